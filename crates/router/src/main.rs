//! The `fleet-router` command: an OpenAI-compatible streaming proxy over a set of replicas.

use anyhow::{Context, Result};
use clap::Parser;
use fleet_router::RouterConfig;
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(name = "fleet-router", version, about = "OpenAI-compatible streaming router for LLM replicas")]
struct Cli {
    /// Address to listen on. Loopback by default; bind 0.0.0.0 only behind a firewall.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Base URL of a replica (repeat for each), e.g. http://127.0.0.1:8100.
    #[arg(long = "replica", required = true)]
    replicas: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let cli = Cli::parse();
    for replica in &cli.replicas {
        anyhow::ensure!(
            replica.starts_with("http://") || replica.starts_with("https://"),
            "--replica {replica:?} is not an http(s) URL; write it like http://127.0.0.1:8100"
        );
    }
    let listener = TcpListener::bind(&cli.listen)
        .await
        .with_context(|| format!("cannot listen on {}; pick another --listen address", cli.listen))?;
    println!(
        "fleet-router listening on http://{} over {} replicas",
        listener.local_addr()?,
        cli.replicas.len()
    );
    let config = RouterConfig { replicas: cli.replicas, ..RouterConfig::default() };
    fleet_router::serve(listener, config, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
