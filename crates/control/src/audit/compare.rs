//! The history comparison in the UI's terms: two windows (or versions) as the store compares them, the
//! overlaid series and the delta table with its intervals. Pure: the store's results come in as values.

use fleet_store::{Comparison, FleetBucket, TimeWindow, WindowSpec};
use fleetdeck_api::{ApiError, HistoryComparison, HistoryWindow, MetricDelta, OverlaySeries};

/// Reads one metric out of a fleet-wide history bucket.
pub(crate) type BucketReader = fn(&FleetBucket) -> Option<f64>;

/// Metrics drawn as overlaid charts, with how each is read from a bucket.
pub(crate) const CHARTED: [(&str, BucketReader); 3] = [
    ("ttft_p95_s", |b| b.ttft_p95_s),
    ("hit_rate", |b| b.hit_rate),
    ("throughput_tok_s", |b| b.throughput_tok_s),
];

pub(crate) fn to_spec(window: &HistoryWindow) -> Result<WindowSpec, ApiError> {
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
pub(crate) fn overlay(buckets: &[FleetBucket], from_ms: i64, read: BucketReader) -> Vec<(f64, f64)> {
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
