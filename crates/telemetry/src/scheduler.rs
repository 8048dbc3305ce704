//! Scraping many targets: each on its own interval, with a deadline and a size cap per scrape,
//! a limit on scrapes in flight, exponential backoff for failing targets, and a per-target
//! state that keeps the last good signals beside the error and the time of the last good scrape.
//!
//! Every target runs as its own small task that sleeps until it is due, so a slow or dead
//! target never delays another; a shared semaphore bounds sockets and CPU bursts. Targets start
//! spread evenly over their first interval rather than all at once. Each scrape's outcome is
//! also sent as an [`Observation`] for whoever stores history, without waiting: a consumer that
//! falls behind (a slow database) loses observations, counted in [`Scheduler::dropped_observations`],
//! and never holds up a scrape.

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
    /// The target's index in the list given to [`Scheduler::start`].
    pub index: usize,
    pub url: String,
    pub at: SystemTime,
    /// The signals after this scrape, or the error in words for operators.
    pub result: Result<ReplicaSignals, String>,
}

struct TargetState {
    status: TargetStatus,
    window: Window,
}

struct Shared {
    targets: Vec<Mutex<TargetState>>,
    /// Origin of the monotonic seconds fed to the windows.
    origin: Instant,
    /// Observations dropped because their queue was full.
    dropped: AtomicU64,
}

impl Shared {
    fn target(&self, index: usize) -> MutexGuard<'_, TargetState> {
        // A target's state is updated in whole assignments; a panic elsewhere cannot leave it
        // torn, so a poisoned lock is taken over rather than propagated.
        self.targets[index].lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A running set of scrape loops; they stop when the cancellation token fires. Cheap to clone.
#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").field("targets", &self.shared.targets.len()).finish()
    }
}

impl Scheduler {
    /// Starts scraping `targets` on the current tokio runtime until `cancel` fires. Returns
    /// the scheduler and the stream of observations (dropping it is fine).
    pub fn start(
        targets: Vec<TargetSpec>,
        config: SchedulerConfig,
        client: reqwest::Client,
        cancel: CancellationToken,
    ) -> (Self, mpsc::Receiver<Observation>) {
        let shared = Arc::new(Shared {
            targets: targets
                .iter()
                .map(|spec| {
                    Mutex::new(TargetState {
                        status: TargetStatus {
                            url: spec.url.clone(),
                            signals: None,
                            last_good: None,
                            last_attempt: None,
                            error: None,
                            consecutive_failures: 0,
                            scrapes_ok: 0,
                            scrapes_failed: 0,
                            last_duration: None,
                        },
                        window: Window::new(config.window),
                    })
                })
                .collect(),
            origin: Instant::now(),
            dropped: AtomicU64::new(0),
        });
        let (observations, receiver) = mpsc::channel(config.observation_queue.max(1));
        let semaphore = Arc::new(Semaphore::new(config.max_concurrent.max(1)));
        let count = targets.len().max(1) as u32;
        for (index, spec) in targets.into_iter().enumerate() {
            let phase = spec.interval * index as u32 / count;
            let target = TargetLoop {
                shared: shared.clone(),
                index,
                spec,
                client: client.clone(),
                semaphore: semaphore.clone(),
                observations: observations.clone(),
                max_backoff: config.max_backoff,
            };
            tokio::spawn(target.run(phase, cancel.clone()));
        }
        (Self { shared }, receiver)
    }

    /// Every target's state, in the order given.
    pub fn statuses(&self) -> Vec<TargetStatus> {
        (0..self.shared.targets.len()).map(|i| self.shared.target(i).status.clone()).collect()
    }

    /// One target's state.
    pub fn status(&self, index: usize) -> Option<TargetStatus> {
        (index < self.shared.targets.len()).then(|| self.shared.target(index).status.clone())
    }

    pub fn len(&self) -> usize {
        self.shared.targets.len()
    }

    /// Observations dropped because their consumer fell behind (the scrapes themselves went on).
    pub fn dropped_observations(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.shared.targets.is_empty()
    }
}

/// How long to wait after the `failures`-th failure in a row: the interval, doubling, capped.
pub fn backoff(interval: Duration, failures: u32, max: Duration) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    interval.saturating_mul(factor).min(max.max(interval))
}

struct TargetLoop {
    shared: Arc<Shared>,
    index: usize,
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
            let at_s = started.duration_since(self.shared.origin).as_secs_f64();

            let (observation, failures) = {
                let mut state = self.shared.target(self.index);
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
                    Observation { index: self.index, url: self.spec.url.clone(), at, result: outcome };
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
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
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
