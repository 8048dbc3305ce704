//! The `fleet-sim` command: serve emulated replicas, or drive an endpoint with traffic.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use fleet_sim::load::{self, LoadConfig, LoadStats};
use fleet_sim::{DEFAULT_MODEL, Fleet, ModelConfig};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "fleet-sim",
    version,
    about = "Emulated LLM replicas with vLLM's interfaces, and traffic for them"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve N emulated replicas on consecutive ports of 127.0.0.1.
    Serve {
        /// How many replicas.
        #[arg(long, default_value_t = 4)]
        replicas: u16,
        /// Port of the first replica; replica i listens on base-port + i (0 picks free ports).
        #[arg(long, default_value_t = 8100)]
        base_port: u16,
        /// Address to bind. Loopback by default; anything else exposes the emulator.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Served model name (what /v1/models and the metrics' model_name label say).
        #[arg(long, default_value = DEFAULT_MODEL)]
        model: String,
        /// KV capacity of each replica, in 16-token blocks.
        #[arg(long, default_value_t = ModelConfig::default().capacity_blocks)]
        capacity_blocks: usize,
        /// Concurrent sequences per replica (vLLM's max_num_seqs).
        #[arg(long, default_value_t = ModelConfig::default().max_num_seqs)]
        max_num_seqs: usize,
    },
    /// Send steady streaming chat traffic to an OpenAI endpoint (a router or a replica).
    Load {
        /// Base URL of the endpoint, e.g. http://127.0.0.1:8080.
        #[arg(long)]
        target: String,
        /// Mean requests per second (Poisson arrivals).
        #[arg(long, default_value_t = 8.0)]
        rps: f64,
        /// Stop after this many seconds (default: run until Ctrl-C).
        #[arg(long)]
        duration: Option<f64>,
        /// Distinct tenants sharing system prompts (Zipf popularity).
        #[arg(long, default_value_t = 6)]
        tenants: usize,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    match Cli::parse().command {
        Command::Serve { replicas, base_port, host, model, capacity_blocks, max_num_seqs } => {
            anyhow::ensure!(replicas > 0, "--replicas must be at least 1");
            let mut listeners = Vec::new();
            for i in 0..replicas {
                let port = if base_port == 0 {
                    0
                } else {
                    base_port.checked_add(i).context("--base-port + --replicas runs past port 65535")?
                };
                let addr = format!("{host}:{port}");
                listeners.push(
                    TcpListener::bind(&addr)
                        .await
                        .with_context(|| format!("cannot listen on {addr}; pick another --base-port"))?,
                );
            }
            let config = ModelConfig { capacity_blocks, max_num_seqs, ..ModelConfig::default() };
            let fleet = Fleet::spawn(listeners, &model, &config, &cancel)?;
            for (i, url) in fleet.urls.iter().enumerate() {
                println!("replica {i} serving {model} at {url}");
            }
            fleet.join().await?;
        }
        Command::Load { target, rps, duration, tenants, seed } => {
            anyhow::ensure!(rps > 0.0 && rps.is_finite(), "--rps must be a positive number, got {rps}");
            let config = LoadConfig { target, rps, tenants, seed, ..LoadConfig::default() };
            let stats = Arc::new(LoadStats::default());
            if let Some(seconds) = duration {
                let stop = cancel.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
                    stop.cancel();
                });
            }
            let client = reqwest::Client::builder().connect_timeout(Duration::from_secs(3)).build()?;
            load::run(config, client, stats.clone(), cancel).await;
            println!(
                "sent {} completed {} failed {} dropped {}",
                stats.sent.load(Ordering::Relaxed),
                stats.completed.load(Ordering::Relaxed),
                stats.failed.load(Ordering::Relaxed),
                stats.dropped.load(Ordering::Relaxed)
            );
        }
    }
    Ok(())
}
