//! From one exposition to a [`Reading`] of raw engine values, and from two readings to the
//! normalised [`Signals`] the app shows.
//!
//! Gauges are read as they are; hit rate and TTFT quantiles come from the *difference*
//! between two scrapes (counter and bucket deltas), so they describe the last interval
//! rather than the replica's whole life. A counter that went backwards means the engine
//! restarted: its new value is the delta.

use fleetdeck_api::Signals;

use crate::exposition::Exposition;

/// Serving engines recognised by their metric names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// vLLM V1 names (`vllm:kv_cache_usage_perc`, `vllm:prefix_cache_*`).
    Vllm,
    /// vLLM before 0.12 (`vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_*`).
    VllmLegacy,
    /// SGLang (`sglang:*`).
    Sglang,
}

impl Engine {
    /// The engine's short name as the UI shows it.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Vllm | Engine::VllmLegacy => "vllm",
            Engine::Sglang => "sglang",
        }
    }
}

/// The exposition matched no known engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported engine: no known metric families among {} seen ({})", families.len(), preview(families))]
pub struct UnsupportedEngine {
    pub families: Vec<String>,
}

fn preview(families: &[String]) -> String {
    let shown: Vec<&str> = families.iter().take(8).map(String::as_str).collect();
    let more = families.len().saturating_sub(shown.len());
    if more > 0 { format!("{}, and {more} more", shown.join(", ")) } else { shown.join(", ") }
}

/// Raw values of one scrape, summed over engine / rank label sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub engine: Engine,
    pub model: Option<String>,
    pub running: Option<f64>,
    pub waiting: Option<f64>,
    pub kv_usage: Option<f64>,
    /// Prefix-cache queries and hits, in tokens (cumulative counters).
    pub prefix_queries: Option<f64>,
    pub prefix_hits: Option<f64>,
    /// TTFT histogram: `(upper bound, cumulative count)`, sorted by bound, `+Inf` last.
    pub ttft_buckets: Vec<(f64, f64)>,
}

/// Metric names of one engine.
struct Names {
    running: &'static str,
    waiting: &'static str,
    kv_usage: &'static str,
    queries: &'static str,
    hits: &'static str,
    ttft_bucket: &'static str,
}

const VLLM: Names = Names {
    running: "vllm:num_requests_running",
    waiting: "vllm:num_requests_waiting",
    kv_usage: "vllm:kv_cache_usage_perc",
    queries: "vllm:prefix_cache_queries_total",
    hits: "vllm:prefix_cache_hits_total",
    ttft_bucket: "vllm:time_to_first_token_seconds_bucket",
};

const VLLM_LEGACY: Names = Names {
    running: "vllm:num_requests_running",
    waiting: "vllm:num_requests_waiting",
    kv_usage: "vllm:gpu_cache_usage_perc",
    queries: "vllm:gpu_prefix_cache_queries_total",
    hits: "vllm:gpu_prefix_cache_hits_total",
    ttft_bucket: "vllm:time_to_first_token_seconds_bucket",
};

const SGLANG: Names = Names {
    running: "sglang:num_running_reqs",
    waiting: "sglang:num_queue_reqs",
    kv_usage: "sglang:token_usage",
    queries: "sglang:prefix_cache_queries_total",
    hits: "sglang:prefix_cache_hits_total",
    ttft_bucket: "sglang:time_to_first_token_seconds_bucket",
};

/// Detects the engine and reads its raw values.
pub fn read(exposition: &Exposition) -> Result<Reading, UnsupportedEngine> {
    let has_prefix = |prefix: &str| exposition.samples.iter().any(|s| s.name.starts_with(prefix));
    let (engine, names) = if exposition.has(VLLM.kv_usage) || exposition.has(VLLM.queries) {
        (Engine::Vllm, &VLLM)
    } else if has_prefix("vllm:") {
        (Engine::VllmLegacy, &VLLM_LEGACY)
    } else if has_prefix("sglang:") {
        (Engine::Sglang, &SGLANG)
    } else {
        return Err(UnsupportedEngine { families: exposition.family_names() });
    };
    let sum = |name: &str| {
        let mut values = exposition.samples_named(name).map(|s| s.value).peekable();
        values.peek().is_some().then(|| values.sum::<f64>())
    };
    let mean = |name: &str| {
        let values: Vec<f64> = exposition.samples_named(name).map(|s| s.value).collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };
    let model = exposition
        .samples
        .iter()
        .filter(|s| s.name.starts_with(engine.name()))
        .find_map(|s| s.label("model_name").map(str::to_string));
    Ok(Reading {
        engine,
        model,
        running: sum(names.running),
        waiting: sum(names.waiting),
        kv_usage: mean(names.kv_usage).map(|u| u.clamp(0.0, 1.0)),
        prefix_queries: sum(names.queries),
        prefix_hits: sum(names.hits),
        ttft_buckets: buckets(exposition, names.ttft_bucket),
    })
}

/// Cumulative bucket counts by bound, summed over label sets with the same bound.
fn buckets(exposition: &Exposition, name: &str) -> Vec<(f64, f64)> {
    let mut by_bound: Vec<(f64, f64)> = Vec::new();
    for sample in exposition.samples_named(name) {
        let Some(bound) = sample.label("le").and_then(|le| match le {
            "+Inf" | "Inf" => Some(f64::INFINITY),
            other => other.parse::<f64>().ok(),
        }) else {
            continue;
        };
        match by_bound.iter_mut().find(|(b, _)| *b == bound) {
            Some((_, count)) => *count += sample.value,
            None => by_bound.push((bound, sample.value)),
        }
    }
    by_bound.sort_by(|a, b| a.0.total_cmp(&b.0));
    by_bound
}

/// Increase of a cumulative counter; a decrease means the engine restarted.
fn counter_delta(previous: f64, current: f64) -> f64 {
    if current >= previous { current - previous } else { current }
}

/// The normalised signals between `previous` (if any) and `current`.
pub fn derive(previous: Option<&Reading>, current: &Reading) -> Signals {
    let mut signals = Signals {
        queue_depth: current.waiting,
        running: current.running,
        kv_usage: current.kv_usage,
        ..Signals::default()
    };
    let Some(previous) = previous else { return signals };
    if let (Some(q0), Some(q1), Some(h0), Some(h1)) =
        (previous.prefix_queries, current.prefix_queries, previous.prefix_hits, current.prefix_hits)
    {
        let restarted = q1 < q0 || h1 < h0;
        let (queries, hits) =
            if restarted { (q1, h1) } else { (counter_delta(q0, q1), counter_delta(h0, h1)) };
        if queries > 0.0 {
            signals.hit_rate = Some((hits / queries).clamp(0.0, 1.0));
        }
    }
    let deltas = bucket_deltas(&previous.ttft_buckets, &current.ttft_buckets);
    signals.ttft_p50_s = histogram_quantile(0.5, &deltas);
    signals.ttft_p95_s = histogram_quantile(0.95, &deltas);
    signals
}

/// Per-bound increases between two cumulative histograms (a reset takes the new counts).
fn bucket_deltas(previous: &[(f64, f64)], current: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let restarted = current.iter().any(|(bound, count)| {
        previous.iter().find(|(b, _)| b == bound).is_some_and(|(_, before)| count < before)
    });
    current
        .iter()
        .map(|&(bound, count)| {
            let before =
                if restarted { 0.0 } else { previous.iter().find(|(b, _)| *b == bound).map_or(0.0, |p| p.1) };
            (bound, count - before)
        })
        .collect()
}

/// Prometheus' `histogram_quantile`: linear interpolation inside the bucket holding rank
/// `q * total`; `None` when no observation fell in the window.
pub fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 || !(0.0..=1.0).contains(&q) {
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
    use crate::exposition::parse;

    fn vllm(queries: f64, hits: f64, buckets: [f64; 3]) -> Reading {
        let text = format!(
            "vllm:num_requests_running{{model_name=\"m\",engine=\"0\"}} 2.0\n\
             vllm:num_requests_waiting{{model_name=\"m\",engine=\"0\"}} 5.0\n\
             vllm:kv_cache_usage_perc{{model_name=\"m\",engine=\"0\"}} 0.25\n\
             vllm:prefix_cache_queries_total{{model_name=\"m\",engine=\"0\"}} {queries}\n\
             vllm:prefix_cache_hits_total{{model_name=\"m\",engine=\"0\"}} {hits}\n\
             vllm:time_to_first_token_seconds_bucket{{le=\"0.1\",model_name=\"m\",engine=\"0\"}} {}\n\
             vllm:time_to_first_token_seconds_bucket{{le=\"1.0\",model_name=\"m\",engine=\"0\"}} {}\n\
             vllm:time_to_first_token_seconds_bucket{{le=\"+Inf\",model_name=\"m\",engine=\"0\"}} {}\n",
            buckets[0], buckets[1], buckets[2]
        );
        read(&parse(&text).unwrap()).unwrap()
    }

    #[test]
    fn gauges_are_read_and_rates_need_two_scrapes() {
        let first = vllm(100.0, 50.0, [1.0, 2.0, 2.0]);
        assert_eq!(first.engine, Engine::Vllm);
        assert_eq!(first.model.as_deref(), Some("m"));
        let alone = derive(None, &first);
        assert_eq!((alone.queue_depth, alone.running, alone.kv_usage), (Some(5.0), Some(2.0), Some(0.25)));
        assert_eq!(alone.hit_rate, None);
        assert_eq!(alone.ttft_p50_s, None);
    }

    #[test]
    fn hit_rate_and_quantiles_come_from_deltas() {
        let before = vllm(100.0, 50.0, [1.0, 2.0, 2.0]);
        // 200 more queried tokens of which 150 hit; 10 more requests: 8 under 0.1 s, 2 under 1 s.
        let after = vllm(300.0, 200.0, [9.0, 12.0, 12.0]);
        let signals = derive(Some(&before), &after);
        assert_eq!(signals.hit_rate, Some(0.75));
        let p50 = signals.ttft_p50_s.unwrap();
        assert!((p50 - 0.0625).abs() < 1e-9, "{p50}"); // rank 5 of 8 in [0, 0.1]
        let p95 = signals.ttft_p95_s.unwrap();
        assert!((p95 - (0.1 + 0.9 * 1.5 / 2.0)).abs() < 1e-9, "{p95}");
    }

    #[test]
    fn a_counter_reset_takes_the_new_values() {
        let before = vllm(1000.0, 900.0, [50.0, 60.0, 60.0]);
        let after = vllm(40.0, 10.0, [2.0, 4.0, 4.0]);
        let signals = derive(Some(&before), &after);
        assert_eq!(signals.hit_rate, Some(0.25));
        assert!(signals.ttft_p50_s.unwrap() <= 0.1);
    }

    #[test]
    fn no_traffic_means_no_rate_rather_than_zero() {
        let reading = vllm(10.0, 5.0, [1.0, 1.0, 1.0]);
        let signals = derive(Some(&reading), &reading);
        assert_eq!(signals.hit_rate, None);
        assert_eq!(signals.ttft_p95_s, None);
    }

    #[test]
    fn legacy_vllm_and_unknown_endpoints_are_told_apart() {
        let legacy =
            parse("vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\nvllm:num_requests_running 1\n").unwrap();
        let reading = read(&legacy).unwrap();
        assert_eq!(reading.engine, Engine::VllmLegacy);
        assert_eq!(reading.kv_usage, Some(0.5));
        let unknown =
            read(&parse("process_cpu_seconds_total 1\nhttp_requests_total 2\n").unwrap()).unwrap_err();
        assert_eq!(unknown.families, ["http_requests_total", "process_cpu_seconds_total"]);
        assert!(unknown.to_string().contains("unsupported engine"));
    }

    #[test]
    fn quantile_beyond_the_last_finite_bound_reports_that_bound() {
        assert_eq!(histogram_quantile(0.99, &[(1.0, 1.0), (f64::INFINITY, 10.0)]), Some(1.0));
        assert_eq!(histogram_quantile(0.5, &[]), None);
    }
}
