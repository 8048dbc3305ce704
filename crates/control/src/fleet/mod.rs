//! The watched fleet: one scrape scheduler over every replica, one batcher feeding the history writer,
//! Prometheus servers as a source of more replicas, and what the fleet views read (the live snapshot and
//! one replica's history).
//!
//! Scraping is `fleet_telemetry::Scheduler`'s: each target on its own timer with a deadline, a size cap, a
//! bound on scrapes in flight and backoff when it fails, keeping its last good signals beside the error and
//! the time of its last good scrape. A failing target never stalls the others. Replicas join and leave the
//! one scheduler as they are added, removed or discovered, without resetting the others' signal windows.
//!
//! Every good scrape, and every Prometheus source's readings, flow to one batcher that hands the history
//! writer one round per scrape interval, so samples reach SQLite in one transaction per interval however
//! many replicas there are. Neither the scheduler nor the batcher ever waits for the database: rounds go
//! through a bounded queue that sheds its oldest unwritten round when full, and failed writes are retried
//! and counted (`history_writer.rs`).

pub mod history_writer;
pub mod prometheus;
pub mod synthetic;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_store::{SampleRow, Store};
use fleet_telemetry::ScrapeLimits;
use fleet_telemetry::scheduler::{Observation, Scheduler, SchedulerConfig, TargetSpec, TargetStatus};
use fleetdeck_api::{
    ApiError, FleetSnapshot, FleetSnapshotArgs, MAX_SYNTHETIC_REPLICAS, ReplicaHistory, ReplicaHistoryArgs,
    ReplicaRow, ScrapeState, Series,
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::audit::{Audit, history_error};
use crate::routers::Routers;
use crate::{lock, unix_ms, unix_ms_now};
use history_writer::HistoryQueue;
use prometheus::PromSources;

/// Most scrapes in flight at once, so a large fleet cannot exhaust sockets.
const MAX_CONCURRENT_SCRAPES: usize = 64;
/// Scrape rounds queued for the history writer before the oldest is shed (a minute at the default interval:
/// a database busy for longer loses its oldest rounds, never the scrapes).
const WRITER_QUEUE_ROUNDS: usize = 60;
/// Readings of Prometheus sources queued for the batcher (one per source and interval).
const SOURCE_QUEUE: usize = 64;
/// Rates, hit rates and TTFT quantiles cover this span (at least three scrape intervals), so
/// a replica with a few requests a second still shows a stable p95.
const SIGNAL_WINDOW: Duration = Duration::from_secs(10);
/// Longest wait between attempts at a failing target.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Points a chart gets at most; longer windows are averaged into wider buckets.
const CHART_POINTS: i64 = 400;

/// The signal window for a scrape interval.
fn signal_window(interval: Duration) -> Duration {
    SIGNAL_WINDOW.max(interval * 3)
}

/// One target's row as the UI shows it.
fn row(id: u32, status: TargetStatus) -> ReplicaRow {
    let last_good_ms = status.last_good.map(unix_ms);
    let scrape = match (&status.error, status.last_attempt, last_good_ms) {
        (Some(message), _, last_good_ms) => ScrapeState::Error { message: message.clone(), last_good_ms },
        (None, Some(_), Some(last_good_ms)) => ScrapeState::Ok { last_good_ms },
        _ => ScrapeState::Pending,
    };
    let signals = status.signals;
    let tokens_per_s = signals.as_ref().and_then(|s| tokens_per_s(&s.total));
    ReplicaRow {
        id,
        url: status.url,
        engine: signals.as_ref().map(|s| s.engine.name().to_string()),
        model: signals.as_ref().and_then(|s| s.model.clone()),
        signals: signals.map(|s| crate::signals::to_api(&s.total)).unwrap_or_default(),
        scrape,
        tokens_per_s,
    }
}

/// Prompt plus generated tokens per second, when the engine reports either.
pub(crate) fn tokens_per_s(signals: &fleet_telemetry::EngineSignals) -> Option<f64> {
    match (signals.prompt_tokens_per_s, signals.generation_tokens_per_s) {
        (None, None) => None,
        (p, g) => Some(p.unwrap_or(0.0) + g.unwrap_or(0.0)),
    }
}

/// A sample row from one observation of scraped signals.
pub(crate) fn sample_row(url: String, at_ms: i64, signals: &fleet_telemetry::ReplicaSignals) -> SampleRow {
    SampleRow {
        url,
        model: signals.model.clone().unwrap_or_default(),
        ts_ms: at_ms,
        signals: crate::signals::sample_signals(&signals.total),
        prompt_tok_s: signals.total.prompt_tokens_per_s,
        gen_tok_s: signals.total.generation_tokens_per_s,
    }
}

/// What the fleet is built from (the app's shared parts).
#[derive(Debug)]
pub(crate) struct FleetParts {
    pub store: Store,
    pub http: reqwest::Client,
    pub limits: ScrapeLimits,
    pub interval: Duration,
    /// The database file, shown with the history writer's counters.
    pub db_path: String,
    pub audit: Audit,
    pub routers: Routers,
}

/// The watched replicas. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Fleet {
    inner: Arc<FleetInner>,
}

#[derive(Debug)]
struct FleetInner {
    store: Store,
    http: reqwest::Client,
    limits: ScrapeLimits,
    scheduler: Scheduler,
    ids: Mutex<Ids>,
    /// The scrape interval; the batcher follows it.
    interval: watch::Sender<Duration>,
    history: Arc<HistoryQueue>,
    /// Readings of the Prometheus sources, joining the scrapes' round in the batcher.
    source_rounds: mpsc::Sender<Vec<SampleRow>>,
    prometheus: PromSources,
    audit: Audit,
    routers: Routers,
    cancel: CancellationToken,
}

/// Row ids: one sequence for scraped replicas and Prometheus instances, stable while they are watched.
#[derive(Debug, Default)]
struct Ids {
    next: u32,
}

impl Fleet {
    /// Starts the scheduler (with no targets yet), the batcher and the history writer; all run until
    /// `cancel` fires.
    pub(crate) fn start(parts: FleetParts, cancel: CancellationToken) -> Self {
        let FleetParts { store, http, limits, interval, db_path, audit, routers } = parts;
        let config = SchedulerConfig {
            max_concurrent: MAX_CONCURRENT_SCRAPES,
            max_backoff: MAX_BACKOFF,
            window: signal_window(interval),
            ..SchedulerConfig::default()
        };
        let (scheduler, observations) = Scheduler::new(config, http.clone(), cancel.child_token());
        let history = Arc::new(HistoryQueue::new(WRITER_QUEUE_ROUNDS, db_path));
        {
            let (history, store, cancel) = (history.clone(), store.clone(), cancel.clone());
            tokio::spawn(async move { history.run(store, cancel).await });
        }
        let (interval_tx, interval_rx) = watch::channel(interval);
        let (source_rounds, source_rx) = mpsc::channel(SOURCE_QUEUE);
        tokio::spawn(batch_rounds(observations, source_rx, history.clone(), interval_rx, cancel.clone()));
        let inner = FleetInner {
            store,
            http,
            limits,
            scheduler,
            ids: Mutex::default(),
            interval: interval_tx,
            history,
            source_rounds,
            prometheus: PromSources::default(),
            audit,
            routers,
            cancel,
        };
        Self { inner: Arc::new(inner) }
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }

    pub(crate) fn limits(&self) -> ScrapeLimits {
        self.inner.limits
    }

    /// A fresh row id.
    pub(crate) fn allocate_id(&self) -> u32 {
        let mut ids = lock(&self.inner.ids);
        let id = ids.next;
        ids.next += 1;
        id
    }

    /// Starts scraping `url` unless it is watched already; whether it was added.
    pub(crate) fn watch(&self, url: &str) -> bool {
        // One lock across the check and the add, so two callers cannot add one URL twice.
        let mut ids = lock(&self.inner.ids);
        if self.inner.scheduler.contains_url(url) {
            return false;
        }
        let id = ids.next;
        ids.next += 1;
        let spec =
            TargetSpec { url: url.to_owned(), interval: self.scrape_interval(), limits: self.inner.limits };
        self.inner.scheduler.add(id, spec);
        true
    }

    /// Starts scraping every URL of `urls` not watched yet.
    pub(crate) fn watch_all<'a>(&self, urls: impl IntoIterator<Item = &'a String>) {
        for url in urls {
            self.watch(url);
        }
    }

    /// Stops watching `url` (the other targets carry on untouched); whether it was watched.
    pub(crate) fn unwatch(&self, url: &str) -> bool {
        let _ids = lock(&self.inner.ids);
        self.inner.scheduler.id_of(url).is_some_and(|id| self.inner.scheduler.remove(id))
    }

    /// Whether `url` is watched.
    pub(crate) fn watches(&self, url: &str) -> bool {
        self.inner.scheduler.contains_url(url)
    }

    /// How many replicas are scraped.
    pub(crate) fn watched_count(&self) -> usize {
        self.inner.scheduler.len()
    }

    /// Scrapes every target on `interval` from now on (their signal windows restart).
    pub(crate) fn set_interval(&self, interval: Duration) {
        self.inner.interval.send_replace(interval);
        self.inner.scheduler.set_interval(interval, signal_window(interval));
    }

    pub(crate) fn scrape_interval(&self) -> Duration {
        *self.inner.interval.borrow()
    }

    /// Every watched target's row (scraped and read through Prometheus), by id.
    pub(crate) fn rows(&self) -> Vec<ReplicaRow> {
        let mut rows: Vec<ReplicaRow> =
            self.inner.scheduler.targets().into_iter().map(|(id, status)| row(id, status)).collect();
        rows.extend(self.inner.prometheus.rows());
        rows.sort_by_key(|r| r.id);
        rows
    }

    /// The Prometheus servers read as sources of replicas.
    pub(crate) fn prometheus(&self) -> &PromSources {
        &self.inner.prometheus
    }

    /// Reads the Prometheus server at `url` once per scrape interval until it is removed.
    pub(crate) fn start_prometheus(&self, url: &str) {
        prometheus::spawn_source(self, url);
    }

    /// Hands one round of samples from a source other than the scheduler to the batcher, without waiting
    /// (a full queue drops it and counts it with the scrapes'). It joins the current interval's round.
    pub(crate) fn submit_round(&self, round: Vec<SampleRow>) {
        if !round.is_empty() && self.inner.source_rounds.try_send(round).is_err() {
            self.inner.history.count_dropped_source_round();
        }
    }

    /// The live table and the TTFT p95 series over the last `args.window_s` seconds.
    pub async fn snapshot(&self, args: FleetSnapshotArgs) -> Result<FleetSnapshot, ApiError> {
        if !(10..=86_400).contains(&args.window_s) {
            return Err(ApiError::new(
                "bad_request",
                format!("window_s is {}; it must be between 10 and 86400 seconds", args.window_s),
            ));
        }
        if args.synthetic > MAX_SYNTHETIC_REPLICAS {
            return Err(ApiError::new(
                "bad_request",
                format!("synthetic is {}; ask for at most {MAX_SYNTHETIC_REPLICAS}", args.synthetic),
            ));
        }
        let now_ms = unix_ms_now();
        let mut replicas = self.rows();
        replicas.extend(synthetic::rows(args.synthetic, now_ms));
        let ttft_p95 = if args.skip_series {
            Vec::new()
        } else {
            let series = self
                .inner
                .store
                .ttft_p95_series(now_ms - i64::from(args.window_s) * 1000)
                .await
                .map_err(|e| ApiError::new("history_unavailable", e.to_string()))?;
            series.into_iter().map(|(url, points)| Series { url, points }).collect()
        };
        Ok(FleetSnapshot { now_ms, replicas, ttft_p95, history: self.history_status() })
    }

    /// One replica's charts over the last `window_s` seconds, with policy changes marked.
    pub async fn replica_history(&self, args: ReplicaHistoryArgs) -> Result<ReplicaHistory, ApiError> {
        if !(60..=90 * 86_400).contains(&args.window_s) {
            return Err(ApiError::new(
                "bad_request",
                format!("window_s is {}; pick 60 s to 90 days", args.window_s),
            ));
        }
        let row = self.rows().into_iter().find(|r| r.id == args.id).ok_or_else(|| {
            ApiError::new(
                "not_found",
                format!("no watched replica has id {}; pick one on the Fleet view", args.id),
            )
        })?;
        let now_ms = unix_ms_now();
        let span_ms = i64::from(args.window_s) * 1000;
        let since = now_ms - span_ms;
        let (source, points) = self
            .inner
            .store
            .replica_series(&row.url, since, now_ms, (span_ms / CHART_POINTS).max(1000))
            .await
            .map_err(history_error)?;
        let pick = |f: fn(&fleet_store::SeriesPoint) -> Option<f64>| -> Vec<(i64, f64)> {
            points.iter().filter_map(|p| f(p).map(|v| (p.ts_ms, v))).collect()
        };
        let mut policy_changes = self.inner.audit.markers(since, now_ms).await?;
        policy_changes.extend(self.inner.routers.markers_since(since));
        policy_changes.sort_by_key(|m| m.ts_ms);
        Ok(ReplicaHistory {
            id: row.id,
            url: row.url,
            engine: row.engine,
            model: row.model,
            now_ms,
            window_s: args.window_s,
            tier: source.name().to_owned(),
            ttft_p50_s: pick(|p| p.ttft_p50_s),
            ttft_p95_s: pick(|p| p.ttft_p95_s),
            queue_depth: pick(|p| p.queue_depth),
            kv_usage: pick(|p| p.kv_usage),
            hit_rate: pick(|p| p.hit_rate),
            tokens_per_s: pick(|p| p.tokens_per_s),
            policy_changes,
        })
    }

    /// How storing the scrapes goes (the fleet view's banner).
    pub fn history_status(&self) -> fleetdeck_api::HistoryWriteStatus {
        let mut status = self.inner.history.health();
        status.scrape_observations_dropped = self.inner.scheduler.dropped_observations();
        status
    }

    /// The app's own counters in Prometheus text format (the headless server's `/metrics`).
    pub fn render_metrics(&self) -> String {
        let mut text = String::new();
        self.inner.history.render_metrics(&mut text);
        let dropped = self.history_status().scrape_observations_dropped;
        text.push_str(&format!(
            "# HELP fleetdeck_scrape_observations_dropped_total Scrape results not handed to the history \
             batcher (the scheduler never waits for it).\n# TYPE fleetdeck_scrape_observations_dropped_total \
             counter\nfleetdeck_scrape_observations_dropped_total {dropped}\n"
        ));
        text
    }

    /// The app's lifetime, for the loops the fleet starts.
    pub(crate) fn cancel_token(&self) -> &CancellationToken {
        &self.inner.cancel
    }

    /// A handle that does not keep the fleet alive (for the loops it starts).
    pub(crate) fn downgrade(&self) -> WeakFleet {
        WeakFleet(Arc::downgrade(&self.inner))
    }
}

/// A [`Fleet`] that a background loop holds without keeping it alive.
#[derive(Debug, Clone)]
pub(crate) struct WeakFleet(std::sync::Weak<FleetInner>);

impl WeakFleet {
    pub(crate) fn upgrade(&self) -> Option<Fleet> {
        self.0.upgrade().map(|inner| Fleet { inner })
    }
}

/// Gathers good scrapes and the Prometheus sources' readings and hands them to the writer once per scrape
/// interval (following its changes): one round per transaction. Never waits for the writer. Ends, after a
/// last flush, when the app stops.
async fn batch_rounds(
    mut observations: mpsc::Receiver<Observation>,
    mut source_rounds: mpsc::Receiver<Vec<SampleRow>>,
    writer: Arc<HistoryQueue>,
    mut interval: watch::Receiver<Duration>,
    cancel: CancellationToken,
) {
    let ticker = |every: Duration| {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    };
    let mut ticks = ticker(*interval.borrow_and_update());
    let mut round: Vec<SampleRow> = Vec::new();
    loop {
        let open = tokio::select! {
            observation = observations.recv() => match observation {
                Some(Observation { url, at, result: Ok(signals), .. }) => {
                    round.push(sample_row(url, unix_ms(at), &signals));
                    continue;
                }
                Some(_) => continue,
                None => false,
            },
            Some(mut rows) = source_rounds.recv() => {
                round.append(&mut rows);
                continue;
            }
            Ok(()) = interval.changed() => {
                ticks = ticker(*interval.borrow_and_update());
                continue;
            }
            _ = ticks.tick() => true,
            _ = cancel.cancelled() => false,
        };
        writer.push(std::mem::take(&mut round));
        if !open {
            return;
        }
    }
}
