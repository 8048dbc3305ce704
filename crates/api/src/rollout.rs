//! The rollout contract: the policy editor, what-if replay, push, canary and history-compare
//! commands, with their argument and result shapes.
//!
//! Policy specs travel as text (JSON or YAML, exactly as the operator typed or the editor
//! composed them) because this crate has no JSON value type; the control crate parses and
//! validates them with fleet-policy. Parameter values and defaults are JSON text for the same reason.

use serde::{Deserialize, Serialize};

/// Command: policies with their parameter docs, and what each router runs. Args: `{}`.
pub const CMD_POLICY_EDITOR: &str = "policy_editor";
/// Command: validate a spec as typed and diff it against every router. Args: [`CheckSpecArgs`].
pub const CMD_CHECK_SPEC: &str = "check_spec";
/// Command: push a spec to chosen routers with compare-and-swap. Args: [`PushArgs`].
pub const CMD_PUSH_POLICY: &str = "push_policy";
/// Command: start a canary. Args: [`CanaryArgs`]. Answers [`CanaryStatus`].
pub const CMD_START_CANARY: &str = "start_canary";
/// Command: the current (or last) canary. Args: `{}`. Answers [`CanaryView`].
pub const CMD_CANARY_STATUS: &str = "canary_status";
/// Command: stop the running canary and roll it back. Args: [`AbortCanaryArgs`]. Answers [`CanaryView`].
pub const CMD_ABORT_CANARY: &str = "abort_canary";
/// Command: start a what-if replay (cancels the previous one). Args: [`WhatIfArgs`]. Answers [`WhatIfStatus`].
pub const CMD_START_WHATIF: &str = "start_whatif";
/// Command: progress or result of a what-if replay. Args: [`WhatIfJobArgs`]. Answers [`WhatIfStatus`].
pub const CMD_WHATIF_STATUS: &str = "whatif_status";
/// Command: cancel a what-if replay. Args: [`WhatIfJobArgs`]. Answers [`WhatIfStatus`].
pub const CMD_CANCEL_WHATIF: &str = "cancel_whatif";
/// Command: the recorded policy versions and pushes. Args: `{}`. Answers [`PolicyHistory`].
pub const CMD_POLICY_HISTORY: &str = "policy_history";
/// Command: compare two windows or two policy versions. Args: [`HistoryCompareArgs`].
pub const CMD_HISTORY_COMPARE: &str = "history_compare";

/// One parameter of one policy, as the editor shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamInfo {
    pub name: String,
    /// `integer`, `float`, `bool` or `choice`: which control the editor draws.
    pub kind: String,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// The allowed strings of a `choice`.
    #[serde(default)]
    pub options: Vec<String>,
    /// The value used when the parameter is omitted, as JSON text.
    pub default_json: String,
    /// What it means, in a sentence.
    pub meaning: String,
}

/// A policy the editor offers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyInfo {
    pub name: String,
    pub summary: String,
    pub params: Vec<ParamInfo>,
}

/// Whether a router runs what the fleet intends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum DriftBadge {
    /// Runs the intended spec (defaults filled in).
    InSync { version: u64 },
    /// Runs something else; `summary` says what differs.
    Drifted { version: u64, summary: String },
    /// Its active spec could not be read.
    Unknown,
    /// Nothing was pushed from this app yet, so there is no intended spec.
    NoIntent,
}

/// What one router runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterPolicy {
    pub url: String,
    pub version: Option<u64>,
    pub policy: Option<String>,
    /// The active spec as pretty JSON.
    pub spec_json: Option<String>,
    /// Why the policy could not be read.
    pub error: Option<String>,
    pub drift: DriftBadge,
}

/// Everything the editor needs to start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyEditor {
    pub policies: Vec<PolicyInfo>,
    pub routers: Vec<RouterPolicy>,
    /// The spec the fleet is meant to run (the last one pushed from this app), as JSON.
    pub intended_json: Option<String>,
    /// The etcd key the fleet's routers watch, when its policy lives in etcd: pushes then go there
    /// ([`CMD_PUSH_STORE_POLICY`]), and such routers refuse HTTP pushes.
    #[serde(default)]
    pub store_key: Option<String>,
}

/// Arguments of [`CMD_CHECK_SPEC`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckSpecArgs {
    /// The spec as JSON (starts with `{`) or YAML.
    pub text: String,
}

/// Why a spec is invalid: the policy crate's sentence and the field it names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecProblem {
    /// `policy`, `params.NAME`, ... when the error names one.
    pub field: Option<String>,
    pub message: String,
}

/// One parameter whose effective value differs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamDelta {
    pub name: String,
    /// JSON text; `None` when that side's policy has no such parameter.
    pub before: Option<String>,
    pub after: Option<String>,
}

/// The difference between what a router runs and the candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterDiff {
    pub url: String,
    /// The version the diff was computed against: push with it to be sure nothing changed since.
    pub version: Option<u64>,
    /// `(running, candidate)` when the policy itself changes.
    pub policy_change: Option<(String, String)>,
    pub params: Vec<ParamDelta>,
    /// True when the router would behave the same under the candidate.
    pub unchanged: bool,
    /// Why the router's spec could not be read (then there is no diff).
    pub error: Option<String>,
}

/// The result of [`CMD_CHECK_SPEC`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecCheck {
    pub valid: bool,
    pub problem: Option<SpecProblem>,
    pub policy: Option<String>,
    /// The spec normalised, in both notations (only when valid).
    pub json: Option<String>,
    pub yaml: Option<String>,
    /// Every parameter with the value a router would use: `(name, JSON text)`.
    pub effective: Vec<(String, String)>,
    /// Against every router (only when valid).
    pub diffs: Vec<RouterDiff>,
}

/// One router to push to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushTarget {
    pub url: String,
    /// The version the operator saw (the diff's); the router refuses if it moved on since.
    /// `None`: read the router's version right before pushing.
    #[serde(default)]
    pub if_version: Option<u64>,
}

/// Arguments of [`CMD_PUSH_POLICY`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushArgs {
    pub text: String,
    pub targets: Vec<PushTarget>,
    /// Who is pushing; default: the configured operator name, else the OS user.
    #[serde(default)]
    pub operator: Option<String>,
}

/// What one router answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PushResult {
    Applied { version: u64 },
    Refused { status: u16, code: String, message: String },
    Unreachable { error: String },
}

/// One router's part of a push.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterPush {
    pub url: String,
    /// The version the push was conditioned on (`If-Match`).
    pub if_version: Option<u64>,
    pub result: PushResult,
}

/// The result of [`CMD_PUSH_POLICY`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushReport {
    /// The audit-trail label of the pushed version.
    pub label: String,
    pub author: String,
    pub at_ms: i64,
    pub results: Vec<RouterPush>,
}

/// When a canary is judged worse than the rest.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CanaryGuards {
    /// Roll back when the canary's TTFT p95 exceeds this multiple of the rest's (e.g. 1.25)...
    pub max_ttft_p95_ratio: f64,
    /// ...and is at least this many milliseconds above it.
    pub min_ttft_p95_increase_ms: f64,
    /// Roll back when the canary's hit rate is this much below the rest's (0.05 = 5 points).
    pub max_hit_rate_drop: f64,
    /// Requests each side must have served before the guards judge.
    pub min_requests: u64,
    /// Roll back when the canary's error rate (5xx, 502s, streams ended by an error event) exceeds this
    /// multiple of the rest's (e.g. 2)...
    pub max_error_rate_ratio: f64,
    /// ...and is at least this much above it (0.02 = 2 points).
    pub min_error_rate_increase: f64,
    /// Without cached-token reports on both sides the canary is "not enough data", never promoted;
    /// `false` promotes on latency and errors alone.
    pub require_hit_rate: bool,
}

impl Default for CanaryGuards {
    fn default() -> Self {
        Self {
            max_ttft_p95_ratio: 1.25,
            min_ttft_p95_increase_ms: 50.0,
            max_hit_rate_drop: 0.05,
            min_requests: 50,
            max_error_rate_ratio: 2.0,
            min_error_rate_increase: 0.02,
            require_hit_rate: true,
        }
    }
}

/// Arguments of [`CMD_START_CANARY`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryArgs {
    pub text: String,
    /// Routers that take the candidate first.
    pub canary: Vec<String>,
    /// The rest, compared against; they take it on promotion.
    pub baseline: Vec<String>,
    /// How long the guards must hold before promotion.
    pub observe_s: u64,
    #[serde(default)]
    pub guards: CanaryGuards,
    /// How often both sides are measured; default 2000 ms.
    #[serde(default)]
    pub check_every_ms: Option<u64>,
    #[serde(default)]
    pub operator: Option<String>,
    /// The version of each router the operator reviewed (the diff's): the canary push, the promotion and
    /// the rollback are conditioned on it (`If-Match`), and a router that moved meanwhile is reported, not
    /// overwritten. A router left out is read right before its push.
    #[serde(default)]
    pub reviewed: Vec<PushTarget>,
}

/// Arguments of [`CMD_ABORT_CANARY`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbortCanaryArgs {
    pub reason: String,
}

/// One side's figures since the canary started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SideFigures {
    pub requests: u64,
    /// Failed requests: 5xx (502s included) or streams ended by an error event.
    #[serde(default)]
    pub errors: u64,
    /// TTFT p95 of successful answers (first token, not first byte).
    pub ttft_p95_s: Option<f64>,
    pub hit_rate: Option<f64>,
}

/// How one guard reads at the last check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardReadingView {
    /// `ttft_p95` (ms), `error_rate` (fraction) or `hit_rate` (fraction).
    pub guard: String,
    pub canary: Option<f64>,
    pub baseline: Option<f64>,
    /// `ok`, `crossed` or `not_enough_data`.
    pub state: String,
    /// The limit, or what is missing.
    pub detail: String,
}

/// A router that had moved on from the version the operator reviewed when the canary came to change it:
/// the change was not made there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MovedRouter {
    pub url: String,
    /// `canary push`, `promotion` or `rollback`.
    pub step: String,
    /// The version the change was conditioned on.
    pub expected_version: Option<u64>,
    /// The version the router runs instead, when it said.
    pub current_version: Option<u64>,
    pub message: String,
}

/// One step of a canary's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryStep {
    pub at_ms: i64,
    pub phase: String,
    pub detail: String,
}

/// A canary as the UI shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryStatus {
    pub id: u64,
    /// `canary_pushing`, `observing`, `promoting`, `rolling_back`, `promoted`, `rolled_back`, `failed`.
    pub phase: String,
    /// Why it rolled back or failed.
    pub reason: Option<String>,
    pub finished: bool,
    pub policy: String,
    pub label: String,
    pub canary: Vec<String>,
    pub baseline: Vec<String>,
    pub observe_s: u64,
    pub guards: CanaryGuards,
    pub started_ms: i64,
    pub canary_side: SideFigures,
    pub baseline_side: SideFigures,
    /// Why the last measurement failed, if it did.
    pub measure_error: Option<String>,
    pub steps: Vec<CanaryStep>,
    /// The last check's verdict: `holding`, `not_enough_data` or `crossed`; `None` before the first.
    #[serde(default)]
    pub verdict: Option<String>,
    /// What the verdict lacks, when it is `not_enough_data`.
    #[serde(default)]
    pub missing: Vec<String>,
    /// Each guard's reading at the last check.
    #[serde(default)]
    pub readings: Vec<GuardReadingView>,
    /// Routers that moved on from the reviewed version and were left alone.
    #[serde(default)]
    pub moved: Vec<MovedRouter>,
}

/// The result of [`CMD_CANARY_STATUS`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryView {
    pub canary: Option<CanaryStatus>,
}

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
    /// Requests each replica served, by replica index.
    pub per_replica_requests: Vec<u64>,
}

/// Candidate and active side by side over the same traffic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WhatIfResult {
    /// Where the traffic came from (routers' recordings or a file).
    pub source: String,
    pub requests: u64,
    pub replicas: u32,
    pub candidate: ReplayFigures,
    pub active: ReplayFigures,
    /// Wall time of both replays.
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
    /// Per-request time outside the engine model, measured from the recording (its median TTFT under the
    /// active policy minus the replay's) and included in both sides' TTFTs; `None`: not measurable (a trace
    /// file, too few recorded first tokens), nothing added.
    #[serde(default)]
    pub ttft_overhead_ms: Option<f64>,
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

/// One recorded policy version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyVersionRow {
    pub label: String,
    pub author: String,
    pub created_ms: i64,
    pub spec: String,
    pub routers: Vec<String>,
    /// When it was in force (first acknowledged push to the next version's), if ever.
    pub active_from_ms: Option<i64>,
    pub active_to_ms: Option<i64>,
    /// One line per push: router, outcome.
    pub pushes: Vec<String>,
}

/// The result of [`CMD_POLICY_HISTORY`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyHistory {
    pub versions: Vec<PolicyVersionRow>,
}

/// One side of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HistoryWindow {
    /// The window a policy version was in force.
    Version { label: String },
    /// A time range, Unix milliseconds.
    Range { from_ms: i64, to_ms: i64 },
}

/// Arguments of [`CMD_HISTORY_COMPARE`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryCompareArgs {
    pub a: HistoryWindow,
    pub b: HistoryWindow,
}

/// One metric's delta with its bootstrap interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricDelta {
    pub name: String,
    pub a: Option<f64>,
    pub b: Option<f64>,
    /// b - a.
    pub delta: Option<f64>,
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    pub n_a: u64,
    pub n_b: u64,
}

/// One metric over both windows, aligned at each window's start (seconds since it began).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverlaySeries {
    pub metric: String,
    pub a: Vec<(f64, f64)>,
    pub b: Vec<(f64, f64)>,
}

/// The result of [`CMD_HISTORY_COMPARE`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryComparison {
    pub a_label: String,
    pub b_label: String,
    pub a_from_ms: i64,
    pub a_to_ms: i64,
    pub b_from_ms: i64,
    pub b_to_ms: i64,
    pub confidence: f64,
    pub metrics: Vec<MetricDelta>,
    pub series: Vec<OverlaySeries>,
    /// The delta table as CSV, for export.
    pub csv: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_results_and_windows_are_tagged_for_the_ui() {
        let refused =
            PushResult::Refused { status: 409, code: "version_conflict".into(), message: "m".into() };
        let json = serde_json::to_value(&refused).unwrap();
        assert_eq!(json["outcome"], "refused");
        let window: HistoryWindow = serde_json::from_str(r#"{"kind":"version","label":"v1"}"#).unwrap();
        assert_eq!(window, HistoryWindow::Version { label: "v1".into() });
        let args: WhatIfArgs = serde_json::from_str(r#"{"text":"policy: random"}"#).unwrap();
        assert_eq!(args.window_s, 600);
        let canary: CanaryArgs =
            serde_json::from_str(r#"{"text":"x","canary":["a"],"baseline":["b"],"observe_s":5}"#).unwrap();
        assert_eq!(canary.guards, CanaryGuards::default());
    }
}

/// Command: the fleet's policy key in etcd as it stands. Args: [`StoreKeyArgs`]. Answers [`StorePolicy`].
pub const CMD_STORE_POLICY: &str = "store_policy";
/// Command: write a spec to the policy key in one etcd txn guarded by the revision the operator reviewed.
/// Args: [`StorePushArgs`]. Answers [`StorePushReport`]; a moved key is the error `revision_conflict`.
pub const CMD_PUSH_STORE_POLICY: &str = "push_store_policy";
/// Command: put the key's previous valid value back, in one guarded txn. Args: [`StoreRollbackArgs`].
/// Answers [`StorePushReport`].
pub const CMD_ROLLBACK_STORE_POLICY: &str = "rollback_store_policy";
/// Command: which routers run the revision of the key they watch, and which lag and why. Args: `{}`.
/// Answers [`StoreDrift`].
pub const CMD_STORE_DRIFT: &str = "store_drift";

/// Which of the fleet's policy keys (`None`: the fleet's main key; canary groups have keys of their own
/// beside it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StoreKeyArgs {
    #[serde(default)]
    pub key: Option<String>,
}

/// A policy key as etcd holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StorePolicy {
    pub key: String,
    /// The key's `mod_revision`: the `if_revision` of the next push (0: the key does not exist).
    pub revision: i64,
    /// The value (the spec's text), absent when the key does not exist.
    pub text: Option<String>,
    /// Why the value is not a valid policy, if it is not (routers refuse it and keep their last good one).
    pub invalid: Option<String>,
}

/// Arguments of [`CMD_PUSH_STORE_POLICY`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StorePushArgs {
    pub text: String,
    /// The key's revision the operator reviewed ([`StorePolicy::revision`]); the txn writes only if the
    /// key is still at it (0: only if the key does not exist).
    pub if_revision: i64,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub operator: Option<String>,
}

/// Arguments of [`CMD_ROLLBACK_STORE_POLICY`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreRollbackArgs {
    /// The key's revision the operator reviewed.
    pub if_revision: i64,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub operator: Option<String>,
}

/// The result of a push or rollback to the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StorePushReport {
    /// The audit-trail label of the written version.
    pub label: String,
    pub author: String,
    pub at_ms: i64,
    pub key: String,
    /// The key's new `mod_revision`: the revision every watching router reports once it runs it.
    pub revision: i64,
    /// The revision it replaced.
    pub previous_revision: i64,
}

/// Drift of the routers that take their policy from the store.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StoreDrift {
    /// One entry per key some router watches.
    pub keys: Vec<KeyDrift>,
    /// Routers that answered but take no policy from etcd (pushed over HTTP instead).
    pub not_on_store: Vec<String>,
    /// Routers whose state could not be read, with why.
    pub unreadable: Vec<LaggingRouter>,
}

impl StoreDrift {
    /// Whether every router runs the revision of its key.
    pub fn is_empty(&self) -> bool {
        self.unreadable.is_empty() && self.keys.iter().all(|k| k.lagging.is_empty())
    }
}

/// The routers watching one key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyDrift {
    pub key: String,
    /// The key's `mod_revision` (0: it does not exist).
    pub revision: i64,
    /// Routers running it.
    pub in_sync: Vec<String>,
    /// Routers behind it.
    pub lagging: Vec<LaggingRouter>,
}

/// A router behind its key, with the revision it runs and why (it refused the value, lost etcd, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaggingRouter {
    pub url: String,
    pub revision: Option<i64>,
    pub reason: String,
}
