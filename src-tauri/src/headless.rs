//! The headless server: the embedded UI and its API over HTTP, for browsers and tests.
//!
//! `GET /...` serves the same UI files the window shows (taken from Tauri's embedded
//! assets, so there is one copy in the binary); `POST /api/COMMAND` runs a command of the
//! control core with the JSON body as its arguments, answering `{code, message}` on error
//! (400 for bad arguments, 404 for unknown commands or ids, 500 otherwise).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use fleetdeck_api::ApiError;
use fleetdeck_control::Control;
use serde_json::Value;
use tauri::utils::assets::AssetKey;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

struct Served {
    control: Control,
    context: tauri::Context<tauri::Wry>,
}

/// Binds `listen` (default: loopback on the preferred port, or any free port if taken) and
/// serves until `cancel` fires or Ctrl-C.
pub async fn run(
    listen: Option<SocketAddr>,
    control: Control,
    context: tauri::Context<tauri::Wry>,
    cancel: CancellationToken,
) -> Result<()> {
    let listener = match listen {
        Some(addr) => {
            if !addr.ip().is_loopback() {
                tracing::warn!(%addr, "serving beyond loopback: anyone who can reach this address sees the fleet");
            }
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}; pick another --listen"))?
        }
        None => match TcpListener::bind(("127.0.0.1", crate::DEFAULT_HEADLESS_PORT)).await {
            Ok(listener) => listener,
            Err(_) => TcpListener::bind(("127.0.0.1", 0)).await.context("cannot listen on 127.0.0.1")?,
        },
    };
    // Tests and scripts read this line to find the server.
    println!("Fleetdeck UI at http://{}/", listener.local_addr()?);
    let app = router(Arc::new(Served { control, context }));
    let stop = cancel.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    axum::serve(listener, app).with_graceful_shutdown(cancel.cancelled_owned()).await?;
    Ok(())
}

fn router(served: Arc<Served>) -> Router {
    Router::new()
        .route("/api/{command}", post(api))
        .route("/", get(asset))
        .route("/{*path}", get(asset))
        .with_state(served)
}

async fn api(
    State(served): State<Arc<Served>>,
    Path(command): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    match dispatch(&served.control, &command, &body).await {
        Ok(value) => axum::Json(value).into_response(),
        Err(error) => {
            let status = match error.code.as_str() {
                "bad_request" | "invalid_spec" => StatusCode::BAD_REQUEST,
                "unknown_command" | "not_found" => StatusCode::NOT_FOUND,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (status, axum::Json(error)).into_response()
        }
    }
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
