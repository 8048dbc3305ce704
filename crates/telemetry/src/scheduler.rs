//! Scraping many targets: each on its own interval, with a deadline and a size cap per scrape,
//! a limit on scrapes in flight, exponential backoff for failing targets, and a per-target
//! state that keeps the last good signals beside the error and the time of the last good scrape.
//!
//! Every target runs as its own small task that sleeps until it is due, so a slow or dead
//! target never delays another; a shared semaphore bounds sockets and CPU bursts. Targets join and
//! leave one scheduler while it runs (`add`, `remove`) without disturbing the others, so a whole fleet,
//! however it grows, is one scheduler with one stream of observations. Targets given at start are spread
//! evenly over their first interval rather than scraped all at once. Each scrape's outcome is
//! also sent as an [`Observation`] for whoever stores history, without waiting: a consumer that
//! falls behind (a slow database) loses observations, counted in [`Scheduler::dropped_observations`],
//! and never holds up a scrape.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::scrape::{self, ScrapeLimits};
use crate::signals::{ReplicaSignals, Window};

/// One target and how to scrape it.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetSpec {
    /// A replica base URL (metrics at `/metrics`) or a full metrics URL.
    pub url: String,
    pub interval: Duration,
    pub limits: ScrapeLimits,
}

impl TargetSpec {
    /// `url` every second with the default limits.
    pub fn new(url: impl Into<String>) -> Self {
        Self { url: url.into(), interval: Duration::from_secs(1), limits: ScrapeLimits::default() }
    }
}

/// Settings shared by all targets.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Most scrapes in flight at once, so a large fleet cannot exhaust sockets.
    pub max_concurrent: usize,
    /// Longest wait between attempts at a failing target (it doubles from its interval).
    pub max_backoff: Duration,
    /// Span over which rates, hit rates and quantiles are computed.
    pub window: Duration,
    /// Queued observations before new ones are dropped (and counted): scraping never waits for their
    /// consumer.
    pub observation_queue: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_concurrent: 64,
            max_backoff: Duration::from_secs(30),
            window: Duration::from_secs(10),
            observation_queue: 4096,
        }
    }
}

/// What the scheduler knows of one target.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetStatus {
    pub url: String,
    /// Signals as of the last good scrape (kept while the target fails).
    pub signals: Option<ReplicaSignals>,
    pub last_good: Option<SystemTime>,
    pub last_attempt: Option<SystemTime>,
    /// The last attempt's error; `None` when it succeeded or none was made yet.
    pub error: Option<String>,
    pub consecutive_failures: u32,
    pub scrapes_ok: u64,
    pub scrapes_failed: u64,
    /// How long the last attempt took.
    pub last_duration: Option<Duration>,
}

/// The outcome of one scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The target's id: given to [`Scheduler::add`], or its index in the list given to
    /// [`Scheduler::start`].
    pub index: u32,
    pub url: String,
    pub at: SystemTime,
    /// The signals after this scrape, or the error in words for operators.
    pub result: Result<ReplicaSignals, String>,
}

struct TargetState {
    status: TargetStatus,
    window: Window,
}

impl TargetState {
    fn new(url: &str, window: Duration) -> Self {
        Self {
            status: TargetStatus {
                url: url.to_owned(),
                signals: None,
                last_good: None,
                last_attempt: None,
                error: None,
                consecutive_failures: 0,
                scrapes_ok: 0,
                scrapes_failed: 0,
                last_duration: None,
            },
            window: Window::new(window),
        }
    }
}

/// One target: its spec, its state (shared with its loop) and what stops its loop.
struct Target {
    spec: TargetSpec,
    state: Arc<Mutex<TargetState>>,
    stop: CancellationToken,
}

/// Locks a target's state. It is updated in whole assignments; a panic elsewhere cannot leave it torn,
/// so a poisoned lock is taken over rather than propagated.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct Shared {
    /// Every target by id, in id order.
    targets: Mutex<BTreeMap<u32, Target>>,
    config: Mutex<SchedulerConfig>,
    client: reqwest::Client,
    semaphore: Arc<Semaphore>,
    /// The sending side every target loop clones; taken when the scheduler is cancelled, so the stream of
    /// observations ends once the last loop stops.
    observations: Mutex<Option<mpsc::Sender<Observation>>>,
    cancel: CancellationToken,
    /// Origin of the monotonic seconds fed to the windows.
    origin: Instant,
    /// Observations dropped because their queue was full.
    dropped: Arc<AtomicU64>,
}

/// A running set of scrape loops, one per target, that targets join and leave while it runs; they all
/// stop when the cancellation token fires. Cheap to clone.
#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").field("targets", &self.len()).finish()
    }
}

impl Scheduler {
    /// A scheduler with no targets yet, on the current tokio runtime until `cancel` fires. Returns it
    /// and the stream of observations of every target, present and future (dropping it is fine).
    pub fn new(
        config: SchedulerConfig,
        client: reqwest::Client,
        cancel: CancellationToken,
    ) -> (Self, mpsc::Receiver<Observation>) {
        let (observations, receiver) = mpsc::channel(config.observation_queue.max(1));
        let shared = Arc::new(Shared {
            targets: Mutex::new(BTreeMap::new()),
            semaphore: Arc::new(Semaphore::new(config.max_concurrent.max(1))),
            config: Mutex::new(config),
            client,
            observations: Mutex::new(Some(observations)),
            cancel: cancel.clone(),
            origin: Instant::now(),
            dropped: Arc::new(AtomicU64::new(0)),
        });
        let weak = Arc::downgrade(&shared);
        tokio::spawn(async move {
            cancel.cancelled().await;
            if let Some(shared) = weak.upgrade() {
                lock(&shared.observations).take();
            }
        });
        (Self { shared }, receiver)
    }

    /// Starts scraping `targets` (ids 0, 1, ... in the order given), spread evenly over their first
    /// interval rather than all at once.
    pub fn start(
        targets: Vec<TargetSpec>,
        config: SchedulerConfig,
        client: reqwest::Client,
        cancel: CancellationToken,
    ) -> (Self, mpsc::Receiver<Observation>) {
        let (scheduler, receiver) = Self::new(config, client, cancel);
        let count = targets.len().max(1) as u32;
        for (id, spec) in (0u32..).zip(targets) {
            let phase = spec.interval * id / count;
            scheduler.spawn(id, spec, phase);
        }
        (scheduler, receiver)
    }

    /// Starts scraping `spec` as target `id` now (a target already there under that id is replaced, its
    /// window started afresh). The others carry on untouched.
    pub fn add(&self, id: u32, spec: TargetSpec) {
        self.spawn(id, spec, Duration::ZERO);
    }

    /// Stops scraping target `id`; whether it was there.
    pub fn remove(&self, id: u32) -> bool {
        let removed = lock(&self.shared.targets).remove(&id);
        removed.map(|target| target.stop.cancel()).is_some()
    }

    /// Scrapes every target on `interval` from now on, computing signals over `window`. Each target's loop
    /// restarts with a fresh window (rates over a window of mixed intervals would mislead), spread evenly
    /// over the new interval.
    pub fn set_interval(&self, interval: Duration, window: Duration) {
        lock(&self.shared.config).window = window;
        let targets: Vec<(u32, TargetSpec)> =
            lock(&self.shared.targets).iter().map(|(id, t)| (*id, t.spec.clone())).collect();
        let count = targets.len().max(1) as u32;
        for (n, (id, spec)) in (0u32..).zip(targets) {
            self.spawn(id, TargetSpec { interval, ..spec }, interval * n / count);
        }
    }

    fn spawn(&self, id: u32, spec: TargetSpec, phase: Duration) {
        // A cancelled scheduler scrapes nothing more.
        let Some(observations) = lock(&self.shared.observations).clone() else { return };
        let (window, max_backoff) = {
            let config = lock(&self.shared.config);
            (config.window, config.max_backoff)
        };
        let state = Arc::new(Mutex::new(TargetState::new(&spec.url, window)));
        let stop = self.shared.cancel.child_token();
        let target = TargetLoop {
            id,
            state: state.clone(),
            origin: self.shared.origin,
            dropped: self.shared.dropped.clone(),
            spec: spec.clone(),
            client: self.shared.client.clone(),
            semaphore: self.shared.semaphore.clone(),
            observations,
            max_backoff,
        };
        let replaced = lock(&self.shared.targets).insert(id, Target { spec, state, stop: stop.clone() });
        if let Some(old) = replaced {
            old.stop.cancel();
        }
        tokio::spawn(target.run(phase, stop));
    }

    /// Every target's state, in id order.
    pub fn statuses(&self) -> Vec<TargetStatus> {
        self.targets().into_iter().map(|(_, status)| status).collect()
    }

    /// Every target's id and state, in id order.
    pub fn targets(&self) -> Vec<(u32, TargetStatus)> {
        let states: Vec<(u32, Arc<Mutex<TargetState>>)> =
            lock(&self.shared.targets).iter().map(|(id, t)| (*id, t.state.clone())).collect();
        states.into_iter().map(|(id, state)| (id, lock(&state).status.clone())).collect()
    }

    /// One target's state.
    pub fn status(&self, id: u32) -> Option<TargetStatus> {
        let state = lock(&self.shared.targets).get(&id).map(|t| t.state.clone())?;
        Some(lock(&state).status.clone())
    }

    /// Whether `url` is one of the targets.
    pub fn contains_url(&self, url: &str) -> bool {
        lock(&self.shared.targets).values().any(|t| t.spec.url == url)
    }

    /// The id of the target scraping `url`, if any.
    pub fn id_of(&self, url: &str) -> Option<u32> {
        lock(&self.shared.targets).iter().find(|(_, t)| t.spec.url == url).map(|(id, _)| *id)
    }

    pub fn len(&self) -> usize {
        lock(&self.shared.targets).len()
    }

    /// Observations dropped because their consumer fell behind (the scrapes themselves went on).
    pub fn dropped_observations(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How long to wait after the `failures`-th failure in a row: the interval, doubling, capped.
pub fn backoff(interval: Duration, failures: u32, max: Duration) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    interval.saturating_mul(factor).min(max.max(interval))
}

struct TargetLoop {
    id: u32,
    state: Arc<Mutex<TargetState>>,
    origin: Instant,
    dropped: Arc<AtomicU64>,
    spec: TargetSpec,
    client: reqwest::Client,
    semaphore: Arc<Semaphore>,
    observations: mpsc::Sender<Observation>,
    max_backoff: Duration,
}

impl TargetLoop {
    async fn run(self, phase: Duration, cancel: CancellationToken) {
        let interval = self.spec.interval.max(Duration::from_millis(10));
        let mut due = tokio::time::Instant::now() + phase;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep_until(due) => {}
            }
            let permit = tokio::select! {
                () = cancel.cancelled() => return,
                permit = self.semaphore.acquire() => permit,
            };
            let Ok(_permit) = permit else { return }; // closed: nothing scrapes any more
            let started = Instant::now();
            let at = SystemTime::now();
            let result = scrape::scrape(&self.client, &self.spec.url, self.spec.limits).await;
            drop(_permit);
            let took = started.elapsed();
            let at_s = started.duration_since(self.origin).as_secs_f64();

            let (observation, failures) = {
                let mut state = lock(&self.state);
                let state = &mut *state;
                state.status.last_attempt = Some(at);
                state.status.last_duration = Some(took);
                let outcome = match result {
                    Ok(reading) => {
                        state.window.push(at_s, &reading);
                        let signals = state.window.signals();
                        state.status.signals = signals.clone();
                        state.status.last_good = Some(at);
                        state.status.error = None;
                        state.status.consecutive_failures = 0;
                        state.status.scrapes_ok += 1;
                        signals.ok_or_else(|| "no signals after a good scrape".to_string())
                    }
                    Err(error) => {
                        let message = error.to_string();
                        state.status.error = Some(message.clone());
                        state.status.consecutive_failures += 1;
                        state.status.scrapes_failed += 1;
                        Err(message)
                    }
                };
                let observation =
                    Observation { index: self.id, url: self.spec.url.clone(), at, result: outcome };
                (observation, state.status.consecutive_failures)
            };

            let now = tokio::time::Instant::now();
            due = if failures == 0 {
                // Keep the cadence; a scrape that overran skips the ticks it missed.
                let mut next = due + interval;
                if next <= now {
                    let behind = now.duration_since(next).as_nanos() / interval.as_nanos().max(1);
                    next += interval * (behind as u32 + 1);
                }
                next
            } else {
                now + backoff(interval, failures, self.max_backoff)
            };
            // Never wait for the consumer: a full queue costs this observation (counted), not the scrapes.
            // A dropped receiver only means nobody stores history.
            if let Err(mpsc::error::TrySendError::Full(_)) = self.observations.try_send(observation) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_interval_up_to_the_cap() {
        let s = Duration::from_secs(1);
        let max = Duration::from_secs(30);
        let waits: Vec<u64> = (1..=7).map(|f| backoff(s, f, max).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(backoff(s, 1000, max), max);
        // A cap below the interval never makes a failing target scraped more often.
        assert_eq!(backoff(Duration::from_secs(5), 3, Duration::from_secs(1)), Duration::from_secs(5));
    }
}
