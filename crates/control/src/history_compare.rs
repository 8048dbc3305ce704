//! The history view's backend: the audit trail's policy versions with their pushes and active
//! windows, and the comparison of two windows (or two versions) with bootstrap intervals from
//! the history store, overlaid series and a CSV export.

use fleet_store::{CompareOptions, Comparison, FleetBucket, Tier, TimeWindow, WindowSpec};
use fleetdeck_api::{
    ApiError, HistoryCompareArgs, HistoryComparison, HistoryWindow, MetricDelta, OverlaySeries,
    PolicyHistory, PolicyVersionRow,
};

use crate::fleet::{Control, unix_ms_now};

/// Reads one metric out of a fleet-wide history bucket.
type BucketReader = fn(&FleetBucket) -> Option<f64>;

/// Metrics drawn as overlaid charts, with how each is read from a bucket.
const CHARTED: [(&str, BucketReader); 3] = [
    ("ttft_p95_s", |b| b.ttft_p95_s),
    ("hit_rate", |b| b.hit_rate),
    ("throughput_tok_s", |b| b.throughput_tok_s),
];

fn history_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::new("history_unavailable", format!("{e}; check that the history database is readable"))
}

fn to_spec(window: &HistoryWindow) -> Result<WindowSpec, ApiError> {
    match window {
        HistoryWindow::Version { label } => Ok(WindowSpec::Policy(label.clone())),
        HistoryWindow::Range { from_ms, to_ms } => {
            if from_ms >= to_ms {
                return Err(ApiError::new(
                    "bad_request",
                    format!("the window {from_ms}..{to_ms} is empty; its start must come before its end"),
                ));
            }
            Ok(WindowSpec::Time(TimeWindow { from_ms: *from_ms, to_ms: *to_ms }))
        }
    }
}

/// Points of one metric, as seconds since the window's start.
fn overlay(buckets: &[FleetBucket], from_ms: i64, read: BucketReader) -> Vec<(f64, f64)> {
    buckets.iter().filter_map(|b| read(b).map(|v| ((b.bucket_ms - from_ms) as f64 / 1000.0, v))).collect()
}

/// The comparison in the UI's terms.
pub fn to_api(
    comparison: &Comparison,
    a_label: String,
    b_label: String,
    series: Vec<OverlaySeries>,
) -> HistoryComparison {
    HistoryComparison {
        a_label,
        b_label,
        a_from_ms: comparison.a.from_ms,
        a_to_ms: comparison.a.to_ms,
        b_from_ms: comparison.b.from_ms,
        b_to_ms: comparison.b.to_ms,
        confidence: comparison.confidence,
        metrics: comparison
            .metrics
            .iter()
            .map(|m| MetricDelta {
                name: m.name.to_owned(),
                a: m.a,
                b: m.b,
                delta: m.delta,
                ci_low: m.ci_low,
                ci_high: m.ci_high,
                n_a: m.n_a as u64,
                n_b: m.n_b as u64,
            })
            .collect(),
        series,
        csv: comparison.to_csv(),
    }
}

impl Control {
    /// Every recorded policy version, oldest first, with its pushes and active window.
    pub async fn policy_history(&self) -> Result<PolicyHistory, ApiError> {
        let store = &self.inner.store;
        let now_ms = unix_ms_now();
        let fleet = self.history_fleet();
        let versions = store.policy_versions(fleet).await.map_err(history_error)?;
        let pushes = store.fleet_pushes(fleet).await.map_err(history_error)?;
        let windows = fleet_store::active_windows(&pushes, now_ms);
        let mut rows = Vec::new();
        for version in versions {
            let window = windows.get(&version.label);
            rows.push(PolicyVersionRow {
                pushes: pushes
                    .iter()
                    .filter(|p| p.label == version.label)
                    .map(|p| match &p.outcome {
                        fleet_store::PushOutcome::Acknowledged { .. } => format!("{}: applied", p.router_url),
                        fleet_store::PushOutcome::Failed { error } => format!("{}: {error}", p.router_url),
                    })
                    .collect(),
                active_from_ms: window.map(|w| w.from_ms),
                active_to_ms: window.map(|w| w.to_ms),
                label: version.label,
                author: version.author,
                created_ms: version.created_ms,
                spec: version.spec,
                routers: version.routers,
            });
        }
        Ok(PolicyHistory { versions: rows })
    }

    /// Window `b` against window `a`: the delta table with intervals, overlaid series, CSV.
    pub async fn history_compare(&self, args: HistoryCompareArgs) -> Result<HistoryComparison, ApiError> {
        let (a, b) = (to_spec(&args.a)?, to_spec(&args.b)?);
        let store = &self.inner.store;
        let now_ms = unix_ms_now();
        let options = CompareOptions { fleet: self.history_fleet().to_owned(), ..CompareOptions::default() };
        let comparison = store.compare(&a, &b, now_ms, &options).await.map_err(|e| {
            let message = e.to_string();
            ApiError::new("bad_request", format!("cannot compare these windows: {message}"))
        })?;
        let fleet_id = store.fleet_id(&options.fleet).await.map_err(history_error)?;
        let oldest = comparison.a.from_ms.min(comparison.b.from_ms);
        let tier = if oldest >= now_ms - options.retention.ten_seconds_ms {
            Tier::TenSeconds
        } else {
            Tier::OneMinute
        };
        let window_a = TimeWindow { from_ms: comparison.a.from_ms, to_ms: comparison.a.to_ms };
        let window_b = TimeWindow { from_ms: comparison.b.from_ms, to_ms: comparison.b.to_ms };
        let buckets_a = store.fleet_buckets(fleet_id, tier, window_a).await.map_err(history_error)?;
        let buckets_b = store.fleet_buckets(fleet_id, tier, window_b).await.map_err(history_error)?;
        let series = CHARTED
            .iter()
            .map(|(metric, read)| OverlaySeries {
                metric: (*metric).to_owned(),
                a: overlay(&buckets_a, window_a.from_ms, *read),
                b: overlay(&buckets_b, window_b.from_ms, *read),
            })
            .collect();
        let label = |w: &HistoryWindow| match w {
            HistoryWindow::Version { label } => label.clone(),
            HistoryWindow::Range { .. } => "time window".to_owned(),
        };
        Ok(to_api(&comparison, label(&args.a), label(&args.b), series))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_ranges_are_refused_and_series_start_at_zero() {
        let err = to_spec(&HistoryWindow::Range { from_ms: 5, to_ms: 5 }).unwrap_err();
        assert_eq!(err.code, "bad_request");
        let buckets = vec![
            FleetBucket { bucket_ms: 10_000, hit_rate: Some(0.5), ..Default::default() },
            FleetBucket { bucket_ms: 20_000, hit_rate: None, ..Default::default() },
            FleetBucket { bucket_ms: 30_000, hit_rate: Some(0.7), ..Default::default() },
        ];
        assert_eq!(overlay(&buckets, 10_000, |b| b.hit_rate), vec![(0.0, 0.5), (20.0, 0.7)]);
    }
}
