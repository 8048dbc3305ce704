//! The audit trail: every policy version, push, rollback and canary step the app makes, under the fleet
//! this launch writes as, and what the history view reads back (versions with their active windows, and
//! before/after comparisons with bootstrap intervals).
//!
//! [`Audit`] owns the history store's audit side and the launch's history fleet. It knows nothing of
//! routers or HTTP: callers hand it what happened, in the store's own terms.

pub mod compare;

use std::path::Path;
use std::sync::{Arc, OnceLock};

use fleet_policy::PolicySpec;
use fleet_store::{
    AnnotationKind, CompareOptions, NewAnnotation, NewPolicyVersion, PushOutcome, Store, StoreError, Tier,
    TimeWindow,
};
use fleetdeck_api::{
    ApiError, HistoryCompareArgs, HistoryComparison, HistoryWindow, OverlaySeries, PolicyHistory,
    PolicyMarker, PolicyVersionRow,
};

use crate::unix_ms_now;

/// The audit trail. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Audit {
    inner: Arc<AuditInner>,
}

#[derive(Debug)]
struct AuditInner {
    store: Store,
    /// The fleet of the history this launch writes and reads (audit trail, comparisons) when it is not
    /// `default`: set once, to `demo`, when the demo starts from the UI, so demo samples never mix with a
    /// real fleet's.
    fleet: OnceLock<&'static str>,
}

pub(crate) fn history_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::new("history_unavailable", format!("{e}; check that the history database is readable"))
}

impl Audit {
    pub(crate) fn new(store: Store) -> Self {
        Self { inner: Arc::new(AuditInner { store, fleet: OnceLock::new() }) }
    }

    /// The history store (samples and series are read through it too).
    pub(crate) fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The fleet whose history this launch writes and reads.
    pub fn fleet(&self) -> &'static str {
        self.inner.fleet.get().copied().unwrap_or(fleet_store::DEFAULT_FLEET)
    }

    /// Writes this launch's history under `fleet` from now on. Set once: an app that wrote under another
    /// fleet before must not move (the demo starts only in an app that watched nothing).
    pub(crate) fn write_as(&self, fleet: &'static str) {
        let _ = self.inner.fleet.set(fleet);
    }

    /// Records a router the app reads (with the path of its token file, never the token).
    pub(crate) async fn register_router(&self, url: &str, token_file: Option<&Path>) {
        if let Err(error) = self.inner.store.register_router(self.fleet(), url, token_file).await {
            tracing::warn!(%error, url, "could not record the router in the history");
        }
    }

    /// Records a new version under a fresh label (`HINT@MS`, or `HINT@MS.N` when taken).
    pub(crate) async fn record_version(
        &self,
        spec: &PolicySpec,
        author: &str,
        routers: &[String],
        label_hint: &str,
    ) -> Result<String, ApiError> {
        let created_ms = unix_ms_now();
        let routers: Vec<&str> = routers.iter().map(String::as_str).collect();
        let spec_text = spec.to_json();
        for attempt in 0..100 {
            let label = if attempt == 0 {
                format!("{label_hint}@{created_ms}")
            } else {
                format!("{label_hint}@{created_ms}.{attempt}")
            };
            let version = NewPolicyVersion {
                fleet: self.fleet(),
                label: &label,
                spec: &spec_text,
                author,
                created_ms,
                routers: &routers,
            };
            match self.inner.store.record_policy_version(&version).await {
                Ok(_) => return Ok(label),
                Err(StoreError::DuplicatePolicy { .. }) => continue,
                Err(e) => {
                    return Err(ApiError::new(
                        "history_unavailable",
                        format!("cannot record the change in the audit trail, so nothing was pushed: {e}"),
                    ));
                }
            }
        }
        Err(ApiError::new("internal", "could not find a free label for the policy version"))
    }

    /// Records how version `label` fared at `target` (a router URL, or `etcd:KEY`). A failure to record is
    /// logged: the change itself already happened.
    pub(crate) async fn record_push(&self, label: &str, target: &str, outcome: &PushOutcome) {
        if let Err(error) = self.inner.store.record_push(label, target, unix_ms_now(), outcome).await {
            tracing::error!(%error, label, target, "could not record a push in the audit trail");
        }
    }

    /// Records a note (a canary step, a gap in what it could measure).
    pub(crate) async fn note(&self, author: &str, text: &str) {
        let annotation = NewAnnotation {
            fleet: self.fleet(),
            kind: AnnotationKind::Note,
            start_ms: unix_ms_now(),
            end_ms: None,
            author,
            text,
        };
        if let Err(error) = self.inner.store.add_annotation(&annotation).await {
            tracing::error!(%error, "could not record a rollout step in the audit trail");
        }
    }

    /// The newest recorded version that parses: what the fleet is meant to run when this launch pushed
    /// nothing yet.
    pub(crate) async fn newest_version(&self) -> Option<(String, PolicySpec)> {
        let versions = self.inner.store.policy_versions(self.fleet()).await.ok()?;
        versions.into_iter().rev().find_map(|v| Some((v.label, v.spec.parse::<PolicySpec>().ok()?)))
    }

    /// Acknowledged pushes between `since` and `until`, as chart markers.
    pub(crate) async fn markers(&self, since: i64, until: i64) -> Result<Vec<PolicyMarker>, ApiError> {
        let pushes = self.inner.store.fleet_pushes(self.fleet()).await.map_err(history_error)?;
        Ok(pushes
            .into_iter()
            .filter(|push| matches!(push.outcome, PushOutcome::Acknowledged { .. }))
            .filter(|push| (since..=until).contains(&push.pushed_ms))
            .map(|push| PolicyMarker {
                ts_ms: push.pushed_ms,
                label: format!("{} pushed to {}", push.label, push.router_url),
            })
            .collect())
    }

    /// Every recorded policy version, oldest first, with its pushes and active window.
    pub async fn policy_history(&self) -> Result<PolicyHistory, ApiError> {
        let store = &self.inner.store;
        let now_ms = unix_ms_now();
        let fleet = self.fleet();
        let versions = store.policy_versions(fleet).await.map_err(history_error)?;
        let pushes = store.fleet_pushes(fleet).await.map_err(history_error)?;
        let windows = fleet_store::active_windows(&pushes, now_ms);
        let rows = versions
            .into_iter()
            .map(|version| {
                let window = windows.get(&version.label);
                PolicyVersionRow {
                    pushes: pushes
                        .iter()
                        .filter(|p| p.label == version.label)
                        .map(|p| match &p.outcome {
                            PushOutcome::Acknowledged { .. } => format!("{}: applied", p.router_url),
                            PushOutcome::Failed { error } => format!("{}: {error}", p.router_url),
                        })
                        .collect(),
                    active_from_ms: window.map(|w| w.from_ms),
                    active_to_ms: window.map(|w| w.to_ms),
                    label: version.label,
                    author: version.author,
                    created_ms: version.created_ms,
                    spec: version.spec,
                    routers: version.routers,
                }
            })
            .collect();
        Ok(PolicyHistory { versions: rows })
    }

    /// Window `b` against window `a`: the delta table with intervals, overlaid series, CSV.
    pub async fn history_compare(&self, args: HistoryCompareArgs) -> Result<HistoryComparison, ApiError> {
        let (a, b) = (compare::to_spec(&args.a)?, compare::to_spec(&args.b)?);
        let store = &self.inner.store;
        let now_ms = unix_ms_now();
        let options = CompareOptions { fleet: self.fleet().to_owned(), ..CompareOptions::default() };
        let comparison = store
            .compare(&a, &b, now_ms, &options)
            .await
            .map_err(|e| ApiError::new("bad_request", format!("cannot compare these windows: {e}")))?;
        let fleet_id = store.fleet_id(&options.fleet).await.map_err(history_error)?;
        let oldest = comparison.a.from_ms.min(comparison.b.from_ms);
        let tier = if oldest >= now_ms - options.retention.ten_seconds_ms {
            Tier::TenSeconds
        } else {
            Tier::OneMinute
        };
        let window_a = TimeWindow { from_ms: comparison.a.from_ms, to_ms: comparison.a.to_ms };
        let window_b = TimeWindow { from_ms: comparison.b.from_ms, to_ms: comparison.b.to_ms };
        let buckets_a = store.fleet_buckets(fleet_id, tier, window_a).await.map_err(history_error)?;
        let buckets_b = store.fleet_buckets(fleet_id, tier, window_b).await.map_err(history_error)?;
        let series = compare::CHARTED
            .iter()
            .map(|(metric, read)| OverlaySeries {
                metric: (*metric).to_owned(),
                a: compare::overlay(&buckets_a, window_a.from_ms, *read),
                b: compare::overlay(&buckets_b, window_b.from_ms, *read),
            })
            .collect();
        let label = |w: &HistoryWindow| match w {
            HistoryWindow::Version { label } => label.clone(),
            HistoryWindow::Range { .. } => "time window".to_owned(),
        };
        Ok(compare::to_api(&comparison, label(&args.a), label(&args.b), series))
    }
}
