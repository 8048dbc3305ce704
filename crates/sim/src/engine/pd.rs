//! Disaggregated prefill/decode in the engine model: the KV transfer's cost and what a failed load does.
//!
//! A *prefill* replica runs a request as usual but, when it finishes, keeps its KV blocks held for a lease
//! ([`super::EngineRequest::hold_for`]) until the decode side has pulled them ([`super::EngineModel::release_held`])
//! or the lease runs out (vLLM's NixlConnector frees them after `kv_lease_duration`, counted in
//! `vllm:nixl_num_kv_expired_reqs`). A *decode* replica admits a request whose prompt KV comes from elsewhere
//! ([`super::EngineRequest::remote`]): it allocates blocks for the prompt, waits while the transfer runs (no
//! compute, no token budget, counted as waiting as vLLM's `WAITING_FOR_REMOTE_KVS` is), then computes only
//! the prompt's last token and samples. A transfer that fails is handled per vLLM's `kv_load_failure_policy`.

use serde::{Deserialize, Serialize};

use super::Micros;

/// What the KV of one token costs to move, and the link it moves over.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransferCost {
    /// KV bytes per token (2 x layers x KV heads x head dim x dtype bytes: 131072 for Llama-3.1-8B in bf16).
    pub bytes_per_token: u64,
    /// Link bandwidth in gigabits per second.
    pub gbps: f64,
    /// Fixed cost of one transfer (handshake, descriptor posting, notification), in microseconds.
    pub latency_us: u64,
}

impl Default for TransferCost {
    fn default() -> Self {
        Self { bytes_per_token: 131_072, gbps: 100.0, latency_us: 500 }
    }
}

impl TransferCost {
    /// Bytes of `tokens` tokens' KV.
    pub fn bytes(&self, tokens: u32) -> u64 {
        u64::from(tokens).saturating_mul(self.bytes_per_token)
    }

    /// How long moving `tokens` tokens' KV takes: the fixed latency plus bytes over the bandwidth.
    pub fn duration_us(&self, tokens: u32) -> Micros {
        let bits = self.bytes(tokens) as f64 * 8.0;
        let wire_us = if self.gbps > 0.0 { bits / (self.gbps * 1e3) } else { 0.0 };
        self.latency_us.saturating_add(wire_us.ceil() as Micros)
    }

    /// Checks the figures are usable.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.gbps.is_finite() && self.gbps > 0.0) {
            return Err(format!("gbps = {}: use a positive bandwidth", self.gbps));
        }
        Ok(())
    }
}

/// What the decode side does when a KV load fails (vLLM's `kv_load_failure_policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadFailurePolicy {
    /// The request fails with finish reason `error` (vLLM's default since 0.11: the API server answers
    /// 500, or ends a stream with an error event, so a proxy can fall back to a local prefill).
    #[default]
    Fail,
    /// The request is rescheduled and its prompt computed locally.
    Recompute,
}

impl std::str::FromStr for LoadFailurePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fail" => Ok(Self::Fail),
            "recompute" => Ok(Self::Recompute),
            other => Err(format!("unknown kv load failure policy {other:?}; use fail or recompute")),
        }
    }
}

/// A decode-side request's remote prefill.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteKv {
    /// Whether the locally cached prefix is reused, so only the rest is pulled (vLLM's NIXL pull); SGLang's
    /// decode side receives the whole prompt's KV.
    pub use_local_cache: bool,
    /// The transfer fails (decided by the caller: an injected fault, or the prefill side no longer holds
    /// the blocks).
    pub fail: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_time_is_latency_plus_bytes_over_bandwidth() {
        let cost = TransferCost { bytes_per_token: 1000, gbps: 8.0, latency_us: 100 };
        // 1000 tokens x 1000 bytes = 8e6 bits over 8e9 bit/s = 1 ms.
        assert_eq!(cost.duration_us(1000), 100 + 1000);
        assert_eq!(cost.duration_us(2000), 100 + 2000, "twice the size, twice the wire time");
        assert_eq!(cost.duration_us(0), 100);
        assert!(TransferCost { gbps: 0.0, ..cost }.validate().is_err());
        assert_eq!("recompute".parse::<LoadFailurePolicy>(), Ok(LoadFailurePolicy::Recompute));
        assert!("retry".parse::<LoadFailurePolicy>().is_err());
    }
}
