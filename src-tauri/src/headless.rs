//! The headless server: the embedded UI and its API over HTTP, for browsers and tests.
//!
//! `GET /...` serves the same UI files the window shows (taken from Tauri's embedded
//! assets, so there is one copy in the binary); `POST /api/COMMAND` runs a command of the
//! control core with the JSON body as its arguments, answering `{code, message}` on error
//! (400 for bad arguments, 404 for unknown commands or ids, 500 otherwise).
//!
//! Every request passes [`guard`] first, which applies the rules of [`crate::access::Gate`]: the
//! `Host` it is addressed to, its origin, its sign-in (the launch secret shown at start, exchanged
//! for a session cookie) and, for the API, a JSON body of at most [`MAX_API_BODY`]. Every answer carries a
//! strict Content-Security-Policy and no referrer, so the sign-in URL never leaks to another site.
//!
//! It is served the way fleet-router serves ([`fleet_router::serve`]): hyper's HTTP/1 server with a header
//! read timeout ([`HEADER_READ_TIMEOUT`]; an idle connection is closed after it too) and at most
//! [`connection_cap`] connections at once (below the process's file limit), the rest answered 503
//! `too_many_connections` at once and closed. So idle sockets, however many, can neither exhaust the app's
//! file descriptors nor keep the UI unreachable for longer than the timeout.
//!
//! The sign-in link holds the launch secret, so it goes only where the operator alone reads it: stdout when
//! that is a terminal; otherwise (stdout captured by a log, a service manager, a pipe) a file readable by its
//! owner only ([`HeadlessOptions::sign_in_file`]), and stdout says where.

use std::borrow::Cow;
use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::{Path as FilePath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use fleetdeck_api::ApiError;
use fleetdeck_control::Control;
use serde_json::Value;
use tauri::utils::assets::AssetKey;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::access::{self, Gate, Refusal};

/// The policy every page and answer is served under: only this server's own scripts (and the
/// compiled wasm) run, nothing is framed, nothing is fetched from elsewhere. Inline styles stay
/// allowed for the charts' SVG and the views' style attributes; inline scripts do not.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Largest API body read; a larger one is answered 413 `body_too_large`.
pub const MAX_API_BODY: usize = 2 << 20;
/// Time a client has to send a request's headers (an idle keep-alive connection is closed after it).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to send an API request's body once its headers are in.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of a body over [`MAX_API_BODY`] is read (and dropped) before the 413 goes out.
const MAX_DRAINED_BODY: usize = 16 << 20;
/// Time requests in flight get to finish when the app stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Connections the server holds at once: a quarter of the process's open-file limit (the rest is for the
/// history database, scrapes and router calls), between 16 and 256. A browser uses about six.
pub fn connection_cap(open_files_limit: Option<u64>) -> usize {
    open_files_limit.map_or(256, |limit| usize::try_from(limit / 4).unwrap_or(usize::MAX)).clamp(16, 256)
}

/// The soft limit of open files of this process (`Max open files` in `/proc/self/limits`), where it can be
/// read (Linux).
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|line| line.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

/// The headless server's refusals before any route runs.
struct AppRefusals {
    cap: usize,
}

impl fleet_router::serve::Refusals for AppRefusals {
    fn over_capacity(&self) -> Vec<u8> {
        let error = ApiError::new(
            "too_many_connections",
            format!(
                "the app serves at most {} connections at once and all are taken; close other tabs or scripts \
                 using it, or wait {} s for idle ones to be closed, and retry",
                self.cap,
                HEADER_READ_TIMEOUT.as_secs()
            ),
        );
        let json = serde_json::to_string(&error).unwrap_or_default();
        fleet_router::serve::over_capacity_answer(&json, &[])
    }
}

/// How the headless server listens.
#[derive(Debug, Default)]
pub struct HeadlessOptions {
    /// Address to bind; default loopback on the preferred port, or any free port if it is taken.
    pub listen: Option<SocketAddr>,
    /// PEM certificate and PKCS#8 key: serve HTTPS (required beyond loopback).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Extra host names the server is reached by (checked against `Host`).
    pub public_names: Vec<String>,
    /// Where the sign-in link (with the launch secret) is written, mode 0600, when stdout is not a terminal.
    pub sign_in_file: PathBuf,
}

struct Served {
    control: Control,
    context: tauri::Context<tauri::Wry>,
    gate: Gate,
}

/// Binds, prints the sign-in URL and serves until `cancel` fires or Ctrl-C.
pub async fn run(
    options: HeadlessOptions,
    control: Control,
    context: tauri::Context<tauri::Wry>,
    cancel: CancellationToken,
) -> Result<()> {
    let listener = match options.listen {
        Some(addr) => {
            access::check_listen(addr, options.tls.is_some()).map_err(anyhow::Error::msg)?;
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}; pick another --listen"))?
        }
        None => match TcpListener::bind(("127.0.0.1", crate::DEFAULT_HEADLESS_PORT)).await {
            Ok(listener) => listener,
            Err(_) => TcpListener::bind(("127.0.0.1", 0)).await.context("cannot listen on 127.0.0.1")?,
        },
    };
    let addr = listener.local_addr()?;
    let launch = fleet_store::secrets::random_token()?;
    let session = fleet_store::secrets::random_token()?;
    let tls = options.tls.as_ref().map(|(cert, key)| crate::tls_listener::acceptor(cert, key)).transpose()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let shown_host = match (addr.ip().is_unspecified(), options.public_names.first()) {
        (false, _) => addr.to_string(),
        (true, Some(name)) if name.contains(':') => name.clone(),
        (true, Some(name)) => format!("{name}:{}", addr.port()),
        (true, None) => format!("127.0.0.1:{}", addr.port()),
    };
    // Tests and scripts read this line to find the server. The secret goes to the operator alone: their
    // terminal, or a file only they can read; never into a captured stdout, which the log shares.
    let base = format!("{scheme}://{shown_host}/");
    let link = format!("{base}?token={}", launch.expose());
    if std::io::stdout().is_terminal() {
        println!("Fleetdeck UI at {link}");
    } else {
        write_sign_in_file(&options.sign_in_file, &link)?;
        println!("{}", sign_in_line(&base, &options.sign_in_file));
    }
    drop(link);
    let gate = Gate::new(launch, session, addr, &options.public_names, tls.is_some());
    let app = router(Arc::new(Served { control, context, gate }));
    let stop = cancel.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    let cap = connection_cap(open_files_limit());
    let deadlines = fleet_router::serve::Deadlines {
        header_read: HEADER_READ_TIMEOUT,
        shutdown_grace: SHUTDOWN_GRACE,
        max_connections: cap,
    };
    let refusals: Arc<dyn fleet_router::serve::Refusals> = Arc::new(AppRefusals { cap });
    match tls {
        Some(acceptor) => {
            let listener = crate::tls_listener::listener(listener, acceptor)?;
            fleet_router::serve::serve_router(listener, app, refusals, deadlines, cancel).await;
        }
        None => fleet_router::serve::serve_router(listener, app, refusals, deadlines, cancel).await,
    }
    Ok(())
}

/// What stdout says when the sign-in link went to a file: the address, and where the link is.
pub fn sign_in_line(base: &str, file: &FilePath) -> String {
    format!(
        "Fleetdeck UI at {base} (stdout is not a terminal: the sign-in link, which holds this launch's secret, \
         is in {}, readable only by you)",
        file.display()
    )
}

/// Writes the sign-in link to `file`, readable and writable by its owner only (replacing an earlier one).
fn write_sign_in_file(file: &FilePath, link: &str) -> Result<()> {
    fleet_store::secrets::write_token_file(file, &format!("{link}\n")).with_context(|| {
        format!(
            "cannot write the sign-in link to {}; run fleetdeck in a terminal or fix the folder",
            file.display()
        )
    })
}

fn router(served: Arc<Served>) -> Router {
    Router::new()
        .route("/api/{command}", post(api))
        // The app's own counters (history writes, shed rounds) for Prometheus; behind the same gate.
        .route("/metrics", get(metrics))
        .route("/", get(asset))
        .route("/{*path}", get(asset))
        .layer(middleware::from_fn_with_state(served.clone(), guard))
        .with_state(served)
}

/// Applies the access rules to every request, and the security headers to every answer.
async fn guard(State(served): State<Arc<Served>>, request: Request, next: Next) -> Response {
    let mut response = match admit(&served.gate, request.method(), request.uri(), request.headers()) {
        Admission::Pass => next.run(request).await,
        Admission::SignIn(cookie) => {
            // Back to the same page without the secret in its URL (and so in the history): a path of this
            // server, never `//elsewhere` (a browser reads that as another host).
            let location = access::local_redirect(request.uri().path()).to_owned();
            let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response();
            if let Ok(cookie) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, cookie);
            }
            response
        }
        Admission::Refuse(refusal) => refused(&refusal, request.uri().path().starts_with("/api/")),
    };
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

enum Admission {
    Pass,
    SignIn(String),
    Refuse(Refusal),
}

/// The verdict on one request: which of the gate's rules apply depends on what it asks for.
fn admit(gate: &Gate, method: &Method, uri: &Uri, headers: &HeaderMap) -> Admission {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let checks = || -> Result<Option<String>, Refusal> {
        gate.check_host(text(header::HOST))?;
        if uri.path().starts_with("/api/") {
            gate.check_origin(
                text(header::ORIGIN),
                headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()),
            )?;
            gate.check_auth(text(header::COOKIE), text(header::AUTHORIZATION))?;
            if method == Method::POST {
                Gate::check_json(text(header::CONTENT_TYPE))?;
            }
            return Ok(None);
        }
        if let Some(sign_in) = gate.sign_in(uri.query()) {
            return sign_in.map(Some);
        }
        gate.check_auth(text(header::COOKIE), text(header::AUTHORIZATION))?;
        Ok(None)
    };
    match checks() {
        Ok(None) => Admission::Pass,
        Ok(Some(cookie)) => Admission::SignIn(cookie),
        Err(refusal) => Admission::Refuse(refusal),
    }
}

/// A refusal: `{code, message}` for the API, a short page saying what to do for a browser.
fn refused(refusal: &Refusal, api: bool) -> Response {
    let status = StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::FORBIDDEN);
    if api {
        return (status, axum::Json(ApiError::new(refusal.code, refusal.message.clone()))).into_response();
    }
    let page = format!(
        "<!doctype html><meta charset=utf-8><title>Fleetdeck</title><p>{}</p>",
        refusal.message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
    );
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
}

async fn metrics(State(served): State<Arc<Served>>) -> Response {
    let text = served.control.fleet().render_metrics();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// The HTTP status of an API error, by its code: the caller's mistakes (arguments, specs, traces, names,
/// states that do not allow the command) are 4xx, the app's own failures 5xx. A code not listed is 500.
pub fn status_of(code: &str) -> StatusCode {
    match code {
        "bad_request" | "invalid_spec" | "bad_trace" => StatusCode::BAD_REQUEST,
        "forbidden_path" => StatusCode::FORBIDDEN,
        "unknown_command" | "not_found" | "unknown_router" | "no_canary" => StatusCode::NOT_FOUND,
        "conflict"
        | "canary_running"
        | "revision_conflict"
        | "no_previous_version"
        | "no_traffic"
        | "no_active_policy"
        | "no_etcd_key"
        | "no_demo" => StatusCode::CONFLICT,
        "body_too_large" => StatusCode::PAYLOAD_TOO_LARGE,
        "body_timeout" => StatusCode::REQUEST_TIMEOUT,
        "etcd_unreachable" => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// An API error answer: `{code, message}` with the status of its code.
fn api_error(error: ApiError) -> Response {
    (status_of(&error.code), axum::Json(error)).into_response()
}

async fn api(State(served): State<Arc<Served>>, Path(command): Path<String>, request: Request) -> Response {
    let mut response = match read_body(request).await {
        Err(error) => api_error(error),
        Ok(body) => match dispatch(&served.control, &command, &body).await {
            Ok(value) => axum::Json(value).into_response(),
            Err(error) => api_error(error),
        },
    };
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// An API request's body, at most [`MAX_API_BODY`] bytes, within [`BODY_READ_TIMEOUT`]. A larger one is
/// `body_too_large` (413), as JSON like every other API error; it is read on (and dropped) up to
/// [`MAX_DRAINED_BODY`] first, so the client, still sending, gets the answer rather than a reset connection.
async fn read_body(request: Request) -> Result<axum::body::Bytes, ApiError> {
    use http_body_util::BodyExt as _;
    let too_large = || {
        ApiError::new(
            "body_too_large",
            format!("the request body is larger than {MAX_API_BODY} bytes, the API's limit; send less"),
        )
    };
    let mut body = request.into_body();
    let read = async {
        let (mut kept, mut seen) = (Vec::new(), 0usize);
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| ApiError::new("bad_request", format!("cannot read the request body: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            seen += data.len();
            if seen <= MAX_API_BODY {
                kept.extend_from_slice(&data);
            } else if seen > MAX_DRAINED_BODY {
                break;
            }
        }
        if seen > MAX_API_BODY { Err(too_large()) } else { Ok(axum::body::Bytes::from(kept)) }
    };
    tokio::time::timeout(BODY_READ_TIMEOUT, read).await.unwrap_or_else(|_| {
        Err(ApiError::new(
            "body_timeout",
            format!("the request body did not arrive within {BODY_READ_TIMEOUT:?}; send it whole"),
        ))
    })
}

/// Runs `command` with the JSON `body` as its arguments (an empty body: none), through the control
/// crate's one command table.
async fn dispatch(control: &Control, command: &str, body: &[u8]) -> Result<Value, ApiError> {
    let args = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::new("bad_request", format!("invalid arguments: {e}")))?
    };
    fleetdeck_control::commands::dispatch(control, command, args).await
}

async fn asset(State(served): State<Arc<Served>>, uri: Uri) -> Response {
    let path = match uri.path() {
        "/" => "/index.html",
        other => other,
    };
    let key = AssetKey::from(path);
    match served.context.assets().get(&key) {
        Some(bytes) => {
            let body: Vec<u8> = match bytes {
                Cow::Borrowed(b) => b.to_vec(),
                Cow::Owned(b) => b,
            };
            ([(header::CONTENT_TYPE, mime_of(path)), (header::CACHE_CONTROL, "no-cache")], body)
                .into_response()
        }
        None => (StatusCode::NOT_FOUND, format!("no UI file at {path}")).into_response(),
    }
}

fn mime_of(path: &str) -> &'static str {
    match path.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("css") => "text/css; charset=utf-8",
        Some("png") => "image/png",
        Some("svg") => "image/svg+xml",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_mistakes_are_4xx_and_the_apps_failures_5xx() {
        for code in ["bad_request", "invalid_spec", "bad_trace"] {
            assert_eq!(status_of(code), StatusCode::BAD_REQUEST, "{code}");
        }
        for code in ["unknown_command", "not_found", "unknown_router", "no_canary"] {
            assert_eq!(status_of(code), StatusCode::NOT_FOUND, "{code}");
        }
        for code in
            ["no_traffic", "canary_running", "revision_conflict", "no_previous_version", "no_active_policy"]
        {
            assert_eq!(status_of(code), StatusCode::CONFLICT, "{code}");
        }
        assert_eq!(status_of("forbidden_path"), StatusCode::FORBIDDEN);
        assert_eq!(status_of("body_too_large"), StatusCode::PAYLOAD_TOO_LARGE);
        for code in ["internal", "history_unavailable", "settings_not_saved", "token_not_saved", "new_code"] {
            assert_eq!(status_of(code), StatusCode::INTERNAL_SERVER_ERROR, "{code}");
        }
    }

    #[test]
    fn the_connection_cap_stays_below_the_file_limit() {
        assert_eq!(connection_cap(Some(160)), 40);
        assert_eq!(connection_cap(Some(1024)), 256);
        assert_eq!(connection_cap(Some(20)), 16);
        assert_eq!(connection_cap(None), 256);
        assert!(open_files_limit().is_some_and(|limit| limit > 0), "readable on Linux");
    }

    #[test]
    fn a_captured_stdout_is_told_where_the_link_is_not_the_link() {
        let line =
            sign_in_line("http://127.0.0.1:1/", FilePath::new("/home/op/.local/share/fleetdeck/sign-in-url"));
        assert!(line.starts_with("Fleetdeck UI at http://127.0.0.1:1/ "), "{line}");
        assert!(!line.contains("token"), "{line}");
        assert!(
            line.contains("is in /home/op/.local/share/fleetdeck/sign-in-url, readable only by you)"),
            "{line}"
        );
    }
}
