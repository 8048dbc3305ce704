//! The benchmark's figures: per-request outcomes, quantiles, goodput, the replicas' prefix-cache deltas,
//! and the report as JSON or a table (pure: no clock, no I/O).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use fleet_base::quantile::interpolated;
use fleet_telemetry::Reading;
use serde::Serialize;

/// How one request ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The stream ended with `[DONE]`.
    Completed(Completed),
    /// It failed; the kind is a short stable word (`connect`, `timeout`, `http_503`, `stream_error`, ...).
    Failed(String),
}

/// Timings of a completed request, in seconds from sending it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Completed {
    /// First generated text.
    pub ttft_s: f64,
    /// Gaps between consecutive chunks that carried text.
    pub itl_s: Vec<f64>,
    /// The whole answer.
    pub e2e_s: f64,
    /// Generated tokens (the usage chunk's count, else the text chunks seen).
    pub output_tokens: u64,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

/// p50/p95/p99 (linear interpolation between closest ranks), mean and count, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Quantiles {
    pub count: usize,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
}

impl Quantiles {
    /// Of values in seconds, reported in milliseconds.
    pub fn of_seconds(mut values: Vec<f64>) -> Self {
        values.retain(|v| v.is_finite());
        values.sort_by(f64::total_cmp);
        let ms = |v: Option<f64>| v.map(|s| s * 1e3);
        let mean = (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64);
        Quantiles {
            count: values.len(),
            mean: ms(mean),
            p50: ms(interpolated(&values, 0.50)),
            p95: ms(interpolated(&values, 0.95)),
            p99: ms(interpolated(&values, 0.99)),
        }
    }
}

/// Service-level objectives a request must meet to count towards goodput (DistServe's definition: the rate
/// of completed requests that met them). None: every completed request counts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    /// On the request's mean time per output token after the first.
    pub tpot_ms: Option<f64>,
}

impl Slo {
    fn met(&self, done: &Completed) -> bool {
        let ttft_ok = self.ttft_ms.is_none_or(|limit| done.ttft_s * 1e3 <= limit);
        let tpot = (done.output_tokens > 1)
            .then(|| (done.e2e_s - done.ttft_s) * 1e3 / (done.output_tokens - 1) as f64);
        let tpot_ok = self.tpot_ms.is_none_or(|limit| tpot.is_none_or(|t| t <= limit));
        ttft_ok && tpot_ok
    }
}

/// One replica's prefix-cache lookups and hits over the run, from its own `/metrics`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaCache {
    pub metrics_url: String,
    pub engine: String,
    /// Prompt tokens (or blocks, as the engine counts) looked up in the prefix cache during the run.
    pub queries: Option<f64>,
    pub hits: Option<f64>,
    pub hit_rate: Option<f64>,
    /// Why the figures are missing or partial (the engine exports no counters, it restarted, a scrape failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The prefix-cache deltas between a reading before the run and one after it. A counter that went back
/// means the replica restarted: the run's lookups are then at least the new values, which are taken.
pub fn cache_delta(metrics_url: &str, before: &Reading, after: &Reading) -> ReplicaCache {
    let engine = after.engine.name().to_owned();
    let (q0, h0, q1, h1) = (
        before.total.prefix_queries,
        before.total.prefix_hits,
        after.total.prefix_queries,
        after.total.prefix_hits,
    );
    let mut cache = ReplicaCache {
        metrics_url: metrics_url.to_owned(),
        engine,
        queries: None,
        hits: None,
        hit_rate: None,
        note: None,
    };
    match (q0, h0, q1, h1) {
        (Some(q0), Some(h0), Some(q1), Some(h1)) => {
            let restarted = q1 < q0 || h1 < h0 || before.created != after.created;
            let (queries, hits) = if restarted { (q1, h1) } else { (q1 - q0, h1 - h0) };
            if restarted {
                cache.note = Some("the replica restarted during the run; counted from its restart".into());
            }
            cache.queries = Some(queries);
            cache.hits = Some(hits);
            cache.hit_rate = (queries > 0.0).then(|| (hits / queries).clamp(0.0, 1.0));
        }
        _ => {
            cache.note = Some(format!(
                "{} exports no prefix-cache counters here, so the run's hit rate cannot be measured from it",
                after.engine.name()
            ));
        }
    }
    cache
}

/// Throughput over the run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Throughput {
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
}

/// Goodput: completed requests that met the SLOs, per second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Goodput {
    pub requests_per_s: f64,
    pub met_slo: u64,
    pub slo: Slo,
}

/// The fleet's prefix cache over the run.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct PrefixCache {
    /// Hits over lookups summed over every replica that reported both (None without --metrics or counters).
    pub hit_rate: Option<f64>,
    pub queries: f64,
    pub hits: f64,
    pub replicas: Vec<ReplicaCache>,
    /// What the servers said in their usage chunks: cached prompt tokens over prompt tokens.
    pub usage_cached_share: Option<f64>,
}

impl PrefixCache {
    pub fn from_replicas(replicas: Vec<ReplicaCache>, usage_cached_share: Option<f64>) -> Self {
        let counted: Vec<_> = replicas.iter().filter_map(|r| Some((r.queries?, r.hits?))).collect();
        let queries: f64 = counted.iter().map(|c| c.0).sum();
        let hits: f64 = counted.iter().map(|c| c.1).sum();
        PrefixCache {
            hit_rate: (queries > 0.0).then(|| (hits / queries).clamp(0.0, 1.0)),
            queries,
            hits,
            replicas,
            usage_cached_share,
        }
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Report {
    pub target: String,
    pub trace: String,
    pub speedup: f64,
    /// Requests the trace (cut by --max-requests) asked for.
    pub requests: u64,
    /// Requests sent.
    pub sent: u64,
    pub completed: u64,
    /// Failed requests, by kind.
    pub errors: BTreeMap<String, u64>,
    pub failed: u64,
    /// Arrivals not sent because --max-in-flight requests were already waiting: the target fell behind.
    pub overflow: u64,
    /// First send to last answer, seconds.
    pub duration_s: f64,
    /// How late the latest arrival was sent after its due time (the client's own lag), milliseconds.
    pub max_send_lag_ms: f64,
    pub ttft_ms: Quantiles,
    pub itl_ms: Quantiles,
    pub e2e_ms: Quantiles,
    pub throughput: Throughput,
    pub goodput: Goodput,
    pub prefix_cache: PrefixCache,
}

/// Outcomes gathered during the run, turned into a [`Report`] at its end.
#[derive(Debug, Default)]
pub struct Tally {
    pub outcomes: Vec<Outcome>,
}

impl Tally {
    /// The report's request figures (the caller fills in target, trace, cache and lag).
    pub fn summarise(&self, duration_s: f64, slo: Slo) -> Report {
        let mut report = Report { duration_s, ..Report::default() };
        let (mut ttft, mut itl, mut e2e) = (Vec::new(), Vec::new(), Vec::new());
        let (mut output_tokens, mut met) = (0u64, 0u64);
        let (mut prompt, mut cached, mut with_usage) = (0u64, 0u64, false);
        for outcome in &self.outcomes {
            report.sent += 1;
            match outcome {
                Outcome::Completed(done) => {
                    report.completed += 1;
                    ttft.push(done.ttft_s);
                    itl.extend_from_slice(&done.itl_s);
                    e2e.push(done.e2e_s);
                    output_tokens += done.output_tokens;
                    met += u64::from(slo.met(done));
                    if let (Some(p), Some(c)) = (done.prompt_tokens, done.cached_tokens) {
                        prompt += p;
                        cached += c;
                        with_usage = true;
                    }
                }
                Outcome::Failed(kind) => {
                    report.failed += 1;
                    *report.errors.entry(kind.clone()).or_default() += 1;
                }
            }
        }
        report.ttft_ms = Quantiles::of_seconds(ttft);
        report.itl_ms = Quantiles::of_seconds(itl);
        report.e2e_ms = Quantiles::of_seconds(e2e);
        let per_s = |n: f64| if duration_s > 0.0 { n / duration_s } else { 0.0 };
        report.throughput = Throughput {
            requests_per_s: per_s(report.completed as f64),
            output_tokens_per_s: per_s(output_tokens as f64),
        };
        report.goodput = Goodput { requests_per_s: per_s(met as f64), met_slo: met, slo };
        report.prefix_cache.usage_cached_share =
            (with_usage && prompt > 0).then(|| cached as f64 / prompt as f64);
        report
    }
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

fn percent(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{:.1}%", v * 100.0))
}

impl Report {
    /// The report as people read it.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "target {}  trace {}  speedup {}x", self.target, self.trace, self.speedup);
        let _ = writeln!(
            out,
            "requests {}: sent {}, completed {}, failed {}, overflow {} (in-flight limit); {:.1} s, client lag max {:.0} ms",
            self.requests,
            self.sent,
            self.completed,
            self.failed,
            self.overflow,
            self.duration_s,
            self.max_send_lag_ms
        );
        if !self.errors.is_empty() {
            let kinds: Vec<String> = self.errors.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(out, "errors: {}", kinds.join(", "));
        }
        let _ =
            writeln!(out, "{:<10} {:>10} {:>10} {:>10} {:>10} {:>8}", "ms", "p50", "p95", "p99", "mean", "n");
        for (name, q) in [("TTFT", &self.ttft_ms), ("ITL", &self.itl_ms), ("end-to-end", &self.e2e_ms)] {
            let _ = writeln!(
                out,
                "{name:<10} {:>10} {:>10} {:>10} {:>10} {:>8}",
                ms(q.p50),
                ms(q.p95),
                ms(q.p99),
                ms(q.mean),
                q.count
            );
        }
        let _ = writeln!(
            out,
            "throughput {:.2} req/s, {:.0} output tok/s; goodput {:.2} req/s ({} met{})",
            self.throughput.requests_per_s,
            self.throughput.output_tokens_per_s,
            self.goodput.requests_per_s,
            self.goodput.met_slo,
            match (self.goodput.slo.ttft_ms, self.goodput.slo.tpot_ms) {
                (None, None) => " (no SLO given: every completed request)".to_owned(),
                (ttft, tpot) => format!(" TTFT <= {} ms, TPOT <= {} ms", ms(ttft), ms(tpot)),
            }
        );
        let cache = &self.prefix_cache;
        let _ = writeln!(
            out,
            "prefix cache hit rate {} (replicas' /metrics, {} of {} looked-up tokens hit); servers' usage: {} cached",
            percent(cache.hit_rate),
            cache.hits,
            cache.queries,
            percent(cache.usage_cached_share)
        );
        for replica in &cache.replicas {
            let _ = writeln!(
                out,
                "  {} ({}): {}{}",
                replica.metrics_url,
                replica.engine,
                percent(replica.hit_rate),
                replica.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use fleet_telemetry::Engine;
    use fleet_telemetry::signals::Values;

    use super::*;

    #[test]
    fn quantiles_interpolate_between_ranks() {
        // Between the two closest ranks (fleet_base::quantile::interpolated), in milliseconds.
        let q = Quantiles::of_seconds(vec![1.0, 0.5]);
        assert_eq!((q.count, q.p50), (2, Some(750.0)));
        let q = Quantiles::of_seconds(vec![0.003, 0.001, 0.002, f64::NAN]);
        assert_eq!((q.count, q.p50), (3, Some(2.0)));
    }

    fn done(ttft_s: f64, e2e_s: f64, output_tokens: u64) -> Outcome {
        Outcome::Completed(Completed {
            ttft_s,
            e2e_s,
            output_tokens,
            itl_s: vec![0.01],
            ..Completed::default()
        })
    }

    #[test]
    fn a_tally_counts_errors_by_kind_and_goodput_by_slo() {
        let tally = Tally {
            outcomes: vec![
                done(0.1, 1.0, 10),
                done(2.0, 3.0, 10),
                Outcome::Failed("http_503".into()),
                Outcome::Failed("http_503".into()),
                Outcome::Failed("timeout".into()),
            ],
        };
        let report = tally.summarise(10.0, Slo { ttft_ms: Some(500.0), tpot_ms: None });
        assert_eq!((report.sent, report.completed, report.failed), (5, 2, 3));
        assert_eq!(report.errors.get("http_503"), Some(&2));
        assert_eq!(report.goodput.met_slo, 1, "the 2 s TTFT misses a 500 ms SLO");
        assert!((report.throughput.requests_per_s - 0.2).abs() < 1e-9);
        assert!((report.throughput.output_tokens_per_s - 2.0).abs() < 1e-9);
        assert!(report.render().contains("http_503 2"));
    }

    fn reading(queries: f64, hits: f64) -> Reading {
        Reading {
            engine: Engine::Vllm,
            flavor: "test",
            model: None,
            created: None,
            total: Values { prefix_queries: Some(queries), prefix_hits: Some(hits), ..Values::default() },
            ranks: Vec::new(),
        }
    }

    #[test]
    fn cache_deltas_cover_the_run_only_and_survive_a_restart() {
        let delta = cache_delta("m", &reading(1000.0, 100.0), &reading(3000.0, 1100.0));
        assert_eq!((delta.queries, delta.hits, delta.hit_rate), (Some(2000.0), Some(1000.0), Some(0.5)));
        let restarted = cache_delta("m", &reading(1000.0, 100.0), &reading(400.0, 100.0));
        assert_eq!(restarted.queries, Some(400.0));
        assert!(restarted.note.is_some());
        let fleet = PrefixCache::from_replicas(vec![delta, restarted], None);
        assert_eq!((fleet.queries, fleet.hits), (2400.0, 1100.0));
    }
}
