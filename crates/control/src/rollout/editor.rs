//! The policy editor's backend: the policies and their parameter docs as the UI draws them,
//! validation as the operator types (fleet-policy's own errors, with the field they name), and
//! the effective diff against what each router runs.
//!
//! Pure: [`super::Rollout::policy_editor`] and [`super::Rollout::check_spec`] gather the routers' specs
//! and call these.

use fleet_policy::{
    POLICY_NAMES, ParamDoc, ParamKind, PolicySpec, SpecError, param_docs, pd_param_docs, policy_summary,
};
use fleet_rollout::{SpecDiff, effective_params, effective_pd};
use fleetdeck_api::{ApiError, ParamDelta, ParamInfo, PolicyInfo, RouterDiff, SpecCheck, SpecProblem};

/// Longest spec text accepted: a spec is a few hundred bytes; more is a pasted mistake. fleet-policy's own
/// limit, checked (with the nesting limit) before any parser runs.
pub const MAX_SPEC_TEXT: usize = fleet_policy::MAX_SPEC_BYTES;

/// Every policy with its parameters, in the order the UI lists them.
pub fn policy_infos() -> Vec<PolicyInfo> {
    POLICY_NAMES
        .iter()
        .map(|name| PolicyInfo {
            name: (*name).to_owned(),
            summary: policy_summary(name).unwrap_or_default().to_owned(),
            params: param_infos(param_docs(name)),
        })
        .collect()
}

/// The `pd:` section's thresholds, as the editor draws them.
pub fn pd_param_infos() -> Vec<ParamInfo> {
    param_infos(pd_param_docs())
}

fn param_infos(docs: Vec<ParamDoc>) -> Vec<ParamInfo> {
    docs.into_iter()
        .map(|doc| {
            let (kind, min, max, options) = match &doc.kind {
                ParamKind::Integer { min, max } => ("integer", Some(*min as f64), Some(*max as f64), vec![]),
                ParamKind::Float { min, max } => ("float", Some(*min), Some(*max), vec![]),
                ParamKind::Bool => ("bool", None, None, vec![]),
                ParamKind::Choice { options } => {
                    ("choice", None, None, options.iter().map(|o| (*o).to_owned()).collect())
                }
            };
            ParamInfo {
                name: doc.name.to_owned(),
                kind: kind.to_owned(),
                min,
                max,
                options,
                default_json: doc.default.to_string(),
                meaning: doc.meaning.to_owned(),
            }
        })
        .collect()
}

/// The field a spec error names, if it names one.
pub fn problem_of(error: &SpecError) -> SpecProblem {
    let field = match error {
        SpecError::Parse { .. }
        | SpecError::TooLarge { .. }
        | SpecError::TooDeep { .. }
        | SpecError::YamlAlias { .. }
        | SpecError::TooSlow { .. } => None,
        SpecError::MissingPolicy | SpecError::UnknownPolicy { .. } => Some("policy".to_owned()),
        SpecError::UnsupportedSchemaVersion { .. } => Some("schema_version".to_owned()),
        SpecError::UnknownField { field, .. }
        | SpecError::WrongType { field, .. }
        | SpecError::OutOfRange { field, .. } => Some(field.clone()),
    };
    SpecProblem { field, message: error.to_string() }
}

/// Parses and validates spec text (JSON or YAML), bounded in size and nesting (fleet-policy checks both
/// before its parsers run). The commands run it through [`super::read_spec`], off the async threads.
pub fn parse_spec(text: &str) -> Result<PolicySpec, SpecProblem> {
    precheck(text)?;
    text.parse::<PolicySpec>().map_err(|e| problem_of(&e))
}

/// What can be said of spec text without parsing it: empty, too long, too deeply nested.
pub fn precheck(text: &str) -> Result<(), SpecProblem> {
    fleet_policy::check_spec_text(text.as_bytes()).map_err(|e| problem_of(&e))?;
    if text.trim().is_empty() {
        return Err(SpecProblem {
            field: Some("policy".to_owned()),
            message: "the spec is empty; write `policy: NAME` and its params".to_owned(),
        });
    }
    Ok(())
}

/// A spec problem as the error every command answers for an invalid spec.
pub fn invalid_spec(problem: SpecProblem) -> ApiError {
    let field = problem.field.map(|f| format!(" (field {f})")).unwrap_or_default();
    ApiError::new("invalid_spec", format!("{}{field}; nothing was sent to any router", problem.message))
}

/// The same as [`parse_spec`], as the error every command answers for an invalid spec.
pub fn spec_or_api_error(text: &str) -> Result<PolicySpec, ApiError> {
    parse_spec(text).map_err(invalid_spec)
}

/// A rollout diff in the UI's terms.
pub fn router_diff(url: &str, version: u64, diff: &SpecDiff) -> RouterDiff {
    RouterDiff {
        url: url.to_owned(),
        version: Some(version),
        policy_change: diff.policy.clone(),
        params: diff
            .params
            .iter()
            .map(|change| ParamDelta {
                name: change.name.clone(),
                before: change.before.as_ref().map(ToString::to_string),
                after: change.after.as_ref().map(ToString::to_string),
            })
            .collect(),
        unchanged: diff.is_empty(),
        error: None,
    }
}

/// Validation result without router diffs.
pub fn check_text(text: &str) -> SpecCheck {
    check_of(&parse_spec(text))
}

/// The validation result of a parse, without router diffs.
pub fn check_of(parsed: &Result<PolicySpec, SpecProblem>) -> SpecCheck {
    match parsed {
        Ok(spec) => SpecCheck {
            valid: true,
            problem: None,
            policy: Some(spec.policy.clone()),
            json: Some(spec.to_json()),
            yaml: Some(spec.to_yaml()),
            effective: effective_params(spec)
                .into_iter()
                .chain(effective_pd(spec))
                .map(|(name, value)| (name, value.to_string()))
                .collect(),
            diffs: Vec::new(),
        },
        Err(problem) => SpecCheck {
            valid: false,
            problem: Some(problem.clone()),
            policy: None,
            json: None,
            yaml: None,
            effective: Vec::new(),
            diffs: Vec::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_rollout::spec_diff;

    #[test]
    fn every_policy_is_offered_with_typed_controls() {
        let infos = policy_infos();
        assert_eq!(infos.len(), POLICY_NAMES.len());
        let chash = infos.iter().find(|p| p.name == "consistent_hash").unwrap();
        let load = chash.params.iter().find(|p| p.name == "load_factor").unwrap();
        assert_eq!(load.kind, "float");
        assert!(load.min.is_some() && load.max.is_some() && !load.meaning.is_empty());
        let least = infos.iter().find(|p| p.name == "least_load").unwrap();
        assert_eq!(least.params[0].kind, "choice");
        assert!(least.params[0].options.contains(&"requests".to_owned()));
    }

    #[test]
    fn typing_errors_name_the_field_from_the_policy_crate() {
        let check = check_text("policy: consistent_hash\nparams:\n  load_factor: 0.1\n");
        assert!(!check.valid);
        let problem = check.problem.unwrap();
        assert_eq!(problem.field.as_deref(), Some("params.load_factor"));
        assert!(problem.message.contains("out of range"), "{}", problem.message);

        let typo =
            check_text(r#"{"policy": "consistent_hash", "params": {"load_factr": 2}}"#).problem.unwrap();
        assert_eq!(typo.field.as_deref(), Some("params.load_factr"));
        assert!(typo.message.contains("did you mean load_factor"), "{}", typo.message);

        assert_eq!(check_text("").problem.unwrap().field.as_deref(), Some("policy"));
        assert!(check_text("policy: [").problem.unwrap().field.is_none());
        let huge = "#".repeat(MAX_SPEC_TEXT + 1);
        assert!(check_text(&huge).problem.unwrap().message.contains("65536"));
    }

    #[test]
    fn a_valid_spec_shows_both_notations_and_effective_values() {
        let check = check_text("policy: consistent_hash\nparams: {load_factor: 2}\n");
        assert!(check.valid, "{:?}", check.problem);
        assert!(check.json.unwrap().contains("\"load_factor\": 2"));
        assert!(check.yaml.unwrap().contains("load_factor: 2"));
        assert!(check.effective.iter().any(|(name, value)| name == "virtual_nodes" && value == "256"));
        let err = spec_or_api_error("policy: nope").unwrap_err();
        assert_eq!(err.code, "invalid_spec");
        assert!(err.message.contains("nothing was sent"), "{}", err.message);
    }

    #[test]
    fn router_diffs_carry_the_version_they_were_computed_against() {
        let running = PolicySpec::named("consistent_hash");
        let candidate = PolicySpec::named("consistent_hash").with("load_factor", 2.0);
        let diff = router_diff("http://r", 7, &spec_diff(&running, &candidate));
        assert_eq!(diff.version, Some(7));
        assert!(!diff.unchanged);
        assert_eq!(diff.params[0].before.as_deref(), Some("1.25"));
        assert_eq!(diff.params[0].after.as_deref(), Some("2.0"));
    }
}
