//! The proxy server: OpenAI routes in, one replica picked, the answer streamed back.
//!
//! Bodies of requests are read whole (they are small and the policy needs the prompt);
//! bodies of responses are never buffered: each upstream chunk is written to the client as
//! it arrives, so SSE tokens keep their timing. A replica that cannot be reached before it
//! answers is skipped for the next one; a stream that breaks after it started ends with an
//! SSE error event, so a client never hangs on a dead replica.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::{StreamExt, stream};
use serde_json::json;
use tokio::net::TcpListener;

use crate::upstream::{Balancer, Upstreams};

/// Response header naming the replica that served a request (for operators and tests).
pub const REPLICA_HEADER: &str = "x-fleet-replica";

/// How the router is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterConfig {
    /// Replica base URLs.
    pub replicas: Vec<String>,
    /// Time allowed to open a connection to a replica before trying the next one.
    pub connect_timeout: Duration,
    /// Longest silence tolerated from a replica while reading its answer.
    pub read_timeout: Duration,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            replicas: Vec::new(),
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(120),
            max_body_bytes: 16 * 1024 * 1024,
        }
    }
}

/// Shared state of the proxy handlers.
#[derive(Debug)]
pub struct Proxy {
    balancer: Balancer,
    client: reqwest::Client,
}

impl Proxy {
    pub fn new(config: &RouterConfig) -> reqwest::Result<Arc<Self>> {
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.read_timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(Arc::new(Self { balancer: Balancer::new(Upstreams::new(config.replicas.clone())), client }))
    }

    pub fn balancer(&self) -> &Balancer {
        &self.balancer
    }
}

/// Serves the proxy on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    config: RouterConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let proxy = Proxy::new(&config)?;
    axum::serve(listener, app(proxy, config.max_body_bytes)).with_graceful_shutdown(shutdown).await?;
    Ok(())
}

/// The router's routes.
pub fn app(proxy: Arc<Proxy>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(forward_chat))
        .route("/v1/completions", post(forward_completions))
        .route("/v1/models", get(forward_models))
        .route("/health", get(|| async { StatusCode::OK }))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(proxy)
}

async fn forward_chat(State(proxy): State<Arc<Proxy>>, headers: HeaderMap, body: Bytes) -> Response {
    forward(&proxy, Method::POST, "/v1/chat/completions", &headers, body).await
}

async fn forward_completions(State(proxy): State<Arc<Proxy>>, headers: HeaderMap, body: Bytes) -> Response {
    forward(&proxy, Method::POST, "/v1/completions", &headers, body).await
}

async fn forward_models(State(proxy): State<Arc<Proxy>>, headers: HeaderMap) -> Response {
    forward(&proxy, Method::GET, "/v1/models", &headers, Bytes::new()).await
}

/// Tries the planned replicas in order until one answers, then streams its response.
async fn forward(proxy: &Proxy, method: Method, path: &str, headers: &HeaderMap, body: Bytes) -> Response {
    let snapshot = proxy.balancer.snapshot();
    let plan = proxy.balancer.plan(&snapshot);
    if plan.is_empty() {
        return openai_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the router has no replicas configured; add one with --replica URL",
        );
    }
    let mut last_error = String::new();
    for index in plan {
        let replica = &snapshot.replicas[index];
        let mut request = proxy.client.request(method.clone(), format!("{replica}{path}")).body(body.clone());
        for name in [header::CONTENT_TYPE, header::AUTHORIZATION, header::ACCEPT] {
            if let Some(value) = headers.get(&name) {
                request = request.header(name, value);
            }
        }
        match request.send().await {
            Ok(upstream) if upstream.status().is_server_error() => {
                last_error = format!("{replica} answered {}", upstream.status());
            }
            Ok(upstream) => return relay(replica, upstream),
            Err(error) => {
                last_error = format!("{replica} unreachable: {error}");
                tracing::warn!(replica, %error, "replica unreachable, trying the next one");
            }
        }
    }
    openai_error(
        StatusCode::BAD_GATEWAY,
        &format!("no replica could serve the request; last error: {last_error}"),
    )
}

/// Streams an upstream response to the client chunk by chunk.
fn relay(replica: &str, upstream: reqwest::Response) -> Response {
    let status = upstream.status();
    let content_type = upstream.headers().get(header::CONTENT_TYPE).cloned();
    let is_sse = content_type.as_ref().is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let upstream_stream = upstream.bytes_stream();
    // After an upstream error, emit one error event (for SSE) and end the stream.
    let body = stream::unfold(Some(upstream_stream), move |state| async move {
        let mut upstream_stream = state?;
        match upstream_stream.next().await {
            Some(Ok(chunk)) => Some((Ok::<Bytes, std::io::Error>(chunk), Some(upstream_stream))),
            Some(Err(error)) if is_sse => {
                let event = json!({"error": {"message": format!("replica stream failed: {error}"), "type": "upstream_error"}});
                Some((Ok(Bytes::from(format!("data: {event}\n\n"))), None))
            }
            Some(Err(error)) => Some((Err(std::io::Error::other(error)), None)),
            None => None,
        }
    });
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = status;
    if let Some(content_type) = content_type {
        response.headers_mut().insert(header::CONTENT_TYPE, content_type);
    }
    if let Ok(value) = HeaderValue::from_str(replica) {
        response.headers_mut().insert(REPLICA_HEADER, value);
    }
    response
}

fn openai_error(status: StatusCode, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "router_error", "param": null, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}
