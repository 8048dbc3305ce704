//! `fleet-sim bench`: its command line and the run function (a module of the binary).

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use fleet_sim::bench::report::Slo;
use fleet_sim::bench::{self, Api, BenchConfig};
use tokio_util::sync::CancellationToken;

/// `fleet-sim bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Base URL of the OpenAI endpoint to measure: a router, a gateway or one replica.
    #[arg(long)]
    target: String,
    /// Another endpoint of the same fleet (another router); repeat for each. Clients are spread over
    /// --target and these: a trace session always through the same one, other requests by their index.
    #[arg(long = "also-target", value_name = "URL")]
    also_targets: Vec<String>,
    /// Trace to replay: Mooncake JSON Lines (timestamp ms, input_length, output_length, hash_ids).
    #[arg(long)]
    trace: PathBuf,
    /// Replay this many times faster than the trace's timestamps.
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Send only the trace's first N requests.
    #[arg(long)]
    max_requests: Option<usize>,
    /// A replica's metrics endpoint (base URL or full URL); repeat for each. The run's prefix hit rate is
    /// the increase of their own counters (any engine fleetdeck reads: vLLM, SGLang, TGI, ...).
    #[arg(long = "metrics", value_name = "URL")]
    metrics: Vec<String>,
    /// `chat` (/v1/chat/completions) or `completions` (/v1/completions).
    #[arg(long, default_value = "chat")]
    api: Api,
    /// The `model` of every request (default: the first the target lists at /v1/models).
    #[arg(long)]
    model: Option<String>,
    /// Requests awaiting their answer at most; later arrivals are counted as overflow, not queued.
    #[arg(long, default_value_t = 2048)]
    max_in_flight: usize,
    /// Deadline of one request, seconds.
    #[arg(long, default_value_t = 600.0)]
    request_timeout_s: f64,
    /// Longest silence before the first byte or between chunks, seconds.
    #[arg(long, default_value_t = 120.0)]
    idle_timeout_s: f64,
    /// Do not send `ignore_eos: true` (for servers that refuse unknown fields; lengths then vary).
    #[arg(long)]
    no_ignore_eos: bool,
    /// Goodput counts only requests whose time to first token is at most this.
    #[arg(long)]
    slo_ttft_ms: Option<f64>,
    /// Goodput counts only requests whose mean time per output token (after the first) is at most this.
    #[arg(long)]
    slo_tpot_ms: Option<f64>,
    /// Print the report as JSON on stdout (progress stays on stderr).
    #[arg(long)]
    json: bool,
}

fn seconds(value: f64, flag: &str) -> Result<Duration> {
    anyhow::ensure!(
        value.is_finite() && value > 0.0,
        "{flag} must be a positive number of seconds, got {value}"
    );
    Ok(Duration::from_secs_f64(value))
}

pub async fn run(args: BenchArgs, cancel: CancellationToken) -> Result<()> {
    let file =
        File::open(&args.trace).with_context(|| format!("cannot open --trace {}", args.trace.display()))?;
    let trace = fleet_trace::read_trace(BufReader::new(file))
        .with_context(|| format!("--trace {} is not a usable trace", args.trace.display()))?;
    let config = BenchConfig {
        target: args.target.trim_end_matches('/').to_owned(),
        also_targets: args.also_targets.iter().map(|t| t.trim_end_matches('/').to_owned()).collect(),
        api: args.api,
        model: args.model,
        speedup: args.speedup,
        max_requests: args.max_requests,
        metrics: args.metrics,
        max_in_flight: args.max_in_flight,
        request_timeout: seconds(args.request_timeout_s, "--request-timeout-s")?,
        idle_timeout: seconds(args.idle_timeout_s, "--idle-timeout-s")?,
        ignore_eos: !args.no_ignore_eos,
        slo: Slo { ttft_ms: args.slo_ttft_ms, tpot_ms: args.slo_tpot_ms },
        ..BenchConfig::default()
    };
    config.validate()?;
    let count = config.max_requests.unwrap_or(usize::MAX).min(trace.len());
    let span_s = trace.records[..count].last().map_or(0, |r| r.timestamp - trace.records[0].timestamp) as f64
        / 1000.0
        / config.speedup;
    eprintln!(
        "bench: {count} requests from {} over {span_s:.0} s ({}x) to {}{}",
        args.trace.display(),
        config.speedup,
        config.target,
        if config.also_targets.is_empty() {
            String::new()
        } else {
            format!(" and {}", config.also_targets.join(", "))
        }
    );
    let report = bench::run(&config, &trace, &args.trace.display().to_string(), cancel).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(())
}
