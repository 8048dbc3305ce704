//! The router's shared state: replicas grouped by model, one policy engine per group, the versioned policy,
//! health, and the bounded windows the admin API reads (decisions, prefix heat).
//!
//! The hot path reads the replica set and the policy version from arc-swapped snapshots and takes one short
//! lock, its group's engine, for `route` (pick + on_routed) and again for the first-token and completion calls.
//! Admin changes (policy versions, replicas) are serialised by one async mutex that the hot path never takes;
//! a policy swap reconfigures each engine under its lock, which keeps loads and indexes, so requests in
//! flight finish normally and the next pick uses the new policy.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use fleet_policy::{
    Decision, Engine, HashingParams, PdReason, PolicySpec, ReplicaId, ReplicaNames, SpecError,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::{ReplicaSpec, RouterConfig};
use crate::health::HealthTracker;
use crate::metrics::{Metrics, ReplicaGauges};
use crate::recording::Recorder;
use crate::routing_key::Tokenize;
use crate::upstream::{ReplicaConnections, Timeouts};
use fleet_policy::{Role, prefill_spec};

/// Versions kept for rollback.
const POLICY_HISTORY: usize = 100;
/// Entries kept in the prefix-heat window at most, whatever the window's length.
const HEAT_ENTRIES: usize = 200_000;
/// Prefix groups listed in `GET /admin/state`.
const TOP_GROUPS: usize = 20;
/// How often a replica of unknown model is asked its `/v1/models` while it answers probes.
pub const MODEL_LOOKUP_EVERY: Duration = Duration::from_secs(2);

/// Locks a std mutex, ignoring poisoning (every critical section here leaves the data consistent).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// Microseconds since the Unix epoch.
pub fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_micros() as u64)
}

/// One replica.
#[derive(Debug)]
pub struct Replica {
    /// Stable id (interned from the URL; a re-added URL gets its old id back).
    pub id: ReplicaId,
    /// How it was configured.
    pub spec: ReplicaSpec,
    /// The model group it serves ("" when the model is unknown: it then serves models no group claims).
    pub model: String,
    healthy: AtomicBool,
    health: Mutex<HealthTracker>,
    /// Requests sent to it (attempts, including retries).
    pub routed_total: AtomicU64,
    /// Attempts that failed (connect errors, 5xx, broken streams).
    pub errors_total: AtomicU64,
    /// Its answers by status, for `fleet_router_requests_total` (shared with [`crate::metrics::Metrics`]).
    pub requests: Arc<crate::metrics::StatusCounts>,
    /// Time to its answers' first byte, for `fleet_router_upstream_first_byte_seconds`.
    pub first_byte: Arc<crate::metrics::Histogram>,
    /// KV events applied to the index.
    pub kv_events: AtomicU64,
    /// Index resyncs after gaps in the KV event sequence.
    pub kv_resyncs: AtomicU64,
    /// Fires when the replica is removed (stops its KV subscriber).
    pub removed: CancellationToken,
    /// Its HTTP/1 connections (the proxy's way to it).
    pub connections: ReplicaConnections,
    /// The URL as a response header value (`x-fleet-replica`), built once.
    pub url_header: Option<axum::http::HeaderValue>,
    /// When (router ms) its `/v1/models` may be asked again while its model is unknown.
    next_model_lookup_ms: AtomicU64,
    /// Its engine's own load figures, scraped from its `/metrics` ([`crate::engine_load`]).
    pub engine_load: crate::engine_load::EngineLoad,
}

impl Replica {
    /// Whether it is in rotation.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }
}

/// An engine with the policy version it runs and its random stream.
#[derive(Debug)]
pub struct PolicyEngine {
    /// The engine.
    pub engine: Engine,
    /// Policy version the engine runs.
    pub version: u64,
    /// Seeded random stream for the policies that draw.
    pub rng: SmallRng,
}

/// The replicas serving one model, with their engines.
#[derive(Debug)]
pub struct Group {
    /// The model name ("" for replicas whose model is unknown).
    pub model: String,
    /// The group's engine, over its `both` and `decode` replicas: whole requests and decode legs.
    pub engine: Mutex<PolicyEngine>,
    /// The engine over its `prefill` replicas (P/D mode's prefill picks), running [`fleet_policy::prefill_spec`].
    pub prefill: Mutex<PolicyEngine>,
}

impl Group {
    /// The engine that knows replicas of `role`.
    pub fn engine_for(&self, role: Role) -> &Mutex<PolicyEngine> {
        match role {
            Role::Prefill => &self.prefill,
            Role::Both | Role::Decode => &self.engine,
        }
    }
}

/// One immutable view of the fleet.
#[derive(Debug, Default)]
pub struct FleetView {
    /// Every replica, in the order added.
    pub replicas: Vec<Arc<Replica>>,
    /// Groups by model.
    pub groups: BTreeMap<String, Arc<Group>>,
    /// Models with a replica of the prefill role: those run in P/D mode. Derived here, once per fleet
    /// change, so a request's check is one lookup (none at all in a fleet without prefill replicas).
    pub prefill_models: BTreeSet<String>,
}

/// Why a request's model has no replicas.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// No replica serves the model.
    #[error("model {model:?} is not served by this router; available models: {}", available.join(", "))]
    UnknownModel {
        /// Requested.
        model: String,
        /// Served.
        available: Vec<String>,
    },
    /// Several models are served and the request named none.
    #[error("this router serves several models ({}); set `model` in the request", available.join(", "))]
    ModelRequired {
        /// Served.
        available: Vec<String>,
    },
    /// No replicas at all.
    #[error("the router has no replicas; add one with --replica URL or POST /admin/replicas")]
    NoReplicas,
}

impl FleetView {
    /// A view of `replicas` in `groups`.
    pub fn new(replicas: Vec<Arc<Replica>>, groups: BTreeMap<String, Arc<Group>>) -> Self {
        let prefill_models = replicas
            .iter()
            .filter(|replica| replica.spec.role == Role::Prefill)
            .map(|replica| replica.model.clone())
            .collect();
        Self { replicas, groups, prefill_models }
    }

    /// The group that serves `model`.
    pub fn group_for(&self, model: Option<&str>) -> Result<&Arc<Group>, GroupError> {
        // The hot path: the model's own group, or the only one. The model lists are built only for errors.
        let served = || self.models();
        match model {
            Some(model) => self
                .groups
                .get(model)
                .or_else(|| self.groups.get(""))
                .ok_or_else(|| GroupError::UnknownModel { model: model.to_owned(), available: served() }),
            None => {
                if self.groups.len() == 1 {
                    return self.groups.values().next().ok_or(GroupError::NoReplicas);
                }
                if self.groups.is_empty() {
                    return Err(GroupError::NoReplicas);
                }
                let mut named = self.groups.iter().filter(|(name, _)| !name.is_empty());
                match (named.next(), named.next()) {
                    (Some((_, group)), None) => Ok(group),
                    _ => Err(GroupError::ModelRequired { available: served() }),
                }
            }
        }
    }

    /// A replica by id.
    pub fn replica(&self, id: ReplicaId) -> Option<&Arc<Replica>> {
        self.replicas.iter().find(|replica| replica.id == id)
    }

    /// Served model names (without the unknown group).
    pub fn models(&self) -> Vec<String> {
        self.groups.keys().filter(|name| !name.is_empty()).cloned().collect()
    }
}

/// One version of the policy.
#[derive(Debug, Clone)]
pub struct PolicyVersion {
    /// Version number, from 1.
    pub version: u64,
    /// The spec.
    pub spec: PolicySpec,
    /// Its hashing parameters (how prompts are cut into blocks).
    pub hashing: HashingParams,
    /// Its policy name.
    pub name: &'static str,
    /// Its `pd` thresholds, resolved once here rather than per request (P/D mode reads them on every pick).
    pub pd: fleet_policy::PdParams,
    /// The version whose spec was in force before this one (what a rollback restores).
    pub previous: Option<u64>,
    /// The etcd `mod_revision` of the value this version came from (`--policy-etcd`); `None` for a policy
    /// from the command line or the admin API.
    pub store_revision: Option<i64>,
    /// When it was put in force (Unix microseconds): the end of a push, for the fan-out benchmark.
    pub applied_at_us: u64,
}

impl PolicyVersion {
    fn new(version: u64, spec: PolicySpec, previous: Option<u64>) -> Result<Self, SpecError> {
        let resolved = spec.resolve()?;
        Ok(Self {
            version,
            hashing: resolved.hashing(),
            name: resolved.name(),
            pd: spec.pd_params()?,
            spec,
            previous,
            store_revision: None,
            applied_at_us: unix_us(),
        })
    }
}

/// Reads a policy spec sent to the router (an admin PUT's body or an etcd value): UTF-8 JSON or YAML,
/// checked by fleet-policy (its size and nesting first, then the parse). Synchronous: the async ways in
/// call [`parse_policy_bounded`].
pub fn parse_policy_text(body: &[u8]) -> Result<PolicySpec, SpecError> {
    fleet_policy::check_spec_text(body)?;
    let text = std::str::from_utf8(body).map_err(|_| SpecError::Parse {
        format: "JSON or YAML",
        message: "the body is not UTF-8".to_owned(),
    })?;
    text.parse::<PolicySpec>()
}

/// [`parse_policy_text`] as both ways in (the admin PUT and the etcd watcher) run it: the size and nesting
/// checks on the caller's thread (one linear pass, refusing at once), the parse on a blocking thread within
/// [`fleet_policy::SPEC_PARSE_DEADLINE`], so no spec text holds the threads that serve traffic.
pub async fn parse_policy_bounded(body: bytes::Bytes) -> Result<PolicySpec, SpecError> {
    fleet_policy::check_spec_text(&body)?;
    let deadline = fleet_policy::SPEC_PARSE_DEADLINE;
    let parse = tokio::task::spawn_blocking(move || parse_policy_text(&body));
    match tokio::time::timeout(deadline, parse).await {
        Ok(Ok(parsed)) => parsed,
        Ok(Err(_)) => Err(SpecError::Parse {
            format: "JSON or YAML",
            message: "the parser stopped unexpectedly".to_owned(),
        }),
        Err(_) => Err(SpecError::TooSlow { limit_ms: deadline.as_millis() as u64 }),
    }
}

/// A recorded pick, as `GET /admin/decisions` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct DecisionRecord {
    /// When the pick happened (Unix ms).
    pub ts_ms: u64,
    /// The router's request id.
    pub request_id: u64,
    /// Requested model.
    pub model: Option<String>,
    /// URL of the replica that served it (after retries), or of the pick when none could.
    pub replica: String,
    /// Policy name.
    pub policy: String,
    /// Policy version.
    pub policy_version: u64,
    /// The engine's explanation of the pick.
    pub decision: Decision,
    /// Replicas tried, in order, when the first did not answer (every one tried, when none did).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<String>,
    /// Why no replica served the request (the client got a 502); absent when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The cached tokens the index predicted for the replica that served it, and the engine's own count
    /// once its answer reported one; absent when no prediction was made (see [`CachePrediction`]).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "shared_prediction")]
    pub cached_tokens: Option<Arc<CachePrediction>>,
    /// P/D mode (the group has prefill replicas): split or local, why, and the prefill pick.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pd: Option<PdRecord>,
}

/// A P/D decision as the decision log keeps it.
#[derive(Debug, Clone, Serialize)]
pub struct PdRecord {
    /// `split` (a remote prefill leg, then the decode leg) or `local` (prefilled at the decode replica).
    pub branch: &'static str,
    /// The rule that decided (`transfer_failed` when a split fell back to a local prefill).
    pub reason: PdReason,
    /// The decision's sentence, with the figures and thresholds it compared.
    pub explanation: String,
    /// Prompt tokens the decode pick holds by the index.
    pub cached_at_decode: u32,
    /// Prompt tokens it lacks.
    pub uncached_tokens: u32,
    /// URL of the prefill replica, when split.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_replica: Option<String>,
    /// The prefill engine's explanation of its pick, when split.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill: Option<Decision>,
    /// How long the prefill leg took, in ms (vLLM's flow; SGLang's runs beside the decode leg, and only
    /// `fleet_router_pd_prefill_leg_seconds` times it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_ms: Option<f64>,
    /// SGLang's flow: the bootstrap room both legs carried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap_room: Option<u64>,
    /// Why a split was served with a local prefill after all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

impl PdRecord {
    /// An upper bound of its size (as [`DecisionRecord::weight`]).
    fn weight(&self) -> usize {
        let text = self.explanation.len()
            + self.prefill_replica.as_ref().map_or(0, String::len)
            + self.fallback.as_ref().map_or(0, String::len)
            + self.prefill.as_ref().map_or(0, |d| {
                d.policy.len()
                    + d.reason.len()
                    + d.notes.iter().map(String::len).sum::<usize>()
                    + d.candidates.iter().filter_map(|c| c.note.as_ref()).map(String::len).sum::<usize>()
            });
        let candidates = self.prefill.as_ref().map_or(0, |d| d.candidates.len());
        256 + 256 * candidates + 6 * text
    }
}

fn shared_prediction<S: serde::Serializer>(
    prediction: &Option<Arc<CachePrediction>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    prediction.as_deref().serialize(serializer)
}

/// A request's cached tokens as the router's index predicted them at pick time (the chosen replica's matched
/// blocks times the block size) and as the engine then reported them (`usage.prompt_tokens_details`).
/// Made only for token-exact blocks (a tokenizer, or token prompts) served by the replica picked, whose
/// index has an opinion (`matched_blocks`).
#[derive(Debug)]
pub struct CachePrediction {
    /// Tokens predicted.
    pub predicted: u32,
    /// Tokens per block.
    pub block_tokens: u32,
    /// What the engine reported; `u64::MAX` until it did.
    reported: AtomicU64,
}

impl CachePrediction {
    /// A prediction of `predicted` tokens in blocks of `block_tokens`.
    pub fn new(predicted: u32, block_tokens: u32) -> Self {
        Self { predicted, block_tokens, reported: AtomicU64::new(u64::MAX) }
    }

    /// Records the engine's count; returns whether the prediction was within one block of it.
    pub fn report(&self, engine: u32) -> bool {
        self.reported.store(u64::from(engine), Ordering::Relaxed);
        self.predicted.abs_diff(engine) <= self.block_tokens
    }

    /// The engine's count, once reported.
    pub fn reported(&self) -> Option<u32> {
        u32::try_from(self.reported.load(Ordering::Relaxed)).ok()
    }
}

impl Serialize for CachePrediction {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let engine = self.reported();
        let mut out = serializer.serialize_struct("CachePrediction", 3)?;
        out.serialize_field("predicted", &self.predicted)?;
        out.serialize_field("engine", &engine)?;
        out.serialize_field(
            "within_block",
            &engine.map(|e| self.predicted.abs_diff(e) <= self.block_tokens),
        )?;
        out.end()
    }
}

impl DecisionRecord {
    /// An upper bound of its size, as JSON and in memory (as [`crate::recording::weight`] is for a trace
    /// record): fixed fields, 256 bytes a candidate, 6 bytes a byte of text, 128 for a cache prediction.
    pub fn weight(&self) -> usize {
        let decision = &self.decision;
        let text = self.model.as_ref().map_or(0, String::len)
            + self.replica.len()
            + self.policy.len()
            + decision.policy.len()
            + decision.reason.len()
            + decision.notes.iter().map(String::len).sum::<usize>()
            + decision.candidates.iter().filter_map(|c| c.note.as_ref()).map(String::len).sum::<usize>()
            + self.attempts.iter().map(String::len).sum::<usize>()
            + self.error.as_ref().map_or(0, String::len);
        let prediction = self.cached_tokens.as_ref().map_or(0, |_| 128);
        let pd = self.pd.as_ref().map_or(0, PdRecord::weight);
        384 + 256 * decision.candidates.len() + 6 * text + prediction + pd
    }
}

/// The decision log: the records and what they weigh.
#[derive(Debug, Default)]
struct DecisionLog {
    /// Each record with its [`DecisionRecord::weight`], weighed once as it is logged.
    records: VecDeque<(Arc<DecisionRecord>, usize)>,
    /// The sum of the records' [`DecisionRecord::weight`]s.
    bytes: usize,
}

#[derive(Debug, Clone, Copy)]
struct HeatEntry {
    ts_ms: u64,
    group: u64,
    replica: ReplicaId,
    matched_blocks: u32,
}

/// Recent traffic by prefix group (first block hash) and replica.
#[derive(Debug, Default)]
struct HeatWindow {
    entries: VecDeque<HeatEntry>,
}

/// One prefix group's recent traffic: (requests, replica -> (requests, max matched blocks, requests with a hit)).
type GroupHeat = (u64, BTreeMap<ReplicaId, (u64, u32, u64)>);

/// Admin-side state: changes are serialised through it.
#[derive(Debug)]
pub struct AdminState {
    /// URL -> id.
    pub names: ReplicaNames,
    /// Recent policy versions, oldest first; the last is in force.
    pub history: VecDeque<PolicyVersion>,
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct RouterState {
    /// The configuration the router started with.
    pub config: RouterConfig,
    /// The replica set.
    pub fleet: ArcSwap<FleetView>,
    /// The policy in force.
    pub policy: ArcSwap<PolicyVersion>,
    /// Serialises admin changes.
    pub admin: tokio::sync::Mutex<AdminState>,
    /// Counters.
    pub metrics: Metrics,
    /// Traffic recording.
    pub recorder: Recorder,
    decisions: Mutex<DecisionLog>,
    heat: Mutex<HeatWindow>,
    /// Client for probes and model lookups (off the hot path).
    pub client: reqwest::Client,
    /// Tokenizer for token-exact blocks.
    pub tokenizer: Option<Arc<dyn Tokenize>>,
    next_request: AtomicU64,
    started: Instant,
    /// Fires when the router shuts down.
    pub shutdown: CancellationToken,
    /// The etcd key the policy comes from (`--policy-etcd`), with its watcher's state.
    pub etcd_policy: Option<Arc<crate::etcd_policy::EtcdPolicyWatch>>,
    /// The load this router and the fleet's other routers share through etcd (`--peer-load-prefix`).
    pub peer_load: Option<Arc<crate::peer_load::PeerLoadShare>>,
}

impl RouterState {
    /// Builds the state (no replicas yet; add them with [`RouterState::add_replica`]).
    pub fn new(config: RouterConfig, tokenizer: Option<Arc<dyn Tokenize>>) -> anyhow::Result<Arc<Self>> {
        config.validate()?;
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.read_timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            // Replicas are reached directly: a desktop's HTTP(S)_PROXY must not capture probes.
            .no_proxy()
            // A probe or model lookup is about the replica at that URL: a redirect elsewhere is not followed.
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        let first = PolicyVersion::new(1, config.policy.clone(), None)?;
        let recorder = Recorder::new(&config.record)?;
        let decisions_capacity = config.decisions_capacity;
        let etcd_policy = match &config.policy_etcd {
            Some(source) => Some(Arc::new(crate::etcd_policy::EtcdPolicyWatch::new(source)?)),
            None => None,
        };
        let peer_load = match &config.peer_load {
            Some(share) => Some(Arc::new(crate::peer_load::PeerLoadShare::new(share.clone())?)),
            None => None,
        };
        Ok(Arc::new(Self {
            fleet: ArcSwap::from_pointee(FleetView::default()),
            policy: ArcSwap::from_pointee(first.clone()),
            admin: tokio::sync::Mutex::new(AdminState {
                names: ReplicaNames::new(),
                history: VecDeque::from([first]),
            }),
            metrics: Metrics::default(),
            recorder,
            decisions: Mutex::new(DecisionLog {
                records: VecDeque::with_capacity(decisions_capacity.min(4096)),
                bytes: 0,
            }),
            heat: Mutex::new(HeatWindow::default()),
            client,
            tokenizer,
            next_request: AtomicU64::new(1),
            started: Instant::now(),
            shutdown: CancellationToken::new(),
            etcd_policy,
            peer_load,
            config,
        }))
    }

    /// Milliseconds since the router started: the engine's clock.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A fresh request id.
    pub fn next_request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// Adds a replica (learning its model from `/v1/models` when the spec has none). Errors when its URL is
    /// already in the fleet.
    pub async fn add_replica(
        self: &Arc<Self>,
        mut spec: ReplicaSpec,
    ) -> Result<Arc<Replica>, AddReplicaError> {
        if self.fleet.load().replicas.iter().any(|replica| replica.spec.url == spec.url) {
            return Err(AddReplicaError::Exists(spec.url));
        }
        if spec.kv_events.is_none()
            && let (Some(offset), Some((host, port))) = (self.config.kv_events_port_offset, spec.host_port())
        {
            spec.kv_events = port.checked_add(offset).map(|kv_port| format!("tcp://{host}:{kv_port}"));
        }
        let model = match &spec.model {
            Some(model) => model.clone(),
            None => self.learn_model(&spec.url).await.unwrap_or_default(),
        };
        self.install(spec, model, None).await
    }

    /// A replica that joined without a model (it was down, or its `/v1/models` did not answer) serves the
    /// unknown group, which takes any model name. When it answers probes again, this asks its `/v1/models`
    /// (at most every [`MODEL_LOOKUP_EVERY`]) and, once it names a model, moves the replica into that
    /// model's group in one swap of the fleet view: same id, same counters, no moment without it. True when
    /// it moved.
    pub async fn learn_missing_model(self: &Arc<Self>, replica: &Arc<Replica>) -> bool {
        if !replica.model.is_empty() || replica.spec.model.is_some() {
            return false;
        }
        let now = self.now_ms();
        let due = replica.next_model_lookup_ms.load(Ordering::Relaxed);
        if now < due {
            return false;
        }
        replica.next_model_lookup_ms.store(now + MODEL_LOOKUP_EVERY.as_millis() as u64, Ordering::Relaxed);
        let Some(model) = self.learn_model(&replica.spec.url).await else { return false };
        match self.install(replica.spec.clone(), model.clone(), Some(replica.clone())).await {
            Ok(_) => {
                tracing::info!(replica = %replica.spec.url, %model, "replica's model learned; it serves that model now");
                true
            }
            Err(error) => {
                tracing::debug!(replica = %replica.spec.url, %error, "the replica's model could not be applied");
                false
            }
        }
    }

    /// Puts a replica of `spec` serving `model` into the fleet, in place of `previous` when given (the same
    /// URL regrouped: it keeps its id and counters and is taken out of its old group in the same swap).
    async fn install(
        self: &Arc<Self>,
        spec: ReplicaSpec,
        model: String,
        previous: Option<Arc<Replica>>,
    ) -> Result<Arc<Replica>, AddReplicaError> {
        let mut admin = self.admin.lock().await;
        let current = self.fleet.load_full();
        let in_fleet = current.replicas.iter().find(|replica| replica.spec.url == spec.url);
        match (&previous, in_fleet) {
            (None, Some(_)) => return Err(AddReplicaError::Exists(spec.url)),
            // Removed (or regrouped) meanwhile: nothing to move.
            (Some(previous), found) if !found.is_some_and(|r| Arc::ptr_eq(r, previous)) => {
                return Err(AddReplicaError::Exists(spec.url));
            }
            _ => {}
        }
        let timeouts = Timeouts {
            connect: self.config.connect_timeout,
            read: self.config.read_timeout,
            idle: self.config.upstream_idle_timeout,
        };
        let connections = ReplicaConnections::new(&spec.url, timeouts)
            .map_err(|reason| AddReplicaError::BadUrl(spec.url.clone(), reason))?;
        let id = admin.names.intern(&spec.url);
        let url_header = axum::http::HeaderValue::from_str(&spec.url).ok();
        let requests = self.metrics.requests_of(&spec.url);
        let first_byte = self.metrics.first_byte_of(&spec.url);
        let carried = |counter: fn(&Replica) -> &AtomicU64| {
            AtomicU64::new(previous.as_deref().map_or(0, |p| counter(p).load(Ordering::Relaxed)))
        };
        let replica = Arc::new(Replica {
            id,
            spec,
            model: model.clone(),
            healthy: AtomicBool::new(previous.as_deref().is_none_or(Replica::healthy)),
            health: Mutex::new(HealthTracker::new(self.config.health.fall, self.config.health.rise)),
            routed_total: carried(|r| &r.routed_total),
            errors_total: carried(|r| &r.errors_total),
            requests,
            first_byte,
            kv_events: carried(|r| &r.kv_events),
            kv_resyncs: carried(|r| &r.kv_resyncs),
            removed: self.shutdown.child_token(),
            connections,
            url_header,
            next_model_lookup_ms: AtomicU64::new(0),
            engine_load: crate::engine_load::EngineLoad::default(),
        });
        let mut groups = current.groups.clone();
        let mut replicas = current.replicas.clone();
        if let Some(previous) = &previous {
            // Out of its old group first: its engine never picks it again, and an emptied group goes.
            if let Some(group) = groups.get(&previous.model) {
                lock(group.engine_for(previous.spec.role)).engine.remove_replica(previous.id);
            }
            replicas.retain(|r| !Arc::ptr_eq(r, previous));
            if !replicas.iter().any(|r| r.model == previous.model) {
                groups.remove(&previous.model);
            }
        }
        // Publish the view first, then teach the engine: a pick never names a replica the view lacks.
        let group = match groups.get(&model) {
            Some(group) => group.clone(),
            None => {
                let policy = self.policy.load();
                let mut engine = Engine::new(policy.spec.clone(), &[]).map_err(AddReplicaError::Policy)?;
                // Scraped engine figures count for a bounded time; then the policies use the own counts.
                engine.set_metrics_max_age(self.config.engine_metrics.max_age_ms());
                // So do other routers' published loads (a stalled watch cannot keep old ones in force).
                let peer_max_age = Some(crate::peer_load::PEER_MAX_AGE.as_millis() as u64);
                engine.set_peer_load_max_age(peer_max_age);
                let mut prefill =
                    Engine::new(prefill_spec(&policy.spec), &[]).map_err(AddReplicaError::Policy)?;
                prefill.set_metrics_max_age(self.config.engine_metrics.max_age_ms());
                prefill.set_peer_load_max_age(peer_max_age);
                // Routers that share their load share the prompts they route too (`peer_load.rs`).
                let sharing = self.peer_load.is_some();
                engine.set_prompt_sharing(sharing);
                prefill.set_prompt_sharing(sharing);
                let group = Arc::new(Group {
                    model: model.clone(),
                    engine: Mutex::new(PolicyEngine {
                        engine,
                        version: policy.version,
                        rng: SmallRng::seed_from_u64(self.config.seed ^ u64::from(id.0)),
                    }),
                    prefill: Mutex::new(PolicyEngine {
                        engine: prefill,
                        version: policy.version,
                        rng: SmallRng::seed_from_u64(self.config.seed ^ u64::from(id.0) ^ 0x9e37_79b9),
                    }),
                });
                groups.insert(model.clone(), group.clone());
                group
            }
        };
        replicas.push(replica.clone());
        self.fleet.store(Arc::new(FleetView::new(replicas, groups)));
        {
            let mut engine = lock(group.engine_for(replica.spec.role));
            engine.engine.add_replica(id);
            if !replica.healthy() {
                let _ = engine.engine.set_health(id, false);
            }
        }
        drop(admin);
        if let Some(previous) = &previous {
            previous.removed.cancel();
        }
        if replica.spec.kv_events.is_some() {
            crate::kv_events::spawn_subscriber(self.clone(), replica.clone());
        }
        Ok(replica)
    }

    /// The model a replica's `/v1/models` names first; `None` when it does not answer, or names none, or a
    /// name longer than any model's ([`crate::recording::MAX_KEPT_NAME_BYTES`]).
    async fn learn_model(&self, url: &str) -> Option<String> {
        let response =
            self.client.get(format!("{url}/v1/models")).timeout(Duration::from_secs(2)).send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        let body = fleet_base::http::read_limited(response, 1 << 20).await.ok()?;
        let models: serde_json::Value = serde_json::from_slice(&body).ok()?;
        let model = models["data"][0]["id"].as_str()?;
        (!model.is_empty() && model.len() <= crate::recording::MAX_KEPT_NAME_BYTES).then(|| model.to_owned())
    }

    /// Removes a replica; requests in flight on it finish. Returns it, or `None` when unknown.
    pub async fn remove_replica(&self, id: ReplicaId) -> Option<Arc<Replica>> {
        let _admin = self.admin.lock().await;
        let current = self.fleet.load_full();
        let replica = current.replica(id)?.clone();
        let mut groups = current.groups.clone();
        // Teach the engine first, then publish the view: the engine never picks it once it is gone.
        if let Some(group) = groups.get(&replica.model) {
            lock(group.engine_for(replica.spec.role)).engine.remove_replica(id);
        }
        let replicas: Vec<Arc<Replica>> = current.replicas.iter().filter(|r| r.id != id).cloned().collect();
        if !replicas.iter().any(|r| r.model == replica.model) {
            groups.remove(&replica.model);
        }
        self.fleet.store(Arc::new(FleetView::new(replicas, groups)));
        replica.removed.cancel();
        Some(replica)
    }

    /// Records a health outcome for a replica (probe or passive); applies a change to its engine.
    pub fn observe_health(&self, replica: &Replica, success: bool) {
        let change = lock(&replica.health).observe(success);
        if let Some(healthy) = change {
            replica.healthy.store(healthy, Ordering::Relaxed);
            if let Some(group) = self.fleet.load().groups.get(&replica.model) {
                let _ = lock(group.engine_for(replica.spec.role)).engine.set_health(replica.id, healthy);
            }
            if healthy {
                tracing::info!(replica = %replica.spec.url, "replica back in rotation");
            } else {
                tracing::warn!(replica = %replica.spec.url, "replica out of rotation");
            }
        }
    }

    /// Makes `spec` the new policy version, if `expected_version` is the one in force.
    pub async fn put_policy(
        &self,
        expected_version: u64,
        spec: PolicySpec,
    ) -> Result<Arc<PolicyVersion>, PolicyChangeError> {
        let mut admin = self.admin.lock().await;
        let current = self.policy.load_full();
        if current.version != expected_version {
            return Err(PolicyChangeError::VersionConflict { current_version: current.version });
        }
        let next = PolicyVersion::new(current.version + 1, spec, Some(current.version))
            .map_err(PolicyChangeError::Invalid)?;
        Ok(self.apply_policy(&mut admin, next))
    }

    /// Puts the value of the policy key at etcd revision `mod_revision` in force, validated exactly as an
    /// admin PUT (bounded: [`parse_policy_bounded`]). `Ok(None)`: that revision (or a newer one) is in force
    /// already. An invalid value leaves the policy in force.
    pub async fn apply_etcd_policy(
        &self,
        mod_revision: i64,
        value: &[u8],
    ) -> Result<Option<Arc<PolicyVersion>>, PolicyChangeError> {
        let in_force = |state: &Self| state.policy.load().store_revision.is_some_and(|r| r >= mod_revision);
        if in_force(self) {
            return Ok(None);
        }
        // Parsed before the admin lock is taken, so a slow value never holds other admin changes.
        let spec = parse_policy_bounded(bytes::Bytes::copy_from_slice(value))
            .await
            .map_err(PolicyChangeError::Invalid)?;
        let mut admin = self.admin.lock().await;
        if in_force(self) {
            return Ok(None);
        }
        let current = self.policy.load_full();
        let mut next = PolicyVersion::new(current.version + 1, spec, Some(current.version))
            .map_err(PolicyChangeError::Invalid)?;
        next.store_revision = Some(mod_revision);
        Ok(Some(self.apply_policy(&mut admin, next)))
    }

    /// Makes the spec in force before the current version the new version.
    pub async fn rollback_policy(&self) -> Result<Arc<PolicyVersion>, PolicyChangeError> {
        self.rollback_policy_if(None).await
    }

    /// Rolls back only while `expected_version` (when given) is in force: a rollback meant to undo a
    /// change must not undo whatever someone put in force after it.
    pub async fn rollback_policy_if(
        &self,
        expected_version: Option<u64>,
    ) -> Result<Arc<PolicyVersion>, PolicyChangeError> {
        let mut admin = self.admin.lock().await;
        let current = self.policy.load_full();
        if let Some(expected) = expected_version
            && current.version != expected
        {
            return Err(PolicyChangeError::VersionConflict { current_version: current.version });
        }
        let previous = current
            .previous
            .and_then(|version| admin.history.iter().find(|v| v.version == version).cloned())
            .ok_or(PolicyChangeError::NoPreviousVersion)?;
        let next = PolicyVersion::new(current.version + 1, previous.spec, previous.previous)
            .map_err(PolicyChangeError::Invalid)?;
        Ok(self.apply_policy(&mut admin, next))
    }

    fn apply_policy(&self, admin: &mut AdminState, mut next: PolicyVersion) -> Arc<PolicyVersion> {
        next.applied_at_us = unix_us();
        for group in self.fleet.load().groups.values() {
            let mut engine = lock(&group.engine);
            // The spec was resolved in PolicyVersion::new, so reconfigure cannot fail; keep the old one if it did.
            if engine.engine.reconfigure(next.spec.clone()).is_ok() {
                engine.version = next.version;
            }
            drop(engine);
            let mut prefill = lock(&group.prefill);
            if prefill.engine.reconfigure(prefill_spec(&next.spec)).is_ok() {
                prefill.version = next.version;
            }
        }
        admin.history.push_back(next.clone());
        while admin.history.len() > POLICY_HISTORY {
            admin.history.pop_front();
        }
        let next = Arc::new(next);
        self.policy.store(next.clone());
        self.metrics.policy_swaps.fetch_add(1, Ordering::Relaxed);
        tracing::info!(version = next.version, policy = next.name, "policy applied");
        next
    }

    /// Keeps a decision for `GET /admin/decisions` and the prefix-heat window.
    pub fn remember_decision(&self, record: DecisionRecord, first_block: Option<u64>, served_by: ReplicaId) {
        let matched = record.decision.chosen().and_then(|c| c.matched_blocks).unwrap_or(0);
        if let Some(group) = first_block {
            let window_ms = self.config.heat_window.as_millis() as u64;
            let mut heat = lock(&self.heat);
            while heat.entries.len() >= HEAT_ENTRIES
                || heat.entries.front().is_some_and(|e| record.ts_ms.saturating_sub(e.ts_ms) > window_ms)
            {
                heat.entries.pop_front();
            }
            heat.entries.push_back(HeatEntry {
                ts_ms: record.ts_ms,
                group,
                replica: served_by,
                matched_blocks: matched,
            });
        }
        let added = record.weight();
        let mut log = lock(&self.decisions);
        while log.records.len() >= self.config.decisions_capacity
            || (!log.records.is_empty() && log.bytes + added > self.config.decisions_max_bytes)
        {
            let Some((_, weight)) = log.records.pop_front() else { break };
            log.bytes -= weight;
        }
        log.bytes += added;
        log.records.push_back((Arc::new(record), added));
    }

    /// The newest `limit` decisions, newest first, at most `max_bytes` of them by
    /// [`DecisionRecord::weight`] (but always the newest one).
    pub fn recent_decisions(&self, limit: usize, max_bytes: usize) -> Vec<Arc<DecisionRecord>> {
        let log = lock(&self.decisions);
        let mut bytes = 0usize;
        let mut page = Vec::new();
        for (record, weight) in log.records.iter().rev().take(limit) {
            bytes += weight;
            if !page.is_empty() && bytes > max_bytes {
                break;
            }
            page.push(record.clone());
        }
        page
    }

    /// What the decision log holds: records and their summed [`DecisionRecord::weight`].
    pub fn decisions_held(&self) -> (usize, usize) {
        let log = lock(&self.decisions);
        (log.records.len(), log.bytes)
    }

    /// The decision for request `request_id`, if the log still holds it.
    pub fn decision_of(&self, request_id: u64) -> Option<Arc<DecisionRecord>> {
        lock(&self.decisions)
            .records
            .iter()
            .rev()
            .find(|(record, _)| record.request_id == request_id)
            .map(|(record, _)| record.clone())
    }

    /// The `/admin/state` document.
    pub fn state_document(&self) -> serde_json::Value {
        let fleet = self.fleet.load_full();
        let policy = self.policy.load_full();
        let mut replicas = Vec::new();
        let now_ms = self.now_ms();
        let max_age_ms = self.config.engine_metrics.max_age_ms();
        for replica in &fleet.replicas {
            let status = fleet.groups.get(&replica.model).and_then(|group| {
                lock(group.engine_for(replica.spec.role)).engine.replica_status_at(replica.id, now_ms)
            });
            let (outstanding, prefill_tokens, indexed_blocks) = status.as_ref().map_or((0, 0, 0), |s| {
                (s.outstanding, s.prefill_tokens, s.routed_index_blocks + s.kv_blocks[0])
            });
            // The load the policy sees: the engine's fresh figures with this router's requests sent since,
            // else this router's own in-flight count.
            let seen = status.as_ref().and_then(|s| s.seen);
            let load = serde_json::json!({
                "own": outstanding,
                "seen": seen.map_or(outstanding, |m| u64::from(m.queue_depth) + u64::from(m.running)),
                "source": if seen.is_some() { "engine" } else { "own" },
                // What the other routers published of their requests here (`--peer-load-prefix`).
                "peers": status.as_ref().and_then(|s| s.peer_load),
                // Prefix marks of the prompts other routers sent here (shared with the load).
                "peer_marks": status.as_ref().map_or(0, |s| s.peer_prompt_marks),
            });
            let engine = self.config.engine_metrics.enabled().then(|| {
                let view = replica.engine_load.view(now_ms, max_age_ms);
                let figures = view.figures;
                serde_json::json!({
                    "waiting": figures.and_then(|f| f.waiting),
                    "running": figures.and_then(|f| f.running),
                    "kv_usage": figures.and_then(|f| f.kv_usage),
                    "age_ms": view.age_ms,
                    "stale": view.stale,
                    "error": view.error,
                    "scrapes_ok": replica.engine_load.scrapes_ok.load(Ordering::Relaxed),
                    "scrapes_failed": replica.engine_load.scrapes_failed.load(Ordering::Relaxed),
                    "scrapes_skipped": replica.engine_load.scrapes_skipped.load(Ordering::Relaxed),
                    // Engine reads shared through etcd: whose read these figures are (null: this
                    // router's), ticks left to the replica's reader, and reads taken from others.
                    "read_by": view.read_by,
                    "scrapes_delegated": replica.engine_load.scrapes_delegated.load(Ordering::Relaxed),
                    "reads_received": replica.engine_load.reads_received.load(Ordering::Relaxed),
                })
            });
            replicas.push(serde_json::json!({
                "load": load,
                "engine": engine,
                "id": replica.id.0,
                "url": replica.spec.url,
                "model": replica.model,
                "role": replica.spec.role.as_str(),
                "bootstrap_port": replica.spec.bootstrap_port,
                "healthy": replica.healthy(),
                "outstanding": outstanding,
                "prefill_tokens": prefill_tokens,
                "routed_total": replica.routed_total.load(Ordering::Relaxed),
                "errors_total": replica.errors_total.load(Ordering::Relaxed),
                "indexed_blocks": indexed_blocks,
            }));
        }
        let window_ms = self.config.heat_window.as_millis() as u64;
        let now = unix_ms();
        let mut groups: HashMap<u64, GroupHeat> = HashMap::new();
        let mut total = 0u64;
        for entry in lock(&self.heat).entries.iter().filter(|e| now.saturating_sub(e.ts_ms) <= window_ms) {
            total += 1;
            let group = groups.entry(entry.group).or_default();
            group.0 += 1;
            let per_replica = group.1.entry(entry.replica).or_default();
            per_replica.0 += 1;
            per_replica.1 = per_replica.1.max(entry.matched_blocks);
            per_replica.2 += u64::from(entry.matched_blocks > 0);
        }
        let mut ranked: Vec<(u64, GroupHeat)> = groups.into_iter().collect();
        ranked.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(&b.0)));
        let prefix_groups: Vec<serde_json::Value> = ranked
            .into_iter()
            .take(TOP_GROUPS)
            .map(|(group, (requests, per_replica))| {
                let replicas: Vec<serde_json::Value> = per_replica
                    .into_iter()
                    .map(|(id, (served, cached_blocks, hits))| {
                        serde_json::json!({
                            "id": id.0,
                            "requests": served,
                            "cached_blocks": cached_blocks,
                            "hit_share": hits as f64 / served.max(1) as f64,
                        })
                    })
                    .collect();
                serde_json::json!({
                    "group": format!("{group:016x}"),
                    "requests": requests,
                    "share": requests as f64 / total.max(1) as f64,
                    "replicas": replicas,
                })
            })
            .collect();
        let mut document = serde_json::json!({
            "policy": {
                "name": policy.name,
                "version": policy.version,
                "store_revision": policy.store_revision,
                "applied_at_us": policy.applied_at_us,
            },
            "replicas": replicas,
            "prefix_groups": prefix_groups,
            "window_s": self.config.heat_window.as_secs(),
            // How often the policies get the engines' own load figures (0: never), so a what-if can replay
            // the router as it is deployed.
            "engine_metrics_ms": self.config.engine_metrics.interval.as_millis() as u64,
            "index_accuracy": {
                "predictions": self.metrics.predictions.load(Ordering::Relaxed),
                "within_block": self.metrics.predictions_within_block.load(Ordering::Relaxed),
            },
        });
        // Cumulative, so the app can show decisions by reason over time and each leg's time per window.
        document["pd"] = self.metrics.pd_state_json();
        if let Some(store) = &self.etcd_policy {
            document["policy_store"] = store.state_document();
        }
        if let Some(share) = &self.peer_load {
            document["peer_load"] = share.state_document(now_ms);
        }
        document
    }

    /// Per-replica gauges for `/metrics`.
    pub fn replica_gauges(&self) -> Vec<ReplicaGauges> {
        let fleet = self.fleet.load_full();
        fleet
            .replicas
            .iter()
            .map(|replica| {
                let outstanding = fleet
                    .groups
                    .get(&replica.model)
                    .and_then(|group| {
                        lock(group.engine_for(replica.spec.role)).engine.replica_status(replica.id)
                    })
                    .map_or(0, |status| status.outstanding);
                ReplicaGauges {
                    url: replica.spec.url.clone(),
                    healthy: replica.healthy(),
                    outstanding,
                    kv_events: replica.kv_events.load(Ordering::Relaxed),
                    kv_resyncs: replica.kv_resyncs.load(Ordering::Relaxed),
                    idle_connections: replica.connections.idle_count() as u64,
                    engine: self.config.engine_metrics.enabled().then(|| {
                        replica.engine_load.view(self.now_ms(), self.config.engine_metrics.max_age_ms())
                    }),
                    engine_scrapes: (
                        replica.engine_load.scrapes_ok.load(Ordering::Relaxed),
                        replica.engine_load.scrapes_failed.load(Ordering::Relaxed),
                    ),
                    engine_shared: (
                        replica.engine_load.scrapes_delegated.load(Ordering::Relaxed),
                        replica.engine_load.reads_received.load(Ordering::Relaxed),
                    ),
                }
            })
            .collect()
    }
}

/// Why a replica could not be added.
#[derive(Debug, thiserror::Error)]
pub enum AddReplicaError {
    /// Its URL is already in the fleet.
    #[error("{0} is already a replica of this router")]
    Exists(String),
    /// Its URL does not parse as a URL.
    #[error("{0} is not a usable URL ({1}); write it like http://127.0.0.1:8100")]
    BadUrl(String, String),
    /// The policy in force could not build an engine (not expected: it was validated).
    #[error("cannot build an engine for the new model group: {0}")]
    Policy(SpecError),
}

/// Why a policy change was refused (the old policy stays in force).
#[derive(Debug, thiserror::Error)]
pub enum PolicyChangeError {
    /// `If-Match` named a version that is no longer in force.
    #[error(
        "the policy is at version {current_version}; fetch it again and retry with If-Match: \"{current_version}\""
    )]
    VersionConflict {
        /// The version in force.
        current_version: u64,
    },
    /// The spec is invalid.
    #[error("{0}")]
    Invalid(SpecError),
    /// Nothing to roll back to.
    #[error("there is no previous policy version to roll back to")]
    NoPreviousVersion,
}

/// Runs active health probes of every replica until shutdown.
pub async fn probe_loop(state: Arc<RouterState>) {
    let health = state.config.health.clone();
    let mut ticker = tokio::time::interval(health.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let fleet = state.fleet.load_full();
        let now = tokio::time::Instant::now();
        for replica in &fleet.replicas {
            replica.connections.close_idle(now);
        }
        let probes = fleet.replicas.iter().map(|replica| {
            let state = state.clone();
            let replica = replica.clone();
            let path = health.path.clone();
            async move {
                let ok = matches!(
                    state.client.get(format!("{}{path}", replica.spec.url)).timeout(health.timeout).send().await,
                    Ok(response) if response.status().is_success()
                );
                state.observe_health(&replica, ok);
                if ok {
                    state.learn_missing_model(&replica).await;
                }
            }
        });
        futures_util::future::join_all(probes).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn policy_versions_check_and_roll_back() {
        let state = RouterState::new(RouterConfig::default(), None).unwrap();
        assert_eq!(state.policy.load().version, 1);
        let conflict = state.put_policy(7, PolicySpec::named("random")).await.unwrap_err();
        assert!(matches!(conflict, PolicyChangeError::VersionConflict { current_version: 1 }));
        assert!(matches!(state.rollback_policy().await, Err(PolicyChangeError::NoPreviousVersion)));
        let v2 = state.put_policy(1, PolicySpec::named("random")).await.unwrap();
        let v3 = state.put_policy(2, PolicySpec::named("least_load")).await.unwrap();
        assert_eq!((v2.version, v3.name), (2, "least_load"));
        let v4 = state.rollback_policy().await.unwrap();
        assert_eq!((v4.version, v4.name), (4, "random"));
        let v5 = state.rollback_policy().await.unwrap();
        assert_eq!((v5.version, v5.name), (5, "round_robin"));
        assert!(matches!(state.rollback_policy().await, Err(PolicyChangeError::NoPreviousVersion)));
    }

    #[tokio::test]
    async fn groups_are_found_by_model() {
        let state = RouterState::new(RouterConfig::default(), None).unwrap();
        let view = state.fleet.load_full();
        assert_eq!(view.group_for(None).unwrap_err(), GroupError::NoReplicas);
        state.add_replica("http://127.0.0.1:9,model=a".parse().unwrap()).await.unwrap();
        state.add_replica("http://127.0.0.1:10,model=b".parse().unwrap()).await.unwrap();
        let view = state.fleet.load_full();
        assert_eq!(view.group_for(Some("b")).unwrap().model, "b");
        assert!(matches!(view.group_for(Some("c")), Err(GroupError::UnknownModel { .. })));
        assert!(matches!(view.group_for(None), Err(GroupError::ModelRequired { .. })));
        assert!(state.add_replica("http://127.0.0.1:9,model=a".parse().unwrap()).await.is_err());
        let removed = state.remove_replica(ReplicaId(1)).await.unwrap();
        assert_eq!(removed.model, "b");
        assert_eq!(state.fleet.load().group_for(None).unwrap().model, "a");
    }
}
