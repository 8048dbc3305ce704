//! The time recorded requests spent outside the engine model, measured from a recording and added to a
//! replay's TTFTs: the app's what-if and `fleet-sim replay --add-recorded-overhead` predict the same way.

use fleet_trace::Trace;

use super::ReplayReport;

/// Fewest recorded first tokens the overhead is measured from; below that it is left out.
pub const MIN_TIMED_REQUESTS: usize = 20;

/// Time a request spends outside the engine model (the router, both HTTP hops, the replica's parsing and
/// tokenising, the first chunk's way back), which the replay does not time: the recorded median TTFT of the
/// answered requests the routers served under `active_policy`, minus the replay's median for the same
/// traffic under that policy, and never below 0. It is the same for any policy (it does not depend on where
/// a request goes), so every replay of the traffic gets it added. `None` when the traffic carries fewer than
/// [`MIN_TIMED_REQUESTS`] measured first tokens under that policy (a Mooncake file, a router that recorded
/// under another policy).
///
/// Without it, fast cache-hit fleets were predicted 15-21 % below the TTFT p95 they then measured: 2-3 ms
/// of HTTP on a 13 ms engine TTFT (`cargo xtask bench fidelity`).
pub fn unmodelled_overhead_s(trace: &Trace, active_policy: &str, active: &ReplayReport) -> Option<f64> {
    let mut ttfts: Vec<f64> = trace
        .records
        .iter()
        .filter(|r| r.policy.as_deref().is_none_or(|p| p == active_policy))
        .filter(|r| r.error.is_none() && r.status.is_none_or(|s| (200..300).contains(&s)))
        .filter_map(|r| r.ttft_ms)
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .collect();
    if ttfts.len() < MIN_TIMED_REQUESTS {
        return None;
    }
    ttfts.sort_by(f64::total_cmp);
    // Nearest rank, as the replay's own p50 it is compared with.
    let median_s = fleet_base::quantile::nearest_rank(&ttfts, 0.5)? / 1000.0;
    Some((median_s - active.ttft_p50_s).max(0.0))
}

impl ReplayReport {
    /// The report with `overhead_s` added to every TTFT in it (the fleet's percentiles, each replica's,
    /// each request's, the no-queueing reference) and recorded in `ttft_overhead_s`.
    pub fn with_ttft_overhead(mut self, overhead_s: f64) -> Self {
        self.ttft_p50_s += overhead_s;
        self.ttft_p95_s += overhead_s;
        self.ttft_p99_s += overhead_s;
        self.unqueued_ttft_p95_s += overhead_s;
        for replica in &mut self.per_replica {
            // A replica that served nothing has no TTFT to move.
            if replica.requests > 0 {
                replica.ttft_p95_s += overhead_s;
            }
        }
        for request in &mut self.per_request {
            request.ttft_s = request.ttft_s.map(|s| s + overhead_s);
        }
        self.ttft_overhead_s = Some(overhead_s);
        self
    }
}

#[cfg(test)]
mod tests {
    use fleet_trace::TraceRecord;

    use super::*;
    use crate::replay::{ReplicaReport, RequestReport};

    #[test]
    fn the_time_outside_the_engine_is_measured_from_the_recording_under_the_active_policy() {
        let timed = |i: u64, policy: &str, ttft_ms: f64, status: u16| TraceRecord {
            policy: Some(policy.to_owned()),
            ttft_ms: Some(ttft_ms),
            status: Some(status),
            ..TraceRecord::mooncake(i * 100, 1024, 4, vec![i])
        };
        // 30 answered requests under round_robin with a median TTFT near 15 ms; slower ones under another
        // policy, failed ones and untimed ones must not count.
        let mut records: Vec<TraceRecord> =
            (0..30).map(|i| timed(i, "round_robin", 10.0 + i as f64 / 3.0, 200)).collect();
        records.extend((30..60).map(|i| timed(i, "consistent_hash", 500.0, 200)));
        records.extend((60..90).map(|i| timed(i, "round_robin", 900.0, 503)));
        records.extend((90..95).map(|i| TraceRecord::mooncake(i * 100, 1024, 4, vec![i])));
        let trace = Trace::from_records(records).unwrap();
        let replayed = ReplayReport { ttft_p50_s: 0.012, ..ReplayReport::default() };
        let overhead = unmodelled_overhead_s(&trace, "round_robin", &replayed).expect("measurable");
        // The recorded median (nearest rank, the 15th of 30) is 10 + 14/3 ms.
        let expected = (10.0 + 14.0 / 3.0 - 12.0) / 1000.0;
        assert!((overhead - expected).abs() < 1e-9, "14.67 ms recorded - 12 ms replayed: {overhead}");
        // A replay slower than the recording adds nothing; a trace without first tokens cannot say.
        let slow = ReplayReport { ttft_p50_s: 0.5, ..ReplayReport::default() };
        assert_eq!(unmodelled_overhead_s(&trace, "round_robin", &slow), Some(0.0));
        assert_eq!(unmodelled_overhead_s(&trace, "kv_precise", &replayed), None);
        let untimed =
            Trace::from_records((0..50).map(|i| TraceRecord::mooncake(i, 64, 1, vec![i])).collect()).unwrap();
        assert_eq!(unmodelled_overhead_s(&untimed, "round_robin", &replayed), None);
    }

    #[test]
    fn the_overhead_moves_every_ttft_of_a_report_and_nothing_else() {
        let replica = |replica: u32, requests: u64, ttft_p95_s: f64| ReplicaReport {
            replica,
            requests,
            prompt_tokens: 100 * requests,
            cached_tokens: 50 * requests,
            hit_rate: 0.5,
            prefill_tokens: 50 * requests,
            output_tokens: 4 * requests,
            preemptions: 0,
            ttft_p95_s,
        };
        let request = |index: u64, ttft_s: Option<f64>| RequestReport {
            index,
            replica: 0,
            prompt_tokens: 100,
            cached_tokens: 50,
            ttft_s,
            queue_s: None,
            prefill_s: None,
            decode_s: None,
        };
        let report = ReplayReport {
            requests: 2,
            hit_rate: 0.5,
            ttft_p50_s: 0.010,
            ttft_p95_s: 0.020,
            ttft_p99_s: 0.030,
            unqueued_ttft_p95_s: 0.008,
            per_replica: vec![replica(0, 2, 0.020), replica(1, 0, 0.0)],
            per_request: vec![request(0, Some(0.010)), request(1, None)],
            ..ReplayReport::default()
        };
        let moved = report.clone().with_ttft_overhead(0.005);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(
            close(moved.ttft_p50_s, 0.015)
                && close(moved.ttft_p95_s, 0.025)
                && close(moved.ttft_p99_s, 0.035)
        );
        assert!(close(moved.unqueued_ttft_p95_s, 0.013));
        assert!(close(moved.per_replica[0].ttft_p95_s, 0.025));
        assert_eq!(moved.per_replica[1].ttft_p95_s, 0.0, "a replica that served nothing has no TTFT");
        assert!(close(moved.per_request[0].ttft_s.unwrap(), 0.015));
        assert_eq!(moved.per_request[1].ttft_s, None, "a request that never started stays so");
        assert_eq!(moved.ttft_overhead_s, Some(0.005));
        // Placement and hits are the replay's, untouched.
        assert_eq!((moved.hit_rate, moved.requests), (report.hit_rate, report.requests));
        assert_eq!(moved.per_replica[0].requests, 2);
    }
}
