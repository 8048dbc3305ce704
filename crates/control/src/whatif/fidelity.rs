//! The fidelity the bench measured (`cargo xtask bench fidelity`, written to `crates/control/fidelity.json`
//! and compiled in): for each measured change A -> B, how far the what-if's prediction of B from A's recorded
//! traffic was from B run live on the same traffic from a cold fleet, in each scenario the bench runs (seeds,
//! tenant counts, KV sizes, engine profiles). The what-if shows, next to its prediction, the worst miss the
//! bench measured for the change it previews (or for the closest measured one).

use fleetdeck_api::WhatIfFidelity;
use serde::{Deserialize, Serialize};

/// The checked-in table.
pub const FIDELITY_JSON: &str = include_str!("../../fidelity.json");

/// Predicted and measured figures of one policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    pub predicted_hit_rate: f64,
    pub measured_hit_rate: f64,
    pub predicted_ttft_p95_ms: f64,
    pub measured_ttft_p95_ms: f64,
    /// How far the measured p95 could have moved by chance: its 95 % confidence interval
    /// (`fleet_base::quantile::confidence_interval`) over the requests measured (absent from older tables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_ttft_p95_interval_ms: Option<(f64, f64)>,
    /// The what-if's spread: its hit rate and TTFT p95 over replays with other random draws, metrics-read
    /// phases and arrival times (absent from older tables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_hit_rate_range: Option<(f64, f64)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_ttft_p95_range_ms: Option<(f64, f64)>,
}

impl Figures {
    /// Predicted minus measured hit rate, in percentage points.
    pub fn hit_rate_error_pp(&self) -> f64 {
        (self.predicted_hit_rate - self.measured_hit_rate) * 100.0
    }

    /// (Predicted - measured) / measured TTFT p95, in percent.
    pub fn ttft_p95_error_pct(&self) -> f64 {
        if self.measured_ttft_p95_ms > 0.0 {
            (self.predicted_ttft_p95_ms - self.measured_ttft_p95_ms) / self.measured_ttft_p95_ms * 100.0
        } else {
            f64::NAN
        }
    }

    /// Whether the prediction misses the goal (2 pp of hit rate, 15 % of TTFT p95).
    pub fn misses_goal(&self) -> bool {
        self.hit_rate_error_pp().abs() > 2.0 || self.ttft_p95_error_pct().abs() > 15.0
    }

    /// A miss that chance cannot explain: the measured hit rate more than 2 pp outside the what-if's spread,
    /// or no p95 of its spread within 15 % of the measured p95's confidence interval. A live run is one
    /// draw of what the spread varies (the policy's random draws, when the routers read metrics, arrival
    /// times) and of which requests make its p95; only a prediction beyond both says the model is wrong.
    pub fn misses_beyond_chance(&self) -> bool {
        let point = |value: f64| (value, value);
        let (low, high) = self.predicted_hit_rate_range.unwrap_or(point(self.predicted_hit_rate));
        let measured = self.measured_hit_rate;
        let outside = if measured < low { low - measured } else { (measured - high).max(0.0) };
        let (p95_low, p95_high) =
            self.predicted_ttft_p95_range_ms.unwrap_or(point(self.predicted_ttft_p95_ms));
        let (ci_low, ci_high) =
            self.measured_ttft_p95_interval_ms.unwrap_or(point(self.measured_ttft_p95_ms));
        outside * 100.0 > 2.0 || p95_high < 0.85 * ci_low || p95_low > 1.15 * ci_high
    }
}

/// One measured change, in one scenario.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Pair {
    /// The scenario's name (tables written before scenarios existed have one unnamed scenario).
    #[serde(default)]
    pub scenario: String,
    /// The engine profile the what-if predicted with (and the emulated fleet ran under).
    #[serde(default)]
    pub profile: String,
    pub from: String,
    pub to: String,
    /// A replayed under A's own recording against A live.
    pub self_check: Figures,
    /// B predicted from A's recording against B live.
    pub candidate: Figures,
}

/// The whole table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// When (a date).
    pub measured: String,
    /// The fleet and traffic it was measured on.
    pub setup: String,
    pub pairs: Vec<Pair>,
}

impl Table {
    /// The checked-in table (an unreadable one counts as empty: the what-if then says "not measured").
    pub fn checked_in() -> Self {
        serde_json::from_str(FIDELITY_JSON).unwrap_or_default()
    }

    /// The entry for `from -> to`: that exact change, else those measured with the same candidate policy.
    /// Over several scenarios it reports the worst of each error (the largest in magnitude, with its sign),
    /// since an operator needs to know how far off the what-if can be, not how far off it is on average.
    pub fn lookup(&self, from: &str, to: &str) -> Option<WhatIfFidelity> {
        let exact: Vec<&Pair> = self.pairs.iter().filter(|p| p.from == from && p.to == to).collect();
        let (pairs, exact) = if exact.is_empty() {
            (self.pairs.iter().filter(|p| p.to == to).collect::<Vec<_>>(), false)
        } else {
            (exact, true)
        };
        let worst = |error: fn(&Figures) -> f64| {
            pairs
                .iter()
                .map(|p| error(&p.candidate))
                .filter(|e| e.is_finite())
                .max_by(|a, b| a.abs().total_cmp(&b.abs()))
                .unwrap_or(f64::NAN)
        };
        let first = pairs.first()?;
        let hit = worst(Figures::hit_rate_error_pp);
        let ttft = worst(Figures::ttft_p95_error_pct);
        let name = format!("{}->{}", first.from, first.to);
        let over = match pairs.len() {
            1 => String::new(),
            n => format!(" (worst of {n} scenarios)"),
        };
        // Of the scenarios that missed the goal, those whose live run fell inside what chance moves.
        let missed = pairs.iter().filter(|p| p.candidate.misses_goal()).count();
        let by_chance =
            pairs.iter().filter(|p| p.candidate.misses_goal() && !p.candidate.misses_beyond_chance()).count();
        let chance = match (missed, by_chance) {
            (0, _) | (_, 0) => String::new(),
            (missed, by_chance) => format!(
                "; {by_chance} of the {missed} scenario(s) beyond the goal were within the what-if's spread or the \
                 measured p95's interval"
            ),
        };
        let summary = format!(
            "fidelity measured by the bench for {}{name}{over}: hit rate predicted {hit:+.1} pp off, TTFT p95 \
             {ttft:+.0} % off{chance} (measured {}; {})",
            if exact { "this change, " } else { "the closest measured change, " },
            self.measured,
            self.setup
        );
        Some(WhatIfFidelity {
            pair: name,
            exact,
            hit_rate_error_pp: hit,
            ttft_p95_error_pct: ttft,
            measured: self.measured.clone(),
            summary,
        })
    }
}

/// The checked-in entry for `from -> to`.
pub fn lookup(from: &str, to: &str) -> Option<WhatIfFidelity> {
    Table::checked_in().lookup(from, to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_table_parses() {
        let table: Table =
            serde_json::from_str(FIDELITY_JSON).expect("crates/control/fidelity.json is valid");
        for pair in &table.pairs {
            assert!(pair.candidate.measured_ttft_p95_ms > 0.0, "{pair:?}");
        }
    }

    #[test]
    fn a_change_finds_its_own_entry_or_the_closest() {
        let figures = Figures {
            predicted_hit_rate: 0.52,
            measured_hit_rate: 0.50,
            predicted_ttft_p95_ms: 110.0,
            measured_ttft_p95_ms: 100.0,
            ..Figures::default()
        };
        let table = Table {
            measured: "2026-12-04".into(),
            setup: "8 replicas".into(),
            pairs: vec![Pair {
                from: "round_robin".into(),
                to: "cache_aware_approx".into(),
                self_check: figures.clone(),
                candidate: figures,
                ..Pair::default()
            }],
        };
        let exact = table.lookup("round_robin", "cache_aware_approx").unwrap();
        assert!(exact.exact);
        assert!(
            (exact.hit_rate_error_pp - 2.0).abs() < 1e-9 && (exact.ttft_p95_error_pct - 10.0).abs() < 1e-9
        );
        assert!(exact.summary.contains("this change"), "{}", exact.summary);
        let close = table.lookup("least_load", "cache_aware_approx").unwrap();
        assert!(!close.exact && close.summary.contains("closest"));
        assert!(table.lookup("round_robin", "kv_precise").is_none());
    }

    #[test]
    fn a_miss_inside_the_spread_or_the_measured_interval_is_chance() {
        // A p95 at the knee between hits (14 ms) and misses (49 ms): 300 requests cannot place it finer.
        let knee = Figures {
            predicted_hit_rate: 0.935,
            measured_hit_rate: 0.942,
            predicted_ttft_p95_ms: 41.0,
            measured_ttft_p95_ms: 27.0,
            measured_ttft_p95_interval_ms: Some((14.0, 49.0)),
            ..Figures::default()
        };
        assert!(knee.misses_goal() && !knee.misses_beyond_chance());
        // 60 ms is beyond 49 ms + 15 %.
        assert!(Figures { predicted_ttft_p95_ms: 60.0, ..knee.clone() }.misses_beyond_chance());
        let unknown = Figures { measured_ttft_p95_interval_ms: None, ..knee.clone() };
        assert!(unknown.misses_beyond_chance(), "no interval: judged by the goal alone");
        // Random draws: one replay 4 pp off, the spread of draws covers the live run.
        let drawn = Figures {
            predicted_hit_rate: 0.565,
            measured_hit_rate: 0.606,
            predicted_ttft_p95_ms: 100.0,
            measured_ttft_p95_ms: 99.0,
            ..Figures::default()
        };
        assert!(drawn.misses_goal() && drawn.misses_beyond_chance());
        let spread = |high: f64| Figures { predicted_hit_rate_range: Some((0.532, high)), ..drawn.clone() };
        assert!(!spread(0.618).misses_beyond_chance(), "inside the spread");
        assert!(!spread(0.59).misses_beyond_chance(), "within 2 pp of its edge");
        assert!(spread(0.58).misses_beyond_chance(), "beyond 2 pp of its edge");
    }

    #[test]
    fn over_several_scenarios_the_worst_miss_is_reported_with_its_sign() {
        let figures = |predicted_hit: f64, predicted_p95: f64| Figures {
            predicted_hit_rate: predicted_hit,
            measured_hit_rate: 0.90,
            predicted_ttft_p95_ms: predicted_p95,
            measured_ttft_p95_ms: 100.0,
            ..Figures::default()
        };
        let pair = |scenario: &str, candidate: Figures| Pair {
            scenario: scenario.into(),
            profile: "llama-3.1-8b-h100".into(),
            from: "round_robin".into(),
            to: "cache_aware_approx".into(),
            self_check: candidate.clone(),
            candidate,
        };
        let table = Table {
            measured: "2026-12-05".into(),
            setup: "three scenarios".into(),
            pairs: vec![
                pair("demo", figures(0.91, 105.0)),
                pair("tight-kv", figures(0.87, 320.0)),
                pair("many-tenants", figures(0.92, 60.0)),
            ],
        };
        let entry = table.lookup("round_robin", "cache_aware_approx").unwrap();
        assert!((entry.hit_rate_error_pp + 3.0).abs() < 1e-9, "{}", entry.hit_rate_error_pp);
        assert!((entry.ttft_p95_error_pct - 220.0).abs() < 1e-9, "{}", entry.ttft_p95_error_pct);
        assert!(entry.summary.contains("worst of 3 scenarios"), "{}", entry.summary);
        assert!(
            !entry.summary.contains("within the what-if's spread"),
            "none has a spread: {}",
            entry.summary
        );
        // With the spreads and intervals the bench now records, a miss that chance explains is said to be:
        // tight-kv's spread covers its live run; many-tenants (p95 40 % low, no spread) stays a miss.
        let mut table = table;
        table.pairs[1].candidate.predicted_hit_rate_range = Some((0.86, 0.91));
        table.pairs[1].candidate.predicted_ttft_p95_range_ms = Some((100.0, 320.0));
        let entry = table.lookup("round_robin", "cache_aware_approx").unwrap();
        assert!(
            entry.summary.contains("; 1 of the 2 scenario(s) beyond the goal were within"),
            "{}",
            entry.summary
        );
    }
}
