//! Emulated fleets that also publish vLLM KV-cache events over ZMQ, for tests of KV-aware routing.

use anyhow::Result;
use fleet_kv_events::Encoding;
use fleet_sim::kv_publish::{KvEndpoint, KvEventsConfig};
use fleet_sim::{Fleet, ReplicaConfig};
use tokio_util::sync::CancellationToken;

use crate::{SimFleet, loopback_listener};

/// Starts `n` replicas on free loopback ports, each publishing KV events in `encoding` on its own
/// free port (PUB and replay endpoints in `fleet.kv_endpoints`, in replica order).
pub async fn spawn_sim_with_kv_events(
    n: usize,
    config: ReplicaConfig,
    encoding: Encoding,
) -> Result<SimFleet> {
    let stop = CancellationToken::new();
    let mut listeners = Vec::new();
    for _ in 0..n {
        listeners.push(loopback_listener().await?);
    }
    let endpoint = KvEndpoint { host: [127, 0, 0, 1].into(), port: 0 };
    let kv = KvEventsConfig { encoding, ..KvEventsConfig::new(endpoint) };
    let fleet = Fleet::start(listeners, fleet_sim::DEFAULT_MODEL, &config, Some(&kv), &stop).await?;
    Ok(SimFleet { fleet, _stop: stop.drop_guard() })
}
