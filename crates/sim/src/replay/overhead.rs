//! The time recorded requests spent outside the engine model, measured from a recording and added to a
//! replay's TTFTs: the app's what-if and `fleet-sim replay --add-recorded-overhead` predict the same way.

use fleet_trace::Trace;

use super::ReplayReport;

/// Fewest recorded first tokens the overhead is measured from; below that it is left out.
pub const MIN_TIMED_REQUESTS: usize = 20;

/// Time a request spends outside the engine model (the router, both HTTP hops, the replica's parsing and
/// tokenising, the first chunk's way back), which the replay does not time: over the answered requests the
/// routers served under `active_policy`, the median of each one's recorded TTFT less its TTFT in `active`
/// (the replay of the same traffic under that policy), and never below 0. It does not depend on where a
/// request goes, so every replay of the traffic gets it added. `None` when the traffic carries fewer than
/// [`MIN_TIMED_REQUESTS`] measured first tokens under that policy (a Mooncake file, a router that recorded
/// under another policy) or `active` is not a replay of `trace` (its requests do not line up).
///
/// Request by request, not the recorded median less the replay's: the two medians are different requests
/// wherever the model is off on the typical one, and the difference carried that error into every
/// prediction's tail. On three real vLLM servers (`cargo xtask bench real --engine vllm`, hot trace) it was
/// 27 ms against 13 ms request by request, and it predicted the cache-aware policies' p95 at 1.32x what
/// they measured. Its median, not a sample of every residual: a congested baseline's residuals hold the
/// queueing the model missed, and a sample handed that queueing to every other policy.
///
/// Without it, fast cache-hit fleets were predicted 15-21 % below the TTFT p95 they then measured: 2-3 ms
/// of HTTP on a 13 ms engine TTFT (`cargo xtask bench fidelity`).
pub fn unmodelled_overhead_s(trace: &Trace, active_policy: &str, active: &ReplayReport) -> Option<f64> {
    if active.per_request.len() != trace.records.len() {
        return None;
    }
    let mut residuals_s: Vec<f64> = active
        .per_request
        .iter()
        .filter_map(|replayed| {
            let record = trace.records.get(usize::try_from(replayed.index).ok()?)?;
            let answered = record.error.is_none() && record.status.is_none_or(|s| (200..300).contains(&s));
            let under_active = record.policy.as_deref().is_none_or(|p| p == active_policy);
            let recorded_ms = record.ttft_ms.filter(|ms| ms.is_finite() && *ms >= 0.0)?;
            (answered && under_active).then_some(recorded_ms / 1000.0 - replayed.ttft_s?)
        })
        .collect();
    if residuals_s.len() < MIN_TIMED_REQUESTS {
        return None;
    }
    residuals_s.sort_by(f64::total_cmp);
    // Nearest rank, as the report's own quantiles.
    Some(fleet_base::quantile::nearest_rank(&residuals_s, 0.5)?.max(0.0))
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

    /// A replay of `trace` whose request `i` took `ttft_ms(i)` to its first token.
    fn replayed(trace: &Trace, ttft_ms: impl Fn(usize) -> f64) -> ReplayReport {
        let per_request = (0..trace.records.len())
            .map(|i| RequestReport {
                index: i as u64,
                replica: 0,
                prompt_tokens: 1024,
                cached_tokens: 0,
                ttft_s: Some(ttft_ms(i) / 1000.0),
                queue_s: None,
                prefill_s: None,
                decode_s: None,
            })
            .collect();
        ReplayReport { per_request, ..ReplayReport::default() }
    }

    #[test]
    fn the_time_outside_the_engine_is_measured_request_by_request_under_the_active_policy() {
        let timed = |i: u64, policy: &str, ttft_ms: f64, status: u16| TraceRecord {
            policy: Some(policy.to_owned()),
            ttft_ms: Some(ttft_ms),
            status: Some(status),
            ..TraceRecord::mooncake(i * 100, 1024, 4, vec![i])
        };
        // 30 answered requests under round_robin, recorded at 10 + i/3 ms; slower ones under another
        // policy, failed ones and untimed ones must not count.
        let mut records: Vec<TraceRecord> =
            (0..30).map(|i| timed(i, "round_robin", 10.0 + i as f64 / 3.0, 200)).collect();
        records.extend((30..60).map(|i| timed(i, "consistent_hash", 500.0, 200)));
        records.extend((60..90).map(|i| timed(i, "round_robin", 900.0, 503)));
        records.extend((90..95).map(|i| TraceRecord::mooncake(i * 100, 1024, 4, vec![i])));
        let trace = Trace::from_records(records).unwrap();
        // The replay has the first requests slow and the last fast: request i is off by 1/6 + i/2 ms, and
        // the median of those (nearest rank, the 15th of 30) is 1/6 + 7 ms, where the medians' difference
        // would be 14.67 - 7.33 ms.
        let active = replayed(&trace, |i| if i < 30 { 5.0 + (29 - i) as f64 / 6.0 } else { 10.0 });
        let overhead = unmodelled_overhead_s(&trace, "round_robin", &active).expect("measurable");
        let expected = (1.0 / 6.0 + 7.0) / 1000.0;
        assert!((overhead - expected).abs() < 1e-9, "{overhead} against {expected}");
        // A replay slower than the recording adds nothing; a trace without first tokens, a policy it was
        // not recorded under, or a report of other traffic cannot say.
        let slow = replayed(&trace, |_| 500.0);
        assert_eq!(unmodelled_overhead_s(&trace, "round_robin", &slow), Some(0.0));
        assert_eq!(unmodelled_overhead_s(&trace, "kv_precise", &active), None);
        let untimed =
            Trace::from_records((0..50).map(|i| TraceRecord::mooncake(i, 64, 1, vec![i])).collect()).unwrap();
        assert_eq!(unmodelled_overhead_s(&untimed, "round_robin", &replayed(&untimed, |_| 1.0)), None);
        let other = ReplayReport { per_request: active.per_request[..40].to_vec(), ..active.clone() };
        assert_eq!(unmodelled_overhead_s(&trace, "round_robin", &other), None);
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
