//! The `fleetdeck` command: the desktop app, or the same UI served over HTTP (`--headless`).
//!
//! Both modes are thin adapters over `fleetdeck_control::Control`; this file only parses
//! the command line, starts the control core (and the demo fleet when asked) on one tokio
//! runtime, and hands it to the window or to the headless server.

mod headless;
mod history;
mod probe;
mod shell;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use fleetdeck_control::demo::{DemoConfig, DemoFleet};
use fleetdeck_control::{Control, ControlConfig, RouterTarget};
use tokio_util::sync::CancellationToken;

/// Port the headless server prefers when `--listen` is not given.
const DEFAULT_HEADLESS_PORT: u16 = 8610;

#[derive(Parser, Debug)]
#[command(
    name = "fleetdeck",
    version,
    about = "Watch and steer an LLM serving fleet",
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
    /// A fleet-router whose admin API feeds the heat map, decisions and headroom views. Repeatable;
    /// pair each with a --router-token-file in the same order. SGLang's SMG or vllm-router are shown too,
    /// read-only: URL,metrics=http://HOST:PROMETHEUS_PORT/metrics adds their policy and counts.
    #[arg(long = "router")]
    routers: Vec<String>,
    /// File holding the admin token of the --router at the same position (mode 0600).
    #[arg(long = "router-token-file")]
    router_token_files: Vec<PathBuf>,
    /// Seconds between scrapes of each replica.
    #[arg(long, default_value_t = 1.0)]
    scrape_interval: f64,
    /// Serve the UI and its API over HTTP instead of opening a window.
    #[arg(long)]
    headless: bool,
    /// Address of the headless server (loopback unless you say otherwise).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The SQLite history file (default: fleetdeck/history.sqlite in the user's data folder).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Set by WebKitWebDriver when it launches the app for UI tests; nothing to do here.
    #[arg(long, hide = true)]
    automation: bool,
}

/// Tools for operators and scripts that run without the window.
#[derive(clap::Subcommand, Debug)]
enum Tool {
    /// Scrape one metrics endpoint twice and print its engine and signals.
    Probe(probe::ProbeArgs),
    /// Query the history database.
    History(history::HistoryArgs),
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
        None => {}
    }
    for url in &cli.replicas {
        anyhow::ensure!(
            url.starts_with("http://") || url.starts_with("https://"),
            "--replica {url:?} is not an http(s) URL; write it like http://127.0.0.1:8100"
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
    let scrape_interval = fleetdeck_control::settings::validate_interval(cli.scrape_interval)
        .map_err(|e| anyhow::anyhow!("--scrape-interval: {e}"))?;
    let db = match &cli.db {
        Some(path) => path.clone(),
        None => dirs::data_dir()
            .context("cannot find the user's data folder; pass --db FILE")?
            .join("fleetdeck")
            .join("history.sqlite"),
    };

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    tauri::async_runtime::set(runtime.handle().clone());
    let cancel = CancellationToken::new();
    let control = runtime.block_on(async {
        let mut config = ControlConfig::new(cli.replicas.clone(), db.clone());
        config.scrape_interval = scrape_interval;
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
        println!("history: {}", db.display());
        Control::start(config, cancel.clone()).await
    })?;

    let context = tauri::generate_context!();
    let display = find_display();
    if cli.headless || display.is_err() {
        if let (false, Err(why)) = (cli.headless, &display) {
            println!("{why}: serving the UI over HTTP instead");
        }
        let served = runtime.block_on(headless::run(cli.listen, control, context, cancel.clone()));
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

/// Writes a tool's report to stdout in one go; a reader that stops early (`| head`) is not
/// an error, and never a panic as `println!` would make it.
fn write_stdout(report: &str) -> Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(report.as_bytes()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => Err(error.into()),
        _ => Ok(()),
    }
}
