//! The embedded demo fleet: emulated replicas, a fleet-router over them, and steady traffic.
//!
//! Everything binds 127.0.0.1 on free ports and stops when the cancellation token fires.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use fleet_sim::load::{self, LoadConfig, LoadStats};
use fleet_sim::{Fleet, ModelConfig};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Shape of the demo.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoConfig {
    pub replicas: usize,
    /// Mean requests per second sent through the router.
    pub rps: f64,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self { replicas: 4, rps: 6.0 }
    }
}

/// A running demo fleet.
#[derive(Debug)]
pub struct DemoFleet {
    /// Base URLs of the emulated replicas (what the app watches).
    pub replica_urls: Vec<String>,
    /// Base URL of the router the traffic goes through.
    pub router_url: String,
    pub load: Arc<LoadStats>,
}

impl DemoFleet {
    /// Starts the demo on loopback; it runs until `cancel` fires.
    pub async fn start(config: &DemoConfig, cancel: &CancellationToken) -> Result<Self> {
        let mut listeners = Vec::new();
        for _ in 0..config.replicas {
            listeners.push(
                TcpListener::bind("127.0.0.1:0").await.context("cannot bind a demo replica on 127.0.0.1")?,
            );
        }
        let fleet = Fleet::spawn(listeners, fleet_sim::DEFAULT_MODEL, &ModelConfig::default(), cancel)?;
        let replica_urls = fleet.urls.clone();

        let router_listener =
            TcpListener::bind("127.0.0.1:0").await.context("cannot bind the demo router")?;
        let router_url = format!("http://{}", router_listener.local_addr()?);
        let router_config =
            fleet_router::RouterConfig { replicas: replica_urls.clone(), ..Default::default() };
        let stop = cancel.clone();
        tokio::spawn(async move {
            if let Err(error) =
                fleet_router::serve(router_listener, router_config, stop.cancelled_owned()).await
            {
                tracing::error!(%error, "demo router stopped");
            }
        });

        let load = Arc::new(LoadStats::default());
        let load_config = LoadConfig { target: router_url.clone(), rps: config.rps, ..LoadConfig::default() };
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .build()
            .context("cannot build the demo's HTTP client")?;
        tokio::spawn(load::run(load_config, client, load.clone(), cancel.clone()));
        tokio::spawn(async move {
            let _ = fleet.join().await;
        });
        Ok(Self { replica_urls, router_url, load })
    }
}
