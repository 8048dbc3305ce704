//! The `replay`, `compare` and `gen` subcommands of `fleet-sim`: arguments and what they run.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use fleet_policy::PolicySpec;
use fleet_sim::engine::Profile;
use fleet_sim::replay::{self, PreparedTrace, ReplayConfig, ReplayControl, ReplayReport};
use fleet_sim::workload::{Arrivals, GenConfig};
use fleet_trace::Trace;

/// Settings shared by `replay` and `compare`.
#[derive(Args, Debug, Clone)]
pub struct FleetArgs {
    /// Trace file: Mooncake JSON Lines or a trace recorded by fleet-router.
    #[arg(long)]
    pub trace: PathBuf,
    /// Replicas in the emulated fleet.
    #[arg(long, default_value_t = 8)]
    pub replicas: u32,
    /// KV capacity of one replica, in blocks of --block-tokens tokens (default: the profile's capacity).
    #[arg(long)]
    pub capacity_blocks: Option<u32>,
    /// Engine block size in tokens (default: the trace's own, 512 for Mooncake traces).
    #[arg(long)]
    pub block_tokens: Option<u32>,
    /// Engine profile: a built-in name (llama-3.1-8b-h100, llama-3.1-70b-8xh100, llama-3.1-8b-a100) or a YAML file.
    #[arg(long, default_value = fleet_sim::engine::cost::DEFAULT_PROFILE)]
    pub profile: String,
    /// Replay this many times faster than the trace's timestamps.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Seed of the policy's random draws (and of each request's draw of the profile's extra latency).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Feed replicas' metrics (queue, running, KV usage) to the policy every MS virtual milliseconds, as a
    /// router that scrapes them would (0: before every pick). Default: none, as a fleet-router run with
    /// --engine-metrics-ms 0; fleet-router reads them every 250 ms unless told otherwise.
    #[arg(long, value_name = "MS")]
    pub replica_metrics_ms: Option<u64>,
    /// Routers over the fleet, each with its own policy engine: a request goes through the router that
    /// recorded it when the trace names one (`router`, as the app's what-if tags several routers'
    /// recordings), else its session's router, and a router hears of other routers' requests only through
    /// the replicas' KV events and metrics (give --replica-metrics-ms), as N fleet-routers over one fleet do.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub routers: u32,
    /// With several --routers: each router hands the others its own in-flight prefill and decode blocks
    /// per replica every MS virtual milliseconds (0: before every pick), as fleet-routers publishing
    /// through etcd (`--peer-load-prefix`, every `--peer-load-ms`, 25 by default) do; the others weigh its requests by
    /// those figures instead of the average size of their own, and the prefix marks of the prompts it
    /// routed since, so that each places a prefix where another sent it. Default: none, as routers without
    /// etcd.
    #[arg(long, value_name = "MS")]
    pub peer_load_ms: Option<u64>,
    /// With --peer-load-ms: share the in-flight load only, not the routed prompts (shows what sharing
    /// the prompts is worth; fleet-router always shares both).
    #[arg(long, requires = "peer_load_ms")]
    pub no_peer_prompts: bool,
    /// Disaggregated prefill/decode: this many prefill replicas beside the --replicas decode replicas, each
    /// request split or served locally by the policy's `pd:` thresholds as fleet-router decides.
    #[arg(long, value_name = "N")]
    pub prefill_replicas: Option<u32>,
    /// With --prefill-replicas: the KV link's bandwidth in gigabits per second (as `serve --transfer-gbps`).
    #[arg(long, requires = "prefill_replicas", default_value_t = 100.0)]
    pub transfer_gbps: f64,
    /// With --prefill-replicas: a transfer's fixed cost in milliseconds (as `serve --transfer-latency-ms`).
    #[arg(long, requires = "prefill_replicas", default_value_t = 0.5)]
    pub transfer_latency_ms: f64,
    /// With --prefill-replicas: KV bytes per token (131072 for Llama-3.1-8B in bf16).
    #[arg(long, requires = "prefill_replicas", default_value_t = 131_072)]
    pub kv_bytes_per_token: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `fleet-sim replay`.
#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Policy by name (round_robin, random, least_load, power_of_two, consistent_hash, cache_aware_approx,
    /// kv_precise, weighted_scorers), with default parameters.
    #[arg(long, conflicts_with = "policy_file", required_unless_present = "policy_file")]
    pub policy: Option<String>,
    /// Policy spec file (YAML or JSON), as the router's admin API takes it.
    #[arg(long)]
    pub policy_file: Option<PathBuf>,
    /// Also write every request's outcome (index, replica, prompt and cached tokens, TTFT) to FILE as JSON
    /// Lines, in arrival order: to set a replay beside a live recording request by request.
    #[arg(long, value_name = "FILE")]
    pub requests_out: Option<PathBuf>,
    /// Add the time the recorded requests spent outside the engine model (the router, the HTTP hops, the
    /// engine's tokenising), as the app's what-if does: the median, over the requests recorded under
    /// POLICY (the policy the trace was recorded under), of each one's recorded TTFT less its TTFT in a
    /// replay under POLICY. Needs a trace recorded by fleet-router, with at least 20 first-token times
    /// under POLICY.
    #[arg(long, value_name = "POLICY")]
    pub add_recorded_overhead: Option<String>,
}

/// `fleet-sim compare`.
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Comma-separated policy names or spec files (default: all eight policies).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Replays run at once (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// `fleet-sim gen`.
#[derive(Args, Debug, Clone)]
pub struct GenArgs {
    /// Output file (default: standard output).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Workload config file (YAML/JSON with GenConfig fields); the flags below override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Requests to generate.
    #[arg(long)]
    pub requests: Option<usize>,
    /// Mean arrival rate, requests per second.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Bursty arrivals: bursts at this many times the quiet rate (20% of the time, 5 s on average).
    #[arg(long)]
    pub bursty: Option<f64>,
    /// With --bursty: the share of time in bursts, between 0 and 1 exclusive (default 0.2).
    #[arg(long, requires = "bursty")]
    pub burst_share: Option<f64>,
    /// With --bursty: the mean burst length in seconds (default 5).
    #[arg(long, requires = "bursty")]
    pub burst_s: Option<f64>,
    /// Skew: the hot tenant's (the longest system prompt's) share of the sessions, 0 to 1, e.g. 0.5.
    #[arg(long)]
    pub hot_share: Option<f64>,
    /// Tenants with their own system prompts.
    #[arg(long)]
    pub tenants: Option<usize>,
}

fn read_trace(path: &Path) -> Result<fleet_trace::Trace> {
    let file = File::open(path).with_context(|| format!("cannot open trace {}", path.display()))?;
    fleet_trace::read_trace(BufReader::new(file))
        .with_context(|| format!("cannot read trace {}", path.display()))
}

fn load_policy(name_or_path: &str) -> Result<PolicySpec> {
    let path = Path::new(name_or_path);
    if fleet_policy::POLICY_NAMES.contains(&name_or_path) || !path.exists() {
        let spec = PolicySpec::named(name_or_path);
        spec.validate().with_context(|| format!("--policy {name_or_path}"))?;
        return Ok(spec);
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read policy file {}", path.display()))?;
    text.parse::<PolicySpec>().with_context(|| format!("invalid policy file {}", path.display()))
}

fn prepare(fleet: &FleetArgs, trace: &Trace) -> Result<(PreparedTrace, ReplayConfig)> {
    let prepared = replay::prepare(trace, fleet.block_tokens, fleet.speedup)?;
    let profile = Profile::load(&fleet.profile)?;
    if fleet.capacity_blocks == Some(0) {
        bail!("--capacity-blocks must be at least 1");
    }
    let mut config = ReplayConfig::new(fleet.replicas, PolicySpec::default());
    config.profile = profile;
    config.capacity_blocks = fleet.capacity_blocks;
    config.seed = fleet.seed;
    config.metrics_interval_ms = fleet.replica_metrics_ms;
    // 0, or several routers in front of a prefill pool, the replay itself refuses by name.
    config.routers = fleet.routers;
    config.peer_load_interval_ms = fleet.peer_load_ms;
    config.peer_prompts = !fleet.no_peer_prompts;
    if let Some(prefill_replicas) = fleet.prefill_replicas {
        let transfer = fleet_sim::engine::TransferCost {
            bytes_per_token: fleet.kv_bytes_per_token,
            gbps: fleet.transfer_gbps,
            latency_us: (fleet.transfer_latency_ms.max(0.0) * 1e3).round() as u64,
        };
        transfer
            .validate()
            .map_err(|fix| anyhow::anyhow!("--transfer-gbps {}: {fix}", fleet.transfer_gbps))?;
        config.pd = Some(replay::PdReplay { prefill_replicas, transfer, ..Default::default() });
    }
    Ok((prepared, config))
}

fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, value)?;
    writeln!(stdout)?;
    Ok(())
}

/// Runs `fleet-sim replay`.
pub fn run_replay(args: ReplayArgs) -> Result<()> {
    let recording = read_trace(&args.fleet.trace)?;
    let (trace, mut config) = prepare(&args.fleet, &recording)?;
    config.policy = match (&args.policy, &args.policy_file) {
        (Some(name), _) => load_policy(name)?,
        (None, Some(path)) => load_policy(&path.to_string_lossy())?,
        (None, None) => bail!("give --policy NAME or --policy-file FILE"),
    };
    let mut report = replay::replay(&trace, &config, ReplayControl::default())?;
    if let Some(recorded_under) = &args.add_recorded_overhead {
        let recorded_policy = PolicySpec::named(recorded_under);
        recorded_policy.validate().with_context(|| format!("--add-recorded-overhead {recorded_under}"))?;
        // The overhead compares each recorded request with its replay under the policy it was recorded
        // under: replay that policy too, unless it is the one just replayed.
        let under_recorded = if recorded_policy == config.policy {
            None
        } else {
            let config = ReplayConfig { policy: recorded_policy.clone(), ..config.clone() };
            Some(replay::replay(&trace, &config, ReplayControl::default())?)
        };
        let Some(overhead) = replay::unmodelled_overhead_s(
            &recording,
            &recorded_policy.policy,
            under_recorded.as_ref().unwrap_or(&report),
        ) else {
            bail!(
                "--add-recorded-overhead {recorded_under}: {} has fewer than {} answered requests with a \
                 first-token time recorded under {}; give the policy the trace was recorded under (a \
                 fleet-router recording names it in each line's `policy`), or leave the flag out",
                args.fleet.trace.display(),
                replay::MIN_TIMED_REQUESTS,
                recorded_policy.policy
            );
        };
        report = report.with_ttft_overhead(overhead);
    }
    if let Some(path) = &args.requests_out {
        write_requests(path, &report.per_request)?;
    }
    if args.fleet.json {
        print_json(&report)
    } else {
        write!(std::io::stdout().lock(), "{}", replay::format_report(&report))?;
        Ok(())
    }
}

/// Writes `--requests-out`: one JSON object per line.
fn write_requests(path: &Path, requests: &[replay::RequestReport]) -> Result<()> {
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = BufWriter::new(file);
    for request in requests {
        serde_json::to_writer(&mut out, request)?;
        writeln!(out)?;
    }
    out.flush().with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Runs `fleet-sim compare`.
pub fn run_compare(args: CompareArgs) -> Result<()> {
    let (trace, config) = prepare(&args.fleet, &read_trace(&args.fleet.trace)?)?;
    let names: Vec<String> = if args.policies.is_empty() {
        fleet_policy::POLICY_NAMES.iter().map(|s| (*s).to_owned()).collect()
    } else {
        args.policies.clone()
    };
    let specs = names.iter().map(|n| load_policy(n)).collect::<Result<Vec<_>>>()?;
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let results = replay::compare(&trace, &config, &specs, threads, None);
    let mut rows: Vec<(String, ReplayReport)> = Vec::new();
    for (name, result) in names.into_iter().zip(results) {
        rows.push((name.clone(), result.with_context(|| format!("replaying policy {name}"))?));
    }
    if args.fleet.json {
        let map: serde_json::Map<String, serde_json::Value> =
            rows.into_iter().map(|(n, r)| Ok((n, serde_json::to_value(r)?))).collect::<Result<_>>()?;
        print_json(&map)
    } else {
        write!(std::io::stdout().lock(), "{}", replay::format_comparison(&rows))?;
        Ok(())
    }
}

/// Runs `fleet-sim gen`.
pub fn run_gen(args: GenArgs) -> Result<()> {
    let mut config = match &args.config {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?
            .parse::<GenConfig>()?,
        None => GenConfig::default(),
    };
    if let Some(seed) = args.seed {
        config.seed = seed;
    }
    if let Some(requests) = args.requests {
        config.requests = requests;
    }
    if let Some(rate) = args.rate {
        config.rate_rps = rate;
    }
    if let Some(factor) = args.bursty {
        config.arrivals = Arrivals::Bursty {
            factor,
            on_share: args.burst_share.unwrap_or(0.2),
            mean_burst_s: args.burst_s.unwrap_or(5.0),
        };
    }
    if let Some(share) = args.hot_share {
        config.hot_tenant_share = Some(share);
    }
    if let Some(tenants) = args.tenants {
        config.tenants = tenants;
    }
    let records = fleet_sim::workload::generate(&config)?;
    match &args.out {
        Some(path) => {
            let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            let mut writer = BufWriter::new(file);
            fleet_sim::workload::write_trace(&records, &mut writer)?;
            writer.flush()?;
        }
        None => {
            let mut writer = BufWriter::new(std::io::stdout().lock());
            fleet_sim::workload::write_trace(&records, &mut writer)?;
            writer.flush()?;
        }
    }
    Ok(())
}
