//! fleet-routers with their admin API on (a bearer token), in-process on port 0, for tests that
//! read and change a router's policy.

use anyhow::Result;
use fleet_router::RouterConfig;
use tokio_util::sync::CancellationToken;

use crate::{RouterHandle, loopback_listener};

/// Starts a router over `replicas` whose admin API answers to `token`.
pub async fn spawn_admin_router(replicas: &[String], token: &str) -> Result<RouterHandle> {
    spawn_router_with(RouterConfig {
        replicas: replicas.to_vec(),
        admin_token: Some(token.into()),
        ..Default::default()
    })
    .await
}

/// Starts a router with `config` on a free loopback port, serving until the handle is dropped.
pub async fn spawn_router_with(config: RouterConfig) -> Result<RouterHandle> {
    config.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let listener = loopback_listener().await?;
    let addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        fleet_router::serve(listener, config, async move { token.cancelled().await }).await
    });
    Ok(RouterHandle { addr, _stop: stop.drop_guard() })
}
