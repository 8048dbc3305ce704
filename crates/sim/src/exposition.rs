//! What a replica reports on `/metrics`: the counters it keeps and the text each engine flavor serves.
//!
//! Three flavors, each rendered the way Python's `prometheus_client` renders that engine's metrics,
//! so a scraper cannot tell us from the real thing by names, types, labels, buckets or format:
//!
//! - [`Flavor::Vllm`]: vLLM V1 as of 0.12+ (`vllm/v1/metrics/loggers.py`): `kv_cache_usage_perc`,
//!   `prefix_cache_queries/hits`, `inter_token_latency_seconds`, ...; labels `model_name`, `engine`.
//! - [`Flavor::VllmLegacy`]: the pre-0.12 names (`gpu_cache_usage_perc`, `gpu_prefix_cache_queries/hits`,
//!   `time_per_output_token_seconds`) and nothing of the new ones, as vLLM 0.7-0.8 exported them.
//! - [`Flavor::Sglang`]: SGLang (`python/sglang/srt/metrics/collector.py`): scheduler gauges labelled
//!   `model_name, engine_type, tp_rank, pp_rank`, tokenizer counters and histograms labelled `model_name`,
//!   SGLang's own buckets, and no `_created` series (SGLang runs prometheus_client in multiprocess mode).
//!
//! Counters carry `_total` and (vLLM) a `_created` gauge; floats print as Python prints them.
//!
//! Disaggregated prefill/decode ([`PdMetrics`]): a vLLM replica with a role serves the NixlConnector's
//! metrics (`vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py`: `vllm:nixl_xfer_time_seconds`,
//! `vllm:nixl_post_time_seconds`, `vllm:nixl_bytes_transferred`, `vllm:nixl_num_descriptors`,
//! `vllm:nixl_num_failed_transfers`, `vllm:nixl_num_failed_notifications`, `vllm:nixl_num_kv_expired_reqs`),
//! which vLLM registers only with a KV connector; SGLang always serves its P/D gauges
//! (`sglang:num_prefill_prealloc_queue_reqs`, `..._inflight_queue_reqs`, `sglang:num_decode_prealloc_queue_reqs`,
//! `..._transfer_queue_reqs`, `sglang:kv_transfer_speed_gb_s`, `sglang:kv_transfer_latency_ms`) and the
//! counters `sglang:num_bootstrap_failed_reqs_total` and `sglang:num_transfer_failed_reqs_total`. Every flavor
//! adds `fleet_sim_replica_info{role}` (the emulator's own family: no engine exports its role).

use std::fmt::Write as _;
use std::str::FromStr;

use crate::pd::Role;

/// Which engine's metrics a replica imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flavor {
    #[default]
    Vllm,
    VllmLegacy,
    Sglang,
}

impl FromStr for Flavor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "vllm" => Ok(Flavor::Vllm),
            "vllm-legacy" => Ok(Flavor::VllmLegacy),
            "sglang" => Ok(Flavor::Sglang),
            other => Err(format!("unknown flavor {other:?}; use vllm, vllm-legacy or sglang")),
        }
    }
}

impl Flavor {
    pub fn name(self) -> &'static str {
        match self {
            Flavor::Vllm => "vllm",
            Flavor::VllmLegacy => "vllm-legacy",
            Flavor::Sglang => "sglang",
        }
    }
}

/// vLLM's buckets for `time_to_first_token_seconds`.
pub const VLLM_TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's buckets for inter-token latency and time per output token.
pub const VLLM_ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// vLLM's `request_latency_buckets` (e2e, queue, inference, prefill, decode).
pub const VLLM_REQUEST_LATENCY_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];
/// vLLM's buckets for `iteration_tokens_total`.
pub const VLLM_ITERATION_TOKEN_BUCKETS: [f64; 13] =
    [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0];
/// vLLM's buckets for `request_params_n`.
pub const VLLM_N_BUCKETS: [f64; 5] = [1.0, 2.0, 5.0, 10.0, 20.0];
/// SGLang's default TTFT buckets.
pub const SGLANG_TTFT_BUCKETS: [f64; 18] =
    [0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0];
/// SGLang's default inter-token latency buckets.
pub const SGLANG_ITL_BUCKETS: [f64; 23] = [
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4, 0.6,
    0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
];
/// SGLang's default e2e latency buckets (also used here for its queue time).
pub const SGLANG_E2E_BUCKETS: [f64; 22] = [
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
    600.0, 1200.0, 1800.0, 2400.0,
];

/// vLLM's NIXL buckets for `nixl_post_time_seconds`; `nixl_xfer_time_seconds` drops the first.
pub const NIXL_TIME_BUCKETS: [f64; 13] =
    [0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0];
/// vLLM's NIXL buckets for `nixl_num_descriptors`.
pub const NIXL_DESCRIPTOR_BUCKETS: [f64; 14] =
    [10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 200.0, 400.0, 1000.0, 2000.0, 4000.0, 10000.0, 20000.0, 50000.0];

/// vLLM's NIXL buckets for `nixl_bytes_transferred`: 2 KiB to 8 GiB, every other power of two.
pub fn nixl_byte_buckets() -> Vec<f64> {
    (1..25).step_by(2).map(|i| 2f64.powi(10 + i)).collect()
}

/// What a replica reports about disaggregated prefill/decode.
#[derive(Debug, Clone, PartialEq)]
pub struct PdMetrics {
    pub role: Role,
    /// Decode side: per transfer, seconds, bytes and descriptors (blocks).
    pub xfer_time: Histogram,
    pub post_time: Histogram,
    pub bytes: Histogram,
    pub descriptors: Histogram,
    /// The fixed part of a transfer, observed as its post time.
    pub post_seconds: f64,
    /// Decode side: transfers that failed.
    pub failed_transfers: u64,
    /// Decode side (SGLang): requests waiting for their prefill's KV to be ready (prealloc queue).
    pub decode_waiting: u32,
    /// The latest transfer's latency (ms) and speed (GB/s), as SGLang's prefill side reports them.
    pub last_latency_ms: f64,
    pub last_speed_gb_s: f64,
    /// Pulls refused: unknown request, expired lease, room that never came (bootstrap failures).
    pub failed_pulls: u64,
}

impl PdMetrics {
    pub fn new(role: Role, post_seconds: f64) -> Self {
        Self {
            role,
            xfer_time: Histogram::new(&NIXL_TIME_BUCKETS[1..]),
            post_time: Histogram::new(&NIXL_TIME_BUCKETS),
            bytes: Histogram::new(&nixl_byte_buckets()),
            descriptors: Histogram::new(&NIXL_DESCRIPTOR_BUCKETS),
            post_seconds,
            failed_transfers: 0,
            decode_waiting: 0,
            last_latency_ms: 0.0,
            last_speed_gb_s: 0.0,
            failed_pulls: 0,
        }
    }

    /// One transfer ended (decode side).
    pub fn observe_transfer(&mut self, seconds: f64, bytes: u64, blocks: u32, failed: bool) {
        if failed {
            self.failed_transfers += 1;
            return;
        }
        self.xfer_time.observe(seconds);
        self.post_time.observe(self.post_seconds.min(seconds));
        self.bytes.observe(bytes as f64);
        self.descriptors.observe(f64::from(blocks));
        self.record_latency(seconds, bytes);
    }

    /// The latest transfer's latency and speed.
    pub fn record_latency(&mut self, seconds: f64, bytes: u64) {
        self.last_latency_ms = seconds * 1e3;
        self.last_speed_gb_s = if seconds > 0.0 { bytes as f64 / seconds / 1e9 } else { 0.0 };
    }
}

/// vLLM's `build_1_2_5_buckets(max_value)`: 1, 2, 5, 10, 20, 50, ... up to `max_value`.
pub fn buckets_1_2_5(max_value: u32) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1u64;
    loop {
        for m in [1u64, 2, 5] {
            let value = m * scale;
            if value > u64::from(max_value) {
                return out;
            }
            out.push(value as f64);
        }
        scale *= 10;
    }
}

/// A cumulative histogram with fixed upper bounds (the `+Inf` bucket is `count`).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: Vec<f64>,
    /// Non-cumulative counts per bound; cumulated when rendered.
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Self {
        Self { bounds: bounds.to_vec(), counts: vec![0; bounds.len()], count: 0, sum: 0.0 }
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

    pub fn sum(&self) -> f64 {
        self.sum
    }
}

/// Everything one replica reports, whatever the flavor. Gauges and token counters are copied from
/// the engine model's stats; latency histograms are observed by the driver from engine events.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaMetrics {
    pub flavor: Flavor,
    pub running: u32,
    pub waiting: u32,
    /// Fraction of KV blocks held by requests, 0..=1.
    pub kv_usage: f64,
    pub used_blocks: u32,
    pub num_gpu_blocks: u32,
    pub block_tokens: u32,
    pub prefix_queries_tokens: u64,
    pub prefix_hits_tokens: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub preemptions: u64,
    pub finished_stop: u64,
    pub finished_length: u64,
    pub finished_abort: u64,
    /// Requests finished with `error` (a failed KV load under the `fail` policy).
    pub finished_error: u64,
    /// Decode side: requests whose KV transfer is running.
    pub kv_loading: u32,
    /// Prefill side: finished requests whose blocks are held for a pull.
    pub kv_held: u32,
    /// Prefill side: held requests whose lease ran out.
    pub kv_expired_holds: u64,
    pub pd: PdMetrics,
    pub ttft: Histogram,
    pub itl: Histogram,
    /// Per request: decode time / (output tokens - 1) (vLLM's `request_time_per_output_token_seconds`).
    pub tpot: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    pub inference: Histogram,
    pub prefill: Histogram,
    pub decode: Histogram,
    pub request_prompt_tokens: Histogram,
    pub request_generation_tokens: Histogram,
    pub request_max_tokens: Histogram,
    pub request_n: Histogram,
    pub iteration_tokens: Histogram,
    /// Unix seconds at which the counters started (the `_created` series).
    pub created_unix_s: f64,
}

impl ReplicaMetrics {
    /// Empty metrics for `flavor`, with token-count buckets up to `max_model_len`.
    pub fn new(flavor: Flavor, max_model_len: u32, created_unix_s: f64) -> Self {
        let (ttft, itl, latency) = match flavor {
            Flavor::Sglang => (&SGLANG_TTFT_BUCKETS[..], &SGLANG_ITL_BUCKETS[..], &SGLANG_E2E_BUCKETS[..]),
            Flavor::Vllm | Flavor::VllmLegacy => {
                (&VLLM_TTFT_BUCKETS[..], &VLLM_ITL_BUCKETS[..], &VLLM_REQUEST_LATENCY_BUCKETS[..])
            }
        };
        let lengths = buckets_1_2_5(max_model_len);
        Self {
            flavor,
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
            used_blocks: 0,
            num_gpu_blocks: 0,
            block_tokens: 16,
            prefix_queries_tokens: 0,
            prefix_hits_tokens: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            preemptions: 0,
            finished_stop: 0,
            finished_length: 0,
            finished_abort: 0,
            finished_error: 0,
            kv_loading: 0,
            kv_held: 0,
            kv_expired_holds: 0,
            pd: PdMetrics::new(Role::Both, 0.0),
            ttft: Histogram::new(ttft),
            itl: Histogram::new(itl),
            tpot: Histogram::new(&VLLM_ITL_BUCKETS),
            e2e: Histogram::new(latency),
            queue: Histogram::new(latency),
            inference: Histogram::new(latency),
            prefill: Histogram::new(latency),
            decode: Histogram::new(latency),
            request_prompt_tokens: Histogram::new(&lengths),
            request_generation_tokens: Histogram::new(&lengths),
            request_max_tokens: Histogram::new(&lengths),
            request_n: Histogram::new(&VLLM_N_BUCKETS),
            iteration_tokens: Histogram::new(&VLLM_ITERATION_TOKEN_BUCKETS),
            created_unix_s,
        }
    }
}

/// Static facts about the replica that `/metrics` labels carry.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpositionInfo {
    pub model_name: String,
    /// vLLM's `engine` label (the engine index inside one server: always 0 here, one engine per replica).
    pub engine_index: u32,
    pub enable_prefix_caching: bool,
}

/// Renders `metrics` in their flavor.
pub fn render(metrics: &ReplicaMetrics, info: &ExpositionInfo) -> String {
    let mut text = match metrics.flavor {
        Flavor::Vllm | Flavor::VllmLegacy => render_vllm(metrics, info),
        Flavor::Sglang => render_sglang(metrics, info),
    };
    let _ = write!(
        text,
        "# HELP fleet_sim_replica_info The emulated replica's disaggregation role (prefill, decode or both).\n\
         # TYPE fleet_sim_replica_info gauge\n\
         fleet_sim_replica_info{{model_name=\"{}\",role=\"{}\",flavor=\"{}\"}} 1.0\n",
        escape_label(&info.model_name),
        metrics.pd.role,
        metrics.flavor.name()
    );
    text
}

/// A body that is not valid exposition text: what a fault-injected replica serves (a truncated
/// write, a sample without a value, a histogram without `+Inf`).
pub fn render_malformed(info: &ExpositionInfo) -> String {
    format!(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{model_name=\"{}\",engine=\"0\"\n\
         vllm:kv_cache_usage_perc{{model_name=\"x\"}} not-a-number\n\
         # TYPE vllm:time_to_first_token_seconds histogram\n\
         vllm:time_to_first_token_seconds_bucket{{le=\"0.1\"}} 3.0\n\
         vllm:time_to_first_token_seconds_count 1",
        escape_label(&info.model_name)
    )
}

struct Writer {
    out: String,
    /// Rendered label pairs shared by every sample of a family (`a="x",b="y"`).
    labels: String,
    /// `Some(ts)` emits `_created` gauges for counters and histograms (vLLM), `None` omits them.
    created: Option<f64>,
}

impl Writer {
    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        let _ = write!(
            self.out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{}}} {}\n",
            self.labels,
            float(value)
        );
    }

    fn created(&mut self, name: &str, help: &str, extra: &[&str]) {
        if let Some(created) = self.created {
            let _ = writeln!(self.out, "# HELP {name}_created {help}\n# TYPE {name}_created gauge");
            for labels in extra {
                let _ = writeln!(self.out, "{name}_created{{{}{labels}}} {}", self.labels, float(created));
            }
        }
    }

    /// A counter family `name` (without `_total`), one sample per `(extra labels, value)`.
    fn counters(&mut self, name: &str, help: &str, samples: &[(&str, u64)]) {
        let _ = writeln!(self.out, "# HELP {name}_total {help}\n# TYPE {name}_total counter");
        for (extra, value) in samples {
            let _ = writeln!(self.out, "{name}_total{{{}{extra}}} {}", self.labels, float(*value as f64));
        }
        let extras: Vec<&str> = samples.iter().map(|(extra, _)| *extra).collect();
        self.created(name, help, &extras);
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.counters(name, help, &[("", value)]);
    }

    fn histogram(&mut self, name: &str, help: &str, histogram: &Histogram) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, count) in histogram.bounds.iter().zip(&histogram.counts) {
            cumulative += count;
            let _ = writeln!(
                self.out,
                "{name}_bucket{{{},le=\"{}\"}} {}",
                self.labels,
                float(*bound),
                float(cumulative as f64)
            );
        }
        let _ = writeln!(
            self.out,
            "{name}_bucket{{{},le=\"+Inf\"}} {}\n{name}_count{{{}}} {}\n{name}_sum{{{}}} {}",
            self.labels,
            float(histogram.count as f64),
            self.labels,
            float(histogram.count as f64),
            self.labels,
            float(histogram.sum)
        );
        self.created(name, help, &[""]);
    }
}

fn render_vllm(m: &ReplicaMetrics, info: &ExpositionInfo) -> String {
    let legacy = m.flavor == Flavor::VllmLegacy;
    let mut w = Writer {
        out: String::with_capacity(24 * 1024),
        labels: format!("model_name=\"{}\",engine=\"{}\"", escape_label(&info.model_name), info.engine_index),
        created: Some(m.created_unix_s),
    };
    w.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        f64::from(m.running),
    );
    w.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", f64::from(m.waiting));
    if legacy {
        w.gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", m.kv_usage);
        w.counter(
            "vllm:gpu_prefix_cache_queries",
            "GPU prefix cache queries, in terms of number of queried tokens.",
            m.prefix_queries_tokens,
        );
        w.counter(
            "vllm:gpu_prefix_cache_hits",
            "GPU prefix cache hits, in terms of number of cached tokens.",
            m.prefix_hits_tokens,
        );
    } else {
        w.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", m.kv_usage);
        w.counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            m.prefix_queries_tokens,
        );
        w.counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            m.prefix_hits_tokens,
        );
    }
    w.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", m.preemptions);
    w.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", m.prompt_tokens);
    w.counter("vllm:generation_tokens", "Number of generation tokens processed.", m.generation_tokens);
    let mut reasons = vec![
        (",finished_reason=\"stop\"", m.finished_stop),
        (",finished_reason=\"length\"", m.finished_length),
        (",finished_reason=\"abort\"", m.finished_abort),
    ];
    if m.pd.role != Role::Both {
        reasons.push((",finished_reason=\"error\"", m.finished_error));
    }
    w.counters("vllm:request_success", "Count of successfully processed requests.", &reasons);
    w.histogram(
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        &m.request_prompt_tokens,
    );
    w.histogram(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        &m.request_generation_tokens,
    );
    w.histogram(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        &m.iteration_tokens,
    );
    w.histogram(
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        &m.request_max_tokens,
    );
    w.histogram("vllm:request_params_n", "Histogram of the n request parameter.", &m.request_n);
    w.histogram(
        "vllm:request_params_max_tokens",
        "Histogram of the max_tokens request parameter.",
        &m.request_max_tokens,
    );
    w.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &m.ttft);
    if legacy {
        w.histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            &m.itl,
        );
    } else {
        w.histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &m.itl,
        );
        w.histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            &m.tpot,
        );
    }
    w.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", &m.e2e);
    w.histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        &m.queue,
    );
    w.histogram(
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        &m.inference,
    );
    w.histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        &m.prefill,
    );
    w.histogram(
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        &m.decode,
    );
    if m.pd.role != Role::Both {
        render_nixl(&mut w, m);
    }
    // vLLM's info gauge: CacheConfig.metrics_info() as labels, set to 1.
    let _ = write!(
        w.out,
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"auto\",calculate_kv_scales=\"False\",\
         cpu_offload_gb=\"0\",enable_prefix_caching=\"{}\",engine=\"{}\",gpu_memory_utilization=\"0.9\",\
         is_attention_free=\"False\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\",num_gpu_blocks_override=\"None\",\
         prefix_caching_hash_algo=\"sha256\",sliding_window=\"None\",swap_space=\"4\"}} 1.0\n",
        m.block_tokens,
        if info.enable_prefix_caching { "True" } else { "False" },
        info.engine_index,
        m.num_gpu_blocks,
    );
    w.out
}

/// The NixlConnector's metrics (`NixlPromMetrics`), labelled like the engine's own.
fn render_nixl(w: &mut Writer, m: &ReplicaMetrics) {
    let pd = &m.pd;
    w.histogram(
        "vllm:nixl_xfer_time_seconds",
        "Histogram of transfer duration for NIXL KV Cache transfers.",
        &pd.xfer_time,
    );
    w.histogram(
        "vllm:nixl_post_time_seconds",
        "Histogram of transfer post time for NIXL KV Cache transfers.",
        &pd.post_time,
    );
    w.histogram(
        "vllm:nixl_bytes_transferred",
        "Histogram of bytes transferred per NIXL KV Cache transfers.",
        &pd.bytes,
    );
    w.histogram(
        "vllm:nixl_num_descriptors",
        "Histogram of number of descriptors per NIXL  KV Cache transfers.",
        &pd.descriptors,
    );
    w.counter(
        "vllm:nixl_num_failed_transfers",
        "Number of failed NIXL KV Cache transfers.",
        pd.failed_transfers,
    );
    w.counter("vllm:nixl_num_failed_notifications", "Number of failed NIXL KV Cache notifications.", 0);
    w.counter(
        "vllm:nixl_num_kv_expired_reqs",
        "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.",
        m.kv_expired_holds,
    );
}

fn render_sglang(m: &ReplicaMetrics, info: &ExpositionInfo) -> String {
    let model = escape_label(&info.model_name);
    let scheduler_labels =
        format!("model_name=\"{model}\",engine_type=\"unified\",tp_rank=\"0\",pp_rank=\"0\"");
    let mut w = Writer { out: String::with_capacity(16 * 1024), labels: scheduler_labels, created: None };
    let total_tokens = u64::from(m.num_gpu_blocks) * u64::from(m.block_tokens);
    let used_tokens = u64::from(m.used_blocks) * u64::from(m.block_tokens);
    let hit_rate = if m.prefix_queries_tokens == 0 {
        0.0
    } else {
        m.prefix_hits_tokens as f64 / m.prefix_queries_tokens as f64
    };
    w.gauge("sglang:num_running_reqs", "The number of running requests.", f64::from(m.running));
    w.gauge("sglang:num_used_tokens", "The number of used tokens.", used_tokens as f64);
    w.gauge("sglang:token_usage", "The token usage.", m.kv_usage);
    w.gauge("sglang:gen_throughput", "The generation throughput (token/s).", 0.0);
    w.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", f64::from(m.waiting));
    w.gauge("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", 0.0);
    w.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", hit_rate);
    w.gauge(
        "sglang:max_total_num_tokens",
        "Maximum total number of tokens in the KV cache pool.",
        total_tokens as f64,
    );
    w.counter(
        "sglang:num_retracted_requests",
        "Total number of retracted requests due to kvcache full.",
        m.preemptions,
    );
    // P/D disaggregation (always registered by SGLang; zero outside its role). The prefill side's
    // bootstrap (prealloc) queue is empty here: the emulated prefill starts without waiting for the decode
    // side's handshake. SGLang's prefill side measures the transfer's latency and speed.
    let (prefill, decode) = (m.pd.role == Role::Prefill, m.pd.role == Role::Decode);
    w.gauge(
        "sglang:num_prefill_prealloc_queue_reqs",
        "The number of requests in the prefill prealloc queue.",
        0.0,
    );
    w.gauge(
        "sglang:num_prefill_inflight_queue_reqs",
        "The number of requests in the prefill inflight queue.",
        if prefill { f64::from(m.kv_held) } else { 0.0 },
    );
    w.gauge(
        "sglang:num_decode_prealloc_queue_reqs",
        "The number of requests in the decode prealloc queue.",
        if decode { f64::from(m.pd.decode_waiting) } else { 0.0 },
    );
    w.gauge(
        "sglang:num_decode_transfer_queue_reqs",
        "The number of requests in the decode transfer queue.",
        if decode { f64::from(m.kv_loading) } else { 0.0 },
    );
    w.gauge(
        "sglang:kv_transfer_speed_gb_s",
        "The transfer speed of the KV cache in GB/s.",
        if prefill { m.pd.last_speed_gb_s } else { 0.0 },
    );
    w.gauge(
        "sglang:kv_transfer_latency_ms",
        "The transfer latency of the KV cache in ms.",
        if prefill { m.pd.last_latency_ms } else { 0.0 },
    );
    w.counter(
        "sglang:num_bootstrap_failed_reqs",
        "The number of bootstrap failed requests.",
        m.pd.failed_pulls + if prefill { m.kv_expired_holds } else { 0 },
    );
    w.counter(
        "sglang:num_transfer_failed_reqs",
        "The number of transfer failed requests.",
        m.pd.failed_transfers,
    );
    w.labels = format!("model_name=\"{model}\"");
    w.counter("sglang:prompt_tokens", "Number of prefill tokens processed.", m.prompt_tokens);
    w.counter("sglang:generation_tokens", "Number of generation tokens processed.", m.generation_tokens);
    w.counter("sglang:cached_tokens", "Number of cached prompt tokens.", m.prefix_hits_tokens);
    w.counter(
        "sglang:num_requests",
        "Number of requests processed.",
        m.finished_stop + m.finished_length + m.finished_abort,
    );
    w.counter("sglang:num_aborted_requests", "Number of requests aborted.", m.finished_abort);
    w.histogram(
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &m.ttft,
    );
    w.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &m.itl);
    w.histogram(
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
        &m.e2e,
    );
    w.histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", &m.queue);
    w.out
}

/// Python's `repr(float)` closely enough for exposition: integral values keep a `.0`.
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

    fn info() -> ExpositionInfo {
        ExpositionInfo { model_name: "demo\"model".into(), engine_index: 0, enable_prefix_caching: true }
    }

    #[test]
    fn renders_vllm_names_types_labels_and_cumulative_buckets() {
        let mut m = ReplicaMetrics::new(Flavor::Vllm, 4096, 1_700_000_000.0);
        m.running = 2;
        m.prefix_hits_tokens = 64;
        m.ttft.observe(0.03);
        m.ttft.observe(3.0);
        let text = render(&m, &info());
        let labels = "model_name=\"demo\\\"model\",engine=\"0\"";
        assert!(text.contains("# TYPE vllm:num_requests_running gauge\n"));
        assert!(text.contains(&format!("vllm:num_requests_running{{{labels}}} 2.0\n")));
        assert!(text.contains(&format!("vllm:prefix_cache_hits_total{{{labels}}} 64.0\n")));
        assert!(
            text.contains(&format!(
                "vllm:request_success_total{{{labels},finished_reason=\"length\"}} 0.0\n"
            ))
        );
        assert!(
            text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{labels},le=\"0.02\"}} 0.0\n"))
        );
        assert!(
            text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{labels},le=\"0.04\"}} 1.0\n"))
        );
        assert!(
            text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{labels},le=\"5.0\"}} 2.0\n"))
        );
        assert!(
            text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{labels},le=\"+Inf\"}} 2.0\n"))
        );
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_sum{{{labels}}} 3.03\n")));
        assert!(text.contains("vllm:inter_token_latency_seconds_bucket"));
        assert!(!text.contains("gpu_cache_usage_perc"));
        assert!(text.contains("vllm:cache_config_info{block_size=\"16\""));
    }

    #[test]
    fn legacy_and_sglang_use_their_own_names() {
        let legacy = render(&ReplicaMetrics::new(Flavor::VllmLegacy, 4096, 0.0), &info());
        for name in [
            "vllm:gpu_cache_usage_perc",
            "vllm:gpu_prefix_cache_queries_total",
            "vllm:time_per_output_token_seconds",
        ] {
            assert!(legacy.contains(name), "{name}");
        }
        for name in ["vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "inter_token_latency"] {
            assert!(!legacy.contains(name), "{name}");
        }
        let sglang = render(&ReplicaMetrics::new(Flavor::Sglang, 4096, 0.0), &info());
        assert!(sglang.contains("sglang:num_running_reqs{model_name=\"demo\\\"model\",engine_type=\"unified\",tp_rank=\"0\",pp_rank=\"0\"} 0.0\n"));
        assert!(sglang.contains("sglang:cached_tokens_total{model_name=\"demo\\\"model\"} 0.0\n"));
        assert!(sglang.contains("le=\"400.0\""));
        assert!(!sglang.contains("_created") && !sglang.contains("vllm:"));
    }

    #[test]
    fn pd_families_follow_the_role_and_the_flavor() {
        let labels = "model_name=\"demo\\\"model\",engine=\"0\"";
        let mut m = ReplicaMetrics::new(Flavor::Vllm, 4096, 0.0);
        let text = render(&m, &info());
        assert!(
            !text.contains("vllm:nixl_") && !text.contains("finished_reason=\"error\""),
            "no connector, no NIXL"
        );
        assert!(text.contains(
            "fleet_sim_replica_info{model_name=\"demo\\\"model\",role=\"both\",flavor=\"vllm\"} 1.0\n"
        ));
        m.pd = PdMetrics::new(Role::Decode, 0.0005);
        m.pd.observe_transfer(0.0105, 1 << 20, 8, false);
        m.pd.observe_transfer(0.02, 0, 0, true);
        m.finished_error = 1;
        let text = render(&m, &info());
        assert!(text.contains(&format!("vllm:nixl_xfer_time_seconds_bucket{{{labels},le=\"0.01\"}} 0.0\n")));
        assert!(text.contains(&format!("vllm:nixl_xfer_time_seconds_bucket{{{labels},le=\"0.025\"}} 1.0\n")));
        assert!(text.contains(&format!("vllm:nixl_bytes_transferred_sum{{{labels}}} 1048576.0\n")));
        assert!(text.contains(&format!("vllm:nixl_post_time_seconds_sum{{{labels}}} 0.0005\n")));
        assert!(text.contains(&format!("vllm:nixl_num_failed_transfers_total{{{labels}}} 1.0\n")));
        assert!(
            text.contains(&format!("vllm:request_success_total{{{labels},finished_reason=\"error\"}} 1.0\n"))
        );
        assert!(text.contains("role=\"decode\""));

        let scheduler = "model_name=\"demo\\\"model\",engine_type=\"unified\",tp_rank=\"0\",pp_rank=\"0\"";
        let mut m = ReplicaMetrics::new(Flavor::Sglang, 4096, 0.0);
        m.pd = PdMetrics::new(Role::Prefill, 0.0);
        m.kv_held = 2;
        m.kv_loading = 5;
        m.pd.record_latency(0.02, 2_000_000_000);
        let text = render(&m, &info());
        assert!(text.contains(&format!("sglang:num_prefill_inflight_queue_reqs{{{scheduler}}} 2.0\n")));
        assert!(
            text.contains(&format!("sglang:num_decode_transfer_queue_reqs{{{scheduler}}} 0.0\n")),
            "not its role"
        );
        assert!(text.contains(&format!("sglang:kv_transfer_latency_ms{{{scheduler}}} 20.0\n")));
        assert!(text.contains(&format!("sglang:kv_transfer_speed_gb_s{{{scheduler}}} 100.0\n")));
        m.pd.role = Role::Decode;
        let text = render(&m, &info());
        assert!(text.contains(&format!("sglang:num_decode_transfer_queue_reqs{{{scheduler}}} 5.0\n")));
        assert!(
            text.contains(&format!("sglang:kv_transfer_latency_ms{{{scheduler}}} 0.0\n")),
            "the prefill side times it"
        );
        assert!(!text.contains("vllm:"));
    }

    #[test]
    fn one_two_five_buckets_match_vllm() {
        assert_eq!(buckets_1_2_5(100), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(buckets_1_2_5(1).len(), 1);
    }

    #[test]
    fn floats_print_like_python() {
        assert_eq!(float(1.0), "1.0");
        assert_eq!(float(0.25), "0.25");
        assert_eq!(float(2560.0), "2560.0");
    }
}
