//! Shared test fixtures: emulated fleets and routers on port 0, misbehaving endpoints.
//!
//! Everything binds 127.0.0.1 port 0 and stops when its [`CancellationToken`] fires (each
//! fixture cancels on drop), so tests run in parallel without port clashes or leftovers.

pub mod admin_router;
pub mod dns;
pub mod endpoints;
mod engines;
pub mod etcd;
pub mod llamacpp;
pub mod process;
pub mod readme;
pub mod tls;
pub mod vllm;
pub mod wait;
pub mod webdriver;

pub use wait::eventually;

use std::net::SocketAddr;

use anyhow::Result;
use fleet_sim::{Fleet, ModelConfig};
use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Binds a loopback listener on a free port.
pub async fn loopback_listener() -> Result<TcpListener> {
    Ok(TcpListener::bind("127.0.0.1:0").await?)
}

/// Emulated replicas serving until dropped.
pub struct SimFleet {
    pub fleet: Fleet,
    _stop: DropGuard,
}

impl SimFleet {
    pub fn urls(&self) -> &[String] {
        &self.fleet.urls
    }
}

/// Starts `n` emulated replicas on free ports.
pub async fn spawn_sim(n: usize, config: ModelConfig) -> Result<SimFleet> {
    let stop = CancellationToken::new();
    let mut listeners = Vec::new();
    for _ in 0..n {
        listeners.push(loopback_listener().await?);
    }
    let fleet = Fleet::spawn(listeners, fleet_sim::DEFAULT_MODEL, &config, &stop)?;
    Ok(SimFleet { fleet, _stop: stop.drop_guard() })
}

/// A fleet-router serving until dropped.
pub struct RouterHandle {
    pub addr: SocketAddr,
    _stop: DropGuard,
}

impl RouterHandle {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Starts a router over `replicas` on a free port.
pub async fn spawn_router(replicas: &[String]) -> Result<RouterHandle> {
    admin_router::spawn_router_with(fleet_router::RouterConfig {
        replicas: replicas.to_vec(),
        ..Default::default()
    })
    .await
}
