//! Disaggregated prefill/decode figures from an engine's exposition: per-role queues and KV transfers.
//!
//! Names come from the engines' own sources:
//! - vLLM's NixlConnector (`vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py`, registered only
//!   with a KV connector): `vllm:nixl_xfer_time_seconds` (histogram, decode side: one observation per
//!   transfer), `vllm:nixl_bytes_transferred`, `vllm:nixl_num_failed_transfers_total`,
//!   `vllm:nixl_num_kv_expired_reqs_total` (prefill side: leases that ran out).
//! - SGLang (`python/sglang/srt/metrics/collector.py`): `sglang:num_prefill_prealloc_queue_reqs` and
//!   `sglang:num_prefill_inflight_queue_reqs` (prefill side), `sglang:num_decode_prealloc_queue_reqs` and
//!   `sglang:num_decode_transfer_queue_reqs` (decode side), `sglang:kv_transfer_latency_ms` and
//!   `sglang:kv_transfer_speed_gb_s` (the latest transfer, prefill side),
//!   `sglang:num_transfer_failed_reqs_total`, `sglang:num_bootstrap_failed_reqs_total`.
//!
//! Counters and histogram sums are cumulative here; [`mean_transfer_s`] turns two readings into the mean
//! transfer time between them. `None` means the engine does not report it, never zero.

use crate::exposition::Exposition;

/// One exposition's P/D figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PdReading {
    /// Prefill side: requests waiting for their decode side or sending their KV (SGLang).
    pub prefill_queue: Option<f64>,
    /// Decode side: requests waiting for their prefill's KV or receiving it (SGLang).
    pub decode_queue: Option<f64>,
    /// Decode side (vLLM): transfers completed, cumulative.
    pub transfers: Option<f64>,
    /// Decode side (vLLM): seconds spent in those transfers, cumulative.
    pub transfer_seconds: Option<f64>,
    /// Decode side (vLLM): bytes moved, cumulative.
    pub transfer_bytes: Option<f64>,
    /// Failed transfers, cumulative.
    pub failed_transfers: Option<f64>,
    /// Prefill side: held KV never pulled (vLLM's expired leases, SGLang's failed bootstraps), cumulative.
    pub abandoned: Option<f64>,
    /// The latest transfer's latency in seconds (SGLang, prefill side).
    pub last_transfer_s: Option<f64>,
    /// The latest transfer's speed in GB/s (SGLang, prefill side).
    pub last_transfer_gb_s: Option<f64>,
}

/// Sum of the samples of `name`, leaving out tensor/pipeline-parallel copies of rank 0's numbers.
fn total(exposition: &Exposition, name: &str) -> Option<f64> {
    exposition
        .samples_named(name)
        .filter(|s| ["tp_rank", "pp_rank"].iter().all(|l| s.label(l).is_none_or(|v| v == "0")))
        .filter(|s| !s.value.is_nan())
        .fold(None, |acc, s| Some(acc.unwrap_or(0.0) + s.value))
}

fn plus(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    }
}

/// The P/D figures of an exposition, `None` when it has none (no KV connector, no disaggregation).
pub fn read_pd(exposition: &Exposition) -> Option<PdReading> {
    let t = |name| total(exposition, name);
    let reading = PdReading {
        prefill_queue: plus(
            t("sglang:num_prefill_prealloc_queue_reqs"),
            t("sglang:num_prefill_inflight_queue_reqs"),
        ),
        decode_queue: plus(
            t("sglang:num_decode_prealloc_queue_reqs"),
            t("sglang:num_decode_transfer_queue_reqs"),
        ),
        transfers: t("vllm:nixl_xfer_time_seconds_count"),
        transfer_seconds: t("vllm:nixl_xfer_time_seconds_sum"),
        transfer_bytes: t("vllm:nixl_bytes_transferred_sum"),
        failed_transfers: plus(
            t("vllm:nixl_num_failed_transfers_total"),
            t("sglang:num_transfer_failed_reqs_total"),
        ),
        abandoned: plus(
            t("vllm:nixl_num_kv_expired_reqs_total"),
            t("sglang:num_bootstrap_failed_reqs_total"),
        ),
        last_transfer_s: t("sglang:kv_transfer_latency_ms").map(|ms| ms / 1e3),
        last_transfer_gb_s: t("sglang:kv_transfer_speed_gb_s"),
    };
    (reading != PdReading::default()).then_some(reading)
}

/// Mean seconds per transfer between two readings of one replica; `None` without transfers between
/// them or after a restart (a counter went backwards).
pub fn mean_transfer_s(earlier: &PdReading, later: &PdReading) -> Option<f64> {
    let count = later.transfers? - earlier.transfers?;
    let seconds = later.transfer_seconds? - earlier.transfer_seconds?;
    (count > 0.0 && seconds >= 0.0).then(|| seconds / count)
}
