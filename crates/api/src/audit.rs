//! The audit trail's contract: every policy version with its pushes and active window, and the comparison
//! of two windows (or versions) of the history with bootstrap intervals.

use serde::{Deserialize, Serialize};

/// Command: the recorded policy versions and pushes. Args: `{}`. Answers [`PolicyHistory`].
pub const CMD_POLICY_HISTORY: &str = "policy_history";

/// Command: compare two windows or two policy versions. Args: [`HistoryCompareArgs`].
pub const CMD_HISTORY_COMPARE: &str = "history_compare";

/// One recorded policy version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyVersionRow {
    pub label: String,
    pub author: String,
    pub created_ms: i64,
    pub spec: String,
    pub routers: Vec<String>,
    /// When it was in force (first acknowledged push to the next version's), if ever.
    pub active_from_ms: Option<i64>,
    pub active_to_ms: Option<i64>,
    /// One line per push: router, outcome.
    pub pushes: Vec<String>,
}

/// The result of [`CMD_POLICY_HISTORY`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyHistory {
    pub versions: Vec<PolicyVersionRow>,
}

/// One side of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HistoryWindow {
    /// The window a policy version was in force.
    Version { label: String },
    /// A time range, Unix milliseconds.
    Range { from_ms: i64, to_ms: i64 },
}

/// Arguments of [`CMD_HISTORY_COMPARE`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryCompareArgs {
    pub a: HistoryWindow,
    pub b: HistoryWindow,
}

/// One metric's delta with its bootstrap interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricDelta {
    pub name: String,
    pub a: Option<f64>,
    pub b: Option<f64>,
    /// b - a.
    pub delta: Option<f64>,
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    pub n_a: u64,
    pub n_b: u64,
}

/// One metric over both windows, aligned at each window's start (seconds since it began).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverlaySeries {
    pub metric: String,
    pub a: Vec<(f64, f64)>,
    pub b: Vec<(f64, f64)>,
}

/// The result of [`CMD_HISTORY_COMPARE`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryComparison {
    pub a_label: String,
    pub b_label: String,
    pub a_from_ms: i64,
    pub a_to_ms: i64,
    pub b_from_ms: i64,
    pub b_to_ms: i64,
    pub confidence: f64,
    pub metrics: Vec<MetricDelta>,
    pub series: Vec<OverlaySeries>,
    /// The delta table as CSV, for export.
    pub csv: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_tagged_by_kind() {
        let window: HistoryWindow = serde_json::from_str(r#"{"kind":"version","label":"v1"}"#).unwrap();
        assert_eq!(window, HistoryWindow::Version { label: "v1".into() });
    }
}
