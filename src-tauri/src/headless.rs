//! The headless server: the embedded UI and its API over HTTP, for browsers and tests.
//!
//! `GET /...` serves the same UI files the window shows (taken from Tauri's embedded
//! assets, so there is one copy in the binary); `POST /api/COMMAND` runs a command of the
//! control core with the JSON body as its arguments, answering `{code, message}` on error
//! (400 for bad arguments, 404 for unknown commands or ids, 500 otherwise).
//!
//! Every request passes [`guard`] first, which applies the rules of [`crate::access::Gate`]: the
//! `Host` it is addressed to, its origin, its sign-in (the launch secret printed at start, exchanged
//! for a session cookie) and, for the API, a JSON body. Every answer carries a strict
//! Content-Security-Policy and no referrer, so the sign-in URL never leaks to another site.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

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

/// How the headless server listens.
#[derive(Debug, Default)]
pub struct HeadlessOptions {
    /// Address to bind; default loopback on the preferred port, or any free port if it is taken.
    pub listen: Option<SocketAddr>,
    /// PEM certificate and PKCS#8 key: serve HTTPS (required beyond loopback).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Extra host names the server is reached by (checked against `Host`).
    pub public_names: Vec<String>,
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
    // Tests and scripts read this line to find the server. The secret goes to the operator's
    // terminal only, never to the log.
    println!("Fleetdeck UI at {scheme}://{shown_host}/?token={}", launch.expose());
    let gate = Gate::new(launch, session, addr, &options.public_names, tls.is_some());
    let app = router(Arc::new(Served { control, context, gate }));
    let stop = cancel.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    let shutdown = cancel.cancelled_owned();
    match tls {
        Some(acceptor) => {
            let listener = crate::tls_listener::listener(listener, acceptor)?;
            axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
        }
        None => axum::serve(listener, app).with_graceful_shutdown(shutdown).await?,
    }
    Ok(())
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
            // Back to the same page without the secret in its URL (and so in the history).
            let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, request.uri().path().to_owned())])
                .into_response();
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

async fn api(
    State(served): State<Arc<Served>>,
    Path(command): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let mut response = match dispatch(&served.control, &command, &body).await {
        Ok(value) => axum::Json(value).into_response(),
        Err(error) => {
            let status = match error.code.as_str() {
                "bad_request" | "invalid_spec" => StatusCode::BAD_REQUEST,
                "unknown_command" | "not_found" => StatusCode::NOT_FOUND,
                "forbidden_path" => StatusCode::FORBIDDEN,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (status, axum::Json(error)).into_response()
        }
    };
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
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
