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
//! With the fleet's routers sharing their load through etcd (`--peer-load-prefix`, `peer_load.rs`), they
//! share these reads too: each replica is read by one router, chosen by rendezvous hashing of the replica's
//! URL over the routers that share reads ([`reader_of`]), and that router's figures reach the others in its
//! load summary. A router that is not a replica's reader skips it while figures from elsewhere are younger
//! than [`HANDOVER_INTERVALS`] intervals, and reads it itself once they are older (its reader died, left,
//! or lost etcd), so figures never stop for lack of a reader. Why: every read costs the engine, not the
//! router (vLLM 0.32's API server spends about 7.6 ms of CPU rendering its 53 KB exposition, and it has no
//! filtered form), so 50 routers each reading every 250 ms would take 1.5 cores from every replica.
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
/// A router that is not a replica's reader leaves the read to it while the figures it holds are younger
/// than this many intervals. Two: a reader's figures take up to one publish interval and etcd's delivery
/// to arrive, and one lost summary must not make every other router read at once; the policies count
/// figures for `max_age_intervals` (4 by default), so a dead reader is replaced before its figures lapse.
pub const HANDOVER_INTERVALS: u64 = 2;

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

/// Which of the routers that share their engine reads reads the replica at `url`: the one whose name
/// hashed with the URL ranks highest (rendezvous hashing). Every router computes the same answer from the
/// same names, a router joining or leaving moves only the replicas it takes or held, and the replicas
/// spread evenly. The hash is xxh3, whose output is fixed by its specification, so routers of different
/// builds agree. `None` when there are no candidates.
pub fn reader_of<'a>(url: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let rank = |name: &str| {
        let mut bytes = Vec::with_capacity(name.len() + url.len() + 1);
        bytes.extend_from_slice(name.as_bytes());
        // A separator, so that ("ab", "c...") and ("a", "bc...") hash apart.
        bytes.push(0);
        bytes.extend_from_slice(url.as_bytes());
        xxhash_rust::xxh3::xxh3_64(&bytes)
    };
    candidates.into_iter().max_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| b.cmp(a)))
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
    /// The router whose read the figures are, when another router read them (`None`: this one).
    read_by: Option<String>,
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
    /// Ticks on which this router left the read to the replica's reader among the fleet's routers.
    pub scrapes_delegated: AtomicU64,
    /// Figures taken from another router's read.
    pub reads_received: AtomicU64,
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
    /// The router that read them, when it was another (engine reads shared through etcd).
    pub read_by: Option<String>,
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
        EngineView {
            figures: latest.figures,
            age_ms,
            stale,
            read_by: latest.read_by.clone(),
            error: latest.error.clone(),
        }
    }

    /// The latest figures if this router read them itself (what it shares with the others).
    pub fn own_read(&self) -> Option<EngineFigures> {
        let latest = lock(&self.latest);
        latest.figures.filter(|_| latest.read_by.is_none())
    }

    /// Whether the latest figures, whoever read them, are at most `max_age_ms` old at `now_ms`.
    pub fn fresh_within(&self, now_ms: u64, max_age_ms: u64) -> bool {
        lock(&self.latest).figures.is_some_and(|f| now_ms.saturating_sub(f.at_ms) <= max_age_ms)
    }

    /// Takes figures router `peer` read, unless those held are as new or newer. Returns whether it took
    /// them. This router's last scrape error stays: it says how this router's own reads fare.
    pub fn record_shared(&self, figures: EngineFigures, peer: &str) -> bool {
        let mut latest = lock(&self.latest);
        if latest.figures.is_some_and(|held| held.at_ms >= figures.at_ms) {
            return false;
        }
        self.reads_received.fetch_add(1, Ordering::Relaxed);
        latest.figures = Some(figures);
        latest.read_by = Some(peer.to_owned());
        true
    }

    fn record(&self, outcome: Result<EngineFigures, String>) {
        let mut latest = lock(&self.latest);
        match outcome {
            Ok(figures) => {
                self.scrapes_ok.fetch_add(1, Ordering::Relaxed);
                latest.figures = Some(figures);
                latest.read_by = None;
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
    let handover_ms = config.interval.as_millis() as u64 * HANDOVER_INTERVALS;
    let sharing = state.peer_load.clone().filter(|share| share.config.share_engine_reads);
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let fleet = state.fleet.load_full();
        let now_ms = state.now_ms();
        let readers = sharing.as_ref().map(|share| share.engine_readers(now_ms));
        for replica in &fleet.replicas {
            if let (Some(share), Some(readers)) = (&sharing, &readers) {
                let me = share.config.name.as_str();
                let reader = reader_of(&replica.spec.url, readers.iter().map(String::as_str).chain([me]));
                if reader != Some(me) && replica.engine_load.fresh_within(now_ms, handover_ms) {
                    replica.engine_load.scrapes_delegated.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
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

    #[test]
    fn a_peers_read_is_taken_only_when_newer_and_says_whose_it_is() {
        let load = EngineLoad::default();
        let at = |at_ms| EngineFigures { waiting: Some(1.0), running: Some(1.0), kv_usage: None, at_ms };
        load.record(Ok(at(1000)));
        assert_eq!(load.own_read(), Some(at(1000)));
        assert!(!load.record_shared(at(900), "b"), "an older read than the one held");
        assert!(load.record_shared(at(1100), "b"));
        let view = load.view(1200, Some(1000));
        assert_eq!((view.read_by.as_deref(), view.age_ms), (Some("b"), Some(100)));
        assert_eq!(load.own_read(), None, "b's read is not this router's to share");
        assert!(load.fresh_within(1200, 100) && !load.fresh_within(1201, 100));
        load.record(Ok(at(1300)));
        assert_eq!(load.view(1300, Some(1000)).read_by, None);
        assert_eq!(load.reads_received.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn each_replica_has_one_reader_that_moves_only_when_its_router_goes() {
        let routers = ["router-a", "router-b", "router-c", "router-d"];
        let urls: Vec<String> =
            (0..1000).map(|i| format!("http://10.0.{}.{}:8000", i / 250, i % 250)).collect();
        let mut share = std::collections::BTreeMap::<&str, usize>::new();
        for url in &urls {
            let reader = reader_of(url, routers).expect("a reader");
            // The same answer whatever order the names come in.
            assert_eq!(reader_of(url, routers.iter().rev().copied()), Some(reader));
            *share.entry(reader).or_default() += 1;
            // Without a router that is not its reader, the replica keeps its reader.
            let other = routers.iter().find(|r| **r != reader).expect("another router");
            assert_eq!(reader_of(url, routers.iter().copied().filter(|r| r != other)), Some(reader));
        }
        // Even spread: each of the four reads a quarter, give or take.
        assert!(share.values().all(|n| (200..=300).contains(n)), "{share:?}");
        assert_eq!(reader_of("http://a", std::iter::empty()), None);
    }
}
