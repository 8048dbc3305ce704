//! What a router answered to a push, and whether each router runs what the fleet intends (drift).
//!
//! Routers take a policy by compare-and-swap (`PUT /admin/policy` with `If-Match`), so a push can be applied,
//! refused for a stated reason (a stale version, an invalid spec, a wrong token) or never reach the router.
//! The three are different operator actions (nothing, re-read and retry or fix, check the network), so they
//! stay distinct all the way to the UI.

use fleet_policy::PolicySpec;
use serde::{Deserialize, Serialize};

use crate::diff::spec_diff;

/// The result of pushing a spec to one router.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PushOutcome {
    /// The router runs the spec now, as `version`.
    Applied { version: u64 },
    /// The router answered and refused: `code` is its error code (`version_conflict`, `invalid_spec`,
    /// `unauthorized`, ...) and `message` its reason.
    Refused { status: u16, code: String, message: String },
    /// No answer: connection refused, timeout, TLS or protocol failure.
    Unreachable { error: String },
}

impl PushOutcome {
    pub fn is_applied(&self) -> bool {
        matches!(self, PushOutcome::Applied { .. })
    }

    /// A refusal because someone else changed the router's policy since it was read.
    pub fn is_stale(&self) -> bool {
        matches!(self, PushOutcome::Refused { status: 409, .. })
    }
}

/// Whether a router runs the intended spec.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Drift {
    /// It runs a spec equivalent to the intended one (defaults filled in).
    InSync { version: u64 },
    /// It runs something else; `summary` says what differs.
    Drifted { version: u64, summary: String },
    /// Its active spec is not known (unreachable, never read).
    Unknown,
}

/// Compares a router's active spec (`None` when unknown) with the fleet's intended one.
pub fn drift(intended: &PolicySpec, active: Option<(u64, &PolicySpec)>) -> Drift {
    let Some((version, active)) = active else { return Drift::Unknown };
    let diff = spec_diff(active, intended);
    if diff.is_empty() {
        return Drift::InSync { version };
    }
    let mut parts = Vec::new();
    if let Some((running, wanted)) = &diff.policy {
        parts.push(format!("runs {running}, intended {wanted}"));
    }
    for change in diff.params.iter().filter(|_| diff.policy.is_none()) {
        let show = |v: &Option<serde_json::Value>| v.as_ref().map_or("-".to_owned(), ToString::to_string);
        parts.push(format!("{}: {} (intended {})", change.name, show(&change.before), show(&change.after)));
    }
    Drift::Drifted { version, summary: parts.join("; ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equivalent_specs_are_in_sync() {
        let intended = PolicySpec::named("least_load");
        let active = PolicySpec::named("least_load").with("load_metric", "wait");
        assert_eq!(drift(&intended, Some((4, &active))), Drift::InSync { version: 4 });
    }

    #[test]
    fn drift_names_what_differs() {
        let intended = PolicySpec::named("consistent_hash").with("load_factor", 1.5);
        let active = PolicySpec::named("consistent_hash");
        let Drift::Drifted { version: 2, summary } = drift(&intended, Some((2, &active))) else {
            panic!("expected drift")
        };
        assert_eq!(summary, "load_factor: 1.25 (intended 1.5)");
        assert_eq!(drift(&intended, None), Drift::Unknown);
    }

    #[test]
    fn outcomes_serialise_with_a_tag_the_ui_reads() {
        let refused =
            PushOutcome::Refused { status: 409, code: "version_conflict".into(), message: "x".into() };
        assert!(refused.is_stale() && !refused.is_applied());
        let json = serde_json::to_value(&refused).unwrap();
        assert_eq!(json["outcome"], "refused");
        assert_eq!(serde_json::to_value(PushOutcome::Applied { version: 3 }).unwrap()["version"], 3);
    }
}
