//! fleet-sim's token-protected admin API: list replicas and set or clear their faults at runtime.
//!
//! - `GET /admin/replicas` -> `[{"index", "url", "faults"}]`
//! - `PUT /admin/replicas/{index}/faults` with a [`Faults`] JSON body (every field optional)
//! - `DELETE /admin/replicas/{index}/faults` clears them
//!
//! Every route needs `Authorization: Bearer TOKEN` (compared in constant time; the token is never
//! logged). Errors are JSON `{"code", "message"}`.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tokio::net::TcpListener;

use crate::faults::Faults;
use crate::server::Replica;

/// Largest admin request body (a `Faults` object is a few hundred bytes).
const MAX_ADMIN_BODY: usize = 64 * 1024;

/// What the admin server manages.
#[derive(Debug)]
pub struct AdminState {
    pub token: String,
    /// (base URL, replica), in index order.
    pub replicas: Vec<(String, Arc<Replica>)>,
}

/// Serves the admin API on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AdminState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await
}

pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/admin/replicas", get(list))
        .route("/admin/replicas/{index}/faults", axum::routing::put(set).delete(clear).get(show))
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_ADMIN_BODY))
        .with_state(state)
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, Json(json!({"code": code, "message": message.into()}))).into_response()
}

/// Equal-length byte comparison whose time does not depend on where the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn authorize(State(state): State<Arc<AdminState>>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        Some(token) if constant_time_eq(token.as_bytes(), state.token.as_bytes()) => next.run(request).await,
        Some(_) => error(StatusCode::UNAUTHORIZED, "unauthorized", "the bearer token is wrong"),
        None => error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send `Authorization: Bearer TOKEN` with the token fleet-sim was started with",
        ),
    }
}

fn entry(index: usize, url: &str, replica: &Replica) -> serde_json::Value {
    json!({"index": index, "url": url, "faults": *replica.faults.get()})
}

async fn list(State(state): State<Arc<AdminState>>) -> Json<serde_json::Value> {
    Json(state.replicas.iter().enumerate().map(|(i, (url, r))| entry(i, url, r)).collect())
}

/// An admin request naming a replica that does not exist.
struct UnknownReplica(String);

impl IntoResponse for UnknownReplica {
    fn into_response(self) -> Response {
        error(StatusCode::NOT_FOUND, "unknown_replica", self.0)
    }
}

fn find<'a>(state: &'a AdminState, index: &str) -> Result<(usize, &'a str, &'a Replica), UnknownReplica> {
    let n = state.replicas.len();
    let unknown = || UnknownReplica(format!("no replica {index:?}; indexes are 0..{n}"));
    let i: usize = index.parse().map_err(|_| unknown())?;
    let (url, replica) = state.replicas.get(i).ok_or_else(unknown)?;
    Ok((i, url, replica))
}

async fn show(State(state): State<Arc<AdminState>>, Path(index): Path<String>) -> Response {
    match find(&state, &index) {
        Ok((i, url, replica)) => Json(entry(i, url, replica)).into_response(),
        Err(unknown) => unknown.into_response(),
    }
}

async fn set(State(state): State<Arc<AdminState>>, Path(index): Path<String>, body: Bytes) -> Response {
    let (i, url, replica) = match find(&state, &index) {
        Ok(found) => found,
        Err(unknown) => return unknown.into_response(),
    };
    let faults: Faults = match serde_json::from_slice(&body) {
        Ok(faults) => faults,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!(
                    "the body must be a Faults JSON object (added_latency_ms, error_rate, drop_mid_stream_rate, stall_ms, malformed_metrics, down, kv_transfer_fail_rate, kv_transfer_fail_next): {e}"
                ),
            );
        }
    };
    if let Err(e) = replica.faults.set(faults) {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"code": "invalid_faults", "message": e.to_string(), "field": e.field})),
        )
            .into_response();
    }
    tracing::info!(replica = i, faults = ?replica.faults.get(), "faults set");
    Json(entry(i, url, replica)).into_response()
}

async fn clear(State(state): State<Arc<AdminState>>, Path(index): Path<String>) -> Response {
    match find(&state, &index) {
        Ok((i, url, replica)) => {
            // Default faults always validate.
            let _ = replica.faults.set(Faults::default());
            tracing::info!(replica = i, "faults cleared");
            Json(entry(i, url, replica)).into_response()
        }
        Err(unknown) => unknown.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_bytes() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(constant_time_eq(b"", b""));
    }
}
