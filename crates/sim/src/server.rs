//! HTTP face of an emulated replica: vLLM's OpenAI routes, `/health` and `/metrics`.
//!
//! The model ([`crate::model`]) decides; this module waits out the computed durations on
//! the tokio clock and streams tokens. Each replica is its own server on its own listener,
//! as each vLLM instance is.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::exposition::{ReplicaMetrics, render_vllm};
use crate::model::{self, Admission, ModelConfig, PrefixCache};
use crate::openai::{self, Api, GenerationRequest, ResponseMeta, SSE_DONE, Usage};

/// Largest request body a replica accepts (vLLM itself has no small limit; this keeps the
/// emulator safe from runaway clients).
const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// One emulated replica: its model state and counters.
#[derive(Debug)]
pub struct Replica {
    model_name: String,
    config: ModelConfig,
    slots: Arc<Semaphore>,
    state: Mutex<ReplicaState>,
}

#[derive(Debug)]
struct ReplicaState {
    cache: PrefixCache,
    metrics: ReplicaMetrics,
    held_blocks: usize,
    next_request_id: u64,
}

impl Replica {
    pub fn new(model_name: impl Into<String>, config: ModelConfig) -> Arc<Self> {
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        Arc::new(Self {
            model_name: model_name.into(),
            slots: Arc::new(Semaphore::new(config.max_num_seqs)),
            state: Mutex::new(ReplicaState {
                cache: PrefixCache::new(config.capacity_blocks),
                metrics: ReplicaMetrics::new(created),
                held_blocks: 0,
                next_request_id: 0,
            }),
            config,
        })
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    fn state(&self) -> MutexGuard<'_, ReplicaState> {
        // A panic while holding the lock cannot leave the counters half-updated in a way
        // worth refusing service for, so a poisoned lock is simply taken over.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A copy of the current counters (what `/metrics` renders).
    pub fn metrics(&self) -> ReplicaMetrics {
        self.state().metrics.clone()
    }

    fn kv_usage(&self, held_blocks: usize) -> f64 {
        (held_blocks as f64 / self.config.capacity_blocks.max(1) as f64).min(1.0)
    }
}

/// A request's batch slot: keeps the running/KV gauges true however the request ends
/// (finished, client gone, error) and frees the slot on drop.
struct RunningGuard {
    replica: Arc<Replica>,
    held_blocks: usize,
    _slot: OwnedSemaphorePermit,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        let mut state = self.replica.state();
        state.metrics.running -= 1;
        state.held_blocks -= self.held_blocks;
        state.metrics.kv_usage = self.replica.kv_usage(state.held_blocks);
    }
}

/// Serves `replica` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    replica: Arc<Replica>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(replica)).with_graceful_shutdown(shutdown).await
}

/// The replica's routes, for embedding or testing without a socket.
pub fn router(replica: Arc<Replica>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(replica)
}

async fn metrics(State(replica): State<Arc<Replica>>) -> Response {
    let text = render_vllm(&replica.metrics(), &replica.model_name);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn models(State(replica): State<Arc<Replica>>) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{"id": replica.model_name, "object": "model", "created": 0, "owned_by": "fleet-sim", "max_model_len": 32768}],
    }))
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
    if let Some(model) = request.model.as_deref().filter(|m| *m != replica.model_name) {
        let body = json!({"error": {
            "message": format!("The model `{model}` does not exist. This replica serves `{}`.", replica.model_name),
            "type": "NotFoundError", "param": "model", "code": 404,
        }});
        return (StatusCode::NOT_FOUND, Json(body)).into_response();
    }
    let arrival = Instant::now();
    let Some((admission, request_id, guard)) = admit(&replica, &request).await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "replica is shutting down").into_response();
    };
    let meta = ResponseMeta {
        id: format!("cmpl-{request_id}"),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        model: replica.model_name.clone(),
        api,
    };
    let run = Run { replica, request, admission, meta, arrival, _guard: guard };
    if run.request.stream {
        let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(32);
        tokio::spawn(run.stream(tx));
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from_stream(ReceiverStream::new(rx)))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
    } else {
        Json(run.complete().await).into_response()
    }
}

/// Waits for a batch slot (counted as waiting meanwhile), then admits against the cache.
async fn admit(
    replica: &Arc<Replica>,
    request: &GenerationRequest,
) -> Option<(Admission, u64, RunningGuard)> {
    replica.state().metrics.waiting += 1;
    let slot = replica.slots.clone().acquire_owned().await;
    let mut state = replica.state();
    state.metrics.waiting -= 1;
    let slot = slot.ok()?;
    let admission = model::admit(&replica.config, &mut state.cache, &request.prompt, request.max_tokens);
    state.next_request_id += 1;
    state.metrics.running += 1;
    state.held_blocks += admission.held_blocks;
    state.metrics.kv_usage = replica.kv_usage(state.held_blocks);
    state.metrics.prefix_queries_tokens += admission.prompt_tokens as u64;
    state.metrics.prefix_hits_tokens += admission.cached_tokens as u64;
    state.metrics.prompt_tokens += admission.prompt_tokens as u64;
    let request_id = state.next_request_id;
    drop(state);
    Some((
        admission,
        request_id,
        RunningGuard { replica: replica.clone(), held_blocks: admission.held_blocks, _slot: slot },
    ))
}

/// One admitted request being executed.
struct Run {
    replica: Arc<Replica>,
    request: GenerationRequest,
    admission: Admission,
    meta: ResponseMeta,
    arrival: Instant,
    _guard: RunningGuard,
}

impl Run {
    fn usage(&self, completion_tokens: usize) -> Usage {
        Usage {
            prompt_tokens: self.admission.prompt_tokens,
            completion_tokens,
            cached_tokens: self.admission.cached_tokens,
        }
    }

    /// Waits out the prefill, then records the TTFT as vLLM does (arrival to first token).
    async fn prefill(&self) {
        tokio::time::sleep(model::prefill_time(&self.replica.config, &self.admission)).await;
        let ttft = self.arrival.elapsed().as_secs_f64();
        self.replica.state().metrics.ttft.observe(ttft);
    }

    /// Waits one decode step at the current batch size and counts the token it produced.
    async fn decode_step(&self) {
        let running = self.replica.state().metrics.running;
        tokio::time::sleep(model::decode_step_time(&self.replica.config, running)).await;
        self.count_token();
    }

    fn count_token(&self) {
        self.replica.state().metrics.generation_tokens += 1;
    }

    async fn complete(self) -> serde_json::Value {
        let tokens = model::output_tokens(&self.request.prompt, self.request.max_tokens);
        self.prefill().await;
        self.count_token();
        for _ in 1..tokens.len() {
            self.decode_step().await;
        }
        self.meta.full_response(&tokens.concat(), "length", self.usage(tokens.len()))
    }

    /// Streams one SSE event per token; stops early (freeing the slot) if the client goes.
    async fn stream(self, tx: mpsc::Sender<Result<Bytes, Infallible>>) {
        let tokens = model::output_tokens(&self.request.prompt, self.request.max_tokens);
        let send = |text: String| {
            let tx = tx.clone();
            async move { tx.send(Ok(Bytes::from(text))).await.is_ok() }
        };
        self.prefill().await;
        for (i, token) in tokens.iter().enumerate() {
            if i == 0 {
                self.count_token();
            } else {
                self.decode_step().await;
            }
            if !send(openai::sse_event(&self.meta.token_chunk(token, i == 0))).await {
                return;
            }
        }
        if !send(openai::sse_event(&self.meta.finish_chunk("length"))).await {
            return;
        }
        if self.request.include_usage {
            let _ = send(openai::sse_event(&self.meta.usage_chunk(self.usage(tokens.len())))).await;
        }
        let _ = send(SSE_DONE.to_string()).await;
    }
}
