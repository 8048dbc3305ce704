//! The demo fleet: emulated replicas, a fleet-router over them with its admin API on and a cache-aware
//! policy, and steady traffic through it; what `fleetdeck --demo` and the first window's "start the demo"
//! run ([`Launcher`] is how the app's control crate starts one without knowing what it is made of).
//!
//! The fleet is sized so that routing matters on screen: each replica's KV cache holds the long system
//! prompts of about a third of the tenants, and the traffic keeps the replicas busy. Under a cache-aware
//! policy each tenant sticks to a replica and its prompt stays cached; switch to round_robin and every
//! replica sees every tenant, evicts prompts before their next use (the hit rate falls) and spends its
//! time on prefill (requests queue, TTFT rises), within a minute.
//!
//! Everything binds 127.0.0.1 on free ports and stops when the cancellation token fires. The
//! router's admin token is fresh per run and kept in a 0600 file (never in SQLite), so the app
//! reads the demo router exactly as it reads a real one.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use fleet_sim::load::{self, LoadConfig, LoadStats};
use fleet_sim::{Fleet, ModelConfig};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use fleetdeck_control::RouterTarget;
use fleetdeck_control::demo::{DemoLauncher, LaunchFuture, LaunchedDemo};

/// The demo router's policy: SGLang-style cache-aware routing, so prefix groups stick to
/// replicas and the heat map and decisions have something to show.
pub const DEMO_POLICY: &str = "policy: cache_aware_approx\n";

/// Shape of the demo.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoConfig {
    pub replicas: usize,
    /// Mean requests per second sent through the router.
    pub rps: f64,
    /// KV capacity of each replica, in blocks of 16 tokens.
    pub kv_blocks: u32,
    /// Tenants with a system prompt of their own, and its length in bytes (4 bytes a token).
    pub tenants: usize,
    pub system_prompt_bytes: usize,
    /// The router's policy at start.
    pub policy: String,
}

impl Default for DemoConfig {
    fn default() -> Self {
        // 12 prompts of ~3,000 tokens (~190 blocks each): a replica's 900 blocks hold about four of
        // them, so cache-aware routing (three tenants a replica on four replicas) keeps them all cached,
        // while round-robin makes every replica cycle through all twelve.
        Self {
            replicas: 4,
            rps: 14.0,
            kv_blocks: 900,
            tenants: 12,
            system_prompt_bytes: 12_000,
            policy: DEMO_POLICY.to_owned(),
        }
    }
}

/// A running demo fleet.
#[derive(Debug)]
pub struct DemoFleet {
    /// Base URLs of the emulated replicas (what the app watches).
    pub replica_urls: Vec<String>,
    /// Base URL of the router the traffic goes through.
    pub router_url: String,
    /// The router with its admin token file, for the app to read.
    pub router: RouterTarget,
    pub load: Arc<LoadStats>,
}

impl DemoFleet {
    /// Starts the demo on loopback; it runs until `cancel` fires. The router's admin token is
    /// written to `demo-router.token` (mode 0600) in `token_dir`.
    pub async fn start(config: &DemoConfig, token_dir: &Path, cancel: &CancellationToken) -> Result<Self> {
        let mut listeners = Vec::new();
        for _ in 0..config.replicas {
            listeners.push(
                TcpListener::bind("127.0.0.1:0").await.context("cannot bind a demo replica on 127.0.0.1")?,
            );
        }
        let mut model = ModelConfig::default();
        model.engine.num_gpu_blocks = config.kv_blocks;
        let fleet = Fleet::spawn(listeners, fleet_sim::DEFAULT_MODEL, &model, cancel)?;
        let replica_urls = fleet.urls.clone();

        let router_listener =
            TcpListener::bind("127.0.0.1:0").await.context("cannot bind the demo router")?;
        let router_url = format!("http://{}", router_listener.local_addr()?);
        let token = fleet_store::secrets::random_token()?;
        let token_file = token_dir.join("demo-router.token");
        fleet_store::secrets::write_token_file(&token_file, token.expose())?;
        let router_config = fleet_router::RouterConfig {
            replicas: replica_urls.clone(),
            policy: config.policy.parse().context("the demo policy does not parse")?,
            admin_token: Some(token.expose().into()),
            // "Recent traffic" for the heat map: a minute reacts to what the operator does.
            heat_window: Duration::from_secs(60),
            ..Default::default()
        };
        let stop = cancel.clone();
        tokio::spawn(async move {
            if let Err(error) =
                fleet_router::serve(router_listener, router_config, stop.cancelled_owned()).await
            {
                tracing::error!(%error, "demo router stopped");
            }
        });

        let load = Arc::new(LoadStats::default());
        let load_config = LoadConfig {
            target: router_url.clone(),
            rps: config.rps,
            tenants: config.tenants,
            system_prompt_bytes: config.system_prompt_bytes,
            ..LoadConfig::default()
        };
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .build()
            .context("cannot build the demo's HTTP client")?;
        tokio::spawn(load::run(load_config, client, load.clone(), cancel.clone()));
        tokio::spawn(async move {
            let _ = fleet.join().await;
        });
        let router = RouterTarget {
            url: router_url.clone(),
            token: None,
            token_file: Some(token_file),
            metrics_url: None,
        };
        Ok(Self { replica_urls, router_url, router, load })
    }
}

/// Starts the default demo fleet for the app's `start_demo` command.
#[derive(Debug, Clone, Copy, Default)]
pub struct Launcher;

impl DemoLauncher for Launcher {
    fn launch<'a>(
        &'a self,
        replicas: u32,
        token_dir: &'a Path,
        cancel: CancellationToken,
    ) -> LaunchFuture<'a> {
        Box::pin(async move {
            let config = DemoConfig { replicas: replicas as usize, ..DemoConfig::default() };
            let demo = DemoFleet::start(&config, token_dir, &cancel).await.map_err(|e| format!("{e:#}"))?;
            Ok(LaunchedDemo {
                replica_urls: demo.replica_urls,
                model: fleet_sim::DEFAULT_MODEL.to_owned(),
                router: demo.router,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_policy_is_cache_aware_and_valid() {
        let spec: fleet_router::RouterConfig =
            fleet_router::RouterConfig { policy: DEMO_POLICY.parse().unwrap(), ..Default::default() };
        assert_eq!(spec.policy.policy, "cache_aware_approx");
    }
}
