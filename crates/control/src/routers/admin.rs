//! The fleet-router admin API as the app reads and drives it: wire shapes (lenient serde mirrors of the
//! router's JSON), their translation into the UI's types, and one bounded HTTP client for all of it:
//! state, decisions, recorded traffic, and the policy (read, conditioned put, rollback).
//!
//! Parsing is pure and tested here on JSON text; [`AdminClient`] only does the I/O, with a
//! deadline and a body size cap on every call, and a bearer token that is never logged.

use std::collections::HashMap;
use std::time::Duration;

use fleet_policy::PolicySpec;
use fleet_rollout::PushOutcome;
use fleet_store::secrets::Secret;
use fleetdeck_api::{CachedTokens, Candidate, DecisionEntry, PdDecision};
use serde::Deserialize;
use serde_json::Value;

use fleet_base::http::{BodyError, read_limited};
pub(crate) use fleet_telemetry::connect_detail;
/// serde's errors describe a fetched body without repeating it (whatever answers at an operator-typed URL
/// must not come back through the app).
pub(crate) use fleet_trace::json_error_shape;

/// Deadline of one admin call (connect, headers and body).
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(4);
/// Largest `/admin/state` or `/admin/decisions` body accepted.
pub const MAX_ADMIN_BODY: usize = 8 << 20;
/// Largest `/admin/trace` body accepted.
pub const MAX_TRACE_BODY: usize = 64 << 20;

/// Why an admin call failed, worded for the operator.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdminError {
    #[error("cannot reach the router at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("the router at {url} did not answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("the router at {url} rejected the admin token (401); set the right token in Settings")]
    Unauthorized { url: String },
    #[error("the router at {url} has no admin API enabled; start fleet-router with --admin-token-file FILE")]
    AdminDisabled { url: String },
    #[error("the router at {url} needs an admin token; add it in Settings")]
    NoToken { url: String },
    #[error("the router at {url} answered HTTP {status}: {message}")]
    Status { url: String, status: u16, message: String },
    #[error("the router at {url} sent more than {limit} bytes for {path}; ask for a shorter window")]
    TooLarge { url: String, path: String, limit: usize },
    #[error("the router at {url} sent {path} in a shape this app does not understand: {detail}")]
    BadBody { url: String, path: String, detail: String },
}

/// `GET /admin/state`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RouterState {
    pub policy: PolicyInfo,
    pub replicas: Vec<RouterReplica>,
    pub prefix_groups: Vec<PrefixGroup>,
    pub window_s: u64,
    /// How often the router's policies read the replicas' engine figures, in ms (`Some(0)`: never;
    /// `None`: a router before it said, which read none).
    pub engine_metrics_ms: Option<u64>,
    /// The load it shares with the fleet's other routers through etcd (`--peer-load-prefix`; absent when it
    /// shares none, or from routers before it).
    pub peer_load: Option<PeerLoadState>,
    /// Where the router takes its policy from, when that is etcd (`--policy-etcd`; `policy_store` on the
    /// wire).
    #[serde(rename = "policy_store")]
    pub etcd: Option<EtcdWatch>,
    /// The index's predicted cached tokens against the engines' counts (absent from routers before it).
    pub index_accuracy: Option<IndexAccuracyCounts>,
    /// P/D decisions and leg times, cumulative (absent from routers before issue 36).
    pub pd: Option<PdCounters>,
}

/// `pd` in `/admin/state`: cumulative since the router started.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct PdCounters {
    /// Decisions per reason (`split`, `short_prompt`, ...).
    pub decisions: std::collections::BTreeMap<String, u64>,
    pub fallbacks: u64,
    pub prefill_leg: LegHistogram,
    pub decode_first_byte: LegHistogram,
}

/// A leg's time histogram as the router keeps it: cumulative `[upper bound s, count]` buckets.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct LegHistogram {
    pub buckets: Vec<(f64, u64)>,
    pub sum_s: f64,
    pub count: u64,
}

/// `index_accuracy` in `/admin/state`: requests predicted, and of those within one block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct IndexAccuracyCounts {
    pub predictions: u64,
    pub within_block: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct PolicyInfo {
    pub name: String,
    pub version: u64,
    /// The etcd `mod_revision` of the value in force (routers on etcd only; `store_revision` on the wire).
    #[serde(rename = "store_revision")]
    pub etcd_revision: Option<i64>,
    /// When the policy was put in force (Unix microseconds).
    pub applied_at_us: Option<u64>,
}

/// A router's etcd watch: the key it watches and how the watch fares.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct EtcdWatch {
    pub key: String,
    pub connected: bool,
    pub seen_revision: i64,
    pub rejected_total: u64,
    pub last_rejected: Option<RejectedValue>,
    pub error: Option<String>,
}

/// The last value a router refused.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RejectedValue {
    pub revision: i64,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RouterReplica {
    #[serde(deserialize_with = "id_text")]
    pub id: String,
    pub url: String,
    pub model: Option<String>,
    /// `prefill`, `decode` or `both` (empty from routers before P/D, which serve whole requests).
    pub role: String,
    pub healthy: bool,
    pub outstanding: u64,
    pub prefill_tokens: u64,
    pub routed_total: u64,
    pub errors_total: u64,
    pub indexed_blocks: u64,
    /// The load the router's policy counts (routers from issue 35 on; `None` before).
    pub load: Option<ReplicaLoad>,
    /// The replica's engine figures as the router scraped them (`None`: scrapes off, or an older router).
    pub engine: Option<EngineFigures>,
}

/// `load` of a replica in `/admin/state`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ReplicaLoad {
    pub own: u64,
    pub seen: u64,
    pub source: String,
    /// What the other routers published of their requests there (`--peer-load-prefix`; `None`: no fresh
    /// summary, or a router without shared load).
    pub peers: Option<PublishedLoad>,
}

/// `peer_load` of `/admin/state`: this router's part in the load its fleet's routers share through etcd.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct PeerLoadState {
    /// How often it publishes its load when it changed, in ms (what the what-if replays).
    pub interval_ms: u64,
}

/// `load.peers` of a replica in `/admin/state`: the other routers' published in-flight load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct PublishedLoad {
    pub requests: u64,
    pub prefill_blocks: u64,
    pub decode_blocks: u64,
}

/// `engine` of a replica in `/admin/state`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct EngineFigures {
    pub waiting: Option<f64>,
    pub running: Option<f64>,
    pub kv_usage: Option<f64>,
    pub age_ms: Option<u64>,
    pub stale: bool,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct PrefixGroup {
    pub group: String,
    pub requests: u64,
    pub share: f64,
    pub replicas: Vec<GroupReplica>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct GroupReplica {
    #[serde(deserialize_with = "id_text")]
    pub id: String,
    pub requests: u64,
    pub cached_blocks: u64,
    pub hit_share: f64,
}

impl RouterState {
    /// Replica URL by the router's replica id.
    pub fn urls_by_id(&self) -> HashMap<String, String> {
        self.replicas.iter().map(|r| (r.id.clone(), r.url.clone())).collect()
    }
}

/// Ids may be numbers or strings depending on the router version; the app keeps them as text.
fn id_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => s,
        Value::Null => String::new(),
        other => other.to_string(),
    })
}

/// One `GET /admin/decisions` entry.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
struct WireDecisionEntry {
    ts_ms: i64,
    #[serde(deserialize_with = "id_text")]
    request_id: String,
    model: Option<String>,
    #[serde(deserialize_with = "id_text")]
    replica: String,
    policy: String,
    policy_version: Option<u64>,
    decision: WireDecision,
    attempts: Vec<String>,
    error: Option<String>,
    cached_tokens: Option<WireCachedTokens>,
    pd: Option<WirePd>,
}

/// The `pd` record of a P/D fleet's decision (fleet-router's `PdRecord`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
struct WirePd {
    branch: String,
    reason: String,
    explanation: String,
    cached_at_decode: u32,
    uncached_tokens: u32,
    prefill_replica: Option<String>,
    prefill_ms: Option<f64>,
    fallback: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(default)]
struct WireCachedTokens {
    predicted: u32,
    engine: Option<u32>,
    within_block: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
struct WireDecision {
    #[serde(deserialize_with = "id_text")]
    replica: String,
    policy: String,
    branch: String,
    reason: String,
    prompt_blocks: Option<u32>,
    candidates: Vec<WireCandidate>,
    notes: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
struct WireCandidate {
    #[serde(deserialize_with = "id_text")]
    replica: String,
    healthy: bool,
    eligible: bool,
    outstanding: u64,
    prefill_tokens: u64,
    load: Option<f64>,
    matched_blocks: Option<u32>,
    score: Option<f64>,
    cost: Option<f64>,
    chosen: bool,
    note: Option<String>,
}

/// Parses `/admin/state`.
pub fn parse_state(body: &[u8]) -> Result<RouterState, String> {
    serde_json::from_slice(body).map_err(|e| json_error_shape(&e))
}

/// Parses `/admin/decisions` into the UI's entries, naming replicas by URL where the router's
/// state (`urls`, id -> URL) knows them.
pub fn parse_decisions(
    router: &str,
    body: &[u8],
    urls: &HashMap<String, String>,
) -> Result<Vec<DecisionEntry>, String> {
    let wire: Vec<WireDecisionEntry> = serde_json::from_slice(body).map_err(|e| json_error_shape(&e))?;
    let name = |id: &str| urls.get(id).cloned().unwrap_or_else(|| id.to_owned());
    Ok(wire
        .into_iter()
        .map(|w| {
            let replica = if w.replica.is_empty() { name(&w.decision.replica) } else { name(&w.replica) };
            DecisionEntry {
                router: router.to_owned(),
                ts_ms: w.ts_ms,
                request_id: w.request_id,
                model: w.model,
                replica,
                policy: if w.policy.is_empty() { w.decision.policy } else { w.policy },
                policy_version: w.policy_version,
                branch: w.decision.branch,
                reason: w.decision.reason,
                prompt_blocks: w.decision.prompt_blocks,
                candidates: w
                    .decision
                    .candidates
                    .into_iter()
                    .map(|c| Candidate {
                        replica: name(&c.replica),
                        healthy: c.healthy,
                        eligible: c.eligible,
                        outstanding: c.outstanding,
                        prefill_tokens: c.prefill_tokens,
                        load: c.load,
                        matched_blocks: c.matched_blocks,
                        score: c.score,
                        cost: c.cost,
                        chosen: c.chosen,
                        note: c.note,
                    })
                    .collect(),
                notes: w.decision.notes,
                attempts: w.attempts,
                error: w.error,
                cached_tokens: w.cached_tokens.map(|c| CachedTokens {
                    predicted: c.predicted,
                    engine: c.engine,
                    within_block: c.within_block,
                }),
                pd: w.pd.map(|pd| PdDecision {
                    branch: pd.branch,
                    reason: pd.reason,
                    explanation: pd.explanation,
                    cached_at_decode: pd.cached_at_decode,
                    uncached_tokens: pd.uncached_tokens,
                    prefill_replica: pd.prefill_replica,
                    prefill_ms: pd.prefill_ms,
                    fallback: pd.fallback,
                }),
            }
        })
        .collect())
}

/// Parses `/admin/trace` (JSON Lines). A bad line fails the whole read with its line number,
/// since a silently shortened trace would skew every figure computed from it.
/// Records a router added after a cursor (`GET /admin/trace?after=N`).
#[derive(Debug, Default)]
pub struct TracePage {
    /// The records, in the order the router added them.
    pub records: Vec<fleet_trace::TraceRecord>,
    /// The number of the router's newest record (`x-fleet-trace-next`); `None` from a router too old to
    /// page, whose answer is then every record since the time asked for.
    pub next: Option<u64>,
    /// When the router started (`x-fleet-trace-epoch`, Unix ms): a new epoch means its numbering restarted.
    pub epoch: Option<u64>,
    /// Records added after the cursor that the router's ring dropped before this read
    /// (`x-fleet-trace-missed`): what was read is then a sample.
    pub missed: u64,
    /// Matching records the router holds after this page (`x-fleet-trace-more`): the page stopped at its
    /// limit, ask again from `next`. 0 from a router too old to say.
    pub more: u64,
}

/// Records per page the app asks a router for.
pub const TRACE_PAGE_RECORDS: usize = 10_000;
/// Most records the app reads from one router for one window (about 100 MB in memory at most).
pub const MAX_WINDOW_RECORDS: usize = 500_000;

/// A window of one router's recorded traffic, read page by page.
#[derive(Debug, Default)]
pub struct TraceWindow {
    pub records: Vec<fleet_trace::TraceRecord>,
    /// Pages read.
    pub pages: u32,
    /// Matching records left unread because the read stopped at [`MAX_WINDOW_RECORDS`].
    pub unread: u64,
}

pub fn parse_trace(body: &[u8]) -> Result<Vec<fleet_trace::TraceRecord>, String> {
    let text = std::str::from_utf8(body).map_err(|_| "the trace is not UTF-8 text".to_owned())?;
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        records.push(fleet_trace::parse_line(line, i + 1).map_err(|e| e.to_string())?);
    }
    Ok(records)
}

/// Largest policy answer accepted: a spec is a few hundred bytes.
pub const MAX_POLICY_BODY: usize = 1 << 20;

/// A router's active policy (`GET /admin/policy`).
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
    let wire: WirePolicy = serde_json::from_slice(body).map_err(|e| json_error_shape(&e))?;
    let spec: PolicySpec =
        serde_json::from_value(wire.spec).map_err(|e| format!("spec: {}", json_error_shape(&e)))?;
    Ok(ActivePolicy { version: wire.version, spec })
}

/// A router's answer to a policy change: the outcome, and on a 409 `version_conflict` the version it runs
/// instead.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyChange {
    pub outcome: PushOutcome,
    pub current_version: Option<u64>,
}

/// The router's error body `{code, message}` as a refusal; never the raw body, which could be anything at
/// that URL.
fn refusal(status: u16, body: &[u8]) -> PushOutcome {
    let error: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let code = error["code"].as_str().map(str::to_owned).unwrap_or_else(|| match status {
        401 => "unauthorized".to_owned(),
        409 => "version_conflict".to_owned(),
        _ => format!("http_{status}"),
    });
    let mut message = error["message"].as_str().map_or_else(
        || format!("the answer (HTTP {status}) is not fleet-router's JSON error"),
        str::to_owned,
    );
    if let Some(current) = error["current_version"].as_u64() {
        message.push_str(&format!(" (the router is at version {current})"));
    }
    PushOutcome::Refused { status, code, message }
}

/// An answer to a policy change (status and body, or why there was none) as a push outcome.
pub fn change_of(answer: Result<(u16, Vec<u8>), String>) -> PolicyChange {
    let current_version = match &answer {
        Ok((409, body)) => {
            serde_json::from_slice::<Value>(body).ok().and_then(|e| e["current_version"].as_u64())
        }
        _ => None,
    };
    let outcome = match answer {
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
    };
    PolicyChange { outcome, current_version }
}

/// One router's admin API.
/// The token is a [`Secret`]: it never reaches a log line or a debug dump.
#[derive(Clone, Debug)]
pub struct AdminClient {
    http: reqwest::Client,
    /// Base URL without a trailing slash.
    pub url: String,
    token: Option<Secret>,
}

impl AdminClient {
    pub fn new(http: reqwest::Client, url: &str, token: Option<Secret>) -> Self {
        Self { http, url: url.trim_end_matches('/').to_owned(), token }
    }

    pub async fn state(&self) -> Result<RouterState, AdminError> {
        let body = self.get("/admin/state", MAX_ADMIN_BODY).await?;
        parse_state(&body).map_err(|detail| self.bad_body("/admin/state", detail))
    }

    /// The newest `limit` decisions. An answer over [`MAX_ADMIN_BODY`] (heavy decisions, or a router that
    /// does not bound its answers) is asked again for half as many, down to one: fewer decisions rather than
    /// none.
    pub async fn decisions(
        &self,
        limit: u32,
        urls: &HashMap<String, String>,
    ) -> Result<Vec<DecisionEntry>, AdminError> {
        let mut limit = limit.max(1);
        loop {
            let path = format!("/admin/decisions?limit={limit}");
            match self.get(&path, MAX_ADMIN_BODY).await {
                Ok(body) => {
                    return parse_decisions(&self.url, &body, urls)
                        .map_err(|detail| self.bad_body(&path, detail));
                }
                Err(AdminError::TooLarge { .. }) if limit > 1 => limit /= 2,
                Err(error) => return Err(error),
            }
        }
    }

    /// The records the router added after record number `after` (0: all it holds) that arrived at or after
    /// `since_ms`, with the cursor to ask with next time.
    pub async fn trace_after(&self, since_ms: i64, after: u64) -> Result<TracePage, AdminError> {
        self.trace_page(since_ms, after, TRACE_PAGE_RECORDS).await
    }

    /// One page of at most `limit` records after record number `after`. A page over [`MAX_TRACE_BODY`]
    /// (heavy records, or a router that does not bound its pages by bytes) is asked again for half as many
    /// records, down to one: the reader pages on instead of failing the router.
    pub async fn trace_page(&self, since_ms: i64, after: u64, limit: usize) -> Result<TracePage, AdminError> {
        let mut limit = limit.max(1);
        let (path, headers, body) = loop {
            let path = format!("/admin/trace?since={since_ms}&after={after}&limit={limit}");
            match self.get_with_headers(&path, MAX_TRACE_BODY).await {
                Ok((headers, body)) => break (path, headers, body),
                Err(AdminError::TooLarge { .. }) if limit > 1 => limit /= 2,
                Err(error) => return Err(error),
            }
        };
        let number = |name: &str| headers.get(name).and_then(|value| value.to_str().ok()?.parse().ok());
        let records = parse_trace(&body).map_err(|detail| self.bad_body(&path, detail))?;
        Ok(TracePage {
            records,
            next: number("x-fleet-trace-next"),
            epoch: number("x-fleet-trace-epoch"),
            missed: number("x-fleet-trace-missed").unwrap_or(0),
            more: number("x-fleet-trace-more").unwrap_or(0),
        })
    }

    /// Every record the router holds that arrived at or after `since_ms`, following its pages to the end or
    /// until `max_records` were read (then `unread` says how many were left).
    pub async fn trace_window(&self, since_ms: i64, max_records: usize) -> Result<TraceWindow, AdminError> {
        self.trace_window_paged(since_ms, max_records, TRACE_PAGE_RECORDS).await
    }

    /// [`Self::trace_window`] in pages of at most `page_records` records.
    pub async fn trace_window_paged(
        &self,
        since_ms: i64,
        max_records: usize,
        page_records: usize,
    ) -> Result<TraceWindow, AdminError> {
        let mut window = TraceWindow::default();
        let mut after = 0;
        loop {
            let room = max_records.saturating_sub(window.records.len());
            let page = self.trace_page(since_ms, after, room.clamp(1, page_records.max(1))).await?;
            window.pages += 1;
            window.records.extend(page.records);
            let Some(next) = page.next.filter(|n| page.more > 0 && *n > after) else {
                // The end, or a router too old to page (it answered everything at once).
                return Ok(window);
            };
            if window.records.len() >= max_records {
                window.unread = page.more;
                return Ok(window);
            }
            after = next;
        }
    }

    /// Every record the router holds that arrived at or after `since_ms` (at most [`MAX_WINDOW_RECORDS`]).
    pub async fn trace_since(&self, since_ms: i64) -> Result<Vec<fleet_trace::TraceRecord>, AdminError> {
        Ok(self.trace_window(since_ms, MAX_WINDOW_RECORDS).await?.records)
    }

    /// `GET /admin/policy`: the policy the router runs.
    pub async fn policy(&self) -> Result<ActivePolicy, String> {
        match self.policy_call(reqwest::Method::GET, "/admin/policy", None, None).await? {
            (200..=299, body) => {
                parse_policy(&body).map_err(|d| format!("cannot read the router's policy: {d}"))
            }
            (status, body) => Err(match refusal(status, &body) {
                PushOutcome::Refused { code, message, .. } => format!("HTTP {status} {code}: {message}"),
                other => format!("{other:?}"),
            }),
        }
    }

    /// `PUT /admin/policy` with `If-Match: "if_version"`. The spec must be valid: callers validate first,
    /// so an invalid spec never reaches a router.
    pub async fn put_policy(&self, spec: &PolicySpec, if_version: u64) -> PolicyChange {
        let body = serde_json::to_string(spec).unwrap_or_default();
        change_of(self.policy_call(reqwest::Method::PUT, "/admin/policy", Some(body), Some(if_version)).await)
    }

    /// `POST /admin/policy/rollback`, with `If-Match` when `if_version` is given: undoing the canary's
    /// version must not undo what someone put in force after it.
    pub async fn rollback_policy(&self, if_version: Option<u64>) -> PolicyChange {
        change_of(self.policy_call(reqwest::Method::POST, "/admin/policy/rollback", None, if_version).await)
    }

    /// One policy call (bounded in time and size by [`Self::call`]): status and body, or why there was none.
    async fn policy_call(
        &self,
        method: reqwest::Method,
        path: &str,
        json: Option<String>,
        if_match: Option<u64>,
    ) -> Result<(u16, Vec<u8>), String> {
        let request = AdminRequest { json, if_match };
        let answer = self.call(method, path, request, MAX_POLICY_BODY).await.map_err(|e| e.to_string())?;
        Ok((answer.status, answer.body))
    }

    fn bad_body(&self, path: &str, detail: String) -> AdminError {
        AdminError::BadBody { url: self.url.clone(), path: path.to_owned(), detail }
    }

    /// One bounded GET: the whole exchange within [`ADMIN_TIMEOUT`], the body within `limit`.
    async fn get(&self, path: &str, limit: usize) -> Result<Vec<u8>, AdminError> {
        self.get_with_headers(path, limit).await.map(|(_, body)| body)
    }

    /// [`Self::get`], with the response's headers; any answer but a 2xx is an error.
    async fn get_with_headers(
        &self,
        path: &str,
        limit: usize,
    ) -> Result<(reqwest::header::HeaderMap, Vec<u8>), AdminError> {
        let AdminAnswer { status, headers, body } =
            self.call(reqwest::Method::GET, path, AdminRequest::default(), limit).await?;
        match status {
            200..=299 => Ok((headers, body)),
            401 => Err(AdminError::Unauthorized { url: self.url.clone() }),
            _ => {
                let error: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                if error["code"] == "admin_disabled" {
                    return Err(AdminError::AdminDisabled { url: self.url.clone() });
                }
                // The router's own JSON message, made short; never the raw body (whatever answers at an
                // operator-typed URL must not be echoed back through the app).
                let message = error["message"].as_str().map_or_else(
                    || "the answer is not fleet-router's JSON error".to_owned(),
                    fleet_telemetry::scrape::short_reason,
                );
                Err(AdminError::Status { url: self.url.clone(), status, message })
            }
        }
    }

    /// One bounded admin call, whatever its answer: the bearer token sent, the whole exchange within
    /// [`ADMIN_TIMEOUT`], the body within `limit`. The status is the caller's to judge (a policy push
    /// reads a 409 or a 422 as an answer, not a failure).
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        request: AdminRequest,
        limit: usize,
    ) -> Result<AdminAnswer, AdminError> {
        let Some(token) = &self.token else {
            return Err(AdminError::NoToken { url: self.url.clone() });
        };
        let work = async {
            let mut call =
                self.http.request(method, format!("{}{path}", self.url)).bearer_auth(token.expose());
            if let Some(version) = request.if_match {
                call = call.header(reqwest::header::IF_MATCH, format!("\"{version}\""));
            }
            if let Some(json) = request.json {
                call = call.header(reqwest::header::CONTENT_TYPE, "application/json").body(json);
            }
            let response = call
                .send()
                .await
                .map_err(|e| AdminError::Unreachable { url: self.url.clone(), detail: connect_detail(&e) })?;
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let body = read_limited(response, limit).await.map_err(|error| match error {
                BodyError::TooLarge => {
                    AdminError::TooLarge { url: self.url.clone(), path: path.to_owned(), limit }
                }
                BodyError::Broken(detail) => AdminError::Unreachable { url: self.url.clone(), detail },
            })?;
            Ok(AdminAnswer { status, headers, body })
        };
        tokio::time::timeout(ADMIN_TIMEOUT, work)
            .await
            .unwrap_or_else(|_| Err(AdminError::Timeout { url: self.url.clone(), timeout: ADMIN_TIMEOUT }))
    }
}

/// What an admin call sends besides its method and path.
#[derive(Debug, Default)]
pub(crate) struct AdminRequest {
    /// A JSON body.
    pub json: Option<String>,
    /// The policy version the change applies to (`If-Match`).
    pub if_match: Option<u64>,
}

/// A router's answer to an admin call.
#[derive(Debug)]
pub(crate) struct AdminAnswer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATE: &str = r#"{
        "policy": {"name": "cache_aware_approx", "version": 3},
        "replicas": [
            {"id": 0, "url": "http://a:1", "model": "m", "healthy": true, "outstanding": 2,
             "prefill_tokens": 10, "routed_total": 50, "errors_total": 0, "indexed_blocks": 7},
            {"id": "1", "url": "http://b:2", "healthy": false}
        ],
        "prefix_groups": [
            {"group": "ab12", "requests": 40, "share": 0.8,
             "replicas": [{"id": 0, "requests": 38, "cached_blocks": 12, "hit_share": 0.9}]}
        ],
        "window_s": 60,
        "index_accuracy": {"predictions": 40, "within_block": 39},
        "something_new": true
    }"#;

    #[test]
    fn state_parses_with_numeric_or_text_ids_and_ignores_new_fields() {
        let state = parse_state(STATE.as_bytes()).unwrap();
        assert_eq!(
            state.policy,
            PolicyInfo { name: "cache_aware_approx".into(), version: 3, ..Default::default() }
        );
        assert_eq!(state.replicas[0].id, "0");
        assert_eq!(state.replicas[1].id, "1");
        assert!(!state.replicas[1].healthy);
        assert_eq!(state.prefix_groups[0].replicas[0].id, "0");
        assert_eq!(state.urls_by_id()["1"], "http://b:2");
        assert_eq!(state.index_accuracy, Some(IndexAccuracyCounts { predictions: 40, within_block: 39 }));
        let older = parse_state(br#"{"policy": {"name": "round_robin", "version": 1}}"#).unwrap();
        assert_eq!(older.index_accuracy, None, "a router before index accuracy reports none");
        assert!(parse_state(b"[1,2]").is_err());
    }

    #[test]
    fn decisions_name_replicas_by_url_and_keep_every_candidate() {
        let body = r#"[{"ts_ms": 5, "request_id": "r1", "model": "m", "replica": 1, "policy": "cache_aware_approx",
            "policy_version": 3, "decision": {"replica": 1, "policy": "cache_aware_approx", "branch": "cache",
            "reason": "longest match 4/5 blocks", "prompt_blocks": 5, "notes": [],
            "candidates": [
              {"replica": 0, "healthy": true, "eligible": true, "outstanding": 3, "prefill_tokens": 0,
               "load": 3.0, "matched_blocks": 0, "score": null, "cost": null, "chosen": false, "note": null},
              {"replica": 1, "healthy": true, "eligible": true, "outstanding": 1, "prefill_tokens": 64,
               "load": 1.0, "matched_blocks": 4, "score": 0.8, "cost": null, "chosen": true, "note": null}]}}]"#;
        let urls = parse_state(STATE.as_bytes()).unwrap().urls_by_id();
        let decisions = parse_decisions("http://router", body.as_bytes(), &urls).unwrap();
        assert_eq!(decisions.len(), 1);
        let d = &decisions[0];
        assert_eq!(
            (d.replica.as_str(), d.branch.as_str(), d.router.as_str()),
            ("http://b:2", "cache", "http://router")
        );
        assert_eq!(d.candidates.len(), 2);
        assert_eq!(d.candidates[1].matched_blocks, Some(4));
        assert!(d.candidates[1].chosen && !d.candidates[0].chosen);
        assert_eq!(d.candidates[0].replica, "http://a:1");
        assert!(d.attempts.is_empty() && d.error.is_none(), "served at the first try");
        assert_eq!(d.cached_tokens, None, "no prediction made");
        let predicted = body.replacen(
            r#""policy_version": 3,"#,
            r#""policy_version": 3, "cached_tokens": {"predicted": 128, "engine": 96, "within_block": true},"#,
            1,
        );
        let decisions = parse_decisions("http://router", predicted.as_bytes(), &urls).unwrap();
        assert_eq!(
            decisions[0].cached_tokens,
            Some(CachedTokens { predicted: 128, engine: Some(96), within_block: Some(true) })
        );

        let failed = r#"[{"ts_ms": 6, "request_id": 9, "replica": "http://b:2", "policy": "round_robin",
            "decision": {"replica": 0, "branch": "round_robin", "reason": "next", "candidates": []},
            "attempts": ["http://a:1", "http://b:2"], "error": "no replica could serve the request"}]"#;
        let decisions = parse_decisions("http://router", failed.as_bytes(), &urls).unwrap();
        assert_eq!(decisions[0].attempts, ["http://a:1", "http://b:2"]);
        assert_eq!(decisions[0].error.as_deref(), Some("no replica could serve the request"));
        assert_eq!(decisions[0].pd, None, "no P/D record outside P/D mode");

        // A split request of a P/D fleet, as fleet-router logs it (the prefill pick's own decision too).
        let split = r#"[{"ts_ms": 7, "request_id": 10, "replica": "http://b:2", "policy": "cache_aware_approx",
            "decision": {"replica": 1, "branch": "cache", "reason": "r", "candidates": []},
            "pd": {"branch": "split", "reason": "split", "explanation": "1024 tokens, 1024 uncached >= 512",
                   "cached_at_decode": 0, "uncached_tokens": 1024, "prefill_replica": "http://p:1",
                   "prefill": {"replica": 0, "branch": "cache", "reason": "r", "candidates": []},
                   "prefill_ms": 12.5}}]"#;
        let decisions = parse_decisions("http://router", split.as_bytes(), &urls).unwrap();
        let pd = decisions[0].pd.as_ref().expect("the P/D record");
        assert_eq!((pd.branch.as_str(), pd.reason.as_str(), pd.uncached_tokens), ("split", "split", 1024));
        assert_eq!(
            (pd.prefill_replica.as_deref(), pd.prefill_ms, pd.fallback.as_deref()),
            (Some("http://p:1"), Some(12.5), None)
        );
    }

    #[test]
    fn a_bad_trace_line_is_named() {
        let good = r#"{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": [1]}"#;
        assert_eq!(parse_trace(format!("{good}\n\n{good}\n").as_bytes()).unwrap().len(), 2);
        let err = parse_trace(format!("{good}\nnot json\n").as_bytes()).unwrap_err();
        assert!(err.contains('2'), "{err}");
    }

    #[test]
    fn debug_output_never_shows_the_token() {
        let client = AdminClient::new(reqwest::Client::new(), "http://x", Some("s3cret-token".into()));
        let shown = format!("{client:?}");
        assert!(!shown.contains("s3cret-token") && shown.contains("redacted"), "{shown}");
    }

    #[tokio::test]
    async fn without_a_token_no_request_is_made() {
        let client = AdminClient::new(reqwest::Client::new(), "http://127.0.0.1:9/", None);
        assert_eq!(client.url, "http://127.0.0.1:9");
        let err = client.state().await.unwrap_err();
        assert!(matches!(err, AdminError::NoToken { .. }));
        assert!(err.to_string().contains("Settings"));
    }

    #[test]
    fn router_answers_become_distinct_outcomes() {
        let applied = change_of(Ok((200, br#"{"version": 4, "spec": {"policy": "random"}}"#.to_vec())));
        assert_eq!(
            applied,
            PolicyChange { outcome: PushOutcome::Applied { version: 4 }, current_version: None }
        );
        let stale = change_of(Ok((
            409,
            br#"{"code": "version_conflict", "message": "stale", "current_version": 5}"#.to_vec(),
        )));
        assert!(stale.outcome.is_stale());
        assert_eq!(stale.current_version, Some(5));
        let PushOutcome::Refused { message, .. } = &stale.outcome else { panic!() };
        assert!(message.contains("version 5"), "{message}");
        let unauthorized = change_of(Ok((401, b"nope".to_vec()))).outcome;
        assert!(
            matches!(unauthorized, PushOutcome::Refused { status: 401, ref code, .. } if code == "unauthorized")
        );
        assert!(matches!(change_of(Err("refused".into())).outcome, PushOutcome::Unreachable { .. }));
        assert!(matches!(change_of(Ok((200, b"{}".to_vec()))).outcome, PushOutcome::Unreachable { .. }));
    }
}
