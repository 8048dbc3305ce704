//! Misbehaving metrics endpoints: garbage, silence, and nothing at all.
//!
//! These are fakes because no real engine misbehaves on demand; each one stands for a
//! failure an operator meets in practice (a proxy's HTML error page, a hung process, a
//! replica that went away).

use std::net::SocketAddr;

use anyhow::Result;
use axum::Router;
use axum::routing::get;
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

async fn serve(router: Router) -> Result<Endpoint> {
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
