//! The what-if contract: replaying recorded traffic (or a trace file) under a candidate and the running
//! policy, its progress, and the result with its coverage, engine profile and measured fidelity.

use serde::{Deserialize, Serialize};

/// Command: start a what-if replay (cancels the previous one). Args: [`WhatIfArgs`]. Answers [`WhatIfStatus`].
pub const CMD_START_WHATIF: &str = "start_whatif";

/// Command: progress or result of a what-if replay. Args: [`WhatIfJobArgs`]. Answers [`WhatIfStatus`].
pub const CMD_WHATIF_STATUS: &str = "whatif_status";

/// Command: cancel a what-if replay. Args: [`WhatIfJobArgs`]. Answers [`WhatIfStatus`].
pub const CMD_CANCEL_WHATIF: &str = "cancel_whatif";

/// Arguments of [`CMD_START_WHATIF`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WhatIfArgs {
    /// The candidate spec (JSON or YAML).
    pub text: String,
    /// Replay the routers' recorded traffic of the last `window_s` seconds...
    #[serde(default = "default_whatif_window")]
    pub window_s: u32,
    /// ...or this fleet-trace / Mooncake file instead.
    #[serde(default)]
    pub trace_path: Option<String>,
    /// Replicas to replay on; default: as many as the routers have.
    #[serde(default)]
    pub replicas: Option<u32>,
    /// The operator's choice of engine profile (a built-in name, see [`WhatIfProfile::available`]);
    /// default: chosen from what the replicas' metrics say (model, engine, KV capacity, block size).
    #[serde(default)]
    pub profile: Option<String>,
    /// The operator's KV capacity per replica, in blocks; default: what the replicas report, else the
    /// profile's.
    #[serde(default)]
    pub kv_blocks: Option<u32>,
    /// P/D: how many of the replicas prefill (the rest decode), to replay another P:D split of the same
    /// replicas; default: as the routers tag them (none tagged `prefill`: no P/D).
    #[serde(default)]
    pub prefill_replicas: Option<u32>,
}

fn default_whatif_window() -> u32 {
    600
}

/// Arguments of [`CMD_WHATIF_STATUS`] and [`CMD_CANCEL_WHATIF`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WhatIfJobArgs {
    pub job: u64,
}

/// One policy's replayed figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayFigures {
    pub policy: String,
    pub requests: u64,
    pub hit_rate: Option<f64>,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p95_s: Option<f64>,
    /// Max over mean of prefill tokens computed per replica (1 = perfectly even), as fleet-sim reports it.
    pub imbalance: Option<f64>,
    /// Requests each replica served, by replica index (the decode replicas in a P/D replay).
    pub per_replica_requests: Vec<u64>,
    /// A P/D replay's split decisions and legs.
    #[serde(default)]
    pub pd: Option<PdFigures>,
    /// How far the figures move over replays with other random draws, other metrics-read phases and
    /// arrivals moved within the recording's millisecond (`None`: replayed once, the trace being too long
    /// for more).
    #[serde(default)]
    pub spread: Option<ReplaySpread>,
}

/// The range of a policy's figures over several replays of the same traffic that differ only where a live
/// fleet is left to chance: the policy's random draws, when in their interval the routers read the
/// replicas' metrics, and arrival times within the recording's millisecond.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplaySpread {
    /// Replays, the main one included.
    pub replays: u32,
    pub hit_rate_min: f64,
    pub hit_rate_max: f64,
    pub ttft_p95_min_s: f64,
    pub ttft_p95_max_s: f64,
}

/// What a P/D replay adds to a policy's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PdFigures {
    /// Split requests / all.
    pub split_share: f64,
    /// Decisions per reason.
    pub decisions: std::collections::BTreeMap<String, u64>,
    /// Mean prefill leg and KV transfer, ms.
    pub prefill_leg_mean_ms: f64,
    pub transfer_mean_ms: f64,
}

/// Candidate and active side by side over the same traffic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WhatIfResult {
    /// Where the traffic came from (routers' recordings or a file).
    pub source: String,
    pub requests: u64,
    /// Replicas replayed (the decode replicas in a P/D replay).
    pub replicas: u32,
    /// P/D: prefill replicas beside them (`None`: no P/D).
    #[serde(default)]
    pub prefill_replicas: Option<u32>,
    pub candidate: ReplayFigures,
    pub active: ReplayFigures,
    /// Wall time of the replays, the spread's included.
    pub elapsed_ms: u64,
    /// How much of the window was read and replayed.
    #[serde(default)]
    pub coverage: crate::WhatIfCoverage,
    /// Each router: the spec it runs (the baseline's source), its share of the traffic, or why it could
    /// not be read.
    #[serde(default)]
    pub routers: Vec<crate::WhatIfRouter>,
    /// Where the baseline came from and what differs: routers that disagree, the app's intended spec
    /// that no router runs, routers that could not be read.
    #[serde(default)]
    pub baseline_notes: Vec<String>,
    /// The engine profile both sides were replayed with, and why.
    #[serde(default)]
    pub profile: crate::WhatIfProfile,
    /// What the fidelity bench measured for this kind of change (`None`: never measured).
    #[serde(default)]
    pub fidelity: Option<crate::WhatIfFidelity>,
    /// Per-request time outside the engine model, measured from the recording (the median, over the
    /// requests recorded under the active policy, of each one's TTFT less its replayed TTFT) and included
    /// in both sides' TTFTs; `None`: not measurable (a trace file, too few recorded first tokens), nothing
    /// added.
    #[serde(default)]
    pub ttft_overhead_ms: Option<f64>,
    /// The routers as the replay models them: how many, and how often they read the engines' load.
    #[serde(default)]
    pub router_model: WhatIfRouterModel,
}

/// The routers a what-if replays, modelled as deployed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WhatIfRouterModel {
    /// Routers replayed, each with its own policy engine; a request goes through the router that recorded
    /// it.
    pub routers: u32,
    /// How often each replayed router reads the replicas' engine figures, in ms (`None`: never, as a
    /// router with `--engine-metrics-ms 0`).
    pub engine_metrics_ms: Option<u64>,
    /// How often each replayed router hands the others its in-flight load, in ms, as routers sharing their
    /// load through etcd (`--peer-load-prefix`) do; `None`: they share none.
    #[serde(default)]
    pub peer_load_ms: Option<u64>,
    /// One line saying what was modelled and why, for the UI.
    pub summary: String,
}

/// A what-if job's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WhatIfStatus {
    pub job: u64,
    /// `running`, `done`, `cancelled` or `failed`.
    pub state: String,
    /// 0..=1.
    pub progress: f64,
    pub message: Option<String>,
    pub result: Option<WhatIfResult>,
}

/// How much of the asked window the what-if actually replayed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WhatIfCoverage {
    /// The window asked for, in seconds (`None` for a trace file).
    pub window_s: Option<u32>,
    /// Requests read and replayed.
    pub requests_read: u64,
    /// Requests the routers hold for the window (read plus left unread at the size limit); `None` when a
    /// router could not be read, so the total is unknown.
    pub requests_in_window: Option<u64>,
    /// Arrival of the first and last request replayed (Unix ms, or the trace's own clock for a file).
    pub first_ms: Option<i64>,
    pub last_ms: Option<i64>,
    /// Pages read from the routers.
    pub pages: u32,
    /// Most records read from one router; reaching it leaves the rest unread (counted above).
    pub limit_per_router: u64,
    /// One line saying what was covered, for the UI.
    pub summary: String,
}

/// One router as the what-if saw it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WhatIfRouter {
    pub url: String,
    /// The policy it runs (`None`: not read).
    pub policy: Option<String>,
    /// Its running spec as JSON.
    pub spec: Option<String>,
    /// Its policy version.
    pub version: Option<u64>,
    /// Requests of the window read from it.
    pub requests: u64,
    /// Whether its spec differs from the baseline the what-if replayed.
    pub differs: bool,
    /// Why it could not be read (it is left out of the replay).
    pub error: Option<String>,
}

/// The engine profile of a what-if.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WhatIfProfile {
    /// The profile's name (a built-in one).
    pub name: String,
    /// The model it describes.
    pub model: String,
    /// The engine the replicas run, as detected (`vllm`, `sglang`; `None`: unknown).
    pub engine: Option<String>,
    /// KV capacity per replica used, in blocks of `block_tokens`.
    pub kv_blocks: u32,
    pub block_tokens: u32,
    /// Why: what was read from the fleet and what was assumed.
    pub reason: String,
    /// Whether the operator chose the profile or the capacity.
    pub overridden: bool,
    /// The profiles the operator can choose from.
    pub available: Vec<String>,
}

/// The fidelity bench's measurement for a change like this one (`cargo xtask bench fidelity`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WhatIfFidelity {
    /// The measured change, `from->to`.
    pub pair: String,
    /// Whether the measured pair is exactly this change (else the closest one: same candidate policy).
    pub exact: bool,
    /// Predicted minus measured hit rate of the candidate, in percentage points.
    pub hit_rate_error_pp: f64,
    /// (Predicted - measured) / measured TTFT p95 of the candidate, in percent.
    pub ttft_p95_error_pct: f64,
    /// When it was measured (a date).
    pub measured: String,
    /// One line for the UI.
    pub summary: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whatif_replays_ten_minutes_unless_told() {
        let args: WhatIfArgs = serde_json::from_str(r#"{"text":"policy: random"}"#).unwrap();
        assert_eq!(args.window_s, 600);
    }
}
