//! Headroom: the hit rate the fleet achieved on its recent recorded traffic next to the hit
//! rate no routing could beat (one pooled cache of unbounded size) and the best policy's
//! what-if result (fleet-sim's replay of the same traffic under each candidate policy). Pure
//! and synchronous: the trace comes in as records; callers run it off the async workers.

use std::collections::{BTreeMap, HashSet};

use fleet_trace::TraceRecord;
use fleetdeck_api::ModelHeadroom;

/// What a trace's records without a model are filed under.
pub const UNKNOWN_MODEL: &str = "(no model recorded)";

/// Per-model figures over `records` (any order; they are taken in timestamp order).
///
/// - achieved: recorded `cached_tokens` over the replica's reported prompt tokens, over the records that
///   carry it (the "measured" requests: a streaming client that asks for no usage leaves its record
///   without). Both are the replica's own counts: the router's may be an estimate from text;
/// - pooled bound: every request served by one cache that never evicts: a request hits the
///   leading blocks any earlier request of the same model already had (hash ids are chained,
///   so an equal id names the whole prefix), capped at its prompt length. It is given over all
///   requests and over the measured ones alone, so that achieved is compared with the bound of
///   the same requests (every request still warms the pooled cache).
pub fn per_model(records: &[TraceRecord]) -> Vec<ModelHeadroom> {
    let mut by_model: BTreeMap<String, Vec<&TraceRecord>> = BTreeMap::new();
    for r in records {
        by_model.entry(r.model.clone().unwrap_or_else(|| UNKNOWN_MODEL.to_owned())).or_default().push(r);
    }
    by_model
        .into_iter()
        .map(|(model, mut records)| {
            records.sort_by_key(|r| r.timestamp);
            let mut seen: HashSet<u64> = HashSet::new();
            let (mut prompt, mut pooled_hits) = (0u64, 0u64);
            let (mut recorded_prompt, mut recorded_hits, mut measured_pooled_hits) = (0u64, 0u64, 0u64);
            let mut measured_requests = 0u64;
            for r in &records {
                let input = u64::from(r.input_length);
                prompt += input;
                let matched = r.hash_ids.iter().take_while(|id| seen.contains(id)).count() as u64;
                let pooled = (matched * u64::from(r.block_tokens())).min(input);
                pooled_hits += pooled;
                seen.extend(r.hash_ids.iter().copied());
                if let Some(cached) = r.cached_tokens {
                    // In the replica's own tokens: a router that estimates tokens from text counts another
                    // length, and the bound's share of the prompt is carried over to the replica's count.
                    let engine_prompt = u64::from(r.engine_prompt_tokens());
                    measured_requests += 1;
                    recorded_prompt += engine_prompt;
                    recorded_hits += u64::from(cached).min(engine_prompt);
                    measured_pooled_hits += (pooled * engine_prompt).checked_div(input).unwrap_or(0);
                }
            }
            let ratio = |hits: u64, of: u64| (of > 0).then(|| hits as f64 / of as f64);
            ModelHeadroom {
                model,
                requests: records.len() as u64,
                prompt_tokens: prompt,
                achieved: ratio(recorded_hits, recorded_prompt),
                measured_requests,
                pooled_bound: ratio(pooled_hits, prompt),
                pooled_bound_measured: ratio(measured_pooled_hits, recorded_prompt),
                best_policy: None,
                best_policy_hit_rate: None,
            }
        })
        .collect()
}

/// Policies the what-if tries, with their default parameters.
pub const WHAT_IF_POLICIES: [&str; 5] =
    ["round_robin", "least_load", "consistent_hash", "cache_aware_approx", "kv_precise"];

/// Replays `records` (one model's) on `replicas` emulated replicas under each of
/// [`WHAT_IF_POLICIES`] and returns the best `(policy, hit rate)`. Deterministic (fixed seed).
pub fn best_policy(records: Vec<TraceRecord>, replicas: u32) -> Result<(String, f64), String> {
    use fleet_sim::replay::{ReplayConfig, compare, prepare};
    let trace = fleet_trace::Trace::from_records(records).map_err(|e| e.to_string())?;
    let prepared = prepare(&trace, None, 1.0).map_err(|e| e.to_string())?;
    let specs = WHAT_IF_POLICIES
        .iter()
        .map(|name| {
            format!("policy: {name}\n").parse::<fleet_policy::PolicySpec>().map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let base = ReplayConfig::new(replicas.max(1), specs[0].clone());
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(specs.len());
    let mut best: Option<(String, f64)> = None;
    for (name, report) in WHAT_IF_POLICIES.iter().zip(compare(&prepared, &base, &specs, threads, None)) {
        let report = report.map_err(|e| format!("replaying {name}: {e}"))?;
        if best.as_ref().is_none_or(|(_, rate)| report.hit_rate > *rate) {
            best = Some(((*name).to_owned(), report.hit_rate));
        }
    }
    best.ok_or_else(|| "no policy was replayed".to_owned())
}

/// [`per_model`] plus each model's best policy by replay on `replicas_of(model)` replicas.
/// A replay that fails leaves that model's what-if empty and says why in the returned notes.
pub fn with_what_if(
    records: Vec<TraceRecord>,
    replicas_of: impl Fn(&str) -> u32,
) -> (Vec<ModelHeadroom>, Vec<String>) {
    let mut figures = per_model(&records);
    let mut notes = Vec::new();
    for figure in &mut figures {
        let mine: Vec<TraceRecord> = records
            .iter()
            .filter(|r| r.model.as_deref().unwrap_or(UNKNOWN_MODEL) == figure.model)
            .cloned()
            .collect();
        match best_policy(mine, replicas_of(&figure.model)) {
            Ok((policy, rate)) => {
                figure.best_policy = Some(policy);
                figure.best_policy_hit_rate = Some(rate);
            }
            Err(e) => notes.push(format!("What-if for {}: {e}", figure.model)),
        }
    }
    (figures, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ts: u64, model: &str, input: u32, ids: &[u64], cached: Option<u32>) -> TraceRecord {
        let mut r = TraceRecord::mooncake(ts, input, 1, ids.to_vec());
        r.block_tokens = Some(16);
        r.model = Some(model.to_owned());
        r.cached_tokens = cached;
        r
    }

    #[test]
    fn the_pooled_bound_counts_prefixes_seen_before_and_achieved_comes_from_the_record() {
        let records = vec![
            // Out of order on purpose: the second request is the one that can hit.
            rec(2, "m", 48, &[1, 2, 9], Some(0)),
            rec(1, "m", 48, &[1, 2, 3], Some(0)),
            rec(3, "m", 40, &[1, 2, 3], Some(32)),
            rec(1, "other", 10, &[1], None),
        ];
        let figures = per_model(&records);
        assert_eq!(figures.len(), 2);
        let m = &figures[0];
        assert_eq!((m.model.as_str(), m.requests, m.prompt_tokens), ("m", 3, 136));
        // 0 + 32 (blocks 1, 2) + min(48, 40) = 72 of 136.
        assert!((m.pooled_bound.unwrap() - 72.0 / 136.0).abs() < 1e-9, "{m:?}");
        assert!((m.achieved.unwrap() - 32.0 / 136.0).abs() < 1e-9);
        assert!(m.achieved <= m.pooled_bound);
        let other = &figures[1];
        assert_eq!(other.achieved, None, "no cached_tokens recorded is unknown, not zero");
        assert_eq!(other.pooled_bound, Some(0.0));
    }

    #[test]
    fn achieved_and_its_bound_are_in_the_replicas_own_tokens() {
        // The router estimated 64 tokens (4 blocks of 16) where the engine's tokenizer counted 80: the
        // engine's cached 60 of 80 is 75 %, not 60 of 64; and the bound's share (3 of 4 blocks) carries over.
        let mut first = rec(1, "m", 64, &[1, 2, 3, 4], Some(0));
        first.engine_prompt_tokens = Some(80);
        let mut second = rec(2, "m", 64, &[1, 2, 3, 5], Some(60));
        second.engine_prompt_tokens = Some(80);
        let m = &per_model(&[first, second])[0];
        assert!((m.achieved.unwrap() - 60.0 / 160.0).abs() < 1e-9, "{m:?}");
        assert!((m.pooled_bound_measured.unwrap() - 60.0 / 160.0).abs() < 1e-9, "{m:?}");
        assert!(m.achieved <= m.pooled_bound_measured);
    }

    #[test]
    fn achieved_is_compared_with_the_bound_of_the_same_requests() {
        // Unmeasured traffic (no usage reported) has shorter shared prefixes than the measured
        // requests; the bound over everything can then sit below achieved, the measured one cannot.
        let records = vec![
            rec(1, "m", 64, &[1, 2, 3, 4], Some(0)),
            rec(2, "m", 64, &[1, 2, 3, 5], Some(48)),
            rec(3, "m", 64, &[7, 8, 9, 10], None),
            rec(4, "m", 64, &[7, 11, 12, 13], None),
        ];
        let m = &per_model(&records)[0];
        assert_eq!((m.requests, m.measured_requests), (4, 2));
        assert!((m.achieved.unwrap() - 48.0 / 128.0).abs() < 1e-9, "{m:?}");
        assert!((m.pooled_bound_measured.unwrap() - 48.0 / 128.0).abs() < 1e-9, "{m:?}");
        assert!((m.pooled_bound.unwrap() - 64.0 / 256.0).abs() < 1e-9, "{m:?}");
        assert!(m.achieved > m.pooled_bound, "the all-requests bound is not the one to compare with");
    }

    #[test]
    fn the_what_if_replays_every_candidate_and_never_beats_the_pooled_bound() {
        // Three tenants with long shared prefixes, round-robin arrivals 100 ms apart.
        let records: Vec<TraceRecord> = (0..60u64)
            .map(|i| {
                let tenant = i % 3;
                let ids: Vec<u64> = (0..8).map(|b| tenant * 1000 + b).chain([10_000 + i]).collect();
                rec(i * 100, "m", 9 * 16, &ids, Some(0))
            })
            .collect();
        let (figures, notes) = with_what_if(records, |_| 3);
        assert!(notes.is_empty(), "{notes:?}");
        let m = &figures[0];
        let best = m.best_policy_hit_rate.unwrap();
        assert!(WHAT_IF_POLICIES.contains(&m.best_policy.as_deref().unwrap()));
        assert!(best > 0.0, "shared prefixes must hit under the best policy");
        assert!(best <= m.pooled_bound.unwrap() + 1e-9, "{best} > {:?}", m.pooled_bound);
    }

    #[test]
    fn records_without_a_model_are_grouped_and_named() {
        let mut r = rec(1, "x", 16, &[5], None);
        r.model = None;
        assert_eq!(per_model(&[r])[0].model, UNKNOWN_MODEL);
        assert!(per_model(&[]).is_empty());
    }
}
