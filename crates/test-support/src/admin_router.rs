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

/// A disaggregated (P/D) fleet: one fleet-sim prefill replica and one decode replica (vLLM's NIXL flow)
/// behind a fleet-router in P/D mode (`cache_aware_approx`, roles tagged) whose admin API answers to a token.
pub struct PdFleet {
    pub prefill: crate::SimFleet,
    pub decode: crate::SimFleet,
    pub router: RouterHandle,
}

impl PdFleet {
    /// Both replicas' URLs, prefill first: what an app watching the fleet scrapes.
    pub fn replica_urls(&self) -> Vec<String> {
        vec![self.prefill.urls()[0].clone(), self.decode.urls()[0].clone()]
    }
}

/// Starts a [`PdFleet`] whose router's admin API answers to `token`.
pub async fn spawn_pd_fleet(token: &str) -> Result<PdFleet> {
    use fleet_sim::pd::{PdConfig, Role};
    let role = |role| fleet_sim::ModelConfig {
        pd: PdConfig { role, ..PdConfig::default() },
        ..fleet_sim::ModelConfig::default()
    };
    let prefill = crate::spawn_sim(1, role(Role::Prefill)).await?;
    let decode = crate::spawn_sim(1, role(Role::Decode)).await?;
    let model = fleet_sim::DEFAULT_MODEL;
    let router = spawn_router_with(RouterConfig {
        replicas: vec![
            format!("{},model={model},role=prefill", prefill.urls()[0]),
            format!("{},model={model},role=decode", decode.urls()[0]),
        ],
        admin_token: Some(token.into()),
        policy: "policy: cache_aware_approx\n".parse().map_err(|e| anyhow::anyhow!("{e}"))?,
        ..Default::default()
    })
    .await?;
    Ok(PdFleet { prefill, decode, router })
}
