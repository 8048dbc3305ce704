//! fleet-sim: emulated LLM replicas behind vLLM's real interfaces, and traffic to drive them.
//!
//! - [`model`]: the pure replica model (tokenisation, prefix cache, latency).
//! - [`exposition`]: vLLM's `/metrics` text.
//! - [`openai`]: OpenAI request parsing and response shapes.
//! - [`server`]: one replica's HTTP server.
//! - [`load`]: a steady, prefix-sharing traffic generator (the demo's clients).
//!
//! Nothing here knows about routing policies or the desktop app.

pub mod exposition;
pub mod load;
pub mod model;
pub mod openai;
pub mod server;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use model::ModelConfig;
pub use server::Replica;

/// The default served model name, as a real deployment would report it.
pub const DEFAULT_MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// A set of replicas serving on their listeners until cancelled.
#[derive(Debug)]
pub struct Fleet {
    /// Base URLs (`http://127.0.0.1:PORT`), one per replica, in listener order.
    pub urls: Vec<String>,
    pub replicas: Vec<Arc<Replica>>,
    tasks: Vec<JoinHandle<std::io::Result<()>>>,
}

impl Fleet {
    /// Starts one replica per listener, each serving `model` with `config`.
    pub fn spawn(
        listeners: Vec<TcpListener>,
        model: &str,
        config: &ModelConfig,
        shutdown: &CancellationToken,
    ) -> std::io::Result<Self> {
        let mut fleet = Fleet { urls: Vec::new(), replicas: Vec::new(), tasks: Vec::new() };
        for listener in listeners {
            fleet.urls.push(format!("http://{}", listener.local_addr()?));
            let replica = Replica::new(model, config.clone());
            fleet.replicas.push(replica.clone());
            let shutdown = shutdown.clone();
            fleet.tasks.push(tokio::spawn(async move {
                server::serve(listener, replica, async move { shutdown.cancelled().await }).await
            }));
        }
        Ok(fleet)
    }

    /// Waits for every replica's server to finish (after the shutdown token fires).
    pub async fn join(self) -> std::io::Result<()> {
        for task in self.tasks {
            task.await.map_err(std::io::Error::other)??;
        }
        Ok(())
    }
}
