//! The fidelity the bench measured (`cargo xtask bench fidelity`, written to `crates/control/fidelity.json`
//! and compiled in): for each measured change A -> B, how far the what-if's prediction of B from A's recorded
//! traffic was from B run live on the same traffic from a cold fleet. The what-if shows the entry for the
//! change it previews (or the closest measured one) next to its prediction.

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
}

/// One measured change.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Pair {
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

    /// The entry for `from -> to`: that exact change, else one measured with the same candidate policy.
    pub fn lookup(&self, from: &str, to: &str) -> Option<WhatIfFidelity> {
        let (pair, exact) = match self.pairs.iter().find(|p| p.from == from && p.to == to) {
            Some(p) => (p, true),
            None => (self.pairs.iter().find(|p| p.to == to)?, false),
        };
        let hit = pair.candidate.hit_rate_error_pp();
        let ttft = pair.candidate.ttft_p95_error_pct();
        let name = format!("{}->{}", pair.from, pair.to);
        let summary = format!(
            "fidelity measured by the bench for {}{name}: hit rate predicted {hit:+.1} pp off, TTFT p95 {ttft:+.0} % \
             off (measured {}; {})",
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
        };
        let table = Table {
            measured: "2026-12-04".into(),
            setup: "8 replicas".into(),
            pairs: vec![Pair {
                from: "round_robin".into(),
                to: "cache_aware_approx".into(),
                self_check: figures.clone(),
                candidate: figures,
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
}
