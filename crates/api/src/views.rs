//! Commands and shapes of the views beyond the live table: heat map, replica detail,
//! decisions, headroom and settings.

use serde::{Deserialize, Serialize};

/// Command: replicas x top prefix groups from every router's `/admin/state`. Args: [`HeatMapArgs`].
pub const CMD_HEAT_MAP: &str = "heat_map";
/// Command: one replica's history charts. Args: [`ReplicaHistoryArgs`].
pub const CMD_REPLICA_HISTORY: &str = "replica_history";
/// Command: recent routing decisions of every router. Args: [`DecisionsArgs`].
pub const CMD_DECISIONS: &str = "decisions";
/// Command: achieved vs achievable hit rate on recent recorded traffic. Args: [`HeadroomArgs`].
pub const CMD_HEADROOM: &str = "headroom";
/// Command: the watched endpoints and settings. Args: none (`{}`).
pub const CMD_SETTINGS: &str = "settings";
/// Command: add (and at once probe) a replica, router or Prometheus source. Args: [`AddEndpointArgs`].
pub const CMD_ADD_ENDPOINT: &str = "add_endpoint";
/// Command: stop watching an endpoint. Args: [`RemoveEndpointArgs`].
pub const CMD_REMOVE_ENDPOINT: &str = "remove_endpoint";
/// Command: change the scrape interval. Args: [`ScrapeIntervalArgs`].
pub const CMD_SET_SCRAPE_INTERVAL: &str = "set_scrape_interval";
/// Command: start the embedded demo fleet inside the running app (once). Args: [`StartDemoArgs`].
pub const CMD_START_DEMO: &str = "start_demo";

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
}

/// One worker of a third-party router, as it lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterWorker {
    pub url: String,
    pub healthy: Option<bool>,
    pub load: Option<f64>,
}

// ---------- heat map ----------

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

// ---------- replica detail ----------

/// Arguments of [`CMD_REPLICA_HISTORY`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReplicaHistoryArgs {
    /// The replica's [`crate::ReplicaRow::id`].
    pub id: u32,
    /// How far back, seconds (60 s .. 90 days); windows past raw retention (24 h) read the 1 min tier.
    pub window_s: u32,
}

/// One replica's charts.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ReplicaHistory {
    pub id: u32,
    pub url: String,
    pub engine: Option<String>,
    pub model: Option<String>,
    pub now_ms: i64,
    pub window_s: u32,
    /// Which history tier the points come from: `raw`, or `1m` past raw retention.
    pub tier: String,
    pub ttft_p50_s: Vec<(i64, f64)>,
    pub ttft_p95_s: Vec<(i64, f64)>,
    pub queue_depth: Vec<(i64, f64)>,
    pub kv_usage: Vec<(i64, f64)>,
    pub hit_rate: Vec<(i64, f64)>,
    pub tokens_per_s: Vec<(i64, f64)>,
    /// Moments the routing policy changed inside the window, oldest first.
    pub policy_changes: Vec<PolicyMarker>,
}

/// A policy change: from the audit trail (an acknowledged push) or seen on a router.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyMarker {
    pub ts_ms: i64,
    pub label: String,
}

// ---------- decisions ----------

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

// ---------- headroom ----------

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

// ---------- settings ----------

/// What kind of endpoint an [`AddEndpointArgs`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointKind {
    /// A replica's metrics endpoint (base URL or full `/metrics` URL).
    Replica,
    /// A fleet-router (its admin API).
    Router,
    /// A Prometheus server whose targets are the replicas.
    Prometheus,
}

/// Arguments of [`CMD_ADD_ENDPOINT`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AddEndpointArgs {
    pub kind: EndpointKind,
    pub url: String,
    /// A router's admin token; written to a 0600 file, never stored in SQLite.
    #[serde(default)]
    pub token: Option<String>,
}

/// Arguments of [`CMD_REMOVE_ENDPOINT`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoveEndpointArgs {
    pub kind: EndpointKind,
    pub url: String,
}

/// Arguments of [`CMD_SET_SCRAPE_INTERVAL`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScrapeIntervalArgs {
    /// 0.2 .. 300 seconds.
    pub seconds: f64,
}

/// Arguments of [`CMD_START_DEMO`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StartDemoArgs {
    /// Emulated replicas, 1 ..= 64.
    pub replicas: u32,
}

impl Default for StartDemoArgs {
    fn default() -> Self {
        Self { replicas: 4 }
    }
}

/// The demo fleet the app runs and watches (until it stops; never saved to the settings).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DemoStarted {
    pub replicas: Vec<String>,
    /// The fleet-router the demo traffic goes through.
    pub router: String,
}

/// What probing an endpoint found.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ProbeReport {
    pub url: String,
    /// Detected engine (`vllm`, `sglang`, ...), `fleet-router`, or `prometheus`.
    pub detected: Option<String>,
    /// A short description: model, policy and version, number of targets.
    pub detail: Option<String>,
    /// Why it could not be probed, and what to do.
    pub error: Option<String>,
}

/// Everything the settings view shows.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SettingsView {
    pub replicas: Vec<ProbeReport>,
    pub routers: Vec<RouterSetting>,
    pub prometheus: Vec<ProbeReport>,
    pub scrape_interval_s: f64,
    /// Where router tokens are kept (a folder of 0600 files).
    pub token_dir: String,
    /// The discovery sources (`--discover-file`, `--discover-srv`) and where each stands.
    #[serde(default)]
    pub discovery: Vec<DiscoveryView>,
    /// Where the fleet's policy lives when its routers take it from etcd (`--policy-etcd`).
    #[serde(default)]
    pub policy_store: Option<PolicyStoreSetting>,
}

/// One discovery source as the settings view shows it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DiscoveryView {
    /// `file PATH` or `DNS SRV NAME`.
    pub source: String,
    /// Replica URLs it listed the last time it could be read.
    pub replicas: Vec<String>,
    /// Router URLs it listed the last time it could be read.
    pub routers: Vec<String>,
    /// Why the last read failed (what it found before is kept and still watched).
    pub error: Option<String>,
    /// Reads finished since the app started, one per scrape interval.
    pub reads: u64,
    /// When the last read finished (unix ms).
    pub last_read_ms: Option<u64>,
}

/// The etcd key a fleet's routers watch.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PolicyStoreSetting {
    /// etcd's client URLs.
    pub endpoints: Vec<String>,
    /// The fleet's main policy key; canary groups use keys beside it.
    pub key: String,
}

/// One router as configured.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RouterSetting {
    pub url: String,
    /// The 0600 file holding its admin token, if it has one.
    pub token_file: Option<String>,
    pub probe: ProbeReport,
}
