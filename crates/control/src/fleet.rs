//! The watched fleet: the scrape scheduler over every target, the history writer, and the
//! snapshot the UI draws.
//!
//! Scraping is `fleet_telemetry::Scheduler`'s: each target on its own timer with a deadline,
//! a size cap, a bound on scrapes in flight and backoff when it fails, keeping its last good
//! signals beside the error and the time of its last good scrape. A failing target never stalls
//! the others. Good scrapes flow to a batcher that hands them to the history writer once per
//! scrape interval, so samples reach SQLite one round per transaction.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use fleet_store::{SampleRow, Store};
use fleet_telemetry::ScrapeLimits;
use fleet_telemetry::scheduler::{Observation, Scheduler, SchedulerConfig, TargetSpec, TargetStatus};
use fleetdeck_api::{ApiError, FleetSnapshot, FleetSnapshotArgs, ReplicaRow, ScrapeState, Series};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Most scrapes in flight at once, so a large fleet cannot exhaust sockets.
const MAX_CONCURRENT_SCRAPES: usize = 64;
/// Scrape rounds queued for the history writer before scraping waits for it.
const WRITER_QUEUE_ROUNDS: usize = 8;
/// Rates, hit rates and TTFT quantiles cover this span (at least three scrape intervals), so
/// a replica with a few requests a second still shows a stable p95.
const SIGNAL_WINDOW: Duration = Duration::from_secs(10);
/// Longest wait between attempts at a failing target.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// How the control crate is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlConfig {
    /// Replica base URLs (or full metrics URLs) to watch.
    pub targets: Vec<String>,
    pub scrape_interval: Duration,
    pub limits: ScrapeLimits,
    /// The SQLite history file.
    pub db_path: PathBuf,
}

impl ControlConfig {
    pub fn new(targets: Vec<String>, db_path: PathBuf) -> Self {
        Self { targets, scrape_interval: Duration::from_secs(1), limits: ScrapeLimits::default(), db_path }
    }
}

fn unix_ms(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// One target's row as the UI shows it.
fn row(status: TargetStatus) -> ReplicaRow {
    let last_good_ms = status.last_good.map(unix_ms);
    let scrape = match (&status.error, status.last_attempt, last_good_ms) {
        (Some(message), _, last_good_ms) => ScrapeState::Error { message: message.clone(), last_good_ms },
        (None, Some(_), Some(last_good_ms)) => ScrapeState::Ok { last_good_ms },
        _ => ScrapeState::Pending,
    };
    let signals = status.signals;
    ReplicaRow {
        url: status.url,
        engine: signals.as_ref().map(|s| s.engine.name().to_string()),
        model: signals.as_ref().and_then(|s| s.model.clone()),
        signals: signals.map(|s| s.total.to_api()).unwrap_or_default(),
        scrape,
    }
}

/// The app's core, shared by the Tauri shell and the headless server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Control {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    scheduler: Scheduler,
    store: Store,
}

pub fn unix_ms_now() -> i64 {
    unix_ms(SystemTime::now())
}

impl Control {
    /// Opens the history and starts scraping `config.targets` until `cancel` fires.
    pub async fn start(config: ControlConfig, cancel: CancellationToken) -> Result<Self> {
        if let Some(dir) = config.db_path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| {
                format!("cannot create the folder {} for the history database", dir.display())
            })?;
        }
        let store = Store::open(&config.db_path).await?;
        // Downsampling and retention run beside ingestion until the app stops.
        store.spawn_maintenance(fleet_store::MaintenanceConfig::default(), cancel.clone().cancelled_owned());
        let client = reqwest::Client::builder()
            .connect_timeout(config.limits.timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .context("cannot build the scraper's HTTP client")?;
        let specs = config
            .targets
            .iter()
            .map(|url| TargetSpec {
                url: url.clone(),
                interval: config.scrape_interval,
                limits: config.limits,
            })
            .collect();
        let scheduler_config = SchedulerConfig {
            max_concurrent: MAX_CONCURRENT_SCRAPES,
            max_backoff: MAX_BACKOFF,
            window: SIGNAL_WINDOW.max(config.scrape_interval * 3),
            ..SchedulerConfig::default()
        };
        let (scheduler, observations) = Scheduler::start(specs, scheduler_config, client, cancel);
        let (writer, rounds) = mpsc::channel(WRITER_QUEUE_ROUNDS);
        tokio::spawn(write_history(store.clone(), rounds));
        tokio::spawn(batch_rounds(observations, writer, config.scrape_interval));
        Ok(Self { inner: Arc::new(Inner { scheduler, store }) })
    }

    /// The live table and the TTFT p95 series over the last `args.window_s` seconds.
    pub async fn fleet_snapshot(&self, args: FleetSnapshotArgs) -> Result<FleetSnapshot, ApiError> {
        if !(10..=86_400).contains(&args.window_s) {
            return Err(ApiError::new(
                "bad_request",
                format!("window_s is {}; it must be between 10 and 86400 seconds", args.window_s),
            ));
        }
        let now_ms = unix_ms_now();
        let replicas: Vec<ReplicaRow> = self.inner.scheduler.statuses().into_iter().map(row).collect();
        let series = self
            .inner
            .store
            .ttft_p95_series(now_ms - i64::from(args.window_s) * 1000)
            .await
            .map_err(|e| ApiError::new("history_unavailable", e.to_string()))?;
        let ttft_p95 = series.into_iter().map(|(url, points)| Series { url, points }).collect();
        Ok(FleetSnapshot { now_ms, replicas, ttft_p95 })
    }
}

/// Gathers good scrapes and hands them to the writer once per scrape interval: one round per
/// transaction. Ends (after a last flush) when the scheduler stops.
async fn batch_rounds(
    mut observations: mpsc::Receiver<Observation>,
    writer: mpsc::Sender<Vec<SampleRow>>,
    every: Duration,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round: Vec<SampleRow> = Vec::new();
    loop {
        let open = tokio::select! {
            observation = observations.recv() => match observation {
                Some(Observation { url, at, result: Ok(signals), .. }) => {
                    round.push(SampleRow {
                        url,
                        model: signals.model.clone().unwrap_or_default(),
                        ts_ms: unix_ms(at),
                        signals: signals.total.to_api(),
                        prompt_tok_s: signals.total.prompt_tokens_per_s,
                        gen_tok_s: signals.total.generation_tokens_per_s,
                    });
                    continue;
                }
                Some(_) => continue,
                None => false,
            },
            _ = ticks.tick() => true,
        };
        if !round.is_empty() && writer.send(std::mem::take(&mut round)).await.is_err() {
            tracing::error!("history writer stopped; samples are no longer stored");
        }
        if !open {
            return;
        }
    }
}

/// Stores each scrape round in one transaction, in order.
async fn write_history(store: Store, mut rounds: mpsc::Receiver<Vec<SampleRow>>) {
    while let Some(samples) = rounds.recv().await {
        if let Err(error) = store.insert_samples(&samples).await {
            tracing::error!(%error, rows = samples.len(), "could not store a scrape round");
        }
    }
}
