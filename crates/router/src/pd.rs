//! P/D mode: a model group with `role=prefill` replicas splits long prompts into a prefill leg at a prefill
//! replica and a decode leg at the decode pick, in vLLM's disaggregated flow (as its toy proxy drives it).
//!
//! Per request, after the decode pick ([`crate::proxy`]): the spec's `pd` thresholds decide
//! ([`fleet_policy::decide_pd`]) from the prompt's length, the part of it the decode pick does not hold (the
//! index's match) and the least loaded healthy prefill replica's outstanding requests. On a split, the
//! prefill engine (cache-aware, over the prefill replicas only) picks a prefill replica and the prefill leg
//! goes there: the client's request with `max_tokens: 1`, `stream: false` and `kv_transfer_params:
//! {"do_remote_decode": true, ...}`, its answer read whole (at most [`PREFILL_ANSWER_LIMIT`] bytes, within the
//! read timeout). Its `kv_transfer_params` are added to the client's request, which then goes to the decode
//! replica as usual (streamed or not, retried before the first byte). A prefill leg that fails (connect
//! error, 5xx, timeout, no `kv_transfer_params`) makes the request local: the decode replica prefills it.
//! With `pd.kv_handoff: prompt` (a connector that finds the KV by the prompt in a shared store, as vLLM's
//! `ExampleConnector` does) no parameters are expected, and the decode leg is the client's request as it came.
//!
//! A prefill replica tagged `bootstrap=PORT` is an SGLang prefill server, and a split onto it runs SGLang's
//! flow instead: both legs carry `bootstrap_host` (the prefill replica's host), `bootstrap_port` and a fresh
//! `bootstrap_room`, and go out at once; the decode server pulls the room's KV from the prefill server as it
//! is computed. The prefill leg's answer (its one token) is read and dropped in a task of its own. If that leg
//! fails before the decode leg's first byte, the decode attempt is abandoned and the decode replica prefills
//! the prompt itself; a decode leg that answers with a KV transfer error falls back the same way, as in
//! vLLM's flow.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue};
use fleet_policy::{Decision, KvHandoff, PdInputs, PdReason, RequestView, decide_pd};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::proxy::{PD_HEADER, PREFILL_REPLICA_HEADER};
use crate::routing_key::Route;
use crate::state::{FleetView, Group, PdRecord, Replica, RouterState, lock};

/// Largest prefill-leg answer read (a completion of one token with its `kv_transfer_params`: a block id per
/// 16 prompt tokens, so a few hundred KiB for the longest prompts).
pub const PREFILL_ANSWER_LIMIT: usize = 4 << 20;

/// Whether `group` runs in P/D mode: some replica of its model has the prefill role.
pub fn in_pd_mode(fleet: &FleetView, group: &Group) -> bool {
    !fleet.prefill_models.is_empty() && fleet.prefill_models.contains(&group.model)
}

/// A request's P/D decision, and for a split the decode leg's body.
#[derive(Debug)]
pub struct PdPlan {
    /// What the decision log keeps.
    pub record: PdRecord,
    /// The client's request with the prefill replica's `kv_transfer_params` (or SGLang's bootstrap fields);
    /// `None` when served locally.
    pub decode_body: Option<Bytes>,
    /// SGLang's flow: says why the prefill leg, running beside the decode leg, failed. Dropped unsent when
    /// it succeeds.
    pub prefill_failed: Option<oneshot::Receiver<String>>,
}

impl PdPlan {
    /// Makes a split request local: counted, and the reason kept for the log.
    pub fn fall_back(&mut self, state: &RouterState, why: String) {
        self.decode_body = None;
        self.prefill_failed = None;
        self.record.branch = "local";
        self.record.reason = PdReason::TransferFailed;
        self.record.fallback = Some(why);
        state.metrics.count_pd(PdReason::TransferFailed);
        state.metrics.pd_fallbacks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Adds the P/D response headers (`x-fleet-pd`, `x-fleet-prefill-replica`).
    pub fn annotate(&self, headers: &mut HeaderMap) {
        headers.insert(PD_HEADER, HeaderValue::from_static(self.record.reason.as_str()));
        if self.decode_body.is_some()
            && let Some(value) =
                self.record.prefill_replica.as_deref().and_then(|url| HeaderValue::from_str(url).ok())
        {
            headers.insert(PREFILL_REPLICA_HEADER, value);
        }
    }
}

/// The request's place in the prefill engine: completed there on drop (the leg ended, or the client left).
struct PrefillTicket {
    state: Arc<RouterState>,
    group: Arc<Group>,
    request_id: u64,
}

impl Drop for PrefillTicket {
    fn drop(&mut self) {
        let now = self.state.now_ms();
        let _ = lock(&self.group.prefill).engine.on_completed(self.request_id, now);
    }
}

/// Decides split or local for one request and, on a split, runs the prefill leg.
#[allow(clippy::too_many_arguments)] // the request's parts, each from a different place
pub async fn prepare(
    state: &Arc<RouterState>,
    fleet: &FleetView,
    group: &Arc<Group>,
    route: Route,
    headers: &HeaderMap,
    body: &Bytes,
    view: &RequestView,
    block_tokens: u32,
    decode_pick: &Decision,
    request_id: u64,
) -> PdPlan {
    let params = state.policy.load().pd;
    let matched = decode_pick.chosen().and_then(|chosen| chosen.matched_blocks).unwrap_or(0);
    let cached_at_decode = matched.saturating_mul(block_tokens).min(view.prompt_tokens);
    let (prefill_replicas, prefill_pool_load) = {
        let prefill = lock(&group.prefill);
        let now = state.now_ms();
        let healthy: Vec<u64> = prefill
            .engine
            .replicas()
            .into_iter()
            .filter_map(|id| prefill.engine.replica_status_at(id, now))
            .filter(|status| status.healthy)
            .map(|status| status.outstanding)
            .collect();
        (healthy.len(), healthy.iter().copied().min().unwrap_or(0))
    };
    let inputs =
        PdInputs { prompt_tokens: view.prompt_tokens, cached_at_decode, prefill_replicas, prefill_pool_load };
    let decision = decide_pd(&params, &inputs);
    state.metrics.count_pd(decision.reason);
    let mut plan = PdPlan {
        record: PdRecord {
            branch: if decision.split { "split" } else { "local" },
            reason: decision.reason,
            explanation: decision.explanation,
            cached_at_decode,
            uncached_tokens: decision.uncached_tokens,
            prefill_replica: None,
            prefill: None,
            prefill_ms: None,
            bootstrap_room: None,
            fallback: None,
        },
        decode_body: None,
        prefill_failed: None,
    };
    if !decision.split {
        return plan;
    }
    let picked = {
        let mut prefill = lock(&group.prefill);
        let prefill = &mut *prefill;
        prefill.engine.route(request_id, view, state.now_ms(), &mut prefill.rng)
    };
    let prefill_pick = match picked {
        Ok(pick) => pick,
        Err(error) => {
            plan.fall_back(state, format!("no prefill replica could be picked: {error}"));
            return plan;
        }
    };
    let ticket = PrefillTicket { state: state.clone(), group: group.clone(), request_id };
    let replica = fleet.replica(prefill_pick.replica).cloned();
    plan.record.prefill_replica = replica.as_ref().map(|replica| replica.spec.url.clone());
    plan.record.prefill = Some(prefill_pick);
    let Some(replica) = replica else {
        plan.fall_back(state, "the prefill pick left the fleet".to_owned());
        return plan;
    };
    replica.routed_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Some(port) = replica.spec.bootstrap_port {
        start_bootstrap_legs(state, &mut plan, ticket, replica, port, route, headers, body);
        return plan;
    }
    let started = Instant::now();
    let outcome = prefill_leg(state, &replica, route, headers, body, params.kv_handoff).await;
    drop(ticket);
    let elapsed = started.elapsed();
    state.metrics.pd_prefill_leg.observe(elapsed);
    plan.record.prefill_ms = Some(elapsed.as_secs_f64() * 1e3);
    let leg = outcome.and_then(|handoff| match handoff {
        Some(transfer_params) => decode_body(body, transfer_params),
        // The connector finds the KV by the prompt: the decode leg is the client's request as it came.
        None => Ok(body.clone()),
    });
    match leg {
        Ok(leg) => {
            state.observe_health(&replica, true);
            plan.decode_body = Some(leg);
        }
        Err(error) => {
            replica.errors_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if !error.answered {
                state.observe_health(&replica, false);
            }
            tracing::warn!(replica = %replica.spec.url, error = %error.message, "P/D prefill leg failed; prefilling locally");
            plan.fall_back(state, format!("the prefill leg failed: {}", error.message));
        }
    }
    plan
}

/// SGLang's flow: sends the prefill leg (the client's request with the bootstrap fields) in a task of its own
/// and makes the same body the decode leg. The task reports a failure on `plan.prefill_failed`.
#[allow(clippy::too_many_arguments)] // the request's parts, each from a different place
fn start_bootstrap_legs(
    state: &Arc<RouterState>,
    plan: &mut PdPlan,
    ticket: PrefillTicket,
    replica: Arc<Replica>,
    bootstrap_port: u16,
    route: Route,
    headers: &HeaderMap,
    body: &Bytes,
) {
    let Some(host) = replica.spec.host() else {
        plan.fall_back(state, format!("{} has no host for SGLang's bootstrap", replica.spec.url));
        return;
    };
    let room = bootstrap_room(ticket.request_id);
    let legs = match bootstrap_body(body, host, bootstrap_port, room) {
        Ok(legs) => legs,
        Err(error) => {
            plan.fall_back(state, format!("the prefill leg failed: {}", error.message));
            return;
        }
    };
    plan.record.bootstrap_room = Some(room);
    let (failed, failure) = oneshot::channel();
    plan.prefill_failed = Some(failure);
    plan.decode_body = Some(legs.clone());
    let (state, headers) = (state.clone(), headers.clone());
    tokio::spawn(async move {
        let started = Instant::now();
        let outcome = send_leg(&state, &replica, route, &headers, legs).await;
        drop(ticket);
        state.metrics.pd_prefill_leg.observe(started.elapsed());
        match outcome {
            Ok(_) => state.observe_health(&replica, true),
            Err(error) => {
                replica.errors_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if !error.answered {
                    state.observe_health(&replica, false);
                }
                tracing::warn!(replica = %replica.spec.url, room, error = %error.message, "P/D prefill leg (SGLang) failed");
                // The decode leg may have finished already; then nobody listens, and that is fine.
                let _ = failed.send(error.message);
            }
        }
    });
}

/// A fresh bootstrap room: SGLang's prefill server keys the KV it hands over by it, so rooms from several
/// routers sharing a prefill server must not collide. The hasher's keys are random per process.
fn bootstrap_room(request_id: u64) -> u64 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    // SGLang takes the room as a non-negative 63-bit integer.
    KEYS.get_or_init(RandomState::new).hash_one((request_id, nanos)) >> 1
}

/// Why a prefill leg failed.
#[derive(Debug)]
struct LegError {
    message: String,
    /// The replica answered (it is up).
    answered: bool,
}

impl LegError {
    fn answered(message: String) -> Self {
        Self { message, answered: true }
    }
}

/// Sends the prefill leg and returns the `kv_transfer_params` of its answer, or `None` when the KV is handed
/// off by the prompt ([`KvHandoff::Prompt`]), which needs none.
async fn prefill_leg(
    state: &RouterState,
    replica: &Replica,
    route: Route,
    headers: &HeaderMap,
    body: &Bytes,
    handoff: KvHandoff,
) -> Result<Option<Value>, LegError> {
    let answer = send_leg(state, replica, route, headers, prefill_body(body)?).await?;
    let url = &replica.spec.url;
    let value: Value = serde_json::from_slice(&answer)
        .map_err(|error| LegError::answered(format!("{url} answered something other than JSON: {error}")))?;
    match (value.get("kv_transfer_params"), handoff) {
        (_, KvHandoff::Prompt) => Ok(None),
        (Some(params @ Value::Object(_)), KvHandoff::Params) => Ok(Some(params.clone())),
        (_, KvHandoff::Params) => Err(LegError::answered(format!(
            "{url} answered without kv_transfer_params (is it a vLLM replica with a KV connector, started \
             as a prefill instance? A connector that finds the KV by the prompt, such as vLLM's \
             ExampleConnector, needs the policy's pd.kv_handoff: prompt; an SGLang prefill server needs \
             bootstrap=PORT in its replica spec)"
        ))),
    }
}

/// Sends one prefill leg and reads its answer whole: at most [`PREFILL_ANSWER_LIMIT`] bytes, within the
/// read timeout, with a success status.
async fn send_leg(
    state: &RouterState,
    replica: &Replica,
    route: Route,
    headers: &HeaderMap,
    leg: Bytes,
) -> Result<Vec<u8>, LegError> {
    let url = &replica.spec.url;
    let deadline = state.config.read_timeout;
    let work = async {
        let upstream = replica
            .connections
            .post(route, headers, leg)
            .await
            .map_err(|error| LegError { message: format!("{url} unreachable: {error}"), answered: false })?;
        let status = upstream.status();
        replica.requests.count(status.as_u16());
        let mut rest = upstream.into_body();
        let mut answer = Vec::new();
        while let Some(chunk) = rest.next_chunk().await {
            let chunk = chunk.map_err(|error| LegError {
                message: format!("{url} failed mid-answer: {error}"),
                answered: false,
            })?;
            if answer.len() + chunk.len() > PREFILL_ANSWER_LIMIT {
                return Err(LegError::answered(format!(
                    "{url} answered more than {PREFILL_ANSWER_LIMIT} bytes to a one-token prefill"
                )));
            }
            answer.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&answer[..answer.len().min(200)]).into_owned();
            return Err(LegError::answered(format!("{url} answered {status}: {text}")));
        }
        Ok(answer)
    };
    tokio::time::timeout(deadline, work).await.unwrap_or_else(|_| {
        Err(LegError { message: format!("{url} did not answer within {deadline:?}"), answered: false })
    })
}

/// The client's request object, or why it cannot be split.
fn request_object(body: &Bytes) -> Result<serde_json::Map<String, Value>, LegError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(object)) => Ok(object),
        _ => Err(LegError::answered("the request body is not a JSON object".to_owned())),
    }
}

/// The prefill leg: the client's request for one token, whole, with vLLM's remote-decode marker.
fn prefill_body(body: &Bytes) -> Result<Bytes, LegError> {
    let mut object = request_object(body)?;
    object.insert("max_tokens".to_owned(), json!(1));
    if object.contains_key("max_completion_tokens") {
        object.insert("max_completion_tokens".to_owned(), json!(1));
    }
    object.insert("stream".to_owned(), json!(false));
    object.remove("stream_options");
    object.insert(
        "kv_transfer_params".to_owned(),
        json!({
            "do_remote_decode": true,
            "do_remote_prefill": false,
            "remote_engine_id": null,
            "remote_block_ids": null,
            "remote_host": null,
            "remote_port": null,
        }),
    );
    Ok(Bytes::from(Value::Object(object).to_string()))
}

/// SGLang's legs (both the same): the client's request with the prefill server's bootstrap address and room.
fn bootstrap_body(body: &Bytes, host: &str, port: u16, room: u64) -> Result<Bytes, LegError> {
    let mut object = request_object(body)?;
    object.insert("bootstrap_host".to_owned(), json!(host));
    object.insert("bootstrap_port".to_owned(), json!(port));
    object.insert("bootstrap_room".to_owned(), json!(room));
    Ok(Bytes::from(Value::Object(object).to_string()))
}

/// The decode leg: the client's request as it came, with the prefill answer's `kv_transfer_params`.
fn decode_body(body: &Bytes, params: Value) -> Result<Bytes, LegError> {
    let mut object = request_object(body)?;
    object.insert("kv_transfer_params".to_owned(), params);
    Ok(Bytes::from(Value::Object(object).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_leg_asks_for_one_whole_token_and_the_decode_leg_carries_the_params() {
        let client = Bytes::from(
            r#"{"model":"m","prompt":"hi","max_tokens":40,"stream":true,"stream_options":{"include_usage":true}}"#,
        );
        let leg: Value = serde_json::from_slice(&prefill_body(&client).unwrap()).unwrap();
        assert_eq!(leg["max_tokens"], 1);
        assert_eq!(leg["stream"], false);
        assert!(leg.get("stream_options").is_none());
        assert_eq!(leg["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(leg["kv_transfer_params"]["do_remote_prefill"], false);
        assert_eq!(leg["prompt"], "hi");
        let params = json!({"do_remote_prefill": true, "remote_port": 8100});
        let decode: Value = serde_json::from_slice(&decode_body(&client, params.clone()).unwrap()).unwrap();
        assert_eq!(decode["kv_transfer_params"], params);
        assert_eq!((decode["max_tokens"].clone(), decode["stream"].clone()), (json!(40), json!(true)));
        let chat = Bytes::from(r#"{"messages":[],"max_completion_tokens":9}"#);
        let leg: Value = serde_json::from_slice(&prefill_body(&chat).unwrap()).unwrap();
        assert_eq!((leg["max_tokens"].clone(), leg["max_completion_tokens"].clone()), (json!(1), json!(1)));
        assert!(prefill_body(&Bytes::from("[1]")).is_err());
    }

    #[test]
    fn sglang_legs_carry_the_bootstrap_address_and_a_fresh_non_negative_room() {
        let client = Bytes::from(r#"{"model":"m","prompt":"hi","max_tokens":40,"stream":true}"#);
        let leg: Value =
            serde_json::from_slice(&bootstrap_body(&client, "10.0.0.7", 8998, 42).unwrap()).unwrap();
        assert_eq!(
            (leg["bootstrap_host"].clone(), leg["bootstrap_port"].clone(), leg["bootstrap_room"].clone()),
            (json!("10.0.0.7"), json!(8998), json!(42))
        );
        assert_eq!((leg["max_tokens"].clone(), leg["stream"].clone()), (json!(40), json!(true)));
        let rooms: std::collections::HashSet<u64> = (0..1000).map(bootstrap_room).collect();
        assert_eq!(rooms.len(), 1000, "no two requests share a room");
        assert!(rooms.iter().all(|room| *room <= i64::MAX as u64));
    }
}
