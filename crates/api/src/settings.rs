//! The settings view's contract: the endpoints the app watches, adding and removing them, the scrape
//! interval, discovery sources and where the fleet's policy lives.

use serde::{Deserialize, Serialize};

/// Command: the watched endpoints and settings. Args: none (`{}`).
pub const CMD_SETTINGS: &str = "settings";

/// Command: add (and at once probe) a replica, router or Prometheus source. Args: [`AddEndpointArgs`].
pub const CMD_ADD_ENDPOINT: &str = "add_endpoint";

/// Command: stop watching an endpoint. Args: [`RemoveEndpointArgs`].
pub const CMD_REMOVE_ENDPOINT: &str = "remove_endpoint";

/// Command: change the scrape interval. Args: [`ScrapeIntervalArgs`].
pub const CMD_SET_SCRAPE_INTERVAL: &str = "set_scrape_interval";

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
    pub etcd: Option<EtcdSetting>,
}

/// One router as configured.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RouterSetting {
    pub url: String,
    /// The 0600 file holding its admin token, if it has one.
    pub token_file: Option<String>,
    pub probe: ProbeReport,
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
pub struct EtcdSetting {
    /// etcd's client URLs.
    pub endpoints: Vec<String>,
    /// The fleet's main policy key; canary groups use keys beside it.
    pub key: String,
}

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
