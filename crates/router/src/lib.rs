//! fleet-router: an OpenAI-compatible data plane that applies Fleetdeck's routing policy to a fleet of
//! LLM replicas, takes pushed policy live, and records its traffic.
//!
//! - [`config`]: [`RouterConfig`] and replica specs (`URL[,model=NAME][,kv=tcp://HOST:PORT][,role=ROLE]`).
//! - [`pd`]: P/D mode, for model groups with `role=prefill` replicas: split or local per request (the
//!   policy's `pd` thresholds), the prefill leg, and the fallback to a local prefill.
//! - [`routing_key`]: a request's model, prompt blocks and session key (pure).
//! - [`state`]: replicas grouped by model, one `fleet_policy::Engine` per group, policy versions, health.
//! - [`proxy`]: the OpenAI routes: pick, retries before the first byte, unbuffered streaming.
//! - [`upstream`]: each replica's pool of HTTP/1 connections (the hot path), with connect and read timeouts.
//! - [`serve`]: the HTTP/1 server loop (header read timeout, graceful shutdown).
//! - [`admin`]: the token-checked admin API; [`metrics`]: `/metrics`; [`recording`]: the trace ring and file.
//! - [`health`]: hysteresis over probes and request outcomes; [`kv_events`]: KV-event subscription.
//! - [`engine_load`]: each replica's queue, running requests and KV usage from its `/metrics`, scraped in the
//!   background and handed to the policy engine, so load other routers sent is seen.
//! - [`etcd_policy`]: the policy from an etcd key (`--policy-etcd`), watched and validated like an admin PUT;
//!   [`etcd_sessions`]: the watch-reconnect loop and backoff it shares with `peer_load`.
//! - [`peer_load`]: the routers of one fleet publish their in-flight load per replica through etcd
//!   (`--peer-load-prefix`) and weigh each other's requests by it.
//! - `tls` (build feature `tls`): HTTPS with rustls; `tokenizer` (build feature): Hugging Face tokenizers.
//!
//! # Embedding
//!
//! ```no_run
//! # async fn demo(listener: tokio::net::TcpListener) -> anyhow::Result<()> {
//! let config = fleet_router::RouterConfig {
//!     replicas: vec!["http://127.0.0.1:8100".into(), "http://127.0.0.1:8101,model=m".into()],
//!     admin_token: Some("secret".into()),
//!     ..Default::default()
//! };
//! fleet_router::serve(listener, config, async { /* shutdown signal */ }).await
//! # }
//! ```
//!
//! [`serve`] runs until the shutdown future resolves. [`start`] does the same setup and returns the shared
//! [`RouterState`] and the server task, for callers that want to look inside.

pub mod admin;
#[cfg(feature = "tokenizer")]
pub mod chat_template;
pub mod config;
pub mod engine_load;
pub mod etcd_policy;
pub mod etcd_sessions;
pub mod handshake;
pub mod health;
pub mod kv_events;
pub mod metrics;
pub mod pd;
pub mod peer_load;
pub mod proxy;
pub mod recording;
pub mod routing_key;
pub mod serve;
pub mod state;
#[cfg(feature = "tls")]
pub mod tls;
#[cfg(feature = "tokenizer")]
pub mod token_memo;
pub mod upstream;

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use config::{
    AdminToken, ConfigError, EngineMetricsConfig, HealthConfig, RecordConfig, ReplicaSpec, RouterConfig,
    TlsConfig,
};
pub use etcd_policy::EtcdPolicySource;
pub use peer_load::PeerLoadConfig;
pub use routing_key::Tokenize;
pub use state::RouterState;

/// Serves the router on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    config: RouterConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (_state, server) = start(listener, config, shutdown).await?;
    server.await.context("the router task panicked")?
}

/// Sets the router up (tokenizer loaded, replicas added, probes running) and spawns its server; returns the
/// shared state and the server task.
pub async fn start(
    listener: TcpListener,
    config: RouterConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(Arc<RouterState>, JoinHandle<anyhow::Result<()>>)> {
    config.validate()?;
    let specs = config.replica_specs()?;
    let tokenizer = load_tokenizer(
        config.tokenizer.as_deref(),
        config.chat_template.as_deref(),
        config.tokenizer_memo_bytes,
    )?;
    let state = RouterState::new(config, tokenizer)?;
    for spec in specs {
        state.add_replica(spec).await.map_err(|error| anyhow::anyhow!("{error}"))?;
    }
    tokio::spawn(state::probe_loop(state.clone()));
    if state.config.engine_metrics.enabled() {
        tokio::spawn(engine_load::scrape_loop(state.clone()));
    }
    if let Some(store) = &state.etcd_policy {
        // Serve with the store's policy from the first request when etcd answers now; the watcher retries
        // (and says so in /admin/state) when it does not.
        if let Err(error) = etcd_policy::read_once(&state, store).await {
            tracing::warn!(key = %store.key, %error, "cannot read the policy from etcd yet; starting with the policy given and retrying");
        }
        tokio::spawn(etcd_policy::run(state.clone(), store.clone()));
    }
    if let Some(share) = &state.peer_load {
        tokio::spawn(peer_load::publish_loop(state.clone(), share.clone()));
        tokio::spawn(peer_load::watch_loop(state.clone(), share.clone()));
    }
    let routes = serve::Routes::new(state.clone(), app(state.clone()));
    let stop = state.shutdown.clone();
    tokio::spawn(async move {
        shutdown.await;
        stop.cancel();
    });
    let stop = state.shutdown.clone();
    let deadlines = serve::Deadlines {
        header_read: state.config.header_read_timeout,
        shutdown_grace: state.config.shutdown_grace,
        max_connections: state.config.max_connections,
    };
    let server = match &state.config.tls {
        None => {
            use axum::serve::ListenerExt;
            // Streamed tokens are small writes: never hold one back for an ACK (Nagle).
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            tokio::spawn(async move {
                serve::serve(listener, routes, deadlines, stop).await;
                Ok(())
            })
        }
        #[cfg(feature = "tls")]
        Some(tls) => {
            let listener = tls::listener(listener, tls::server_config(&tls.cert, &tls.key)?)?;
            tokio::spawn(async move {
                serve::serve(listener, routes, deadlines, stop).await;
                Ok(())
            })
        }
        #[cfg(not(feature = "tls"))]
        Some(_) => anyhow::bail!(
            "this fleet-router was built without the `tls` feature; rebuild with --features tls"
        ),
    };
    Ok((state, server))
}

/// Loads a Hugging Face `tokenizer.json` (build feature `tokenizer`) with the model's chat template
/// (`chat_template`, else the one beside the tokenizer) and a memo of its prompt chunks of up to
/// `memo_bytes` (none at 0); `None` without a path.
pub fn load_tokenizer(
    path: Option<&std::path::Path>,
    chat_template: Option<&std::path::Path>,
    memo_bytes: u64,
) -> anyhow::Result<Option<Arc<dyn Tokenize>>> {
    let Some(path) = path else { return Ok(None) };
    #[cfg(feature = "tokenizer")]
    {
        Ok(Some(Arc::new(routing_key::HfTokenizer::from_file(path, chat_template, memo_bytes)?)))
    }
    #[cfg(not(feature = "tokenizer"))]
    {
        let _ = (chat_template, memo_bytes);
        anyhow::bail!(
            "cannot use --tokenizer {}: this fleet-router was built without the `tokenizer` feature; rebuild with --features tokenizer",
            path.display()
        )
    }
}

/// The router's routes over `state`.
pub fn app(state: Arc<RouterState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics))
        .with_state(state.clone())
        .merge(admin::routes(state))
        .fallback(not_found)
}

/// Any other path: a 404 in OpenAI's error shape that lists what the router serves.
async fn not_found(request: Request) -> Response {
    let message = format!(
        "no route for {} {}; fleet-router serves POST /v1/chat/completions, POST /v1/completions, \
         GET /v1/models, GET /health, GET /metrics and /admin/*",
        request.method(),
        request.uri().path()
    );
    proxy::openai_error(StatusCode::NOT_FOUND, "not_found_error", &message)
}

async fn chat(State(state): State<Arc<RouterState>>, request: Request) -> Response {
    proxy::handle(state, routing_key::Route::Chat, request).await
}

async fn completions(State(state): State<Arc<RouterState>>, request: Request) -> Response {
    proxy::handle(state, routing_key::Route::Completions, request).await
}

async fn models(State(state): State<Arc<RouterState>>) -> Response {
    proxy::list_models(&state).await
}

async fn metrics(State(state): State<Arc<RouterState>>) -> Response {
    let policy = state.policy.load_full();
    let mut text = state.metrics.render(
        policy.name,
        policy.version,
        &state.replica_gauges(),
        state.recorder.recorded.load(std::sync::atomic::Ordering::Relaxed),
    );
    if let Some(store) = &state.etcd_policy {
        store.render_metrics(&mut text, policy.store_revision.unwrap_or(0));
    }
    if let Some(share) = &state.peer_load {
        share.render_metrics(&mut text, state.now_ms());
    }
    if let Some(tokenizer) = &state.tokenizer {
        tokenizer.render_metrics(&mut text);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}
