//! The engine: replica state, the observe calls that change it, and `pick`, which only reads it.
//!
//! State changes happen only in the `&mut self` observe calls. `pick` takes `&self`, so a pick never hides
//! a change: where a policy learns from its own decisions, it does so in [`Engine::on_routed`]:
//! - `round_robin` advances its turn to the replica named in `on_routed`;
//! - `cache_aware_approx` (and `weighted_scorers` with `prefix_source: routed`) inserts the routed
//!   prompt's blocks into the approximate index for that replica;
//! - `kv_precise` counts the prompt's blocks as pending on that replica until its prefill ends;
//! - every policy counts the request as outstanding on that replica until `on_completed`.
//!
//! [`Engine::route`] is `pick` followed by `on_routed` for callers that want both under one lock.

mod cache_aware;
mod load_based;
mod load_guard;
mod peer_prompts;
mod ring;

pub use peer_prompts::RoutedPrompt;
pub(crate) use ring::chwbl_bound;

use std::collections::{BTreeMap, HashMap, VecDeque};

use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::decision::{Branch, CandidateExplanation, Decision, ObserveError, PickError};
use crate::kv_event::{KvEvent, Medium};
use crate::prefix_index::PrefixIndex;
use crate::replica::ReplicaId;
use crate::request::{RequestId, RequestView};
use crate::spec::{PolicySpec, PrefixSource, ResolvedPolicy, SpecError};

/// Index bound per replica for the KV-event index when the policy does not set one.
const DEFAULT_KV_BLOCKS_PER_REPLICA: usize = 1 << 22;
/// Index bound per replica for the routed index when the policy does not set one.
const DEFAULT_ROUTED_BLOCKS_PER_REPLICA: usize = 1 << 20;

/// Load figures a replica reports (scraped metrics), used by `weighted_scorers`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplicaMetrics {
    /// Requests waiting in the replica's queue.
    pub queue_depth: u32,
    /// Requests the replica is running.
    pub running: u32,
    /// KV-cache usage, 0 to 1.
    pub kv_usage: f64,
}

/// What one router has in flight on one replica: what a router publishes of its own requests for the
/// others over the same fleet (fleet-router through etcd), and what [`Engine::set_peer_load`] takes in.
///
/// Engines report how many requests they hold, not how large they are; a router knows the size only of
/// its own. Without these summaries an engine weighs each request another router sent as its own average
/// (see [`Engine::foreign_weights`]), which on traffic whose prompts range over two orders of magnitude
/// (Mooncake's) misjudges where the long prefills queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerLoad {
    /// Requests routed to the replica and not completed.
    pub requests: u64,
    /// Blocks those requests still have to prefill there (not cached when routed).
    pub prefill_blocks: u64,
    /// Blocks held by those of them past their prefill.
    pub decode_blocks: u64,
}

impl PeerLoad {
    /// The sum, saturating: the figures come from other processes, and absurd ones must not overflow.
    fn plus(self, other: Self) -> Self {
        Self {
            requests: self.requests.saturating_add(other.requests),
            prefill_blocks: self.prefill_blocks.saturating_add(other.prefill_blocks),
            decode_blocks: self.decode_blocks.saturating_add(other.decode_blocks),
        }
    }
}

/// A snapshot of one replica's state, for display.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    /// The replica.
    pub replica: ReplicaId,
    /// Whether it is healthy.
    pub healthy: bool,
    /// Requests routed to it and not completed.
    pub outstanding: u64,
    /// Prompt tokens of its requests still in prefill.
    pub prefill_tokens: u64,
    /// Estimated blocks still to prefill for its requests.
    pub active_prefill_blocks: u64,
    /// Blocks of its requests in decode.
    pub active_decode_blocks: u64,
    /// Latest reported metrics and when they were set.
    pub metrics: Option<(ReplicaMetrics, u64)>,
    /// The load the policies see at the status's `now_ms`: the reported metrics while fresh (see
    /// [`Engine::set_metrics_max_age`]), combined with this engine's own requests (see [`Engine::seen_metrics`]);
    /// `None` when there are no fresh metrics and the policies fall back to `outstanding`.
    pub seen: Option<ReplicaMetrics>,
    /// What the other routers published of their requests there, summed over those whose summaries are
    /// fresh at the status's `now_ms` (see [`Engine::set_peer_load`]); `None` when none is.
    #[serde(default)]
    pub peer_load: Option<PeerLoad>,
    /// KV events received from it.
    pub kv_events: u64,
    /// Blocks the routed (approximate) index attributes to it.
    pub routed_index_blocks: usize,
    /// Prefix marks of prompts other routers sent it (see [`Engine::observe_peer_prompts`]).
    #[serde(default)]
    pub peer_prompt_marks: usize,
    /// Blocks its KV events say it holds, per medium (GPU, CPU, disk).
    pub kv_blocks: [usize; 3],
}

#[derive(Clone, Debug)]
struct ReplicaState {
    id: ReplicaId,
    healthy: bool,
    outstanding: u64,
    prefill_tokens: u64,
    active_prefill_blocks: u64,
    active_decode_blocks: u64,
    metrics: Option<(ReplicaMetrics, u64)>,
    /// Bumped by every `set_metrics`: tells a completing request whether the latest metrics count it.
    metrics_epoch: u64,
    /// Requests routed to it since its metrics were set and still outstanding (the metrics cannot count them).
    routed_since_metrics: u64,
    /// Requests the metrics counted that completed since (the metrics still count them).
    completed_since_metrics: u64,
    kv_events: u64,
}

impl ReplicaState {
    fn new(id: ReplicaId) -> Self {
        Self {
            id,
            healthy: true,
            outstanding: 0,
            prefill_tokens: 0,
            active_prefill_blocks: 0,
            active_decode_blocks: 0,
            metrics: None,
            metrics_epoch: 0,
            routed_since_metrics: 0,
            completed_since_metrics: 0,
            kv_events: 0,
        }
    }
}

#[derive(Clone, Debug)]
struct ActiveRequest {
    replica: ReplicaId,
    prompt_tokens: u64,
    /// Blocks the replica had to prefill (not cached there when routed).
    prefill_blocks: u64,
    prompt_blocks: u64,
    in_decode: bool,
    routed_at_ms: u64,
    /// The replica's metrics epoch when routed: the metrics of a later epoch count the request.
    metrics_epoch: u64,
    /// Prompt blocks counted as pending on the replica until the prefill ends (`kv_precise` only).
    pending_blocks: Vec<u64>,
}

/// The routing-policy engine. See the module docs for the state rules.
#[derive(Clone, Debug)]
pub struct Engine {
    spec: PolicySpec,
    policy: ResolvedPolicy,
    /// Replica state by slot; a slot is also the replica's location in the indexes. Freed slots are reused.
    slots: Vec<Option<ReplicaState>>,
    slot_of: BTreeMap<ReplicaId, u32>,
    /// Fed by `on_routed` when the policy learns from its own decisions.
    routed_index: PrefixIndex,
    /// Fed by KV events, one per medium.
    kv_indexes: [PrefixIndex; 3],
    /// Blocks of requests routed under `kv_precise` whose prefill has not ended, by replica slot: the
    /// replica will hold them before a request routed now is prefilled, but no KV event says so yet.
    pending_index: PrefixIndex,
    /// How many in-prefill requests hold each (slot, block) of `pending_index`.
    pending_counts: HashMap<(u32, u64), u32>,
    requests: BTreeMap<RequestId, ActiveRequest>,
    last_routed_slot: Option<u32>,
    /// Consistent-hash ring: sorted (point, slot).
    ring: Vec<(u64, u32)>,
    /// Reported metrics older than this are ignored (`None`: they never age out).
    metrics_max_age_ms: Option<u64>,
    /// Moving means of the prefill and prompt blocks of the requests this engine routed: the size the load
    /// guard and kv_precise's cost give a request another router sent, which only the replica's reported
    /// counts show (`Engine::foreign_weights`).
    routed_size: Option<RoutedSize>,
    /// The other routers' published load, by router name (see [`Engine::set_peer_load`]).
    peers: BTreeMap<String, PeerSummary>,
    /// Peer summaries older than this are ignored (`None`: they never age out).
    peer_load_max_age_ms: Option<u64>,
    /// Prefix marks of the prompts other routers routed, by replica slot (the policies that learn from
    /// routing; see [`Engine::observe_peer_prompts`]).
    peer_routed_index: PrefixIndex,
    /// Prompts this engine routed that the other routers have not been handed yet (while sharing is on,
    /// see [`Engine::set_prompt_sharing`]); oldest first, bounded.
    prompt_outbox: VecDeque<RoutedPrompt>,
    prompt_sharing: bool,
}

/// One other router's latest published load (see [`Engine::set_peer_load`]).
#[derive(Clone, Debug)]
struct PeerSummary {
    /// When it arrived, on this engine's clock (never the publisher's: routers' clocks differ).
    at_ms: u64,
    /// Its load on each replica, by slot (slots of replicas it did not name hold zero).
    by_slot: Vec<PeerLoad>,
    /// Its requests still in prefill whose prompts it shared, by its request id: slot and prefix marks
    /// (`kv_precise`, see [`Engine::observe_peer_prompts`]).
    in_prefill: BTreeMap<RequestId, (u32, Vec<u64>)>,
}

/// Moving means of routed requests' sizes, in blocks (see `Engine::routed_size`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct RoutedSize {
    prefill_blocks: f64,
    prompt_blocks: f64,
}

/// Estimated blocks of the requests other routers sent to a replica (see [`Engine::foreign_blocks`]):
/// `prefill` still to prefill, `decode` held by requests past their prefill.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct ForeignBlocks {
    pub(crate) prefill: f64,
    pub(crate) decode: f64,
}

/// What one request another router sent is taken to weigh (see [`Engine::foreign_weights`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ForeignWeights {
    /// A request the replica reports waiting: all of it still to prefill.
    queued: ForeignBlocks,
    /// A request the replica reports running: in prefill or decode, as this engine's own are.
    running: ForeignBlocks,
}

/// This engine's outstanding requests over every replica, and the blocks they hold in prefill and decode.
#[derive(Clone, Copy, Debug, Default)]
struct OwnTotals {
    outstanding: u64,
    prefill_blocks: u64,
    decode_blocks: u64,
}

impl OwnTotals {
    fn plus(self, state: &ReplicaState) -> Self {
        Self {
            outstanding: self.outstanding + state.outstanding,
            prefill_blocks: self.prefill_blocks + state.active_prefill_blocks,
            decode_blocks: self.decode_blocks + state.active_decode_blocks,
        }
    }
}

/// Weight of each routed request in [`RoutedSize`]'s moving means: about the last 32 requests count.
const ROUTED_SIZE_WEIGHT: f64 = 1.0 / 32.0;

impl Engine {
    /// An engine running `spec` over `replicas` (duplicates are ignored), all healthy and idle.
    pub fn new(spec: PolicySpec, replicas: &[ReplicaId]) -> Result<Self, SpecError> {
        let policy = spec.resolve()?;
        let mut engine = Self {
            spec,
            policy,
            slots: Vec::new(),
            slot_of: BTreeMap::new(),
            routed_index: PrefixIndex::new(DEFAULT_ROUTED_BLOCKS_PER_REPLICA),
            kv_indexes: std::array::from_fn(|_| PrefixIndex::new(DEFAULT_KV_BLOCKS_PER_REPLICA)),
            pending_index: PrefixIndex::new(DEFAULT_ROUTED_BLOCKS_PER_REPLICA),
            pending_counts: HashMap::new(),
            requests: BTreeMap::new(),
            last_routed_slot: None,
            ring: Vec::new(),
            metrics_max_age_ms: None,
            routed_size: None,
            peers: BTreeMap::new(),
            peer_load_max_age_ms: None,
            peer_routed_index: PrefixIndex::new(DEFAULT_ROUTED_BLOCKS_PER_REPLICA),
            prompt_outbox: VecDeque::new(),
            prompt_sharing: false,
        };
        engine.apply_capacities();
        for replica in replicas {
            engine.insert_replica(*replica);
        }
        engine.rebuild_ring();
        Ok(engine)
    }

    /// The spec in force.
    pub fn spec(&self) -> &PolicySpec {
        &self.spec
    }

    /// The typed policy in force.
    pub fn policy(&self) -> &ResolvedPolicy {
        &self.policy
    }

    /// Switches to another spec, keeping replicas, loads, outstanding requests and both indexes, so a
    /// policy change does not forget what the fleet has cached.
    pub fn reconfigure(&mut self, spec: PolicySpec) -> Result<(), SpecError> {
        self.policy = spec.resolve()?;
        self.spec = spec;
        self.apply_capacities();
        self.rebuild_ring();
        Ok(())
    }

    fn apply_capacities(&mut self) {
        let (routed, kv) = match &self.policy {
            ResolvedPolicy::CacheAwareApprox(p) => (p.max_blocks_per_replica, DEFAULT_KV_BLOCKS_PER_REPLICA),
            ResolvedPolicy::KvPrecise(p) => (DEFAULT_ROUTED_BLOCKS_PER_REPLICA, p.max_blocks_per_replica),
            ResolvedPolicy::WeightedScorers(p) => match p.prefix_source {
                PrefixSource::Routed => (p.max_blocks_per_replica, DEFAULT_KV_BLOCKS_PER_REPLICA),
                PrefixSource::KvEvents => (DEFAULT_ROUTED_BLOCKS_PER_REPLICA, p.max_blocks_per_replica),
            },
            _ => (DEFAULT_ROUTED_BLOCKS_PER_REPLICA, DEFAULT_KV_BLOCKS_PER_REPLICA),
        };
        if self.routed_index.capacity_per_location() != routed {
            self.routed_index.set_capacity_per_location(routed);
        }
        // A prompt has fewer marks than blocks, so at the same capacity the marks of other routers'
        // prompts are remembered at least as long as this router's own blocks.
        if self.peer_routed_index.capacity_per_location() != routed {
            self.peer_routed_index.set_capacity_per_location(routed);
        }
        for index in &mut self.kv_indexes {
            if index.capacity_per_location() != kv {
                index.set_capacity_per_location(kv);
            }
        }
    }

    /// Whether `on_routed` feeds the routed index under the current policy.
    fn learns_from_routing(&self) -> bool {
        match &self.policy {
            ResolvedPolicy::CacheAwareApprox(_) => true,
            ResolvedPolicy::WeightedScorers(p) => p.prefix_source == PrefixSource::Routed,
            _ => false,
        }
    }

    /// Replicas in the engine's order (slot order, the order explanations list them).
    pub fn replicas(&self) -> Vec<ReplicaId> {
        self.slots.iter().flatten().map(|state| state.id).collect()
    }

    /// Sets how long reported metrics count: a replica whose latest metrics are older than `max_age_ms`
    /// at a pick is treated as reporting none (the policies fall back to the engine's own counts). `None`
    /// (the default) keeps metrics until the next ones. A policy change keeps the setting.
    pub fn set_metrics_max_age(&mut self, max_age_ms: Option<u64>) {
        self.metrics_max_age_ms = max_age_ms;
    }

    /// How long reported metrics count (see [`Engine::set_metrics_max_age`]).
    pub fn metrics_max_age(&self) -> Option<u64> {
        self.metrics_max_age_ms
    }

    /// The load the policies see on a replica at `now_ms`, or `None` when it has no fresh metrics.
    ///
    /// Reported metrics count every request the replica holds, whoever sent it (other routers too), but
    /// not those this engine routed since they were set, and still count this engine's requests that have
    /// completed since; the engine's own counts know only its own. So: queue = reported queue + requests
    /// routed here since and still outstanding; running = the reported running less this engine's requests
    /// completed since, raised to this engine's own earlier requests not accounted for in the reported
    /// queue. Queue plus running is then at least this engine's outstanding count, and counts what other
    /// routers had there at the report.
    pub fn seen_metrics(&self, replica: ReplicaId, now_ms: u64) -> Option<ReplicaMetrics> {
        let slot = *self.slot_of.get(&replica)?;
        self.seen_of(self.slots.get(slot as usize)?.as_ref()?, now_ms)
    }

    fn seen_of(&self, state: &ReplicaState, now_ms: u64) -> Option<ReplicaMetrics> {
        let (metrics, at_ms) = state.metrics?;
        if self.metrics_max_age_ms.is_some_and(|max_age| now_ms.saturating_sub(at_ms) > max_age) {
            return None;
        }
        let since = state.routed_since_metrics;
        let earlier_own = state.outstanding.saturating_sub(since);
        let queue = u64::from(metrics.queue_depth) + since;
        let running = u64::from(metrics.running)
            .saturating_sub(state.completed_since_metrics)
            .max(earlier_own.saturating_sub(u64::from(metrics.queue_depth)));
        let clamp = |value: u64| u32::try_from(value).unwrap_or(u32::MAX);
        Some(ReplicaMetrics {
            queue_depth: clamp(queue),
            running: clamp(running),
            kv_usage: metrics.kv_usage,
        })
    }

    /// Requests on a replica that this engine did not send, as the load it is `seen` with (its fresh
    /// metrics, [`Engine::seen_of`]) shows them: (queued, running), what that holds beyond this engine's own
    /// outstanding requests, split in the reported queue:running proportion.
    fn foreign_requests(state: &ReplicaState, seen: ReplicaMetrics) -> (f64, f64) {
        let (queued, running) = (f64::from(seen.queue_depth), f64::from(seen.running));
        let foreign = (queued + running - state.outstanding as f64).max(0.0);
        if foreign == 0.0 {
            return (0.0, 0.0);
        }
        let queued_share = queued / (queued + running);
        (foreign * queued_share, foreign * (1.0 - queued_share))
    }

    /// What a request another router sent is taken to weigh: the traffic of several routers over one
    /// fleet is alike, so like this engine's own. A waiting one weighs the mean prefill of the requests
    /// this engine routed. A running one weighs what this engine's outstanding requests hold on average
    /// now, in prefill and in decode: engines (vLLM, fleet-sim) report a request in chunked prefill as
    /// running, so most of a loaded fleet's queued prefill shows up there, not as waiting. Before this
    /// engine routed anything, a prompt of `prompt_blocks` (the request being placed), running ones in
    /// decode.
    fn foreign_weights(&self, prompt_blocks: u64, own: OwnTotals) -> ForeignWeights {
        let size = self.routed_size.unwrap_or(RoutedSize {
            prefill_blocks: prompt_blocks as f64,
            prompt_blocks: prompt_blocks as f64,
        });
        let running = if own.outstanding == 0 {
            ForeignBlocks { prefill: 0.0, decode: size.prompt_blocks }
        } else {
            let n = own.outstanding as f64;
            ForeignBlocks { prefill: own.prefill_blocks as f64 / n, decode: own.decode_blocks as f64 / n }
        };
        ForeignWeights { queued: ForeignBlocks { prefill: size.prefill_blocks, decode: 0.0 }, running }
    }

    /// The blocks of the requests other routers sent to a replica: what they published of them (`peer`,
    /// see [`Engine::set_peer_load`]), plus, for the requests its fresh metrics (the load it is `seen`
    /// with) show beyond those, `weights` each. Routers that publish are weighed by their own figures; only
    /// the rest (routers that do not publish, or requests sent since their last summary) by the average.
    fn foreign_blocks(
        state: &ReplicaState,
        seen: Option<ReplicaMetrics>,
        weights: ForeignWeights,
        peer: Option<PeerLoad>,
    ) -> ForeignBlocks {
        let peer = peer.unwrap_or_default();
        let published = peer.requests as f64;
        let unpublished = seen.map_or(ForeignBlocks::default(), |seen| {
            let (queued, running) = Self::foreign_requests(state, seen);
            let reported = queued + running;
            if reported <= published {
                return ForeignBlocks::default();
            }
            // The requests beyond the published ones, in the reported queue:running proportion.
            let share = (reported - published) / reported;
            ForeignBlocks {
                prefill: share * (queued * weights.queued.prefill + running * weights.running.prefill),
                decode: share * (queued * weights.queued.decode + running * weights.running.decode),
            }
        });
        ForeignBlocks {
            prefill: peer.prefill_blocks as f64 + unpublished.prefill,
            decode: peer.decode_blocks as f64 + unpublished.decode,
        }
    }

    /// Records what router `peer` published of its own requests (`loads`, by replica; replicas this
    /// engine does not know are skipped), received at `now_ms`. It replaces that router's previous
    /// summary. Until it ages out (see [`Engine::set_peer_load_max_age`]), the load guard, kv_precise's
    /// cost and the wait metric weigh that router's requests by these figures instead of the average size
    /// of this engine's own. Returns how many replicas it named that this engine knows.
    pub fn set_peer_load(&mut self, peer: &str, loads: &[(ReplicaId, PeerLoad)], now_ms: u64) -> usize {
        let mut by_slot = vec![PeerLoad::default(); self.slots.len()];
        let mut known = 0;
        for (replica, load) in loads {
            if let Some(&slot) = self.slot_of.get(replica) {
                by_slot[slot as usize] = by_slot[slot as usize].plus(*load);
                known += 1;
            }
        }
        let summary = self.peer_summary_mut(peer);
        summary.at_ms = now_ms;
        summary.by_slot = by_slot;
        known
    }

    /// Forgets router `peer`'s summary (it stopped, or its key was deleted); returns whether there was one.
    pub fn remove_peer(&mut self, peer: &str) -> bool {
        self.peers.remove(peer).is_some()
    }

    /// Sets how long a peer's summary counts (as [`Engine::set_metrics_max_age`] does for metrics): a
    /// router that stopped publishing is no longer counted by its last figures. `None` (the default) keeps
    /// a summary until the next one or [`Engine::remove_peer`].
    pub fn set_peer_load_max_age(&mut self, max_age_ms: Option<u64>) {
        self.peer_load_max_age_ms = max_age_ms;
    }

    fn peer_fresh(&self, summary: &PeerSummary, now_ms: u64) -> bool {
        self.peer_load_max_age_ms.is_none_or(|max_age| now_ms.saturating_sub(summary.at_ms) <= max_age)
    }

    /// The fresh peers' load on every slot, summed (one pass over the peers); `None` when no fresh peer
    /// has a summary.
    fn peer_loads_by_slot(&self, now_ms: u64) -> Option<Vec<PeerLoad>> {
        let mut sums: Option<Vec<PeerLoad>> = None;
        for summary in self.peers.values() {
            if self.peer_fresh(summary, now_ms) {
                let sums = sums.get_or_insert_with(|| vec![PeerLoad::default(); self.slots.len()]);
                for (sum, load) in sums.iter_mut().zip(&summary.by_slot) {
                    *sum = sum.plus(*load);
                }
            }
        }
        sums
    }

    /// The requests a replica holds as a pick weighs them: by its fresh metrics (`seen`, this engine's
    /// requests sent since included), or, when higher, this engine's outstanding requests plus those the
    /// fresh peers published (`peer`, every 25 ms against metrics read every 250 ms: without them several
    /// routers all see the replica they just loaded as idle until its next read, and pile onto it). `None`
    /// with neither.
    fn seen_requests(
        state: &ReplicaState,
        seen: Option<ReplicaMetrics>,
        peer: Option<PeerLoad>,
    ) -> Option<f64> {
        let reported = seen.map(|seen| u64::from(seen.queue_depth) + u64::from(seen.running));
        let published = peer.map(|peer| state.outstanding.saturating_add(peer.requests));
        match (reported, published) {
            (None, None) => None,
            (reported, published) => Some(reported.unwrap_or(0).max(published.unwrap_or(0)) as f64),
        }
    }

    /// The fresh peers' load on the replica in `slot`, summed; `None` when no fresh peer has a summary.
    fn peer_load_at(&self, slot: u32, now_ms: u64) -> Option<PeerLoad> {
        self.peer_loads_by_slot(now_ms).map(|loads| loads.get(slot as usize).copied().unwrap_or_default())
    }

    /// This engine's own requests on each replica, as it would publish them for other routers (see
    /// [`Engine::set_peer_load`]), in engine order.
    pub fn own_load(&self) -> Vec<(ReplicaId, PeerLoad)> {
        self.slots
            .iter()
            .flatten()
            .map(|state| {
                let load = PeerLoad {
                    requests: state.outstanding,
                    prefill_blocks: state.active_prefill_blocks,
                    decode_blocks: state.active_decode_blocks,
                };
                (state.id, load)
            })
            .collect()
    }

    /// The load guard's expected wait on `replica` at `now_ms`, in blocks of prefill, for a prompt of
    /// `prompt_blocks` (see the load guard's module docs): its queued prefill, `decode_wait_weight` per
    /// block its decoding requests hold, and what other routers' requests weigh by its fresh metrics.
    pub fn expected_wait_blocks(
        &self,
        replica: ReplicaId,
        now_ms: u64,
        prompt_blocks: u64,
        decode_wait_weight: f64,
    ) -> Option<f64> {
        let slot = *self.slot_of.get(&replica)?;
        let state = self.slots.get(slot as usize)?.as_ref()?;
        let own = self.slots.iter().flatten().fold(OwnTotals::default(), |totals, s| totals.plus(s));
        let weights = self.foreign_weights(prompt_blocks, own);
        let peer = self.peer_load_at(slot, now_ms);
        let foreign = Self::foreign_blocks(state, self.seen_of(state, now_ms), weights, peer);
        Some(
            state.active_prefill_blocks as f64
                + foreign.prefill
                + decode_wait_weight * (state.active_decode_blocks as f64 + foreign.decode),
        )
    }

    /// Whether a replica's metrics were reported but are too old to count at `now_ms`.
    fn metrics_aged_out(&self, state: &ReplicaState, now_ms: u64) -> bool {
        state.metrics.is_some_and(|(_, at_ms)| {
            self.metrics_max_age_ms.is_some_and(|max_age| now_ms.saturating_sub(at_ms) > max_age)
        })
    }

    /// A snapshot of one replica (`seen` as of the last metrics' time; see [`Engine::replica_status_at`]).
    pub fn replica_status(&self, replica: ReplicaId) -> Option<ReplicaStatus> {
        let at =
            self.slot_of.get(&replica).and_then(|&slot| self.slots.get(slot as usize)?.as_ref()?.metrics);
        self.replica_status_at(replica, at.map_or(0, |(_, at_ms)| at_ms))
    }

    /// A snapshot of one replica, with the load the policies would see at `now_ms`.
    pub fn replica_status_at(&self, replica: ReplicaId, now_ms: u64) -> Option<ReplicaStatus> {
        let slot = *self.slot_of.get(&replica)?;
        let state = self.slots.get(slot as usize)?.as_ref()?;
        Some(ReplicaStatus {
            replica,
            healthy: state.healthy,
            outstanding: state.outstanding,
            prefill_tokens: state.prefill_tokens,
            active_prefill_blocks: state.active_prefill_blocks,
            active_decode_blocks: state.active_decode_blocks,
            metrics: state.metrics,
            seen: self.seen_of(state, now_ms),
            peer_load: self.peer_load_at(slot, now_ms),
            kv_events: state.kv_events,
            routed_index_blocks: self.routed_index.blocks_at(slot),
            peer_prompt_marks: self.peer_routed_index.blocks_at(slot),
            kv_blocks: std::array::from_fn(|medium| self.kv_indexes[medium].blocks_at(slot)),
        })
    }

    /// The routed (approximate) index, for inspection.
    pub fn routed_index(&self) -> &PrefixIndex {
        &self.routed_index
    }

    /// The KV-event index of one medium, for inspection.
    pub fn kv_index(&self, medium: Medium) -> &PrefixIndex {
        &self.kv_indexes[medium.index()]
    }

    /// Requests routed and not yet completed.
    pub fn outstanding_requests(&self) -> usize {
        self.requests.len()
    }

    fn insert_replica(&mut self, replica: ReplicaId) -> bool {
        if self.slot_of.contains_key(&replica) {
            return false;
        }
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(free) => {
                self.slots[free] = Some(ReplicaState::new(replica));
                free
            }
            None => {
                self.slots.push(Some(ReplicaState::new(replica)));
                self.slots.len() - 1
            }
        };
        self.slot_of.insert(replica, slot as u32);
        true
    }

    /// Adds a healthy, idle replica; returns false if it was already there.
    pub fn add_replica(&mut self, replica: ReplicaId) -> bool {
        let added = self.insert_replica(replica);
        if added {
            self.rebuild_ring();
        }
        added
    }

    /// Removes a replica and everything indexed for it; its outstanding requests are forgotten when they
    /// complete. Returns false if it was not there.
    pub fn remove_replica(&mut self, replica: ReplicaId) -> bool {
        let Some(slot) = self.slot_of.remove(&replica) else {
            return false;
        };
        self.slots[slot as usize] = None;
        self.routed_index.clear_location(slot);
        for index in &mut self.kv_indexes {
            index.clear_location(slot);
        }
        self.pending_index.clear_location(slot);
        self.pending_counts.retain(|(pending_slot, _), _| *pending_slot != slot);
        // A replica added later may reuse the slot: the peers' figures for this one must not pass to it.
        for summary in self.peers.values_mut() {
            if let Some(load) = summary.by_slot.get_mut(slot as usize) {
                *load = PeerLoad::default();
            }
            summary.in_prefill.retain(|_, (prompt_slot, _)| *prompt_slot != slot);
        }
        self.peer_routed_index.clear_location(slot);
        self.prompt_outbox.retain(|prompt| prompt.replica != replica);
        // `last_routed_slot` may still name the freed slot: round robin simply continues after it.
        self.rebuild_ring();
        true
    }

    fn state_mut(&mut self, replica: ReplicaId) -> Result<(u32, &mut ReplicaState), ObserveError> {
        let slot = *self.slot_of.get(&replica).ok_or(ObserveError::UnknownReplica(replica))?;
        let state = self.slots[slot as usize].as_mut().ok_or(ObserveError::UnknownReplica(replica))?;
        Ok((slot, state))
    }

    /// Marks a replica healthy or not; unhealthy replicas are never picked but keep their state.
    pub fn set_health(&mut self, replica: ReplicaId, healthy: bool) -> Result<(), ObserveError> {
        self.state_mut(replica)?.1.healthy = healthy;
        Ok(())
    }

    /// Records a replica's reported metrics, stamped with `now_ms`.
    pub fn set_metrics(
        &mut self,
        replica: ReplicaId,
        metrics: ReplicaMetrics,
        now_ms: u64,
    ) -> Result<(), ObserveError> {
        let state = self.state_mut(replica)?.1;
        state.metrics = Some((metrics, now_ms));
        state.metrics_epoch += 1;
        state.routed_since_metrics = 0;
        state.completed_since_metrics = 0;
        Ok(())
    }

    /// Records that request `request` was sent to `replica` (see the module docs for what each policy learns).
    pub fn on_routed(
        &mut self,
        request: RequestId,
        replica: ReplicaId,
        view: &RequestView,
        now_ms: u64,
    ) -> Result<(), ObserveError> {
        if self.requests.contains_key(&request) {
            return Err(ObserveError::DuplicateRequest(request));
        }
        let learns = self.learns_from_routing();
        let cached_index = match &self.policy {
            ResolvedPolicy::KvPrecise(_) => &self.kv_indexes[Medium::Gpu.index()],
            ResolvedPolicy::WeightedScorers(p) if p.prefix_source == PrefixSource::KvEvents => {
                &self.kv_indexes[Medium::Gpu.index()]
            }
            _ => &self.routed_index,
        };
        let slot = *self.slot_of.get(&replica).ok_or(ObserveError::UnknownReplica(replica))?;
        let mut cached = cached_index.match_location(slot, &view.block_hashes) as u64;
        if std::ptr::eq(cached_index, &self.routed_index) && learns {
            // Where other routers sent this prefix, it is as cached as if this one had: without this, a
            // request that follows another router's prompt counts as all prefill, and its replica looks
            // busier to the load guard (and to the routers it is published to) than it is.
            let by_peers = self.peer_routed_index.match_marks_location(slot, &view.block_hashes);
            cached = cached.max(by_peers as u64);
        }
        let prompt_blocks = view.block_hashes.len() as u64;
        let prefill_blocks = prompt_blocks.saturating_sub(cached);
        let (prefill, prompt) = (prefill_blocks as f64, prompt_blocks as f64);
        self.routed_size = Some(match self.routed_size {
            None => RoutedSize { prefill_blocks: prefill, prompt_blocks: prompt },
            Some(mean) => RoutedSize {
                prefill_blocks: mean.prefill_blocks + ROUTED_SIZE_WEIGHT * (prefill - mean.prefill_blocks),
                prompt_blocks: mean.prompt_blocks + ROUTED_SIZE_WEIGHT * (prompt - mean.prompt_blocks),
            },
        });
        let tracks_pending = matches!(self.policy, ResolvedPolicy::KvPrecise(_));
        let (slot, state) = self.state_mut(replica)?;
        state.outstanding += 1;
        state.routed_since_metrics += 1;
        let metrics_epoch = state.metrics_epoch;
        state.prefill_tokens += u64::from(view.prompt_tokens);
        state.active_prefill_blocks += prefill_blocks;
        self.requests.insert(
            request,
            ActiveRequest {
                replica,
                prompt_tokens: u64::from(view.prompt_tokens),
                prefill_blocks,
                prompt_blocks,
                in_decode: false,
                routed_at_ms: now_ms,
                metrics_epoch,
                pending_blocks: if tracks_pending { view.block_hashes.clone() } else { Vec::new() },
            },
        );
        if tracks_pending {
            self.add_pending(slot, &view.block_hashes);
        }
        if learns {
            self.routed_index.insert(slot, &view.block_hashes);
        }
        if self.prompt_sharing && (learns || tracks_pending) {
            self.share_routed_prompt(request, replica, &view.block_hashes);
        }
        self.last_routed_slot = Some(slot);
        Ok(())
    }

    /// Records that a request produced its first token: its prefill load becomes decode load.
    pub fn on_first_token(&mut self, request: RequestId, _now_ms: u64) -> Result<(), ObserveError> {
        let active = self.requests.get_mut(&request).ok_or(ObserveError::UnknownRequest(request))?;
        if active.in_decode {
            return Ok(());
        }
        active.in_decode = true;
        let pending = std::mem::take(&mut active.pending_blocks);
        let active = active.clone();
        self.release_pending(active.replica, &pending);
        if let Ok((_, state)) = self.state_mut(active.replica) {
            state.prefill_tokens = state.prefill_tokens.saturating_sub(active.prompt_tokens);
            state.active_prefill_blocks = state.active_prefill_blocks.saturating_sub(active.prefill_blocks);
            state.active_decode_blocks += active.prompt_blocks;
        }
        Ok(())
    }

    /// Records that a request finished (successfully or not); its load leaves the replica.
    pub fn on_completed(&mut self, request: RequestId, _now_ms: u64) -> Result<(), ObserveError> {
        let active = self.requests.remove(&request).ok_or(ObserveError::UnknownRequest(request))?;
        self.release(&active);
        Ok(())
    }

    fn add_pending(&mut self, slot: u32, blocks: &[u64]) {
        let mut new = Vec::new();
        for &block in blocks {
            let count = self.pending_counts.entry((slot, block)).or_insert(0);
            *count += 1;
            if *count == 1 {
                new.push(block);
            }
        }
        if !new.is_empty() {
            self.pending_index.insert(slot, &new);
        }
    }

    fn release_pending(&mut self, replica: ReplicaId, blocks: &[u64]) {
        let Some(&slot) = self.slot_of.get(&replica) else { return };
        let mut gone = Vec::new();
        for &block in blocks {
            if let Some(count) = self.pending_counts.get_mut(&(slot, block)) {
                *count -= 1;
                if *count == 0 {
                    self.pending_counts.remove(&(slot, block));
                    gone.push(block);
                }
            }
        }
        if !gone.is_empty() {
            self.pending_index.remove(slot, &gone);
        }
    }

    /// Blocks counted as pending (routed under `kv_precise`, prefill not ended) on each replica slot.
    pub fn pending_index(&self) -> &PrefixIndex {
        &self.pending_index
    }

    fn release(&mut self, active: &ActiveRequest) {
        self.release_pending(active.replica, &active.pending_blocks);
        // A request outliving its replica just disappears with it.
        if let Ok((_, state)) = self.state_mut(active.replica) {
            state.outstanding = state.outstanding.saturating_sub(1);
            if active.metrics_epoch == state.metrics_epoch {
                state.routed_since_metrics = state.routed_since_metrics.saturating_sub(1);
            } else {
                state.completed_since_metrics += 1;
            }
            if active.in_decode {
                state.active_decode_blocks = state.active_decode_blocks.saturating_sub(active.prompt_blocks);
            } else {
                state.prefill_tokens = state.prefill_tokens.saturating_sub(active.prompt_tokens);
                state.active_prefill_blocks =
                    state.active_prefill_blocks.saturating_sub(active.prefill_blocks);
            }
        }
    }

    /// Completes every request routed more than `max_age_ms` before `now_ms`, so a lost completion
    /// (a dropped connection, a crashed handler) cannot leave load behind forever. Returns how many.
    pub fn expire_requests(&mut self, now_ms: u64, max_age_ms: u64) -> usize {
        let expired: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(_, active)| now_ms.saturating_sub(active.routed_at_ms) > max_age_ms)
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            if let Some(active) = self.requests.remove(id) {
                self.release(&active);
            }
        }
        expired.len()
    }

    /// Applies one KV event from `replica`; returns how many blocks changed.
    pub fn on_kv_event(
        &mut self,
        replica: ReplicaId,
        event: &KvEvent,
        _now_ms: u64,
    ) -> Result<usize, ObserveError> {
        let (slot, state) = self.state_mut(replica)?;
        state.kv_events += 1;
        Ok(match event {
            KvEvent::Stored { medium, block_hashes } => {
                self.kv_indexes[medium.index()].insert(slot, block_hashes).added
            }
            KvEvent::Removed { medium, block_hashes } => {
                self.kv_indexes[medium.index()].remove(slot, block_hashes)
            }
            KvEvent::AllCleared { medium: Some(medium) } => {
                self.kv_indexes[medium.index()].clear_location(slot)
            }
            KvEvent::AllCleared { medium: None } => {
                self.kv_indexes.iter_mut().map(|index| index.clear_location(slot)).sum()
            }
        })
    }

    /// `pick` then `on_routed` for the chosen replica, as one step.
    pub fn route<R: RngCore + ?Sized>(
        &mut self,
        request: RequestId,
        view: &RequestView,
        now_ms: u64,
        rng: &mut R,
    ) -> Result<Decision, PickError> {
        if self.requests.contains_key(&request) {
            return Err(PickError::DuplicateRequest(request));
        }
        let decision = self.pick(view, now_ms, rng)?;
        self.on_routed(request, decision.replica, view, now_ms)
            .map_err(|_| PickError::DuplicateRequest(request))?;
        Ok(decision)
    }

    /// Chooses a healthy replica for `view` and explains why. Reads state only; the same state, inputs
    /// and random stream give the same decision.
    pub fn pick<R: RngCore + ?Sized>(
        &self,
        view: &RequestView,
        now_ms: u64,
        rng: &mut R,
    ) -> Result<Decision, PickError> {
        // Other routers' requests weigh in the load guard (the cache-aware policies) and the wait metric.
        let counts_others = self.policy.weighs_other_routers();
        let mut pick = PickInProgress::new(self, view, now_ms, counts_others)?;
        match &self.policy {
            ResolvedPolicy::RoundRobin => load_based::round_robin(self, &mut pick, rng),
            ResolvedPolicy::Random => load_based::random(&mut pick, rng),
            ResolvedPolicy::LeastLoad(p) => load_based::least_load(self, &mut pick, p),
            ResolvedPolicy::PowerOfTwo(p) => load_based::power_of_two(self, &mut pick, p, rng),
            // The cache-aware policies decide, then the shared load guard reviews the choice.
            ResolvedPolicy::ConsistentHash(p) => {
                ring::consistent_hash(self, &mut pick, p, view);
                load_guard::review(self, &mut pick, &p.guard, view);
            }
            ResolvedPolicy::CacheAwareApprox(p) => {
                cache_aware::approx(self, &mut pick, p, view);
                load_guard::review(self, &mut pick, &p.guard, view);
            }
            ResolvedPolicy::KvPrecise(p) => {
                cache_aware::precise(self, &mut pick, p, view, rng);
                load_guard::review(self, &mut pick, &p.guard, view);
            }
            ResolvedPolicy::WeightedScorers(p) => {
                cache_aware::weighted(self, &mut pick, p, view, now_ms);
                load_guard::review(self, &mut pick, &p.guard, view);
            }
        }
        Ok(pick.finish(self.policy.name(), view))
    }

    fn rebuild_ring(&mut self) {
        self.ring = match &self.policy {
            ResolvedPolicy::ConsistentHash(p) => ring::build(&self.slots, p.virtual_nodes),
            _ => Vec::new(),
        };
    }
}

/// A candidate's expected wait in blocks of prefill ([`PickInProgress::wait_blocks`]).
#[derive(Clone, Copy)]
struct WaitBlocks {
    /// For this engine's own requests there.
    own: f64,
    /// For other routers' requests, as they published them and the replica's fresh metrics report them.
    foreign: f64,
}

impl WaitBlocks {
    fn total(self) -> f64 {
        self.own + self.foreign
    }
}

/// The candidates of one pick, filled in by the policy, then turned into a [`Decision`].
struct PickInProgress {
    /// Slot of each candidate (parallel to `candidates`).
    slots: Vec<u32>,
    candidates: Vec<CandidateExplanation>,
    /// Blocks of other routers' requests at each candidate (parallel to `candidates`; zero without fresh
    /// metrics or peer summaries; empty for the policies that do not weigh them).
    foreign: Vec<ForeignBlocks>,
    /// This engine's requests at each candidate plus those the fresh peers published (parallel to
    /// `candidates`; empty without fresh peer summaries).
    published: Vec<u64>,
    /// Positions (into `candidates`) of healthy candidates, in order.
    healthy: Vec<usize>,
    chosen: usize,
    branch: Branch,
    reason: String,
    notes: Vec<String>,
    /// The pick's time (what is fresh is judged at it).
    now_ms: u64,
}

impl PickInProgress {
    /// A pick over every replica; `counts_others`: weigh other routers' requests (`foreign`), as the
    /// cache-aware policies do.
    fn new(engine: &Engine, view: &RequestView, now_ms: u64, counts_others: bool) -> Result<Self, PickError> {
        let mut slots = Vec::with_capacity(engine.slots.len());
        let mut candidates = Vec::with_capacity(engine.slots.len());
        let mut healthy = Vec::with_capacity(engine.slots.len());
        // Seen loads are kept for other routers' requests, which only the cache-aware policies weigh.
        let mut seen_loads = Vec::with_capacity(if counts_others { engine.slots.len() } else { 0 });
        let mut own = OwnTotals::default();
        // The fresh peers' published load per slot, summed once for every candidate (`None`: no peer).
        let peers = engine.peer_loads_by_slot(now_ms);
        let peer_at = |slot: usize| peers.as_ref().map(|loads| loads.get(slot).copied().unwrap_or_default());
        // Allocated only when some peer is fresh: a router that shares with no one pays nothing per pick.
        let mut published = Vec::with_capacity(if peers.is_some() { engine.slots.len() } else { 0 });
        for (slot, state) in engine.slots.iter().enumerate() {
            let Some(state) = state else { continue };
            if state.healthy {
                healthy.push(candidates.len());
            }
            slots.push(slot as u32);
            let seen = engine.seen_of(state, now_ms);
            if let Some(peer) = peer_at(slot) {
                published.push(state.outstanding.saturating_add(peer.requests));
            }
            if counts_others {
                seen_loads.push(seen);
                own = own.plus(state);
            }
            candidates.push(CandidateExplanation {
                replica: state.id,
                healthy: state.healthy,
                eligible: state.healthy,
                outstanding: state.outstanding,
                prefill_tokens: state.prefill_tokens,
                seen_load: Engine::seen_requests(state, seen, peer_at(slot)),
                load: None,
                matched_blocks: None,
                score: None,
                cost: None,
                chosen: false,
                note: if state.healthy { None } else { Some("unhealthy".to_owned()) },
            });
        }
        if candidates.is_empty() {
            return Err(PickError::NoReplicas);
        }
        if healthy.is_empty() {
            return Err(PickError::NoHealthyReplica { replicas: candidates.len() });
        }
        let weights = engine.foreign_weights(view.block_hashes.len() as u64, own);
        let foreign = slots
            .iter()
            .zip(&seen_loads)
            .map(|(&slot, &seen)| {
                engine.slots[slot as usize].as_ref().map_or(ForeignBlocks::default(), |state| {
                    Engine::foreign_blocks(state, seen, weights, peer_at(slot as usize))
                })
            })
            .collect();
        Ok(Self {
            slots,
            candidates,
            foreign,
            published,
            healthy,
            chosen: 0,
            branch: Branch::Fallback,
            reason: String::new(),
            notes: Vec::new(),
            now_ms,
        })
    }

    fn decide(&mut self, position: usize, branch: Branch, reason: String) {
        self.chosen = position;
        self.branch = branch;
        self.reason = reason;
    }

    fn replica(&self, position: usize) -> ReplicaId {
        self.candidates[position].replica
    }

    /// The expected wait at a candidate, in blocks of prefill (the load guard's module docs): this engine's
    /// queued prefill there plus `decode_wait_weight` per block its decoding requests hold, and the same of
    /// other routers' requests (zero unless the policy weighs them and the replica's metrics or the other
    /// routers' summaries are fresh).
    fn wait_blocks(&self, engine: &Engine, position: usize, decode_wait_weight: f64) -> WaitBlocks {
        let (prefill, decode) = engine.slots[self.slots[position] as usize]
            .as_ref()
            .map_or((0.0, 0.0), |s| (s.active_prefill_blocks as f64, s.active_decode_blocks as f64));
        let foreign = self.foreign.get(position).copied().unwrap_or_default();
        WaitBlocks {
            own: prefill + decode_wait_weight * decode,
            foreign: foreign.prefill + decode_wait_weight * foreign.decode,
        }
    }

    fn finish(mut self, policy: &str, view: &RequestView) -> Decision {
        self.candidates[self.chosen].chosen = true;
        Decision {
            replica: self.candidates[self.chosen].replica,
            policy: policy.to_owned(),
            branch: self.branch,
            reason: self.reason,
            prompt_blocks: u32::try_from(view.block_hashes.len()).unwrap_or(u32::MAX),
            candidates: self.candidates,
            notes: self.notes,
        }
    }
}

/// Position of the smallest `key` among `positions` (first wins ties, so engine order breaks ties).
fn argmin_by<K: PartialOrd + Copy>(positions: &[usize], key: impl Fn(usize) -> K) -> usize {
    let mut best = positions[0];
    let mut best_key = key(best);
    for &position in &positions[1..] {
        let candidate = key(position);
        if candidate < best_key {
            best = position;
            best_key = candidate;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use rand::{SeedableRng, rngs::StdRng};

    use super::*;

    fn ids(n: u32) -> Vec<ReplicaId> {
        (0..n).map(ReplicaId).collect()
    }

    #[test]
    fn observe_calls_track_load_through_the_request_lifecycle() {
        let mut engine = Engine::new(PolicySpec::named("least_load"), &ids(2)).expect("valid");
        let view = RequestView { block_hashes: vec![1, 2, 3], prompt_tokens: 48, session_key: None };
        engine.on_routed(7, ReplicaId(1), &view, 0).expect("routed");
        assert_eq!(engine.on_routed(7, ReplicaId(1), &view, 0), Err(ObserveError::DuplicateRequest(7)));
        let status = engine.replica_status(ReplicaId(1)).expect("known");
        assert_eq!((status.outstanding, status.prefill_tokens, status.active_prefill_blocks), (1, 48, 3));
        engine.on_first_token(7, 5).expect("first token");
        let status = engine.replica_status(ReplicaId(1)).expect("known");
        assert_eq!(
            (status.prefill_tokens, status.active_prefill_blocks, status.active_decode_blocks),
            (0, 0, 3)
        );
        engine.on_completed(7, 9).expect("completed");
        let status = engine.replica_status(ReplicaId(1)).expect("known");
        assert_eq!((status.outstanding, status.active_decode_blocks), (0, 0));
        assert_eq!(engine.on_completed(7, 9), Err(ObserveError::UnknownRequest(7)));
    }

    #[test]
    fn requests_other_routers_published_count_when_the_replicas_metrics_lag_behind() {
        let mut engine = Engine::new(PolicySpec::named("cache_aware_approx"), &ids(2)).expect("valid");
        engine.set_peer_load_max_age(Some(500));
        let idle = ReplicaMetrics { queue_depth: 0, running: 0, kv_usage: 0.0 };
        engine.set_metrics(ReplicaId(0), idle, 0).expect("known");
        engine.set_metrics(ReplicaId(1), idle, 0).expect("known");
        // Since the replicas' last read, another router sent r0 three requests, and says so.
        let sent = PeerLoad { requests: 3, prefill_blocks: 30, decode_blocks: 0 };
        engine.set_peer_load("router-b", &[(ReplicaId(0), sent)], 10);
        let view = RequestView { block_hashes: vec![1, 2], prompt_tokens: 32, session_key: None };
        let pick = |engine: &Engine, now_ms| {
            engine.pick(&view, now_ms, &mut StdRng::seed_from_u64(1)).expect("a pick")
        };
        let decision = pick(&engine, 20);
        let seen: Vec<Option<f64>> = decision.candidates.iter().map(|c| c.seen_load).collect();
        assert_eq!(seen, [Some(3.0), Some(0.0)]);
        assert_eq!(decision.replica, ReplicaId(1), "{}", decision.reason);
        // Once the summary ages out, the metrics alone count again.
        assert_eq!(pick(&engine, 600).candidates[0].seen_load, Some(0.0));
        // Metrics above the published figures win: requests from a router that does not publish.
        engine.set_peer_load("router-b", &[(ReplicaId(0), sent)], 600);
        engine
            .set_metrics(ReplicaId(0), ReplicaMetrics { queue_depth: 4, running: 2, kv_usage: 0.5 }, 600)
            .expect("known");
        assert_eq!(pick(&engine, 610).candidates[0].seen_load, Some(6.0));
        // weighted_scorers counts the published requests beyond the reported ones as queued there.
        let mut scored = Engine::new(PolicySpec::named("weighted_scorers"), &ids(2)).expect("valid");
        scored.set_metrics(ReplicaId(0), idle, 0).expect("known");
        scored.set_metrics(ReplicaId(1), idle, 0).expect("known");
        assert_eq!(pick(&scored, 20).replica, ReplicaId(0), "idle replicas tie to engine order");
        scored.set_peer_load("router-b", &[(ReplicaId(0), sent)], 10);
        let decision = pick(&scored, 20);
        assert_eq!(decision.replica, ReplicaId(1), "{}", decision.reason);
        // Without metrics, this engine's own requests plus the published ones.
        let mut blind = Engine::new(PolicySpec::named("least_load"), &ids(2)).expect("valid");
        blind.on_routed(1, ReplicaId(1), &view, 0).expect("routed");
        blind.set_peer_load("router-b", &[(ReplicaId(1), sent)], 0);
        let decision = pick(&blind, 0);
        let seen: Vec<Option<f64>> = decision.candidates.iter().map(|c| c.seen_load).collect();
        assert_eq!(seen, [Some(0.0), Some(4.0)]);
    }

    #[test]
    fn kv_precise_counts_prompt_blocks_as_pending_until_the_prefill_ends() {
        let mut engine = Engine::new(PolicySpec::named("kv_precise"), &ids(2)).expect("valid");
        let view = RequestView { block_hashes: vec![1, 2, 3], prompt_tokens: 48, session_key: None };
        engine.on_routed(1, ReplicaId(1), &view, 0).expect("routed");
        engine.on_routed(2, ReplicaId(1), &view, 0).expect("routed");
        assert_eq!(engine.pending_index().match_location(1, &[1, 2, 3]), 3);
        assert_eq!(engine.pending_index().match_location(0, &[1, 2, 3]), 0);
        engine.on_first_token(1, 1).expect("first token");
        assert_eq!(engine.pending_index().match_location(1, &[1, 2, 3]), 3, "request 2 is still in prefill");
        engine.on_completed(2, 2).expect("completed");
        assert_eq!(engine.pending_index().distinct_blocks(), 0);
        engine.on_completed(1, 3).expect("completed");
        // Other policies do not track pending blocks.
        let mut engine = Engine::new(PolicySpec::named("least_load"), &ids(2)).expect("valid");
        engine.on_routed(1, ReplicaId(1), &view, 0).expect("routed");
        assert_eq!(engine.pending_index().distinct_blocks(), 0);
    }

    #[test]
    fn the_load_guard_counts_what_other_routers_queued_on_a_prefix_owner() {
        // cache_aware_approx learns a prefix on replica 0 from its own pick, and the request completes.
        let mut engine = Engine::new(PolicySpec::named("cache_aware_approx"), &ids(2)).expect("valid");
        engine.set_metrics_max_age(Some(1_000));
        let mut rng = StdRng::seed_from_u64(1);
        // 40 blocks of 16 tokens: the default bound, 8,192 tokens, is 512 of them.
        let view = RequestView { block_hashes: (1..=40).collect(), prompt_tokens: 640, session_key: None };
        engine.on_routed(0, ReplicaId(0), &view, 0).expect("routed");
        engine.on_first_token(0, 10).expect("first token");
        engine.on_completed(0, 20).expect("completed");
        let owner = engine.pick(&view, 30, &mut rng).expect("pick");
        assert_eq!(owner.replica, ReplicaId(0), "{}", owner.reason);
        // Other routers queue 20 requests on the owner: only its reported figures say so. Each counts as a
        // request this engine routed (40 blocks to prefill): 800 blocks, past the bound beyond replica 1's 40.
        let busy = ReplicaMetrics { queue_depth: 20, running: 0, kv_usage: 0.4 };
        engine.set_metrics(ReplicaId(0), busy, 40).expect("known");
        engine.set_metrics(ReplicaId(1), ReplicaMetrics::default(), 40).expect("known");
        assert_eq!(engine.expected_wait_blocks(ReplicaId(0), 50, 40, 0.1), Some(800.0));
        let spread = engine.pick(&view, 50, &mut rng).expect("pick");
        assert_eq!(spread.replica, ReplicaId(1), "{}", spread.reason);
        assert_eq!(spread.branch, Branch::Balance);
        assert!(spread.reason.contains("800.0 of them from other routers"), "{}", spread.reason);
        // Once those figures age out the owner is back: the guard never acts on stale reports.
        assert_eq!(engine.expected_wait_blocks(ReplicaId(0), 1_100, 40, 0.1), Some(0.0));
        let back = engine.pick(&view, 1_100, &mut rng).expect("pick");
        assert_eq!(back.replica, ReplicaId(0), "{}", back.reason);
        // Running requests of other routers weigh decode_wait_weight (0.1) x 40 blocks each: 40 of them
        // (160 blocks) are within the bound (and within approx's own balance thresholds), so the owner
        // keeps the prefix.
        let decoding = ReplicaMetrics { queue_depth: 0, running: 40, kv_usage: 0.4 };
        engine.set_metrics(ReplicaId(0), decoding, 1_200).expect("known");
        engine.set_metrics(ReplicaId(1), ReplicaMetrics::default(), 1_200).expect("known");
        let kept = engine.pick(&view, 1_250, &mut rng).expect("pick");
        assert_eq!(kept.replica, ReplicaId(0), "{}", kept.reason);
    }

    #[test]
    fn other_routers_summaries_weigh_their_requests_in_place_of_the_average() {
        let mut engine = Engine::new(PolicySpec::named("kv_precise"), &ids(2)).expect("valid");
        engine.set_metrics_max_age(Some(1_000));
        engine.set_peer_load_max_age(Some(500));
        // This engine's own traffic is small: one 4-block request in prefill on replica 1.
        let small = RequestView { block_hashes: vec![1, 2, 3, 4], prompt_tokens: 64, session_key: None };
        engine.on_routed(0, ReplicaId(1), &small, 0).expect("routed");
        // Replica 0 reports two requests waiting, both another router's: each weighs what this engine
        // routes on average (4 blocks to prefill) without a summary...
        let two_waiting = ReplicaMetrics { queue_depth: 2, running: 0, kv_usage: 0.1 };
        engine.set_metrics(ReplicaId(0), two_waiting, 10).expect("known");
        assert_eq!(engine.expected_wait_blocks(ReplicaId(0), 20, 4, 0.1), Some(8.0));
        // ...and what that router published of them (two long prompts, 3,000 blocks to prefill) with one.
        let long = PeerLoad { requests: 2, prefill_blocks: 3_000, decode_blocks: 0 };
        assert_eq!(engine.set_peer_load("router-b", &[(ReplicaId(0), long), (ReplicaId(9), long)], 20), 1);
        assert_eq!(engine.expected_wait_blocks(ReplicaId(0), 30, 4, 0.1), Some(3_000.0));
        let status = engine.replica_status_at(ReplicaId(0), 30).expect("known");
        assert_eq!(status.peer_load, Some(long));
        // A request the metrics show beyond the summaries (a router that does not publish) still weighs
        // the average; a summary of more than the metrics show adds nothing from them.
        let three_waiting = ReplicaMetrics { queue_depth: 3, ..two_waiting };
        engine.set_metrics(ReplicaId(0), three_waiting, 40).expect("known");
        assert_eq!(engine.expected_wait_blocks(ReplicaId(0), 50, 4, 0.1), Some(3_004.0));
        // Decode blocks weigh decode_wait_weight, as this engine's own.
        let decoding = PeerLoad { requests: 3, prefill_blocks: 0, decode_blocks: 200 };
        engine.set_peer_load("router-b", &[(ReplicaId(0), decoding)], 60);
        assert_eq!(engine.expected_wait_blocks(ReplicaId(0), 70, 4, 0.1), Some(20.0));
        // kv_precise's cost counts it too: a prefix owner buried under another router's long prefills loses
        // the prompt.
        engine.set_peer_load("router-b", &[(ReplicaId(0), long)], 80);
        let mut rng = StdRng::seed_from_u64(1);
        engine
            .on_kv_event(
                ReplicaId(0),
                &KvEvent::Stored { medium: Medium::Gpu, block_hashes: vec![11, 12, 13] },
                80,
            )
            .expect("known");
        let view = RequestView { block_hashes: vec![11, 12, 13, 14], prompt_tokens: 64, session_key: None };
        let decision = engine.pick(&view, 90, &mut rng).expect("pick");
        assert_eq!(decision.replica, ReplicaId(1), "{}", decision.reason);
        let owner_cost = decision.candidates[0].cost.expect("kv_precise states costs");
        assert!(owner_cost > 3_000.0, "{owner_cost}: {}", decision.reason);
        // A summary counts until it ages out or its router is removed; what this engine publishes is its own.
        assert!(engine.replica_status_at(ReplicaId(0), 580).expect("known").peer_load.is_some());
        assert_eq!(engine.expected_wait_blocks(ReplicaId(0), 581, 4, 0.1), Some(12.0));
        assert!(engine.replica_status_at(ReplicaId(0), 581).expect("known").peer_load.is_none());
        assert!(engine.remove_peer("router-b"));
        assert!(!engine.remove_peer("router-b"));
        let own = PeerLoad { requests: 1, prefill_blocks: 4, decode_blocks: 0 };
        assert_eq!(engine.own_load(), vec![(ReplicaId(0), PeerLoad::default()), (ReplicaId(1), own)]);
        // Absurd figures from a peer saturate rather than overflow.
        let absurd = PeerLoad { requests: u64::MAX, prefill_blocks: u64::MAX, decode_blocks: u64::MAX };
        engine.set_peer_load("router-x", &[(ReplicaId(0), absurd), (ReplicaId(0), absurd)], 590);
        engine.set_peer_load("router-y", &[(ReplicaId(0), absurd)], 590);
        assert_eq!(engine.replica_status_at(ReplicaId(0), 590).expect("known").peer_load, Some(absurd));
        assert!(engine.expected_wait_blocks(ReplicaId(0), 590, 4, 0.1).is_some_and(f64::is_finite));
        engine.remove_peer("router-x");
        engine.remove_peer("router-y");
        // A replica removed and another added in its slot does not inherit a peer's figures for it.
        engine.set_peer_load("router-c", &[(ReplicaId(0), long)], 600);
        assert!(engine.remove_replica(ReplicaId(0)));
        assert!(engine.add_replica(ReplicaId(5)));
        assert_eq!(
            engine.replica_status_at(ReplicaId(5), 600).expect("known").peer_load,
            Some(PeerLoad::default())
        );
    }

    #[test]
    fn reported_load_counts_other_routers_requests_and_ages_out() {
        // Replica 0 is first in engine order, so without reported figures least_load ties to it. Load
        // counted in requests: what `seen_load` holds.
        let least_requests = PolicySpec::named("least_load").with("load_metric", "requests");
        let mut engine = Engine::new(least_requests, &ids(2)).expect("valid");
        engine.set_metrics_max_age(Some(1_000));
        let mut rng = StdRng::seed_from_u64(1);
        let view = RequestView::default();
        // Another router keeps six requests on replica 0: only its engine's figures say so.
        let busy = ReplicaMetrics { queue_depth: 2, running: 4, kv_usage: 0.5 };
        engine.set_metrics(ReplicaId(0), busy, 100).expect("known");
        engine.set_metrics(ReplicaId(1), ReplicaMetrics::default(), 100).expect("known");
        let decision = engine.pick(&view, 200, &mut rng).expect("pick");
        assert_eq!(decision.replica, ReplicaId(1), "{}", decision.reason);
        assert_eq!(decision.candidates[0].seen_load, Some(6.0));
        // Requests this engine routes after the figures count on top of them until the next figures.
        for id in 0..7 {
            engine.on_routed(id, ReplicaId(1), &view, 300).expect("routed");
        }
        let seen = engine.seen_metrics(ReplicaId(1), 300).expect("fresh");
        assert_eq!((seen.queue_depth, seen.running), (7, 0));
        assert_eq!(engine.pick(&view, 300, &mut rng).expect("pick").replica, ReplicaId(0));
        // Figures that already count this engine's requests do not count them twice, and never go below them.
        engine
            .set_metrics(ReplicaId(1), ReplicaMetrics { queue_depth: 0, running: 3, ..busy }, 400)
            .expect("known");
        let seen = engine.seen_metrics(ReplicaId(1), 400).expect("fresh");
        assert_eq!((seen.queue_depth, seen.running), (0, 7), "own outstanding is a floor");
        // Completed requests leave the figures at once: those routed since (7 -> 5 outstanding, queue 0)...
        engine.on_completed(0, 450).expect("completed");
        engine.on_completed(1, 450).expect("completed");
        let seen = engine.seen_metrics(ReplicaId(1), 450).expect("fresh");
        assert_eq!((seen.queue_depth, seen.running), (0, 5));
        // ...and those the figures counted (replica 0's report of 4 running, 1 of them ours).
        engine.on_routed(100, ReplicaId(0), &view, 460).expect("routed");
        engine.set_metrics(ReplicaId(0), busy, 470).expect("known");
        engine.on_completed(100, 480).expect("completed");
        let seen = engine.seen_metrics(ReplicaId(0), 480).expect("fresh");
        assert_eq!((seen.queue_depth, seen.running), (2, 3));
        // Past the bound, figures no longer count: the engine's own counts decide (replica 1 holds 7).
        assert!(engine.seen_metrics(ReplicaId(0), 1_471).is_none());
        let decision = engine.pick(&view, 1_500, &mut rng).expect("pick");
        assert_eq!(decision.replica, ReplicaId(0), "{}", decision.reason);
        assert_eq!(decision.candidates[0].seen_load, None);
        let status = engine.replica_status_at(ReplicaId(0), 1_500).expect("known");
        assert_eq!((status.metrics.map(|m| m.1), status.seen), (Some(470), None));
    }

    #[test]
    fn weighted_scorers_ignore_aged_out_metrics_and_say_so() {
        let mut engine = Engine::new(PolicySpec::named("weighted_scorers"), &ids(2)).expect("valid");
        engine.set_metrics_max_age(Some(1_000));
        let mut rng = StdRng::seed_from_u64(1);
        let view = RequestView::default();
        let full = ReplicaMetrics { queue_depth: 50, running: 50, kv_usage: 0.99 };
        engine.set_metrics(ReplicaId(0), full, 0).expect("known");
        engine.set_metrics(ReplicaId(1), ReplicaMetrics::default(), 0).expect("known");
        assert_eq!(engine.pick(&view, 500, &mut rng).expect("pick").replica, ReplicaId(1));
        let decision = engine.pick(&view, 2_000, &mut rng).expect("pick");
        assert_eq!(decision.replica, ReplicaId(0), "aged out: both idle by own counts, engine order");
        assert!(
            decision.notes.iter().any(|n| n.contains("older than 1000 ms were ignored")),
            "{:?}",
            decision.notes
        );
    }

    #[test]
    fn expired_requests_release_their_load() {
        let mut engine = Engine::new(PolicySpec::named("least_load"), &ids(1)).expect("valid");
        let view = RequestView::default();
        engine.on_routed(1, ReplicaId(0), &view, 0).expect("routed");
        engine.on_routed(2, ReplicaId(0), &view, 900).expect("routed");
        assert_eq!(engine.expire_requests(1_000, 500), 1);
        assert_eq!(engine.replica_status(ReplicaId(0)).expect("known").outstanding, 1);
    }

    #[test]
    fn removed_replica_frees_its_slot_and_index() {
        let mut engine = Engine::new(PolicySpec::named("kv_precise"), &ids(2)).expect("valid");
        let stored = KvEvent::Stored { medium: Medium::Gpu, block_hashes: vec![1, 2] };
        assert_eq!(engine.on_kv_event(ReplicaId(0), &stored, 0), Ok(2));
        assert!(engine.remove_replica(ReplicaId(0)));
        assert!(!engine.remove_replica(ReplicaId(0)));
        assert_eq!(engine.kv_index(Medium::Gpu).distinct_blocks(), 0);
        assert!(engine.add_replica(ReplicaId(9)));
        assert_eq!(engine.replicas(), vec![ReplicaId(9), ReplicaId(1)], "slot 0 is reused");
        assert_eq!(engine.replica_status(ReplicaId(9)).expect("known").kv_blocks, [0, 0, 0]);
        assert_eq!(
            engine.on_kv_event(ReplicaId(0), &stored, 0),
            Err(ObserveError::UnknownReplica(ReplicaId(0)))
        );
    }

    #[test]
    fn no_replicas_and_no_healthy_replica_are_errors() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut engine = Engine::new(PolicySpec::default(), &[]).expect("valid");
        assert_eq!(engine.pick(&RequestView::default(), 0, &mut rng), Err(PickError::NoReplicas));
        engine.add_replica(ReplicaId(3));
        engine.set_health(ReplicaId(3), false).expect("known");
        assert_eq!(
            engine.pick(&RequestView::default(), 0, &mut rng),
            Err(PickError::NoHealthyReplica { replicas: 1 })
        );
    }

    #[test]
    fn reconfigure_keeps_the_kv_index() {
        let mut engine = Engine::new(PolicySpec::named("kv_precise"), &ids(2)).expect("valid");
        let stored = KvEvent::Stored { medium: Medium::Gpu, block_hashes: vec![1, 2] };
        engine.on_kv_event(ReplicaId(1), &stored, 0).expect("known");
        engine.reconfigure(PolicySpec::named("round_robin")).expect("valid");
        engine.reconfigure(PolicySpec::named("kv_precise")).expect("valid");
        let mut rng = StdRng::seed_from_u64(1);
        let view = RequestView { block_hashes: vec![1, 2], prompt_tokens: 32, session_key: None };
        assert_eq!(engine.pick(&view, 0, &mut rng).expect("pick").replica, ReplicaId(1));
        assert!(engine.reconfigure(PolicySpec::named("nope")).is_err());
        assert_eq!(engine.policy().name(), "kv_precise", "a rejected spec changes nothing");
    }
}
