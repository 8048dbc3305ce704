//! The `fleetdeck` command: the desktop app, or the same UI served over HTTP (`--headless`).
//!
//! Both modes are thin adapters over `fleetdeck_control::Control`; this file only parses
//! the command line, starts the control core (and the demo fleet when asked) on one tokio
//! runtime, and hands it to the window or to the headless server.

mod access;
mod headless;
mod history;
mod probe;
mod shell;
mod tls_listener;
#[cfg(test)]
mod ui_dist;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{CommandFactory as _, Parser};
use fleet_demo::{DemoConfig, DemoFleet};
use fleetdeck_control::{Control, ControlConfig, RouterTarget};
use tokio_util::sync::CancellationToken;

/// Port the headless server prefers when `--listen` is not given.
const DEFAULT_HEADLESS_PORT: u16 = 8610;

/// The end of `--help` (and of the man page): the three ways to give the app a fleet.
const WAYS_IN: &str = "\
Three ways in:
  fleetdeck --replica http://127.0.0.1:8100 --replica http://127.0.0.1:8101
      watch replicas' /metrics directly (vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM, Triton, Dynamo)
  fleetdeck --prometheus http://127.0.0.1:9090
      read the replicas a Prometheus server already scrapes (fleets too big to scrape from a laptop)
  fleetdeck --demo
      an embedded demo fleet: 4 emulated replicas, a fleet-router over them and steady traffic

Add --router URL --router-token-file FILE for the heat map, decisions and policy views, and
--headless to use a browser instead of a window. Started with none of these, the window opens
on an empty fleet where replicas and Prometheus servers can be added (kept for the next start).";

#[derive(Parser, Debug)]
#[command(
    name = "fleetdeck",
    version,
    about = "Watch and steer an LLM serving fleet",
    after_help = WAYS_IN,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// Command-line tools; without one, the app starts.
    #[command(subcommand)]
    tool: Option<Tool>,
    /// Start an embedded demo fleet (emulated replicas, a router, steady traffic) and watch it.
    #[arg(long)]
    demo: bool,
    /// Number of replicas in the demo fleet.
    #[arg(long, default_value_t = 4, requires = "demo")]
    demo_replicas: usize,
    /// A replica to watch: its base URL (metrics at /metrics) or full metrics URL. Repeatable.
    #[arg(long = "replica")]
    replicas: Vec<String>,
    /// A Prometheus server (base URL) whose scrape targets are replicas: their signals come
    /// through PromQL. Repeatable.
    #[arg(long = "prometheus")]
    prometheus: Vec<String>,
    /// A fleet-router whose admin API feeds the heat map, decisions and headroom views. Repeatable;
    /// pair each with a --router-token-file in the same order. SGLang's SMG or vllm-router are shown too,
    /// read-only: URL,metrics=http://HOST:PROMETHEUS_PORT/metrics adds their policy and counts.
    #[arg(long = "router")]
    routers: Vec<String>,
    /// File holding the admin token of the --router at the same position (mode 0600).
    #[arg(long = "router-token-file")]
    router_token_files: Vec<PathBuf>,
    #[command(flatten)]
    etcd: fleetdeck_control::fleet_etcd::cli::EtcdArgs,
    /// Find replicas (and routers) in this file, read again every scrape interval: Prometheus file_sd,
    /// {replicas: [...], routers: [{url, token_file}]} or a list of URLs, in JSON or YAML. Repeatable.
    #[arg(long = "discover-file", value_name = "FILE")]
    discover_files: Vec<PathBuf>,
    /// Find replicas in the SRV records of this name (e.g. _vllm._tcp.fleet.internal), asked every scrape
    /// interval. Repeatable.
    #[arg(long = "discover-srv", value_name = "NAME")]
    discover_srv: Vec<String>,
    /// DNS server for --discover-srv (default: the first nameserver of /etc/resolv.conf).
    #[arg(long, value_name = "HOST:PORT")]
    dns_server: Option<SocketAddr>,
    /// Seconds between scrapes of each replica.
    #[arg(long, default_value_t = 1.0)]
    scrape_interval: f64,
    /// Serve the UI and its API over HTTP instead of opening a window.
    #[arg(long)]
    headless: bool,
    /// Address of the headless server (loopback unless you say otherwise; beyond loopback it needs
    /// --tls-cert and --tls-key).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// PEM certificate chain for serving the headless UI over HTTPS.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PKCS#8 PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// A host name the headless UI is reached by besides loopback (e.g. its name on a VPN); requests
    /// addressed to any other name are refused. Repeatable.
    #[arg(long = "public-name")]
    public_names: Vec<String>,
    /// Folder the what-if may read trace files from; the UI names a file in it (no other path is
    /// ever opened on the API's behalf).
    #[arg(long)]
    trace_dir: Option<PathBuf>,
    /// The SQLite history file (default: fleetdeck/history.sqlite in the user's data folder; with
    /// --demo, fleetdeck/demo/history.sqlite, so demo samples never mix with a real fleet's).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Set by WebKitWebDriver when it launches the app for UI tests; nothing to do here.
    #[arg(long, hide = true)]
    automation: bool,
}

/// The history file when `--db` is not given: the demo keeps its own (with its own settings and tokens
/// beside it), so its emulated samples never enter a real fleet's comparisons.
fn default_db(data_dir: &std::path::Path, demo: bool) -> PathBuf {
    let folder = data_dir.join("fleetdeck");
    if demo { folder.join("demo").join("history.sqlite") } else { folder.join("history.sqlite") }
}

/// Tools for operators and scripts that run without the window.
#[derive(clap::Subcommand, Debug)]
enum Tool {
    /// Scrape one metrics endpoint twice and print its engine and signals.
    Probe(probe::ProbeArgs),
    /// Query the history database.
    History(history::HistoryArgs),
    /// Write the man pages (fleetdeck.1 and one per tool) into a folder; used to package the app.
    #[command(hide = true)]
    Man {
        /// The folder to write into (created if missing).
        out_dir: PathBuf,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    match cli.tool {
        Some(Tool::Probe(args)) => return probe::run(args),
        Some(Tool::History(args)) => return history::run(args),
        Some(Tool::Man { out_dir }) => return write_man_pages(&out_dir),
        None => {}
    }
    for url in &cli.replicas {
        anyhow::ensure!(
            url.starts_with("http://") || url.starts_with("https://"),
            "--replica {url:?} is not an http(s) URL; write it like http://127.0.0.1:8100"
        );
    }
    for url in &cli.prometheus {
        anyhow::ensure!(
            url.starts_with("http://") || url.starts_with("https://"),
            "--prometheus {url:?} is not an http(s) URL; write it like http://127.0.0.1:9090"
        );
    }
    for router in &cli.routers {
        let url = router.split_once(",metrics=").map_or(router.as_str(), |(url, _)| url);
        anyhow::ensure!(
            url.starts_with("http://") || url.starts_with("https://"),
            "--router {url:?} is not an http(s) URL; write it like http://127.0.0.1:8080"
        );
    }
    anyhow::ensure!(
        cli.router_token_files.len() <= cli.routers.len(),
        "there are more --router-token-file than --router options; give one token file per router, in order"
    );
    if let Some(addr) = cli.listen {
        access::check_listen(addr, cli.tls_cert.is_some()).map_err(anyhow::Error::msg)?;
    }
    if let Some(dir) = &cli.trace_dir {
        anyhow::ensure!(
            dir.is_dir(),
            "--trace-dir {} is not a folder; create it or pick another",
            dir.display()
        );
    }
    let scrape_interval = fleetdeck_control::settings::validate_interval(cli.scrape_interval)
        .map_err(|e| anyhow::anyhow!("--scrape-interval: {e}"))?;
    let db = match &cli.db {
        Some(path) => path.clone(),
        None => default_db(
            &dirs::data_dir().context("cannot find the user's data folder; pass --db FILE")?,
            cli.demo,
        ),
    };

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    tauri::async_runtime::set(runtime.handle().clone());
    let cancel = CancellationToken::new();
    let control = runtime.block_on(async {
        let mut config = ControlConfig::new(cli.replicas.clone(), db.clone());
        config.scrape_interval = scrape_interval;
        config.trace_dir = cli.trace_dir.clone();
        config.prometheus = cli.prometheus.clone();
        config.demo = Some(std::sync::Arc::new(fleet_demo::Launcher));
        for path in &cli.discover_files {
            config.discovery.push(fleetdeck_control::DiscoverySource::File(path.clone()));
        }
        for name in &cli.discover_srv {
            config
                .discovery
                .push(fleetdeck_control::DiscoverySource::Srv { name: name.clone(), server: cli.dns_server });
        }
        if let Some((etcd, key)) = cli.etcd.connection()? {
            config.etcd_policy = Some(fleetdeck_control::EtcdPolicyConfig { etcd, key });
        }
        for (i, router) in cli.routers.iter().enumerate() {
            let (url, metrics_url) = match router.split_once(",metrics=") {
                Some((url, metrics)) => (url.to_owned(), Some(metrics.to_owned())),
                None => (router.clone(), None),
            };
            config.routers.push(RouterTarget {
                url,
                token: None,
                token_file: cli.router_token_files.get(i).cloned(),
                metrics_url,
            });
        }
        if cli.demo {
            let demo = DemoFleet::start(
                &DemoConfig { replicas: cli.demo_replicas, ..DemoConfig::default() },
                &config.token_dir,
                &cancel,
            )
            .await?;
            println!("demo fleet: {} replicas, router at {}", demo.replica_urls.len(), demo.router_url);
            config.targets.extend(demo.replica_urls);
            config.routers.push(demo.router);
        }
        if cli.demo && cli.db.is_none() {
            println!("history: {} (the demo's own database; --db FILE to choose)", db.display());
        } else {
            println!("history: {}", db.display());
        }
        Control::start(config, cancel.clone()).await
    })?;

    let context = tauri::generate_context!();
    let display = find_display();
    if cli.headless || display.is_err() {
        if let (false, Err(why)) = (cli.headless, &display) {
            println!("{why}: serving the UI over HTTP instead");
        }
        let options = headless::HeadlessOptions {
            listen: cli.listen,
            tls: cli.tls_cert.clone().zip(cli.tls_key.clone()),
            public_names: cli.public_names.clone(),
            // Beside the database, with the settings and the token folder.
            sign_in_file: db.parent().unwrap_or(std::path::Path::new(".")).join("sign-in-url"),
        };
        let served = runtime.block_on(headless::run(options, control, context, cancel.clone()));
        cancel.cancel();
        return served;
    }
    let result = shell::run(control, context);
    cancel.cancel();
    result
}

/// Whether a window can open: a Wayland display, or an X display whose local socket exists
/// (GTK aborts on a DISPLAY that names no running server, so that is checked up front).
fn find_display() -> Result<(), String> {
    let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
    if var("WAYLAND_DISPLAY").is_some() {
        return Ok(());
    }
    let Some(display) = var("DISPLAY") else {
        return Err("no display found (DISPLAY and WAYLAND_DISPLAY are unset)".into());
    };
    // ":N" or ":N.S" is a local server listening on /tmp/.X11-unix/XN; other forms (host:N)
    // are remote and cannot be checked cheaply, so they are trusted.
    if let Some(number) = display.strip_prefix(':').and_then(|rest| rest.split('.').next())
        && !std::path::Path::new(&format!("/tmp/.X11-unix/X{number}")).exists()
    {
        return Err(format!("DISPLAY={display} but no X server is running there"));
    }
    Ok(())
}

/// Writes `fleetdeck.1` and a page per tool (`fleetdeck-probe.1`, ...) into `out_dir`, from the
/// same definitions as `--help`, so the packaged pages never drift from the binary.
fn write_man_pages(out_dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;
    clap_mangen::generate_to(Cli::command(), out_dir)
        .with_context(|| format!("cannot write the man pages into {}", out_dir.display()))
}

/// Writes a tool's report to stdout in one go; a reader that stops early (`| head`) is not
/// an error, and never a panic as `println!` would make it.
fn write_stdout(report: &str) -> Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(report.as_bytes()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => Err(error.into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser as _};

    #[test]
    fn the_demo_keeps_its_own_database_unless_told_otherwise() {
        let data = std::path::Path::new("/home/op/.local/share");
        let real = super::default_db(data, false);
        let demo = super::default_db(data, true);
        assert_eq!(real, data.join("fleetdeck/history.sqlite"));
        assert_eq!(demo, data.join("fleetdeck/demo/history.sqlite"));
        // Settings and tokens live beside the database, so the demo's are apart too.
        assert_ne!(real.parent(), demo.parent());
    }
    use fleet_test_support::readme::{commands, readme_commands};

    use super::{Cli, WAYS_IN};

    #[test]
    fn every_readme_example_parses_and_the_help_shows_the_three_ways_in() {
        Cli::command().debug_assert();
        let readme = readme_commands("fleetdeck");
        for words in &readme {
            if let Err(error) = Cli::try_parse_from(words) {
                panic!("the README's `{}` does not parse: {error}", words.join(" "));
            }
        }
        let help = commands(WAYS_IN, "fleetdeck");
        let flags: Vec<&str> = help.iter().map(|words| words[1].as_str()).collect();
        assert_eq!(flags, ["--replica", "--prometheus", "--demo"]);
        for words in &help {
            assert!(readme.contains(words), "--help's `{}` is not in the README", words.join(" "));
        }
        let rendered = Cli::command().render_help().to_string();
        assert!(rendered.contains("Three ways in:"), "{rendered}");
    }
}
