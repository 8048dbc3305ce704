//! The fleet view's contract: the live snapshot of every watched replica (signals, scrape state, the history
//! writer's health) and one replica's charts over time.

use serde::{Deserialize, Serialize};

/// Command name: the live fleet table and TTFT chart data. Args: [`FleetSnapshotArgs`].
pub const CMD_FLEET_SNAPSHOT: &str = "fleet_snapshot";

/// Arguments of [`CMD_FLEET_SNAPSHOT`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FleetSnapshotArgs {
    /// How far back the chart series reach, in seconds.
    pub window_s: u32,
    /// Append this many synthetic replicas (deterministic, changing every second) after the
    /// real ones: how the overview is exercised at fleet sizes one laptop cannot emulate.
    /// Zero (the default) adds none; at most [`MAX_SYNTHETIC_REPLICAS`].
    #[serde(default)]
    pub synthetic: u32,
    /// Leave out the TTFT series (views that draw no chart skip the history query).
    #[serde(default)]
    pub skip_series: bool,
}

/// Upper bound of [`FleetSnapshotArgs::synthetic`].
pub const MAX_SYNTHETIC_REPLICAS: u32 = 10_000;

impl Default for FleetSnapshotArgs {
    fn default() -> Self {
        Self { window_s: 300, synthetic: 0, skip_series: false }
    }
}

/// Everything the fleet view draws, as of one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetSnapshot {
    /// Wall-clock time the snapshot was taken, in Unix milliseconds.
    pub now_ms: i64,
    /// One row per watched replica, in a stable order (the order they were added).
    pub replicas: Vec<ReplicaRow>,
    /// TTFT p95 per replica over the requested window, oldest point first.
    pub ttft_p95: Vec<Series>,
    /// How storing the scrapes goes: which database, failed writes, shed rounds.
    #[serde(default)]
    pub history: HistoryWriteStatus,
}

/// The history writer's state: scrapes are never held up by the database, so what could not be stored is
/// counted here (and in the app's `/metrics`) rather than lost silently.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HistoryWriteStatus {
    /// The SQLite file the history goes to.
    pub db_path: String,
    /// Rounds waiting for the writer.
    pub pending_rounds: u64,
    pub written_rounds: u64,
    /// Unwritten rounds dropped (oldest first) because the writer's queue was full.
    pub shed_rounds: u64,
    /// Failed write attempts (each round is retried).
    pub failed_writes: u64,
    /// Rounds given up after every retry failed.
    pub dropped_rounds: u64,
    pub last_error: Option<String>,
    pub last_error_ms: Option<i64>,
    /// The last write failed (until one succeeds).
    pub failing: bool,
    /// Scrape results the scheduler could not hand to the batcher (it never waits for it).
    #[serde(default)]
    pub scrape_observations_dropped: u64,
}

/// The live state of one replica as the scraper last saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaRow {
    /// Stable id of the watched target (its position in the order targets were added); the
    /// replica detail route is `#/replica/ID`.
    #[serde(default)]
    pub id: u32,
    /// The metrics endpoint, which is also the replica's identity in the UI.
    pub url: String,
    /// Detected serving engine (`vllm`, `sglang`, ...), `None` until the first good scrape.
    pub engine: Option<String>,
    /// Served model name, from the engine's labels.
    pub model: Option<String>,
    /// Signals from the last good scrape; `None` means "not provided" or "not yet known".
    pub signals: Signals,
    /// Health of the scrape itself.
    pub scrape: ScrapeState,
    /// Prompt plus generated tokens per second over the signal window; `None`: not reported.
    #[serde(default)]
    pub tokens_per_s: Option<f64>,
}

/// Normalised per-replica signals. Rates and quantiles are over the app's signal window (10 s,
/// or three scrape intervals if that is longer), computed from counter and bucket deltas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Signals {
    /// Requests waiting for admission.
    pub queue_depth: Option<f64>,
    /// Requests in the running batch.
    pub running: Option<f64>,
    /// KV-cache usage, 0..=1.
    pub kv_usage: Option<f64>,
    /// Prefix-cache hits / queries (tokens) over the window.
    pub hit_rate: Option<f64>,
    /// TTFT median over the requests that produced their first token in the window.
    pub ttft_p50_s: Option<f64>,
    /// TTFT 95th percentile, same window.
    pub ttft_p95_s: Option<f64>,
    /// Mean KV transfer time into this replica, same window (P/D fleets; absent elsewhere).
    #[serde(default)]
    pub kv_transfer_s: Option<f64>,
}

/// Whether the replica's metrics endpoint answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ScrapeState {
    /// Not scraped yet.
    Pending,
    /// The last scrape succeeded.
    Ok { last_good_ms: i64 },
    /// The last scrape failed; the row keeps the signals of the last good one.
    Error {
        message: String,
        /// When the last good scrape happened, if ever.
        last_good_ms: Option<i64>,
    },
}

/// One replica's time series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub url: String,
    /// `(unix_ms, value)` pairs, oldest first.
    pub points: Vec<(i64, f64)>,
}

/// Command: one replica's history charts. Args: [`ReplicaHistoryArgs`].
pub const CMD_REPLICA_HISTORY: &str = "replica_history";

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrape_state_is_tagged_for_the_ui() {
        let err = ScrapeState::Error { message: "timed out".into(), last_good_ms: Some(5) };
        let json = serde_json::to_value(&err).unwrap();
        assert_eq!(json["state"], "error");
        assert_eq!(json["last_good_ms"], 5);
        let back: ScrapeState = serde_json::from_value(json).unwrap();
        assert_eq!(back, err);
    }

    #[test]
    fn snapshot_args_default_to_five_minutes() {
        let args: FleetSnapshotArgs = serde_json::from_str(r#"{"window_s": 60}"#).unwrap();
        assert_eq!(args.window_s, 60);
        assert_eq!(FleetSnapshotArgs::default().window_s, 300);
    }
}
