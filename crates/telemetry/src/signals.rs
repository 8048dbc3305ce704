//! Raw readings of one scrape and the normalised signals derived from a window of them.
//!
//! A [`Reading`] holds what one scrape said, already in common units (seconds, fractions,
//! cumulative token and request counts), per data-parallel rank and summed over the replica.
//! A [`Window`] keeps the increases between consecutive readings for a span of time and turns
//! them into [`ReplicaSignals`]: gauges from the latest reading; hit rate, token and
//! preemption rates from counter deltas; TTFT and inter-token-latency quantiles from histogram
//! bucket deltas. So rates describe the last `span` seconds rather than the replica's life.
//!
//! Counter resets: a counter (or histogram bucket) that went backwards, or a `_created`
//! timestamp that changed, means the engine restarted; the new value is then the increase, never
//! a negative rate. `None` always means "this engine does not provide it" or "no data in the
//! window", never zero.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::engines::Engine;

/// A cumulative histogram in seconds: `(upper bound, cumulative count)` sorted by bound with
/// `+Inf` last (empty when the engine only exports a sum and a count), plus the sum and count.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

/// Raw values of one scrape for one rank (or the whole replica).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Values {
    pub running: Option<f64>,
    pub waiting: Option<f64>,
    /// KV-cache usage, 0..=1.
    pub kv_usage: Option<f64>,
    /// Prefix-cache lookups and hits (tokens or blocks, as the engine counts), cumulative.
    pub prefix_queries: Option<f64>,
    pub prefix_hits: Option<f64>,
    /// The engine's own hit-rate gauge, used only when it exports no counters.
    pub hit_rate_gauge: Option<f64>,
    /// Cumulative counters.
    pub prompt_tokens: Option<f64>,
    /// Prompt tokens served from a prefix cache rather than computed, cumulative (vLLM's
    /// `prompt_tokens_cached_total`, SGLang's `cached_tokens_total`, llama.cpp's); with
    /// `prompt_tokens` it gives the prompt tokens the engine computed.
    pub prompt_tokens_cached: Option<f64>,
    pub generation_tokens: Option<f64>,
    pub preemptions: Option<f64>,
    pub ttft: Option<Histogram>,
    pub itl: Option<Histogram>,
    /// P/D decode side (vLLM's NixlConnector): KV transfers completed and the seconds they took,
    /// cumulative; the replica as a whole only (see [`crate::pd`]).
    pub kv_transfers: Option<f64>,
    pub kv_transfer_seconds: Option<f64>,
    /// P/D prefill side (SGLang): the latest transfer's seconds, a gauge.
    pub kv_transfer_last_s: Option<f64>,
}

/// What one scrape of a supported engine said.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub engine: Engine,
    /// Which variant was recognised, for people (e.g. "vLLM V1 metric names").
    pub flavor: &'static str,
    pub model: Option<String>,
    /// The latest `_created` timestamp among the counters read; a change means a restart.
    pub created: Option<f64>,
    /// The replica as a whole: gauges and counters summed over ranks, KV usage averaged.
    pub total: Values,
    /// Per data-parallel rank (`engine` or `dp_rank` label), sorted by rank; empty when the
    /// engine labels no ranks.
    pub ranks: Vec<(String, Values)>,
}

/// Normalised signals of one replica or rank.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineSignals {
    pub queue_depth: Option<f64>,
    pub running: Option<f64>,
    pub kv_usage: Option<f64>,
    pub hit_rate: Option<f64>,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p95_s: Option<f64>,
    pub ttft_p99_s: Option<f64>,
    pub itl_p50_s: Option<f64>,
    pub itl_p95_s: Option<f64>,
    pub itl_mean_s: Option<f64>,
    pub prompt_tokens_per_s: Option<f64>,
    pub generation_tokens_per_s: Option<f64>,
    pub preemptions_per_s: Option<f64>,
    /// Mean seconds per KV transfer into this replica over the window (P/D, vLLM), or the latest
    /// transfer's seconds where the engine reports only that (SGLang).
    pub kv_transfer_mean_s: Option<f64>,
}

impl EngineSignals {
    /// Every signal with its stable snake_case name, for reports and comparisons.
    pub fn fields(&self) -> [(&'static str, Option<f64>); 14] {
        [
            ("queue_depth", self.queue_depth),
            ("running", self.running),
            ("kv_usage", self.kv_usage),
            ("hit_rate", self.hit_rate),
            ("ttft_p50_s", self.ttft_p50_s),
            ("ttft_p95_s", self.ttft_p95_s),
            ("ttft_p99_s", self.ttft_p99_s),
            ("itl_p50_s", self.itl_p50_s),
            ("itl_p95_s", self.itl_p95_s),
            ("itl_mean_s", self.itl_mean_s),
            ("prompt_tokens_per_s", self.prompt_tokens_per_s),
            ("generation_tokens_per_s", self.generation_tokens_per_s),
            ("preemptions_per_s", self.preemptions_per_s),
            ("kv_transfer_mean_s", self.kv_transfer_mean_s),
        ]
    }
}

/// Signals of one replica: identity, the whole, and each labelled rank.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaSignals {
    pub engine: Engine,
    pub flavor: &'static str,
    pub model: Option<String>,
    pub total: EngineSignals,
    pub ranks: Vec<(String, EngineSignals)>,
}

/// Increases between two consecutive readings of one rank.
#[derive(Debug, Clone, Default)]
struct Step {
    at: f64,
    dt: f64,
    prefix: Option<(f64, f64)>,
    prompt_tokens: Option<f64>,
    generation_tokens: Option<f64>,
    preemptions: Option<f64>,
    ttft: Option<Histogram>,
    itl: Option<Histogram>,
    /// KV transfers completed and their seconds.
    kv_transfer: Option<(f64, f64)>,
}

/// One rank's latest values and recent steps.
#[derive(Debug, Clone, Default)]
struct Track {
    last: Option<(f64, Values)>,
    steps: VecDeque<Step>,
}

impl Track {
    fn push(&mut self, at: f64, values: &Values, restarted: bool, span: f64) {
        if let Some((before_at, before)) = &self.last
            && at > *before_at
        {
            self.steps.push_back(step(*before_at, before, at, values, restarted));
        }
        // The newest step always stays, so a span shorter than the interval still has data.
        while self.steps.len() > 1 && self.steps.front().is_some_and(|s| s.at <= at - span) {
            self.steps.pop_front();
        }
        self.last = Some((at, values.clone()));
    }

    fn signals(&self) -> EngineSignals {
        let Some((_, latest)) = &self.last else { return EngineSignals::default() };
        let mut signals = EngineSignals {
            queue_depth: latest.waiting,
            running: latest.running,
            kv_usage: latest.kv_usage,
            ..EngineSignals::default()
        };
        let rate = |pick: fn(&Step) -> Option<f64>| {
            let (mut total, mut seconds, mut any) = (0.0, 0.0, false);
            for step in &self.steps {
                if let Some(increase) = pick(step) {
                    total += increase;
                    seconds += step.dt;
                    any = true;
                }
            }
            (any && seconds > 0.0).then(|| total / seconds)
        };
        signals.prompt_tokens_per_s = rate(|s| s.prompt_tokens);
        signals.generation_tokens_per_s = rate(|s| s.generation_tokens);
        signals.preemptions_per_s = rate(|s| s.preemptions);
        let (transfers, transfer_seconds) = self
            .steps
            .iter()
            .filter_map(|s| s.kv_transfer)
            .fold((0.0, 0.0), |(n, t), (dn, dt)| (n + dn, t + dt));
        signals.kv_transfer_mean_s =
            if transfers > 0.0 { Some(transfer_seconds / transfers) } else { latest.kv_transfer_last_s };

        let (mut queries, mut hits) = (0.0, 0.0);
        for (q, h) in self.steps.iter().filter_map(|s| s.prefix) {
            queries += q;
            hits += h;
        }
        signals.hit_rate = if latest.prefix_queries.is_some() {
            (queries > 0.0).then(|| (hits / queries).clamp(0.0, 1.0))
        } else {
            latest.hit_rate_gauge
        };

        if let Some(ttft) = merged(self.steps.iter().filter_map(|s| s.ttft.as_ref())) {
            signals.ttft_p50_s = histogram_quantile(0.5, &ttft.buckets);
            signals.ttft_p95_s = histogram_quantile(0.95, &ttft.buckets);
            signals.ttft_p99_s = histogram_quantile(0.99, &ttft.buckets);
        }
        if let Some(itl) = merged(self.steps.iter().filter_map(|s| s.itl.as_ref())) {
            signals.itl_p50_s = histogram_quantile(0.5, &itl.buckets);
            signals.itl_p95_s = histogram_quantile(0.95, &itl.buckets);
            signals.itl_mean_s = (itl.count > 0.0).then(|| itl.sum / itl.count);
        }
        signals
    }
}

/// Increase of a cumulative counter; a decrease (or a known restart) means it began again at 0.
fn counter_delta(previous: f64, current: f64, restarted: bool) -> f64 {
    if restarted || current < previous { current } else { current - previous }
}

fn step(before_at: f64, before: &Values, at: f64, now: &Values, restarted: bool) -> Step {
    let counter = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(counter_delta(a, b, restarted)),
        _ => None,
    };
    let prefix = match (before.prefix_queries, now.prefix_queries, before.prefix_hits, now.prefix_hits) {
        (Some(q0), Some(q1), Some(h0), Some(h1)) => {
            // Both counters restart together; if either went back, take both anew.
            let reset = restarted || q1 < q0 || h1 < h0;
            Some(if reset { (q1, h1) } else { (q1 - q0, h1 - h0) })
        }
        _ => None,
    };
    Step {
        at,
        dt: at - before_at,
        prefix,
        prompt_tokens: counter(before.prompt_tokens, now.prompt_tokens),
        generation_tokens: counter(before.generation_tokens, now.generation_tokens),
        preemptions: counter(before.preemptions, now.preemptions),
        ttft: histogram_delta(before.ttft.as_ref(), now.ttft.as_ref(), restarted),
        itl: histogram_delta(before.itl.as_ref(), now.itl.as_ref(), restarted),
        kv_transfer: match (
            before.kv_transfers,
            now.kv_transfers,
            before.kv_transfer_seconds,
            now.kv_transfer_seconds,
        ) {
            (Some(n0), Some(n1), Some(t0), Some(t1)) => {
                let reset = restarted || n1 < n0 || t1 < t0;
                Some(if reset { (n1, t1) } else { (n1 - n0, t1 - t0) })
            }
            _ => None,
        },
    }
}

/// Per-bucket increases; a reset (any bucket or the count going back, or the bucket layout
/// changing) takes the new histogram whole.
fn histogram_delta(
    before: Option<&Histogram>,
    now: Option<&Histogram>,
    restarted: bool,
) -> Option<Histogram> {
    let (before, now) = (before?, now?);
    let same_layout = before.buckets.len() == now.buckets.len()
        && before.buckets.iter().zip(&now.buckets).all(|(a, b)| a.0 == b.0);
    let reset = restarted
        || !same_layout
        || now.count < before.count
        || before.buckets.iter().zip(&now.buckets).any(|(a, b)| b.1 < a.1);
    if reset {
        return Some(now.clone());
    }
    Some(Histogram {
        buckets: before.buckets.iter().zip(&now.buckets).map(|(a, b)| (b.0, b.1 - a.1)).collect(),
        sum: (now.sum - before.sum).max(0.0),
        count: now.count - before.count,
    })
}

/// Sums histogram deltas that share the latest layout (older layouts predate a restart).
fn merged<'a>(deltas: impl DoubleEndedIterator<Item = &'a Histogram>) -> Option<Histogram> {
    let mut deltas = deltas.rev();
    let mut total = deltas.next()?.clone();
    for delta in deltas {
        let same = delta.buckets.len() == total.buckets.len()
            && delta.buckets.iter().zip(&total.buckets).all(|(a, b)| a.0 == b.0);
        if !same {
            break;
        }
        for (sum, add) in total.buckets.iter_mut().zip(&delta.buckets) {
            sum.1 += add.1;
        }
        total.sum += delta.sum;
        total.count += delta.count;
    }
    Some(total)
}

/// Readings of one target over a sliding span of time, and the signals they give.
#[derive(Debug, Clone)]
pub struct Window {
    span: f64,
    identity: Option<(Engine, &'static str, Option<String>)>,
    created: Option<f64>,
    total: Track,
    ranks: HashMap<String, Track>,
    rank_order: Vec<String>,
}

impl Window {
    /// A window over the last `span` (at least one step is always kept, so a span shorter
    /// than the scrape interval means "between the last two scrapes").
    pub fn new(span: Duration) -> Self {
        Self {
            span: span.as_secs_f64(),
            identity: None,
            created: None,
            total: Track::default(),
            ranks: HashMap::new(),
            rank_order: Vec::new(),
        }
    }

    /// Adds a reading taken at `at_s` (seconds on any monotonic clock).
    pub fn push(&mut self, at_s: f64, reading: &Reading) {
        // A different engine behind the same URL shares nothing with the old one.
        if self.identity.as_ref().is_some_and(|(engine, ..)| *engine != reading.engine) {
            *self = Self::new(Duration::from_secs_f64(self.span));
        }
        let restarted = matches!((self.created, reading.created), (Some(a), Some(b)) if a != b);
        let span = self.span;
        self.total.push(at_s, &reading.total, restarted, span);
        for (rank, values) in &reading.ranks {
            if !self.ranks.contains_key(rank) {
                self.rank_order.push(rank.clone());
            }
            self.ranks.entry(rank.clone()).or_default().push(at_s, values, restarted, span);
        }
        // Ranks that stopped reporting drop out rather than show stale values.
        self.rank_order.retain(|rank| reading.ranks.iter().any(|(r, _)| r == rank));
        self.ranks.retain(|rank, _| reading.ranks.iter().any(|(r, _)| r == rank));
        self.created = reading.created;
        self.identity = Some((reading.engine, reading.flavor, reading.model.clone()));
    }

    /// The signals over the window, `None` before the first reading.
    pub fn signals(&self) -> Option<ReplicaSignals> {
        let (engine, flavor, model) = self.identity.clone()?;
        let mut ranks: Vec<(String, EngineSignals)> =
            self.rank_order.iter().map(|r| (r.clone(), self.ranks[r].signals())).collect();
        ranks.sort_by(|a, b| rank_order(&a.0, &b.0));
        Some(ReplicaSignals { engine, flavor, model, total: self.total.signals(), ranks })
    }
}

/// Ranks sort numerically when they are numbers ("2" before "10"), numbers before other
/// names, and by text otherwise: a total order (mixing the two rules would not be, and sorting
/// panics on an inconsistent order; the fuzzer found that).
pub(crate) fn rank_order(a: &str, b: &str) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(x), Ok(y)) => x.cmp(&y).then_with(|| a.cmp(b)),
        (Ok(_), Err(_)) => Ordering::Less,
        (Err(_), Ok(_)) => Ordering::Greater,
        (Err(_), Err(_)) => a.cmp(b),
    }
}

/// Prometheus' `histogram_quantile`: linear interpolation inside the bucket holding rank
/// `q * total`; `None` when no observation fell in the window or there are no buckets.
pub fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 || !(0.0..=1.0).contains(&q) || !buckets.last()?.0.is_infinite() {
        return None;
    }
    let rank = q * total;
    let mut lower_bound = 0.0;
    let mut lower_count = 0.0;
    for &(bound, count) in buckets {
        if count >= rank {
            if bound.is_infinite() {
                // The quantile lies beyond the largest finite bound: report that bound.
                return Some(lower_bound);
            }
            let in_bucket = count - lower_count;
            let fraction = if in_bucket > 0.0 { (rank - lower_count) / in_bucket } else { 1.0 };
            return Some(lower_bound + (bound - lower_bound) * fraction);
        }
        lower_bound = bound;
        lower_count = count;
    }
    Some(lower_bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(queries: f64, hits: f64, buckets: [f64; 3]) -> Reading {
        let ttft = Histogram {
            buckets: vec![(0.1, buckets[0]), (1.0, buckets[1]), (f64::INFINITY, buckets[2])],
            sum: 0.0,
            count: buckets[2],
        };
        Reading {
            engine: Engine::Vllm,
            flavor: "test",
            model: Some("m".into()),
            created: None,
            total: Values {
                running: Some(2.0),
                waiting: Some(5.0),
                kv_usage: Some(0.25),
                prefix_queries: Some(queries),
                prefix_hits: Some(hits),
                prompt_tokens: Some(queries),
                ttft: Some(ttft),
                ..Values::default()
            },
            ranks: Vec::new(),
        }
    }

    fn window(points: &[(f64, Reading)]) -> EngineSignals {
        let mut window = Window::new(Duration::from_secs(10));
        for (at, r) in points {
            window.push(*at, r);
        }
        window.signals().unwrap().total
    }

    #[test]
    fn gauges_come_at_once_and_rates_need_two_scrapes() {
        let alone = window(&[(0.0, reading(100.0, 50.0, [1.0, 2.0, 2.0]))]);
        assert_eq!((alone.queue_depth, alone.running, alone.kv_usage), (Some(5.0), Some(2.0), Some(0.25)));
        assert_eq!((alone.hit_rate, alone.ttft_p50_s, alone.prompt_tokens_per_s), (None, None, None));
    }

    #[test]
    fn hit_rate_rates_and_quantiles_come_from_deltas_over_the_window() {
        // 200 more queried tokens of which 150 hit; 10 more requests: 8 under 0.1 s, 2 under 1 s.
        let s = window(&[
            (0.0, reading(100.0, 50.0, [1.0, 2.0, 2.0])),
            (1.0, reading(200.0, 130.0, [5.0, 6.0, 6.0])),
            (2.0, reading(300.0, 200.0, [9.0, 12.0, 12.0])),
        ]);
        assert_eq!(s.hit_rate, Some(0.75));
        assert_eq!(s.prompt_tokens_per_s, Some(100.0));
        let p50 = s.ttft_p50_s.unwrap();
        assert!((p50 - 0.0625).abs() < 1e-9, "{p50}"); // rank 5 of 8 in [0, 0.1]
        let p95 = s.ttft_p95_s.unwrap();
        assert!((p95 - (0.1 + 0.9 * 1.5 / 2.0)).abs() < 1e-9, "{p95}");
    }

    #[test]
    fn kv_transfer_time_is_the_mean_over_the_window_or_the_engines_latest() {
        let with_transfers = |transfers: f64, seconds: f64| {
            let mut r = reading(0.0, 0.0, [0.0; 3]);
            (r.total.kv_transfers, r.total.kv_transfer_seconds) = (Some(transfers), Some(seconds));
            r
        };
        // 4 transfers taking 0.2 s in all, then 1 more taking 0.3 s: 0.5 s over 5.
        let s = window(&[
            (0.0, with_transfers(10.0, 9.0)),
            (1.0, with_transfers(14.0, 9.2)),
            (2.0, with_transfers(15.0, 9.5)),
        ]);
        assert!(s.kv_transfer_mean_s.is_some_and(|m| (m - 0.1).abs() < 1e-9), "{s:?}");
        let idle = window(&[(0.0, with_transfers(10.0, 9.0)), (1.0, with_transfers(10.0, 9.0))]);
        assert_eq!(idle.kv_transfer_mean_s, None, "no transfer in the window is no figure, not zero");
        let mut sglang = reading(0.0, 0.0, [0.0; 3]);
        sglang.total.kv_transfer_last_s = Some(0.04);
        assert_eq!(window(&[(0.0, sglang)]).kv_transfer_mean_s, Some(0.04));
        assert_eq!(window(&[(0.0, reading(0.0, 0.0, [0.0; 3]))]).kv_transfer_mean_s, None);
    }

    #[test]
    fn old_steps_leave_the_window() {
        let s = window(&[
            (0.0, reading(0.0, 0.0, [0.0; 3])),
            (1.0, reading(100.0, 100.0, [1.0; 3])), // all hits, then out of the window
            (20.0, reading(200.0, 100.0, [1.0; 3])), // 100 queries, no hits
        ]);
        assert_eq!(s.hit_rate, Some(0.0));
        assert_eq!(s.ttft_p50_s, None, "no request finished in the window");
    }

    #[test]
    fn a_counter_reset_mid_window_counts_the_new_values_not_a_negative() {
        let s = window(&[
            (0.0, reading(1000.0, 900.0, [50.0, 60.0, 60.0])),
            (1.0, reading(40.0, 10.0, [2.0, 4.0, 4.0])),
            (2.0, reading(80.0, 30.0, [4.0, 8.0, 8.0])),
        ]);
        assert_eq!(s.hit_rate, Some(0.375)); // (10 + 20) / (40 + 40)
        assert_eq!(s.prompt_tokens_per_s, Some(40.0));
        assert!(s.ttft_p50_s.unwrap() <= 1.0);
    }

    #[test]
    fn a_changed_created_timestamp_is_a_restart_even_if_counters_grew() {
        let mut a = reading(100.0, 50.0, [1.0; 3]);
        a.created = Some(1.0);
        let mut b = reading(300.0, 300.0, [2.0; 3]);
        b.created = Some(2.0);
        assert_eq!(window(&[(0.0, a), (1.0, b)]).hit_rate, Some(1.0)); // 300 / 300, not 250 / 200
    }

    #[test]
    fn no_traffic_means_no_rate_rather_than_zero() {
        let r = reading(10.0, 5.0, [1.0, 1.0, 1.0]);
        let s = window(&[(0.0, r.clone()), (1.0, r)]);
        assert_eq!((s.hit_rate, s.ttft_p95_s), (None, None));
        assert_eq!(s.prompt_tokens_per_s, Some(0.0), "a provided counter that did not move is a zero rate");
        assert_eq!(s.preemptions_per_s, None, "not provided");
    }

    #[test]
    fn a_short_span_still_keeps_the_last_step() {
        let mut w = Window::new(Duration::from_millis(1));
        w.push(0.0, &reading(0.0, 0.0, [0.0; 3]));
        w.push(5.0, &reading(10.0, 5.0, [0.0; 3]));
        assert_eq!(w.signals().unwrap().total.hit_rate, Some(0.5));
    }

    #[test]
    fn rank_order_is_total_even_for_mixed_labels() {
        // "2" < "10" numerically, "10" < "1a" and "1a" < "2" as text would be a cycle.
        let mut ranks = vec!["1a", "10", "2", "01", "1", "x", "02"];
        ranks.sort_by(|a, b| rank_order(a, b));
        assert_eq!(ranks, ["01", "1", "02", "2", "10", "1a", "x"]);
    }

    #[test]
    fn quantile_beyond_the_last_finite_bound_reports_that_bound() {
        assert_eq!(histogram_quantile(0.99, &[(1.0, 1.0), (f64::INFINITY, 10.0)]), Some(1.0));
        assert_eq!(histogram_quantile(0.5, &[]), None);
    }
}
