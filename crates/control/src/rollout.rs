//! Changing the fleet's routing policy: each router's policy through its admin API (read, push
//! with compare-and-swap, roll back), drift against the intended spec, the canary runner, and the
//! audit trail of every change.
//!
//! The decisions are fleet-rollout's (pure); this module performs them: it does the HTTP calls,
//! each bounded in time and size, measures both canary sides from the routers' recorded traffic,
//! and writes every version, push and canary step to the history store.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fleet_policy::PolicySpec;
use fleet_rollout::{Action, Canary, CanaryPlan, Drift, Guards, Phase, PushOutcome, SideWindow, Verdict};
use fleet_store::{AnnotationKind, NewAnnotation, NewPolicyVersion, StoreError};
use fleet_trace::TraceRecord;
use fleetdeck_api::{
    AbortCanaryArgs, ApiError, CanaryArgs, CanaryGuards, CanaryStatus, CanaryStep, CanaryView, DriftBadge,
    GuardReadingView, MovedRouter, PushArgs, PushReport, PushResult, RouterPush, SideFigures,
};
use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::admin::{AdminClient, AdminRequest, TracePage};
use crate::fleet::{Control, unix_ms_now};
use crate::lock;

/// Largest policy answer accepted: a spec is a few hundred bytes.
pub const MAX_POLICY_BODY: usize = 1 << 20;
/// Default time between two measurements of a canary.
pub const DEFAULT_CHECK_EVERY: Duration = Duration::from_secs(2);
/// Longest observation a canary may be given (a day).
const MAX_OBSERVE_S: u64 = 86_400;

/// A router's active policy.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivePolicy {
    pub version: u64,
    pub spec: PolicySpec,
}

#[derive(Deserialize)]
struct WirePolicy {
    version: u64,
    spec: Value,
}

/// Parses `GET /admin/policy` (and the 200 answers of PUT and rollback).
pub fn parse_policy(body: &[u8]) -> Result<ActivePolicy, String> {
    let wire: WirePolicy = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let spec: PolicySpec = serde_json::from_value(wire.spec).map_err(|e| format!("spec: {e}"))?;
    Ok(ActivePolicy { version: wire.version, spec })
}

/// One policy call (bounded in time and size by [`AdminClient::call`]): status and body, or why there was
/// none.
async fn exchange(
    client: &AdminClient,
    method: reqwest::Method,
    path: &str,
    json: Option<String>,
    if_match: Option<u64>,
) -> Result<(u16, Vec<u8>), String> {
    let request = AdminRequest { json, if_match };
    let answer = client.call(method, path, request, MAX_POLICY_BODY).await.map_err(|e| e.to_string())?;
    Ok((answer.status, answer.body))
}

/// Every router of a step the app could not even address (an unknown URL), with the reason.
fn all_unreachable(routers: &[String], error: &ApiError) -> Vec<(String, PushOutcome)> {
    routers.iter().map(|r| (r.clone(), PushOutcome::Unreachable { error: error.message.clone() })).collect()
}

/// The router's error body `{code, message}`, or a shortened raw body.
fn refusal(status: u16, body: &[u8]) -> PushOutcome {
    let error: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let code = error["code"].as_str().map(str::to_owned).unwrap_or_else(|| match status {
        401 => "unauthorized".to_owned(),
        409 => "version_conflict".to_owned(),
        _ => format!("http_{status}"),
    });
    // The router's own JSON message; never the raw body, which could be anything at that URL.
    let mut message = error["message"].as_str().map_or_else(
        || format!("the answer (HTTP {status}) is not fleet-router's JSON error"),
        str::to_owned,
    );
    if let Some(current) = error["current_version"].as_u64() {
        message.push_str(&format!(" (the router is at version {current})"));
    }
    PushOutcome::Refused { status, code, message }
}

/// The version a 409 `version_conflict` says is in force.
fn conflict_version(result: &Result<(u16, Vec<u8>), String>) -> Option<u64> {
    let Ok((409, body)) = result else { return None };
    serde_json::from_slice::<Value>(body).ok()?["current_version"].as_u64()
}

/// An answer to a policy change as a push outcome.
fn outcome_of(result: Result<(u16, Vec<u8>), String>) -> PushOutcome {
    match result {
        Err(error) => PushOutcome::Unreachable { error },
        Ok((200..=299, body)) => match parse_policy(&body) {
            Ok(policy) => PushOutcome::Applied { version: policy.version },
            Err(detail) => PushOutcome::Unreachable {
                error: format!(
                    "the router answered success in a shape this app does not understand: {detail}"
                ),
            },
        },
        Ok((status, body)) => refusal(status, &body),
    }
}

/// `GET /admin/policy`.
pub async fn read_policy(client: &AdminClient) -> Result<ActivePolicy, String> {
    match exchange(client, reqwest::Method::GET, "/admin/policy", None, None).await? {
        (200..=299, body) => parse_policy(&body).map_err(|d| format!("cannot read the router's policy: {d}")),
        (status, body) => Err(match refusal(status, &body) {
            PushOutcome::Refused { code, message, .. } => format!("HTTP {status} {code}: {message}"),
            other => format!("{other:?}"),
        }),
    }
}

/// `PUT /admin/policy` with `If-Match: "if_version"`. The spec must be valid: callers validate
/// first, so an invalid spec never reaches a router.
pub async fn put_policy(client: &AdminClient, spec: &PolicySpec, if_version: u64) -> PushOutcome {
    let body = serde_json::to_string(spec).unwrap_or_default();
    outcome_of(exchange(client, reqwest::Method::PUT, "/admin/policy", Some(body), Some(if_version)).await)
}

/// `PUT /admin/policy` with `If-Match: "if_version"`, and on a 409 the version the router runs instead.
async fn put_policy_reporting(
    client: &AdminClient,
    spec: &PolicySpec,
    if_version: u64,
) -> (PushOutcome, Option<u64>) {
    let body = serde_json::to_string(spec).unwrap_or_default();
    let answer = exchange(client, reqwest::Method::PUT, "/admin/policy", Some(body), Some(if_version)).await;
    let current = conflict_version(&answer);
    (outcome_of(answer), current)
}

/// `POST /admin/policy/rollback`.
pub async fn rollback_policy(client: &AdminClient) -> PushOutcome {
    outcome_of(exchange(client, reqwest::Method::POST, "/admin/policy/rollback", None, None).await)
}

/// `POST /admin/policy/rollback` only while `if_version` is in force (`If-Match`): undoing the canary's
/// version must not undo what someone put in force after it. On a 409, the version the router runs.
async fn rollback_policy_if(client: &AdminClient, if_version: Option<u64>) -> (PushOutcome, Option<u64>) {
    let answer = exchange(client, reqwest::Method::POST, "/admin/policy/rollback", None, if_version).await;
    let current = conflict_version(&answer);
    (outcome_of(answer), current)
}

/// Pushes with compare-and-swap against the version the router runs now.
async fn push_current(client: &AdminClient, spec: &PolicySpec) -> (Option<u64>, PushOutcome) {
    match read_policy(client).await {
        Ok(active) => (Some(active.version), put_policy(client, spec, active.version).await),
        Err(error) => (None, PushOutcome::Unreachable { error }),
    }
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

/// The fields of a recorded request that a canary's guards read (hashes and the rest are not kept).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observed {
    /// Arrival (Unix ms).
    pub arrival_ms: u64,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Prompt tokens the replica served from its cache, when it said.
    pub cached_tokens: Option<u32>,
    /// Time to first token, when measured.
    pub ttft_ms: Option<f64>,
    /// The request failed: a 5xx (the router's 502s included) or a stream ended by an error event.
    pub failed: bool,
    /// The request succeeded (2xx, not ended by an error): only these have a TTFT worth judging; a fast 4xx
    /// is neither a good first token nor a server error.
    pub succeeded: bool,
}

impl From<&TraceRecord> for Observed {
    fn from(record: &TraceRecord) -> Self {
        let status = record.status.unwrap_or(200);
        let failed = status >= 500 || record.error.is_some();
        Self {
            arrival_ms: record.timestamp,
            input_tokens: record.input_length,
            cached_tokens: record.cached_tokens,
            ttft_ms: record.ttft_ms,
            failed,
            succeeded: !failed && (200..300).contains(&status),
        }
    }
}

/// What a canary has read of one router's recorded traffic: its cursor and every request since the canary
/// began. Each check reads only what the router added since the last one: a canary of an hour on a busy
/// fleet would otherwise download hours of records every few seconds, and soon more than a body may hold.
#[derive(Debug, Default)]
pub struct RouterTraffic {
    next: Option<u64>,
    epoch: Option<u64>,
    observed: Vec<Observed>,
}

impl RouterTraffic {
    /// The cursor to read the next page with.
    pub fn cursor(&self) -> u64 {
        self.next.unwrap_or(0)
    }

    /// Takes in a page read with [`Self::cursor`]. A router that restarted (new epoch, or a cursor that went
    /// back) answered with everything it holds, and a router too old to page (no cursor) with the whole
    /// window: both replace what was kept rather than add to it.
    pub fn absorb(&mut self, page: TracePage) {
        let restarted = self.epoch.is_some() && page.epoch != self.epoch
            || matches!((self.next, page.next), (Some(before), Some(now)) if now < before);
        if page.next.is_none() || restarted {
            self.observed.clear();
        }
        self.observed.extend(page.records.iter().map(Observed::from));
        (self.next, self.epoch) = (page.next, page.epoch);
    }
}

/// One side's figures from the routers' recorded requests that arrived at or after `since_ms`:
/// failed requests counted as errors, TTFT p95 (nearest rank) over the successful requests' `ttft_ms`, hit
/// rate = sum cached tokens / sum prompt tokens over the requests that report cached tokens.
pub fn side_window<'a>(observed: impl IntoIterator<Item = &'a Observed>, since_ms: u64) -> SideWindow {
    let recent: Vec<&Observed> = observed.into_iter().filter(|r| r.arrival_ms >= since_ms).collect();
    let errors = recent.iter().filter(|r| r.failed).count() as u64;
    let mut ttfts: Vec<f64> =
        recent.iter().filter(|r| r.succeeded).filter_map(|r| r.ttft_ms).filter(|t| t.is_finite()).collect();
    ttfts.sort_by(f64::total_cmp);
    let ttft_p95_s = (!ttfts.is_empty()).then(|| {
        let rank = ((ttfts.len() as f64) * 0.95).ceil() as usize;
        ttfts[rank.clamp(1, ttfts.len()) - 1] / 1000.0
    });
    let (cached, input) = recent
        .iter()
        .filter_map(|r| r.cached_tokens.map(|c| (u64::from(c), u64::from(r.input_tokens))))
        .fold((0u64, 0u64), |(c, i), (rc, ri)| (c + rc, i + ri));
    let hit_rate = (input > 0).then(|| cached as f64 / input as f64);
    SideWindow { requests: recent.len() as u64, errors, ttft_p95_s, hit_rate }
}

fn figures(side: &SideWindow) -> SideFigures {
    SideFigures {
        requests: side.requests,
        errors: side.errors,
        ttft_p95_s: side.ttft_p95_s,
        hit_rate: side.hit_rate,
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

/// The rollout side of the app: the intended spec and the canary.
#[derive(Debug, Default)]
pub(crate) struct RolloutState {
    /// `(label, spec)` of the version last pushed from this app.
    intended: Mutex<Option<(String, PolicySpec)>>,
    canary: Mutex<Option<CanaryRun>>,
    next_canary: AtomicU64,
    pub(crate) whatif: crate::whatif::WhatIfJobs,
}

#[derive(Debug)]
struct CanaryRun {
    status: CanaryStatus,
    abort: CancellationToken,
    abort_reason: Option<String>,
}

impl Control {
    fn rollout(&self) -> &RolloutState {
        &self.inner.rollout
    }

    /// The spec the fleet is meant to run: the last pushed from this app, else the newest
    /// version in the audit trail.
    pub(crate) async fn intended_spec(&self) -> Option<(String, PolicySpec)> {
        let cached = lock(&self.rollout().intended).clone();
        if cached.is_some() {
            return cached;
        }
        let versions = self.inner.store.policy_versions(self.history_fleet()).await.ok()?;
        let last = versions.into_iter().rev().find_map(|v| {
            let spec = v.spec.parse::<PolicySpec>().ok()?;
            Some((v.label, spec))
        })?;
        Some(last)
    }

    /// Remembers `spec` as what the fleet is meant to run (a push from this app took effect).
    pub(crate) fn set_intended(&self, label: &str, spec: PolicySpec) {
        *lock(&self.rollout().intended) = Some((label.to_owned(), spec));
    }

    /// Each router's client by URL, or an error naming the routers there are.
    fn clients_for(&self, urls: &[String]) -> Result<Vec<AdminClient>, ApiError> {
        let known: Vec<AdminClient> = self.inner.routers.clients().into_iter().map(|(c, _)| c).collect();
        let mut chosen = Vec::new();
        for url in urls {
            let url = url.trim_end_matches('/');
            let Some(client) = known.iter().find(|c| c.url == url) else {
                let names: Vec<&str> = known.iter().map(|c| c.url.as_str()).collect();
                return Err(ApiError::new(
                    "unknown_router",
                    format!(
                        "{url} is not one of the app's routers ({}); add it in Settings first",
                        if names.is_empty() { "none yet".to_owned() } else { names.join(", ") }
                    ),
                ));
            };
            if !chosen.iter().any(|c: &AdminClient| c.url == client.url) {
                chosen.push(client.clone());
            }
        }
        Ok(chosen)
    }

    /// Every router's active policy, concurrently: `(url, policy or why not)`.
    pub(crate) async fn read_router_policies(&self) -> Vec<(String, Result<ActivePolicy, String>)> {
        let clients: Vec<AdminClient> = self.inner.routers.clients().into_iter().map(|(c, _)| c).collect();
        let results = futures_util::future::join_all(clients.iter().map(read_policy)).await;
        clients.into_iter().map(|c| c.url).zip(results).collect()
    }

    /// Records a new version in the audit trail under a fresh label.
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
                fleet: self.history_fleet(),
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

    async fn record_outcome(&self, label: &str, router: &str, outcome: &PushOutcome) {
        let record = match outcome {
            PushOutcome::Applied { .. } => {
                fleet_store::PushOutcome::Acknowledged { acked_label: label.to_owned() }
            }
            other => fleet_store::PushOutcome::Failed { error: describe(other) },
        };
        if let Err(error) = self.inner.store.record_push(label, router, unix_ms_now(), &record).await {
            tracing::error!(%error, label, router, "could not record a push in the audit trail");
        }
    }

    async fn note(&self, author: &str, text: &str) {
        let annotation = NewAnnotation {
            fleet: self.history_fleet(),
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

    /// Pushes a spec to the chosen routers with compare-and-swap and records every outcome.
    /// An invalid spec is refused before any router is contacted.
    pub async fn push_policy(&self, args: PushArgs) -> Result<PushReport, ApiError> {
        let spec = crate::policy_edit::spec_or_api_error(&args.text)?;
        if args.targets.is_empty() {
            return Err(ApiError::new("bad_request", "pick at least one router to push to"));
        }
        let urls: Vec<String> = args.targets.iter().map(|t| t.url.clone()).collect();
        let clients = self.clients_for(&urls)?;
        let author = operator_name(args.operator.as_deref());
        let router_urls: Vec<String> = clients.iter().map(|c| c.url.clone()).collect();
        let label = self.record_version(&spec, &author, &router_urls, &spec.policy).await?;
        let pushes = clients.iter().map(|client| {
            let if_version = args
                .targets
                .iter()
                .find(|t| t.url.trim_end_matches('/') == client.url)
                .and_then(|t| t.if_version);
            let spec = &spec;
            async move {
                match if_version {
                    Some(version) => (Some(version), put_policy(client, spec, version).await),
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
            *lock(&self.rollout().intended) = Some((label.clone(), spec));
        }
        Ok(PushReport { label, author, at_ms: unix_ms_now(), results })
    }

    /// Starts a canary: the candidate goes to `args.canary`, is watched against `args.baseline`,
    /// then promoted or rolled back by itself. One canary runs at a time.
    pub async fn start_canary(&self, args: CanaryArgs) -> Result<CanaryStatus, ApiError> {
        let spec = crate::policy_edit::spec_or_api_error(&args.text)?;
        if args.observe_s == 0 || args.observe_s > MAX_OBSERVE_S {
            return Err(ApiError::new(
                "bad_request",
                format!("observe_s is {}; watch the canary for 1 to {MAX_OBSERVE_S} seconds", args.observe_s),
            ));
        }
        let check_every =
            Duration::from_millis(args.check_every_ms.unwrap_or(DEFAULT_CHECK_EVERY.as_millis() as u64));
        if !(Duration::from_millis(200)..=Duration::from_secs(600)).contains(&check_every) {
            return Err(ApiError::new(
                "bad_request",
                format!("check_every_ms is {}; measure every 200 to 600000 ms", check_every.as_millis()),
            ));
        }
        let canary_clients = self.clients_for(&args.canary)?;
        let baseline_clients = self.clients_for(&args.baseline)?;
        let plan = CanaryPlan {
            candidate: spec.clone(),
            canary: canary_clients.iter().map(|c| c.url.clone()).collect(),
            baseline: baseline_clients.iter().map(|c| c.url.clone()).collect(),
            observe_ms: args.observe_s * 1000,
            guards: Guards {
                max_ttft_p95_ratio: args.guards.max_ttft_p95_ratio,
                min_ttft_p95_increase_ms: args.guards.min_ttft_p95_increase_ms,
                max_hit_rate_drop: args.guards.max_hit_rate_drop,
                min_requests: args.guards.min_requests,
                max_error_rate_ratio: args.guards.max_error_rate_ratio,
                min_error_rate_increase: args.guards.min_error_rate_increase,
                require_hit_rate: args.guards.require_hit_rate,
            },
        };
        let reviewed: HashMap<String, u64> = args
            .reviewed
            .iter()
            .filter_map(|t| Some((t.url.trim_end_matches('/').to_owned(), t.if_version?)))
            .collect();
        plan.validate().map_err(|e| ApiError::new("bad_request", e.to_string()))?;
        {
            let running = lock(&self.rollout().canary);
            if let Some(run) = running.as_ref().filter(|r| !r.status.finished) {
                return Err(ApiError::new(
                    "canary_running",
                    format!(
                        "canary {} is still {}; wait for it or abort it first",
                        run.status.label, run.status.phase
                    ),
                ));
            }
        }
        let author = operator_name(args.operator.as_deref());
        let all: Vec<String> = plan.canary.iter().chain(&plan.baseline).cloned().collect();
        let label = self.record_version(&spec, &author, &all, &format!("canary-{}", spec.policy)).await?;
        let started_ms = unix_ms_now();
        let (canary, first) = Canary::start(plan.clone(), started_ms as u64)
            .map_err(|e| ApiError::new("bad_request", e.to_string()))?;
        let id = self.rollout().next_canary.fetch_add(1, Ordering::Relaxed) + 1;
        let abort = self.inner.cancel.child_token();
        let status = CanaryStatus {
            id,
            phase: "canary_pushing".to_owned(),
            reason: None,
            finished: false,
            policy: spec.policy.clone(),
            label: label.clone(),
            canary: plan.canary.clone(),
            baseline: plan.baseline.clone(),
            observe_s: args.observe_s,
            guards: CanaryGuards { ..args.guards },
            started_ms,
            canary_side: SideFigures::default(),
            baseline_side: SideFigures::default(),
            measure_error: None,
            steps: Vec::new(),
            verdict: None,
            missing: Vec::new(),
            readings: Vec::new(),
            moved: Vec::new(),
        };
        *lock(&self.rollout().canary) =
            Some(CanaryRun { status: status.clone(), abort: abort.clone(), abort_reason: None });
        let control = self.clone();
        tokio::spawn(async move {
            control.run_canary(canary, first, label, author, check_every, abort, reviewed).await;
        });
        Ok(status)
    }

    /// The current (or last) canary.
    pub async fn canary_status(&self) -> Result<CanaryView, ApiError> {
        Ok(CanaryView { canary: lock(&self.rollout().canary).as_ref().map(|r| r.status.clone()) })
    }

    /// Stops the running canary; whatever took the candidate is rolled back.
    pub async fn abort_canary(&self, args: AbortCanaryArgs) -> Result<CanaryView, ApiError> {
        {
            let mut canary = lock(&self.rollout().canary);
            match canary.as_mut() {
                Some(run) if !run.status.finished => {
                    run.abort_reason = Some(args.reason.trim().to_owned()).filter(|r| !r.is_empty());
                    run.abort.cancel();
                }
                _ => return Err(ApiError::new("no_canary", "no canary is running")),
            }
        }
        self.canary_status().await
    }

    /// Updates the status the UI reads from the state machine.
    fn publish(
        &self,
        canary: &Canary,
        sides: Option<(SideWindow, SideWindow)>,
        measure_error: Option<String>,
    ) {
        let mut slot = lock(&self.rollout().canary);
        let Some(run) = slot.as_mut() else { return };
        let status = &mut run.status;
        let phase = canary.phase();
        status.phase = phase.name().to_owned();
        status.reason = match phase {
            Phase::RollingBack { reason } | Phase::RolledBack { reason } | Phase::Failed { reason } => {
                Some(reason.clone())
            }
            _ => None,
        };
        status.finished = phase.is_terminal();
        if let Some((c, b)) = sides {
            status.canary_side = figures(&c);
            status.baseline_side = figures(&b);
        }
        if measure_error.is_some() || sides.is_some() {
            status.measure_error = measure_error;
        }
        if let Some(judgement) = canary.judgement() {
            status.verdict = Some(judgement.verdict.name().to_owned());
            status.missing = match &judgement.verdict {
                Verdict::NotEnoughData { missing } => missing.clone(),
                _ => Vec::new(),
            };
            status.readings = judgement
                .readings
                .iter()
                .map(|r| GuardReadingView {
                    guard: r.guard.clone(),
                    canary: r.canary,
                    baseline: r.baseline,
                    state: r.state.clone(),
                    detail: r.detail.clone(),
                })
                .collect();
        }
        status.steps = canary
            .log()
            .iter()
            .map(|s| CanaryStep { at_ms: s.at_ms as i64, phase: s.phase.clone(), detail: s.detail.clone() })
            .collect();
    }

    /// Both sides' figures since `since_ms`, from every router's recorded traffic: reads what each router
    /// added since the last check into `traffic`. A router that cannot be read fails the measurement (the
    /// others' pages are kept; its own cursor stays, so nothing is lost). Also returns a line for each
    /// router whose ring dropped records before they were read.
    async fn measure(
        &self,
        plan: &CanaryPlan,
        since_ms: u64,
        traffic: &mut HashMap<String, RouterTraffic>,
    ) -> Result<(SideWindow, SideWindow, Vec<String>), String> {
        let urls: Vec<String> = plan.canary.iter().chain(&plan.baseline).cloned().collect();
        let clients = self.clients_for(&urls).map_err(|e| e.message)?;
        let pages = futures_util::future::join_all(clients.iter().map(|client| {
            let after = traffic.get(&client.url).map_or(0, RouterTraffic::cursor);
            client.trace_after(since_ms as i64, after)
        }))
        .await;
        let mut failure = None;
        let mut gaps = Vec::new();
        for (client, page) in clients.iter().zip(pages) {
            match page {
                Ok(page) => {
                    if page.missed > 0 {
                        gaps.push(format!(
                            "the router at {} dropped {} recorded requests before the canary read them \
                             (its trace ring is full between checks); the guards judge the rest, a sample",
                            client.url, page.missed
                        ));
                    }
                    traffic.entry(client.url.clone()).or_default().absorb(page);
                }
                Err(error) => failure = failure.or(Some(error.to_string())),
            }
        }
        if let Some(error) = failure {
            return Err(error);
        }
        let side = |urls: &[String]| {
            let kept = urls.iter().filter_map(|url| traffic.get(url.trim_end_matches('/')));
            side_window(kept.flat_map(|router| &router.observed), since_ms)
        };
        Ok((side(&plan.canary), side(&plan.baseline), gaps))
    }

    /// Adds routers that moved meanwhile to the status the UI reads.
    fn report_moved(&self, moved: Vec<MovedRouter>) {
        if moved.is_empty() {
            return;
        }
        if let Some(run) = lock(&self.rollout().canary).as_mut() {
            run.status.moved.extend(moved);
        }
    }

    /// Drives one canary to its end, performing each action the state machine returns. Every change is
    /// conditioned: pushes on the version the operator reviewed (`reviewed`, by router URL), rollbacks on
    /// the version the canary put in force.
    #[allow(clippy::too_many_arguments)] // one canary's settings, each from the operator's request
    async fn run_canary(
        &self,
        mut canary: Canary,
        mut action: Action,
        label: String,
        author: String,
        check_every: Duration,
        abort: CancellationToken,
        reviewed: HashMap<String, u64>,
    ) {
        let mut logged = 0;
        let mut aborted = false;
        let mut traffic = HashMap::new();
        let mut applied_versions: HashMap<String, u64> = HashMap::new();
        loop {
            // Every new step goes to the audit trail as it happens.
            for step in &canary.log()[logged..] {
                self.note(&author, &format!("canary {label}: {}: {}", step.phase, step.detail)).await;
            }
            logged = canary.log().len();
            let now = || unix_ms_now() as u64;
            if abort.is_cancelled() && !aborted && !canary.phase().is_terminal() {
                aborted = true;
                let reason = lock(&self.rollout().canary)
                    .as_ref()
                    .and_then(|r| r.abort_reason.clone())
                    .unwrap_or_else(|| "stopped".to_owned());
                if matches!(canary.phase(), Phase::Observing { .. } | Phase::CanaryPushing) {
                    action = canary.abort(&reason, now());
                    self.publish(&canary, None, None);
                    continue;
                }
            }
            match action {
                Action::Finished => {
                    self.publish(&canary, None, None);
                    return;
                }
                Action::Push { routers, spec } => {
                    let step =
                        if matches!(canary.phase(), Phase::Promoting) { "promotion" } else { "canary push" };
                    let (outcomes, moved) = self.push_to(&routers, &spec, &label, &reviewed, step).await;
                    self.report_moved(moved);
                    for (url, outcome) in &outcomes {
                        if let PushOutcome::Applied { version } = outcome {
                            applied_versions.insert(url.clone(), *version);
                        }
                    }
                    action = canary.on_push_outcomes(&outcomes, now());
                    if matches!(canary.phase(), Phase::Promoted) {
                        *lock(&self.rollout().intended) = Some((label.clone(), spec));
                    }
                }
                Action::Rollback { routers } => {
                    let (outcomes, moved) =
                        self.roll_back(&routers, &label, &author, &applied_versions).await;
                    self.report_moved(moved);
                    action = canary.on_rollback_outcomes(&outcomes, now());
                }
                Action::Observe => {
                    tokio::select! {
                        _ = abort.cancelled(), if !aborted => continue,
                        _ = tokio::time::sleep(check_every) => {}
                    }
                    let Phase::Observing { since_ms } = canary.phase().clone() else { continue };
                    match self.measure(canary.plan(), since_ms, &mut traffic).await {
                        Ok((c, b, gaps)) => {
                            for gap in gaps {
                                self.note(&author, &format!("canary {label}: {gap}")).await;
                            }
                            action = canary.on_observation(&c, &b, now());
                            self.publish(&canary, Some((c, b)), None);
                            continue;
                        }
                        Err(error) => {
                            // An unmeasurable window is not a verdict; keep watching, and show why.
                            self.publish(&canary, None, Some(error));
                            action =
                                canary.on_observation(&SideWindow::default(), &SideWindow::default(), now());
                            continue;
                        }
                    }
                }
            }
            self.publish(&canary, None, None);
        }
    }

    /// Pushes `spec` to `routers`, each over HTTP conditioned on its `reviewed` version (else the version it
    /// runs now), or through its etcd key; returns the outcomes and the routers that moved meanwhile.
    async fn push_to(
        &self,
        routers: &[String],
        spec: &PolicySpec,
        label: &str,
        reviewed: &HashMap<String, u64>,
        step: &str,
    ) -> (Vec<(String, PushOutcome)>, Vec<MovedRouter>) {
        let clients = match self.clients_for(routers) {
            Ok(clients) => clients,
            Err(e) => return (all_unreachable(routers, &e), Vec::new()),
        };
        // Routers on the store take the step through their key (a canary group's own key), the rest over HTTP.
        let (by_key, clients) = self.split_by_key(clients).await;
        let (on_keys, _) = self.change_keys(&by_key, crate::etcd_policy::KeyChange::Push(spec)).await;
        let mut answered = Vec::new();
        for (url, outcome) in on_keys {
            self.record_outcome(label, &url, &outcome).await;
            answered.push((url, outcome));
        }
        let pushes = clients.iter().map(|client| async move {
            match reviewed.get(&client.url) {
                Some(&version) => {
                    let (outcome, current) = put_policy_reporting(client, spec, version).await;
                    (Some(version), outcome, current)
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
    async fn roll_back(
        &self,
        routers: &[String],
        label: &str,
        author: &str,
        applied: &HashMap<String, u64>,
    ) -> (Vec<(String, PushOutcome)>, Vec<MovedRouter>) {
        let clients = match self.clients_for(routers) {
            Ok(clients) => clients,
            Err(e) => return (all_unreachable(routers, &e), Vec::new()),
        };
        let (by_key, clients) = self.split_by_key(clients).await;
        let mut answered = Vec::new();
        let (on_keys, restored) = self.change_keys(&by_key, crate::etcd_policy::KeyChange::Rollback).await;
        if let Some(spec) = restored.filter(|_| on_keys.iter().any(|(_, o)| o.is_applied())) {
            let urls: Vec<String> = on_keys.iter().map(|(url, _)| url.clone()).collect();
            let hint = format!("rollback-of-{label}");
            if let Ok(rollback) = self.record_version(&spec, author, &urls, &hint).await {
                for (url, outcome) in on_keys.iter().filter(|(_, o)| o.is_applied()) {
                    self.record_outcome(&rollback, url, outcome).await;
                }
            }
        }
        answered.extend(on_keys);
        let outcomes = futures_util::future::join_all(
            clients.iter().map(|client| rollback_policy_if(client, applied.get(&client.url).copied())),
        )
        .await;
        let restored = futures_util::future::join_all(clients.iter().map(read_policy)).await;
        let mut rollback_label: Option<String> = None;
        let mut moved_routers = Vec::new();
        for ((client, (outcome, current)), active) in clients.iter().zip(outcomes).zip(restored) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ts: u64, input: u32, cached: Option<u32>, ttft_ms: Option<f64>) -> TraceRecord {
        serde_json::from_value(serde_json::json!({
            "timestamp": ts, "input_length": input, "output_length": 4, "hash_ids": [1],
            "cached_tokens": cached, "ttft_ms": ttft_ms,
        }))
        .unwrap()
    }

    #[test]
    fn a_side_counts_only_requests_since_the_canary_began() {
        let mut records: Vec<TraceRecord> =
            (1..=20).map(|i| record(1000 + i, 100, Some(50), Some(i as f64 * 10.0))).collect();
        records.push(record(10, 100, Some(0), Some(9999.0)));
        let records: Vec<Observed> = records.iter().map(Observed::from).collect();
        let side = side_window(&records, 1000);
        assert_eq!(side.requests, 20);
        assert_eq!(side.hit_rate, Some(0.5));
        // Nearest rank: the 19th of 20 sorted values.
        assert_eq!(side.ttft_p95_s, Some(0.19));
        let empty = side_window(&records, 5000);
        assert_eq!(empty, SideWindow { requests: 0, errors: 0, ttft_p95_s: None, hit_rate: None });
        let unknown = side_window(&[Observed::from(&record(2000, 100, None, None))], 0);
        assert_eq!((unknown.requests, unknown.hit_rate, unknown.ttft_p95_s), (1, None, None));
    }

    #[test]
    fn failed_answers_are_errors_and_never_good_first_tokens() {
        let answer = |status: u16, error: Option<&str>, ttft: Option<f64>| {
            let mut r = record(2000, 100, Some(50), ttft);
            r.status = Some(status);
            r.error = error.map(str::to_owned);
            Observed::from(&r)
        };
        let mut observed: Vec<Observed> = (0..18).map(|_| answer(200, None, Some(400.0))).collect();
        // Fast failures: a 500 passed on, the router's 502, a stream ended by the replica's error event,
        // a stream the replica broke off, and a 404 (the client's error: not a server error, no TTFT).
        observed.push(answer(500, None, Some(1.0)));
        observed.push(answer(502, Some("no_replica"), None));
        observed.push(answer(200, Some("stream_error"), Some(2.0)));
        observed.push(answer(502, Some("stream_broken"), Some(3.0)));
        observed.push(answer(404, None, Some(1.0)));
        let side = side_window(&observed, 0);
        assert_eq!((side.requests, side.errors), (23, 4));
        // Every fast failure left out: the p95 is the successful answers' 400 ms, not a millisecond.
        assert_eq!(side.ttft_p95_s, Some(0.4));
        // A record from a router too old to say its status counts as a success.
        let mut old = record(2000, 100, None, Some(10.0));
        old.status = None;
        assert!(Observed::from(&old).succeeded);
    }

    #[test]
    fn a_router_is_read_page_by_page_and_from_scratch_after_a_restart() {
        let page = |arrivals: &[u64], next: Option<u64>, epoch: Option<u64>| TracePage {
            records: arrivals.iter().map(|&ts| record(ts, 100, Some(10), Some(5.0))).collect(),
            next,
            epoch,
            missed: 0,
            more: 0,
        };
        let arrivals =
            |traffic: &RouterTraffic| traffic.observed.iter().map(|o| o.arrival_ms).collect::<Vec<_>>();
        let mut traffic = RouterTraffic::default();
        assert_eq!(traffic.cursor(), 0);
        traffic.absorb(page(&[10, 20], Some(2), Some(7)));
        // The next page holds only what was added since, including a request that arrived early.
        traffic.absorb(page(&[5, 30], Some(4), Some(7)));
        assert_eq!((arrivals(&traffic), traffic.cursor()), (vec![10, 20, 5, 30], 4));
        // The router restarted: a new epoch, and its answer is everything it holds.
        traffic.absorb(page(&[40], Some(1), Some(9)));
        assert_eq!((arrivals(&traffic), traffic.cursor()), (vec![40], 1));
        // A cursor that went back (a restart within one millisecond keeps the epoch) also starts over.
        traffic.absorb(page(&[50, 60], Some(3), Some(9)));
        traffic.absorb(page(&[70], Some(1), Some(9)));
        assert_eq!(arrivals(&traffic), [70]);
        // A router too old to page answers the whole window each time.
        let mut old = RouterTraffic::default();
        old.absorb(page(&[10, 20], None, None));
        old.absorb(page(&[10, 20, 30], None, None));
        assert_eq!((arrivals(&old), old.cursor()), (vec![10, 20, 30], 0));
    }

    #[test]
    fn router_answers_become_distinct_outcomes() {
        let applied = outcome_of(Ok((200, br#"{"version": 4, "spec": {"policy": "random"}}"#.to_vec())));
        assert_eq!(applied, PushOutcome::Applied { version: 4 });
        let stale = outcome_of(Ok((
            409,
            br#"{"code": "version_conflict", "message": "stale", "current_version": 5}"#.to_vec(),
        )));
        assert!(stale.is_stale());
        let PushOutcome::Refused { message, .. } = &stale else { panic!() };
        assert!(message.contains("version 5"), "{message}");
        let unauthorized = outcome_of(Ok((401, b"nope".to_vec())));
        assert!(
            matches!(unauthorized, PushOutcome::Refused { status: 401, ref code, .. } if code == "unauthorized")
        );
        assert!(matches!(outcome_of(Err("refused".into())), PushOutcome::Unreachable { .. }));
        assert!(matches!(outcome_of(Ok((200, b"{}".to_vec()))), PushOutcome::Unreachable { .. }));
    }

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
