//! The data plane: OpenAI routes in, the policy's pick, the answer streamed back unbuffered.
//!
//! A request is keyed ([`crate::routing_key`]), its model picks a group, and the group's engine routes it
//! (one short lock). The pick is tried first; a connect failure, a 5xx, or an error before the first body
//! byte moves on to another healthy replica of the group (least outstanding first), up to
//! `max_attempts`. Nothing is sent to the client until the chosen replica produced its first body chunk, so
//! a request that had not started streaming is never lost to a failing replica. After that, chunks are
//! relayed as they arrive; a replica dying mid-stream ends an SSE stream with an error event (`data:
//! {"error": ...}`), never a hang (every read has the configured read timeout). When the response ends
//! (or the client goes away) a guard completes the request in the engine, counts it and records it.
//!
//! P/D mode (the group has `role=prefill` replicas, see [`crate::pd`]): the pick above is the decode pick;
//! the spec's `pd` thresholds decide whether to split. A split request's prefill leg goes to the prefill
//! engine's pick, whole and bounded, before the decode attempts; its `kv_transfer_params` ride on the
//! client's own request to the decode replica. A failed prefill leg, or a decode replica that answers a
//! split leg with a 5xx or an error event first (a failed KV transfer), falls back to the client's own
//! request at that decode replica: a local prefill.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleet_policy::{Branch, CandidateExplanation, Decision, Engine, PickError, ReplicaId, RequestView};
use fleet_trace::TraceRecord;
use futures_util::Stream;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::json;

use crate::metrics::{Refusal, branch_label};
use crate::pd::PdPlan;
use crate::routing_key::{Route, routing_input, session_hash};
use crate::state::{CachePrediction, DecisionRecord, FleetView, Group, Replica, RouterState, lock, unix_ms};
use crate::upstream::TimedBody;

// Header names are built at compile time: inserting by `&str` would parse and allocate per request.
/// Response header naming the replica that served a request (for operators and tests).
pub const REPLICA_HEADER: HeaderName = HeaderName::from_static("x-fleet-replica");
/// Response header naming the policy branch that decided.
pub const BRANCH_HEADER: HeaderName = HeaderName::from_static("x-fleet-branch");
/// Response header with the policy version that decided.
pub const POLICY_VERSION_HEADER: HeaderName = HeaderName::from_static("x-fleet-policy-version");
/// Response header with the router's id of the request: `GET /admin/decisions?request_id=N` shows its pick.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-fleet-request-id");
/// Response header with the P/D decision's reason (`split`, `short_prompt`, ..., `transfer_failed`), in P/D mode.
pub const PD_HEADER: HeaderName = HeaderName::from_static("x-fleet-pd");
/// Response header naming the prefill replica of a split request.
pub const PREFILL_REPLICA_HEADER: HeaderName = HeaderName::from_static("x-fleet-prefill-replica");
/// Request header carrying a session key (wins over the body's `user`).
pub const SESSION_HEADER: HeaderName = HeaderName::from_static("x-session-id");

/// An OpenAI-shaped error response.
pub fn openai_error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

/// `GET /v1/models`: the models of every group.
pub async fn list_models(state: &RouterState) -> Response {
    let fleet = state.fleet.load();
    let data: Vec<serde_json::Value> = fleet
        .models()
        .into_iter()
        .map(|model| json!({"id": model, "object": "model", "created": 0, "owned_by": "fleet-router"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// An attempt that got an answer other than a 5xx, and its first body chunk (or an empty body): the
/// request commits to it (a 4xx is passed on as it is, without retry).
struct Committed {
    status: StatusCode,
    content_type: Option<HeaderValue>,
    /// The first chunk is the whole body (its length is the announced Content-Length).
    complete: bool,
    first: Option<Bytes>,
    rest: TimedBody,
}

/// Proxies one OpenAI request: reads its body (up to the configured limit, within the body read
/// timeout), then [`forward`]s it. Every answer, the router's own refusals included, carries
/// `x-fleet-request-id`.
///
/// The request is taken whole rather than through axum's `HeaderMap` and `Bytes` extractors: those
/// copy the headers, and a body over the limit deserves an OpenAI-shaped error naming the limit.
pub async fn handle<B>(state: Arc<RouterState>, route: Route, request: axum::http::Request<B>) -> Response
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let request_id = state.next_request_id();
    let (parts, body) = request.into_parts();
    let limit = state.config.max_body_bytes;
    let deadline = state.config.body_read_timeout;
    // Each arm's answer carries the request id: `forward` stamps its own, the rest are `refusal`s.
    match tokio::time::timeout(deadline, read_whole(body, limit)).await {
        Ok(Ok(body)) => forward(state, route, parts.headers, body, request_id).await,
        Ok(Err(error)) if error.is::<LengthLimitError>() => {
            state.metrics.count_refusal(Refusal::BodyTooLarge);
            let message = format!(
                "the request body is larger than {limit} bytes, the router's limit (--max-body-bytes)"
            );
            refusal(request_id, StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", &message)
        }
        Ok(Err(error)) => {
            let message = format!("cannot read the request body: {error}");
            refusal(request_id, StatusCode::BAD_REQUEST, "invalid_request_error", &message)
        }
        Err(_) => {
            // A client trickling its body would hold the connection and this task for ever.
            state.metrics.count_refusal(Refusal::BodyReadTimeout);
            let message = format!(
                "the request body did not arrive within {deadline:?} (--body-read-timeout-s); send it whole"
            );
            let mut response =
                refusal(request_id, StatusCode::REQUEST_TIMEOUT, "invalid_request_error", &message);
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

/// A request body whole, refused past `limit` bytes ([`LengthLimitError`]). A body that arrives as one
/// frame, as a JSON request sent with its head does, is taken as it is; only a body of several frames is
/// copied into one buffer. `collect()` queued every frame in a `VecDeque` first and copied them out again:
/// the router ran 49.8k instructions a request with it and 49.2-49.3k without (callgrind, `cargo xtask
/// bench router`'s fast workload, release build, engine-metrics scraper off).
async fn read_whole<B>(body: B, limit: usize) -> Result<Bytes, Box<dyn std::error::Error + Send + Sync>>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut body = std::pin::pin!(Limited::new(body, limit));
    let mut whole = Bytes::new();
    let mut joined: Option<bytes::BytesMut> = None;
    while let Some(frame) = body.frame().await {
        // Trailers are dropped, as `collect().to_bytes()` dropped them.
        let Ok(data) = frame?.into_data() else { continue };
        if data.is_empty() {
            continue;
        }
        match &mut joined {
            Some(joined) => joined.extend_from_slice(&data),
            None if whole.is_empty() => whole = data,
            None => {
                let mut buffer = bytes::BytesMut::with_capacity(whole.len() + data.len());
                buffer.extend_from_slice(&whole);
                buffer.extend_from_slice(&data);
                joined = Some(buffer);
            }
        }
    }
    Ok(joined.map_or(whole, bytes::BytesMut::freeze))
}

/// The router's own error answer to request `request_id`, stamped with its id as every answer is.
fn refusal(request_id: u64, status: StatusCode, kind: &str, message: &str) -> Response {
    let mut response = openai_error(status, kind, message);
    response.headers_mut().insert(REQUEST_ID_HEADER, HeaderValue::from(request_id));
    response
}

/// Proxies one OpenAI request; every answer it gives, its refusals included, carries `x-fleet-request-id`.
pub async fn forward(
    state: Arc<RouterState>,
    route: Route,
    headers: HeaderMap,
    body: Bytes,
    request_id: u64,
) -> Response {
    let policy = state.policy.load();
    let session = headers.get(&SESSION_HEADER).and_then(|value| value.to_str().ok());
    let input = match routing_input(route, &body, session, policy.hashing, state.tokenizer.as_deref()) {
        Ok(input) => input,
        Err(error) => {
            return refusal(request_id, StatusCode::BAD_REQUEST, "invalid_request_error", &error.to_string());
        }
    };
    drop(policy);
    let fleet = state.fleet.load_full();
    let group = match fleet.group_for(input.model.as_deref()) {
        Ok(group) => group.clone(),
        Err(error @ crate::state::GroupError::UnknownModel { .. }) => {
            return refusal(request_id, StatusCode::NOT_FOUND, "model_not_found", &error.to_string());
        }
        Err(error @ crate::state::GroupError::ModelRequired { .. }) => {
            return refusal(request_id, StatusCode::BAD_REQUEST, "invalid_request_error", &error.to_string());
        }
        Err(error) => {
            return refusal(request_id, StatusCode::SERVICE_UNAVAILABLE, "router_error", &error.to_string());
        }
    };
    // The model as the logs keep it: the group's own name, or (for replicas of unknown model) the client's
    // name cut to a bounded length.
    let mut model = input.model.as_deref().map(crate::recording::kept_name);
    let arrival_ms = unix_ms();
    let started = Instant::now();

    let picked = {
        let mut engine = lock(&group.engine);
        let now = state.now_ms();
        let engine = &mut *engine;
        let version = engine.version;
        match engine.engine.route(request_id, &input.view, now, &mut engine.rng) {
            Err(PickError::NoHealthyReplica { .. }) => {
                panic_route(&mut engine.engine, request_id, &input.view, now)
            }
            other => other,
        }
        .map(|decision| (decision, version))
    };
    let pick_latency = started.elapsed();
    let (decision, policy_version) = match picked {
        Ok(picked) => picked,
        Err(PickError::NoReplicas) if crate::pd::in_pd_mode(&fleet, &group) => {
            let message = format!(
                "model {:?} has only prefill replicas (role=prefill); add a replica with role=decode or role=both \
                 to serve its requests",
                group.model
            );
            return refusal(request_id, StatusCode::SERVICE_UNAVAILABLE, "router_error", &message);
        }
        Err(error @ (PickError::NoHealthyReplica { .. } | PickError::NoReplicas)) => {
            return refusal(request_id, StatusCode::SERVICE_UNAVAILABLE, "router_error", &error.to_string());
        }
        Err(error) => {
            return refusal(
                request_id,
                StatusCode::INTERNAL_SERVER_ERROR,
                "router_error",
                &error.to_string(),
            );
        }
    };
    let matched = decision.chosen().and_then(|chosen| chosen.matched_blocks).unwrap_or(0);
    state.metrics.count_pick(pick_latency, decision.branch, decision.prompt_blocks, matched);

    let mut ticket = Ticket {
        state: state.clone(),
        group: group.clone(),
        request_id,
        replica: None,
        view: input.view,
        in_engine: true,
        prediction: None,
    };
    // P/D mode: decide, and for a split send the prefill leg now. Boxed: inline, the rare P/D future made
    // this function's state 1.2 KB larger, copied whole every time the request's future moves.
    let mut pd: Option<PdPlan> = if crate::pd::in_pd_mode(&fleet, &group) {
        let block_tokens = input.block_tokens;
        Some(
            Box::pin(crate::pd::prepare(
                &state,
                &fleet,
                &group,
                route,
                &headers,
                &body,
                &ticket.view,
                block_tokens,
                &decision,
                request_id,
            ))
            .await,
        )
    } else {
        None
    };
    let mut tried: Vec<ReplicaId> = Vec::new();
    let mut current = decision.replica;
    let mut last_error = String::new();
    let mut attempts = state.config.max_attempts;
    let mut attempt = 0;
    while attempt < attempts {
        let Some(replica) = fleet.replica(current).cloned() else {
            last_error = format!("replica {current} left the fleet");
            break;
        };
        tried.push(current);
        ticket.replica = Some(replica.clone());
        replica.routed_total.fetch_add(1, Ordering::Relaxed);
        let split_leg = pd.as_ref().and_then(|plan| plan.decode_body.clone());
        let is_split = split_leg.is_some();
        let leg = split_leg.unwrap_or_else(|| body.clone());
        let sent = attempt_once(&replica, route, &headers, leg, is_split);
        let prefill_failed = pd.as_mut().and_then(|plan| plan.prefill_failed.take());
        let outcome = match prefill_failed {
            // SGLang's flow: a prefill leg that fails first ends the decode attempt, which would only wait
            // for KV that never comes.
            Some(failed) => tokio::select! {
                outcome = sent => outcome,
                Ok(why) = failed => Err(AttemptError::prefill_failed(why)),
            },
            None => sent.await,
        };
        match outcome {
            Ok(upstream) => {
                if is_split {
                    state.metrics.pd_decode_first_byte.observe(started.elapsed());
                }
                if upstream.status.is_success() {
                    state.observe_health(&replica, true);
                }
                ticket.first_token();
                let first_byte = started.elapsed();
                replica.first_byte.observe(first_byte);
                let first_byte_ms = first_byte.as_secs_f64() * 1e3;
                let attempts_urls = if tried.len() > 1 { urls_of(&fleet, &tried) } else { Vec::new() };
                // Committed: no more retries, so the ticket's view of the request moves into the trace.
                let view = std::mem::take(&mut ticket.view);
                let first_block = view.block_hashes.first().copied();
                let trace = trace_record(
                    view,
                    &model,
                    input.block_tokens,
                    arrival_ms,
                    &replica,
                    &decision,
                    policy_version,
                    Some(first_byte_ms),
                );
                let branch = decision.branch;
                // The index's prediction of the engine's cached tokens, when the pick served it.
                // Not for a split: the decode replica reports the transferred tokens as cached.
                if input.token_exact && tried.len() == 1 && !is_split {
                    ticket.prediction =
                        decision.chosen().and_then(|chosen| chosen.matched_blocks).map(|blocks| {
                            Arc::new(CachePrediction::new(
                                blocks.saturating_mul(input.block_tokens),
                                input.block_tokens,
                            ))
                        });
                }
                state.remember_decision(
                    DecisionRecord {
                        ts_ms: arrival_ms,
                        request_id,
                        // Returned right after: the name moves into the log.
                        model: model.take(),
                        replica: replica.spec.url.clone(),
                        policy: decision.policy.clone(),
                        policy_version,
                        decision,
                        attempts: attempts_urls,
                        error: None,
                        cached_tokens: ticket.prediction.clone(),
                        pd: pd.as_ref().map(|plan| plan.record.clone()),
                    },
                    first_block,
                    replica.id,
                );
                let mut response = relay(ticket, replica, upstream, trace, branch, policy_version, started);
                if let Some(plan) = &pd {
                    plan.annotate(response.headers_mut());
                }
                return response;
            }
            Err(error) => {
                last_error = error.message;
                replica.errors_total.fetch_add(1, Ordering::Relaxed);
                replica.requests.count(502);
                if is_split
                    && error.answered
                    && let Some(plan) = &mut pd
                {
                    // The decode replica is up but could not load the transferred KV (or its prefill leg
                    // failed): the same replica prefills the prompt itself, and that attempt is not one of
                    // the retries.
                    let why = if error.prefill_failed {
                        format!("the prefill leg failed: {last_error}")
                    } else {
                        format!("the decode leg failed: {last_error}")
                    };
                    plan.fall_back(&state, why);
                    tracing::warn!(replica = %replica.spec.url, error = %last_error, "P/D decode leg failed; prefilling locally");
                    attempts += 1;
                    attempt += 1;
                    continue;
                }
                state.observe_health(&replica, false);
                tracing::warn!(replica = %replica.spec.url, error = %last_error, "attempt failed before the first byte");
            }
        }
        if attempt + 1 == attempts {
            break;
        }
        let Some(next) = next_replica(&fleet, &decision, &tried) else { break };
        if !ticket.move_to(next) {
            break;
        }
        state.metrics.retries.fetch_add(1, Ordering::Relaxed);
        current = next;
        attempt += 1;
    }
    let message = format!(
        "no replica could serve the request after {} attempt(s); last error: {last_error}",
        tried.len()
    );
    // The failure is in the decision log too, so the id in the answer leads an operator to the pick and
    // every replica tried. Not in the prefix heat: nothing was served.
    let tried_urls = urls_of(&fleet, &tried);
    let replica = tried_urls.last().cloned().unwrap_or_default();
    // And in the recorded traffic, as a 502 with no first token: a canary judges its error rate from it.
    if let Some(last) = fleet.replica(current) {
        let mut failed = trace_record(
            std::mem::take(&mut ticket.view),
            &model,
            input.block_tokens,
            arrival_ms,
            last,
            &decision,
            policy_version,
            None,
        );
        failed.status = Some(502);
        failed.error = Some("no_replica".to_owned());
        state.recorder.record(failed);
    }
    state.remember_decision(
        DecisionRecord {
            ts_ms: arrival_ms,
            request_id,
            model,
            replica,
            policy: decision.policy.clone(),
            policy_version,
            decision,
            attempts: tried_urls,
            error: Some(message.clone()),
            cached_tokens: None,
            pd: pd.as_ref().map(|plan| plan.record.clone()),
        },
        None,
        current,
    );
    refusal(request_id, StatusCode::BAD_GATEWAY, "upstream_error", &message)
}

/// Every replica of the group is marked unhealthy: rather than fail everything (health checks can be wrong,
/// for example when probes time out under overload), try the least loaded one anyway, as Envoy's panic
/// threshold does. A dead replica costs a fast connect failure; a live one serves.
fn panic_route(
    engine: &mut Engine,
    request_id: u64,
    view: &RequestView,
    now: u64,
) -> Result<Decision, PickError> {
    let statuses: Vec<_> = engine.replicas().into_iter().filter_map(|id| engine.replica_status(id)).collect();
    let chosen =
        statuses.iter().min_by_key(|status| status.outstanding).ok_or(PickError::NoReplicas)?.replica;
    engine.on_routed(request_id, chosen, view, now).map_err(|_| PickError::DuplicateRequest(request_id))?;
    let candidates = statuses
        .iter()
        .map(|status| CandidateExplanation {
            replica: status.replica,
            healthy: status.healthy,
            eligible: true,
            outstanding: status.outstanding,
            prefill_tokens: status.prefill_tokens,
            seen_load: None,
            load: Some(status.outstanding as f64),
            matched_blocks: None,
            score: None,
            cost: None,
            chosen: status.replica == chosen,
            note: Some("panic routing: every replica is marked unhealthy".to_owned()),
        })
        .collect();
    Ok(Decision {
        replica: chosen,
        policy: engine.policy().name().to_owned(),
        branch: Branch::Fallback,
        reason: "every replica is marked unhealthy, so the least loaded one is tried anyway (panic routing)"
            .to_owned(),
        prompt_blocks: u32::try_from(view.block_hashes.len()).unwrap_or(u32::MAX),
        candidates,
        notes: vec!["health checks failed for every replica".to_owned()],
    })
}

/// The URLs of the replicas `tried`, in order (those still in the fleet), for the decision log.
fn urls_of(fleet: &FleetView, tried: &[ReplicaId]) -> Vec<String> {
    tried.iter().filter_map(|id| fleet.replica(*id).map(|replica| replica.spec.url.clone())).collect()
}

/// The next replica to try: healthy, not tried yet, least outstanding first (engine order breaks ties).
/// When the pick saw no healthy candidate (panic routing), any untried replica will do.
fn next_replica(fleet: &FleetView, decision: &Decision, tried: &[ReplicaId]) -> Option<ReplicaId> {
    let panic = decision.candidates.iter().all(|candidate| !candidate.healthy);
    decision
        .candidates
        .iter()
        .filter(|candidate| !tried.contains(&candidate.replica))
        .filter(|candidate| {
            fleet.replica(candidate.replica).is_some_and(|replica| panic || replica.healthy())
        })
        .min_by_key(|candidate| candidate.outstanding)
        .map(|candidate| candidate.replica)
}

/// Why an attempt failed before its first byte.
struct AttemptError {
    message: String,
    /// The replica answered (a 5xx, or an error event first): it is up, the request failed there.
    answered: bool,
    /// The attempt was abandoned because its P/D prefill leg (SGLang's flow) failed.
    prefill_failed: bool,
}

impl AttemptError {
    fn prefill_failed(why: String) -> Self {
        Self { message: why, answered: true, prefill_failed: true }
    }
}

/// One attempt at one replica: `Ok` once it produced its first body chunk. A P/D decode leg (`split_leg`)
/// whose first chunk is an error event failed too (the KV transfer, before any token).
async fn attempt_once(
    replica: &Replica,
    route: Route,
    headers: &HeaderMap,
    body: Bytes,
    split_leg: bool,
) -> Result<Committed, AttemptError> {
    let unreachable = |message: String| AttemptError { message, answered: false, prefill_failed: false };
    let upstream = replica
        .connections
        .post(route, headers, body)
        .await
        .map_err(|error| unreachable(format!("{} unreachable: {error}", replica.spec.url)))?;
    let status = upstream.status();
    if status.is_server_error() {
        return Err(AttemptError {
            message: format!("{} answered {status}", replica.spec.url),
            answered: true,
            prefill_failed: false,
        });
    }
    let content_type = upstream.headers().get(header::CONTENT_TYPE).cloned();
    let mut rest = upstream.into_body();
    let length = rest.exact_len();
    let first = match rest.next_chunk().await {
        Some(Ok(chunk)) => Some(chunk),
        Some(Err(error)) => {
            return Err(unreachable(format!("{} failed before its first byte: {error}", replica.spec.url)));
        }
        None => None,
    };
    if split_leg
        && let Some(chunk) = &first
        && is_error_event(chunk)
    {
        return Err(AttemptError {
            message: format!("{} sent an error event before any token", replica.spec.url),
            answered: true,
            prefill_failed: false,
        });
    }
    let complete = length.is_some_and(|n| first.as_ref().map_or(0, |b| b.len() as u64) == n);
    Ok(Committed { status, content_type, complete, first, rest })
}

#[allow(clippy::too_many_arguments)] // the fields of one record, each from a different place
fn trace_record(
    view: RequestView,
    model: &Option<String>,
    block_tokens: u32,
    arrival_ms: u64,
    replica: &Replica,
    decision: &Decision,
    policy_version: u64,
    first_byte_ms: Option<f64>,
) -> TraceRecord {
    TraceRecord {
        timestamp: arrival_ms,
        input_length: view.prompt_tokens,
        output_length: 0,
        session: view.session_key.as_deref().map(session_hash),
        hash_ids: view.block_hashes,
        block_tokens: Some(block_tokens),
        chained: true,
        model: model.clone(),
        replica: Some(replica.spec.url.clone()),
        router: None,
        branch: Some(branch_label(decision.branch).to_owned()),
        policy: Some(decision.policy.clone()),
        policy_version: Some(policy_version),
        cached_tokens: None,
        engine_prompt_tokens: None,
        // Set when a chunk carrying a token passes (`Finish`).
        ttft_ms: None,
        first_byte_ms,
        status: None,
        error: None,
    }
}

/// A request's place in its group's engine; completes it there exactly once, on drop at the latest.
struct Ticket {
    state: Arc<RouterState>,
    group: Arc<Group>,
    request_id: u64,
    replica: Option<Arc<Replica>>,
    view: RequestView,
    in_engine: bool,
    /// The index's prediction of the engine's cached tokens, checked when the answer reports them.
    prediction: Option<Arc<CachePrediction>>,
}

impl Ticket {
    fn first_token(&self) {
        let now = self.state.now_ms();
        let _ = lock(&self.group.engine).engine.on_first_token(self.request_id, now);
    }

    /// Moves the request's load to another replica for a retry.
    fn move_to(&mut self, replica: ReplicaId) -> bool {
        let now = self.state.now_ms();
        let mut engine = lock(&self.group.engine);
        if self.in_engine {
            let _ = engine.engine.on_completed(self.request_id, now);
        }
        self.in_engine = engine.engine.on_routed(self.request_id, replica, &self.view, now).is_ok();
        self.in_engine
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.in_engine {
            let now = self.state.now_ms();
            let _ = lock(&self.group.engine).engine.on_completed(self.request_id, now);
        }
    }
}

/// Reads token counts out of response bytes as they pass (usage fields, else SSE data events), and notices
/// the first generated content and error events.
///
/// A chunk is whatever one read of the replica's socket held, so a key or its number can be cut in two: a
/// router that fell behind a stream reads several events at once, up to its buffer, and the cut lands
/// anywhere. The stream's last bytes are kept ([`CARRY`]) and a match cut by a boundary is read when the
/// chunk that ends it arrives. (Read alone, each chunk lost such a match: most likely why a real-vLLM test
/// of `cargo xtask test` once counted fewer predictions than requests on a busy machine.)
#[derive(Debug)]
struct UsageSniffer {
    completion_tokens: Option<u32>,
    prompt_tokens: Option<u32>,
    cached_tokens: Option<u32>,
    token_chunks: u32,
    /// An SSE error event passed (`data: {"error": ...}` or `"object":"error"`, as vLLM and SGLang send when
    /// a generation fails after the stream began).
    error_event: bool,
    /// The stream's last `tail_len` bytes, for the matches the next chunk's boundary cuts.
    tail: [u8; CARRY],
    tail_len: usize,
}

impl Default for UsageSniffer {
    fn default() -> Self {
        Self {
            completion_tokens: None,
            prompt_tokens: None,
            cached_tokens: None,
            token_chunks: 0,
            error_event: false,
            tail: [0; CARRY],
            tail_len: 0,
        }
    }
}

/// Bytes of the stream's end kept for the next chunk: more than the longest match with its context (a
/// key, blanks, a ten-digit number and the byte that ends it: about 35; `data: {"error"`: 14).
const CARRY: usize = 64;

/// What the sniffer reads after a chunk's `"` (each key it looks for starts with one): the byte after the
/// quote of every key, so most quotes (other keys, string values) cost one compare.
const KEY_FIRST_BYTES: &[u8] = b"cprtfeo";

/// What one chunk said: the first value of each usage key (`Some(None)`: the key with no number, as
/// `null`), its open SSE chunks, whether it carried generated content or an error event.
#[derive(Default)]
struct ChunkReading {
    completion: Option<Option<u32>>,
    prompt: Option<Option<u32>>,
    cached: Option<Option<u32>>,
    open: u32,
    generated: bool,
    error_event: bool,
}

impl ChunkReading {
    /// Reads the matches of `buf` that `counts(start, end)` admits, where `start..end` are a match's bytes
    /// with what it needs around it: the `data: {` before an error key, the value's first byte after an
    /// output key, the byte after a number (which shows the number ended). A match whose bytes `buf` does
    /// not hold whole is left for a later read.
    fn read(&mut self, buf: &[u8], counts: impl Fn(usize, usize) -> bool) {
        for at in memchr::memchr_iter(b'"', buf) {
            let key = &buf[at + 1..];
            if !key.first().is_some_and(|b| KEY_FIRST_BYTES.contains(b)) {
                continue;
            }
            let number_keys: [(&[u8], &mut Option<Option<u32>>); 3] = [
                (b"completion_tokens\":", &mut self.completion),
                (b"prompt_tokens\":", &mut self.prompt),
                (b"cached_tokens\":", &mut self.cached),
            ];
            if let Some((name, slot)) = number_keys.into_iter().find(|(name, _)| key.starts_with(name)) {
                if let Some((value, used)) = number_and_end(&key[name.len()..])
                    && counts(at, at + 1 + name.len() + used)
                {
                    slot.get_or_insert(value);
                }
                continue;
            }
            const OPEN: &[u8] = b"finish_reason\":null";
            const ERROR_OBJECT: &[u8] = b"object\":\"error\"";
            const ERROR_KEY: &[u8] = b"error\"";
            if key.starts_with(OPEN) {
                // Each streamed token chunk is still open; the closing chunk is not.
                if counts(at, at + 1 + OPEN.len()) {
                    self.open = self.open.saturating_add(1);
                }
            } else if key.starts_with(ERROR_OBJECT) {
                // An SSE error event, as vLLM and SGLang send when a generation fails after the stream began.
                self.error_event |= counts(at, at + 1 + ERROR_OBJECT.len());
            } else if key.starts_with(ERROR_KEY) {
                let before = &buf[..at];
                let opener = [&b"data: {"[..], b"data:{"].into_iter().find(|opener| before.ends_with(opener));
                if let Some(opener) = opener {
                    self.error_event |= counts(at - opener.len(), at + 1 + ERROR_KEY.len());
                }
            } else if let Some(name) = [&b"content\":\""[..], b"text\":\"", b"reasoning_content\":\""]
                .into_iter()
                .find(|name| key.starts_with(name))
                && let Some(&value_first) = key.get(name.len())
            {
                // A key followed by a non-empty string: `"content":""` is a role-only or closing chunk.
                self.generated |= value_first != b'"' && counts(at, at + 1 + name.len() + 1);
            }
        }
    }
}

/// The number at the start of `text` (blanks allowed before it) and how many bytes it took with the byte
/// after it; `Some((None, _))` when something else stands there (`null`); `None` when `text` ends first
/// (the number may go on in the next chunk).
fn number_and_end(text: &[u8]) -> Option<(Option<u32>, usize)> {
    let blanks = text.len() - text.trim_ascii_start().len();
    let digits = text[blanks..].iter().position(|b| !b.is_ascii_digit())?;
    let value =
        std::str::from_utf8(&text[blanks..blanks + digits]).ok().and_then(|number| number.parse().ok());
    Some((value, blanks + digits + 1))
}

impl UsageSniffer {
    /// Reads one chunk; true when it carries generated content (a token).
    ///
    /// One pass over the chunk's quotes, not a search per key: for the short answers of the fast path
    /// (a refusal, a one-token completion) ten searches cost 1,160 instructions per request (callgrind),
    /// more than the answer's bytes. The first match of each usage key counts, as vLLM and SGLang write
    /// each key once per chunk; a test holds this to one search per key. Matches cut by the chunk's start
    /// are read first, from the kept tail joined to the chunk's head.
    fn scan(&mut self, chunk: &[u8]) -> bool {
        let mut reading = ChunkReading::default();
        // A stream cut after an SSE event's blank line cuts no match (each lies inside one event's data),
        // the usual case: reading the joined bytes anyway cost a streamed one-token answer about 2.5k
        // instructions (callgrind).
        let cut_between_events = self.tail[..self.tail_len].ends_with(b"\n\n");
        if self.tail_len > 0 && !cut_between_events {
            // The tail and the chunk's head; a match counts here only if it starts before the boundary and
            // ends after it (the ones on either side were or will be read whole).
            let boundary = self.tail_len;
            let head = chunk.len().min(CARRY);
            let mut joined = [0u8; 2 * CARRY];
            joined[..boundary].copy_from_slice(&self.tail[..boundary]);
            joined[boundary..boundary + head].copy_from_slice(&chunk[..head]);
            reading.read(&joined[..boundary + head], |start, end| start < boundary && end > boundary);
        }
        reading.read(chunk, |_, _| true);
        self.keep_tail(chunk);
        if let Some(Some(value)) = reading.completion {
            self.completion_tokens = Some(value);
        }
        if let Some(Some(value)) = reading.prompt {
            self.prompt_tokens = Some(value);
        }
        if let Some(Some(value)) = reading.cached {
            self.cached_tokens = Some(value);
        }
        self.token_chunks = self.token_chunks.saturating_add(reading.open);
        self.error_event |= reading.error_event;
        reading.generated
    }

    /// Keeps the stream's last [`CARRY`] bytes: the tail so far, then `chunk`.
    fn keep_tail(&mut self, chunk: &[u8]) {
        if chunk.len() >= CARRY {
            self.tail.copy_from_slice(&chunk[chunk.len() - CARRY..]);
            self.tail_len = CARRY;
            return;
        }
        let kept = self.tail_len.min(CARRY - chunk.len());
        self.tail.copy_within(self.tail_len - kept..self.tail_len, 0);
        self.tail[kept..kept + chunk.len()].copy_from_slice(chunk);
        self.tail_len = kept + chunk.len();
    }

    fn output_tokens(&self) -> u32 {
        // Without a usage block, each open SSE chunk carries one token.
        self.completion_tokens.unwrap_or(self.token_chunks)
    }
}

/// Whether `chunk` carries an SSE error event (what [`UsageSniffer`] flags).
fn is_error_event(chunk: &[u8]) -> bool {
    // One chunk alone: no stream before it, so no tail to keep or join.
    let mut reading = ChunkReading::default();
    reading.read(chunk, |_, _| true);
    reading.error_event
}

/// The client-facing body: the first chunk, then the replica's stream; finishes the request on drop.
struct RelayBody {
    first: Option<Bytes>,
    rest: TimedBody,
    is_sse: bool,
    done: bool,
    finish: Option<Finish>,
}

/// What happens when the relayed response ends.
struct Finish {
    ticket: Ticket,
    replica: Arc<Replica>,
    status: StatusCode,
    trace: TraceRecord,
    usage: UsageSniffer,
    broken: bool,
    /// When the request arrived, for its time to first token.
    started: Instant,
}

impl Finish {
    fn scan(&mut self, chunk: &[u8]) {
        // A refusal (4xx) carries no usage and no token, and its status already says it failed: reading it
        // cost 1,480 of the 52k instructions a relayed 400 takes (callgrind, release build).
        if !self.status.is_success() {
            return;
        }
        if self.usage.scan(chunk) && self.trace.ttft_ms.is_none() {
            self.trace.ttft_ms = Some(self.started.elapsed().as_secs_f64() * 1e3);
        }
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        let state = &self.ticket.state;
        let status = if self.broken { 502 } else { self.status.as_u16() };
        self.replica.requests.count(status);
        if self.broken {
            self.replica.errors_total.fetch_add(1, Ordering::Relaxed);
            state.metrics.stream_errors.fetch_add(1, Ordering::Relaxed);
            state.observe_health(&self.replica, false);
        }
        let mut trace = std::mem::take(&mut self.trace);
        trace.output_length = self.usage.output_tokens();
        trace.cached_tokens = self.usage.cached_tokens;
        trace.engine_prompt_tokens = self.usage.prompt_tokens;
        if let (Some(prediction), Some(engine)) = (&self.ticket.prediction, self.usage.cached_tokens) {
            state.metrics.count_prediction(prediction.report(engine));
        }
        trace.status = Some(status);
        if (400..500).contains(&status) {
            // The replica refused the prompt (too long, malformed): it cached nothing of it, and its hashes
            // (a 15 MiB prompt has a quarter of a million) would only weigh on the ring and its readers.
            trace.hash_ids = Vec::new();
        }
        if self.broken {
            trace.error = Some("stream_broken".to_owned());
        } else if self.usage.error_event {
            trace.error = Some("stream_error".to_owned());
        }
        state.recorder.record(trace);
    }
}

impl Stream for RelayBody {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(first) = self.first.take() {
            if let Some(finish) = &mut self.finish {
                finish.scan(&first);
            }
            return Poll::Ready(Some(Ok(first)));
        }
        match self.rest.poll_chunk(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(chunk))) => {
                if let Some(finish) = &mut self.finish {
                    finish.scan(&chunk);
                }
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(error))) => {
                self.done = true;
                if let Some(finish) = &mut self.finish {
                    finish.broken = true;
                }
                let url = self.finish.as_ref().map(|f| f.replica.spec.url.clone()).unwrap_or_default();
                // Complete now: the client may keep the connection open after the error event.
                self.finish = None;
                if self.is_sse {
                    let event = json!({"error": {
                        "message": format!("the replica {url} failed mid-stream: {error}; the answer is incomplete, retry the request"),
                        "type": "upstream_error",
                        "code": 502,
                    }});
                    Poll::Ready(Some(Ok(Bytes::from(format!("data: {event}\n\n")))))
                } else {
                    Poll::Ready(Some(Err(std::io::Error::other(error.to_string()))))
                }
            }
            Poll::Ready(None) => {
                self.done = true;
                self.finish = None;
                Poll::Ready(None)
            }
        }
    }
}

fn relay(
    ticket: Ticket,
    replica: Arc<Replica>,
    upstream: Committed,
    trace: TraceRecord,
    branch: Branch,
    policy_version: u64,
    started: Instant,
) -> Response {
    let Committed { status, content_type, complete, first, rest } = upstream;
    let request_id = ticket.request_id;
    let is_sse = content_type.as_ref().is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let url = replica.url_header.clone();
    let mut finish =
        Finish { ticket, replica, status, trace, usage: UsageSniffer::default(), broken: false, started };
    let body = if complete && !is_sse {
        // The whole answer is here (a non-streaming completion, an error): send it sized, in one
        // write, and finish the request now rather than when the client has read it.
        let whole = first.unwrap_or_default();
        finish.scan(&whole);
        drop(finish);
        Body::from(whole)
    } else {
        Body::from_stream(RelayBody { first, rest, is_sse, done: false, finish: Some(finish) })
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    // First, so that the answer's head carries it on its first header line: a relayed 400 is told from
    // hyper's own by that line alone (`serve::Stamped`).
    headers.insert(REQUEST_ID_HEADER, HeaderValue::from(request_id));
    if let Some(content_type) = content_type {
        headers.insert(header::CONTENT_TYPE, content_type);
    }
    if is_sse {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    if let Some(value) = url {
        headers.insert(REPLICA_HEADER, value);
    }
    headers.insert(BRANCH_HEADER, HeaderValue::from_static(branch_label(branch)));
    headers.insert(POLICY_VERSION_HEADER, HeaderValue::from(policy_version));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that arrives as `chunks`, one frame each.
    fn framed(
        chunks: &[&'static str],
    ) -> http_body_util::StreamBody<impl Stream<Item = Result<hyper::body::Frame<Bytes>, std::io::Error>>>
    {
        let frames =
            chunks.iter().map(|chunk| Ok(hyper::body::Frame::data(Bytes::from_static(chunk.as_bytes()))));
        http_body_util::StreamBody::new(futures_util::stream::iter(frames.collect::<Vec<_>>()))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_in_one_frame_or_many_and_refused_past_the_limit() {
        let one = read_whole(framed(&[r#"{"prompt":"hi"}"#]), 64).await.unwrap();
        assert_eq!(one, Bytes::from_static(br#"{"prompt":"hi"}"#));
        let many = read_whole(framed(&["{\"pro", "", "mpt\":", "\"hi\"}"]), 64).await.unwrap();
        assert_eq!(many, one, "frames are joined in order, empty ones skipped");
        assert_eq!(read_whole(framed(&[]), 64).await.unwrap(), Bytes::new());
        assert_eq!(
            read_whole(framed(&["12345", "678"]), 8).await.unwrap().len(),
            8,
            "the limit itself is allowed"
        );
        let over = read_whole(framed(&["12345", "6789"]), 8).await.unwrap_err();
        assert!(over.is::<LengthLimitError>(), "past the limit: {over}");
    }

    #[test]
    fn usage_is_sniffed_from_sse_and_json() {
        let mut sse = UsageSniffer::default();
        sse.scan(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n");
        sse.scan(b"data: {\"choices\":[{\"delta\":{\"content\":\"b\"},\"finish_reason\":null}],\"usage\":null}\n\n");
        sse.scan(b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n");
        sse.scan(b"data: [DONE]\n\n");
        assert_eq!(sse.output_tokens(), 2);
        let mut whole = UsageSniffer::default();
        whole.scan(br#"{"usage":{"prompt_tokens":9,"completion_tokens": 40,"prompt_tokens_details":{"cached_tokens":16}}}"#);
        assert_eq!(
            (whole.output_tokens(), whole.cached_tokens, whole.prompt_tokens),
            (40, Some(16), Some(9))
        );
        let mut nothing = UsageSniffer::default();
        assert!(!nothing.error_event);
        nothing.scan(br#"{"usage":{"completion_tokens": null},"choices":[{"finish_reason":null},{"finish_reason":null}]}"#);
        assert_eq!((nothing.completion_tokens, nothing.output_tokens()), (None, 2));
    }

    #[test]
    fn the_first_token_is_a_chunk_with_content_and_error_events_are_noticed() {
        let cases: [(&[u8], bool, bool); 8] = [
            // (chunk, carries a token, is an error event)
            (
                br#"data: {"choices":[{"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
                false,
                false,
            ),
            (br#"data: {"choices":[{"delta":{"role":"assistant"},"finish_reason":null}]}"#, false, false),
            (br#"data: {"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]}"#, true, false),
            (br#"data: {"choices":[{"text":" the","finish_reason":null}]}"#, true, false),
            (br#"{"choices":[{"message":{"role":"assistant","content":"a b c"}}]}"#, true, false),
            (br#"data: {"error": {"message": "engine died", "code": 503}}"#, false, true),
            (br#"data: {"object":"error","message":"bad","code":500}"#, false, true),
            (br#"{"error":{"message":"no such model","code":404}}"#, false, false),
        ];
        for (chunk, token, error) in cases {
            let mut sniffer = UsageSniffer::default();
            let text = String::from_utf8_lossy(chunk);
            assert_eq!(sniffer.scan(chunk), token, "token in {text}");
            assert_eq!(sniffer.error_event, error, "error event in {text}");
        }
    }

    /// The number at the start of `text` (blanks allowed before it), if there is one.
    fn leading_number(text: &[u8]) -> Option<u32> {
        let digits = text.trim_ascii_start();
        let end = digits.iter().position(|b| !b.is_ascii_digit()).unwrap_or(digits.len());
        std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
    }

    /// The sniffer as it was, one search per key: the one-pass scan must read every chunk as it does.
    fn reference_scan(sniffer: &mut UsageSniffer, chunk: &[u8]) -> bool {
        use memchr::memmem::{find, find_iter};
        let number_after = |key: &[u8]| Some(leading_number(&chunk[find(chunk, key)? + key.len()..]));
        if let Some(Some(value)) = number_after(b"\"completion_tokens\":") {
            sniffer.completion_tokens = Some(value);
        }
        if let Some(Some(value)) = number_after(b"\"prompt_tokens\":") {
            sniffer.prompt_tokens = Some(value);
        }
        if let Some(Some(value)) = number_after(b"\"cached_tokens\":") {
            sniffer.cached_tokens = Some(value);
        }
        let open = find_iter(chunk, b"\"finish_reason\":null").count() as u32;
        sniffer.token_chunks = sniffer.token_chunks.saturating_add(open);
        let errors: [&[u8]; 3] = [b"data: {\"error\"", b"data:{\"error\"", b"\"object\":\"error\""];
        if errors.iter().any(|pattern| find(chunk, pattern).is_some()) {
            sniffer.error_event = true;
        }
        let keys: [&[u8]; 3] = [b"\"content\":\"", b"\"text\":\"", b"\"reasoning_content\":\""];
        keys.iter()
            .any(|key| find_iter(chunk, key).any(|at| chunk.get(at + key.len()).is_some_and(|&b| b != b'"')))
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn one_pass_reads_chunks_as_one_search_per_key_did(
            chunks in proptest::collection::vec(
                proptest::collection::vec(
                    prop_oneof![
                        proptest::sample::select(vec![
                            "\"completion_tokens\":", "\"prompt_tokens\":", "\"cached_tokens\":", " 12", "7", "null",
                            "\"finish_reason\":null", "\"finish_reason\":\"stop\"", "data: {", "data:{", "\"error\"",
                            "\"object\":\"error\"", "\"content\":\"", "\"text\":\"", "\"reasoning_content\":\"", "\"",
                            "\\\"", "{", "}", ",", ":", "x", "\n\n",
                        ]).prop_map(str::to_owned),
                        "[a-z\" :{},0-9]{0,6}",
                    ],
                    0..24,
                ).prop_map(|parts| parts.concat()),
                1..4,
            ),
        ) {
            for chunk in &chunks {
                // Each chunk whole and alone, ended by a byte that ends a number: what a chunk cut in a
                // match leaves for the next is the framing test's below.
                let chunk = format!("{chunk},");
                let (mut fast, mut reference) = (UsageSniffer::default(), UsageSniffer::default());
                prop_assert_eq!(fast.scan(chunk.as_bytes()), reference_scan(&mut reference, chunk.as_bytes()), "{}", chunk);
                prop_assert_eq!(
                    (fast.completion_tokens, fast.prompt_tokens, fast.cached_tokens, fast.token_chunks, fast.error_event),
                    (reference.completion_tokens, reference.prompt_tokens, reference.cached_tokens, reference.token_chunks, reference.error_event),
                    "{}", chunk
                );
            }
        }

        #[test]
        fn how_a_stream_is_cut_into_chunks_changes_nothing_the_sniffer_reads(
            tokens in proptest::collection::vec("[a-z ]{1,5}", 1..6),
            (prompt, completion, cached) in (0..2_000_000_000u32, 0..100_000u32, 0..2_000_000_000u32),
            failed in any::<bool>(),
            cuts in proptest::collection::vec(0..2_000usize, 0..40),
        ) {
            // A vLLM stream with usage: its token events, the closing event with the usage block, an error
            // event when the generation failed, the end.
            let mut stream = String::new();
            for token in &tokens {
                stream += &format!("data: {{\"id\":\"cmpl-1\",\"choices\":[{{\"index\":0,\"text\":\"{token}\",\"finish_reason\":null}}],\"usage\":null}}\n\n");
            }
            stream += &format!("data: {{\"id\":\"cmpl-1\",\"choices\":[{{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}}],\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":1,\"completion_tokens\":{completion},\"prompt_tokens_details\":{{\"cached_tokens\":{cached}}}}}}}\n\n");
            if failed {
                stream += "data: {\"error\": {\"message\": \"engine died\", \"code\": 503}}\n\n";
            }
            stream += "data: [DONE]\n\n";
            let bytes = stream.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|&cut| cut < bytes.len()).collect();
            cuts.extend([0, bytes.len()]);
            cuts.sort_unstable();
            cuts.dedup();
            let first_token_byte = stream.find("\"text\":\"").unwrap() + 8;
            let mut sniffer = UsageSniffer::default();
            let mut first_token_chunk = None;
            for (index, piece) in cuts.windows(2).enumerate() {
                if sniffer.scan(&bytes[piece[0]..piece[1]]) && first_token_chunk.is_none() {
                    first_token_chunk = Some(index);
                }
            }
            prop_assert_eq!(
                (sniffer.prompt_tokens, sniffer.completion_tokens, sniffer.cached_tokens),
                (Some(prompt), Some(completion), Some(cached))
            );
            prop_assert_eq!((sniffer.token_chunks, sniffer.error_event), (tokens.len() as u32, failed));
            let expected_chunk = cuts.windows(2).position(|piece| (piece[0]..piece[1]).contains(&first_token_byte));
            prop_assert_eq!(first_token_chunk, expected_chunk, "the first token is seen in the chunk that holds it");
        }
    }

    #[test]
    fn a_usage_block_cut_anywhere_is_read_whole() {
        let event = br#"data: {"choices":[],"usage":{"prompt_tokens":1480,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":1408}}}"#;
        for cut in 0..=event.len() {
            let mut sniffer = UsageSniffer::default();
            sniffer.scan(&event[..cut]);
            sniffer.scan(&event[cut..]);
            assert_eq!(
                (sniffer.prompt_tokens, sniffer.completion_tokens, sniffer.cached_tokens),
                (Some(1480), Some(8), Some(1408)),
                "cut after {:?}",
                String::from_utf8_lossy(&event[..cut])
            );
        }
    }
}
