//! Changing the routers' policy: a push with compare-and-swap, and a canary that promotes or rolls itself
//! back, with their argument and result shapes.

use serde::{Deserialize, Serialize};

/// Command: push a spec to chosen routers with compare-and-swap. Args: [`PushArgs`].
pub const CMD_PUSH_POLICY: &str = "push_policy";

/// Command: start a canary. Args: [`CanaryArgs`]. Answers [`CanaryStatus`].
pub const CMD_START_CANARY: &str = "start_canary";

/// Command: the current (or last) canary. Args: `{}`. Answers [`CanaryView`].
pub const CMD_CANARY_STATUS: &str = "canary_status";

/// Command: stop the running canary and roll it back. Args: [`AbortCanaryArgs`]. Answers [`CanaryView`].
pub const CMD_ABORT_CANARY: &str = "abort_canary";

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

/// When a canary is judged worse than the rest. Every guard the operator leaves unset (`None`) takes the
/// canary runner's own default (fleet-rollout's `Guards::default()`, the one source of those numbers):
/// [`PolicyEditor::canary_defaults`](crate::PolicyEditor) shows them, and [`CanaryStatus::guards`] carries
/// the values a running canary uses, all set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CanaryGuards {
    /// Roll back when the canary's TTFT p95 exceeds this multiple of the rest's (e.g. 1.25)...
    pub max_ttft_p95_ratio: Option<f64>,
    /// ...and is at least this many milliseconds above it.
    pub min_ttft_p95_increase_ms: Option<f64>,
    /// Roll back when the canary's hit rate is this much below the rest's (0.05 = 5 points).
    pub max_hit_rate_drop: Option<f64>,
    /// Requests each side must have served before the guards judge.
    pub min_requests: Option<u64>,
    /// Roll back when the canary's error rate (5xx, 502s, streams ended by an error event) exceeds this
    /// multiple of the rest's (e.g. 2)...
    pub max_error_rate_ratio: Option<f64>,
    /// ...and is at least this much above it (0.02 = 2 points).
    pub min_error_rate_increase: Option<f64>,
    /// Without cached-token reports on both sides the canary is "not enough data", never promoted;
    /// `false` promotes on latency and errors alone.
    pub require_hit_rate: Option<bool>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_results_are_tagged_and_unset_guards_are_the_runners_defaults() {
        let refused =
            PushResult::Refused { status: 409, code: "version_conflict".into(), message: "m".into() };
        let json = serde_json::to_value(&refused).unwrap();
        assert_eq!(json["outcome"], "refused");
        let canary: CanaryArgs =
            serde_json::from_str(r#"{"text":"x","canary":["a"],"baseline":["b"],"observe_s":5}"#).unwrap();
        assert_eq!(canary.guards, CanaryGuards::default());
        assert_eq!(canary.guards.min_requests, None, "unset: the canary runner's own default applies");
        let partial: CanaryGuards = serde_json::from_str(r#"{"min_requests": 20}"#).unwrap();
        assert_eq!((partial.min_requests, partial.max_ttft_p95_ratio), (Some(20), None));
    }
}
