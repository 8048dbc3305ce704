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
//! The loop serves any hyper service with the refusals of a [`Refusals`] (the fleetdeck app's headless server
//! runs on it too, with its own words): connections over the cap are answered at once and closed, and the
//! answers hyper makes itself to a request it cannot parse (400, 414, 431), which no route sees, can carry a
//! header (fleet-router's request id) added on their way out ([`Stamped`]).
//!
//! Shutdown (mini-redis's pattern): when `shutdown` fires the loop stops accepting, each connection
//! finishes the request in flight and closes, and [`serve`] returns once the last one has (every
//! connection task holds a sender of a channel whose receiver waits for them all to be dropped).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use std::task::{Context, Poll};

use axum::Router;
use axum::http::{HeaderName, HeaderValue, Method, Request};
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::AbortHandle;
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

/// What the serve loop needs of the program it serves besides its service: the refusals it makes before any
/// route runs, in that program's words.
pub trait Refusals: Send + Sync + 'static {
    /// The whole HTTP/1.1 answer to a client over the connection cap, written straight to its socket (hyper
    /// never runs for it, so an over-the-cap client costs one small write and a close). Also counts it.
    fn over_capacity(&self) -> Vec<u8>;

    /// A header to add to the answers hyper makes itself (a request it cannot parse: 400, 414, 431), which no
    /// route sees; `None` adds nothing.
    fn stamp_header(&self) -> Option<HeaderName> {
        None
    }

    /// The value of [`Refusals::stamp_header`] for one answer hyper made itself; asked only for an answer that
    /// is stamped (fleet-router draws a request id for each).
    fn stamp_value(&self) -> HeaderValue {
        HeaderValue::from_static("")
    }
}

/// An HTTP/1.1 503 answer with a JSON body, closing the connection: the shape of an over-the-cap refusal.
pub fn over_capacity_answer(json: &str, extra_headers: &[(HeaderName, HeaderValue)]) -> Vec<u8> {
    let mut head = String::from(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n",
    );
    for (name, value) in extra_headers {
        head.push_str(&format!("{name}: {}\r\n", value.to_str().unwrap_or_default()));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n{json}", json.len()));
    head.into_bytes()
}

/// fleet-router's refusals: counted in `/metrics`, each with its request id.
struct RouterRefusals(Arc<RouterState>);

impl Refusals for RouterRefusals {
    fn over_capacity(&self) -> Vec<u8> {
        self.0.metrics.count_refusal(Refusal::ConnectionLimit);
        let body = r#"{"error":{"message":"fleet-router is at its connection limit (--max-connections); retry later","type":"router_error","param":null,"code":503}}"#;
        let id = HeaderValue::from(self.0.next_request_id());
        over_capacity_answer(body, &[(crate::proxy::REQUEST_ID_HEADER, id)])
    }

    fn stamp_header(&self) -> Option<HeaderName> {
        Some(crate::proxy::REQUEST_ID_HEADER)
    }

    fn stamp_value(&self) -> HeaderValue {
        HeaderValue::from(self.0.next_request_id())
    }
}

/// A client connection that adds the [`Refusals::stamp_header`] header to the answers hyper writes itself.
///
/// hyper answers a request it cannot parse with a bare head (`HTTP/1.1 400 Bad Request`, `414`, `431`, a
/// `content-length: 0`, a date) and closes the connection; no service runs, so nothing else can add a header
/// to it. This recognises such a head as it is written (an error status of those three, a head that ends the
/// write and does not carry the header already, as every answer of a route does) and writes it with the
/// header after its status line. Other writes pass through untouched: one length check and a byte compare.
/// A route's answer of those statuses (a relayed 400) is told apart by the header, which routes put first
/// so that the check stops at the first line.
pub struct Stamped<IO> {
    io: IO,
    /// The header to stamp and who gives its values; `None` stamps nothing.
    stamp: Option<(HeaderName, Arc<dyn Refusals>)>,
    /// A stamped head being written: its bytes, how many are written, and the length the caller wrote.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<IO> Stamped<IO> {
    /// `io`, stamping hyper's own answers with `refusals`' header (none when it has none).
    pub fn new(io: IO, refusals: &Arc<dyn Refusals>) -> Self {
        let stamp = refusals.stamp_header().map(|name| (name, refusals.clone()));
        Self { io, stamp, pending: None }
    }
}

/// Whether `buf` may be the whole head of an answer hyper made itself: a status hyper answers itself, and
/// nothing after the head. (Whether it lacks the header is asked next, of these few only.)
fn own_error_head(buf: &[u8]) -> bool {
    const STATUSES: [&[u8]; 3] = [b"400 ", b"414 ", b"431 "];
    buf.len() < 1024
        && buf.starts_with(b"HTTP/1.")
        && buf.get(9..13).is_some_and(|status| STATUSES.contains(&status))
        && buf.ends_with(b"\r\n\r\n")
}

/// Whether the head `buf` carries a header called `name` (names are case-insensitive): a line that starts
/// with the name followed by its colon, so a longer name that begins with it does not count. Compares at
/// line starts only: a window compare at every byte cost 1,200 instructions per 400 answer relayed
/// (callgrind).
fn has_header(buf: &[u8], name: &HeaderName) -> bool {
    let name = name.as_str().as_bytes();
    memchr::memchr_iter(b'\n', buf).any(|at| {
        buf.get(at + 1..at + 2 + name.len())
            .is_some_and(|line| line[..name.len()].eq_ignore_ascii_case(name) && line[name.len()] == b':')
    })
}

impl<IO: AsyncWrite + Unpin> Stamped<IO> {
    /// Writes the pending stamped head; `Ready(Ok(n))` with the caller's length once all of it is out.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        while let Some((bytes, written, reported)) = &mut self.pending {
            match Pin::new(&mut self.io).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => {
                    self.pending = None;
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => {
                    *written += n;
                    if *written == bytes.len() {
                        let reported = *reported;
                        self.pending = None;
                        return Poll::Ready(Ok(reported));
                    }
                }
                Poll::Ready(Err(error)) => {
                    self.pending = None;
                    return Poll::Ready(Err(error));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(0))
    }

    /// Starts writing `buf` stamped, if it is one of hyper's own answers; `None` when it is not.
    fn try_stamp(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Option<Poll<std::io::Result<usize>>> {
        let (name, refusals) = self.stamp.as_ref()?;
        if !own_error_head(buf) || has_header(buf, name) {
            return None;
        }
        let value = refusals.stamp_value();
        let line_end = buf.windows(2).position(|w| w == b"\r\n")? + 2;
        let mut stamped = Vec::with_capacity(buf.len() + 64);
        stamped.extend_from_slice(&buf[..line_end]);
        stamped.extend_from_slice(name.as_str().as_bytes());
        stamped.extend_from_slice(b": ");
        stamped.extend_from_slice(value.as_bytes());
        stamped.extend_from_slice(b"\r\n");
        stamped.extend_from_slice(&buf[line_end..]);
        self.pending = Some((stamped, 0, buf.len()));
        Some(self.poll_pending(cx))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Stamped<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Stamped<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.is_some() {
            return this.poll_pending(cx);
        }
        if let Some(stamped) = this.try_stamp(cx, buf) {
            return stamped;
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.is_some() {
            return this.poll_pending(cx);
        }
        // A head hyper made itself is its own slice (and the only one: such an answer has no body).
        if let Some(first) = bufs.iter().find(|b| !b.is_empty())
            && let Some(stamped) = this.try_stamp(cx, first)
        {
            return stamped;
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.pending.is_some()
            && let Poll::Pending = this.poll_pending(cx)
        {
            return Poll::Pending;
        }
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.pending.is_some()
            && let Poll::Pending = this.poll_pending(cx)
        {
            return Poll::Pending;
        }
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

/// How long a write of [`over_capacity_answer`] may take before the connection is dropped unanswered.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an over-the-cap connection may take to send its request before it is answered anyway: the answer
/// waits for the request because an HTTP client that reads an answer before it has written its request calls
/// the connection broken (hyper: "received unexpected message") instead of reading a refusal.
const REFUSAL_REQUEST_WAIT: Duration = Duration::from_secs(1);
/// How long a refused client may take to close after its answer; reading until then keeps the request's
/// unread bytes from turning the close into a reset, which can discard the answer before the client reads it.
const REFUSAL_DRAIN: Duration = Duration::from_millis(500);
/// How many over-the-cap connections may be in the middle of their refusal at once. When one more arrives,
/// the oldest is closed unanswered: a flood of idle sockets then costs at most this many descriptors beyond
/// the cap, and the newest client (most likely a real one, behind the flood) is still answered.
const REFUSALS_IN_PROGRESS: usize = 16;

/// Answers one over-the-cap connection: waits (briefly) for its request, writes `answer`, half-closes, and
/// reads until the client closes. Every step is bounded; the connection is dropped at the end regardless.
async fn refuse<Io>(mut io: Io, answer: Vec<u8>)
where
    Io: AsyncRead + AsyncWrite + Unpin,
{
    let mut request = vec![0; 4096];
    let _ = tokio::time::timeout(REFUSAL_REQUEST_WAIT, io.read(&mut request)).await;
    let written = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, async {
        io.write_all(&answer).await?;
        io.shutdown().await
    })
    .await;
    if matches!(written, Ok(Ok(()))) {
        let _ =
            tokio::time::timeout(REFUSAL_DRAIN, async { while let Ok(1..) = io.read(&mut request).await {} })
                .await;
    }
}

/// Serves fleet-router's `routes` on `listener` until `shutdown` is cancelled and every open connection has
/// closed, or the shutdown grace has passed and the rest have been cut off.
pub async fn serve<L>(listener: L, routes: Routes, deadlines: Deadlines, shutdown: CancellationToken)
where
    L: axum::serve::Listener,
{
    let refusals: Arc<dyn Refusals> = Arc::new(RouterRefusals(routes.state.clone()));
    serve_with(listener, routes, refusals, deadlines, shutdown).await;
}

/// Serves an axum `app` on `listener` with [`serve_with`]: how the fleetdeck app's headless server runs.
pub async fn serve_router<L>(
    listener: L,
    app: Router,
    refusals: Arc<dyn Refusals>,
    deadlines: Deadlines,
    shutdown: CancellationToken,
) where
    L: axum::serve::Listener,
{
    serve_with(listener, TowerToHyperService::new(app), refusals, deadlines, shutdown).await;
}

/// Serves any `service` on `listener` the way fleet-router serves its routes: headers within the header
/// read timeout, at most `max_connections` at once (the rest answered by `refusals`), graceful shutdown.
pub async fn serve_with<L, S>(
    mut listener: L,
    service: S,
    refusals: Arc<dyn Refusals>,
    deadlines: Deadlines,
    shutdown: CancellationToken,
) where
    L: axum::serve::Listener,
    S: hyper::service::Service<Request<Incoming>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(deadlines.header_read);
    let (connection_open, mut all_closed) = mpsc::channel::<()>(1);
    let slots = Arc::new(Semaphore::new(deadlines.max_connections));
    // Fired when the grace is over: the connections still open are dropped, mid-answer or not.
    let cut_off = CancellationToken::new();
    // The refusals under way, oldest first (at most `REFUSALS_IN_PROGRESS`).
    let mut refusing = VecDeque::<AbortHandle>::new();
    loop {
        // `Listener::accept` retries failed accepts itself (with a pause when out of file descriptors).
        let (io, _peer) = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refusing.retain(|refusal| !refusal.is_finished());
            if refusing.len() >= REFUSALS_IN_PROGRESS
                && let Some(oldest) = refusing.pop_front()
            {
                oldest.abort();
            }
            refusing.push_back(tokio::spawn(refuse(io, refusals.over_capacity())).abort_handle());
            continue;
        };
        let connection = http.serve_connection(TokioIo::new(Stamped::new(io, &refusals)), service.clone());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_is_found_at_a_line_start_in_any_case_only() {
        let name = HeaderName::from_static("x-fleet-request-id");
        let head = b"HTTP/1.1 400 Bad Request\r\nX-Fleet-Request-Id: 7\r\ncontent-length: 0\r\n\r\n";
        assert!(has_header(head, &name));
        assert!(!has_header(b"HTTP/1.1 400 Bad Request\r\nvia: x-fleet-request-id\r\n\r\n", &name));
        assert!(!has_header(b"HTTP/1.1 400 Bad Request\r\nx-fleet-request\r\n", &name));
        // A longer name that starts with this one is another header.
        assert!(!has_header(b"HTTP/1.1 400 Bad Request\r\nx-fleet-request-idx: 1\r\n\r\n", &name));
        assert!(!has_header(b"HTTP/1.1 400 Bad Request\r\nx-fleet-request-id", &name));
        assert!(!has_header(b"", &name));
    }
}
