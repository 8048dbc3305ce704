//! The policy editor's contract: the policies and their parameter docs, what each router runs (with its
//! drift badge), and the validation and effective diff of a spec as the operator types it.
//!
//! Specs travel as text (JSON or YAML, as typed) because this crate has no JSON value type; the control
//! crate parses and validates them with fleet-policy. Parameter values and defaults are JSON text too.

use serde::{Deserialize, Serialize};

/// Command: policies with their parameter docs, and what each router runs. Args: `{}`.
pub const CMD_POLICY_EDITOR: &str = "policy_editor";

/// Command: validate a spec as typed and diff it against every router. Args: [`CheckSpecArgs`].
pub const CMD_CHECK_SPEC: &str = "check_spec";

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
    /// ([`CMD_PUSH_ETCD_POLICY`]), and such routers refuse HTTP pushes.
    #[serde(default)]
    pub etcd_key: Option<String>,
    /// The canary guards a canary uses where the operator sets none, every one set: the form starts from
    /// these, so it never shows a default the canary runner does not use.
    #[serde(default)]
    pub canary_defaults: crate::CanaryGuards,
    /// The `pd:` section's thresholds (P/D mode: replicas tagged `role=prefill`), whatever the policy.
    #[serde(default)]
    pub pd_params: Vec<ParamInfo>,
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
