//! The watched fleet: the scrape scheduler over every target, the history writer, and the
//! snapshot the UI draws.
//!
//! Scraping is `fleet_telemetry::Scheduler`'s: each target on its own timer with a deadline,
//! a size cap, a bound on scrapes in flight and backoff when it fails, keeping its last good
//! signals beside the error and the time of its last good scrape. A failing target never stalls
//! the others. Good scrapes flow to a batcher that hands them to the history writer once per
//! scrape interval, so samples reach SQLite one round per transaction. Neither the scheduler nor the
//! batcher ever waits for the database: rounds go through a bounded queue that sheds its oldest
//! unwritten round when full, and failed writes are retried and counted (`history_writer.rs`).
//!
//! Targets live in groups, one scheduler each: the targets given at start form one group and
//! each target added later its own, so adding or removing one never resets the others' signal
//! windows. Changing the scrape interval restarts every group.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use fleet_store::{SampleRow, Store};
use fleet_telemetry::ScrapeLimits;
use fleet_telemetry::scheduler::{Observation, Scheduler, SchedulerConfig, TargetSpec, TargetStatus};
use fleetdeck_api::{
    ApiError, FleetSnapshot, FleetSnapshotArgs, MAX_SYNTHETIC_REPLICAS, ReplicaRow, ScrapeState, Series,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::lock;
use crate::routers::{RouterTarget, Routers};
use crate::settings::SavedSettings;
use crate::synthetic;

/// Most scrapes in flight at once per group, so a large fleet cannot exhaust sockets.
const MAX_CONCURRENT_SCRAPES: usize = 64;
/// Scrape rounds queued for the history writer before the oldest is shed (a minute at the default interval:
/// a database busy for longer loses its oldest rounds, never the scrapes).
const WRITER_QUEUE_ROUNDS: usize = 60;
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
    /// fleet-routers whose admin API feeds the heat map, decisions and headroom views.
    pub routers: Vec<RouterTarget>,
    /// Prometheus servers whose targets are replicas (read through PromQL).
    pub prometheus: Vec<String>,
    pub scrape_interval: Duration,
    pub limits: ScrapeLimits,
    /// The SQLite history file.
    pub db_path: PathBuf,
    /// Endpoints added in the app (default: `settings.json` beside the database).
    pub settings_path: PathBuf,
    /// Folder of the routers' 0600 token files (default: `tokens/` beside the database).
    pub token_dir: PathBuf,
    /// The only folder the what-if reads trace files from (`--trace-dir`); `None`: no trace files.
    /// A path from the API is never opened outside it.
    pub trace_dir: Option<PathBuf>,
    /// The etcd key the fleet's routers take their policy from, if they do (`--policy-etcd`).
    pub policy_store: Option<crate::policy_store::PolicyStoreConfig>,
    /// Sources of replicas and routers read every scrape interval (a watched file, DNS SRV).
    pub discovery: Vec<crate::discovery::DiscoverySource>,
}

impl ControlConfig {
    pub fn new(targets: Vec<String>, db_path: PathBuf) -> Self {
        let dir = db_path.parent().map(PathBuf::from).unwrap_or_default();
        Self {
            targets,
            routers: Vec::new(),
            prometheus: Vec::new(),
            scrape_interval: Duration::from_secs(1),
            limits: ScrapeLimits::default(),
            settings_path: dir.join("settings.json"),
            token_dir: dir.join("tokens"),
            trace_dir: None,
            policy_store: None,
            discovery: Vec::new(),
            db_path,
        }
    }
}

pub(crate) fn unix_ms(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
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
    let tokens_per_s =
        signals.as_ref().and_then(|s| match (s.total.prompt_tokens_per_s, s.total.generation_tokens_per_s) {
            (None, None) => None,
            (p, g) => Some(p.unwrap_or(0.0) + g.unwrap_or(0.0)),
        });
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

/// The app's core, shared by the Tauri shell and the headless server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Control {
    pub(crate) inner: Arc<Inner>,
}

/// Targets sharing one scheduler.
#[derive(Debug)]
struct Group {
    scheduler: Scheduler,
    stop: CancellationToken,
    /// `(id, url)` in the scheduler's order.
    targets: Vec<(u32, String)>,
}

#[derive(Debug)]
struct Targets {
    groups: Vec<Group>,
    next_id: u32,
    interval: Duration,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) store: Store,
    pub(crate) http: reqwest::Client,
    pub(crate) limits: ScrapeLimits,
    targets: Mutex<Targets>,
    pub(crate) history: Arc<crate::history_writer::HistoryQueue>,
    pub(crate) cancel: CancellationToken,
    pub(crate) routers: Routers,
    pub(crate) settings_path: PathBuf,
    pub(crate) token_dir: PathBuf,
    pub(crate) trace_dir: Option<PathBuf>,
    /// What the operator added in the app (persisted).
    pub(crate) saved: Mutex<SavedSettings>,
    /// The demo fleet started from the UI, if any (`start_demo`).
    pub(crate) demo: tokio::sync::Mutex<Option<fleetdeck_api::DemoStarted>>,
    /// The fleet of the history this launch writes and reads (audit trail, comparisons) when it is not
    /// `default`: set once, to `demo`, when the demo starts from the UI, so demo samples never mix with a
    /// real fleet's.
    pub(crate) history_fleet: std::sync::OnceLock<&'static str>,
    pub(crate) prometheus: crate::sources::PromSources,
    /// Intended policy, canary and what-if jobs.
    pub(crate) rollout: crate::rollout::RolloutState,
    /// The fleet's policy key in etcd, when its routers watch one.
    pub(crate) policy_store: Option<crate::policy_store::PolicyStore>,
    /// What each discovery source found last.
    pub(crate) discovery: crate::discovery::Discovery,
}

pub fn unix_ms_now() -> i64 {
    unix_ms(SystemTime::now())
}

impl Control {
    /// Opens the history and starts scraping `config.targets` (plus what the settings file
    /// adds) until `cancel` fires.
    pub async fn start(config: ControlConfig, cancel: CancellationToken) -> Result<Self> {
        if let Some(dir) = config.db_path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| {
                format!("cannot create the folder {} for the history database", dir.display())
            })?;
        }
        let saved = SavedSettings::load(&config.settings_path)?;
        let store = Store::open(&config.db_path).await?;
        // Downsampling and retention run beside ingestion until the app stops.
        store.spawn_maintenance(fleet_store::MaintenanceConfig::default(), cancel.clone().cancelled_owned());
        let http = reqwest::Client::builder()
            .connect_timeout(config.limits.timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .context("cannot build the app's HTTP client")?;
        let interval = match saved.scrape_interval_s {
            Some(s) => crate::settings::validate_interval(s).map_err(anyhow::Error::msg)?,
            None => config.scrape_interval,
        };
        let history = Arc::new(crate::history_writer::HistoryQueue::new(
            WRITER_QUEUE_ROUNDS,
            config.db_path.display().to_string(),
        ));
        {
            let (history, store, cancel) = (history.clone(), store.clone(), cancel.clone());
            tokio::spawn(async move { history.run(store, cancel).await });
        }

        let mut routers = config.routers.clone();
        for r in &saved.routers {
            if !routers.iter().any(|t| t.url == r.url) {
                routers.push(RouterTarget {
                    url: r.url.clone(),
                    token: None,
                    token_file: r.token_file.clone(),
                    metrics_url: None,
                });
            }
        }
        let policy_store = match &config.policy_store {
            Some(store) => {
                Some(crate::policy_store::PolicyStore::new(store).context("invalid --policy-etcd")?)
            }
            None => None,
        };
        let routers = Routers::new(http.clone(), routers, &store, fleet_store::DEFAULT_FLEET).await;
        let inner = Arc::new(Inner {
            store,
            http,
            limits: config.limits,
            targets: Mutex::new(Targets { groups: Vec::new(), next_id: 0, interval }),
            history,
            cancel: cancel.clone(),
            routers,
            settings_path: config.settings_path,
            token_dir: config.token_dir,
            trace_dir: config.trace_dir,
            saved: Mutex::new(saved.clone()),
            demo: Default::default(),
            history_fleet: std::sync::OnceLock::new(),
            prometheus: crate::sources::PromSources::default(),
            rollout: Default::default(),
            policy_store,
            discovery: Default::default(),
        });
        let control = Self { inner };
        let mut targets = config.targets.clone();
        for url in &saved.replicas {
            if !targets.contains(url) {
                targets.push(url.clone());
            }
        }
        control.add_group(targets);
        // Holds only a weak handle, so the poller never keeps a dropped Control alive.
        let weak = Arc::downgrade(&control.inner);
        tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                inner.routers.poll().await;
                drop(inner);
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(crate::routers::POLL_EVERY) => {}
                }
            }
        });
        let mut prometheus = config.prometheus;
        for url in saved.prometheus {
            if !prometheus.contains(&url) {
                prometheus.push(url);
            }
        }
        for url in prometheus {
            control.start_prometheus(&url);
        }
        for source in config.discovery {
            control.start_discovery(source);
        }
        Ok(control)
    }

    /// The fleet whose history this launch writes and reads (see [`Inner::history_fleet`]).
    pub(crate) fn history_fleet(&self) -> &'static str {
        self.inner.history_fleet.get().copied().unwrap_or(fleet_store::DEFAULT_FLEET)
    }

    /// Starts one scheduler over `urls` with fresh ids.
    pub(crate) fn add_group(&self, urls: Vec<String>) {
        let mut targets = lock(&self.inner.targets);
        let ids: Vec<(u32, String)> = urls
            .into_iter()
            .map(|url| {
                let id = targets.next_id;
                targets.next_id += 1;
                (id, url)
            })
            .collect();
        if ids.is_empty() {
            return;
        }
        let interval = targets.interval;
        let group = self.start_group(ids, interval);
        targets.groups.push(group);
    }

    fn start_group(&self, targets: Vec<(u32, String)>, interval: Duration) -> Group {
        let stop = self.inner.cancel.child_token();
        let specs = targets
            .iter()
            .map(|(_, url)| TargetSpec { url: url.clone(), interval, limits: self.inner.limits })
            .collect();
        let config = SchedulerConfig {
            max_concurrent: MAX_CONCURRENT_SCRAPES,
            max_backoff: MAX_BACKOFF,
            window: SIGNAL_WINDOW.max(interval * 3),
            ..SchedulerConfig::default()
        };
        let (scheduler, observations) =
            Scheduler::start(specs, config, self.inner.http.clone(), stop.clone());
        tokio::spawn(batch_rounds(observations, self.inner.history.clone(), interval));
        Group { scheduler, stop, targets }
    }

    /// How many replicas are watched.
    pub(crate) fn watched_count(&self) -> usize {
        lock(&self.inner.targets).groups.iter().map(|g| g.targets.len()).sum()
    }

    /// Whether `url` is watched already.
    pub(crate) fn watches(&self, url: &str) -> bool {
        lock(&self.inner.targets).groups.iter().any(|g| g.targets.iter().any(|(_, u)| u == url))
    }

    /// Stops watching `url`; the other targets of its group carry on in a new group with their
    /// ids. Returns whether it was watched.
    pub(crate) fn remove_target(&self, url: &str) -> bool {
        let mut targets = lock(&self.inner.targets);
        let Some(index) = targets.groups.iter().position(|g| g.targets.iter().any(|(_, u)| u == url)) else {
            return false;
        };
        let group = targets.groups.remove(index);
        group.stop.cancel();
        let rest: Vec<(u32, String)> = group.targets.into_iter().filter(|(_, u)| u != url).collect();
        if !rest.is_empty() {
            let interval = targets.interval;
            let group = self.start_group(rest, interval);
            targets.groups.insert(index, group);
        }
        true
    }

    /// Restarts every group on `interval`.
    pub(crate) fn set_interval(&self, interval: Duration) {
        let mut targets = lock(&self.inner.targets);
        targets.interval = interval;
        let groups = std::mem::take(&mut targets.groups);
        for group in groups {
            group.stop.cancel();
            let restarted = self.start_group(group.targets, interval);
            targets.groups.push(restarted);
        }
    }

    pub(crate) fn scrape_interval(&self) -> Duration {
        lock(&self.inner.targets).interval
    }

    /// Every watched target's row, by id.
    pub(crate) fn rows(&self) -> Vec<ReplicaRow> {
        let groups: Vec<(Scheduler, Vec<(u32, String)>)> = lock(&self.inner.targets)
            .groups
            .iter()
            .map(|g| (g.scheduler.clone(), g.targets.clone()))
            .collect();
        let mut rows: Vec<ReplicaRow> = groups
            .into_iter()
            .flat_map(|(scheduler, ids)| {
                scheduler.statuses().into_iter().zip(ids).map(|(status, (id, _))| row(id, status))
            })
            .collect();
        rows.extend(self.inner.prometheus.rows());
        rows.sort_by_key(|r| r.id);
        rows
    }

    /// The live table and the TTFT p95 series over the last `args.window_s` seconds.
    pub async fn fleet_snapshot(&self, args: FleetSnapshotArgs) -> Result<FleetSnapshot, ApiError> {
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

    /// How storing the scrapes goes (the fleet view's banner).
    pub fn history_status(&self) -> fleetdeck_api::HistoryWriteStatus {
        let mut status = self.inner.history.health();
        status.scrape_observations_dropped =
            lock(&self.inner.targets).groups.iter().map(|g| g.scheduler.dropped_observations()).sum();
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

    /// Hands one round of samples (from a source other than the schedulers) to the writer.
    pub(crate) async fn store_round(&self, round: Vec<SampleRow>) {
        self.inner.history.push(round);
    }

    /// A fresh id for a target that is not scheduled here (a Prometheus instance).
    pub(crate) fn allocate_id(&self) -> u32 {
        let mut targets = lock(&self.inner.targets);
        let id = targets.next_id;
        targets.next_id += 1;
        id
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

/// Gathers good scrapes and hands them to the writer once per scrape interval: one round per
/// transaction. Never waits for the writer. Ends (after a last flush) when the scheduler stops.
async fn batch_rounds(
    mut observations: mpsc::Receiver<Observation>,
    writer: Arc<crate::history_writer::HistoryQueue>,
    every: Duration,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
            _ = ticks.tick() => true,
        };
        writer.push(std::mem::take(&mut round));
        if !open {
            return;
        }
    }
}
