//! The data plane's connections to replicas: a pool of HTTP/1 connections per replica, with the router's
//! connect and read timeouts.
//!
//! Why not a general-purpose client: a proxy needs none of reqwest's layers (redirects, cookies,
//! decompression, proxies), and they cost time on every request; reqwest 0.13 re-parses each response's
//! URL for its redirect support. hyper-util's pooled client was next: per request it hashes the
//! scheme and authority (SipHash) three times to find the pool, rewrites the URI and sets the `Host`
//! header, and wraps the connection in layers of futures. Measured with callgrind, replacing it cut the
//! router's user-space instructions per request from 62.5k to 49.1k. Here each [`Replica`](crate::state::Replica) owns its
//! [`ReplicaConnections`]: a short list of idle hyper HTTP/1 connections, its `Host` header built once,
//! and request paths that are constants.
//!
//! A connection goes back to its list when its response body has been read to the end (a body dropped
//! earlier means the client went away mid-answer: the connection cannot be reused and closes). A
//! connection the replica closed while idle hands the request back unsent, and it is sent on another.
//!
//! Timeouts: connecting has `connect_timeout` (then the proxy tries another replica); the response head
//! and then every body frame must come within `read_timeout` of the last one ([`TimedBody`]), so a
//! replica that goes silent ends the request with an error, never a hang. Both use one timer per request.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, Method, Request, Response, Uri, header};
use fleet_base::error::error_chain;
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::routing_key::Route;

/// Request headers passed on to the replica (the body's framing headers are the client's own).
const FORWARDED_HEADERS: [header::HeaderName; 3] =
    [header::CONTENT_TYPE, header::AUTHORIZATION, header::ACCEPT];

/// Idle connections kept per replica; more are closed when they come back.
const MAX_IDLE: usize = 512;

/// Why a replica did not answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The connection could not be opened.
    #[error("cannot connect to {address}: {source}")]
    Connect {
        /// `HOST:PORT` dialled.
        address: String,
        /// Why.
        source: std::io::Error,
    },
    /// Opening the connection took longer than the connect timeout.
    #[error("no connection to {address} within {} ms (the router's connect timeout)", .timeout.as_millis())]
    ConnectTimeout {
        /// `HOST:PORT` dialled.
        address: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The request could not be sent or its answer read (the connection broke).
    /// Shown with its causes: hyper's own messages are terse without their sources.
    #[error("{}", error_chain(.0))]
    Http(#[from] hyper::Error),
    /// Nothing arrived for the read timeout.
    #[error("no answer for {} ms (the router's read timeout)", .0.as_millis())]
    Silent(Duration),
}

/// How the router reaches one replica: connect, read and idle timeouts.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// Time allowed to open a connection.
    pub connect: Duration,
    /// Longest silence tolerated while waiting for the answer.
    pub read: Duration,
    /// A connection idle this long is closed, not reused (the replica may be about to close it).
    pub idle: Duration,
}

/// A replica's HTTP/1 connections: idle ones ready for a request, new ones opened on demand.
#[derive(Debug)]
pub struct ReplicaConnections {
    /// `HOST:PORT` to connect to.
    address: String,
    /// The `Host` header of every request.
    host: HeaderValue,
    /// Origin-form targets of `/v1/chat/completions` and `/v1/completions` (after the URL's path, if
    /// any), parsed once: cloning a `Uri` is a reference count.
    targets: [Uri; 2],
    idle: Arc<IdleConnections>,
    timeouts: Timeouts,
}

#[derive(Debug, Default)]
struct IdleConnections(Mutex<Vec<IdleConnection>>);

#[derive(Debug)]
struct IdleConnection {
    sender: SendRequest<Full<Bytes>>,
    since: Instant,
}

impl IdleConnection {
    /// Not worth keeping at `now`: the replica closed it, or it has been idle longer than `idle_timeout`.
    fn is_stale(&self, now: Instant, idle_timeout: Duration) -> bool {
        self.sender.is_closed() || now.saturating_duration_since(self.since) > idle_timeout
    }
}

impl IdleConnections {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<IdleConnection>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A connection ready for a request, if one is idle. Closed and stale ones are dropped on the way;
    /// one still finishing its last answer stays for later.
    fn take(&self, idle_timeout: Duration) -> Option<SendRequest<Full<Bytes>>> {
        let now = Instant::now();
        let mut idle = self.lock();
        let mut busy = Vec::new();
        let mut ready = None;
        while let Some(connection) = idle.pop() {
            if connection.is_stale(now, idle_timeout) {
                continue;
            }
            if connection.sender.is_ready() {
                ready = Some(connection.sender);
                break;
            }
            busy.push(connection);
        }
        idle.append(&mut busy);
        ready
    }

    fn give_back(&self, sender: SendRequest<Full<Bytes>>) {
        let mut idle = self.lock();
        if idle.len() < MAX_IDLE && !sender.is_closed() {
            idle.push(IdleConnection { sender, since: Instant::now() });
        }
    }

    /// Drops the connections the replica closed and those idle longer than `idle_timeout` at `now`;
    /// returns how many stay. Dropping the last sender of a connection closes it.
    fn close_stale(&self, now: Instant, idle_timeout: Duration) -> usize {
        let mut idle = self.lock();
        idle.retain(|connection| !connection.is_stale(now, idle_timeout));
        idle.len()
    }
}

impl ReplicaConnections {
    /// Connections to the replica at `base` (`http://HOST[:PORT]`), or why it cannot be reached.
    pub fn new(base: &str, timeouts: Timeouts) -> Result<Self, String> {
        let uri = Uri::try_from(base).map_err(|error| error.to_string())?;
        if uri.scheme_str() != Some("http") {
            return Err(
                "replicas are reached over plain http:// (put a TLS sidecar before one that only speaks https)"
                    .to_owned(),
            );
        }
        let authority = uri.authority().ok_or("it names no host")?;
        if authority.host().is_empty() {
            return Err("it names no host".to_owned());
        }
        if authority.as_str().rsplit_once(':').is_some_and(|(_, port)| !port.ends_with(']'))
            && authority.port_u16().is_none()
        {
            return Err("its port is not a number from 0 to 65535".to_owned());
        }
        if uri.query().is_some() {
            return Err("it has a query (?...); give the replica's base URL".to_owned());
        }
        let prefix = uri.path().trim_end_matches('/');
        let target = |path: &str| Uri::try_from(format!("{prefix}{path}")).map_err(|error| error.to_string());
        let port = authority.port_u16().unwrap_or(80);
        let host = HeaderValue::from_str(authority.as_str()).map_err(|error| error.to_string())?;
        Ok(Self {
            address: format!("{}:{port}", authority.host()),
            host,
            targets: [target("/v1/chat/completions")?, target("/v1/completions")?],
            idle: Arc::default(),
            timeouts,
        })
    }

    /// Where requests of `route` go on this replica.
    pub fn target(&self, route: Route) -> Uri {
        match route {
            Route::Chat => self.targets[0].clone(),
            Route::Completions => self.targets[1].clone(),
        }
    }

    /// Closes the idle connections that have been idle longer than the idle timeout at `now`, and those
    /// the replica closed; returns how many stay idle. The probe loop calls it on every tick, so a burst's
    /// connections do not stay open for ever once traffic stops (taking one only drops stale ones
    /// lazily, and only when a request comes).
    pub fn close_idle(&self, now: Instant) -> usize {
        self.idle.close_stale(now, self.timeouts.idle)
    }

    /// Connections idle now, ready for a request.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().len()
    }

    /// POSTs `body` to the replica's `route` with the client's forwarded headers; resolves once the
    /// response head is in.
    pub async fn post(
        &self,
        route: Route,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<TimedBody>, UpstreamError> {
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.target(route);
        let forwarded = request.headers_mut();
        forwarded.insert(header::HOST, self.host.clone());
        for name in FORWARDED_HEADERS {
            if let Some(value) = headers.get(&name) {
                forwarded.insert(name, value.clone());
            }
        }
        // One timer for the whole answer: it bounds the wait for the head, then moves into the body.
        let mut timer = Box::pin(tokio::time::sleep(self.timeouts.read));
        let (response, sender) = tokio::select! {
            biased;
            sent = self.send(request) => sent?,
            () = timer.as_mut() => return Err(UpstreamError::Silent(self.timeouts.read)),
        };
        let lease = Lease { sender, idle: self.idle.clone() };
        Ok(response.map(|body| TimedBody::new(body, self.timeouts.read, timer, lease)))
    }

    /// Sends `request` on an idle connection, or on a new one; returns the answer and its connection.
    async fn send(
        &self,
        mut request: Request<Full<Bytes>>,
    ) -> Result<(Response<Incoming>, SendRequest<Full<Bytes>>), UpstreamError> {
        loop {
            let (mut sender, fresh) = match self.idle.take(self.timeouts.idle) {
                Some(sender) => (sender, false),
                // Boxed: most requests find an idle connection, and an inline connect future (the TCP
                // connect and the HTTP/1 handshake) would make every request's future larger.
                None => (Box::pin(self.connect()).await?, true),
            };
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, sender)),
                Err(mut error) => match error.take_message() {
                    // The replica closed the idle connection before the request went out: try another.
                    Some(unsent) if !fresh => request = unsent,
                    _ => return Err(error.into_error().into()),
                },
            }
        }
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, UpstreamError> {
        let address = &self.address;
        let stream = tokio::time::timeout(self.timeouts.connect, TcpStream::connect(address))
            .await
            .map_err(|_| UpstreamError::ConnectTimeout {
                address: address.clone(),
                timeout: self.timeouts.connect,
            })?
            .map_err(|source| UpstreamError::Connect { address: address.clone(), source })?;
        // Streamed tokens are small writes; never wait for an ACK to send one (Nagle).
        let _ = stream.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "replica connection ended with an error");
            }
        });
        Ok(sender)
    }
}

/// A connection on loan to one answer: back to its replica's idle list once the answer has been read.
#[derive(Debug)]
struct Lease {
    sender: SendRequest<Full<Bytes>>,
    idle: Arc<IdleConnections>,
}

/// A replica's response body whose every frame must come within the read timeout of the last one.
///
/// One timer per body, re-armed only when it fires: progress is noted as a time stamp, so a stream of
/// many small chunks costs no timer operation per chunk.
#[derive(Debug)]
pub struct TimedBody {
    body: Incoming,
    timeout: Duration,
    last_progress: Instant,
    timer: Pin<Box<Sleep>>,
    /// The connection, until the body has been read to the end.
    lease: Option<Lease>,
}

impl TimedBody {
    fn new(body: Incoming, timeout: Duration, timer: Pin<Box<Sleep>>, lease: Lease) -> Self {
        let mut body = Self { body, timeout, last_progress: Instant::now(), timer, lease: Some(lease) };
        body.release_if_read();
        body
    }

    /// Gives the connection back once the whole body has arrived: as soon as the last byte of a sized
    /// body is in, without waiting for a read that returns its end (a chunked body has to be read to it).
    fn release_if_read(&mut self) {
        if self.body.is_end_stream() {
            self.release();
        }
    }

    fn release(&mut self) {
        if let Some(Lease { sender, idle }) = self.lease.take() {
            idle.give_back(sender);
        }
    }

    /// The body's length when the replica announced it (Content-Length).
    pub fn exact_len(&self) -> Option<u64> {
        self.body.size_hint().exact()
    }

    /// The next data chunk; `None` at the end of the body.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        loop {
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    self.last_progress = Instant::now();
                    self.release_if_read();
                    // Trailers carry nothing a client of the OpenAI API reads.
                    match frame.into_data() {
                        Ok(data) if !data.is_empty() => return Poll::Ready(Some(Ok(data))),
                        _ => continue,
                    }
                }
                Poll::Ready(Some(Err(error))) => {
                    // A broken answer leaves the connection unusable: let it close.
                    self.lease = None;
                    return Poll::Ready(Some(Err(error.into())));
                }
                Poll::Ready(None) => {
                    self.release();
                    return Poll::Ready(None);
                }
                Poll::Pending => {}
            }
            // Waiting. The timer may be set from an older progress stamp: when it fires early, re-arm it
            // from the latest one.
            loop {
                match self.timer.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(()) => {
                        let deadline = self.last_progress + self.timeout;
                        if Instant::now() >= deadline {
                            return Poll::Ready(Some(Err(UpstreamError::Silent(self.timeout))));
                        }
                        self.timer.as_mut().reset(deadline);
                    }
                }
            }
        }
    }

    /// The next data chunk; `None` at the end of the body.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, UpstreamError>> {
        std::future::poll_fn(|cx| self.poll_chunk(cx)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("client error (Connect)")]
    struct Outer(#[source] std::io::Error);

    fn connections(base: &str) -> Result<ReplicaConnections, String> {
        let timeouts = Timeouts {
            connect: Duration::from_secs(1),
            read: Duration::from_secs(1),
            idle: Duration::from_secs(1),
        };
        ReplicaConnections::new(base, timeouts)
    }

    #[test]
    fn replica_urls_are_checked_and_give_address_host_and_targets() {
        let local = connections("http://127.0.0.1:8100").unwrap();
        assert_eq!(
            (local.address.as_str(), local.host.to_str().unwrap()),
            ("127.0.0.1:8100", "127.0.0.1:8100")
        );
        assert_eq!(local.target(Route::Completions), "/v1/completions");
        assert_eq!(local.target(Route::Chat), "/v1/chat/completions");
        let v6 = connections("http://[::1]").unwrap();
        assert_eq!((v6.address.as_str(), v6.host.to_str().unwrap()), ("[::1]:80", "[::1]"));
        let behind_a_gateway = connections("http://gateway:8080/pools/a/").unwrap();
        assert_eq!(behind_a_gateway.target(Route::Chat), "/pools/a/v1/chat/completions");
        assert!(connections("http://127.0.0.1:notaport").unwrap_err().contains("port"));
        assert!(connections("http://127.0.0.1:70000").is_err());
        assert!(connections("https://gpu:8000").unwrap_err().contains("http://"));
        assert!(connections("http://").is_err());
        assert!(connections("http://gpu:8000/?x=1").unwrap_err().contains("query"));
    }

    #[test]
    fn errors_name_their_causes() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        assert_eq!(error_chain(&Outer(refused)), "client error (Connect): connection refused");
        assert_eq!(
            UpstreamError::Silent(Duration::from_millis(1500)).to_string(),
            "no answer for 1500 ms (the router's read timeout)"
        );
    }
}
