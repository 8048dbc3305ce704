//! The data plane's client for replicas: hyper's pooled HTTP/1 client with the router's timeouts.
//!
//! Why not reqwest, which the router still uses off the hot path (health probes, the model lookup): a
//! proxy needs none of its layers (redirects, cookies, decompression, proxies), and they cost time on
//! every request; reqwest 0.13 re-parses each response's URL (`Url::parse`, IDNA included) for its
//! redirect support and boxes every body through a tower stack. The replica's request URI is built
//! once per replica ([`crate::state::Replica::upstream_uri`]) and cloned (a reference count) per request.
//!
//! Timeouts: connecting has `connect_timeout` (then the proxy tries another replica); the response head
//! and then every body frame must come within `read_timeout` of the last one ([`TimedBody`]), so a
//! replica that goes silent ends the request with an error, never a hang.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Request, Response, Uri, header};
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::time::{Instant, Sleep};

/// Request headers passed on to the replica (the body's framing headers are the client's own).
const FORWARDED_HEADERS: [header::HeaderName; 3] =
    [header::CONTENT_TYPE, header::AUTHORIZATION, header::ACCEPT];

/// Why a replica did not answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Connecting failed, or the request could not be sent or its answer read.
    #[error("{}", chain(.0))]
    Request(#[from] hyper_util::client::legacy::Error),
    /// Reading the body failed (the connection broke).
    #[error("{}", chain(.0))]
    Body(#[from] hyper::Error),
    /// Nothing arrived for the read timeout.
    #[error("no answer for {} ms (the router's read timeout)", .0.as_millis())]
    Silent(Duration),
    /// The request could not be built (not expected: URIs are checked when a replica is added).
    #[error("cannot build the request: {0}")]
    Build(#[from] axum::http::Error),
}

/// An error and its causes, `outer: inner: ...` (hyper's own messages are terse without their sources).
fn chain(error: &dyn std::error::Error) -> String {
    std::iter::successors(Some(error), |error| error.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// The URI of `path` on the replica at `base` (`http://HOST[:PORT]`), or why it is not usable.
pub fn replica_uri(base: &str, path: &str) -> Result<Uri, String> {
    let uri = Uri::try_from(format!("{base}{path}")).map_err(|error| error.to_string())?;
    if uri.scheme_str() != Some("http") {
        return Err(
            "replicas are reached over plain http:// (put a TLS sidecar before one that only speaks https)"
                .to_owned(),
        );
    }
    let authority = uri.authority().map(|authority| authority.as_str()).unwrap_or_default();
    if uri.host().is_none_or(str::is_empty) {
        return Err("it names no host".to_owned());
    }
    if authority.rsplit_once(':').is_some_and(|(_, port)| !port.ends_with(']')) && uri.port_u16().is_none() {
        return Err("its port is not a number from 0 to 65535".to_owned());
    }
    Ok(uri)
}

/// The pooled client (cheap to clone: it shares the pool).
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    client: Client<HttpConnector, Full<Bytes>>,
    read_timeout: Duration,
}

impl UpstreamClient {
    /// A client with the router's connect and read timeouts; idle pooled connections close after 30 s.
    pub fn new(connect_timeout: Duration, read_timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        // Streamed tokens are small writes; never wait for an ACK to send one (Nagle).
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_timer(TokioTimer::new())
            .build(connector);
        Self { client, read_timeout }
    }

    /// POSTs `body` to `uri` with the client's forwarded headers; resolves once the response head is in.
    pub async fn post(
        &self,
        uri: Uri,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<TimedBody>, UpstreamError> {
        let mut request = Request::builder().method(Method::POST).uri(uri);
        for name in FORWARDED_HEADERS {
            if let Some(value) = headers.get(&name) {
                request = request.header(name, value);
            }
        }
        let request = request.body(Full::new(body))?;
        let response = tokio::time::timeout(self.read_timeout, self.client.request(request))
            .await
            .map_err(|_| UpstreamError::Silent(self.read_timeout))??;
        let timeout = self.read_timeout;
        Ok(response.map(|body| TimedBody::new(body, timeout)))
    }
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
}

impl TimedBody {
    fn new(body: Incoming, timeout: Duration) -> Self {
        let now = Instant::now();
        Self { body, timeout, last_progress: now, timer: Box::pin(tokio::time::sleep_until(now + timeout)) }
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
                    // Trailers carry nothing a client of the OpenAI API reads.
                    match frame.into_data() {
                        Ok(data) if !data.is_empty() => return Poll::Ready(Some(Ok(data))),
                        _ => continue,
                    }
                }
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error.into()))),
                Poll::Ready(None) => return Poll::Ready(None),
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

    #[test]
    fn replica_uris_are_checked() {
        assert_eq!(
            replica_uri("http://127.0.0.1:8100", "/v1/completions").unwrap(),
            "http://127.0.0.1:8100/v1/completions"
        );
        assert_eq!(replica_uri("http://[::1]", "/v1/models").unwrap(), "http://[::1]/v1/models");
        assert!(replica_uri("http://127.0.0.1:notaport", "/v1/completions").unwrap_err().contains("port"));
        assert!(replica_uri("http://127.0.0.1:70000", "/v1/completions").is_err());
        assert!(replica_uri("https://gpu:8000", "/v1/completions").unwrap_err().contains("http://"));
        assert!(replica_uri("http://", "/v1/completions").is_err());
    }

    #[test]
    fn errors_name_their_causes() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        assert_eq!(chain(&Outer(refused)), "client error (Connect): connection refused");
        assert_eq!(
            UpstreamError::Silent(Duration::from_millis(1500)).to_string(),
            "no answer for 1500 ms (the router's read timeout)"
        );
    }
}
