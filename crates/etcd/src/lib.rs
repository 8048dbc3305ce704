//! fleet-etcd: the small etcd v3 client fleet-router and the app share, over etcd's JSON gateway
//! (`/v3/...`, served by every etcd since 3.3 on its client port) rather than gRPC, so neither program
//! pulls in a gRPC stack for four calls.
//!
//! - [`wire`]: request bodies and answer parsing, pure and tested on etcd 3.4's own answers.
//! - [`EtcdClient`]: range, compare-and-swap txn, put and watch over reqwest, each unary call bounded in
//!   time and size, a watch frame bounded in size; user/password auth (token renewed when etcd expires it);
//!   https with a private CA and client certificates (feature `tls`).
//! - Leases and prefixes, for a value that must vanish with the process that wrote it (each router's
//!   load under `/fleetdeck/FLEET/load/ROUTER`): [`EtcdClient::grant_lease`] (etcd may grant a longer TTL
//!   than asked: its minimum), [`EtcdClient::keep_alive`], [`EtcdClient::revoke_lease`],
//!   [`EtcdClient::put_with_lease`]; [`EtcdClient::get_prefix`] (at most [`MAX_PREFIX_KEYS`] keys) and
//!   [`EtcdClient::watch_prefix`], where an expired lease's keys arrive as deletions.
//!
//! Secrets (the password, the auth token) never reach a log line or a `Debug` output.

#[cfg(feature = "cli")]
pub mod cli;

pub mod wire;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fleet_base::error::error_chain;
use fleet_base::http::{BodyError, read_limited};
use futures_util::StreamExt;
use serde_json::Value;

pub use wire::{KeyValue, Lease, PrefixRange, Range, TxnOutcome, WatchEvent, WatchFrame, WireError};

/// Largest answer to a unary call accepted: a policy is a few hundred bytes, etcd's own value limit is 1.5 MiB.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

/// Most keys one [`EtcdClient::get_prefix`] reads: a prefix holds one key per router, and a prefix that
/// grew past this (a stray writer) must not grow the answer with it; [`PrefixRange::more`] says so.
pub const MAX_PREFIX_KEYS: i64 = 1024;

/// A user and password for etcd's auth, read from a file holding `USER:PASSWORD` (what `etcdctl --user`
/// takes). The password never appears in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The etcd user.
    pub user: String,
    password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("user", &self.user).field("password", &"<redacted>").finish()
    }
}

impl Credentials {
    /// A user and password.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Self { user: user.into(), password: password.into() }
    }

    /// Reads `USER:PASSWORD` (one line, surrounding whitespace ignored) from `path`.
    pub fn from_file(path: &Path) -> Result<Self, EtcdError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            EtcdError::Config(format!("cannot read the etcd credentials file {}: {e}", path.display()))
        })?;
        let line = text.trim();
        match line.split_once(':') {
            Some((user, password)) if !user.is_empty() && !password.is_empty() && !line.contains('\n') => {
                Ok(Self::new(user, password))
            }
            _ => Err(EtcdError::Config(format!(
                "the etcd credentials file {} must hold one line USER:PASSWORD (as etcdctl --user takes)",
                path.display()
            ))),
        }
    }
}

/// PEM files for https endpoints: a CA to trust beside the system's, and a client certificate and key
/// (PKCS#8) for etcd's `--client-cert-auth`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificate(s) that signed etcd's server certificate.
    pub ca: Option<PathBuf>,
    /// Client certificate chain.
    pub cert: Option<PathBuf>,
    /// Client private key (PKCS#8 PEM: `openssl pkcs8 -topk8 -nocrypt` converts others).
    pub key: Option<PathBuf>,
}

/// Where etcd is and how to talk to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs of the cluster's members (`http://127.0.0.1:2379`); calls go to one and move on to the
    /// next when it cannot be reached.
    pub endpoints: Vec<String>,
    /// User and password, when etcd has auth enabled.
    pub credentials: Option<Credentials>,
    /// https settings.
    pub tls: TlsFiles,
    /// Time allowed to open a connection.
    pub connect_timeout: Duration,
    /// Time allowed for one unary call, answer included.
    pub request_timeout: Duration,
    /// Largest watch frame accepted.
    pub max_frame_bytes: usize,
}

impl EtcdConfig {
    /// The defaults for `endpoints` (a comma-separated list is split).
    pub fn new(endpoints: &str) -> Self {
        Self {
            endpoints: endpoints
                .split(',')
                .map(|e| e.trim().trim_end_matches('/').to_owned())
                .filter(|e| !e.is_empty())
                .collect(),
            credentials: None,
            tls: TlsFiles::default(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            max_frame_bytes: MAX_ANSWER_BYTES,
        }
    }

    /// Checks the endpoints and files; the error names what is wrong and the fix.
    pub fn validate(&self) -> Result<(), EtcdError> {
        if self.endpoints.is_empty() {
            return Err(EtcdError::Config(
                "no etcd endpoint; give one like http://127.0.0.1:2379 (several separated by commas)".into(),
            ));
        }
        for endpoint in &self.endpoints {
            let https = endpoint.starts_with("https://");
            if !(https || endpoint.starts_with("http://"))
                || endpoint.split_once("://").is_none_or(|(_, h)| h.is_empty())
            {
                return Err(EtcdError::Config(format!(
                    "etcd endpoint {endpoint:?} is not an http:// or https:// URL; write it like http://127.0.0.1:2379"
                )));
            }
            if https && !cfg!(feature = "tls") {
                return Err(EtcdError::Config(format!(
                    "etcd endpoint {endpoint} is https, but this build has no TLS client; rebuild with the `tls` feature"
                )));
            }
        }
        if self.tls.cert.is_some() != self.tls.key.is_some() {
            return Err(EtcdError::Config(
                "an etcd client certificate needs both the certificate and its key file".into(),
            ));
        }
        if (self.tls.ca.is_some() || self.tls.cert.is_some()) && !cfg!(feature = "tls") {
            return Err(EtcdError::Config(
                "etcd TLS files were given, but this build has no TLS client; rebuild with the `tls` feature"
                    .into(),
            ));
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() || self.max_frame_bytes == 0 {
            return Err(EtcdError::Config("etcd timeouts and the frame limit must be above zero".into()));
        }
        Ok(())
    }
}

/// Why an etcd call failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
    /// No answer: connection refused, reset, or the deadline passed.
    #[error("cannot reach etcd at {endpoint}: {detail}")]
    Unreachable {
        /// The endpoint tried.
        endpoint: String,
        /// What went wrong.
        detail: String,
    },
    /// etcd answered with an error.
    #[error("etcd at {endpoint} refused the call (HTTP {status}, gRPC code {code}): {message}")]
    Server {
        /// The endpoint.
        endpoint: String,
        /// HTTP status of the gateway's answer (0 inside a stream: a watch's or a keepalive's).
        status: u16,
        /// gRPC status code.
        code: i64,
        /// etcd's message.
        message: String,
    },
    /// The answer passed the size limit.
    #[error("etcd at {endpoint} sent more than {limit} bytes")]
    TooLarge {
        /// The endpoint.
        endpoint: String,
        /// The limit.
        limit: usize,
    },
    /// The answer could not be read.
    #[error("etcd at {endpoint}: {source}")]
    Wire {
        /// The endpoint.
        endpoint: String,
        /// What is wrong with it.
        source: WireError,
    },
}

impl EtcdError {
    /// Whether etcd said the auth token is missing, invalid or expired (a new one may fix it).
    fn is_auth(&self) -> bool {
        matches!(self, Self::Server { status: 401, .. })
            || matches!(self, Self::Server { code: 16, .. })
            || matches!(self, Self::Server { message, .. } if message.contains("invalid auth token"))
    }

    /// Whether etcd said a lease does not exist (it expired, was revoked, or never was): a put on it, a
    /// revoke of it (gRPC NotFound, 404 on the gateway).
    pub fn is_lease_gone(&self) -> bool {
        matches!(self, Self::Server { code: 5, .. })
    }
}

/// An etcd client. Cheap to clone (one connection pool).
#[derive(Debug, Clone)]
pub struct EtcdClient {
    inner: std::sync::Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    config: EtcdConfig,
    /// The endpoint calls go to (moves on when one cannot be reached).
    current: AtomicUsize,
    token: Mutex<Option<Token>>,
}

/// etcd's auth token; never in `Debug`.
#[derive(Clone)]
struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl EtcdClient {
    /// A client for `config` (validated; TLS files read now, so a bad file fails here, not mid-run).
    pub fn new(config: EtcdConfig) -> Result<Self, EtcdError> {
        config.validate()?;
        let builder = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            // etcd is reached directly: a desktop's HTTP(S)_PROXY must not carry its calls or its secrets.
            .no_proxy();
        let builder = tls(builder, &config.tls)?;
        let http = builder
            .build()
            .map_err(|e| EtcdError::Config(format!("cannot set up the etcd client: {}", error_chain(&e))))?;
        Ok(Self {
            inner: std::sync::Arc::new(Inner {
                http,
                config,
                current: AtomicUsize::new(0),
                token: Mutex::new(None),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The endpoint calls go to now.
    pub fn endpoint(&self) -> &str {
        let endpoints = &self.inner.config.endpoints;
        &endpoints[self.inner.current.load(Ordering::Relaxed) % endpoints.len()]
    }

    fn next_endpoint(&self) {
        self.inner.current.fetch_add(1, Ordering::Relaxed);
    }

    fn cached_token(&self) -> Option<Token> {
        self.inner.token.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn set_token(&self, token: Option<Token>) {
        *self.inner.token.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = token;
    }

    /// A token for the configured user, asked for once and kept until etcd refuses it.
    async fn token(&self) -> Result<Option<Token>, EtcdError> {
        let Some(credentials) = &self.inner.config.credentials else { return Ok(None) };
        if let Some(token) = self.cached_token() {
            return Ok(Some(token));
        }
        let body = wire::authenticate_request(&credentials.user, &credentials.password);
        let answer = self.send("/v3/auth/authenticate", &body, None).await?;
        let endpoint = self.endpoint().to_owned();
        let token = Token(wire::parse_token(&answer).map_err(|source| EtcdError::Wire { endpoint, source })?);
        self.set_token(Some(token.clone()));
        Ok(Some(token))
    }

    /// One POST to the current endpoint (the next one is tried on the following call when this one cannot
    /// be reached). An answer other than 2xx is read, bounded, into [`EtcdError::Server`]; a 2xx answer is
    /// handed back unread with the endpoint that gave it. `timeout` bounds the whole call; a watch has none.
    async fn post(
        &self,
        path: &str,
        body: &Value,
        token: Option<&Token>,
        timeout: Option<Duration>,
    ) -> Result<(String, reqwest::Response), EtcdError> {
        let endpoint = self.endpoint().to_owned();
        let mut request = self.inner.http.post(format!("{endpoint}{path}")).json(body);
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        if let Some(token) = token {
            request = request.header(reqwest::header::AUTHORIZATION, &token.0);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                self.next_endpoint();
                return Err(EtcdError::Unreachable { endpoint, detail: error_chain(&error) });
            }
        };
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            return Ok((endpoint, response));
        }
        let body = read_limited(response, MAX_ANSWER_BYTES).await.map_err(|e| body_error(&endpoint, e))?;
        let error = wire::parse_error(&body).unwrap_or(wire::ServerError {
            code: 2,
            message: String::from_utf8_lossy(&body).chars().take(200).collect(),
        });
        Err(EtcdError::Server { endpoint, status, code: error.code, message: error.message })
    }

    /// One unary call to the current endpoint, bounded in time and size.
    async fn send(&self, path: &str, body: &Value, token: Option<&Token>) -> Result<Vec<u8>, EtcdError> {
        let timeout = Some(self.inner.config.request_timeout);
        let (endpoint, response) = self.post(path, body, token, timeout).await?;
        read_limited(response, MAX_ANSWER_BYTES).await.map_err(|e| body_error(&endpoint, e))
    }

    /// One call with auth: a refused token is dropped and the call made once more with a new one.
    async fn call(&self, path: &str, body: &Value) -> Result<Vec<u8>, EtcdError> {
        let token = self.token().await?;
        match self.send(path, body, token.as_ref()).await {
            Err(error) if token.is_some() && error.is_auth() => {
                self.set_token(None);
                let token = self.token().await?;
                self.send(path, body, token.as_ref()).await
            }
            other => other,
        }
    }

    fn wire<T>(&self, parsed: Result<T, WireError>) -> Result<T, EtcdError> {
        parsed.map_err(|source| EtcdError::Wire { endpoint: self.endpoint().to_owned(), source })
    }

    /// The error etcd ended a stream (a watch, a keepalive) with. The HTTP answer was already 200, past
    /// the retry of a refused token, so an expired token is only dropped: the next call asks for a new one.
    fn stream_error(&self, endpoint: String, error: wire::ServerError) -> EtcdError {
        let error = EtcdError::Server { endpoint, status: 0, code: error.code, message: error.message };
        if error.is_auth() {
            self.set_token(None);
        }
        error
    }

    /// Reads `key` as it stands now.
    pub async fn get(&self, key: &str) -> Result<Range, EtcdError> {
        self.get_at(key, 0).await
    }

    /// Reads `key` as it stood at `revision` (0: now). A revision compacted away is a `Server` error (code 11).
    pub async fn get_at(&self, key: &str, revision: i64) -> Result<Range, EtcdError> {
        let answer = self.call("/v3/kv/range", &wire::range_request(key.as_bytes(), revision)).await?;
        self.wire(wire::parse_range(&answer))
    }

    /// Writes `value` to `key` only if the key's `mod_revision` is `expected_mod_revision` (0: only if it
    /// does not exist yet), in one txn: etcd's If-Match.
    pub async fn put_if(
        &self,
        key: &str,
        value: &[u8],
        expected_mod_revision: i64,
    ) -> Result<TxnOutcome, EtcdError> {
        let body = wire::put_if_request(key.as_bytes(), value, expected_mod_revision);
        let answer = self.call("/v3/kv/txn", &body).await?;
        self.wire(wire::parse_put_if(&answer))
    }

    /// Writes `value` to `key` whatever it holds; returns the new revision.
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<i64, EtcdError> {
        self.put_with_lease(key, value, 0).await
    }

    /// Writes `value` to `key` whatever it holds, attached to the lease `lease_id` (0: none), so that
    /// etcd deletes the key when the lease expires or is revoked; returns the new revision. A lease etcd
    /// no longer holds is a `Server` error (code 5, "requested lease not found"): grant a new one.
    pub async fn put_with_lease(&self, key: &str, value: &[u8], lease_id: i64) -> Result<i64, EtcdError> {
        let answer = self.call("/v3/kv/put", &wire::put_request(key.as_bytes(), value, lease_id)).await?;
        self.wire(wire::parse_put(&answer))
    }

    /// Reads every key starting with `prefix` as they stand now, in key order, at most
    /// [`MAX_PREFIX_KEYS`] of them (`more` says some were left out). Watching the prefix from
    /// `revision + 1` then misses no change.
    pub async fn get_prefix(&self, prefix: &str) -> Result<PrefixRange, EtcdError> {
        let body = wire::prefix_range_request(prefix.as_bytes(), MAX_PREFIX_KEYS);
        let answer = self.call("/v3/kv/range", &body).await?;
        self.wire(wire::parse_prefix_range(&answer))
    }

    /// Asks etcd for a lease of `ttl_seconds`. etcd raises a TTL below its minimum (2 s with its default
    /// election timeout; 0 and negative too): [`Lease::ttl_seconds`] is what it granted, and keepalives
    /// must come well within it.
    pub async fn grant_lease(&self, ttl_seconds: i64) -> Result<Lease, EtcdError> {
        let answer = self.call("/v3/lease/grant", &wire::lease_grant_request(ttl_seconds)).await?;
        self.wire(wire::parse_lease_grant(&answer))
    }

    /// Renews the lease `id` once: its time to live from now, in seconds, or `None` when etcd no longer
    /// holds it (expired or revoked; its keys are gone, so grant a new lease and put them again).
    ///
    /// Keepalive is a gRPC stream; one request over the gateway is one frame and the end of the stream, so
    /// it is a unary call here, bounded in time and size like the others, with no stream left open.
    pub async fn keep_alive(&self, id: i64) -> Result<Option<i64>, EtcdError> {
        let answer = self.call("/v3/lease/keepalive", &wire::lease_request(id)).await?;
        self.wire(wire::parse_keepalive(&answer))?
            .map_err(|error| self.stream_error(self.endpoint().to_owned(), error))
    }

    /// Revokes the lease `id`: etcd deletes its keys now rather than when it would expire. A lease etcd no
    /// longer holds is a `Server` error (HTTP 404, code 5), which a process shutting down may ignore.
    pub async fn revoke_lease(&self, id: i64) -> Result<(), EtcdError> {
        let answer = self.call("/v3/lease/revoke", &wire::lease_request(id)).await?;
        self.wire(wire::parse_put(&answer)).map(drop)
    }

    /// Watches `key` from `start_revision` on. The stream has no deadline (a quiet key is normal); a
    /// watcher that must notice a silent partition reads the key now and then beside it.
    pub async fn watch(&self, key: &str, start_revision: i64) -> Result<Watch, EtcdError> {
        self.open_watch(&wire::watch_request(key.as_bytes(), start_revision)).await
    }

    /// Watches every key starting with `prefix` from `start_revision` on, like [`Self::watch`]. The keys
    /// of a lease that expired or was revoked arrive as [`WatchEvent::Delete`]s at one revision (one frame,
    /// as etcd 3.4 sends them).
    pub async fn watch_prefix(&self, prefix: &str, start_revision: i64) -> Result<Watch, EtcdError> {
        self.open_watch(&wire::watch_prefix_request(prefix.as_bytes(), start_revision)).await
    }

    /// Opens the watch stream `body` asks for; a refused token is dropped and the watch opened once more
    /// with a new one (as [`Self::call`] does, but the answer is a stream and has no deadline).
    async fn open_watch(&self, body: &Value) -> Result<Watch, EtcdError> {
        let mut retried = false;
        loop {
            let token = self.token().await?;
            let (endpoint, response) = match self.post("/v3/watch", body, token.as_ref(), None).await {
                Ok(answer) => answer,
                Err(error) if token.is_some() && error.is_auth() && !retried => {
                    retried = true;
                    self.set_token(None);
                    continue;
                }
                Err(error) => return Err(error),
            };
            return Ok(Watch {
                endpoint,
                body: Box::pin(response.bytes_stream()),
                lines: wire::Lines::new(self.inner.config.max_frame_bytes),
                ready: std::collections::VecDeque::new(),
                client: self.clone(),
            });
        }
    }
}

#[cfg(feature = "tls")]
fn tls(mut builder: reqwest::ClientBuilder, files: &TlsFiles) -> Result<reqwest::ClientBuilder, EtcdError> {
    let read = |path: &Path, what: &str| {
        std::fs::read(path)
            .map_err(|e| EtcdError::Config(format!("cannot read the etcd {what} {}: {e}", path.display())))
    };
    if let Some(ca) = &files.ca {
        let pem = read(ca, "CA file")?;
        let certificate = reqwest::Certificate::from_pem(&pem).map_err(|e| {
            EtcdError::Config(format!(
                "the etcd CA file {} is not a PEM certificate: {}",
                ca.display(),
                error_chain(&e)
            ))
        })?;
        builder = builder.add_root_certificate(certificate);
    }
    if let (Some(cert), Some(key)) = (&files.cert, &files.key) {
        let identity = reqwest::Identity::from_pkcs8_pem(
            &read(cert, "client certificate")?,
            &read(key, "client key")?,
        )
        .map_err(|e| {
            EtcdError::Config(format!(
                "the etcd client certificate {} and key {} cannot be used (the key must be PKCS#8 PEM: \
                     openssl pkcs8 -topk8 -nocrypt converts one): {}",
                cert.display(),
                key.display(),
                error_chain(&e)
            ))
        })?;
        builder = builder.identity(identity);
    }
    Ok(builder)
}

#[cfg(not(feature = "tls"))]
fn tls(builder: reqwest::ClientBuilder, _files: &TlsFiles) -> Result<reqwest::ClientBuilder, EtcdError> {
    // validate() already refused TLS files and https endpoints in a build without TLS.
    Ok(builder)
}

/// etcd's words for an answer body [`read_limited`] could not read (every unary answer is capped at
/// [`MAX_ANSWER_BYTES`]).
fn body_error(endpoint: &str, error: BodyError) -> EtcdError {
    match error {
        BodyError::TooLarge => EtcdError::TooLarge { endpoint: endpoint.to_owned(), limit: MAX_ANSWER_BYTES },
        BodyError::Broken(detail) => EtcdError::Unreachable { endpoint: endpoint.to_owned(), detail },
    }
}

type ByteStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// A running watch: frames in order until etcd or the connection ends it.
pub struct Watch {
    endpoint: String,
    body: ByteStream,
    lines: wire::Lines,
    ready: std::collections::VecDeque<Vec<u8>>,
    client: EtcdClient,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("endpoint", &self.endpoint).finish_non_exhaustive()
    }
}

impl Watch {
    /// The next frame; `Ok(None)` when the stream ended (etcd stopped or the connection closed).
    pub async fn next(&mut self) -> Result<Option<WatchFrame>, EtcdError> {
        loop {
            if let Some(line) = self.ready.pop_front() {
                return match wire::parse_watch_frame(&line) {
                    Ok(Ok(frame)) => Ok(Some(frame)),
                    Ok(Err(error)) => Err(self.client.stream_error(self.endpoint.clone(), error)),
                    Err(source) => Err(EtcdError::Wire { endpoint: self.endpoint.clone(), source }),
                };
            }
            match self.body.next().await {
                None => return Ok(None),
                Some(Err(error)) => {
                    return Err(EtcdError::Unreachable {
                        endpoint: self.endpoint.clone(),
                        detail: error_chain(&error),
                    });
                }
                Some(Ok(chunk)) => {
                    let lines = self
                        .lines
                        .push(&chunk)
                        .map_err(|source| EtcdError::Wire { endpoint: self.endpoint.clone(), source })?;
                    self.ready.extend(lines);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_checked_with_a_fix() {
        assert!(EtcdConfig::new("http://127.0.0.1:2379").validate().is_ok());
        let two = EtcdConfig::new("http://a:1, http://b:2/");
        assert_eq!(two.endpoints, ["http://a:1", "http://b:2"]);
        for bad in ["", "127.0.0.1:2379", "http://", "tcp://a:1"] {
            let error = EtcdConfig::new(bad).validate().unwrap_err().to_string();
            assert!(error.contains("http://127.0.0.1:2379"), "{bad}: {error}");
        }
        let half = EtcdConfig {
            tls: TlsFiles { cert: Some("c.pem".into()), ..Default::default() },
            ..EtcdConfig::new("http://a:1")
        };
        assert!(half.validate().is_err());
    }

    #[test]
    fn credentials_come_from_a_file_and_stay_out_of_debug() {
        let dir = std::env::temp_dir().join(format!("fleet-etcd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        std::fs::write(&good, "fleet:s3cret:with-colon\n").unwrap();
        let credentials = Credentials::from_file(&good).unwrap();
        assert_eq!(credentials.user, "fleet");
        assert_eq!(credentials.password, "s3cret:with-colon");
        assert!(!format!("{credentials:?}").contains("s3cret"));
        let bad = dir.join("bad");
        std::fs::write(&bad, "justauser\n").unwrap();
        assert!(Credentials::from_file(&bad).unwrap_err().to_string().contains("USER:PASSWORD"));
        assert!(Credentials::from_file(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
