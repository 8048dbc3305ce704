//! `fleet-sim serve`: its command line and the run function (a module of the binary).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use fleet_kv_events::Encoding;

use fleet_sim::engine::cost::DEFAULT_PROFILE;
use fleet_sim::engine::{LoadFailurePolicy, Profile, TransferCost};
use fleet_sim::kv_publish::{KvEndpoint, KvEventsConfig};
use fleet_sim::pd::{PdConfig, Role};
use fleet_sim::{DEFAULT_MODEL, Flavor, Fleet, ReplicaConfig};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Environment variable holding the admin token (instead of `--admin-token-file`).
pub const ADMIN_TOKEN_ENV: &str = "FLEET_SIM_ADMIN_TOKEN";

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// How many replicas (one process serves hundreds).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    replicas: u16,
    /// Port of the first replica; replica i listens on base-port + i (0 picks free ports).
    #[arg(long, default_value_t = 8100)]
    base_port: u16,
    /// Address to bind. Loopback by default; anything else exposes the emulator.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Served model name (what /v1/models and the metrics' model_name label say).
    #[arg(long, default_value = DEFAULT_MODEL)]
    model: String,
    /// Whose /metrics to speak: vllm (current names), vllm-legacy (pre-0.12 names) or sglang.
    #[arg(long, default_value = "vllm")]
    flavor: Flavor,
    /// Engine profile: a built-in name (llama-3.1-8b-h100, ...) or a YAML file.
    #[arg(long, default_value = DEFAULT_PROFILE)]
    profile: String,
    /// Tokens per KV block (vLLM's --block-size; default from the profile, usually 16).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    block_tokens: Option<u32>,
    /// KV capacity of each replica in blocks (default: the profile's KV memory / block size).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    num_gpu_blocks: Option<u32>,
    /// Concurrent sequences per replica (vLLM's --max-num-seqs).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_num_seqs: Option<u32>,
    /// Token budget of one engine step (vLLM's --max-num-batched-tokens; chunked prefill).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_num_batched_tokens: Option<u32>,
    /// Longest prompt + completion a request may ask for (vLLM's --max-model-len).
    #[arg(long, default_value_t = 32_768, value_parser = clap::value_parser!(u32).range(1..))]
    max_model_len: u32,
    /// Turn prefix caching off (vLLM's --no-enable-prefix-caching).
    #[arg(long)]
    no_enable_prefix_caching: bool,
    /// Publish KV-cache events like vLLM: tcp://HOST:PORT (tcp://*:PORT for every interface);
    /// replica i binds PORT+i.
    #[arg(long, value_name = "ENDPOINT")]
    kv_events: Option<KvEndpoint>,
    /// msgpack encoding of KV event batches: vllm (what vLLM 0.32 sends: an array batch of maps tagged
    /// "type"), array (older vLLM: arrays throughout) or map (maps throughout).
    #[arg(long, default_value = "vllm", requires = "kv_events")]
    kv_events_encoding: Encoding,
    /// First port of the replay sockets (replica i: this + i). Default: kv port + replicas.
    #[arg(long, requires = "kv_events")]
    kv_events_replay_port: Option<u16>,
    /// Topic frame of every KV event message (vLLM's default is empty).
    #[arg(long, default_value = "", requires = "kv_events")]
    kv_events_topic: String,
    /// Serve the fault-injection admin API here (needs a token).
    #[arg(long)]
    admin_listen: Option<SocketAddr>,
    /// File holding the admin bearer token (or set FLEET_SIM_ADMIN_TOKEN).
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// Seed of the random faults (error and drop rates).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Disaggregated serving: prefill (computes prompts, holds their KV for a decode replica), decode
    /// (pulls the KV, then decodes) or both (no disaggregation).
    #[arg(long, default_value = "both")]
    role: Role,
    /// KV bytes per token moved by a transfer (2 x layers x KV heads x head dim x dtype bytes).
    #[arg(long, default_value_t = 131_072)]
    kv_bytes_per_token: u64,
    /// Bandwidth of the KV link between prefill and decode replicas, in gigabits per second.
    #[arg(long, default_value_t = 100.0)]
    transfer_gbps: f64,
    /// Fixed cost of one KV transfer, in milliseconds.
    #[arg(long, default_value_t = 0.5)]
    transfer_latency_ms: f64,
    /// How long a prefill replica holds a finished request's KV for a pull (vLLM's kv_lease_duration).
    #[arg(long, default_value_t = 30_000)]
    kv_lease_ms: u64,
    /// How long a decode replica waits for a prefill's KV (SGLang's waiting timeout); bounds every pull.
    #[arg(long, default_value_t = 300_000, value_parser = clap::value_parser!(u64).range(1..))]
    kv_wait_timeout_ms: u64,
    /// What a failed KV load does on a vLLM decode replica: fail (500, vLLM's default) or recompute.
    #[arg(long, default_value = "fail")]
    kv_load_failure_policy: LoadFailurePolicy,
}

fn replica_config(args: &ServeArgs) -> Result<ReplicaConfig> {
    let profile = Profile::load(&args.profile).with_context(|| format!("--profile {}", args.profile))?;
    let mut engine = profile.engine_config();
    if let Some(block_tokens) = args.block_tokens {
        engine.block_tokens = block_tokens;
        engine.num_gpu_blocks = profile.capacity_blocks(block_tokens);
    }
    if let Some(blocks) = args.num_gpu_blocks {
        engine.num_gpu_blocks = blocks;
    }
    if let Some(seqs) = args.max_num_seqs {
        engine.max_num_seqs = seqs;
    }
    if let Some(tokens) = args.max_num_batched_tokens {
        engine.max_num_batched_tokens = tokens;
    }
    engine.enable_prefix_caching = !args.no_enable_prefix_caching;
    engine.kv_transfer = TransferCost {
        bytes_per_token: args.kv_bytes_per_token,
        gbps: args.transfer_gbps,
        latency_us: (args.transfer_latency_ms.max(0.0) * 1e3).round() as u64,
    };
    ensure!(
        !(args.flavor == Flavor::Sglang && args.kv_load_failure_policy == LoadFailurePolicy::Recompute),
        "--kv-load-failure-policy recompute is vLLM's; SGLang fails a request whose KV transfer failed"
    );
    engine.kv_load_failure_policy = args.kv_load_failure_policy;
    engine.validate().context("engine settings")?;
    let pd = PdConfig {
        role: args.role,
        lease: Duration::from_millis(args.kv_lease_ms),
        wait_timeout: Duration::from_millis(args.kv_wait_timeout_ms),
    };
    Ok(ReplicaConfig { engine, flavor: args.flavor, max_model_len: args.max_model_len, seed: args.seed, pd })
}

fn admin_token(args: &ServeArgs) -> Result<Option<String>> {
    let token = match &args.admin_token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --admin-token-file {}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => std::env::var(ADMIN_TOKEN_ENV).ok().map(|t| t.trim().to_string()),
    };
    match token {
        Some(token) if token.is_empty() => bail!("the admin token is empty; put a secret in the token file"),
        other => Ok(other),
    }
}

pub async fn run(args: ServeArgs, cancel: CancellationToken) -> Result<()> {
    let config = replica_config(&args)?;
    let token = admin_token(&args)?;
    if args.admin_listen.is_some() && token.is_none() {
        bail!("--admin-listen needs a token: --admin-token-file FILE or {ADMIN_TOKEN_ENV}");
    }
    let mut listeners = Vec::with_capacity(usize::from(args.replicas));
    for i in 0..args.replicas {
        let port = if args.base_port == 0 {
            0
        } else {
            args.base_port.checked_add(i).context("--base-port + --replicas runs past port 65535")?
        };
        let addr = SocketAddr::new(args.host, port);
        listeners.push(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}; pick another --base-port"))?,
        );
    }
    let kv_events = args.kv_events.map(|endpoint| KvEventsConfig {
        endpoint,
        replay_port: args.kv_events_replay_port,
        encoding: args.kv_events_encoding,
        topic: args.kv_events_topic.clone(),
    });
    let fleet = Fleet::start(listeners, &args.model, &config, kv_events.as_ref(), &cancel).await?;
    for (i, url) in fleet.urls.iter().enumerate() {
        println!("replica {i} serving {} at {url}", args.model);
        if args.role != Role::Both {
            println!("replica {i} role {}", args.role);
        }
    }
    for (i, endpoints) in fleet.kv_endpoints.iter().enumerate() {
        println!("replica {i} kv events at {} replay {}", endpoints.publish, endpoints.replay);
    }
    if let (Some(addr), Some(token)) = (args.admin_listen, token) {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on --admin-listen {addr}"))?;
        println!("admin API at http://{}", listener.local_addr()?);
        let state = fleet.admin_state(token);
        let stop = cancel.clone();
        tokio::spawn(async move {
            if let Err(error) = fleet_sim::admin::serve(listener, state, stop.cancelled_owned()).await {
                tracing::error!(%error, "admin API stopped");
            }
        });
    }
    ensure!(!fleet.urls.is_empty(), "no replicas started");
    fleet.join().await?;
    Ok(())
}
