//! Changing the fleet's routing policy: the policy editor's checks, a push to chosen routers with
//! compare-and-swap, the steps a canary takes (push and roll back, over HTTP or through the routers' etcd
//! key), drift against the intended spec, and the audit trail of every change.
//!
//! The decisions are fleet-rollout's (pure); [`Rollout`] performs them: it does the HTTP calls through the
//! routers' admin clients, each bounded in time and size, and writes every version and push to the audit
//! trail. The canary runner ([`canary::Canary`]) drives its steps through it; the etcd side is
//! [`etcd::EtcdKeys`].

pub mod canary;
pub mod editor;
pub mod etcd;
pub(crate) mod intended;

use std::collections::HashMap;
use std::sync::Arc;

use fleet_policy::PolicySpec;
use fleet_rollout::{Drift, PushOutcome, spec_diff};
use fleetdeck_api::{
    ApiError, CheckSpecArgs, DriftBadge, MovedRouter, PolicyEditor, PushArgs, PushReport, PushResult,
    RouterDiff, RouterPolicy, RouterPush, SpecCheck, SpecProblem,
};

use crate::audit::Audit;
use crate::routers::Routers;
use crate::routers::admin::{ActivePolicy, AdminClient};
use crate::unix_ms_now;
use etcd::{EtcdKeys, KeyChange};
use intended::Intended;

/// Pushes with compare-and-swap against the version the router runs now.
async fn push_current(client: &AdminClient, spec: &PolicySpec) -> (Option<u64>, PushOutcome) {
    match client.policy().await {
        Ok(active) => (Some(active.version), client.put_policy(spec, active.version).await.outcome),
        Err(error) => (None, PushOutcome::Unreachable { error }),
    }
}

/// Every router of a step the app could not even address (an unknown URL), with the reason.
fn all_unreachable(routers: &[String], error: &ApiError) -> Vec<(String, PushOutcome)> {
    routers.iter().map(|r| (r.clone(), PushOutcome::Unreachable { error: error.message.clone() })).collect()
}

/// The drift badge of a router whose active policy is `active` (`None`: unreadable).
pub fn drift_badge(intended: Option<&PolicySpec>, active: Option<&ActivePolicy>) -> DriftBadge {
    let Some(intended) = intended else { return DriftBadge::NoIntent };
    match fleet_rollout::drift(intended, active.map(|a| (a.version, &a.spec))) {
        Drift::InSync { version } => DriftBadge::InSync { version },
        Drift::Drifted { version, summary } => DriftBadge::Drifted { version, summary },
        Drift::Unknown => DriftBadge::Unknown,
    }
}

/// What the UI shows of one router's push. A 409 to a push conditioned on the reviewed version means the
/// router moved after the operator looked: said so in words, since the fix is to review again, not retry.
fn push_result(outcome: &PushOutcome, if_version: Option<u64>) -> PushResult {
    match outcome.clone() {
        PushOutcome::Applied { version } => PushResult::Applied { version },
        PushOutcome::Refused { status: 409, code, message } if code == "version_conflict" => {
            let reviewed =
                if_version.map_or_else(|| "the version it ran".to_owned(), |v| format!("version {v}"));
            PushResult::Refused {
                status: 409,
                code,
                message: format!(
                    "moved meanwhile: you reviewed {reviewed}; left as it is, review its change again ({message})"
                ),
            }
        }
        PushOutcome::Refused { status, code, message } => PushResult::Refused { status, code, message },
        PushOutcome::Unreachable { error } => PushResult::Unreachable { error },
    }
}

fn describe(outcome: &PushOutcome) -> String {
    match outcome {
        PushOutcome::Applied { version } => format!("applied as version {version}"),
        PushOutcome::Refused { status, code, message } => format!("refused ({status} {code}): {message}"),
        PushOutcome::Unreachable { error } => format!("unreachable: {error}"),
    }
}

/// A push outcome as the audit trail records it.
fn audit_outcome(label: &str, outcome: &PushOutcome) -> fleet_store::PushOutcome {
    match outcome {
        PushOutcome::Applied { .. } => {
            fleet_store::PushOutcome::Acknowledged { acked_label: label.to_owned() }
        }
        other => fleet_store::PushOutcome::Failed { error: describe(other) },
    }
}

/// A router whose conditioned change came back 409 `version_conflict`, as the canary reports it.
fn moved(
    url: &str,
    step: &str,
    expected: Option<u64>,
    current: Option<u64>,
    outcome: &PushOutcome,
) -> MovedRouter {
    MovedRouter {
        url: url.to_owned(),
        step: step.to_owned(),
        expected_version: expected,
        current_version: current,
        message: format!(
            "moved meanwhile: the {step} was conditioned on version {}, the router runs {}; left as it is ({})",
            expected.map_or("?".to_owned(), |v| v.to_string()),
            current.map_or("another".to_owned(), |v| format!("version {v}")),
            describe(outcome)
        ),
    }
}

/// Who made a change: the name given, else `FLEETDECK_OPERATOR`, else the OS user.
pub fn operator_name(given: Option<&str>) -> String {
    given
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .or_else(|| std::env::var("FLEETDECK_OPERATOR").ok().filter(|n| !n.trim().is_empty()))
        .or_else(|| std::env::var("USER").ok().filter(|n| !n.is_empty()))
        .or_else(|| std::env::var("USERNAME").ok().filter(|n| !n.is_empty()))
        .unwrap_or_else(|| "unknown operator".to_owned())
}

/// The rollout side of the app. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Rollout {
    inner: Arc<RolloutInner>,
}

#[derive(Debug)]
struct RolloutInner {
    routers: Routers,
    audit: Audit,
    intended: Intended,
    etcd: EtcdKeys,
}

impl Rollout {
    pub(crate) fn new(routers: Routers, audit: Audit, etcd: EtcdKeys, intended: Intended) -> Self {
        Self { inner: Arc::new(RolloutInner { routers, audit, intended, etcd }) }
    }

    pub(crate) fn routers(&self) -> &Routers {
        &self.inner.routers
    }

    pub(crate) fn audit(&self) -> &Audit {
        &self.inner.audit
    }

    /// The spec the fleet is meant to run: the last put in force from this app, else the newest version in
    /// the audit trail.
    pub(crate) async fn intended_spec(&self) -> Option<(String, PolicySpec)> {
        self.inner.intended.get().await
    }

    /// Remembers `spec` as what the fleet is meant to run (a change from this app took effect).
    pub(crate) fn set_intended(&self, label: &str, spec: PolicySpec) {
        self.inner.intended.set(label, spec);
    }

    /// Records how version `label` fared on `router`.
    async fn record_outcome(&self, label: &str, router: &str, outcome: &PushOutcome) {
        self.inner.audit.record_push(label, router, &audit_outcome(label, outcome)).await;
    }

    /// The policies, their parameter docs, what every router runs with its drift badge, and the canary
    /// guards' defaults.
    pub async fn policy_editor(&self) -> Result<PolicyEditor, ApiError> {
        let intended = self.intended_spec().await;
        let intended_spec = intended.as_ref().map(|(_, spec)| spec);
        let routers = self
            .inner
            .routers
            .read_policies()
            .await
            .into_iter()
            .map(|(url, result)| match result {
                Ok(policy) => RouterPolicy {
                    drift: drift_badge(intended_spec, Some(&policy)),
                    url,
                    version: Some(policy.version),
                    policy: Some(policy.spec.policy.clone()),
                    spec_json: Some(policy.spec.to_json()),
                    error: None,
                },
                Err(error) => RouterPolicy {
                    drift: drift_badge(intended_spec, None),
                    url,
                    version: None,
                    policy: None,
                    spec_json: None,
                    error: Some(error),
                },
            })
            .collect();
        Ok(PolicyEditor {
            policies: editor::policy_infos(),
            routers,
            intended_json: intended.map(|(_, spec)| spec.to_json()),
            etcd_key: self.inner.etcd.main_key().map(str::to_owned),
            canary_defaults: canary::guards_view(&fleet_rollout::Guards::default()),
            pd_params: editor::pd_param_infos(),
        })
    }

    /// Validates `args.text` and, when valid, diffs it against every router's active spec.
    pub async fn check_spec(&self, args: CheckSpecArgs) -> Result<SpecCheck, ApiError> {
        let parsed = read_spec(&args.text).await;
        let mut check = editor::check_of(&parsed);
        let Ok(candidate) = parsed else { return Ok(check) };
        check.diffs = self
            .inner
            .routers
            .read_policies()
            .await
            .into_iter()
            .map(|(url, result)| match result {
                Ok(active) => editor::router_diff(&url, active.version, &spec_diff(&active.spec, &candidate)),
                Err(error) => RouterDiff {
                    url,
                    version: None,
                    policy_change: None,
                    params: Vec::new(),
                    unchanged: false,
                    error: Some(error),
                },
            })
            .collect();
        Ok(check)
    }

    /// Pushes a spec to the chosen routers with compare-and-swap and records every outcome.
    /// An invalid spec is refused before any router is contacted.
    pub async fn push_policy(&self, args: PushArgs) -> Result<PushReport, ApiError> {
        let spec = spec_or_api_error(&args.text).await?;
        if args.targets.is_empty() {
            return Err(ApiError::new("bad_request", "pick at least one router to push to"));
        }
        let urls: Vec<String> = args.targets.iter().map(|t| t.url.clone()).collect();
        let clients = self.inner.routers.clients_for(&urls)?;
        let author = operator_name(args.operator.as_deref());
        let router_urls: Vec<String> = clients.iter().map(|c| c.url.clone()).collect();
        let label = self.inner.audit.record_version(&spec, &author, &router_urls, &spec.policy).await?;
        let pushes = clients.iter().map(|client| {
            let if_version = args
                .targets
                .iter()
                .find(|t| t.url.trim_end_matches('/') == client.url)
                .and_then(|t| t.if_version);
            let spec = &spec;
            async move {
                match if_version {
                    Some(version) => (Some(version), client.put_policy(spec, version).await.outcome),
                    None => push_current(client, spec).await,
                }
            }
        });
        let outcomes = futures_util::future::join_all(pushes).await;
        let mut results = Vec::new();
        for (client, (if_version, outcome)) in clients.iter().zip(outcomes) {
            self.record_outcome(&label, &client.url, &outcome).await;
            results.push(RouterPush {
                url: client.url.clone(),
                if_version,
                result: push_result(&outcome, if_version),
            });
        }
        if results.iter().any(|r| matches!(r.result, PushResult::Applied { .. })) {
            self.set_intended(&label, spec);
        }
        Ok(PushReport { label, author, at_ms: unix_ms_now(), results })
    }

    /// Pushes `spec` to `routers`, each over HTTP conditioned on its `reviewed` version (else the version it
    /// runs now), or through its etcd key; returns the outcomes and the routers that moved meanwhile.
    pub(crate) async fn push_to(
        &self,
        routers: &[String],
        spec: &PolicySpec,
        label: &str,
        reviewed: &HashMap<String, u64>,
        step: &str,
    ) -> (Vec<(String, PushOutcome)>, Vec<MovedRouter>) {
        let clients = match self.inner.routers.clients_for(routers) {
            Ok(clients) => clients,
            Err(e) => return (all_unreachable(routers, &e), Vec::new()),
        };
        // Routers on etcd take the step through their key (a canary group's own key), the rest over HTTP.
        let (by_key, clients) = self.inner.etcd.split_by_key(clients).await;
        let (on_keys, _) = self.inner.etcd.change_keys(&by_key, KeyChange::Push(spec)).await;
        let mut answered = Vec::new();
        for (url, outcome) in on_keys {
            self.record_outcome(label, &url, &outcome).await;
            answered.push((url, outcome));
        }
        let pushes = clients.iter().map(|client| async move {
            match reviewed.get(&client.url) {
                Some(&version) => {
                    let change = client.put_policy(spec, version).await;
                    (Some(version), change.outcome, change.current_version)
                }
                None => {
                    let (version, outcome) = push_current(client, spec).await;
                    (version, outcome, None)
                }
            }
        });
        let outcomes = futures_util::future::join_all(pushes).await;
        let mut moved_routers = Vec::new();
        for (client, (expected, outcome, current)) in clients.iter().zip(outcomes) {
            self.record_outcome(label, &client.url, &outcome).await;
            if is_conflict(&outcome) {
                moved_routers.push(moved(&client.url, step, expected, current, &outcome));
            }
            answered.push((client.url.clone(), outcome));
        }
        (answered, moved_routers)
    }

    /// Rolls routers back and records the restored spec as a version of its own, so the
    /// candidate's active window ends where the rollback took effect. Over HTTP each rollback is
    /// conditioned on the version the canary applied there (`applied`): a router someone changed since
    /// keeps that change and is reported as moved.
    pub(crate) async fn roll_back(
        &self,
        routers: &[String],
        label: &str,
        author: &str,
        applied: &HashMap<String, u64>,
    ) -> (Vec<(String, PushOutcome)>, Vec<MovedRouter>) {
        let clients = match self.inner.routers.clients_for(routers) {
            Ok(clients) => clients,
            Err(e) => return (all_unreachable(routers, &e), Vec::new()),
        };
        let (by_key, clients) = self.inner.etcd.split_by_key(clients).await;
        let mut answered = Vec::new();
        let (on_keys, restored) = self.inner.etcd.change_keys(&by_key, KeyChange::Rollback).await;
        if let Some(spec) = restored.filter(|_| on_keys.iter().any(|(_, o)| o.is_applied())) {
            let urls: Vec<String> = on_keys.iter().map(|(url, _)| url.clone()).collect();
            let hint = format!("rollback-of-{label}");
            if let Ok(rollback) = self.inner.audit.record_version(&spec, author, &urls, &hint).await {
                for (url, outcome) in on_keys.iter().filter(|(_, o)| o.is_applied()) {
                    self.record_outcome(&rollback, url, outcome).await;
                }
            }
        }
        answered.extend(on_keys);
        let outcomes = futures_util::future::join_all(
            clients.iter().map(|client| client.rollback_policy(applied.get(&client.url).copied())),
        )
        .await;
        let restored = futures_util::future::join_all(clients.iter().map(AdminClient::policy)).await;
        let mut rollback_label: Option<String> = None;
        let mut moved_routers = Vec::new();
        for ((client, change), active) in clients.iter().zip(outcomes).zip(restored) {
            let (outcome, current) = (change.outcome, change.current_version);
            if is_conflict(&outcome) {
                let expected = applied.get(&client.url).copied();
                moved_routers.push(moved(&client.url, "rollback", expected, current, &outcome));
            }
            if outcome.is_applied()
                && let Ok(active) = active
            {
                if rollback_label.is_none() {
                    let urls: Vec<String> = clients.iter().map(|c| c.url.clone()).collect();
                    rollback_label = self
                        .inner
                        .audit
                        .record_version(&active.spec, author, &urls, &format!("rollback-of-{label}"))
                        .await
                        .ok();
                }
                if let Some(rollback) = &rollback_label {
                    self.record_outcome(rollback, &client.url, &outcome).await;
                }
            }
            answered.push((client.url.clone(), outcome));
        }
        (answered, moved_routers)
    }
}

/// A 409 `version_conflict`: the router moved on from the version the change was conditioned on.
fn is_conflict(outcome: &PushOutcome) -> bool {
    matches!(outcome, PushOutcome::Refused { status: 409, code, .. } if code == "version_conflict")
}

/// Spec text as every command reads it: the checks that need no parse (empty, size, nesting) at once, then
/// the parse on a blocking thread within [`fleet_policy::SPEC_PARSE_DEADLINE`], so no text an operator (or a
/// page) sends holds the threads that serve the UI and scrape the fleet.
pub(crate) async fn read_spec(text: &str) -> Result<PolicySpec, SpecProblem> {
    editor::precheck(text)?;
    let deadline = fleet_policy::SPEC_PARSE_DEADLINE;
    let owned = text.to_owned();
    match tokio::time::timeout(deadline, tokio::task::spawn_blocking(move || editor::parse_spec(&owned)))
        .await
    {
        Ok(Ok(parsed)) => parsed,
        Ok(Err(_)) => {
            Err(SpecProblem { field: None, message: "the spec parser stopped unexpectedly".to_owned() })
        }
        Err(_) => Err(editor::problem_of(&fleet_policy::SpecError::TooSlow {
            limit_ms: deadline.as_millis() as u64,
        })),
    }
}

/// [`read_spec`], as the error every command answers for an invalid spec.
pub(crate) async fn spec_or_api_error(text: &str) -> Result<PolicySpec, ApiError> {
    read_spec(text).await.map_err(editor::invalid_spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_needs_an_intent_and_a_readable_router() {
        let spec = PolicySpec::named("least_load");
        let active = ActivePolicy { version: 3, spec: PolicySpec::named("least_load") };
        assert_eq!(drift_badge(None, Some(&active)), DriftBadge::NoIntent);
        assert_eq!(drift_badge(Some(&spec), Some(&active)), DriftBadge::InSync { version: 3 });
        assert_eq!(drift_badge(Some(&spec), None), DriftBadge::Unknown);
        let other = ActivePolicy { version: 4, spec: PolicySpec::named("random") };
        assert!(matches!(drift_badge(Some(&spec), Some(&other)), DriftBadge::Drifted { version: 4, .. }));
    }

    #[test]
    fn the_operator_is_named() {
        assert_eq!(operator_name(Some(" ana ")), "ana");
        assert!(!operator_name(None).is_empty());
    }
}
