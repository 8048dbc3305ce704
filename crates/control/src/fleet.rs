//! The watched fleet: per-replica scrape state, the once-a-second scrape loop, and the
//! snapshot the UI draws.
//!
//! Each round scrapes every target concurrently (bounded), updates the in-memory state the
//! UI reads, and hands the good samples to a writer task that stores them in one
//! transaction. A target that fails keeps its last good signals and shows the error with
//! the time of its last good scrape; it never stalls the others, because every scrape has
//! its own deadline.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use fleet_store::{SampleRow, Store};
use fleet_telemetry::{Reading, ScrapeLimits};
use fleetdeck_api::{ApiError, FleetSnapshot, FleetSnapshotArgs, ReplicaRow, ScrapeState, Series, Signals};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Most scrapes in flight at once, so a large fleet cannot exhaust sockets.
const MAX_CONCURRENT_SCRAPES: usize = 64;
/// Scrape rounds queued for the history writer before scraping waits for it.
const WRITER_QUEUE_ROUNDS: usize = 8;

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

/// What the app knows of one target.
#[derive(Debug, Clone)]
struct Target {
    url: String,
    last_reading: Option<Reading>,
    signals: Signals,
    scrape: ScrapeState,
}

impl Target {
    fn row(&self) -> ReplicaRow {
        let reading = self.last_reading.as_ref();
        ReplicaRow {
            url: self.url.clone(),
            engine: reading.map(|r| r.engine.name().to_string()),
            model: reading.and_then(|r| r.model.clone()),
            signals: self.signals,
            scrape: self.scrape.clone(),
        }
    }

    fn last_good_ms(&self) -> Option<i64> {
        match self.scrape {
            ScrapeState::Ok { last_good_ms } => Some(last_good_ms),
            ScrapeState::Error { last_good_ms, .. } => last_good_ms,
            ScrapeState::Pending => None,
        }
    }
}

/// The app's core, shared by the Tauri shell and the headless server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Control {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    targets: Mutex<Vec<Target>>,
    store: Store,
}

pub fn unix_ms_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
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
        let targets = config
            .targets
            .iter()
            .map(|url| Target {
                url: url.clone(),
                last_reading: None,
                signals: Signals::default(),
                scrape: ScrapeState::Pending,
            })
            .collect();
        let control = Self { inner: Arc::new(Inner { targets: Mutex::new(targets), store: store.clone() }) };
        let client = reqwest::Client::builder()
            .connect_timeout(config.limits.timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .context("cannot build the scraper's HTTP client")?;
        let (writer, rounds) = mpsc::channel(WRITER_QUEUE_ROUNDS);
        tokio::spawn(write_history(store, rounds));
        tokio::spawn(control.clone().scrape_loop(client, config, writer, cancel));
        Ok(control)
    }

    fn targets(&self) -> MutexGuard<'_, Vec<Target>> {
        // The state is plain data updated in whole assignments; a panic elsewhere cannot
        // leave it torn, so a poisoned lock is taken over rather than propagated.
        self.inner.targets.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn scrape_loop(
        self,
        client: reqwest::Client,
        config: ControlConfig,
        writer: mpsc::Sender<Vec<SampleRow>>,
        cancel: CancellationToken,
    ) {
        let mut ticks = tokio::time::interval(config.scrape_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let urls: Vec<String> = self.targets().iter().map(|t| t.url.clone()).collect();
            let results: Vec<_> = futures_util::stream::iter(urls)
                .map(|url| {
                    let client = &client;
                    async move {
                        let result = fleet_telemetry::scrape(client, &url, config.limits).await;
                        (url, result, unix_ms_now())
                    }
                })
                .buffered(MAX_CONCURRENT_SCRAPES)
                .collect()
                .await;
            let samples = self.apply(results);
            if !samples.is_empty() && writer.send(samples).await.is_err() {
                tracing::error!("history writer stopped; samples are no longer stored");
            }
        }
    }

    /// Folds one round of scrape results into the state; returns the rows to store.
    fn apply(
        &self,
        results: Vec<(String, Result<Reading, fleet_telemetry::ScrapeError>, i64)>,
    ) -> Vec<SampleRow> {
        let mut targets = self.targets();
        let mut samples = Vec::new();
        for (url, result, at_ms) in results {
            let Some(target) = targets.iter_mut().find(|t| t.url == url) else { continue };
            match result {
                Ok(reading) => {
                    target.signals = fleet_telemetry::derive(target.last_reading.as_ref(), &reading);
                    target.scrape = ScrapeState::Ok { last_good_ms: at_ms };
                    samples.push(SampleRow {
                        url: url.clone(),
                        model: reading.model.clone().unwrap_or_default(),
                        ts_ms: at_ms,
                        signals: target.signals,
                    });
                    target.last_reading = Some(reading);
                }
                Err(error) => {
                    tracing::debug!(%url, %error, "scrape failed");
                    target.scrape = ScrapeState::Error {
                        message: error.to_string(),
                        last_good_ms: target.last_good_ms(),
                    };
                }
            }
        }
        samples
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
        let replicas: Vec<ReplicaRow> = self.targets().iter().map(Target::row).collect();
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

/// Stores each scrape round in one transaction, in order.
async fn write_history(store: Store, mut rounds: mpsc::Receiver<Vec<SampleRow>>) {
    while let Some(samples) = rounds.recv().await {
        if let Err(error) = store.insert_samples(&samples).await {
            tracing::error!(%error, rows = samples.len(), "could not store a scrape round");
        }
    }
}
