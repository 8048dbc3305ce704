//! Load shared between the routers of one fleet through etcd (`--peer-load-prefix`): each router publishes
//! what it has in flight on each replica, and weighs the other routers' requests by what they publish.
//!
//! Why: a replica's `/metrics` say how many requests it holds, not how much prompt they carry, and a router
//! knows the size only of its own requests. Weighing another router's requests as the average of its own
//! put kv_precise's TTFT p95 with 4 routers at 1.67x one router's on the Mooncake trace (a prompt's prefill
//! there ranges over two orders of magnitude); with each router's own blocks published every 25 ms, 1.07x
//! (`fleet-sim replay --routers 4 --peer-load-ms 25`, 300 requests at 4x over 8 replicas of 312 blocks). The engines do not export queued prefill tokens
//! (vLLM 0.32 has only request counts), so the routers tell each other, through the etcd the fleet already
//! runs for its policy, never a protocol of their own.
//!
//! The same summaries carry the prompts each router routed since its last one, as prefix marks (a few
//! of a prompt's chained block hashes, `fleet_policy::prefix_marks`), and which of its requests are still
//! in prefill: every router's cache-aware policy then places a prefix where any of them sent it
//! (`Engine::observe_peer_prompts`). Without them each router's approximate tree learns only its own
//! share of the traffic: replayed on `fleet-sim gen` traffic (1,000 requests at 12 req/s, 8 replicas of
//! 10,000 blocks, summaries every 25 ms), 4 routers' cache_aware_approx hit 75.6 % against one router's
//! 83.7 %; sharing the prompts too, 83.2 %.
//!
//! - Publisher: every `interval`, when it changed or it routed a prompt since, the router's own load per
//!   replica (requests, blocks still to prefill, blocks in decode: `Engine::own_load`, per group engine),
//!   its requests in prefill and its new routed prompts as JSON under `PREFIX + NAME`, on a lease of
//!   [`LEASE_TTL_S`] seconds kept alive every third of it. A router that dies takes its key with its lease;
//!   one that shuts down revokes the lease at once. An unchanged summary is written again only after
//!   [`REPUBLISH_UNCHANGED`], so an idle fleet costs etcd one write a second per router.
//! - Watcher: reads the prefix, then watches it from the next revision; every other router's summary goes
//!   to every group engine (`Engine::set_peer_load` and `Engine::observe_peer_prompts`, replicas matched
//!   by URL), a deleted key removes that
//!   router (`Engine::remove_peer`). Summaries count for [`PEER_MAX_AGE`] after they arrive, so a watch that
//!   stalls silently cannot leave old figures in force. When etcd is lost both sides retry with backoff and
//!   the engines fall back, as summaries age out, to weighing other routers' requests by the average.
//!
//! The interval is short because a stale summary misleads: a peer's long prompt still counted in prefill
//! after its prefill ended makes a replica look busy, and every router then sends its work elsewhere at
//! once. In the replay above, summaries every 100 ms left least_load worse off than none on two of three
//! workloads (hot tenant at 16 req/s: TTFT p95 1.66x one router's, against 1.34x without); every 25 ms
//! each policy on each workload was better off than without.
//!
//! Cost: a summary is written only when it changed (or after [`REPUBLISH_UNCHANGED`]), so at most 40
//! writes a second per busy router at 25 ms; 50 busy routers are 2,000 small writes a second to etcd (a
//! summary of 8 replicas is about 0.7 KB, and each prompt routed adds its marks once: 8 per doubling of
//! its length, about 1.2 KB for a 10,000-token prompt) and each router receives the other 49's.
//! `--peer-load-ms` trades that against how fresh the summaries are. A prompt sent between a router's
//! two summaries is unknown to the others for that long, and one written while a watcher reconnects is
//! lost to it: the approximate policies tolerate both.
//!
//! The summaries carry one more thing, unless a router runs with `--engine-metrics-read-all`: the engine
//! figures (queue, running, KV usage) it read itself from the replicas' `/metrics`, with their age. Each
//! replica is then read by one router, not all of them (`engine_load.rs` says which and why): a router
//! that shares its reads publishes an `engine` map, possibly empty, and only such routers are given
//! replicas to read. A new read counts as a change, so a router that reads some replica writes its summary
//! every `--engine-metrics-ms` (250 ms) even when idle, not every second: 50 idle routers write 200 small
//! values a second to etcd rather than 50, and each replica is read 4 times a second rather than 200.
//! Another router's read reaches this one a publish interval and etcd's delivery later than its own
//! would; requests it routes meanwhile count from the next figures. Routers that share a prefix are meant
//! to serve the same replicas: a replica given to a router that does not serve it is read by the others
//! themselves whenever its figures age past the handover (every third interval or so), not lost.
//!
//! Nothing here is on the request path: picks read the engine under the lock they already take.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_etcd::{EtcdClient, EtcdConfig, EtcdError, MAX_PREFIX_KEYS, WatchEvent, WatchFrame};
use fleet_policy::{PeerLoad, ReplicaId, RoutedPrompt};
use serde::{Deserialize, Serialize};

use crate::engine_load::EngineFigures;
use crate::etcd_sessions::{self, Backoff, Connection, Sessions};
use crate::state::{FleetView, RouterState, lock};

/// Seconds a router's key outlives its last keep-alive (etcd raises anything below 2).
pub const LEASE_TTL_S: i64 = 3;
/// An unchanged summary is written again after this long, so receivers never age it out while it holds.
pub const REPUBLISH_UNCHANGED: Duration = Duration::from_secs(1);
/// How long a received summary counts (three republish periods: one lost write is not enough to drop it).
pub const PEER_MAX_AGE: Duration = Duration::from_secs(3);
/// The default publish interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(25);

/// Where the routers of a fleet share their load, and as whom this one publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerLoadConfig {
    /// How to reach etcd (the policy's etcd, `--policy-etcd`, from the command line).
    pub etcd: EtcdConfig,
    /// The key prefix every router of the fleet publishes under, e.g. `/fleetdeck/FLEET/load/`.
    pub prefix: String,
    /// This router's name, unique in the fleet: its key is `prefix + name`.
    pub name: String,
    /// How often it publishes its own load.
    pub interval: Duration,
    /// Whether it shares its reads of the replicas' `/metrics` with the other routers and takes theirs
    /// (each replica read by one router; see the module docs). On by default.
    pub share_engine_reads: bool,
}

impl PeerLoadConfig {
    /// The defaults for `endpoints`, `prefix` and `name`.
    pub fn new(endpoints: &str, prefix: &str, name: &str) -> Self {
        Self {
            etcd: EtcdConfig::new(endpoints),
            prefix: prefix.to_owned(),
            name: name.to_owned(),
            interval: DEFAULT_INTERVAL,
            share_engine_reads: true,
        }
    }

    /// Checks every field; the error says which and how to fix it.
    pub fn validate(&self) -> Result<(), String> {
        self.etcd.validate().map_err(|error| error.to_string())?;
        if !self.prefix.starts_with('/') || !self.prefix.ends_with('/') || self.prefix.len() < 2 {
            return Err(format!(
                "the peer-load prefix {:?} must start and end with '/', e.g. /fleetdeck/FLEET/load/",
                self.prefix
            ));
        }
        if self.name.is_empty() || self.name.contains('/') || self.name.len() > 200 {
            return Err(format!(
                "the router name {:?} must be 1-200 characters without '/' (it ends the router's etcd key)",
                self.name
            ));
        }
        if self.interval < Duration::from_millis(10) || self.interval > Duration::from_secs(10) {
            return Err(format!(
                "the peer-load interval {:?} must be between 10 ms and 10 s (25 ms is the default)",
                self.interval
            ));
        }
        Ok(())
    }

    /// This router's key.
    pub fn key(&self) -> String {
        format!("{}{}", self.prefix, self.name)
    }
}

/// What one router publishes: its own in-flight load per replica, by the replica's URL (routers number
/// replicas each their own way; the URL is what they share), and the prompts it routed since its last
/// summary, so that the others place a prefix where it sent it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadSummary {
    /// The publishing router's name.
    pub router: String,
    /// Its load on each replica it has routed to, by URL.
    pub replicas: BTreeMap<String, PeerLoad>,
    /// Its requests still in prefill, by its request ids (kv_precise counts those of `routed` as their
    /// prefixes' coming owners until they leave this list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_prefill: Vec<u64>,
    /// The prompts it routed since its previous summary (under the policies that use them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routed: Vec<SharedPrompt>,
    /// The engine figures it read itself, by replica URL, when it shares its reads (`None`: it does not,
    /// and is given no replica to read; empty: it shares and holds no fresh read of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<BTreeMap<String, SharedFigures>>,
}

/// One replica's figures as the router that read them shares them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedFigures {
    /// Requests waiting in the replica's queue, if its engine says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<f64>,
    /// Requests it is running, if its engine says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<f64>,
    /// Its KV-cache usage, 0 to 1, if its engine says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_usage: Option<f64>,
    /// How old the read was when the summary was written, in milliseconds: routers' clocks differ, so
    /// the receiver dates it by its own clock, as arrived less this.
    pub age_ms: u64,
}

impl SharedFigures {
    /// The figures as read at `at_ms` by this router's clock.
    fn figures_at(&self, at_ms: u64) -> EngineFigures {
        EngineFigures { waiting: self.waiting, running: self.running, kv_usage: self.kv_usage, at_ms }
    }
}

/// A prompt a router routed, as it shares it: `Engine::take_routed_prompts` with the replica by URL.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedPrompt {
    /// The publishing router's request id.
    pub request: u64,
    /// The replica it went to.
    pub replica: String,
    /// The prompt's prefix marks (`fleet_policy::prefix_marks`): a few of its chained block hashes.
    pub marks: Vec<u64>,
}

/// Prompts a publisher holds for its next write at most (the oldest go unshared past it, so a router
/// that cannot reach etcd does not grow without end, nor write one huge value when it can again).
const UNSENT_PROMPTS: usize = 1024;
/// Marks of one received prompt kept at most: 8 per doubling of the prompt, so 256 cover any real one.
const MARKS_PER_PROMPT: usize = 256;

impl LoadSummary {
    /// This router's summary: every group engine's own load by replica URL (a replica without load is
    /// left out, so an idle router publishes an empty map) and its requests in prefill; no prompts (see
    /// [`LoadSummary::take_routed`]).
    pub fn of(name: &str, fleet: &FleetView) -> Self {
        let mut replicas = BTreeMap::new();
        let mut in_prefill = Vec::new();
        for group in fleet.groups.values() {
            for engine in [&group.engine, &group.prefill] {
                let engine = lock(engine);
                for (id, load) in engine.engine.own_load() {
                    if load == PeerLoad::default() {
                        continue;
                    }
                    if let Some(replica) = fleet.replica(id) {
                        replicas.insert(replica.spec.url.clone(), load);
                    }
                }
                in_prefill.extend(engine.engine.own_in_prefill());
            }
        }
        in_prefill.sort_unstable();
        in_prefill.dedup();
        Self { router: name.to_owned(), replicas, in_prefill, routed: Vec::new(), engine: None }
    }

    /// The figures this router read itself and still fresh at `now_ms` (at most `max_age_ms` old), by
    /// replica URL: what it shares of its engine reads.
    pub fn own_engine_reads(
        fleet: &FleetView,
        now_ms: u64,
        max_age_ms: u64,
    ) -> BTreeMap<String, EngineFigures> {
        fleet
            .replicas
            .iter()
            .filter_map(|replica| {
                let figures = replica.engine_load.own_read()?;
                (now_ms.saturating_sub(figures.at_ms) <= max_age_ms)
                    .then(|| (replica.spec.url.clone(), figures))
            })
            .collect()
    }

    /// Sets the shared engine figures from `reads`, aged as of `now_ms`.
    fn set_engine_reads(&mut self, reads: &BTreeMap<String, EngineFigures>, now_ms: u64) {
        let shared = reads.iter().map(|(url, figures)| {
            let shared = SharedFigures {
                waiting: figures.waiting,
                running: figures.running,
                kv_usage: figures.kv_usage,
                age_ms: now_ms.saturating_sub(figures.at_ms),
            };
            (url.clone(), shared)
        });
        self.engine = Some(shared.collect());
    }

    /// The prompts every group engine routed since the last call, by replica URL.
    pub fn take_routed(fleet: &FleetView) -> Vec<SharedPrompt> {
        let mut routed = Vec::new();
        for group in fleet.groups.values() {
            for engine in [&group.engine, &group.prefill] {
                for prompt in lock(engine).engine.take_routed_prompts() {
                    if let Some(replica) = fleet.replica(prompt.replica) {
                        let replica = replica.spec.url.clone();
                        routed.push(SharedPrompt { request: prompt.request, replica, marks: prompt.marks });
                    }
                }
            }
        }
        routed
    }

    /// Reads a published summary; the error names what is wrong.
    pub fn parse(value: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(value).map_err(|error| format!("not a load summary ({error})"))
    }

    /// Its loads by this router's replica ids (replicas this router does not know are skipped).
    fn by_id(&self, fleet: &FleetView) -> Vec<(ReplicaId, PeerLoad)> {
        fleet
            .replicas
            .iter()
            .filter_map(|replica| self.replicas.get(&replica.spec.url).map(|load| (replica.id, *load)))
            .collect()
    }

    /// Its routed prompts by this router's replica ids (prompts to replicas it does not know are skipped).
    fn routed_by_id(&self, fleet: &FleetView) -> Vec<RoutedPrompt> {
        let ids: BTreeMap<&str, ReplicaId> =
            fleet.replicas.iter().map(|replica| (replica.spec.url.as_str(), replica.id)).collect();
        self.routed
            .iter()
            .filter_map(|prompt| {
                let replica = *ids.get(prompt.replica.as_str())?;
                let marks = prompt.marks.iter().take(MARKS_PER_PROMPT).copied().collect();
                Some(RoutedPrompt { request: prompt.request, replica, marks })
            })
            .collect()
    }
}

/// One other router as this one last heard from it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Peer {
    /// When its summary arrived (router ms).
    at_ms: u64,
    /// Its requests in flight over the fleet.
    requests: u64,
    /// Replicas its summary named.
    replicas: usize,
    /// Whether it shares its engine reads, and how many replicas' figures its summary carried.
    engine_reads: Option<usize>,
}

impl Peer {
    /// Whether its last summary still counts at `now_ms` ([`PEER_MAX_AGE`]).
    fn counts(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.at_ms) <= PEER_MAX_AGE.as_millis() as u64
    }
}

/// The sharing's state, as `/admin/state` and `/metrics` show it.
#[derive(Debug)]
pub struct PeerLoadShare {
    /// The configuration.
    pub config: PeerLoadConfig,
    client: EtcdClient,
    /// The other routers heard from, by name.
    peers: Mutex<BTreeMap<String, Peer>>,
    /// The publisher's and the watcher's state, each its own: a watch that fails (say, a user allowed to
    /// write its key but not to read the prefix) must not be hidden by the publisher's next good write.
    publisher: Connection,
    watcher: Connection,
    /// Summaries written.
    published: AtomicU64,
    /// Writes, grants and keep-alives that failed.
    publish_failed: AtomicU64,
    /// Summaries received from other routers.
    received: AtomicU64,
    /// Routed prompts those summaries carried.
    prompts_received: AtomicU64,
    /// Routed prompts this router shared.
    prompts_published: AtomicU64,
    /// Values under the prefix that were no summary (skipped).
    malformed: AtomicU64,
}

impl PeerLoadShare {
    /// The sharing for `config` (the client is built now, so a bad TLS file fails the start).
    pub fn new(config: PeerLoadConfig) -> Result<Self, EtcdError> {
        Ok(Self {
            client: EtcdClient::new(config.etcd.clone())?,
            config,
            peers: Mutex::new(BTreeMap::new()),
            publisher: Connection::default(),
            watcher: Connection::default(),
            published: AtomicU64::new(0),
            publish_failed: AtomicU64::new(0),
            received: AtomicU64::new(0),
            prompts_received: AtomicU64::new(0),
            prompts_published: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
        })
    }

    /// The other routers that share their engine reads and whose summaries count at `now_ms`: with this
    /// one, the candidates to read each replica (`engine_load::reader_of`).
    pub fn engine_readers(&self, now_ms: u64) -> Vec<String> {
        lock(&self.peers)
            .iter()
            .filter(|(_, peer)| peer.engine_reads.is_some() && peer.counts(now_ms))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Other routers whose summaries count at `now_ms`.
    pub fn fresh_peers(&self, now_ms: u64) -> usize {
        lock(&self.peers).values().filter(|peer| peer.counts(now_ms)).count()
    }

    /// The `peer_load` object of `/admin/state`.
    pub fn state_document(&self, now_ms: u64) -> serde_json::Value {
        let peers: Vec<serde_json::Value> = lock(&self.peers)
            .iter()
            .map(|(name, peer)| {
                let age_ms = now_ms.saturating_sub(peer.at_ms);
                serde_json::json!({
                    "name": name,
                    "age_ms": age_ms,
                    "counted": peer.counts(now_ms),
                    "requests": peer.requests,
                    "replicas": peer.replicas,
                    "engine_reads": peer.engine_reads,
                })
            })
            .collect();
        serde_json::json!({
            "name": self.config.name,
            "key": self.config.key(),
            "prefix": self.config.prefix,
            "interval_ms": self.config.interval.as_millis() as u64,
            "share_engine_reads": self.config.share_engine_reads,
            "connected": self.publisher.connected() && self.watcher.connected(),
            "publish_error": self.publisher.error(),
            "watch_error": self.watcher.error(),
            "published_total": self.published.load(Ordering::Relaxed),
            "publish_failed_total": self.publish_failed.load(Ordering::Relaxed),
            "received_total": self.received.load(Ordering::Relaxed),
            "prompts_published_total": self.prompts_published.load(Ordering::Relaxed),
            "prompts_received_total": self.prompts_received.load(Ordering::Relaxed),
            "malformed_total": self.malformed.load(Ordering::Relaxed),
            "peers": peers,
        })
    }

    /// Appends the sharing's families to the `/metrics` text.
    pub fn render_metrics(&self, out: &mut String, now_ms: u64) {
        use std::fmt::Write as _;
        let families: [(&str, &str, &str, u64); 7] = [
            (
                "fleet_router_peer_routers",
                "gauge",
                "Other routers whose published load counts now (fresh summaries through etcd).",
                self.fresh_peers(now_ms) as u64,
            ),
            (
                "fleet_router_peer_load_published_total",
                "counter",
                "Load summaries this router wrote to etcd.",
                self.published.load(Ordering::Relaxed),
            ),
            (
                "fleet_router_peer_load_publish_failed_total",
                "counter",
                "Writes, lease grants and keep-alives of the load summary that failed.",
                self.publish_failed.load(Ordering::Relaxed),
            ),
            (
                "fleet_router_peer_load_received_total",
                "counter",
                "Load summaries received from other routers.",
                self.received.load(Ordering::Relaxed),
            ),
            (
                "fleet_router_peer_prompts_published_total",
                "counter",
                "Routed prompts (prefix marks) this router shared with the others.",
                self.prompts_published.load(Ordering::Relaxed),
            ),
            (
                "fleet_router_peer_prompts_received_total",
                "counter",
                "Routed prompts (prefix marks) received from other routers.",
                self.prompts_received.load(Ordering::Relaxed),
            ),
            (
                "fleet_router_peer_load_connected",
                "gauge",
                "1 when the last calls to etcd for shared load, publishing and watching, both succeeded.",
                u64::from(self.publisher.connected() && self.watcher.connected()),
            ),
        ];
        for (name, kind, help, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        }
    }

    /// Hands one value under the prefix to the engines; the router's own key is skipped.
    fn receive(&self, state: &RouterState, key: &[u8], value: &[u8]) {
        let Some(name) = self.peer_name(key) else { return };
        let summary = match LoadSummary::parse(value) {
            Ok(summary) => summary,
            Err(error) => {
                self.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(key = %String::from_utf8_lossy(key), %error, "skipping a value under the peer-load prefix");
                return;
            }
        };
        let now_ms = state.now_ms();
        {
            let mut peers = lock(&self.peers);
            // Bounded as a prefix read is: a runaway writer cannot grow this map without end.
            if !peers.contains_key(&name) && peers.len() >= MAX_PREFIX_KEYS as usize {
                self.malformed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let requests =
                summary.replicas.values().fold(0_u64, |sum, load| sum.saturating_add(load.requests));
            let engine_reads = summary.engine.as_ref().map(BTreeMap::len);
            peers.insert(
                name.clone(),
                Peer { at_ms: now_ms, requests, replicas: summary.replicas.len(), engine_reads },
            );
        }
        self.received.fetch_add(1, Ordering::Relaxed);
        self.prompts_received.fetch_add(summary.routed.len() as u64, Ordering::Relaxed);
        let fleet = state.fleet.load_full();
        let loads = summary.by_id(&fleet);
        let routed = summary.routed_by_id(&fleet);
        for group in fleet.groups.values() {
            for engine in [&group.engine, &group.prefill] {
                let mut engine = lock(engine);
                engine.engine.set_peer_load(&name, &loads, now_ms);
                engine.engine.observe_peer_prompts(&name, &routed, &summary.in_prefill, now_ms);
            }
        }
        if let Some(reads) = summary.engine.as_ref().filter(|_| self.takes_engine_reads(state)) {
            for replica in &fleet.replicas {
                let Some(shared) = reads.get(&replica.spec.url) else { continue };
                let figures = shared.figures_at(now_ms.saturating_sub(shared.age_ms));
                if !replica.engine_load.record_shared(figures, &name) {
                    continue;
                }
                if let Some(group) = fleet.groups.get(&replica.model) {
                    let mut engine = lock(group.engine_for(replica.spec.role));
                    let _ = engine.engine.set_metrics(replica.id, figures.metrics(), figures.at_ms);
                }
            }
        }
    }

    /// Whether this router shares engine reads: it reads the replicas' `/metrics` and has not been told
    /// to read every replica itself.
    fn takes_engine_reads(&self, state: &RouterState) -> bool {
        self.config.share_engine_reads && state.config.engine_metrics.enabled()
    }

    /// Forgets router `name` (its key was deleted: its lease expired or it shut down).
    fn forget(&self, state: &RouterState, name: &str) {
        lock(&self.peers).remove(name);
        let fleet = state.fleet.load_full();
        for group in fleet.groups.values() {
            for engine in [&group.engine, &group.prefill] {
                lock(engine).engine.remove_peer(name);
            }
        }
    }

    /// The router a key under the prefix belongs to; `None` for this router's own key or another key.
    fn peer_name(&self, key: &[u8]) -> Option<String> {
        let name = std::str::from_utf8(key).ok()?.strip_prefix(&self.config.prefix)?;
        (!name.is_empty() && name != self.config.name).then(|| name.to_owned())
    }
}

/// Publishes this router's load until shutdown, then revokes its lease so its key goes at once.
pub async fn publish_loop(state: Arc<RouterState>, share: Arc<PeerLoadShare>) {
    let key = share.config.key();
    let mut lease: Option<i64> = None;
    // The last summary written: its load (without prompts or engine reads), the engine reads it carried,
    // and when.
    let mut last: Option<(LoadSummary, BTreeMap<String, EngineFigures>, Instant)> = None;
    let shares_reads = share.takes_engine_reads(&state);
    let max_age_ms = state.config.engine_metrics.max_age_ms().unwrap_or(0);
    let mut keep_alive_at = Instant::now();
    let mut backoff_until = Instant::now();
    let mut backoff = Backoff::new();
    let mut tick = tokio::time::interval(share.config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Prompts routed and not yet written; kept across a failed write.
    let mut unsent: Vec<SharedPrompt> = Vec::new();
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let fleet = state.fleet.load_full();
        unsent.extend(LoadSummary::take_routed(&fleet));
        if unsent.len() > UNSENT_PROMPTS {
            unsent.drain(..unsent.len() - UNSENT_PROMPTS);
        }
        let now = Instant::now();
        if now < backoff_until {
            continue;
        }
        let load = LoadSummary::of(&share.config.name, &fleet);
        let now_ms = state.now_ms();
        let reads = if shares_reads {
            LoadSummary::own_engine_reads(&fleet, now_ms, max_age_ms)
        } else {
            BTreeMap::new()
        };
        // The load and the engine reads decide whether the summary changed (a read's age changes every
        // tick, the read itself only when made); new prompts always go out.
        let unchanged = unsent.is_empty()
            && last.as_ref().is_some_and(|(previous, previous_reads, at)| {
                *previous == load && *previous_reads == reads && now.duration_since(*at) < REPUBLISH_UNCHANGED
            });
        let mut summary = load.clone();
        if shares_reads {
            summary.set_engine_reads(&reads, now_ms);
        }
        // A copy: the prompts stay unsent until the write succeeds.
        summary.routed = unsent.clone();
        let value = match serde_json::to_vec(&summary) {
            Ok(value) => value,
            Err(error) => {
                tracing::error!(%error, "cannot encode the load summary");
                continue;
            }
        };
        let outcome = publish_once(&share, &key, &value, unchanged, &mut lease, &mut keep_alive_at).await;
        match outcome {
            Ok(wrote) => {
                if wrote {
                    last = Some((load, reads, now));
                    share.prompts_published.fetch_add(unsent.len() as u64, Ordering::Relaxed);
                    unsent.clear();
                }
                backoff.reset();
                share.publisher.set_error(None);
            }
            Err(error) => {
                share.publish_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%key, %error, retry_in = ?backoff.wait(), "cannot publish this router's load to etcd");
                if error.is_lease_gone() {
                    // The lease expired while etcd was away: the next attempt takes a new one.
                    lease = None;
                }
                share.publisher.set_error(Some(error.to_string()));
                backoff_until = now + backoff.wait();
                backoff.grow();
                last = None;
            }
        }
    }
    if let Some(id) = lease {
        // Bounded by the client's request timeout; a failure leaves the key to its lease's expiry.
        let _ = share.client.revoke_lease(id).await;
    }
}

/// One tick of the publisher: a lease when there is none, its keep-alive when due, and the summary unless
/// `unchanged`. Returns whether the summary was written.
async fn publish_once(
    share: &PeerLoadShare,
    key: &str,
    value: &[u8],
    unchanged: bool,
    lease: &mut Option<i64>,
    keep_alive_at: &mut Instant,
) -> Result<bool, EtcdError> {
    let keep_alive_every = Duration::from_secs(LEASE_TTL_S as u64) / 3;
    let id = match *lease {
        Some(id) => id,
        None => {
            let granted = share.client.grant_lease(LEASE_TTL_S).await?;
            *lease = Some(granted.id);
            *keep_alive_at = Instant::now() + keep_alive_every;
            // A new lease: the key must be written on it whatever the summary.
            share.client.put_with_lease(key, value, granted.id).await?;
            share.published.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
    };
    if Instant::now() >= *keep_alive_at {
        match share.client.keep_alive(id).await? {
            Some(_) => *keep_alive_at = Instant::now() + keep_alive_every,
            None => {
                // Expired (etcd was away longer than the TTL): the key went with it; start again.
                *lease = None;
                return Box::pin(publish_once(share, key, value, false, lease, keep_alive_at)).await;
            }
        }
    }
    if unchanged {
        return Ok(false);
    }
    share.client.put_with_lease(key, value, id).await?;
    share.published.fetch_add(1, Ordering::Relaxed);
    Ok(true)
}

/// Watches the other routers' summaries until shutdown, reconnecting with backoff (`etcd_sessions.rs`).
pub async fn watch_loop(state: Arc<RouterState>, share: Arc<PeerLoadShare>) {
    etcd_sessions::run(&state.shutdown, &PeerSessions { state: &state, share: &share }).await;
}

/// The shared-load watcher's sessions.
struct PeerSessions<'a> {
    state: &'a RouterState,
    share: &'a PeerLoadShare,
}

impl Sessions for PeerSessions<'_> {
    fn session(&self, backoff: &mut Backoff) -> impl Future<Output = Result<String, EtcdError>> + Send {
        watch_session(self.state, self.share, backoff)
    }

    fn ended(&self, reason: String, retry_in: Duration) {
        tracing::warn!(prefix = %self.share.config.prefix, error = %reason, ?retry_in, "the peer-load watch ended; trying again");
        self.share.watcher.set_error(Some(reason));
    }
}

/// One session: read the prefix (routers whose keys are gone are forgotten), then watch it from the next
/// revision. Ends with the reason the watch stopped, or an error.
async fn watch_session(
    state: &RouterState,
    share: &PeerLoadShare,
    backoff: &mut Backoff,
) -> Result<String, EtcdError> {
    let range = share.client.get_prefix(&share.config.prefix).await?;
    let present: Vec<String> = range.kvs.iter().filter_map(|kv| share.peer_name(&kv.key)).collect();
    let gone: Vec<String> =
        lock(&share.peers).keys().filter(|name| !present.contains(name)).cloned().collect();
    for name in gone {
        share.forget(state, &name);
    }
    for kv in &range.kvs {
        share.receive(state, &kv.key, &kv.value);
    }
    let mut watch = share.client.watch_prefix(&share.config.prefix, range.revision + 1).await?;
    share.watcher.set_error(None);
    backoff.reset();
    loop {
        match watch.next().await? {
            None => return Ok("etcd closed the watch stream".to_owned()),
            Some(WatchFrame::Created { .. } | WatchFrame::Progress { .. }) => {}
            Some(WatchFrame::Events { events, .. }) => {
                for event in events {
                    match event {
                        WatchEvent::Put(kv) => share.receive(state, &kv.key, &kv.value),
                        WatchEvent::Delete { key, .. } => {
                            if let Some(name) = share.peer_name(&key) {
                                share.forget(state, &name);
                            }
                        }
                    }
                }
            }
            Some(WatchFrame::Canceled { compact_revision, reason }) => {
                return Ok(match compact_revision {
                    Some(compacted) => {
                        format!(
                            "etcd compacted the prefix's history up to revision {compacted}; reading it again"
                        )
                    }
                    None => format!("etcd cancelled the watch: {reason}"),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_checked_with_a_fix() {
        let good = PeerLoadConfig::new("http://127.0.0.1:2379", "/fleetdeck/f/load/", "router-a");
        assert_eq!(good.validate(), Ok(()));
        assert_eq!(good.key(), "/fleetdeck/f/load/router-a");
        for (prefix, name, ms) in [
            ("fleetdeck/load/", "a", 100),
            ("/fleetdeck/load", "a", 100),
            ("/l/", "a/b", 100),
            ("/l/", "", 100),
            ("/l/", "a", 5),
        ] {
            let config = PeerLoadConfig {
                interval: Duration::from_millis(ms),
                ..PeerLoadConfig::new("http://a:1", prefix, name)
            };
            let error = config.validate().expect_err("invalid");
            assert!(error.contains("must"), "{prefix} {name} {ms}: {error}");
        }
    }

    #[test]
    fn summaries_round_trip_and_bad_ones_are_named() {
        let mut summary = LoadSummary { router: "r1".into(), ..LoadSummary::default() };
        summary.replicas.insert(
            "http://10.0.0.1:8000".into(),
            PeerLoad { requests: 2, prefill_blocks: 300, decode_blocks: 40 },
        );
        let bytes = serde_json::to_vec(&summary).expect("encodes");
        assert_eq!(LoadSummary::parse(&bytes), Ok(summary.clone()));
        // A summary without prompts has no empty lists on the wire (what routers before them sent).
        assert!(!String::from_utf8_lossy(&bytes).contains("routed"));
        summary.in_prefill = vec![7];
        summary.routed = vec![SharedPrompt {
            request: 7,
            replica: "http://10.0.0.1:8000".into(),
            marks: vec![u64::MAX, 1],
        }];
        let bytes = serde_json::to_vec(&summary).expect("encodes");
        assert_eq!(LoadSummary::parse(&bytes), Ok(summary.clone()));
        // Engine reads: a router that shares them says so even with none to give.
        summary.engine = Some(BTreeMap::new());
        let bytes = serde_json::to_vec(&summary).expect("encodes");
        assert!(String::from_utf8_lossy(&bytes).contains("\"engine\":{}"));
        summary.engine = Some(BTreeMap::from([(
            "http://10.0.0.1:8000".to_owned(),
            SharedFigures { waiting: Some(2.0), running: None, kv_usage: Some(0.5), age_ms: 40 },
        )]));
        let bytes = serde_json::to_vec(&summary).expect("encodes");
        assert_eq!(LoadSummary::parse(&bytes), Ok(summary));
        let error = LoadSummary::parse(b"{\"router\": 3}").expect_err("wrong shape");
        assert!(error.starts_with("not a load summary"), "{error}");
    }
}
