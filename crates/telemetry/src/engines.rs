//! Serving engines: how each is recognised from its metric names and labels, and where each
//! normalised signal lives in its exposition.
//!
//! Every engine is described by one [`Profile`]: data, not code. The same profiles drive the
//! local reader here ([`read`]) and the PromQL the Prometheus source sends (`prometheus.rs`),
//! so both sources give the same signals. Names come from each engine's own source; the
//! fixtures under `tests/fixtures/` cite them.
//!
//! Aggregation rules, and why:
//! - A rank is a data-parallel engine, labelled `engine` (vLLM) or `dp_rank` (SGLang, Dynamo).
//!   Gauges and counters add up over ranks; KV usage is averaged (it is a fraction).
//! - Within a rank, series that carry a non-zero `tp_rank`, `pp_rank`, `moe_ep_rank` or
//!   `attn_tp_rank` are skipped: tensor/pipeline-parallel workers of one engine report the same
//!   batch, and adding them up would count it several times.
//! - Histograms add bucket counts with the same bound over the remaining series.

use std::collections::BTreeMap;

use crate::exposition::{Exposition, Sample};
use crate::signals::{Histogram, Reading, Values, rank_order};

/// Serving engines recognised by their metric names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    /// vLLM (also llm-d-inference-sim, which emits vLLM's names).
    Vllm,
    Sglang,
    /// Hugging Face Text Generation Inference.
    Tgi,
    /// llama.cpp's `llama-server --metrics`.
    LlamaCpp,
    /// TensorRT-LLM's `trtllm-serve`.
    TrtLlm,
    /// Triton Inference Server (with the TensorRT-LLM backend for the LLM signals).
    Triton,
    /// NVIDIA Dynamo frontend or worker.
    Dynamo,
}

impl Engine {
    /// The engine's short, stable name (`--json`, the UI, the history).
    pub fn name(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Tgi => "tgi",
            Engine::LlamaCpp => "llamacpp",
            Engine::TrtLlm => "trtllm",
            Engine::Triton => "triton",
            Engine::Dynamo => "dynamo",
        }
    }
}

/// The exposition matched no known engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported engine: none of vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM, Triton or Dynamo metric \
     names among the {} families seen ({})",
    families.len(),
    preview(families)
)]
pub struct UnsupportedEngine {
    pub families: Vec<String>,
}

fn preview(families: &[String]) -> String {
    if families.is_empty() {
        return "the exposition is empty".into();
    }
    let shown: Vec<&str> = families.iter().take(12).map(String::as_str).collect();
    let more = families.len().saturating_sub(shown.len());
    if more > 0 { format!("{}, and {more} more", shown.join(", ")) } else { shown.join(", ") }
}

/// Where a number comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Src {
    /// The samples of one name.
    Metric(&'static str),
    /// The samples of one name whose label has a value.
    Select(&'static str, &'static str, &'static str),
    /// `a / b`, both read as gauges.
    Ratio(&'static Src, &'static Src),
    /// `max(a - b, 0)`.
    Minus(&'static Src, &'static Src),
    /// `a + b`.
    Plus(&'static Src, &'static Src),
    /// The first alternative the exposition has.
    First(&'static [Src]),
}

/// Where a latency distribution comes from; values are multiplied by `scale` to get seconds.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HistSrc {
    /// A histogram family (`base_bucket`, `base_sum`, `base_count`).
    Buckets { base: &'static str, scale: f64 },
    /// Only a total of seconds and a count (llama.cpp), which gives a mean.
    SumCount { sum: &'static str, count: &'static str, scale: f64 },
}

/// Where one engine keeps each signal. `None` or empty means "not provided".
#[derive(Debug, Clone, Copy)]
pub(crate) struct Profile {
    pub engine: Engine,
    pub flavor: &'static str,
    /// A name every exposition of this engine has; PromQL uses it to find the engine's targets.
    pub marker: &'static str,
    pub running: Option<Src>,
    pub waiting: Option<Src>,
    pub kv_usage: Option<Src>,
    /// `(lookups, hits)` counters.
    pub prefix: Option<(Src, Src)>,
    pub hit_rate_gauge: Option<Src>,
    pub prompt_tokens: Option<Src>,
    /// Prompt tokens served from a prefix cache instead of computed (a counter of tokens).
    pub prompt_tokens_cached: Option<Src>,
    pub generation_tokens: Option<Src>,
    pub preemptions: Option<Src>,
    pub ttft: &'static [HistSrc],
    pub itl: &'static [HistSrc],
    /// Labels that name the served model, most specific first.
    pub model_labels: &'static [&'static str],
}

const NONE: Profile = Profile {
    engine: Engine::Vllm,
    flavor: "",
    marker: "",
    running: None,
    waiting: None,
    kv_usage: None,
    prefix: None,
    hit_rate_gauge: None,
    prompt_tokens: None,
    prompt_tokens_cached: None,
    generation_tokens: None,
    preemptions: None,
    ttft: &[],
    itl: &[],
    model_labels: &["model_name", "model"],
};

// vLLM: vllm/v1/metrics/loggers.py (current) and vllm/engine/metrics.py (V0 / before 0.11).
const VLLM_BASE: Profile = Profile {
    engine: Engine::Vllm,
    flavor: "vLLM (current metric names)",
    marker: "vllm:num_requests_running",
    running: Some(Src::Metric("vllm:num_requests_running")),
    waiting: Some(Src::Metric("vllm:num_requests_waiting")),
    kv_usage: Some(Src::First(&[
        Src::Metric("vllm:kv_cache_usage_perc"),
        Src::Metric("vllm:gpu_cache_usage_perc"),
    ])),
    prefix: Some((
        Src::First(&[
            Src::Metric("vllm:prefix_cache_queries_total"),
            Src::Metric("vllm:gpu_prefix_cache_queries_total"),
        ]),
        Src::First(&[
            Src::Metric("vllm:prefix_cache_hits_total"),
            Src::Metric("vllm:gpu_prefix_cache_hits_total"),
        ]),
    )),
    hit_rate_gauge: Some(Src::Metric("vllm:gpu_prefix_cache_hit_rate")),
    prompt_tokens: Some(Src::Metric("vllm:prompt_tokens_total")),
    // Local and external cache hits (vLLM 0.32: `prompt_tokens_cached_total`, also by `source`).
    prompt_tokens_cached: Some(Src::Metric("vllm:prompt_tokens_cached_total")),
    generation_tokens: Some(Src::Metric("vllm:generation_tokens_total")),
    preemptions: Some(Src::Metric("vllm:num_preemptions_total")),
    ttft: &[HistSrc::Buckets { base: "vllm:time_to_first_token_seconds", scale: 1.0 }],
    itl: &[
        HistSrc::Buckets { base: "vllm:inter_token_latency_seconds", scale: 1.0 },
        HistSrc::Buckets { base: "vllm:time_per_output_token_seconds", scale: 1.0 },
    ],
    model_labels: &["model_name"],
};
pub(crate) const VLLM: Profile = VLLM_BASE;
pub(crate) const VLLM_LEGACY: Profile =
    Profile { flavor: "vLLM (legacy names: gpu_cache_usage_perc, gpu_prefix_cache_*)", ..VLLM_BASE };
pub(crate) const LLM_D_SIM: Profile = Profile { flavor: "llm-d-inference-sim (vLLM names)", ..VLLM_BASE };

// SGLang: python/sglang/srt/metrics/collector.py.
pub(crate) const SGLANG: Profile = Profile {
    engine: Engine::Sglang,
    flavor: "SGLang",
    marker: "sglang:num_running_reqs",
    running: Some(Src::Metric("sglang:num_running_reqs")),
    waiting: Some(Src::Metric("sglang:num_queue_reqs")),
    kv_usage: Some(Src::Metric("sglang:token_usage")),
    prefix: Some((Src::Metric("sglang:prompt_tokens_total"), Src::Metric("sglang:cached_tokens_total"))),
    hit_rate_gauge: Some(Src::Metric("sglang:cache_hit_rate")),
    prompt_tokens: Some(Src::Metric("sglang:prompt_tokens_total")),
    prompt_tokens_cached: Some(Src::Metric("sglang:cached_tokens_total")),
    generation_tokens: Some(Src::Metric("sglang:generation_tokens_total")),
    preemptions: Some(Src::Metric("sglang:num_retracted_requests_total")),
    ttft: &[HistSrc::Buckets { base: "sglang:time_to_first_token_seconds", scale: 1.0 }],
    itl: &[HistSrc::Buckets { base: "sglang:inter_token_latency_seconds", scale: 1.0 }],
    model_labels: &["model_name"],
};

// TGI: router/src/server.rs and backends/v3 (metrics-exporter-prometheus: counters have no
// `_total`). KV usage is the token budget the running batch holds over the budget TGI derived
// from free KV memory at start-up. TGI has no time-to-first-token histogram.
pub(crate) const TGI: Profile = Profile {
    engine: Engine::Tgi,
    flavor: "Hugging Face TGI",
    marker: "tgi_queue_size",
    running: Some(Src::Metric("tgi_batch_current_size")),
    waiting: Some(Src::Metric("tgi_queue_size")),
    kv_usage: Some(Src::Ratio(
        &Src::Metric("tgi_batch_current_max_tokens"),
        &Src::Metric("tgi_batch_max_total_tokens"),
    )),
    prompt_tokens: Some(Src::Metric("tgi_request_input_length_sum")),
    generation_tokens: Some(Src::Metric("tgi_request_generated_tokens_sum")),
    itl: &[HistSrc::Buckets { base: "tgi_request_mean_time_per_token_duration", scale: 1.0 }],
    model_labels: &[],
    ..NONE
};

// llama.cpp: `llama-server --metrics`, names from tools/server/server-task.cpp
// (`server_task_result_metrics::to_metrics`), checked against a real b11434 server by the e2e tests
// (tests/e2e/llamacpp.rs) and its capture in tests/fixtures/llamacpp-b11434.*.prom. No histograms, no
// labels. `prompt_tokens_total` counts only the prompt tokens it computed; the ones it took from a
// slot's cache or the host prompt cache are `prompt_tokens_cached_total` (since 2025), so the prompt
// tokens presented are their sum and the hit rate is cached / presented, in tokens as SGLang's.
// `kv_cache_usage_ratio` is only in older servers (the fixture llamacpp.*.prom); current ones have no
// KV-usage, TTFT or preemption figure in /metrics, so those are None. ITL is a mean: decode seconds
// (summed over slots) per generated token.
const LLAMACPP_PRESENTED: Src = Src::Plus(
    &Src::Metric("llamacpp:prompt_tokens_total"),
    &Src::Metric("llamacpp:prompt_tokens_cached_total"),
);
pub(crate) const LLAMACPP: Profile = Profile {
    engine: Engine::LlamaCpp,
    flavor: "llama.cpp server",
    marker: "llamacpp:requests_processing",
    running: Some(Src::Metric("llamacpp:requests_processing")),
    waiting: Some(Src::Metric("llamacpp:requests_deferred")),
    kv_usage: Some(Src::Metric("llamacpp:kv_cache_usage_ratio")),
    prefix: Some((LLAMACPP_PRESENTED, Src::Metric("llamacpp:prompt_tokens_cached_total"))),
    prompt_tokens: Some(Src::First(&[LLAMACPP_PRESENTED, Src::Metric("llamacpp:prompt_tokens_total")])),
    prompt_tokens_cached: Some(Src::Metric("llamacpp:prompt_tokens_cached_total")),
    generation_tokens: Some(Src::Metric("llamacpp:tokens_predicted_total")),
    itl: &[HistSrc::SumCount {
        sum: "llamacpp:tokens_predicted_seconds_total",
        count: "llamacpp:tokens_predicted_total",
        scale: 1.0,
    }],
    model_labels: &[],
    ..NONE
};

// TensorRT-LLM trtllm-serve: tensorrt_llm/metrics/collector.py (prefix `trtllm_`). Prefix reuse
// is counted in KV blocks: lookups are reused + missed blocks.
pub(crate) const TRTLLM: Profile = Profile {
    engine: Engine::TrtLlm,
    flavor: "TensorRT-LLM trtllm-serve",
    marker: "trtllm_time_to_first_token_seconds_count",
    running: Some(Src::Metric("trtllm_num_requests_running")),
    waiting: Some(Src::Metric("trtllm_num_requests_waiting")),
    kv_usage: Some(Src::Metric("trtllm_kv_cache_utilization")),
    prefix: Some((
        Src::Plus(
            &Src::Metric("trtllm_kv_cache_reused_blocks_total"),
            &Src::Metric("trtllm_kv_cache_missed_blocks_total"),
        ),
        Src::Metric("trtllm_kv_cache_reused_blocks_total"),
    )),
    hit_rate_gauge: Some(Src::Metric("trtllm_kv_cache_hit_rate")),
    prompt_tokens: Some(Src::Metric("trtllm_prompt_tokens_total")),
    generation_tokens: Some(Src::Metric("trtllm_generation_tokens_total")),
    ttft: &[HistSrc::Buckets { base: "trtllm_time_to_first_token_seconds", scale: 1.0 }],
    itl: &[HistSrc::Buckets { base: "trtllm_time_per_output_token_seconds", scale: 1.0 }],
    model_labels: &["model_name"],
    ..NONE
};

// Triton + TensorRT-LLM backend: tensorrtllm_backend README "Triton Metrics" (nv_trt_llm_*),
// Triton core metrics (nv_inference_*). TTFT is Triton's first-response histogram, which it
// exports only with `--metrics-config histogram_latencies=true` (milliseconds).
pub(crate) const TRITON: Profile = Profile {
    engine: Engine::Triton,
    flavor: "Triton Inference Server (TensorRT-LLM backend)",
    marker: "nv_trt_llm_request_metrics",
    running: Some(Src::Select("nv_trt_llm_request_metrics", "request_type", "active")),
    waiting: Some(Src::Select("nv_trt_llm_request_metrics", "request_type", "waiting")),
    kv_usage: Some(Src::First(&[
        Src::Select("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "fraction"),
        Src::Ratio(
            &Src::Select("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "used"),
            &Src::Select("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "max"),
        ),
    ])),
    ttft: &[HistSrc::Buckets { base: "nv_inference_first_response_histogram_ms", scale: 0.001 }],
    model_labels: &["model"],
    ..NONE
};

// Dynamo: lib/runtime/src/metrics/prometheus_names.rs. The frontend counts requests it holds:
// `queued_requests` wait for a first response, `inflight_requests` includes them. Its per-request
// histograms of input tokens and of cached tokens (prefix cache hits) give the hit rate in tokens: the
// increase of `cached_tokens_sum` over that of `input_sequence_tokens_sum`, as SGLang's counters do.
pub(crate) const DYNAMO_FRONTEND: Profile = Profile {
    engine: Engine::Dynamo,
    flavor: "NVIDIA Dynamo frontend",
    marker: "dynamo_frontend_inflight_requests",
    running: Some(Src::Minus(
        &Src::Metric("dynamo_frontend_inflight_requests"),
        &Src::Metric("dynamo_frontend_queued_requests"),
    )),
    waiting: Some(Src::Metric("dynamo_frontend_queued_requests")),
    prefix: Some((
        Src::Metric("dynamo_frontend_input_sequence_tokens_sum"),
        Src::Metric("dynamo_frontend_cached_tokens_sum"),
    )),
    prompt_tokens: Some(Src::Metric("dynamo_frontend_input_sequence_tokens_sum")),
    prompt_tokens_cached: Some(Src::Metric("dynamo_frontend_cached_tokens_sum")),
    generation_tokens: Some(Src::First(&[
        Src::Metric("dynamo_frontend_output_tokens_total"),
        Src::Metric("dynamo_frontend_output_sequence_tokens_sum"),
    ])),
    ttft: &[HistSrc::Buckets { base: "dynamo_frontend_time_to_first_token_seconds", scale: 1.0 }],
    itl: &[HistSrc::Buckets { base: "dynamo_frontend_inter_token_latency_seconds", scale: 1.0 }],
    model_labels: &["model", "model_name"],
    ..NONE
};

/// A Dynamo worker without engine metrics passed through: only Dynamo's own KV statistics.
pub(crate) const DYNAMO_WORKER: Profile = Profile {
    engine: Engine::Dynamo,
    flavor: "NVIDIA Dynamo worker",
    marker: "dynamo_component_requests_total",
    running: Some(Src::Metric("dynamo_component_inflight_requests")),
    kv_usage: Some(Src::Metric("dynamo_component_kvstats_gpu_cache_usage_percent")),
    hit_rate_gauge: Some(Src::Metric("dynamo_component_kvstats_gpu_prefix_cache_hit_rate")),
    model_labels: &["model", "model_name"],
    ..NONE
};

pub(crate) const DYNAMO_WORKER_VLLM: Profile =
    Profile { engine: Engine::Dynamo, flavor: "NVIDIA Dynamo worker (vLLM engine)", ..VLLM_BASE };
pub(crate) const DYNAMO_WORKER_SGLANG: Profile =
    Profile { engine: Engine::Dynamo, flavor: "NVIDIA Dynamo worker (SGLang engine)", ..SGLANG };
pub(crate) const DYNAMO_WORKER_TRTLLM: Profile =
    Profile { engine: Engine::Dynamo, flavor: "NVIDIA Dynamo worker (TensorRT-LLM engine)", ..TRTLLM };

/// Triton without the TensorRT-LLM backend's metrics: only what Triton core exports.
pub(crate) const TRITON_CORE: Profile = Profile {
    flavor: "Triton Inference Server (no TensorRT-LLM metrics)",
    marker: "nv_inference_request_success",
    ..TRITON
};

/// Which engine wrote this exposition, or the families seen when none did.
pub(crate) fn detect(exposition: &Exposition) -> Result<&'static Profile, UnsupportedEngine> {
    detect_by(
        |prefix| exposition.has_prefix(prefix),
        |name| exposition.has(name),
        || is_llm_d_sim(exposition),
    )
    .ok_or_else(|| UnsupportedEngine { families: exposition.family_names() })
}

/// Names whose presence [`detect_by`] looks at; a source that cannot list every name (PromQL)
/// asks for these.
pub(crate) const DETECTION_NAMES: [&str; 13] = [
    "dynamo_frontend_inflight_requests",
    "dynamo_component_requests_total",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "sglang:num_running_reqs",
    "tgi_queue_size",
    "llamacpp:requests_processing",
    "trtllm_time_to_first_token_seconds_count",
    "trtllm_num_requests_running",
    "nv_trt_llm_request_metrics",
    "nv_inference_request_success",
    "nv_inference_count",
];

/// The detection rules over "is a name with this prefix present" and "is this name present".
pub(crate) fn detect_by(
    has_prefix: impl Fn(&str) -> bool,
    has: impl Fn(&str) -> bool,
    llm_d_sim: impl Fn() -> bool,
) -> Option<&'static Profile> {
    let profile = if has_prefix("dynamo_frontend_") {
        &DYNAMO_FRONTEND
    } else if has_prefix("dynamo_component_") {
        // Workers pass their engine's own metrics through; those carry the richer signals.
        if has_prefix("vllm:") {
            &DYNAMO_WORKER_VLLM
        } else if has_prefix("sglang:") {
            &DYNAMO_WORKER_SGLANG
        } else if has_prefix("trtllm_") {
            &DYNAMO_WORKER_TRTLLM
        } else {
            &DYNAMO_WORKER
        }
    } else if has_prefix("vllm:") {
        if llm_d_sim() {
            &LLM_D_SIM
        } else if has("vllm:kv_cache_usage_perc") || has("vllm:prefix_cache_queries_total") {
            &VLLM
        } else {
            &VLLM_LEGACY
        }
    } else if has_prefix("sglang:") {
        &SGLANG
    } else if has_prefix("tgi_") {
        &TGI
    } else if has_prefix("llamacpp:") {
        &LLAMACPP
    } else if has_prefix("trtllm_") {
        &TRTLLM
    } else if has_prefix("nv_trt_llm_") {
        &TRITON
    } else if has_prefix("nv_inference_") {
        &TRITON_CORE
    } else {
        return None;
    };
    Some(profile)
}

/// llm-d-inference-sim emits vLLM's names from Go's client library: no `engine` rank label
/// and no `_created` series, both of which vLLM (Python, V1) always has.
fn is_llm_d_sim(exposition: &Exposition) -> bool {
    let unranked = exposition.samples_named("vllm:num_requests_running").all(|s| s.label("engine").is_none());
    let no_created = !exposition.sample_names().any(|n| n.starts_with("vllm:") && n.ends_with("_created"));
    let no_python = !exposition.has_prefix("python_");
    exposition.has("vllm:num_requests_running") && unranked && no_created && no_python
}

const RANK_LABELS: [&str; 2] = ["engine", "dp_rank"];
const REPLICA_LABELS: [&str; 4] = ["tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank"];

fn rank_of(sample: &Sample) -> Option<&str> {
    RANK_LABELS.iter().find_map(|l| sample.label(l))
}

/// A series of a tensor- or pipeline-parallel peer that repeats rank 0's numbers.
fn is_peer_copy(sample: &Sample) -> bool {
    REPLICA_LABELS.iter().any(|l| sample.label(l).is_some_and(|v| v != "0"))
}

/// Samples of one rank (`None`: all ranks) that count.
fn series<'a>(
    exposition: &'a Exposition,
    name: &str,
    rank: Option<&'a str>,
) -> impl Iterator<Item = &'a Sample> + 'a {
    exposition
        .samples_named(name)
        .filter(move |s| !is_peer_copy(s) && (rank.is_none() || rank_of(s) == rank))
        .filter(|s| !s.value.is_nan())
}

fn sum(values: impl Iterator<Item = f64>) -> Option<f64> {
    values.fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
}

impl Src {
    fn eval(&self, exposition: &Exposition, rank: Option<&str>) -> Option<f64> {
        match *self {
            Src::Metric(name) => sum(series(exposition, name, rank).map(|s| s.value)),
            Src::Select(name, label, value) => {
                sum(series(exposition, name, rank).filter(|s| s.label(label) == Some(value)).map(|s| s.value))
            }
            Src::Ratio(a, b) => {
                let (a, b) = (a.eval(exposition, rank)?, b.eval(exposition, rank)?);
                (b > 0.0).then(|| a / b)
            }
            Src::Minus(a, b) => Some((a.eval(exposition, rank)? - b.eval(exposition, rank)?).max(0.0)),
            Src::Plus(a, b) => Some(a.eval(exposition, rank)? + b.eval(exposition, rank)?),
            Src::First(alternatives) => alternatives.iter().find_map(|a| a.eval(exposition, rank)),
        }
    }

    /// Names this source reads, for the `_created` restart check.
    pub(crate) fn names(&self, out: &mut Vec<&'static str>) {
        match *self {
            Src::Metric(n) | Src::Select(n, ..) => out.push(n),
            Src::Ratio(a, b) | Src::Minus(a, b) | Src::Plus(a, b) => {
                a.names(out);
                b.names(out);
            }
            Src::First(alternatives) => alternatives.iter().for_each(|a| a.names(out)),
        }
    }
}

fn histogram(exposition: &Exposition, sources: &[HistSrc], rank: Option<&str>) -> Option<Histogram> {
    sources.iter().find_map(|source| match *source {
        HistSrc::Buckets { base, scale } => {
            let mut by_bound: Vec<(f64, f64)> = Vec::new();
            for sample in series(exposition, &format!("{base}_bucket"), rank) {
                let Some(bound) = sample.label("le").and_then(parse_bound) else { continue };
                let bound = bound * scale;
                match by_bound.iter_mut().find(|(b, _)| *b == bound) {
                    Some((_, count)) => *count += sample.value,
                    None => by_bound.push((bound, sample.value)),
                }
            }
            if by_bound.is_empty() {
                return None;
            }
            by_bound.sort_by(|a, b| a.0.total_cmp(&b.0));
            let count = sum(series(exposition, &format!("{base}_count"), rank).map(|s| s.value))
                .unwrap_or_else(|| by_bound.last().map_or(0.0, |b| b.1));
            let total = sum(series(exposition, &format!("{base}_sum"), rank).map(|s| s.value)).unwrap_or(0.0);
            Some(Histogram { buckets: by_bound, sum: total * scale, count })
        }
        HistSrc::SumCount { sum: sum_name, count, scale } => {
            let total = sum(series(exposition, sum_name, rank).map(|s| s.value))?;
            let count = sum(series(exposition, count, rank).map(|s| s.value))?;
            Some(Histogram { buckets: Vec::new(), sum: total * scale, count })
        }
    })
}

fn parse_bound(le: &str) -> Option<f64> {
    match le {
        "+Inf" | "Inf" | "inf" | "+inf" => Some(f64::INFINITY),
        other => other.parse::<f64>().ok().filter(|b| !b.is_nan()),
    }
}

fn values(profile: &Profile, exposition: &Exposition, rank: Option<&str>) -> Values {
    let eval = |src: &Option<Src>| src.as_ref().and_then(|s| s.eval(exposition, rank));
    let kv_usage = match (&profile.kv_usage, rank) {
        // A fraction: the replica's usage is the mean over ranks, not their sum.
        (Some(src), None) => {
            let ranks = ranks(exposition, profile);
            if ranks.len() > 1 {
                let per_rank: Vec<f64> = ranks.iter().filter_map(|r| src.eval(exposition, Some(r))).collect();
                (!per_rank.is_empty()).then(|| per_rank.iter().sum::<f64>() / per_rank.len() as f64)
            } else {
                src.eval(exposition, None)
            }
        }
        (src, _) => eval(src),
    };
    // Some engines report percent where they document a fraction; 0..=1 is the contract.
    let kv_usage =
        kv_usage.map(|u| if u > 1.0 && u <= 100.0 { u / 100.0 } else { u }).map(|u| u.clamp(0.0, 1.0));
    let (prefix_queries, prefix_hits) = match &profile.prefix {
        Some((q, h)) => match (q.eval(exposition, rank), h.eval(exposition, rank)) {
            (Some(q), Some(h)) => (Some(q), Some(h)),
            _ => (None, None),
        },
        None => (None, None),
    };
    // P/D transfer figures are the replica's as a whole: connectors label no data-parallel ranks.
    let pd = if rank.is_none() { crate::pd::read_pd(exposition) } else { None }.unwrap_or_default();
    Values {
        running: eval(&profile.running),
        waiting: eval(&profile.waiting),
        kv_usage,
        prefix_queries,
        prefix_hits,
        hit_rate_gauge: eval(&profile.hit_rate_gauge).map(|r| r.clamp(0.0, 1.0)),
        prompt_tokens: eval(&profile.prompt_tokens),
        prompt_tokens_cached: eval(&profile.prompt_tokens_cached),
        generation_tokens: eval(&profile.generation_tokens),
        preemptions: eval(&profile.preemptions),
        ttft: histogram(exposition, profile.ttft, rank),
        itl: histogram(exposition, profile.itl, rank),
        kv_transfers: pd.transfers,
        kv_transfer_seconds: pd.transfer_seconds,
        kv_transfer_last_s: pd.last_transfer_s,
    }
}

/// Rank labels present on the profile's gauges and counters, sorted.
/// The names of the families an engine's load is read from, which also name its data-parallel ranks.
fn load_names(profile: &Profile) -> Vec<&'static str> {
    let mut names = Vec::new();
    for src in
        [&profile.running, &profile.waiting, &profile.kv_usage, &profile.prompt_tokens].into_iter().flatten()
    {
        src.names(&mut names);
    }
    names
}

fn ranks(exposition: &Exposition, profile: &Profile) -> Vec<String> {
    let mut ranks: BTreeMap<String, ()> = BTreeMap::new();
    for name in load_names(profile) {
        for sample in exposition.samples_named(name).filter(|s| !is_peer_copy(s)) {
            if let Some(rank) = rank_of(sample) {
                ranks.insert(rank.to_string(), ());
            }
        }
    }
    let mut ranks: Vec<String> = ranks.into_keys().collect();
    ranks.sort_by(|a, b| rank_order(a, b));
    ranks
}

/// The latest `_created` timestamp among the counters the profile reads.
fn created(exposition: &Exposition, profile: &Profile) -> Option<f64> {
    let mut names = Vec::new();
    for src in [
        &profile.prompt_tokens,
        &profile.prompt_tokens_cached,
        &profile.generation_tokens,
        &profile.preemptions,
    ]
    .into_iter()
    .flatten()
    {
        src.names(&mut names);
    }
    if let Some((q, h)) = &profile.prefix {
        q.names(&mut names);
        h.names(&mut names);
    }
    let mut latest: Option<f64> = None;
    for name in names {
        let base = name.strip_suffix("_total").unwrap_or(name);
        for sample in exposition.samples_named(&format!("{base}_created")) {
            if sample.value.is_finite() {
                latest = Some(latest.map_or(sample.value, |l| l.max(sample.value)));
            }
        }
    }
    latest
}

/// An engine's load figures (requests waiting and running, KV usage), read again and again from its
/// expositions without parsing what they do not need: the engine is detected once from a whole
/// exposition, after which only the sample lines of the families its load is read from are parsed (with
/// the families that name its data-parallel ranks). fleet-router reads these three figures from every
/// replica several times a second; a vLLM exposition is mostly histogram lines it would otherwise parse
/// each time.
#[derive(Debug, Clone, Copy)]
pub struct LoadReader {
    profile: &'static Profile,
}

/// The load figures of one exposition, summed over ranks (KV usage averaged), as [`Reading::total`] has them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Load {
    /// Requests waiting.
    pub waiting: Option<f64>,
    /// Requests running.
    pub running: Option<f64>,
    /// KV-cache usage, 0 to 1.
    pub kv_usage: Option<f64>,
}

impl LoadReader {
    /// Detects the engine of a whole exposition (an error names the families seen, as [`read`]'s does).
    pub fn detect(exposition: &Exposition) -> Result<Self, UnsupportedEngine> {
        detect(exposition).map(|profile| Self { profile })
    }

    /// The load figures of a whole exposition.
    pub fn load_of(&self, exposition: &Exposition) -> Load {
        let values = values(self.profile, exposition, None);
        Load { waiting: values.waiting, running: values.running, kv_usage: values.kv_usage }
    }

    /// The load figures of an exposition's text, parsing only the families they come from. An exposition
    /// of another engine (a replica replaced behind its URL) gives no figures: detect again then.
    pub fn read_text(&self, text: &str) -> Result<Load, crate::exposition::ParseError> {
        let names = load_names(self.profile);
        let exposition = crate::exposition::parse_families(text, |name| names.contains(&name))?;
        Ok(self.load_of(&exposition))
    }
}

/// Detects the engine and reads its raw values, per rank and in total.
pub fn read(exposition: &Exposition) -> Result<Reading, UnsupportedEngine> {
    let profile = detect(exposition)?;
    Ok(read_with(profile, exposition))
}

pub(crate) fn read_with(profile: &Profile, exposition: &Exposition) -> Reading {
    // The running gauge first: on Triton the marker also counts helper models (ensemble...).
    let mut names = Vec::new();
    if let Some(running) = &profile.running {
        running.names(&mut names);
    }
    names.push(profile.marker);
    let model = names.into_iter().find_map(|name| {
        exposition
            .samples_named(name)
            .find_map(|s| profile.model_labels.iter().find_map(|l| s.label(l)).map(str::to_string))
    });
    let ranks = ranks(exposition, profile);
    let ranks = if ranks.is_empty() {
        Vec::new()
    } else {
        ranks.into_iter().map(|r| (r.clone(), values(profile, exposition, Some(&r)))).collect()
    };
    Reading {
        engine: profile.engine,
        flavor: profile.flavor,
        model,
        created: created(exposition, profile),
        total: values(profile, exposition, None),
        ranks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::parse;

    #[test]
    fn legacy_vllm_and_unknown_endpoints_are_told_apart() {
        let legacy = parse(
            "vllm:gpu_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.5\n\
             vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 1\n",
        )
        .unwrap();
        let reading = read(&legacy).unwrap();
        assert_eq!((reading.engine, reading.flavor), (Engine::Vllm, VLLM_LEGACY.flavor));
        assert_eq!(reading.total.kv_usage, Some(0.5));
        let unknown =
            read(&parse("process_cpu_seconds_total 1\nhttp_requests_total 2\n").unwrap()).unwrap_err();
        assert_eq!(unknown.families, ["http_requests_total", "process_cpu_seconds_total"]);
        assert!(unknown.to_string().contains("unsupported engine"), "{unknown}");
        assert!(unknown.to_string().contains("http_requests_total"), "{unknown}");
    }

    #[test]
    fn ranks_add_up_and_kv_usage_averages() {
        let text = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2\n\
                    vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 3\n\
                    vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.2\n\
                    vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.6\n";
        let reading = read(&parse(text).unwrap()).unwrap();
        assert_eq!(reading.total.running, Some(5.0));
        assert!((reading.total.kv_usage.unwrap() - 0.4).abs() < 1e-12);
        assert_eq!(reading.ranks.len(), 2);
        assert_eq!(reading.ranks[1].0, "1");
        assert_eq!(reading.ranks[1].1.running, Some(3.0));
    }

    #[test]
    fn tensor_parallel_peers_are_not_double_counted() {
        let text = "sglang:num_running_reqs{model_name=\"m\",tp_rank=\"0\"} 4\n\
                    sglang:num_running_reqs{model_name=\"m\",tp_rank=\"1\"} 4\n";
        assert_eq!(read(&parse(text).unwrap()).unwrap().total.running, Some(4.0));
    }
}
