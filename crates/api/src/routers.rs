//! What the app reads from the fleet's routers: where each router stands, the prefix heat map, the decision
//! log and the cache headroom of their recorded traffic.

use serde::{Deserialize, Serialize};

/// Command: replicas x top prefix groups from every router's `/admin/state`. Args: [`HeatMapArgs`].
pub const CMD_HEAT_MAP: &str = "heat_map";

/// Command: recent routing decisions of every router. Args: [`DecisionsArgs`].
pub const CMD_DECISIONS: &str = "decisions";

/// Command: achieved vs achievable hit rate on recent recorded traffic. Args: [`HeadroomArgs`].
pub const CMD_HEADROOM: &str = "headroom";

/// Command: a disaggregated (P/D) fleet at a glance: per-role saturation, the P:D ratio, the routers'
/// split decisions by reason over time and TTFT divided into its legs. Args: [`PdViewArgs`].
pub const CMD_PD_VIEW: &str = "pd_view";

/// Where a router's part of a combined view came from, and whether it answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterSource {
    pub url: String,
    /// `None` when the last call succeeded; otherwise what went wrong and how to fix it.
    pub error: Option<String>,
    /// Policy name and version the router reported, when it answered.
    pub policy: Option<String>,
    pub policy_version: Option<u64>,
    /// `fleet-router`, `smg` or `vllm-router` (empty until the router first answered).
    #[serde(default)]
    pub kind: String,
    /// Why the app cannot change this router's policy (third-party routers); the UI shows it.
    #[serde(default)]
    pub read_only: Option<String>,
    /// The workers a third-party router lists (fleet-router's replicas are in its own views).
    #[serde(default)]
    pub workers: Vec<RouterWorker>,
    /// A third-party router's own request and error counts (from its metrics).
    #[serde(default)]
    pub requests_total: Option<f64>,
    #[serde(default)]
    pub errors_total: Option<f64>,
    /// How well a fleet-router's KV index predicts the engines' cached tokens (`/admin/state`'s
    /// `index_accuracy`); `None` for a router that does not report it (third-party, or older).
    #[serde(default)]
    pub index_accuracy: Option<IndexAccuracy>,
}

/// A fleet-router's index accuracy since it started: of the requests whose cached tokens its index
/// predicted and the engine then reported, how many were predicted within one KV block.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct IndexAccuracy {
    pub predictions: u64,
    pub within_block: u64,
}

impl IndexAccuracy {
    /// `within_block / predictions`, `None` before the first prediction.
    pub fn share(&self) -> Option<f64> {
        (self.predictions > 0)
            .then(|| self.within_block.min(self.predictions) as f64 / self.predictions as f64)
    }
}

/// One worker of a third-party router, as it lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterWorker {
    pub url: String,
    pub healthy: Option<bool>,
    pub load: Option<f64>,
}

/// Arguments of [`CMD_HEAT_MAP`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HeatMapArgs {
    /// A hotspot is one replica serving a prefix group whose requests on that replica are more
    /// than this share (0..1) of all recent traffic.
    pub hotspot_share: f64,
}

impl Default for HeatMapArgs {
    fn default() -> Self {
        Self { hotspot_share: 0.3 }
    }
}

/// Replicas x top prefix groups.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct HeatMap {
    pub now_ms: i64,
    pub routers: Vec<RouterSource>,
    /// Column order: replica URLs as the routers name them.
    pub replicas: Vec<String>,
    /// Row order: busiest group first.
    pub groups: Vec<HeatGroup>,
    pub hotspots: Vec<Hotspot>,
    /// The router's traffic window, seconds.
    pub window_s: u64,
    /// Whether the routers agree on each replica's load: each router's view beside the engine's own figure.
    #[serde(default)]
    pub load_agreement: Vec<ReplicaLoadAgreement>,
    /// Where each router believes the busiest prefix groups are cached, for groups two or more routers
    /// report; those they disagree on first.
    #[serde(default)]
    pub prefix_placement: Vec<PrefixPlacement>,
}

/// One prefix group and the replicas each router believes hold it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PrefixPlacement {
    /// Hex of the group's first block hash, as in [`HeatGroup::group`].
    pub group: String,
    /// The group's requests over all the routers that report it.
    pub requests: u64,
    /// One entry per router that reports the group.
    pub routers: Vec<RouterPrefixView>,
    /// Routers whose indexes name holders name different ones.
    pub disagree: bool,
}

/// Where one router believes a prefix group is cached.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RouterPrefixView {
    pub router: String,
    /// Replica URLs the router's index says hold most of the group's prefix (at least half the blocks of the
    /// replica holding the most), in URL order; empty when its index names none.
    pub holders: Vec<String>,
    /// The group's requests through this router.
    pub requests: u64,
}

/// One replica's load as every router sees it, beside what its engine itself reports.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ReplicaLoadAgreement {
    pub replica: String,
    /// Requests the engine holds (waiting + running) by its own `/metrics`, from the router whose scrape
    /// is freshest; `None` when no router has fresh figures.
    pub engine: Option<f64>,
    /// Age of that figure, milliseconds.
    pub engine_age_ms: Option<u64>,
    /// One entry per router that lists the replica.
    pub routers: Vec<RouterLoadView>,
    /// Whether some router's view is off the engine's figure (or, without one, off the other routers'):
    /// by more than 2 requests and a quarter of the figure.
    pub disagree: bool,
    /// Which routers are off and by how much, for people.
    pub note: Option<String>,
}

/// One router's view of one replica's load.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RouterLoadView {
    pub router: String,
    /// Requests this router has in flight there.
    pub own: u64,
    /// Requests its policy counts there: the engine's fresh figures with its own requests since, else `own`.
    pub seen: u64,
    /// `engine` or `own` (no fresh engine figures: scrapes off, failing or stale).
    pub source: String,
    /// Its scraped engine figures are missing or too old.
    pub stale: bool,
    /// Requests the fleet's other routers told it they have there (load shared through etcd,
    /// `--peer-load-prefix`); `None` when it holds no fresh summary from any.
    #[serde(default)]
    pub published_by_others: Option<u64>,
}

/// One prefix group (requests whose first block is the same).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct HeatGroup {
    /// Hex of the first block hash.
    pub group: String,
    pub requests: u64,
    /// Share of all recent requests, 0..1.
    pub share: f64,
    /// One cell per entry of [`HeatMap::replicas`], same order.
    pub cells: Vec<HeatCell>,
}

/// One replica's part of a group.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct HeatCell {
    pub requests: u64,
    pub cached_blocks: u64,
    /// Share of the group's prompt blocks that hit this replica's cache, 0..1.
    pub hit_share: f64,
}

/// One replica carrying too much of the traffic through one prefix group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hotspot {
    pub group: String,
    pub replica: String,
    /// That replica's requests of the group over all requests, 0..1.
    pub share: f64,
}

/// Arguments of [`CMD_DECISIONS`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DecisionsArgs {
    /// Newest decisions per router, 1..=500.
    pub limit: u32,
}

impl Default for DecisionsArgs {
    fn default() -> Self {
        Self { limit: 50 }
    }
}

/// Recent decisions of every router, newest first.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DecisionLog {
    pub now_ms: i64,
    pub routers: Vec<RouterSource>,
    pub decisions: Vec<DecisionEntry>,
}

/// One routed request and why it went where it went.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DecisionEntry {
    pub router: String,
    pub ts_ms: i64,
    pub request_id: String,
    pub model: Option<String>,
    /// URL of the chosen replica.
    pub replica: String,
    pub policy: String,
    pub policy_version: Option<u64>,
    /// The rule that decided (`cache`, `balance`, `cost`, `fallback`, ...).
    pub branch: String,
    pub reason: String,
    pub prompt_blocks: Option<u32>,
    pub candidates: Vec<Candidate>,
    pub notes: Vec<String>,
    /// Replica URLs tried in order, when the first did not answer (every one, when none did).
    #[serde(default)]
    pub attempts: Vec<String>,
    /// Why no replica served the request (its client got a 502); `None` when one did.
    #[serde(default)]
    pub error: Option<String>,
    /// The cached tokens fleet-router's index predicted for the replica that served it, and the engine's
    /// own count once it reported one; `None` when no prediction was made.
    #[serde(default)]
    pub cached_tokens: Option<CachedTokens>,
    /// fleet-router's prefill/decode decision, for a model in P/D mode.
    #[serde(default)]
    pub pd: Option<PdDecision>,
}

/// A P/D fleet's per-request decision: a remote prefill leg then the decode leg (`split`), or a local
/// prefill at the decode replica (`local`), and why.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PdDecision {
    /// `split` or `local`.
    pub branch: String,
    /// `split`, `short_prompt`, `cached_at_decode`, `prefill_pool_busy`, `no_prefill_replica` or
    /// `transfer_failed` (a split that fell back to a local prefill).
    pub reason: String,
    /// The router's sentence, with the figures and thresholds it compared.
    pub explanation: String,
    /// Prompt tokens the decode replica held and lacked, by the router's index.
    pub cached_at_decode: u32,
    pub uncached_tokens: u32,
    /// The prefill replica's URL, when split.
    pub prefill_replica: Option<String>,
    /// How long the prefill leg took, ms.
    pub prefill_ms: Option<f64>,
    /// Why a split was prefilled locally after all.
    pub fallback: Option<String>,
}

/// A request's cached tokens, predicted by the router's index and reported by the engine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CachedTokens {
    pub predicted: u32,
    /// `None` until the engine's answer reported its count.
    pub engine: Option<u32>,
    /// Whether the prediction was within one KV block of the engine's count.
    pub within_block: Option<bool>,
}

/// One replica as the pick saw it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Candidate {
    /// The replica's URL when the router names it, else its id.
    pub replica: String,
    pub healthy: bool,
    pub eligible: bool,
    pub outstanding: u64,
    pub prefill_tokens: u64,
    pub load: Option<f64>,
    pub matched_blocks: Option<u32>,
    pub score: Option<f64>,
    pub cost: Option<f64>,
    pub chosen: bool,
    pub note: Option<String>,
}

/// Arguments of [`CMD_HEADROOM`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HeadroomArgs {
    /// Recorded traffic of the last `window_s` seconds, 10 s .. 1 day.
    pub window_s: u32,
}

impl Default for HeadroomArgs {
    fn default() -> Self {
        Self { window_s: 600 }
    }
}

/// Achieved vs achievable prefix hit rate, per model.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Headroom {
    pub now_ms: i64,
    pub window_s: u32,
    pub routers: Vec<RouterSource>,
    pub models: Vec<ModelHeadroom>,
    /// Caveats about how the figures were computed.
    pub notes: Vec<String>,
}

/// One model's figures. Rates are token-weighted, 0..1; `None` when unknown.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelHeadroom {
    pub model: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    /// What the fleet got: cached prompt tokens the routers recorded over prompt tokens, over the
    /// `measured_requests` whose responses reported a cached-token count.
    pub achieved: Option<f64>,
    /// Requests whose responses reported cached tokens (clients that ask for no usage report none).
    pub measured_requests: u64,
    /// One shared cache of unbounded size over all `requests`: no routing can beat it.
    pub pooled_bound: Option<f64>,
    /// The pooled bound over the measured requests only (the cache still warmed by all), the
    /// figure `achieved` is compared with.
    pub pooled_bound_measured: Option<f64>,
    /// The best policy's what-if result on the same traffic, when a replay ran.
    pub best_policy: Option<String>,
    pub best_policy_hit_rate: Option<f64>,
}

/// Arguments of [`CMD_PD_VIEW`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PdViewArgs {
    /// The last `window_s` seconds, 10 .. 900 (the app keeps 15 minutes of the routers' counters).
    pub window_s: u32,
    /// Width of one bar of decisions over time, 1 .. `window_s` seconds.
    pub bucket_s: u32,
}

impl Default for PdViewArgs {
    fn default() -> Self {
        Self { window_s: 300, bucket_s: 10 }
    }
}

/// A P/D fleet as the routers and replicas report it. Figures are `None` when nothing reported them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PdView {
    pub now_ms: i64,
    pub window_s: u32,
    pub bucket_s: u32,
    pub routers: Vec<RouterSource>,
    /// Whether any router knows a replica of the prefill role (else the fleet does not disaggregate).
    pub disaggregated: bool,
    /// `prefill`, `decode` and `both` (replicas that serve whole requests), in that order, where present.
    pub roles: Vec<PdRole>,
    /// Prefill to decode replicas, reduced (`1:2`); `None` without both.
    pub ratio: Option<String>,
    /// Decisions in the window per reason (`split`, `short_prompt`, ...), largest first.
    pub reasons: Vec<PdReasonCount>,
    /// Decisions per reason in consecutive buckets of `bucket_s`, oldest first.
    pub over_time: Vec<PdBucket>,
    pub ttft: PdTtftSplit,
    /// Each router's own P/D figures (fleet-routers and third-party routers that disaggregate).
    #[serde(default)]
    pub router_figures: Vec<PdRouterRow>,
    /// How the figures were read, and what is missing.
    pub notes: Vec<String>,
}

/// One role's replicas and how full they are.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PdRole {
    /// `prefill`, `decode` or `both`.
    pub role: String,
    pub replicas: u32,
    pub healthy: u32,
    /// Requests the routers have outstanding on these replicas, per replica.
    pub outstanding_per_replica: f64,
    /// The engines' own figures, means over the replicas that report them.
    pub kv_usage: Option<f64>,
    pub queue_depth: Option<f64>,
    pub running: Option<f64>,
    /// Mean KV transfer into these replicas, ms (decode side, vLLM's connector; SGLang's latest).
    pub transfer_ms: Option<f64>,
}

/// A reason's decisions in the window.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PdReasonCount {
    pub reason: String,
    pub count: u64,
    /// Of all P/D decisions in the window, 0..1.
    pub share: f64,
}

/// Decisions per reason in one bucket.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PdBucket {
    pub start_ms: i64,
    pub counts: std::collections::BTreeMap<String, u64>,
}

/// Where a split request's time to first token goes, over the window (ms).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PdTtftSplit {
    /// Split requests whose prefill leg finished in the window.
    pub splits: u64,
    /// Splits that fell back to a local prefill.
    pub fallbacks: u64,
    /// The prefill leg as the routers timed it: sending, prefilling, the answer back.
    pub prefill_leg_mean_ms: Option<f64>,
    pub prefill_leg_p95_ms: Option<f64>,
    /// The KV transfer as the decode engines timed it (absent when they export no transfer metrics).
    pub transfer_mean_ms: Option<f64>,
    /// The decode leg's first token after the transfer: the decode leg less the transfer.
    pub first_decode_token_mean_ms: Option<f64>,
    /// The decode leg: what the split's TTFT adds after the prefill leg (transfer included).
    #[serde(default)]
    pub decode_leg_mean_ms: Option<f64>,
    /// A split request's arrival at the router to the decode replica's first byte: its TTFT as the routers
    /// saw it (prefill leg, transfer and first decode token).
    pub decode_first_byte_mean_ms: Option<f64>,
    pub decode_first_byte_p95_ms: Option<f64>,
}

/// One router's own P/D figures over the view's window: fleet-router's counters, or a third-party router's
/// own metrics (SMG's `smg_pd_*`), each as that router times it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PdRouterRow {
    pub url: String,
    /// `fleet-router`, or the third-party router's kind (`smg`).
    pub kind: String,
    /// Requests it split (sent to a prefill replica) in the window.
    pub splits: u64,
    /// Splits that failed: fleet-router's fall back to a local prefill; SMG answers its bootstrap, KV
    /// transfer and rendezvous failures as errors.
    pub failures: u64,
    /// A split request's time to first token (fleet-router: arrival to the decode replica's first byte;
    /// SMG: `smg_pd_ttft_seconds`).
    pub ttft_mean_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    /// The prefill leg (SMG: `smg_pd_prefill_duration_seconds`).
    pub prefill_mean_ms: Option<f64>,
    /// The KV transfer, where the router times it (SMG's gRPC path); fleet-router leaves it to the engines.
    pub transfer_mean_ms: Option<f64>,
    /// The decode side's own time to its first token, where the router times it (SMG's gRPC path).
    pub decode_ttft_mean_ms: Option<f64>,
    /// Requests it served without a split in the window, where it counts them (fleet-router's local
    /// decisions; llm-d's `decode-only`).
    #[serde(default)]
    pub local: u64,
    /// Its workers by type as it reports them now (Dynamo's per-worker gauges).
    #[serde(default)]
    pub worker_types: Vec<PdWorkerType>,
}

/// One worker type's figures as a router reports them (Dynamo's `dynamo_frontend_worker_*` gauges).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PdWorkerType {
    /// `prefill` or `decode`.
    pub worker_type: String,
    pub workers: u32,
    /// Prefill tokens queued or running on them, summed.
    pub active_prefill_tokens: Option<f64>,
    /// KV blocks their decodes hold, summed.
    pub active_decode_blocks: Option<f64>,
    /// Mean of each worker's latest time to first token, ms.
    pub last_ttft_ms: Option<f64>,
}
