//! The difference between two policy specs as an operator reads it: parameter by parameter, defaults filled in.
//!
//! Comparing raw documents would call `{}` and `{load_factor: 1.25}` different although a router runs them the
//! same way, and would hide that a policy change also changes every parameter's meaning. So both sides are
//! expanded to their effective values (given, else the documented default) before comparing.

use fleet_policy::{PolicySpec, param_docs, pd_param_docs};
use serde::Serialize;
use serde_json::{Map, Value};

/// Every parameter of `spec`'s policy with the value a router would use: the given one, else the default.
/// Unknown parameter names are kept as given (so an invalid spec still diffs; validation reports it).
pub fn effective_params(spec: &PolicySpec) -> Map<String, Value> {
    let mut params = Map::new();
    for doc in param_docs(&spec.policy) {
        params.insert(doc.name.to_owned(), doc.default.clone());
    }
    for (name, value) in &spec.params {
        params.insert(name.clone(), value.clone());
    }
    params
}

/// The `pd:` thresholds (P/D mode) a router would use, named `pd.NAME`: the given one, else the default.
/// They are part of every spec whatever its policy, so a change of thresholds alone is a change to push.
pub fn effective_pd(spec: &PolicySpec) -> Map<String, Value> {
    let mut pd = Map::new();
    for doc in pd_param_docs() {
        pd.insert(format!("pd.{}", doc.name), doc.default.clone());
    }
    for (name, value) in &spec.pd {
        pd.insert(format!("pd.{name}"), value.clone());
    }
    pd
}

/// One parameter that differs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ParamChange {
    pub name: String,
    /// The effective value before, `None` when the old policy has no such parameter.
    pub before: Option<Value>,
    /// The effective value after, `None` when the new policy has no such parameter.
    pub after: Option<Value>,
}

/// What changes when `running` is replaced by `candidate`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SpecDiff {
    /// `(before, after)` when the policy itself changes.
    pub policy: Option<(String, String)>,
    /// Parameters whose effective value differs, by name.
    pub params: Vec<ParamChange>,
}

impl SpecDiff {
    /// True when a router would behave identically under both specs.
    pub fn is_empty(&self) -> bool {
        self.policy.is_none() && self.params.is_empty()
    }
}

/// The effective difference from `running` to `candidate`.
pub fn spec_diff(running: &PolicySpec, candidate: &PolicySpec) -> SpecDiff {
    let policy =
        (running.policy != candidate.policy).then(|| (running.policy.clone(), candidate.policy.clone()));
    let mut before = effective_params(running);
    before.extend(effective_pd(running));
    let mut after = effective_params(candidate);
    after.extend(effective_pd(candidate));
    let mut names: Vec<&String> = before.keys().chain(after.keys()).collect();
    names.sort();
    names.dedup();
    let params = names
        .into_iter()
        .filter_map(|name| {
            let (old, new) = (before.get(name), after.get(name));
            (!same_value(old, new)).then(|| ParamChange {
                name: name.clone(),
                before: old.cloned(),
                after: new.cloned(),
            })
        })
        .collect();
    SpecDiff { policy, params }
}

/// JSON equality that treats `2` and `2.0` as equal, as the spec's validator does.
fn same_value(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (Some(Value::Number(x)), Some(Value::Number(y))) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_given_explicitly_are_no_change() {
        let implicit = PolicySpec::named("consistent_hash");
        let explicit = PolicySpec::named("consistent_hash").with("load_factor", 1.25);
        assert!(spec_diff(&implicit, &explicit).is_empty());
        assert!(spec_diff(&explicit, &implicit).is_empty());
    }

    #[test]
    fn a_changed_parameter_shows_both_effective_values() {
        let running = PolicySpec::named("consistent_hash");
        let candidate =
            PolicySpec::named("consistent_hash").with("load_factor", 2).with("virtual_nodes", 256);
        let diff = spec_diff(&running, &candidate);
        assert_eq!(diff.policy, None);
        assert_eq!(
            diff.params,
            vec![ParamChange {
                name: "load_factor".into(),
                before: Some(json!(1.25)),
                after: Some(json!(2))
            }]
        );
    }

    #[test]
    fn pd_thresholds_alone_are_a_change_and_their_defaults_are_not() {
        let mut running = PolicySpec::named("cache_aware_approx");
        let mut candidate = running.clone();
        candidate.pd.insert("min_uncached_tokens".into(), json!(1024));
        let diff = spec_diff(&running, &candidate);
        assert!(!diff.is_empty());
        assert_eq!(
            diff.params,
            vec![ParamChange {
                name: "pd.min_uncached_tokens".into(),
                before: Some(json!(512)),
                after: Some(json!(1024))
            }]
        );
        running.pd.insert("min_prompt_tokens".into(), json!(256));
        assert!(
            spec_diff(&running, &PolicySpec::named("cache_aware_approx")).is_empty(),
            "256 is the default"
        );
    }

    #[test]
    fn a_policy_change_lists_parameters_that_appear_and_disappear() {
        let diff = spec_diff(&PolicySpec::named("round_robin"), &PolicySpec::named("least_load"));
        assert_eq!(diff.policy, Some(("round_robin".into(), "least_load".into())));
        assert!(
            diff.params.iter().any(|c| c.name == "load_metric" && c.before.is_none() && c.after.is_some())
        );
        let back = spec_diff(&PolicySpec::named("least_load"), &PolicySpec::named("round_robin"));
        assert!(back.params.iter().all(|c| c.after.is_none()));
    }
}
