//! The `fleet-router` command: the OpenAI-compatible data plane over a fleet of replicas.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use fleet_policy::PolicySpec;
use fleet_router::{RecordConfig, RouterConfig};
use rand::TryRngCore;
use rand::rngs::OsRng;
use tokio::net::TcpListener;

/// mimalloc rather than glibc's malloc: the proxy allocates and frees a few dozen small objects per
/// request, and switching cut a proxied request from 49.2k to 46.4k user-space instructions (callgrind).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The end of `--help`: the README's examples (a unit test keeps the two the same).
const EXAMPLES: &str = "\
Examples:
  fleet-router --listen 127.0.0.1:8080 --replica http://127.0.0.1:8100 --replica http://127.0.0.1:8101 \\
    --policy-file policy.yaml --admin-token-file token --record traffic.jsonl
      two replicas, a routing policy, the admin API (its token in a file) and recorded traffic
  fleet-router --replica http://127.0.0.1:8100 --tls-cert cert.pem --tls-key key.pem --tokenizer tokenizer.json
      HTTPS and token-exact prefix blocks (built with --features tls,tokenizer)
  fleet-router --policy-etcd http://etcd:2379 --policy-key /fleetdeck/prod/policy --peer-load-prefix /fleetdeck/prod/load/ --router-name edge-1 --replica http://10.0.0.5:8000
      one of several routers over a fleet: the policy from etcd, and the load shared with the others there

The admin API (GET /admin/state, /admin/decisions, PUT /admin/policy, ...) needs the token as
`Authorization: Bearer TOKEN`; /metrics is open.";

#[derive(Parser)]
#[command(
    name = "fleet-router",
    version,
    about = "OpenAI-compatible, cache-aware streaming router for LLM replicas",
    after_help = EXAMPLES
)]
struct Cli {
    /// Address to listen on. Loopback by default; bind 0.0.0.0 only behind a firewall (and with --tls-*).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// A replica: URL[,model=NAME][,kv=tcp://HOST:PORT][,kv_replay=tcp://HOST:PORT][,role=ROLE][,bootstrap=PORT]
    /// (repeat for each). ROLE is prefill, decode or both (the default): a model with prefill replicas runs
    /// in P/D mode, splitting long uncached prompts into a prefill leg there and a decode leg at a
    /// decode/both replica (vLLM's KV-connector flow; SGLang's bootstrap flow for a prefill replica given its
    /// bootstrap PORT), by the thresholds of the policy's `pd` section (min_uncached_tokens 512,
    /// min_prompt_tokens 256, max_prefill_queue 16).
    #[arg(long = "replica")]
    replicas: Vec<String>,
    /// Policy spec (YAML or JSON, see fleet-policy's README); round_robin without it.
    #[arg(long)]
    policy_file: Option<PathBuf>,
    /// File holding the admin API's bearer token (else FLEET_ROUTER_ADMIN_TOKEN; without either the admin API is off).
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// Append every request's trace record (hashes and counts, never text) to this file, rotated by size.
    #[arg(long)]
    record: Option<PathBuf>,
    /// Size at which the --record file rotates.
    #[arg(long, default_value_t = 64 << 20)]
    record_max_bytes: u64,
    /// Rotated --record files kept.
    #[arg(long, default_value_t = 4)]
    record_keep: usize,
    /// Hugging Face tokenizer.json for token-exact prompt blocks (needs the `tokenizer` build feature).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// The model's Jinja chat template (default: tokenizer_config.json's, beside --tokenizer), so chats are
    /// tokenised as the engine renders them.
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// MiB the memo of tokenized prompt chunks may hold: a prefix many prompts share is tokenized once
    /// (with --tokenizer; 0 tokenizes every prompt whole).
    #[arg(long, default_value_t = 64)]
    tokenizer_memo_mb: u64,
    /// Seed of the policy's random draws (random, power_of_two, sampled kv_precise). By default one is
    /// drawn from the OS at start, so that routers over one fleet draw independently (with one seed they
    /// would all draw the same replicas at once); set it to repeat a run's draws.
    #[arg(long)]
    seed: Option<u64>,
    /// Replicas without kv= publish KV events on their HTTP port plus this offset (vLLM --kv-events-config).
    #[arg(long)]
    kv_events_port_offset: Option<u16>,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 16 << 20)]
    max_body_bytes: usize,
    /// Time allowed to connect to a replica, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    connect_timeout_ms: u64,
    /// Longest silence tolerated from a replica mid-answer, in seconds.
    #[arg(long, default_value_t = 120)]
    read_timeout_s: u64,
    /// Idle connections to a replica are closed after this many seconds (keep it below the replica's
    /// keep-alive timeout).
    #[arg(long, default_value_t = 30)]
    upstream_idle_timeout_s: u64,
    /// Time a client has to send a request's headers (an idle keep-alive connection is closed after it), in
    /// seconds.
    #[arg(long, default_value_t = 30)]
    header_read_timeout_s: u64,
    /// Time a client has to send a request's body once its headers are in (a client trickling it gets a
    /// 408 and its connection closed), in seconds.
    #[arg(long, default_value_t = 30)]
    body_read_timeout_s: u64,
    /// Client connections open at once; one over the cap is answered 503 and closed.
    #[arg(long, default_value_t = 8192)]
    max_connections: usize,
    /// On SIGTERM or Ctrl-C, time requests in flight get to finish before their connections are cut, in
    /// seconds (new connections are refused at once).
    #[arg(long, default_value_t = 30)]
    shutdown_grace_s: u64,
    /// Read each replica's queue, running requests and KV usage from its /metrics every this many
    /// milliseconds (off the request path; figures older than 4 intervals are ignored); 0 turns it off.
    /// Each read costs the replica too (vLLM's API server renders every metric it has): with many routers,
    /// share the reads (--peer-load-prefix does, unless --engine-metrics-read-all) or read less often.
    #[arg(long, default_value_t = 250)]
    engine_metrics_ms: u64,
    /// Time one /metrics scrape of a replica may take, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    engine_metrics_timeout_ms: u64,
    /// Health probe interval, in milliseconds.
    #[arg(long, default_value_t = 400)]
    health_interval_ms: u64,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key; needs the `tls` build feature).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Replicas tried per request on connect failures or 5xx before the first byte.
    #[arg(long, default_value_t = 3)]
    max_attempts: usize,
    #[command(flatten)]
    etcd: fleet_etcd::cli::EtcdArgs,
    /// Besides watching, read the etcd key every this many seconds (notices a silent partition).
    #[arg(long, default_value_t = 10)]
    policy_etcd_check_s: u64,
    /// Share load with the fleet's other routers through the --policy-etcd cluster: publish this router's
    /// in-flight prefill and decode blocks per replica under PREFIX + --router-name (on a lease), and weigh
    /// the other routers' requests by what they publish there, e.g. /fleetdeck/FLEET/load/.
    #[arg(long, requires = "policy_etcd", value_name = "PREFIX")]
    peer_load_prefix: Option<String>,
    /// How often this router publishes its load when it changed (with --peer-load-prefix), in milliseconds.
    #[arg(long, default_value_t = 25)]
    peer_load_ms: u64,
    /// With --peer-load-prefix, read every replica's /metrics from this router too, rather than share the
    /// reads with the fleet's other routers (by default each replica is read by one of them and its figures
    /// reach the others with their load summaries, so that an engine pays for one read per interval, not
    /// one per router).
    #[arg(long)]
    engine_metrics_read_all: bool,
    /// This router's name among the fleet's routers (its etcd key with --peer-load-prefix); default: the
    /// host name and the process id.
    #[arg(long)]
    router_name: Option<String>,
    /// Threads serving requests (default: one per core). One thread avoids cross-thread wake-ups, the
    /// lowest latency when the router shares a small machine with its replicas (as nginx's single worker).
    #[arg(long)]
    worker_threads: Option<usize>,
}

/// The host name and the process id: unique among routers on one host, and a restarted router's new name
/// never meets its old key (that goes with its lease).
fn default_router_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().replace('/', "-"))
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "router".to_owned());
    format!("{host}-{}", std::process::id())
}

fn read_token(cli: &Cli) -> Result<Option<String>> {
    if let Some(path) = &cli.admin_token_file {
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --admin-token-file {}", path.display()))?;
        let token = token.trim().to_owned();
        anyhow::ensure!(
            !token.is_empty(),
            "--admin-token-file {} is empty; put the token in it",
            path.display()
        );
        return Ok(Some(token));
    }
    Ok(std::env::var("FLEET_ROUTER_ADMIN_TOKEN")
        .ok()
        .map(|token| token.trim().to_owned())
        .filter(|t| !t.is_empty()))
}

fn main() -> Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let cli = Cli::parse();
    // One thread: tokio's current-thread scheduler, with no work-stealing hand-offs at all.
    let mut runtime = match cli.worker_threads {
        Some(0) => anyhow::bail!("--worker-threads must be at least 1, got 0"),
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(threads) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(threads);
            builder
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    runtime.enable_all().build().context("cannot start the async runtime")?.block_on(run(cli))
}

async fn run(cli: Cli) -> Result<()> {
    let policy = match &cli.policy_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --policy-file {}", path.display()))?;
            text.parse::<PolicySpec>()
                .with_context(|| format!("--policy-file {} is not a valid policy", path.display()))?
        }
        None => PolicySpec::default(),
    };
    let admin_token = read_token(&cli)?;
    let policy_etcd = cli.etcd.connection()?.map(|(etcd, key)| fleet_router::EtcdPolicySource {
        etcd,
        key,
        check_every: Duration::from_secs(cli.policy_etcd_check_s),
    });
    let peer_load = match (&cli.peer_load_prefix, cli.etcd.connection()?) {
        (Some(prefix), Some((etcd, _))) => Some(fleet_router::PeerLoadConfig {
            etcd,
            prefix: prefix.clone(),
            name: cli.router_name.clone().unwrap_or_else(default_router_name),
            interval: Duration::from_millis(cli.peer_load_ms),
            share_engine_reads: !cli.engine_metrics_read_all,
        }),
        _ => None,
    };
    let seed = match cli.seed {
        Some(seed) => seed,
        None => OsRng.try_next_u64().context("cannot draw a seed from the OS; pass --seed N")?,
    };
    let config = RouterConfig {
        replicas: cli.replicas.clone(),
        policy,
        admin_token: admin_token.map(Into::into),
        connect_timeout: Duration::from_millis(cli.connect_timeout_ms),
        read_timeout: Duration::from_secs(cli.read_timeout_s),
        upstream_idle_timeout: Duration::from_secs(cli.upstream_idle_timeout_s),
        header_read_timeout: Duration::from_secs(cli.header_read_timeout_s),
        body_read_timeout: Duration::from_secs(cli.body_read_timeout_s),
        max_connections: cli.max_connections,
        shutdown_grace: Duration::from_secs(cli.shutdown_grace_s),
        max_body_bytes: cli.max_body_bytes,
        max_attempts: cli.max_attempts,
        health: fleet_router::HealthConfig {
            interval: Duration::from_millis(cli.health_interval_ms),
            ..Default::default()
        },
        record: RecordConfig {
            file: cli.record.clone(),
            max_file_bytes: cli.record_max_bytes,
            keep_files: cli.record_keep,
            ..RecordConfig::default()
        },
        kv_events_port_offset: cli.kv_events_port_offset,
        engine_metrics: fleet_router::EngineMetricsConfig {
            interval: Duration::from_millis(cli.engine_metrics_ms),
            timeout: Duration::from_millis(cli.engine_metrics_timeout_ms),
            ..Default::default()
        },
        tokenizer: cli.tokenizer.clone(),
        chat_template: cli.chat_template.clone(),
        tokenizer_memo_bytes: cli.tokenizer_memo_mb.saturating_mul(1 << 20),
        seed,
        tls: cli
            .tls_cert
            .clone()
            .zip(cli.tls_key.clone())
            .map(|(cert, key)| fleet_router::TlsConfig { cert, key }),
        policy_etcd,
        peer_load,
        ..RouterConfig::default()
    };
    config.validate().context("invalid fleet-router options")?;
    let listener = TcpListener::bind(&cli.listen)
        .await
        .with_context(|| format!("cannot listen on {}; pick another --listen address", cli.listen))?;
    let addr = listener.local_addr()?;
    let admin = if config.admin_token.is_some() { "admin API on" } else { "admin API off" };
    let replicas = config.replicas.len();
    let config_tls = config.tls.is_some();
    let mut store = match &config.policy_etcd {
        Some(source) => format!(", policy from etcd key {}", source.key),
        None => String::new(),
    };
    if let Some(share) = &config.peer_load {
        store.push_str(&format!(", load shared as {}", share.key()));
    }
    let grace = config.shutdown_grace;
    // Installed before the router announces itself, so a signal sent right after never meets the
    // default action (which would drop every request in flight).
    let stop = stop_signal()?;
    let (_state, server) = fleet_router::start(listener, config, async move {
        let signal = stop.await;
        eprintln!(
            "fleet-router: {signal}: refusing new connections; requests in flight have {}s to finish",
            grace.as_secs_f64()
        );
    })
    .await?;
    let scheme = if config_tls { "https" } else { "http" };
    println!(
        "fleet-router listening on {scheme}://{addr} over {replicas} replicas ({admin}{store}, policy seed {seed})"
    );
    server.await.context("the router task panicked")??;
    eprintln!("fleet-router: stopped");
    Ok(())
}

/// Resolves to the name of the first of SIGTERM (what Kubernetes and systemd send) or SIGINT (Ctrl-C).
fn stop_signal() -> Result<impl std::future::Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        }
    })
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser as _};
    use fleet_test_support::readme::{commands, readme_commands};

    use super::{Cli, EXAMPLES};

    #[test]
    fn every_readme_example_parses_and_the_help_shows_the_readmes() {
        Cli::command().debug_assert();
        let readme = readme_commands("fleet-router");
        for words in &readme {
            if let Err(error) = Cli::try_parse_from(words) {
                panic!("the README's `{}` does not parse: {error}", words.join(" "));
            }
        }
        let help = commands(EXAMPLES, "fleet-router");
        assert!(!help.is_empty(), "--help shows no example");
        for words in &help {
            assert!(readme.contains(words), "--help's `{}` is not in the README", words.join(" "));
        }
    }
}
