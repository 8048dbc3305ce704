//! Misbehaving and telling endpoints: metrics that are garbage or silent, replicas that fail, go silent,
//! report their connections or answer only when told, and nothing at all.
//!
//! These are fakes because no real engine misbehaves on demand; each one stands for a
//! failure an operator meets in practice (a proxy's HTML error page, a hung process, a
//! replica that went away).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::routing::{get, post};
use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::loopback_listener;

/// An HTTP endpoint serving until dropped.
pub struct Endpoint {
    pub addr: SocketAddr,
    _stop: DropGuard,
}

impl Endpoint {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Serves `router` on a free loopback port until the endpoint is dropped (handlers may read the client's
/// address with `ConnectInfo<SocketAddr>`).
pub async fn serve(router: Router) -> Result<Endpoint> {
    let listener = loopback_listener().await?;
    let addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(async move { token.cancelled().await })
            .await
    });
    Ok(Endpoint { addr, _stop: stop.drop_guard() })
}

/// `/metrics` answers 200 with text that is not a Prometheus exposition.
pub async fn garbage_metrics() -> Result<Endpoint> {
    serve(Router::new().route("/metrics", get(|| async { "<html>502 Bad Gateway</html>\n{not: metrics}" })))
        .await
}

/// `/metrics` accepts the connection and never answers.
pub async fn silent_metrics() -> Result<Endpoint> {
    serve(Router::new().route("/metrics", get(std::future::pending::<String>))).await
}

/// A URL on which nothing listens (the port was bound once, then released).
pub async fn unreachable_url() -> Result<String> {
    let listener = loopback_listener().await?;
    let addr = listener.local_addr()?;
    drop(listener);
    Ok(format!("http://{addr}"))
}

/// A replica that fails every generation with 500 before its first byte but passes health checks
/// (fleet-sim's `error_rate` fault does the same, but only with a probability).
pub async fn failing_replica() -> Result<Endpoint> {
    let crashed = || async { (StatusCode::INTERNAL_SERVER_ERROR, "engine crashed") };
    serve(
        Router::new()
            .route("/v1/completions", post(crashed))
            .route("/v1/chat/completions", post(crashed))
            .route("/health", get(|| async { StatusCode::OK })),
    )
    .await
}

/// A replica that goes silent: `/v1/completions` never answers, `/v1/chat/completions` sends one SSE
/// event and then nothing (fleet-sim's faults delay answers, but never hang forever).
pub async fn silent_replica() -> Result<Endpoint> {
    let first = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n";
    let one_event_then_silence = move || async move {
        let events = futures_util::stream::once(async move { Ok::<_, std::io::Error>(first) })
            .chain(futures_util::stream::pending());
        ([("content-type", "text/event-stream")], axum::body::Body::from_stream(events))
    };
    serve(
        Router::new()
            .route("/v1/completions", post(std::future::pending::<StatusCode>))
            .route("/v1/chat/completions", post(one_event_then_silence))
            .route("/health", get(|| async { StatusCode::OK })),
    )
    .await
}

/// A replica that notes the client address (so the connection) of every generation request it serves:
/// `/v1/completions` answers a sized JSON body, `/v1/chat/completions` a chunked SSE stream. A fake because
/// no engine reports which connection carried a request.
pub struct PeerRecordingReplica {
    pub endpoint: Endpoint,
    peers: Arc<Mutex<HashSet<SocketAddr>>>,
}

impl PeerRecordingReplica {
    /// Distinct connections that have carried a generation request so far.
    pub fn connections(&self) -> usize {
        self.peers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }
}

/// Starts a [`PeerRecordingReplica`] on a free loopback port.
pub async fn peer_recording_replica() -> Result<PeerRecordingReplica> {
    let peers: Arc<Mutex<HashSet<SocketAddr>>> = Arc::default();
    let (for_completions, for_chat) = (peers.clone(), peers.clone());
    let completion = move |ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
        for_completions.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(peer);
        axum::Json(serde_json::json!({
            "object": "text_completion",
            "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }))
    };
    let stream = move |ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
        for_chat.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(peer);
        let events = [
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
            "data: [DONE]\n\n",
        ];
        let body = futures_util::stream::iter(events.map(Ok::<_, std::io::Error>));
        ([("content-type", "text/event-stream")], axum::body::Body::from_stream(body))
    };
    let endpoint = serve(
        Router::new()
            .route("/v1/completions", post(completion))
            .route("/v1/chat/completions", post(stream))
            .route("/health", get(|| async { StatusCode::OK })),
    )
    .await?;
    Ok(PeerRecordingReplica { endpoint, peers })
}

/// A replica whose `/v1/completions` holds every request until the test opens its gate, so a test can
/// act while a request is in flight without guessing how long that lasts. A fake because no engine
/// holds an answer on demand.
pub struct GatedReplica {
    pub endpoint: Endpoint,
    arrived: Arc<Notify>,
    gate: Arc<Notify>,
}

impl GatedReplica {
    /// Resolves once a request is waiting at the gate (or has already waited there).
    pub async fn arrived(&self) {
        self.arrived.notified().await;
    }

    /// Lets one waiting (or the next) request through; it is answered with a sized JSON completion.
    pub fn open(&self) {
        self.gate.notify_one();
    }
}

/// Starts a [`GatedReplica`] on a free loopback port.
pub async fn gated_replica() -> Result<GatedReplica> {
    let (arrived, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (on_arrival, at_gate) = (arrived.clone(), gate.clone());
    let completion = move || async move {
        on_arrival.notify_one();
        at_gate.notified().await;
        axum::Json(serde_json::json!({
            "object": "text_completion",
            "choices": [{"index": 0, "text": "after the gate", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
        }))
    };
    let endpoint = serve(
        Router::new()
            .route("/v1/completions", post(completion))
            .route("/health", get(|| async { StatusCode::OK })),
    )
    .await?;
    Ok(GatedReplica { endpoint, arrived, gate })
}

/// A replica that serves completions of any model and refuses a request body over `max_body` bytes with a
/// 400, as an engine refuses a prompt longer than its context. Its `/v1/models` answers 404, so a router
/// never learns its model (it serves the unknown group, which takes any model name). A fake because no
/// engine's context limit can be set that low, nor its model list turned off.
pub async fn refusing_replica(max_body: usize) -> Result<Endpoint> {
    let completion = move |body: axum::body::Bytes| async move {
        if body.len() > max_body {
            let error = r#"{"error":{"message":"the prompt is longer than the model's context","type":"BadRequestError","code":400}}"#;
            return (StatusCode::BAD_REQUEST, [("content-type", "application/json")], error);
        }
        let answer = r#"{"choices":[{"text":" ok","finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}"#;
        (StatusCode::OK, [("content-type", "application/json")], answer)
    };
    serve(
        Router::new()
            .route("/v1/completions", post(completion))
            .route("/v1/chat/completions", post(completion))
            .route("/v1/models", get(|| async { StatusCode::NOT_FOUND }))
            .route("/health", get(|| async { StatusCode::OK }))
            .layer(axum::extract::DefaultBodyLimit::disable()),
    )
    .await
}

/// What a [`MetricsReplica`]'s `/metrics` does.
#[derive(Clone, Debug, PartialEq)]
pub enum MetricsMode {
    /// vLLM's load gauges with these figures.
    Load { waiting: u32, running: u32, kv_usage: f64 },
    /// Accepts the request and never answers (a hung exporter).
    Silent,
    /// Answers 200 with this body, whatever it is (garbage, or more than a reader should take).
    Body(String),
}

/// A replica that answers generations at once and whose `/metrics` the test sets ([`MetricsMode`]):
/// figures of its choosing, silence, or any body. A fake because no engine's exporter hangs, lies or
/// floods on demand.
pub struct MetricsReplica {
    pub endpoint: Endpoint,
    mode: Arc<Mutex<MetricsMode>>,
    scrapes: Arc<std::sync::atomic::AtomicU64>,
}

impl MetricsReplica {
    pub fn url(&self) -> String {
        self.endpoint.url()
    }

    /// Changes what `/metrics` does from the next scrape on.
    pub fn set(&self, mode: MetricsMode) {
        *self.mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = mode;
    }

    /// `/metrics` requests received so far.
    pub fn scrapes(&self) -> u64 {
        self.scrapes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// vLLM V1's load gauges (the names fleet-telemetry's vLLM table reads) for `model`.
pub fn vllm_load_text(model: &str, waiting: u32, running: u32, kv_usage: f64) -> String {
    format!(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"{model}\"}} {running}\n\
         # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"{model}\"}} {waiting}\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"{model}\"}} {kv_usage}\n"
    )
}

/// Starts a [`MetricsReplica`] serving `model` on a free loopback port.
pub async fn metrics_replica(model: &str, mode: MetricsMode) -> Result<MetricsReplica> {
    let mode = Arc::new(Mutex::new(mode));
    let scrapes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (for_metrics, counter, name) = (mode.clone(), scrapes.clone(), model.to_owned());
    let metrics = move || {
        let (mode, counter, name) = (for_metrics.clone(), counter.clone(), name.clone());
        async move {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let current = mode.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            match current {
                MetricsMode::Load { waiting, running, kv_usage } => {
                    vllm_load_text(&name, waiting, running, kv_usage)
                }
                MetricsMode::Silent => std::future::pending().await,
                MetricsMode::Body(body) => body,
            }
        }
    };
    let models = serde_json::json!({"object": "list", "data": [{"id": model, "object": "model"}]});
    let answer = r#"{"id":"fake","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
    let completion = move || async move { (StatusCode::OK, [("content-type", "application/json")], answer) };
    let endpoint = serve(
        Router::new()
            .route("/metrics", get(metrics))
            .route("/v1/models", get(move || async move { axum::Json(models) }))
            .route("/v1/chat/completions", post(completion))
            .route("/v1/completions", post(completion))
            .route("/health", get(|| async { StatusCode::OK })),
    )
    .await?;
    Ok(MetricsReplica { endpoint, mode, scrapes })
}
