//! The router's HTTP/1 server: accepts connections, drives each with hyper over the router's routes,
//! cuts off clients that are slow to send their headers, and shuts down gracefully.
//!
//! [`Routes`] is the service each connection runs: the two proxy routes go straight to
//! [`crate::proxy::handle`], everything else (admin API, `/metrics`, `/v1/models`, wrong methods)
//! through axum. The proxy routes are the hot path, and skipping axum's routing, extractor and
//! response layers there cut a proxied request from 46.4k to 43.2k user-space instructions
//! (callgrind), for a dispatch that is two string comparisons.
//!
//! Why not `axum::serve`: it drives every connection with hyper-util's automatic HTTP/1-or-2 builder and
//! no timer, so nothing bounds how long a client may take to send a request's headers; one that
//! trickles them (slowloris), or opens connections and sends nothing, holds them for ever. It also
//! sniffs every connection for the HTTP/2 preface, which the router (HTTP/1.1 to its clients) does not
//! need. Here each connection is hyper's HTTP/1 server with a header read timeout
//! ([`crate::RouterConfig::header_read_timeout`]).
//!
//! Shutdown (mini-redis's pattern): when `shutdown` fires the loop stops accepting, each connection
//! finishes the request in flight and closes, and [`serve`] returns once the last one has (every
//! connection task holds a sender of a channel whose receiver waits for them all to be dropped).

use std::convert::Infallible;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, Method, Request};
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::RouterState;
use crate::metrics::Refusal;
use crate::routing_key::Route;

/// The service every client connection runs: proxy routes directly, the rest through axum.
#[derive(Clone)]
pub struct Routes {
    state: Arc<RouterState>,
    app: TowerToHyperService<Router>,
}

impl Routes {
    /// `app` answers everything but `POST` to the two proxy routes.
    pub fn new(state: Arc<RouterState>, app: Router) -> Self {
        Self { state, app: TowerToHyperService::new(app) }
    }
}

/// The proxy route a request goes to, if it is a `POST` to one (as axum matches: the path alone,
/// without the query).
fn proxy_route<B>(request: &Request<B>) -> Option<Route> {
    if request.method() != Method::POST {
        return None;
    }
    match request.uri().path() {
        "/v1/completions" => Some(Route::Completions),
        "/v1/chat/completions" => Some(Route::Chat),
        _ => None,
    }
}

impl hyper::service::Service<Request<Incoming>> for Routes {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        match proxy_route(&request) {
            Some(route) => {
                let state = self.state.clone();
                Box::pin(async move { Ok(crate::proxy::handle(state, route, request).await) })
            }
            None => {
                // The admin API, /metrics, /v1/models and the 404s and 405s: their answers carry a request
                // id too, as the proxy's do.
                let request_id = self.state.next_request_id();
                let answer = hyper::service::Service::call(&self.app, request);
                Box::pin(async move {
                    let mut response = answer.await?;
                    response
                        .headers_mut()
                        .entry(crate::proxy::REQUEST_ID_HEADER)
                        .or_insert_with(|| HeaderValue::from(request_id));
                    Ok(response)
                })
            }
        }
    }
}

/// How the server treats its clients' time: the header read timeout, and how long a shutdown waits for
/// requests in flight.
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    /// See [`crate::RouterConfig::header_read_timeout`].
    pub header_read: Duration,
    /// See [`crate::RouterConfig::shutdown_grace`].
    pub shutdown_grace: Duration,
    /// See [`crate::RouterConfig::max_connections`].
    pub max_connections: usize,
}

/// The whole answer to a client over the connection cap, written straight to its socket: hyper never
/// runs for it, so an over-the-cap client costs one small write and a close.
fn over_capacity_answer(request_id: u64) -> Vec<u8> {
    let body = r#"{"error":{"message":"fleet-router is at its connection limit (--max-connections); retry later","type":"router_error","param":null,"code":503}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n\
         {}: {request_id}\r\ncontent-length: {}\r\n\r\n{body}",
        crate::proxy::REQUEST_ID_HEADER,
        body.len()
    )
    .into_bytes()
}

/// How long a write of [`over_capacity_answer`] may take before the connection is dropped unanswered.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Serves `routes` on `listener` until `shutdown` is cancelled and every open connection has closed, or
/// the shutdown grace has passed and the rest have been cut off.
pub async fn serve<L>(mut listener: L, routes: Routes, deadlines: Deadlines, shutdown: CancellationToken)
where
    L: axum::serve::Listener,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(deadlines.header_read);
    let (connection_open, mut all_closed) = mpsc::channel::<()>(1);
    let slots = Arc::new(Semaphore::new(deadlines.max_connections));
    // Fired when the grace is over: the connections still open are dropped, mid-answer or not.
    let cut_off = CancellationToken::new();
    loop {
        // `Listener::accept` retries failed accepts itself (with a pause when out of file descriptors).
        let (io, _peer) = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            routes.state.metrics.count_refusal(Refusal::ConnectionLimit);
            let answer = over_capacity_answer(routes.state.next_request_id());
            tokio::spawn(async move {
                let mut io = io;
                let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, async {
                    io.write_all(&answer).await?;
                    io.shutdown().await
                })
                .await;
            });
            continue;
        };
        let connection = http.serve_connection(TokioIo::new(io), routes.clone());
        // A child token per connection: each waits on its own notifier, not on one shared by all.
        let stop = shutdown.child_token();
        let cut_off = cut_off.clone();
        let open = connection_open.clone();
        tokio::spawn(async move {
            let mut connection = pin!(connection);
            // The connection first; the signal behind it is this connection's own token, one uncontended
            // check per wake-up. `cut_off` is only looked at once the shutdown has begun.
            let result = tokio::select! {
                biased;
                result = connection.as_mut() => result,
                () = stop.cancelled() => {
                    // Idle keep-alive connections close now; one with a request in flight after its answer.
                    connection.as_mut().graceful_shutdown();
                    tokio::select! {
                        result = connection.as_mut() => result,
                        () = cut_off.cancelled() => Ok(()),
                    }
                }
            };
            if let Err(error) = result {
                // Clients that go away or time out on their headers; nothing an operator acts on.
                tracing::debug!(%error, "client connection ended with an error");
            }
            drop((open, slot));
        });
    }
    drop(listener);
    drop(connection_open);
    // Every sender dropped: every connection has closed.
    tokio::select! {
        _ = all_closed.recv() => {}
        () = tokio::time::sleep(deadlines.shutdown_grace) => {
            tracing::warn!(
                grace = ?deadlines.shutdown_grace,
                "requests still in flight after the shutdown grace; closing their connections"
            );
            cut_off.cancel();
            let _ = all_closed.recv().await;
        }
    }
}
