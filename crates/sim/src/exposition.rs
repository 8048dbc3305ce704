//! vLLM's Prometheus exposition: the counters a replica keeps and the text it serves.
//!
//! Names, types, help texts, label names and histogram buckets follow vLLM's V1 engine
//! (`vllm/v1/metrics/loggers.py`), rendered the way Python's `prometheus_client` renders
//! them (counters carry `_total`, each counter and histogram has a `_created` gauge,
//! floats print with a decimal point), so a scraper cannot tell us from vLLM by format.

use std::fmt::Write as _;

/// vLLM's buckets for `vllm:time_to_first_token_seconds`.
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];

/// A cumulative histogram with fixed upper bounds (the `+Inf` bucket is `count`).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Non-cumulative counts per bound; cumulated when rendered.
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self { bounds, counts: vec![0; bounds.len()], count: 0, sum: 0.0 }
    }

    pub fn observe(&mut self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| value <= b) {
            self.counts[i] += 1;
        }
        self.count += 1;
        self.sum += value;
    }

    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Everything one replica reports on `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaMetrics {
    pub running: usize,
    pub waiting: usize,
    /// Fraction of KV blocks held by running requests, 0..=1.
    pub kv_usage: f64,
    pub prefix_queries_tokens: u64,
    pub prefix_hits_tokens: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub ttft: Histogram,
    /// Unix seconds at which the counters started (the `_created` series).
    pub created_unix_s: f64,
}

impl ReplicaMetrics {
    pub fn new(created_unix_s: f64) -> Self {
        Self {
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
            prefix_queries_tokens: 0,
            prefix_hits_tokens: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            ttft: Histogram::new(&TTFT_BUCKETS),
            created_unix_s,
        }
    }
}

/// Renders `metrics` as vLLM would for `model_name` served by engine index 0.
pub fn render_vllm(metrics: &ReplicaMetrics, model_name: &str) -> String {
    let labels = format!("model_name=\"{}\",engine=\"0\"", escape_label(model_name));
    let mut out = String::with_capacity(4096);
    let gauge = |out: &mut String, name: &str, help: &str, value: f64| {
        let _ =
            write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {}\n", float(value));
    };
    let counter = |out: &mut String, name: &str, help: &str, value: u64| {
        let _ = write!(
            out,
            "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total{{{labels}}} {}\n\
             # HELP {name}_created {help}\n# TYPE {name}_created gauge\n{name}_created{{{labels}}} {}\n",
            float(value as f64),
            float(metrics.created_unix_s),
        );
    };

    gauge(
        &mut out,
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        metrics.running as f64,
    );
    gauge(
        &mut out,
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        metrics.waiting as f64,
    );
    gauge(
        &mut out,
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        metrics.kv_usage,
    );
    counter(
        &mut out,
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        metrics.prefix_queries_tokens,
    );
    counter(
        &mut out,
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        metrics.prefix_hits_tokens,
    );
    counter(&mut out, "vllm:prompt_tokens", "Number of prefill tokens processed.", metrics.prompt_tokens);
    counter(
        &mut out,
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        metrics.generation_tokens,
    );

    let name = "vllm:time_to_first_token_seconds";
    let help = "Histogram of time to first token in seconds.";
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cumulative = 0;
    for (bound, count) in metrics.ttft.bounds.iter().zip(&metrics.ttft.counts) {
        cumulative += count;
        let _ =
            writeln!(out, "{name}_bucket{{le=\"{}\",{labels}}} {}", float(*bound), float(cumulative as f64));
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\",{labels}}} {}", float(metrics.ttft.count as f64));
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", float(metrics.ttft.count as f64));
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", float(metrics.ttft.sum));
    let _ = write!(
        out,
        "# HELP {name}_created {help}\n# TYPE {name}_created gauge\n{name}_created{{{labels}}} {}\n",
        float(metrics.created_unix_s)
    );
    out
}

/// Python's `repr(float)`: integral values keep a `.0`.
fn float(value: f64) -> String {
    if value.is_finite() && value.fract() == 0.0 && value.abs() < 1e16 {
        format!("{value:.1}")
    } else {
        format!("{value}")
    }
}

fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_vllm_names_types_and_labels() {
        let mut metrics = ReplicaMetrics::new(1_700_000_000.0);
        metrics.running = 2;
        metrics.prefix_queries_tokens = 100;
        metrics.prefix_hits_tokens = 64;
        metrics.ttft.observe(0.03);
        metrics.ttft.observe(3.0);
        let text = render_vllm(&metrics, "demo\"model");
        assert!(text.contains("# TYPE vllm:num_requests_running gauge\n"));
        assert!(text.contains("vllm:num_requests_running{model_name=\"demo\\\"model\",engine=\"0\"} 2.0\n"));
        assert!(text.contains("# TYPE vllm:prefix_cache_queries_total counter\n"));
        assert!(
            text.contains("vllm:prefix_cache_hits_total{model_name=\"demo\\\"model\",engine=\"0\"} 64.0\n")
        );
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{le=\"0.04\",model_name="));
        // Buckets are cumulative: 0.03 lands in le=0.04, 3.0 in le=5.0.
        assert!(text.contains("_bucket{le=\"0.02\",model_name=\"demo\\\"model\",engine=\"0\"} 0.0\n"));
        assert!(text.contains("_bucket{le=\"0.04\",model_name=\"demo\\\"model\",engine=\"0\"} 1.0\n"));
        assert!(text.contains("_bucket{le=\"5.0\",model_name=\"demo\\\"model\",engine=\"0\"} 2.0\n"));
        assert!(text.contains("_bucket{le=\"+Inf\",model_name=\"demo\\\"model\",engine=\"0\"} 2.0\n"));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_sum{model_name=\"demo\\\"model\",engine=\"0\"} 3.03\n"
        ));
    }

    #[test]
    fn floats_print_like_python() {
        assert_eq!(float(1.0), "1.0");
        assert_eq!(float(0.25), "0.25");
        assert_eq!(float(2560.0), "2560.0");
    }
}
