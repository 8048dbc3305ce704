//! HTTP face of an emulated replica: vLLM's OpenAI routes, `/health`, `/metrics`, with faults.
//!
//! Handlers parse, tokenise and hand the request to the replica's engine driver
//! ([`crate::driver`]), then turn the engine's token events into OpenAI responses (SSE or one
//! JSON body). Each replica is its own server on its own listener, as each vLLM instance is.
//! Faults ([`crate::faults`]) are read from an arc-swapped snapshot on every request; `down`
//! also closes the listening socket (connections are refused) until the replica is up again.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::driver::{DriverHandle, PdOptions, RequestStream, StreamEvent, SubmitError};
use crate::engine::{AddError, FinishReason, RemoteKv, tokenize};
use crate::exposition::{self, ExpositionInfo, Flavor};
use crate::faults::FaultSwitch;
use crate::openai::{self, Api, GenerationRequest, OutputWords, ResponseMeta, SSE_DONE, Usage};
use crate::pd::{self, PdConfig, PdLeg, PullRequest, Role, RoomState, Rooms};

/// Largest request body a replica accepts (vLLM itself has no small limit; this keeps the
/// emulator safe from runaway clients).
const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// One emulated replica: its engine driver, faults and identity.
#[derive(Debug)]
pub struct Replica {
    pub index: usize,
    pub info: ExpositionInfo,
    pub max_model_len: u32,
    pub driver: Arc<DriverHandle>,
    pub faults: FaultSwitch,
    pub flavor: Flavor,
    /// Disaggregated prefill/decode settings (role, lease, wait bound).
    pub pd: PdConfig,
    /// The address the replica serves on: the side channel a decode replica pulls KV through.
    pub addr: SocketAddr,
    /// vLLM's `engine_id`, named in `kv_transfer_params.remote_engine_id`.
    pub engine_id: String,
    /// SGLang prefill side: bootstrap rooms whose KV is held for a decode replica.
    pub rooms: Rooms,
    /// Decode side: the client that pulls KV from prefill replicas.
    pub http: reqwest::Client,
}

impl Replica {
    pub fn model_name(&self) -> &str {
        &self.info.model_name
    }

    /// The `/metrics` text the replica serves now (ignoring faults).
    pub fn render_metrics(&self) -> String {
        exposition::render(&self.driver.metrics(), &self.info)
    }
}

/// Serves `replica` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    replica: Arc<Replica>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = DownableListener::new(listener, replica.faults.watch_down())?;
    axum::serve(listener, router(replica)).with_graceful_shutdown(shutdown).await
}

/// The replica's routes, for embedding or testing without a socket.
pub fn router(replica: Arc<Replica>) -> Router {
    let routes = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics));
    // `/version` is vLLM's alone: SGLang serves none, and gateways (SMG) tell the engines apart by it.
    let routes = match replica.flavor {
        Flavor::Vllm | Flavor::VllmLegacy => {
            routes.route("/version", get(|| async { Json(json!({"version": "0.12.0"})) }))
        }
        Flavor::Sglang => routes,
    };
    routes
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/fleet_sim/kv/pull", post(kv_pull))
        .layer(middleware::from_fn_with_state(replica.clone(), fault_gate))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(replica)
}

/// Applies the faults every route shares: added latency first, then `down` (503 on connections
/// that were open before the port closed).
async fn fault_gate(State(replica): State<Arc<Replica>>, request: Request, next: Next) -> Response {
    let faults = replica.faults.get();
    if faults.added_latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(faults.added_latency_ms)).await;
    }
    if replica.faults.get().down {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            "replica is down (injected fault)",
        );
    }
    next.run(request).await
}

fn error_response(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": status.as_u16()}});
    (status, Json(body)).into_response()
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn metrics(State(replica): State<Arc<Replica>>) -> Response {
    let text = if replica.faults.get().malformed_metrics {
        exposition::render_malformed(&replica.info)
    } else {
        replica.render_metrics()
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn models(State(replica): State<Arc<Replica>>) -> Json<serde_json::Value> {
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let model = replica.model_name();
    let owner = match replica.flavor {
        Flavor::Vllm | Flavor::VllmLegacy => "vllm",
        Flavor::Sglang => "sglang",
    };
    Json(json!({
        "object": "list",
        "data": [{
            "id": model, "object": "model", "created": created, "owned_by": owner, "root": model,
            "parent": null, "max_model_len": replica.max_model_len,
        }],
    }))
}

/// The replica's identity: its role in vLLM's (`kv_role`) and SGLang's (`disaggregation_mode`) words.
async fn server_info(State(replica): State<Arc<Replica>>) -> Json<serde_json::Value> {
    let transfer = &replica.driver.config().kv_transfer;
    Json(json!({
        "model": replica.model_name(),
        "flavor": replica.flavor.name(),
        "role": replica.pd.role,
        "kv_role": pd::kv_role(replica.pd.role),
        "disaggregation_mode": pd::disaggregation_mode(replica.pd.role),
        "engine_id": replica.engine_id,
        "kv_transfer": {
            "bytes_per_token": transfer.bytes_per_token,
            "gbps": transfer.gbps,
            "latency_us": transfer.latency_us,
            "lease_ms": replica.pd.lease.as_millis() as u64,
            "wait_timeout_ms": replica.pd.wait_timeout.as_millis() as u64,
            "kv_load_failure_policy": replica.driver.config().kv_load_failure_policy,
        },
    }))
}

/// The prefill side of a pull: frees the blocks held for a vLLM request id, or waits (bounded) for an
/// SGLang room's prefill and frees its blocks. 404/504/500 say why nothing could be pulled.
async fn kv_pull(State(replica): State<Arc<Replica>>, body: Bytes) -> Response {
    let request: PullRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            let message = format!("the body must be a pull request (request_id or room, wait_ms): {e}");
            return (StatusCode::BAD_REQUEST, Json(openai_error(&message, "body"))).into_response();
        }
    };
    let refused = |status: StatusCode, kind: &str, message: String| {
        replica.driver.metrics().pd.failed_pulls += 1;
        error_response(status, kind, &message)
    };
    let (id, tokens) = match (request.request_id, request.room) {
        (Some(id), None) => (id, None),
        (None, Some(room)) => {
            let wait = Duration::from_millis(request.wait_ms).min(replica.pd.wait_timeout);
            match replica.rooms.take(room, wait).await {
                Some(RoomState::Ready { id, tokens }) => (id, Some(tokens)),
                Some(RoomState::Failed | RoomState::Pending) => {
                    return refused(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "InternalServerError",
                        format!("KVTransferError(bootstrap_room={room}): the prefill of this room failed"),
                    );
                }
                None => {
                    return refused(
                        StatusCode::GATEWAY_TIMEOUT,
                        "TimeoutError",
                        format!(
                            "KVTransferError(bootstrap_room={room}): no prefill for this room within {} ms",
                            wait.as_millis()
                        ),
                    );
                }
            }
        }
        _ => {
            let message = "a pull names exactly one of request_id (vLLM) or room (SGLang)";
            return (StatusCode::BAD_REQUEST, Json(openai_error(message, "body"))).into_response();
        }
    };
    match replica.driver.release_held(id).await {
        Ok(true) => {
            if let Some(tokens) = tokens {
                // SGLang's prefill side reports the latest transfer's latency and speed.
                let transfer = &replica.driver.config().kv_transfer;
                let seconds = transfer.duration_us(tokens) as f64 / 1e6;
                replica.driver.metrics().pd.record_latency(seconds, transfer.bytes(tokens));
            }
            Json(json!({"released": true, "request_id": id})).into_response()
        }
        Ok(false) => refused(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!("no KV is held for request {id}: unknown, already pulled, or its lease expired"),
        ),
        Err(e) => refused(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailableError", e.to_string()),
    }
}

/// Reads the request's P/D leg, if this replica's role and flavor take part in one: vLLM flavors read
/// `kv_transfer_params`, SGLang reads the bootstrap fields; a replica of role `both` ignores both, as an
/// engine without a KV connector or disaggregation mode does.
fn pd_leg(replica: &Replica, body: &[u8]) -> Result<Option<PdLeg>, pd::PdError> {
    if replica.pd.role == Role::Both {
        return Ok(None);
    }
    let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Ok(None);
    };
    match replica.flavor {
        Flavor::Vllm | Flavor::VllmLegacy => pd::parse_kv_transfer_params(fields.get("kv_transfer_params")),
        Flavor::Sglang => Ok(pd::parse_bootstrap(&fields)?.map(|(host, port, room)| match replica.pd.role {
            Role::Prefill => PdLeg::SglangPrefill { room },
            _ => PdLeg::SglangDecode { host, port, room },
        })),
    }
}

/// Decode side: asks the prefill replica to release the request's KV; `Err` carries why it could not.
async fn pull(replica: &Replica, host: &str, port: u16, request: &PullRequest) -> Result<(), String> {
    let url = format!("http://{host}:{port}/fleet_sim/kv/pull");
    let response = replica.http.post(&url).json(request).send().await.map_err(|e| e.to_string())?;
    if response.status().is_success() {
        return Ok(());
    }
    let status = response.status();
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    Err(body["error"]["message"]
        .as_str()
        .map_or_else(|| format!("the prefill replica answered {status}"), str::to_string))
}

/// Counts a decode request waiting for its prefill's KV (SGLang's decode prealloc queue) while it lives.
struct DecodeWaiting<'a>(&'a DriverHandle);

impl<'a> DecodeWaiting<'a> {
    fn new(driver: &'a DriverHandle) -> Self {
        driver.metrics().pd.decode_waiting += 1;
        Self(driver)
    }
}

impl Drop for DecodeWaiting<'_> {
    fn drop(&mut self) {
        let mut metrics = self.0.metrics();
        metrics.pd.decode_waiting = metrics.pd.decode_waiting.saturating_sub(1);
    }
}

async fn reset_prefix_cache(State(replica): State<Arc<Replica>>) -> Response {
    match replica.driver.reset_prefix_cache().await {
        Ok(true) => StatusCode::OK.into_response(),
        Ok(false) => {
            error_response(StatusCode::CONFLICT, "ConflictError", "requests hold KV blocks; retry when idle")
        }
        Err(_) => error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            "replica is shutting down",
        ),
    }
}

async fn completions(State(replica): State<Arc<Replica>>, body: Bytes) -> Response {
    generate(replica, Api::Completions, &body).await
}

async fn chat_completions(State(replica): State<Arc<Replica>>, body: Bytes) -> Response {
    generate(replica, Api::Chat, &body).await
}

async fn generate(replica: Arc<Replica>, api: Api, body: &[u8]) -> Response {
    let request = match openai::parse(api, body) {
        Ok(request) => request,
        Err(invalid) => return (StatusCode::BAD_REQUEST, Json(invalid.body())).into_response(),
    };
    if let Some(model) = request.model.as_deref().filter(|m| *m != replica.model_name()) {
        let message =
            format!("The model `{model}` does not exist. This replica serves `{}`.", replica.model_name());
        return error_response(StatusCode::NOT_FOUND, "NotFoundError", &message);
    }
    let faults = replica.faults.get();
    if replica.faults.roll(faults.error_rate) {
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            "injected fault: engine error",
        );
    }
    let leg = match pd_leg(&replica, body) {
        Ok(leg) => leg,
        Err(invalid) => {
            return (StatusCode::BAD_REQUEST, Json(openai_error(&invalid.message, invalid.param)))
                .into_response();
        }
    };
    let block_tokens = replica.driver.config().block_tokens;
    let prompt = tokenize::prompt_of_text(&request.prompt, block_tokens);
    let mut max_tokens = u32::try_from(request.max_tokens).unwrap_or(u32::MAX);
    let requested = u64::from(prompt.tokens) + u64::from(max_tokens);
    if requested > u64::from(replica.max_model_len) {
        let message = format!(
            "This model's maximum context length is {} tokens. However, you requested {requested} tokens \
             ({} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion.",
            replica.max_model_len, prompt.tokens
        );
        return (StatusCode::BAD_REQUEST, Json(openai_error(&message, "max_tokens"))).into_response();
    }
    let lease = u64::try_from(replica.pd.lease.as_micros()).unwrap_or(u64::MAX);
    let prompt_tokens = prompt.tokens;
    let (options, on_finish) = match &leg {
        None => (PdOptions::default(), PdFinish::None),
        Some(PdLeg::VllmPrefill) => (PdOptions { hold_for: Some(lease), remote: None }, PdFinish::VllmAnswer),
        Some(PdLeg::SglangPrefill { room }) => {
            // SGLang's prefill server produces the first token only; the decode server generates the rest.
            max_tokens = 1;
            if !replica.rooms.set(*room, RoomState::Pending) {
                return error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailableError",
                    "too many bootstrap rooms in flight; retry later",
                );
            }
            (PdOptions { hold_for: Some(lease), remote: None }, PdFinish::Room(*room))
        }
        Some(PdLeg::VllmDecode { host, port, request_id, .. }) => {
            let ask = PullRequest { request_id: Some(*request_id), room: None, wait_ms: 0 };
            let pulled = pull(&replica, host, *port, &ask).await;
            if let Err(why) = &pulled {
                tracing::warn!(replica = replica.index, %why, "KV pull failed; the load fails as the engine's would");
            }
            let fail = pulled.is_err() || replica.faults.transfer_fails();
            (
                PdOptions { hold_for: None, remote: Some(RemoteKv { use_local_cache: true, fail }) },
                PdFinish::None,
            )
        }
        Some(PdLeg::SglangDecode { host, port, room }) => {
            let wait_ms = u64::try_from(replica.pd.wait_timeout.as_millis()).unwrap_or(u64::MAX);
            let ask = PullRequest { request_id: None, room: Some(*room), wait_ms };
            let waiting = DecodeWaiting::new(&replica.driver);
            let pulled = pull(&replica, host, *port, &ask).await;
            drop(waiting);
            if let Err(why) = pulled {
                replica.driver.metrics().pd.failed_transfers += 1;
                return error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalServerError",
                    &format!(
                        "KVTransferError(bootstrap_room={room}): Failed to get kvcache from prefill instance: {why}"
                    ),
                );
            }
            let fail = replica.faults.transfer_fails();
            let options =
                PdOptions { hold_for: None, remote: Some(RemoteKv { use_local_cache: false, fail }) };
            (options, PdFinish::SglangDecode(*room))
        }
    };
    let stream = match replica.driver.submit_pd(prompt, max_tokens, options).await {
        Ok(stream) => stream,
        Err(SubmitError::Engine(error @ AddError::TooLarge { .. })) => {
            return (StatusCode::BAD_REQUEST, Json(openai_error(&error.to_string(), "max_tokens")))
                .into_response();
        }
        Err(error) => {
            return error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailableError",
                &error.to_string(),
            );
        }
    };
    let meta = ResponseMeta {
        id: format!("cmpl-{}-{}", replica.index, stream.id),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        model: replica.model_name().to_string(),
        api,
    };
    let on_finish = match on_finish {
        PdFinish::VllmAnswer => PdFinish::VllmParams(pd::vllm_prefill_answer(
            &replica.engine_id,
            stream.id,
            &replica.addr.ip().to_string(),
            replica.addr.port(),
            prompt_tokens.div_ceil(block_tokens.max(1)),
            prompt_tokens,
        )),
        other => other,
    };
    let run = Run {
        replica: replica.clone(),
        on_finish,
        words: OutputWords::new(&request.prompt),
        request,
        meta,
        stream,
        stall: Duration::from_millis(faults.stall_ms),
        drop_mid_stream: replica.faults.roll(faults.drop_mid_stream_rate),
    };
    if run.request.stream {
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
        tokio::spawn(run.stream(tx));
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from_stream(ReceiverStream::new(rx)))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
    } else {
        run.complete().await
    }
}

fn openai_error(message: &str, param: &str) -> serde_json::Value {
    json!({"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}})
}

fn dropped() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "injected fault: connection dropped mid-stream",
    )
}

/// What a P/D leg adds when it finishes.
enum PdFinish {
    None,
    /// vLLM prefill leg, before its engine id is known.
    VllmAnswer,
    /// vLLM prefill leg: `kv_transfer_params` for the decode leg (non-streamed answers carry it).
    VllmParams(serde_json::Value),
    /// SGLang prefill leg: the room whose KV is held once the request finishes.
    Room(u64),
    /// SGLang decode leg: a failed transfer is reported with the room.
    SglangDecode(u64),
}

impl Run {
    /// Marks the SGLang room ready (or failed) as the prefill leg finishes.
    fn finish_room(&self, reason: FinishReason, prompt_tokens: u32) {
        if let PdFinish::Room(room) = self.on_finish {
            let state = if reason == FinishReason::Length {
                RoomState::Ready { id: self.stream.id, tokens: prompt_tokens }
            } else {
                RoomState::Failed
            };
            self.replica.rooms.set(room, state);
        }
    }

    /// The error a failed KV load gives the client, in the imitated engine's words.
    fn load_error(&self) -> (StatusCode, &'static str, String) {
        match self.on_finish {
            PdFinish::SglangDecode(room) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                format!(
                    "KVTransferError(bootstrap_room={room}): Failed to get kvcache from prefill instance, it might be dead"
                ),
            ),
            // vLLM's GenerationError for finish reason `error` (kv_load_failure_policy = fail).
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                "Internal server error".to_string(),
            ),
        }
    }
}

/// One accepted request being turned into a response.
struct Run {
    replica: Arc<Replica>,
    on_finish: PdFinish,
    request: GenerationRequest,
    meta: ResponseMeta,
    stream: RequestStream,
    words: OutputWords,
    stall: Duration,
    drop_mid_stream: bool,
}

/// How a request's generation ended, for the response.
struct Outcome {
    text: String,
    reason: FinishReason,
    usage: Usage,
}

impl Run {
    /// Where a dropped connection cuts: after half the requested tokens (at least one).
    fn drop_after(&self) -> usize {
        (self.request.max_tokens / 2).max(1)
    }

    /// Waits for every token (non-streaming).
    async fn collect(&mut self) -> Option<Outcome> {
        let mut text = String::new();
        while let Some(event) = self.stream.next().await {
            match event {
                StreamEvent::FirstToken { .. } => {
                    if !self.stall.is_zero() {
                        tokio::time::sleep(self.stall).await;
                    }
                    text.push_str(&self.words.next().unwrap_or_default());
                }
                StreamEvent::Token { .. } => text.push_str(&self.words.next().unwrap_or_default()),
                StreamEvent::Finished { reason, prompt_tokens, output_tokens, cached_tokens } => {
                    self.finish_room(reason, prompt_tokens);
                    let usage = Usage {
                        prompt_tokens: prompt_tokens as usize,
                        completion_tokens: output_tokens as usize,
                        cached_tokens: cached_tokens as usize,
                    };
                    return Some(Outcome { text, reason, usage });
                }
            }
        }
        None
    }

    async fn complete(mut self) -> Response {
        let Some(outcome) = self.collect().await else {
            return error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailableError",
                "replica is shutting down",
            );
        };
        if outcome.reason == FinishReason::Error {
            let (status, kind, message) = self.load_error();
            return error_response(status, kind, &message);
        }
        let mut body = self.meta.full_response(&outcome.text, outcome.reason.as_str(), outcome.usage);
        if let PdFinish::VllmParams(params) = &self.on_finish {
            body["kv_transfer_params"] = params.clone();
        }
        let body = body.to_string();
        if self.drop_mid_stream {
            // Half the JSON, then the connection breaks.
            let body = Bytes::from(body.into_bytes());
            let half = futures_util::stream::once(async move { Ok(body.slice(..body.len() / 2)) });
            // A moment for the first half to leave before the connection breaks.
            let cut = futures_util::stream::once(async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Err::<Bytes, _>(dropped())
            });
            return Response::builder()
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(futures_util::StreamExt::chain(half, cut)))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
        }
        ([(header::CONTENT_TYPE, "application/json")], body).into_response()
    }

    /// Streams one SSE event per token. Stops (aborting the request in the engine) when the
    /// client goes away; breaks the connection when the drop fault fires.
    async fn stream(mut self, tx: mpsc::Sender<Result<Bytes, std::io::Error>>) {
        let send = |text: String| {
            let tx = tx.clone();
            async move { tx.send(Ok(Bytes::from(text))).await.is_ok() }
        };
        let mut sent = 0usize;
        while let Some(event) = self.stream.next().await {
            let token = match event {
                StreamEvent::FirstToken { .. } => {
                    if !self.stall.is_zero() {
                        tokio::time::sleep(self.stall).await;
                    }
                    self.meta.token_chunk(&self.words.next().unwrap_or_default(), true)
                }
                StreamEvent::Token { .. } => {
                    self.meta.token_chunk(&self.words.next().unwrap_or_default(), false)
                }
                StreamEvent::Finished { reason, prompt_tokens, output_tokens, cached_tokens } => {
                    self.finish_room(reason, prompt_tokens);
                    if reason == FinishReason::Error {
                        // vLLM ends the stream with an error event (the headers have gone out as 200).
                        let (status, kind, message) = self.load_error();
                        let error = json!({"error": {"message": message, "type": kind, "param": null, "code": status.as_u16()}});
                        if send(openai::sse_event(&error)).await {
                            let _ = send(SSE_DONE.to_string()).await;
                        }
                        return;
                    }
                    if !send(openai::sse_event(&self.meta.finish_chunk(reason.as_str()))).await {
                        return;
                    }
                    if self.request.include_usage {
                        let usage = Usage {
                            prompt_tokens: prompt_tokens as usize,
                            completion_tokens: output_tokens as usize,
                            cached_tokens: cached_tokens as usize,
                        };
                        if !send(openai::sse_event(&self.meta.usage_chunk(usage))).await {
                            return;
                        }
                    }
                    let _ = send(SSE_DONE.to_string()).await;
                    return;
                }
            };
            if !send(openai::sse_event(&token)).await {
                return;
            }
            sent += 1;
            if self.drop_mid_stream && sent >= self.drop_after() {
                let _ = tx.send(Err(dropped())).await;
                return;
            }
        }
        // The driver stopped (shutdown) before the request finished: end the stream with an error
        // event, as vLLM does when its engine dies, rather than leaving the client hanging.
        let error = json!({"error": {"message": "replica is shutting down", "type": "ServiceUnavailableError", "code": 503}});
        let _ = send(openai::sse_event(&error)).await;
    }
}

/// A listener whose port closes while the replica is `down` (connections are refused, as with a
/// dead process) and reopens on the same address when it is up again.
struct DownableListener {
    addr: SocketAddr,
    listener: Option<TcpListener>,
    down: watch::Receiver<bool>,
}

impl DownableListener {
    fn new(listener: TcpListener, down: watch::Receiver<bool>) -> std::io::Result<Self> {
        Ok(Self { addr: listener.local_addr()?, listener: Some(listener), down })
    }
}

impl axum::serve::Listener for DownableListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            if *self.down.borrow_and_update() {
                self.listener = None;
                // Wait for "up"; a closed watch (replica gone) leaves the port closed for good.
                if self.down.wait_for(|down| !down).await.is_err() {
                    std::future::pending::<()>().await;
                }
                continue;
            }
            let Some(listener) = &self.listener else {
                match TcpListener::bind(self.addr).await {
                    Ok(listener) => self.listener = Some(listener),
                    Err(error) => {
                        tracing::warn!(%error, addr = %self.addr, "cannot reopen the replica's port; retrying");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                continue;
            };
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(connection) => {
                        // As vLLM's server does: streamed tokens go out without waiting for ACKs.
                        let _ = connection.0.set_nodelay(true);
                        return connection;
                    }
                    Err(error) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::debug!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Ok(()) = self.down.changed() => {}
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}
