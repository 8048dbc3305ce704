//! The `fleet-sim` command: serve emulated replicas, or drive an endpoint with traffic.

mod cli_bench;
mod cli_replay;
mod cli_serve;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};
use fleet_sim::load::{self, LoadConfig, LoadStats};
use tokio_util::sync::CancellationToken;

/// The end of `--help`: the README's examples (a unit test keeps the two the same).
const EXAMPLES: &str = "\
Examples:
  fleet-sim serve --replicas 4 --base-port 8100
      4 vLLM-like replicas on 127.0.0.1:8100..8103
  fleet-sim serve --replicas 256 --base-port 9000 --flavor sglang --profile llama-3.1-70b-8xh100 \\
    --kv-events tcp://127.0.0.1:5557 --kv-events-encoding array \\
    --admin-listen 127.0.0.1:8199 --admin-token-file token
      256 SGLang-like replicas with KV events (on 5557+i) and the fault-injection admin API
  fleet-sim gen --requests 12000 --seed 7 > workload.jsonl
      a seeded workload: tenants, sessions, RAG, bursts
  fleet-sim replay --trace workload.jsonl --replicas 16 --policy kv_precise --json
      what-if: that workload on 16 emulated replicas under one policy
  fleet-sim compare --trace traffic.jsonl --replicas 8 --policies round_robin,cache_aware_approx,kv_precise
      a router's recorded traffic under three policies, side by side
  fleet-sim load --target http://127.0.0.1:8080 --rps 8
      steady prefix-sharing traffic through a router";

#[derive(Parser)]
#[command(
    name = "fleet-sim",
    version,
    about = "Emulated LLM replicas with vLLM's interfaces, traffic for them, and a benchmark client for any endpoint",
    after_help = EXAMPLES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve N emulated replicas on consecutive ports of 127.0.0.1.
    Serve(cli_serve::ServeArgs),
    /// Send steady streaming chat traffic to an OpenAI endpoint (a router or a replica).
    Load {
        /// Base URL of the endpoint, e.g. http://127.0.0.1:8080.
        #[arg(long)]
        target: String,
        /// Another endpoint of the same fleet (another router); repeat for each. Each request goes to
        /// --target or one of these, drawn evenly; the traffic itself stays the same.
        #[arg(long = "also-target", value_name = "URL")]
        also_targets: Vec<String>,
        /// Mean requests per second (Poisson arrivals).
        #[arg(long, default_value_t = 8.0)]
        rps: f64,
        /// Stop after this many seconds (default: run until Ctrl-C).
        #[arg(long)]
        duration: Option<f64>,
        /// Distinct tenants sharing system prompts (Zipf popularity).
        #[arg(long, default_value_t = 6)]
        tenants: usize,
        /// Length of each tenant's system prompt, in bytes (the demo fleet's traffic uses 12000).
        #[arg(long, default_value_t = 6000)]
        system_prompt_bytes: usize,
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// The `model` every request names; "" leaves the field out.
        #[arg(long, default_value = fleet_sim::DEFAULT_MODEL)]
        model: String,
    },
    /// Replay a trace through emulated replicas under one routing policy (what-if).
    Replay(cli_replay::ReplayArgs),
    /// Replay a trace under several policies in parallel and compare them.
    Compare(cli_replay::CompareArgs),
    /// Generate a seeded workload trace (Mooncake JSON Lines).
    Gen(cli_replay::GenArgs),
    /// Replay a trace open-loop against an OpenAI endpoint and report TTFT, ITL, goodput and hit rate.
    Bench(cli_bench::BenchArgs),
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
        Command::Serve(args) => cli_serve::run(args, cancel).await?,
        Command::Load { target, also_targets, rps, duration, tenants, system_prompt_bytes, seed, model } => {
            anyhow::ensure!(rps > 0.0 && rps.is_finite(), "--rps must be a positive number, got {rps}");
            let model = (!model.is_empty()).then_some(model);
            let config = LoadConfig {
                target,
                also_targets,
                rps,
                tenants,
                system_prompt_bytes,
                seed,
                model,
                ..LoadConfig::default()
            };
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
        Command::Replay(args) => quiet_on_closed_pipe(cli_replay::run_replay(args))?,
        Command::Compare(args) => quiet_on_closed_pipe(cli_replay::run_compare(args))?,
        Command::Gen(args) => cli_replay::run_gen(args)?,
        Command::Bench(args) => cli_bench::run(args, cancel).await?,
    }
    Ok(())
}

/// A reader that stops early (`fleet-sim replay --json | head`) closes the pipe: that is its choice, not
/// an error of ours, so the report ends there quietly, as `cat` would.
fn quiet_on_closed_pipe(result: Result<()>) -> Result<()> {
    match result {
        Err(error)
            if error.chain().any(|cause| {
                let kind = cause.downcast_ref::<std::io::Error>().map(std::io::Error::kind).or_else(|| {
                    cause.downcast_ref::<serde_json::Error>().and_then(serde_json::Error::io_error_kind)
                });
                kind == Some(std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            Ok(())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser as _};
    use fleet_test_support::readme::{commands, readme_commands};

    use super::{Cli, EXAMPLES};

    #[test]
    fn every_readme_example_parses_and_the_help_shows_the_readmes() {
        Cli::command().debug_assert();
        let readme = readme_commands("fleet-sim");
        for words in &readme {
            if let Err(error) = Cli::try_parse_from(words) {
                panic!("the README's `{}` does not parse: {error}", words.join(" "));
            }
        }
        let help = commands(EXAMPLES, "fleet-sim");
        assert!(help.len() >= 5, "--help shows too few examples: {help:?}");
        for words in &help {
            assert!(readme.contains(words), "--help's `{}` is not in the README", words.join(" "));
        }
    }
}
