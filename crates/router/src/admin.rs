//! The admin API the app pushes to: policy versions (compare-and-swap, rollback), replicas, state,
//! decisions and recorded traffic. Every route needs `Authorization: Bearer TOKEN`.
//!
//! The token is compared in constant time with a hand loop: it always walks every byte of the configured
//! token (XOR-accumulating, lengths folded in), so the time depends only on the configured token's length,
//! never on how much of a guess is right. The token is never logged. Without a configured token every admin
//! route answers 403 `admin_disabled`.
//!
//! `GET /admin/decisions?limit=N` lists the newest picks with their explanations; `?request_id=ID` finds
//! the one behind an answer's `x-fleet-request-id` header, including a request no replica could serve
//! (its `attempts` and `error`).
//!
//! `GET /admin/trace?since=T&after=N` answers the recorded requests (fleet-trace JSON lines) that arrived at
//! or after `T` (Unix ms) and were recorded after record number `N`. Its headers carry the cursor for the
//! next call (`x-fleet-trace-next`), the router's start (`x-fleet-trace-epoch`: numbers restart with it)
//! and, when the reader came back too late, how many records the ring dropped (`x-fleet-trace-missed`).
//! A page holds at most `limit` records ([`TRACE_PAGE_DEFAULT`], at most [`TRACE_PAGE_MAX`]) and at most
//! [`TRACE_PAGE_MAX_BYTES`]; a page cut at either says how many more match (`x-fleet-trace-more`) and its
//! `x-fleet-trace-next` is its last record, so a reader follows the cursor until `more` is 0.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use fleet_policy::{ReplicaId, SpecError};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::ReplicaSpec;
use crate::state::{AddReplicaError, PolicyChangeError, PolicyVersion, RouterState};

/// An admin error: `{"code", "message", ...extra}`.
fn error(status: StatusCode, code: &str, message: &str, extra: Value) -> Response {
    let mut body = json!({"code": code, "message": message});
    if let (Value::Object(body), Value::Object(extra)) = (&mut body, extra) {
        body.extend(extra);
    }
    (status, axum::Json(body)).into_response()
}

/// Compares a presented token with the configured one in time independent of the presented bytes.
pub fn token_matches(configured: &str, presented: &str) -> bool {
    let configured = configured.as_bytes();
    let presented = presented.as_bytes();
    let mut difference = u8::from(configured.len() != presented.len());
    for (i, expected) in configured.iter().enumerate() {
        let given = presented.get(i).copied().unwrap_or(0);
        difference |= std::hint::black_box(expected ^ given);
    }
    difference == 0
}

/// The credentials of an `Authorization: Bearer TOKEN` value. The scheme's name is case-insensitive
/// (RFC 7235: `bearer`, `BEARER` and `Bearer` are one scheme) and may be followed by several blanks;
/// `None` for any other scheme, or none.
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let value = authorization.trim();
    let (scheme, token) = value.split_once([' ', '\t'])?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|token| !token.is_empty())
}

async fn require_token(State(state): State<Arc<RouterState>>, request: Request, next: Next) -> Response {
    let Some(configured) = &state.config.admin_token else {
        return error(
            StatusCode::FORBIDDEN,
            "admin_disabled",
            "the admin API is off; start fleet-router with --admin-token-file FILE or FLEET_ROUTER_ADMIN_TOKEN",
            json!({}),
        );
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(bearer_token);
    match presented {
        Some(presented) if configured.matches(presented) => next.run(request).await,
        Some(_) => unauthorized("the bearer token is wrong; use the router's admin token"),
        None => unauthorized("missing `Authorization: Bearer TOKEN`; send the router's admin token"),
    }
}

fn unauthorized(message: &str) -> Response {
    let mut response = error(StatusCode::UNAUTHORIZED, "unauthorized", message, json!({}));
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The `/admin` routes, token-checked.
pub fn routes(state: Arc<RouterState>) -> Router {
    Router::new()
        .route("/admin/policy", get(get_policy).put(put_policy))
        .route("/admin/policy/rollback", post(rollback_policy))
        .route("/admin/replicas", get(list_replicas).post(add_replica))
        .route("/admin/replicas/{id}", delete(remove_replica))
        .route("/admin/state", get(get_state))
        .route("/admin/decisions", get(get_decisions))
        .route("/admin/trace", get(get_trace))
        // `route_layer`, not `layer`: the token guards these routes only. With `layer` it would also
        // guard the merged router's fallback, and a mistyped public path would answer 401/403.
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state)
}

fn policy_response(status: StatusCode, version: &PolicyVersion) -> Response {
    let mut response =
        (status, axum::Json(json!({"version": version.version, "spec": version.spec}))).into_response();
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{}\"", version.version)) {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
}

async fn get_policy(State(state): State<Arc<RouterState>>) -> Response {
    policy_response(StatusCode::OK, &state.policy.load())
}

/// The field a spec error is about.
fn spec_error_field(error: &SpecError) -> String {
    match error {
        SpecError::Parse { .. }
        | SpecError::TooLarge { .. }
        | SpecError::TooDeep { .. }
        | SpecError::YamlAlias { .. }
        | SpecError::TooSlow { .. } => "body".to_owned(),
        SpecError::MissingPolicy | SpecError::UnknownPolicy { .. } => "policy".to_owned(),
        SpecError::UnsupportedSchemaVersion { .. } => "schema_version".to_owned(),
        SpecError::UnknownField { field, .. }
        | SpecError::WrongType { field, .. }
        | SpecError::OutOfRange { field, .. } => field.clone(),
    }
}

fn invalid_spec(spec_error: &SpecError) -> Response {
    let reason = spec_error.to_string();
    error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_spec",
        &format!("the policy spec was rejected and the policy in force is unchanged: {reason}"),
        json!({"field": spec_error_field(spec_error), "reason": reason}),
    )
}

/// The refusal of an admin policy change on a router whose policy comes from etcd: the next change of the
/// key would silently undo it, so the change belongs in the store.
fn policy_from_store(state: &RouterState) -> Option<Response> {
    let store = state.etcd_policy.as_ref()?;
    Some(error(
        StatusCode::CONFLICT,
        "policy_from_store",
        &format!(
            "this router takes its policy from etcd key {}; change the policy there (the app pushes to the key), not through the admin API",
            store.key
        ),
        json!({"key": store.key}),
    ))
}

async fn put_policy(State(state): State<Arc<RouterState>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refusal) = policy_from_store(&state) {
        return refusal;
    }
    let Some(if_match) = headers.get(header::IF_MATCH).and_then(|value| value.to_str().ok()) else {
        return error(
            StatusCode::PRECONDITION_REQUIRED,
            "precondition_required",
            "PUT /admin/policy needs If-Match: \"VERSION\" with the version from GET /admin/policy",
            json!({"current_version": state.policy.load().version}),
        );
    };
    let expected = if_match.trim().trim_start_matches("W/").trim_matches('"').parse::<u64>();
    let Ok(expected) = expected else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_if_match",
            &format!(
                "If-Match {if_match:?} is not a policy version; send the ETag of GET /admin/policy, e.g. \"3\""
            ),
            json!({}),
        );
    };
    // Check the version first so a stale writer learns that before fixing its spec.
    let current = state.policy.load().version;
    if current != expected {
        return version_conflict(current);
    }
    let spec = match crate::state::parse_policy_bounded(body).await {
        Ok(spec) => spec,
        Err(spec_error) => return invalid_spec(&spec_error),
    };
    match state.put_policy(expected, spec).await {
        Ok(version) => policy_response(StatusCode::OK, &version),
        Err(PolicyChangeError::VersionConflict { current_version }) => version_conflict(current_version),
        Err(PolicyChangeError::Invalid(spec_error)) => invalid_spec(&spec_error),
        Err(other) => error(StatusCode::CONFLICT, "policy_change_refused", &other.to_string(), json!({})),
    }
}

fn version_conflict(current_version: u64) -> Response {
    error(
        StatusCode::CONFLICT,
        "version_conflict",
        &format!(
            "the policy changed: version {current_version} is in force; GET /admin/policy and retry with If-Match: \"{current_version}\""
        ),
        json!({"current_version": current_version}),
    )
}

/// `POST /admin/policy/rollback`, with an optional `If-Match: "VERSION"`: then only while that version is
/// in force (409 `version_conflict` otherwise), so undoing a change never undoes a later one.
async fn rollback_policy(State(state): State<Arc<RouterState>>, headers: HeaderMap) -> Response {
    if let Some(refusal) = policy_from_store(&state) {
        return refusal;
    }
    let expected = match headers.get(header::IF_MATCH).map(|value| value.to_str().map(str::trim)) {
        None => None,
        Some(Ok(text)) => match text.trim_start_matches("W/").trim_matches('"').parse::<u64>() {
            Ok(version) => Some(version),
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "bad_if_match",
                    &format!(
                        "If-Match {text:?} is not a policy version; send the version to undo, e.g. \"3\""
                    ),
                    json!({}),
                );
            }
        },
        Some(Err(_)) => {
            return error(StatusCode::BAD_REQUEST, "bad_if_match", "If-Match is not text", json!({}));
        }
    };
    match state.rollback_policy_if(expected).await {
        Ok(version) => policy_response(StatusCode::OK, &version),
        Err(PolicyChangeError::VersionConflict { current_version }) => version_conflict(current_version),
        Err(PolicyChangeError::NoPreviousVersion) => error(
            StatusCode::CONFLICT,
            "no_previous_version",
            "there is no previous policy version to roll back to",
            json!({"current_version": state.policy.load().version}),
        ),
        Err(other) => error(StatusCode::CONFLICT, "policy_change_refused", &other.to_string(), json!({})),
    }
}

fn replica_json(replica: &crate::state::Replica) -> Value {
    json!({"id": replica.id.0, "url": replica.spec.url, "model": replica.model, "healthy": replica.healthy()})
}

async fn list_replicas(State(state): State<Arc<RouterState>>) -> Response {
    let fleet = state.fleet.load();
    axum::Json(fleet.replicas.iter().map(|replica| replica_json(replica)).collect::<Vec<_>>()).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewReplica {
    url: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    kv_events: Option<String>,
    #[serde(default)]
    kv_replay: Option<String>,
}

async fn add_replica(State(state): State<Arc<RouterState>>, body: Bytes) -> Response {
    let new: NewReplica = match serde_json::from_slice(&body) {
        Ok(new) => new,
        Err(parse_error) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_replica",
                &format!(
                    "the body must be {{\"url\", \"model\"?, \"kv_events\"?, \"kv_replay\"?}}: {parse_error}"
                ),
                json!({"field": "body"}),
            );
        }
    };
    let mut text = new.url.clone();
    for (key, value) in [("model", &new.model), ("kv", &new.kv_events), ("kv_replay", &new.kv_replay)] {
        if let Some(value) = value {
            text.push_str(&format!(",{key}={value}"));
        }
    }
    let spec: ReplicaSpec = match text.parse() {
        Ok(spec) => spec,
        Err(config_error) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_replica",
                &config_error.message,
                json!({"field": "url"}),
            );
        }
    };
    match state.add_replica(spec).await {
        Ok(replica) => (StatusCode::CREATED, axum::Json(replica_json(&replica))).into_response(),
        Err(add_error @ AddReplicaError::Exists(_)) => {
            error(StatusCode::CONFLICT, "replica_exists", &add_error.to_string(), json!({}))
        }
        Err(add_error @ AddReplicaError::BadUrl(..)) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_replica",
            &add_error.to_string(),
            json!({"field": "url"}),
        ),
        Err(add_error) => {
            error(StatusCode::INTERNAL_SERVER_ERROR, "internal", &add_error.to_string(), json!({}))
        }
    }
}

async fn remove_replica(State(state): State<Arc<RouterState>>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<u32>() else {
        return error(
            StatusCode::NOT_FOUND,
            "unknown_replica",
            &format!("{id:?} is not a replica id; ids are the numbers GET /admin/replicas lists"),
            json!({}),
        );
    };
    match state.remove_replica(ReplicaId(id)).await {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "unknown_replica",
            &format!("no replica has id {id}; GET /admin/replicas lists them"),
            json!({}),
        ),
    }
}

async fn get_state(State(state): State<Arc<RouterState>>) -> Response {
    axum::Json(state.state_document()).into_response()
}

#[derive(Deserialize)]
struct DecisionsQuery {
    /// The newest this many (50 when absent).
    limit: Option<usize>,
    /// Only the decision for this request (the `x-fleet-request-id` of its answer).
    request_id: Option<u64>,
}

/// `GET /admin/decisions?limit=N` (newest first) or `?request_id=ID` (that request's, if the log still
/// holds it): a JSON list either way.
async fn get_decisions(
    State(state): State<Arc<RouterState>>,
    Query(query): Query<DecisionsQuery>,
) -> Response {
    let decisions = match query.request_id {
        Some(id) => state.decision_of(id).into_iter().collect(),
        None => state.recent_decisions(
            query.limit.unwrap_or(50).min(state.config.decisions_capacity),
            DECISIONS_PAGE_MAX_BYTES,
        ),
    };
    let decisions: Vec<&crate::state::DecisionRecord> = decisions.iter().map(AsRef::as_ref).collect();
    axum::Json(decisions).into_response()
}

/// Response header of `GET /admin/trace`: the number of the newest record, the `after` of the next call.
pub const TRACE_NEXT_HEADER: HeaderName = HeaderName::from_static("x-fleet-trace-next");
/// Response header of `GET /admin/trace`: when the router started (Unix ms); record numbers restart with it.
pub const TRACE_EPOCH_HEADER: HeaderName = HeaderName::from_static("x-fleet-trace-epoch");
/// Response header of `GET /admin/trace?after=N`: records after N the ring no longer holds.
pub const TRACE_MISSED_HEADER: HeaderName = HeaderName::from_static("x-fleet-trace-missed");
/// Response header of `GET /admin/trace`: matching records after this page (0: the page reached the newest).
pub const TRACE_MORE_HEADER: HeaderName = HeaderName::from_static("x-fleet-trace-more");
/// Records per `/admin/trace` page when the reader names no `limit` (about 2 MB of JSON lines).
pub const TRACE_PAGE_DEFAULT: usize = 10_000;
/// Most records per `/admin/trace` page.
pub const TRACE_PAGE_MAX: usize = 50_000;
/// Most bytes of one `/admin/trace` page (by [`crate::recording::weight`], an upper bound of the JSON):
/// a page of heavy records stops early and says how many more there are, so a reader pages through any
/// ring with bounded answers. One record always comes (at most 1.4 MB: its hashes are bounded too).
pub const TRACE_PAGE_MAX_BYTES: usize = 4 << 20;
/// Most bytes of one `/admin/decisions` answer (by [`crate::state::DecisionRecord::weight`]): fewer
/// decisions than asked come when they are heavy (a large fleet's candidates), the newest first.
pub const DECISIONS_PAGE_MAX_BYTES: usize = 4 << 20;

#[derive(Deserialize)]
struct TraceQuery {
    /// Arrivals at or after this time (Unix ms).
    since: Option<u64>,
    /// Only records added after this one (the previous answer's `x-fleet-trace-next`).
    after: Option<u64>,
    /// Records per page (default [`TRACE_PAGE_DEFAULT`], at most [`TRACE_PAGE_MAX`]).
    limit: Option<usize>,
}

async fn get_trace(State(state): State<Arc<RouterState>>, Query(query): Query<TraceQuery>) -> Response {
    let limit = query.limit.unwrap_or(TRACE_PAGE_DEFAULT).clamp(1, TRACE_PAGE_MAX);
    let page =
        state.recorder.page(query.since.unwrap_or(0), query.after.unwrap_or(0), limit, TRACE_PAGE_MAX_BYTES);
    let mut body = Vec::with_capacity(page.records.len() * 200);
    for record in &page.records {
        if fleet_trace::write_record(&mut body, record).is_err() {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "cannot serialise a trace record",
                json!({}),
            );
        }
    }
    let mut response = Response::new(Body::from(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    headers.insert(TRACE_NEXT_HEADER, HeaderValue::from(page.next));
    headers.insert(TRACE_EPOCH_HEADER, HeaderValue::from(state.recorder.epoch));
    if page.missed > 0 {
        headers.insert(TRACE_MISSED_HEADER, HeaderValue::from(page.missed));
    }
    headers.insert(TRACE_MORE_HEADER, HeaderValue::from(page.more));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        for value in ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret ", " bEaReR\ts3cret"] {
            assert_eq!(bearer_token(value), Some("s3cret"), "{value:?}");
        }
        for value in ["Basic s3cret", "Bearer", "Bearer ", "Bearers3cret", "s3cret", ""] {
            assert_eq!(bearer_token(value), None, "{value:?}");
        }
    }

    #[test]
    fn tokens_match_only_exactly() {
        assert!(token_matches("s3cret", "s3cret"));
        assert!(!token_matches("s3cret", "s3cre"));
        assert!(!token_matches("s3cret", "s3cret!"));
        assert!(!token_matches("s3cret", "S3cret"));
        assert!(!token_matches("s3cret", ""));
    }
}
