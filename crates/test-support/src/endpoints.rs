//! Misbehaving endpoints: metrics that are garbage or silent, replicas that fail or go silent, and nothing at all.
//!
//! These are fakes because no real engine misbehaves on demand; each one stands for a
//! failure an operator meets in practice (a proxy's HTML error page, a hung process, a
//! replica that went away).

use std::net::SocketAddr;

use anyhow::Result;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use futures_util::StreamExt;
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

/// Serves `router` on a free loopback port until the endpoint is dropped.
pub async fn serve(router: Router) -> Result<Endpoint> {
    let listener = loopback_listener().await?;
    let addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, router).with_graceful_shutdown(async move { token.cancelled().await }).await
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
