//! Engine load from the replicas' own `/metrics`: queue, running requests and KV usage, read in the
//! background with the app's parsers (fleet-telemetry's exposition parser and engine tables), so the policies
//! see the load every router sent, not only this one's.
//!
//! One loop ([`scrape_loop`]) wakes every `engine_metrics.interval` and starts a scrape of each replica
//! that has none in flight (at most one per replica; a slow replica is skipped, never queued). A scrape is
//! bounded in time (`timeout`: connect, headers and body) and size (`max_bytes`: a larger body is refused
//! unread), follows no redirect and goes through no proxy (the router's probe client); the text is parsed
//! on a blocking thread, off the workers that serve requests. A good reading is kept on the replica
//! ([`EngineLoad`]) and handed to its group's engine with `set_metrics`, stamped with the router's clock;
//! the engine ignores figures older than `max_age_intervals` intervals (`Engine::set_metrics_max_age`), so
//! a replica whose `/metrics` stops answering falls back to the router's own in-flight counts. A failed
//! scrape changes no figure: it counts, and its error is kept for `/admin/state`.
//!
//! The request path never touches any of this: it reads the engine under the lock it already takes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fleet_policy::ReplicaMetrics;
use fleet_telemetry::engines::{Load, LoadReader};
use fleet_telemetry::exposition;
use fleet_telemetry::scrape::{ScrapeError, ScrapeLimits, fetch, metrics_url};

use crate::state::{Replica, RouterState, lock};

/// Longest error text kept per replica.
const MAX_ERROR_CHARS: usize = 300;

/// The figures of one good scrape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineFigures {
    /// Requests waiting in the replica's queue (`None`: its engine does not say).
    pub waiting: Option<f64>,
    /// Requests it is running.
    pub running: Option<f64>,
    /// KV-cache usage, 0 to 1.
    pub kv_usage: Option<f64>,
    /// When it was read, on the router's clock ([`RouterState::now_ms`]).
    pub at_ms: u64,
}

impl EngineFigures {
    /// The figures as the policy engine takes them (a figure the engine does not give counts as zero).
    pub fn metrics(&self) -> ReplicaMetrics {
        let count =
            |value: Option<f64>| value.map_or(0, |v| v.clamp(0.0, f64::from(u32::MAX)).round() as u32);
        ReplicaMetrics {
            queue_depth: count(self.waiting),
            running: count(self.running),
            kv_usage: self.kv_usage.unwrap_or(0.0).clamp(0.0, 1.0),
        }
    }
}

#[derive(Debug, Default)]
struct Latest {
    figures: Option<EngineFigures>,
    error: Option<String>,
}

/// One replica's engine-load scrapes: the latest good figures, the last error, counters, and the flag that
/// keeps one scrape in flight at most.
#[derive(Debug, Default)]
pub struct EngineLoad {
    latest: std::sync::Mutex<Latest>,
    /// The replica's engine as the last good scrape detected it: later scrapes parse only its load families.
    reader: std::sync::Mutex<Option<LoadReader>>,
    in_flight: AtomicBool,
    /// Scrapes that gave figures.
    pub scrapes_ok: AtomicU64,
    /// Scrapes that failed (no answer, an error status, too large, not an exposition, an unknown engine).
    pub scrapes_failed: AtomicU64,
    /// Ticks skipped because the previous scrape was still in flight.
    pub scrapes_skipped: AtomicU64,
}

/// What `/admin/state` and `/metrics` show of one replica's engine figures.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineView {
    /// The latest good figures, if any.
    pub figures: Option<EngineFigures>,
    /// Their age at the time asked, in milliseconds.
    pub age_ms: Option<u64>,
    /// Whether they are missing or too old to count (the policies then use the router's own counts).
    pub stale: bool,
    /// The last scrape's error, when the last scrape failed.
    pub error: Option<String>,
}

impl EngineLoad {
    /// The figures as of `now_ms`, stale beyond `max_age_ms` (`None`: scrapes off, always stale).
    pub fn view(&self, now_ms: u64, max_age_ms: Option<u64>) -> EngineView {
        let latest = lock(&self.latest);
        let age_ms = latest.figures.map(|f| now_ms.saturating_sub(f.at_ms));
        let stale = match (age_ms, max_age_ms) {
            (Some(age), Some(max_age)) => age > max_age,
            _ => true,
        };
        EngineView { figures: latest.figures, age_ms, stale, error: latest.error.clone() }
    }

    fn record(&self, outcome: Result<EngineFigures, String>) {
        let mut latest = lock(&self.latest);
        match outcome {
            Ok(figures) => {
                self.scrapes_ok.fetch_add(1, Ordering::Relaxed);
                latest.figures = Some(figures);
                latest.error = None;
            }
            Err(error) => {
                self.scrapes_failed.fetch_add(1, Ordering::Relaxed);
                latest.error = Some(error.chars().take(MAX_ERROR_CHARS).collect());
            }
        }
    }
}

/// Why a replica's figures could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EngineScrapeError {
    /// The fetch failed (unreachable, timeout, status, too large, not text).
    #[error(transparent)]
    Fetch(#[from] ScrapeError),
    /// The text is no exposition.
    #[error("a malformed exposition: {0}")]
    Malformed(String),
    /// The exposition is no engine fleet-telemetry knows.
    #[error("{0}")]
    Unsupported(String),
    /// The parse did not finish (its thread panicked or the runtime is shutting down).
    #[error("the parse did not finish: {0}")]
    Parse(String),
    /// The engine exports neither a queue nor a running count.
    #[error("the engine's /metrics have neither a queue nor a running-requests figure")]
    NoLoad,
}

/// Reads one replica's figures: one bounded fetch, then the parse on a blocking thread. With the engine
/// `known` from an earlier scrape, only its load families are parsed; the exposition is parsed whole, and
/// the engine detected, the first time and whenever that gives no figures (another engine behind the URL).
/// Returns the figures and the engine, for the next scrape.
pub async fn scrape_once(
    client: &reqwest::Client,
    url: &str,
    limits: ScrapeLimits,
    known: Option<LoadReader>,
) -> Result<(Load, LoadReader), EngineScrapeError> {
    let text = fetch(client, url, limits).await?;
    let (load, reader) = tokio::task::spawn_blocking(move || {
        let malformed = |e: exposition::ParseError| EngineScrapeError::Malformed(e.to_string());
        if let Some(reader) = known {
            let load = reader.read_text(&text).map_err(malformed)?;
            if load.waiting.is_some() || load.running.is_some() {
                return Ok((load, reader));
            }
        }
        let parsed = exposition::parse(&text).map_err(malformed)?;
        let reader =
            LoadReader::detect(&parsed).map_err(|e| EngineScrapeError::Unsupported(e.to_string()))?;
        Ok::<_, EngineScrapeError>((reader.load_of(&parsed), reader))
    })
    .await
    .map_err(|e| EngineScrapeError::Parse(e.to_string()))??;
    if load.waiting.is_none() && load.running.is_none() {
        return Err(EngineScrapeError::NoLoad);
    }
    Ok((load, reader))
}

/// Scrapes one replica and hands good figures to its group's engine.
async fn scrape_replica(state: Arc<RouterState>, replica: Arc<Replica>, limits: ScrapeLimits) {
    let url = metrics_url(&replica.spec.url);
    let known = *lock(&replica.engine_load.reader);
    let outcome = scrape_once(&state.client, &url, limits, known).await;
    let now_ms = state.now_ms();
    *lock(&replica.engine_load.reader) = outcome.as_ref().ok().map(|(_, reader)| *reader);
    match outcome {
        Ok((load, _)) => {
            let figures = EngineFigures {
                waiting: load.waiting,
                running: load.running,
                kv_usage: load.kv_usage,
                at_ms: now_ms,
            };
            // The group as it is now: a replica that moved group (its model learnt) reports to the new one.
            if let Some(group) = state.fleet.load().groups.get(&replica.model) {
                let _ = lock(group.engine_for(replica.spec.role)).engine.set_metrics(
                    replica.id,
                    figures.metrics(),
                    now_ms,
                );
            }
            replica.engine_load.record(Ok(figures));
        }
        Err(error) => {
            tracing::debug!(replica = %replica.spec.url, %error, "engine metrics scrape failed");
            replica.engine_load.record(Err(error.to_string()));
        }
    }
    replica.engine_load.in_flight.store(false, Ordering::Release);
}

/// Scrapes every replica's `/metrics` on the configured interval until shutdown (see the module docs).
pub async fn scrape_loop(state: Arc<RouterState>) {
    let config = state.config.engine_metrics.clone();
    if !config.enabled() {
        return;
    }
    let limits = ScrapeLimits { timeout: config.timeout, max_bytes: config.max_bytes };
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let fleet = state.fleet.load_full();
        for replica in &fleet.replicas {
            if replica.engine_load.in_flight.swap(true, Ordering::AcqRel) {
                replica.engine_load.scrapes_skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let state = state.clone();
            let replica = replica.clone();
            let stop = state.shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = scrape_replica(state, replica, limits) => {}
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_become_policy_metrics_clamped() {
        let figures = EngineFigures { waiting: Some(3.4), running: None, kv_usage: Some(1.7), at_ms: 0 };
        assert_eq!(figures.metrics(), ReplicaMetrics { queue_depth: 3, running: 0, kv_usage: 1.0 });
        let negative = EngineFigures { waiting: Some(-2.0), running: Some(5.6), kv_usage: None, at_ms: 0 };
        assert_eq!(negative.metrics(), ReplicaMetrics { queue_depth: 0, running: 6, kv_usage: 0.0 });
    }

    #[test]
    fn figures_go_stale_after_the_bound_and_keep_the_last_error() {
        let load = EngineLoad::default();
        assert!(load.view(0, Some(1000)).stale, "no figures yet: stale");
        load.record(Ok(EngineFigures { waiting: Some(1.0), running: Some(2.0), kv_usage: None, at_ms: 500 }));
        let fresh = load.view(1500, Some(1000));
        assert_eq!((fresh.age_ms, fresh.stale), (Some(1000), false));
        load.record(Err("no answer".into()));
        let old = load.view(1501, Some(1000));
        assert_eq!((old.age_ms, old.stale, old.error.as_deref()), (Some(1001), true, Some("no answer")));
        assert_eq!(old.figures.and_then(|f| f.running), Some(2.0), "a failure keeps the last figures");
        assert!(load.view(600, None).stale, "scrapes off: never fresh");
    }
}
