//! fleet-sim: emulated LLM replicas behind vLLM's real interfaces, and traffic to drive them.
//!
//! - [`engine`]: the pure replica engine model (paged KV, continuous batching, cost model, tokenisation).
//! - [`driver`]: the per-replica task running the engine on the wall clock.
//! - [`exposition`]: `/metrics` text in vLLM's (current and legacy) and SGLang's names.
//! - [`openai`]: OpenAI request parsing and response shapes.
//! - [`server`]: one replica's HTTP server; [`faults`] and [`admin`]: fault injection at runtime.
//! - [`kv_publish`]: vLLM's KV-cache events over ZMQ (PUB + replay).
//! - [`pd`]: disaggregated prefill/decode at the HTTP edge: roles, vLLM's and SGLang's request flows.
//! - [`load`]: a steady, prefix-sharing traffic generator (the demo's clients).
//! - [`bench`]: a trace-driven, open-loop benchmark client for any OpenAI endpoint (`fleet-sim bench`).
//!
//! Nothing here knows about routing policies or the desktop app.

pub mod admin;
pub mod bench;
pub mod driver;
pub mod engine;
pub mod exposition;
pub mod faults;
pub mod kv_publish;
pub mod load;
pub mod openai;
pub mod pd;
pub mod replay;
pub mod server;
pub mod workload;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use exposition::Flavor;
pub use faults::Faults;
pub use kv_publish::{KvEndpoints, KvEventsConfig};
pub use server::Replica;

use engine::EngineConfig;
use exposition::{ExpositionInfo, ReplicaMetrics};

/// The default served model name, as a real deployment would report it.
pub const DEFAULT_MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// How every replica of a fleet is configured.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaConfig {
    /// The engine model (profile, KV blocks, batch limits). Serve mode always turns on
    /// `token_events`; `kv_events` follows whether events are published.
    pub engine: EngineConfig,
    /// Whose `/metrics` names to speak.
    pub flavor: Flavor,
    /// Longest prompt + output a request may ask for (vLLM's `--max-model-len`).
    pub max_model_len: u32,
    /// Seed of the replicas' fault RNGs (replica `i` uses `seed + i`).
    pub seed: u64,
    /// Disaggregated prefill/decode: the replicas' role, lease and wait bounds.
    pub pd: pd::PdConfig,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        Self {
            engine: EngineConfig::default(),
            flavor: Flavor::Vllm,
            max_model_len: 32_768,
            seed: 0,
            pd: pd::PdConfig::default(),
        }
    }
}

/// The foundation's name for [`ReplicaConfig`], kept so fixtures written against it still build.
pub type ModelConfig = ReplicaConfig;

/// Why a fleet could not start, or a fleet call was refused.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(transparent)]
    Config(#[from] engine::ConfigError),
    #[error(transparent)]
    KvEvents(#[from] kv_publish::KvPublishError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("no replica {index}; this fleet has {replicas}")]
    UnknownReplica { index: usize, replicas: usize },
    #[error(transparent)]
    Faults(#[from] faults::FaultError),
    #[error("a fleet serves at most 65535 replicas")]
    TooManyReplicas,
}

/// A set of replicas serving on their listeners until cancelled.
#[derive(Debug)]
pub struct Fleet {
    /// Base URLs (`http://127.0.0.1:PORT`), one per replica, in listener order.
    pub urls: Vec<String>,
    pub replicas: Vec<Arc<Replica>>,
    /// Per replica, the ZMQ endpoints its KV events are published on (empty without `--kv-events`).
    pub kv_endpoints: Vec<KvEndpoints>,
    tasks: Vec<JoinHandle<std::io::Result<()>>>,
}

impl Fleet {
    /// Starts one replica per listener, each serving `model` with `config`, without KV events.
    pub fn spawn(
        listeners: Vec<TcpListener>,
        model: &str,
        config: &ReplicaConfig,
        shutdown: &CancellationToken,
    ) -> std::io::Result<Self> {
        let mut fleet =
            Fleet { urls: Vec::new(), replicas: Vec::new(), kv_endpoints: Vec::new(), tasks: Vec::new() };
        for (index, listener) in listeners.into_iter().enumerate() {
            let addr = listener.local_addr()?;
            let replica =
                new_replica(index, addr, model, config, None, shutdown).map_err(std::io::Error::other)?;
            fleet.serve(listener, replica, shutdown)?;
        }
        Ok(fleet)
    }

    /// Starts one replica per listener; with `kv_events`, each publishes its KV-cache events
    /// (replica `i` on the `i`-th port of the range, see [`kv_publish`]).
    pub async fn start(
        listeners: Vec<TcpListener>,
        model: &str,
        config: &ReplicaConfig,
        kv_events: Option<&KvEventsConfig>,
        shutdown: &CancellationToken,
    ) -> Result<Self, FleetError> {
        let count = u16::try_from(listeners.len()).map_err(|_| FleetError::TooManyReplicas)?;
        let mut fleet =
            Fleet { urls: Vec::new(), replicas: Vec::new(), kv_endpoints: Vec::new(), tasks: Vec::new() };
        for (index, listener) in listeners.into_iter().enumerate() {
            let kv_out = match kv_events {
                Some(kv) => {
                    let (tx, endpoints) =
                        kv_publish::start(kv, index as u16, count, shutdown.child_token()).await?;
                    fleet.kv_endpoints.push(endpoints);
                    Some(tx)
                }
                None => None,
            };
            let replica = new_replica(index, listener.local_addr()?, model, config, kv_out, shutdown)?;
            fleet.serve(listener, replica, shutdown)?;
        }
        Ok(fleet)
    }

    fn serve(
        &mut self,
        listener: TcpListener,
        replica: Arc<Replica>,
        shutdown: &CancellationToken,
    ) -> std::io::Result<()> {
        self.urls.push(format!("http://{}", listener.local_addr()?));
        self.replicas.push(replica.clone());
        let shutdown = shutdown.clone();
        self.tasks.push(tokio::spawn(async move {
            server::serve(listener, replica, async move { shutdown.cancelled().await }).await
        }));
        Ok(())
    }

    fn replica(&self, index: usize) -> Result<&Arc<Replica>, FleetError> {
        self.replicas.get(index).ok_or(FleetError::UnknownReplica { index, replicas: self.replicas.len() })
    }

    /// Sets replica `index`'s faults (what `PUT /admin/replicas/{index}/faults` does).
    pub fn set_faults(&self, index: usize, faults: Faults) -> Result<(), FleetError> {
        Ok(self.replica(index)?.faults.set(faults)?)
    }

    /// Replica `index`'s current faults.
    pub fn faults(&self, index: usize) -> Result<Faults, FleetError> {
        Ok((*self.replica(index)?.faults.get()).clone())
    }

    /// The admin API's view of this fleet, authorised by `token`.
    pub fn admin_state(&self, token: String) -> Arc<admin::AdminState> {
        Arc::new(admin::AdminState {
            token,
            replicas: self.urls.iter().cloned().zip(self.replicas.iter().cloned()).collect(),
        })
    }

    /// Waits for every replica's server to finish (after the shutdown token fires).
    pub async fn join(self) -> std::io::Result<()> {
        for task in self.tasks {
            task.await.map_err(std::io::Error::other)??;
        }
        Ok(())
    }
}

fn new_replica(
    index: usize,
    addr: std::net::SocketAddr,
    model: &str,
    config: &ReplicaConfig,
    kv_out: Option<tokio::sync::mpsc::Sender<fleet_kv_events::EventBatch>>,
    shutdown: &CancellationToken,
) -> Result<Arc<Replica>, engine::ConfigError> {
    let engine = EngineConfig { token_events: true, kv_events: kv_out.is_some(), ..config.engine.clone() };
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let mut metrics = ReplicaMetrics::new(config.flavor, config.max_model_len, created);
    metrics.block_tokens = engine.block_tokens;
    metrics.num_gpu_blocks = engine.num_gpu_blocks;
    metrics.pd = exposition::PdMetrics::new(config.pd.role, engine.kv_transfer.latency_us as f64 / 1e6);
    let info = ExpositionInfo {
        model_name: model.to_string(),
        engine_index: 0,
        enable_prefix_caching: engine.enable_prefix_caching,
    };
    let driver = driver::spawn(engine, metrics, index as u32, kv_out, shutdown.child_token())?;
    Ok(Arc::new(Replica {
        index,
        info,
        max_model_len: config.max_model_len,
        driver,
        faults: faults::FaultSwitch::new(config.seed.wrapping_add(index as u64)),
        flavor: config.flavor,
        pd: config.pd.clone(),
        addr,
        engine_id: format!("fleet-sim-{}-{index}", std::process::id()),
        rooms: pd::Rooms::default(),
        http: reqwest::Client::builder()
            .timeout(config.pd.wait_timeout + std::time::Duration::from_secs(5))
            .build()
            .unwrap_or_default(),
    }))
}
