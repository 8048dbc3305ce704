//! The what-if result's provenance: how much traffic it read, what each router runs, which engine profile
//! it replayed with, and how close such predictions came when the fidelity bench measured them.

use serde::{Deserialize, Serialize};

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
