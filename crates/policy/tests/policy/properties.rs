//! Property tests: picks are healthy, CHWBL keeps its bound, the KV index equals a brute-force reference,
//! the same seed gives the same decisions, and prefix marks never overstate a shared prefix.

use std::collections::{BTreeMap, VecDeque};

use fleet_policy::{
    ConsistentHashParams, Decision, Engine, KvEvent, Medium, POLICY_NAMES, PickError, PolicySpec, ReplicaId,
    ReplicaMetrics, RequestView, ResolvedPolicy, chain_block_ids, chwbl_bound,
};
use proptest::prelude::*;
use rand::{SeedableRng, rngs::StdRng};

/// One step of a random workload.
#[derive(Clone, Debug)]
enum Op {
    Route { doc: u8, len: u8, session: Option<u8> },
    Complete { nth: u8 },
    FirstToken { nth: u8 },
    Health { replica: u8, healthy: bool },
    Store { replica: u8, doc: u8, len: u8 },
    Remove { replica: u8, doc: u8, from: u8, len: u8 },
    Clear { replica: u8 },
    Metrics { replica: u8, queue: u8, running: u8, kv_usage: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6u8, 0..10u8, proptest::option::of(0..5u8)).prop_map(|(doc, len, session)| Op::Route { doc, len, session }),
        2 => any::<u8>().prop_map(|nth| Op::Complete { nth }),
        1 => any::<u8>().prop_map(|nth| Op::FirstToken { nth }),
        1 => (0..12u8, any::<bool>()).prop_map(|(replica, healthy)| Op::Health { replica, healthy }),
        2 => (0..12u8, 0..6u8, 0..10u8).prop_map(|(replica, doc, len)| Op::Store { replica, doc, len }),
        1 => (0..12u8, 0..6u8, 0..10u8, 0..4u8).prop_map(|(replica, doc, from, len)| Op::Remove { replica, doc, from, len }),
        1 => (0..12u8).prop_map(|replica| Op::Clear { replica }),
        1 => (0..12u8, 0..200u8, 0..50u8, 0..=100u8)
            .prop_map(|(replica, queue, running, kv_usage)| Op::Metrics { replica, queue, running, kv_usage }),
    ]
}

/// Six "documents" sharing prefixes pairwise, so prompts and cached blocks overlap partially.
fn doc_blocks(doc: u8, len: u8) -> Vec<u64> {
    let ids: Vec<u64> = (0..u64::from(len))
        .map(|i| if i < 3 { u64::from(doc / 2) } else { u64::from(doc) * 100 + i })
        .collect();
    chain_block_ids(&ids)
}

fn spec_for(policy: &str, extra: u8) -> PolicySpec {
    let spec = PolicySpec::named(policy);
    match policy {
        "consistent_hash" => spec.with("load_factor", 1.0 + f64::from(extra % 20) / 10.0),
        "kv_precise" => {
            spec.with("max_blocks_per_replica", 16).with("temperature", f64::from(extra % 3) / 2.0)
        }
        "cache_aware_approx" => {
            spec.with("max_blocks_per_replica", 16).with("balance_abs_threshold", i64::from(extra % 4))
        }
        "weighted_scorers" => spec.with("max_queue_depth", 1 + i64::from(extra)),
        _ => spec,
    }
}

/// Applies one op; routes through `pick` + `on_routed` and returns the decision (or pick error) if it routed.
fn apply(
    engine: &mut Engine,
    op: &Op,
    replicas: u8,
    next_request: &mut u64,
    outstanding: &mut Vec<u64>,
    rng: &mut StdRng,
) -> Option<Result<Decision, PickError>> {
    let replica = |r: u8| ReplicaId(u32::from(r % replicas));
    match op {
        Op::Route { doc, len, session } => {
            let view = RequestView {
                block_hashes: doc_blocks(*doc, *len),
                prompt_tokens: u32::from(*len) * 16,
                session_key: session.map(|s| format!("session-{s}")),
            };
            let result = engine.pick(&view, *next_request, rng);
            if let Ok(decision) = &result {
                engine.on_routed(*next_request, decision.replica, &view, *next_request).expect("fresh id");
                outstanding.push(*next_request);
            }
            *next_request += 1;
            return Some(result);
        }
        Op::Complete { nth } if !outstanding.is_empty() => {
            let id = outstanding.remove(usize::from(*nth) % outstanding.len());
            engine.on_completed(id, 0).expect("outstanding");
        }
        Op::FirstToken { nth } if !outstanding.is_empty() => {
            let id = outstanding[usize::from(*nth) % outstanding.len()];
            engine.on_first_token(id, 0).expect("outstanding");
        }
        Op::Complete { .. } | Op::FirstToken { .. } => {}
        Op::Health { replica: r, healthy } => engine.set_health(replica(*r), *healthy).expect("known"),
        Op::Store { replica: r, doc, len } => {
            let event = KvEvent::Stored { medium: Medium::Gpu, block_hashes: doc_blocks(*doc, *len) };
            engine.on_kv_event(replica(*r), &event, 0).expect("known");
        }
        Op::Remove { replica: r, doc, from, len } => {
            let blocks = doc_blocks(*doc, 10);
            let from = usize::from(*from);
            let block_hashes = blocks[from..(from + usize::from(*len)).min(blocks.len())].to_vec();
            engine
                .on_kv_event(replica(*r), &KvEvent::Removed { medium: Medium::Gpu, block_hashes }, 0)
                .expect("known");
        }
        Op::Clear { replica: r } => {
            engine.on_kv_event(replica(*r), &KvEvent::AllCleared { medium: None }, 0).expect("known");
        }
        Op::Metrics { replica: r, queue, running, kv_usage } => {
            let metrics = ReplicaMetrics {
                queue_depth: u32::from(*queue),
                running: u32::from(*running),
                kv_usage: f64::from(*kv_usage) / 100.0,
            };
            engine.set_metrics(replica(*r), metrics, 0).expect("known");
        }
    }
    None
}

fn run_workload(
    policy: &str,
    extra: u8,
    replicas: u8,
    ops: &[Op],
    seed: u64,
) -> Vec<Result<Decision, PickError>> {
    let ids: Vec<ReplicaId> = (0..u32::from(replicas)).map(ReplicaId).collect();
    let mut engine = Engine::new(spec_for(policy, extra), &ids).expect("valid");
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut next_request, mut outstanding) = (1, Vec::new());
    ops.iter()
        .filter_map(|op| apply(&mut engine, op, replicas, &mut next_request, &mut outstanding, &mut rng))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The load guard's invariant: with it on, no cache-aware pick (consistent_hash's included) starts its request (queued prefill blocks
    /// plus the prompt blocks to prefill there) more than `spread_wait_tokens` (in its blocks) after the soonest eligible
    /// replica would.
    #[test]
    fn the_load_guard_bounds_the_chosen_replicas_expected_wait(
        policy in 0..4usize,
        extra in any::<u8>(),
        spread in 0..12i64,
        replicas in 1..10u8,
        ops in proptest::collection::vec(op(), 1..120),
        seed in any::<u64>(),
    ) {
        let name = ["cache_aware_approx", "kv_precise", "weighted_scorers", "consistent_hash"][policy];
        let ids: Vec<ReplicaId> = (0..u32::from(replicas)).map(ReplicaId).collect();
        // Every routed prompt here has 16 tokens a block, so the bound is `spread` blocks.
        let spec = spec_for(name, extra).with("spread_wait_tokens", spread * 16);
        let mut engine = Engine::new(spec, &ids).expect("valid");
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut next_request, mut outstanding) = (1, Vec::new());
        for op in &ops {
            // The guard's expected wait with its default decode_wait_weight (0.1), other routers' requests
            // (reported metrics) included, at the pick's time (a route op picks at its request id) and for
            // the prompt it would route.
            let prompt_blocks = match op {
                Op::Route { doc, len, .. } => doc_blocks(*doc, *len).len() as u64,
                _ => 0,
            };
            let waits: BTreeMap<ReplicaId, f64> = engine
                .replicas()
                .into_iter()
                .filter_map(|r| Some((r, engine.expected_wait_blocks(r, next_request, prompt_blocks, 0.1)?)))
                .collect();
            let Some(Ok(decision)) = apply(&mut engine, op, replicas, &mut next_request, &mut outstanding, &mut rng)
            else {
                continue;
            };
            let start = |c: &fleet_policy::CandidateExplanation| {
                waits[&c.replica] + f64::from(decision.prompt_blocks - c.matched_blocks.unwrap_or(0))
            };
            let mut eligible: Vec<_> = decision.candidates.iter().filter(|c| c.healthy && c.eligible).collect();
            if eligible.is_empty() {
                eligible = decision.candidates.iter().filter(|c| c.healthy).collect();
            }
            let soonest = eligible.iter().map(|c| start(c)).fold(f64::INFINITY, f64::min);
            let chosen = decision.chosen().expect("one chosen");
            prop_assert!(
                start(chosen) <= soonest + spread as f64 + 1e-9,
                "chosen starts after {} blocks, soonest after {soonest}, bound {spread}: {decision:?}",
                start(chosen)
            );
        }
    }

    #[test]
    fn a_pick_is_always_a_healthy_candidate(
        policy in 0..POLICY_NAMES.len(),
        extra in any::<u8>(),
        replicas in 1..10u8,
        ops in proptest::collection::vec(op(), 1..120),
        seed in any::<u64>(),
    ) {
        let ids: Vec<ReplicaId> = (0..u32::from(replicas)).map(ReplicaId).collect();
        let mut engine = Engine::new(spec_for(POLICY_NAMES[policy], extra), &ids).expect("valid");
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut next_request, mut outstanding) = (1, Vec::new());
        for op in &ops {
            let healthy: Vec<ReplicaId> = engine
                .replicas()
                .into_iter()
                .filter(|r| engine.replica_status(*r).is_some_and(|s| s.healthy))
                .collect();
            if let Some(result) = apply(&mut engine, op, replicas, &mut next_request, &mut outstanding, &mut rng) {
                match result {
                    Ok(decision) => {
                        prop_assert!(healthy.contains(&decision.replica), "{decision:?}");
                        let chosen = decision.chosen().expect("one chosen");
                        prop_assert!(chosen.healthy && chosen.replica == decision.replica);
                    }
                    Err(error) => {
                        prop_assert!(healthy.is_empty());
                        prop_assert_eq!(error, PickError::NoHealthyReplica { replicas: usize::from(replicas) });
                    }
                }
            }
        }
    }

    #[test]
    fn chwbl_never_exceeds_its_bound(
        extra in any::<u8>(),
        replicas in 1..12u8,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let spec = spec_for("consistent_hash", extra);
        let Ok(ResolvedPolicy::ConsistentHash(ConsistentHashParams { load_factor, .. })) = spec.resolve() else {
            panic!("consistent_hash resolves");
        };
        let ids: Vec<ReplicaId> = (0..u32::from(replicas)).map(ReplicaId).collect();
        let mut engine = Engine::new(spec, &ids).expect("valid");
        let mut rng = StdRng::seed_from_u64(0);
        let (mut next_request, mut outstanding) = (1, Vec::new());
        for op in &ops {
            let loads: BTreeMap<ReplicaId, (bool, u64)> = engine
                .replicas()
                .into_iter()
                .filter_map(|r| engine.replica_status(r).map(|s| (r, (s.healthy, s.outstanding))))
                .collect();
            let healthy = loads.values().filter(|(h, _)| *h).count();
            let total: u64 = loads.values().filter(|(h, _)| *h).map(|(_, l)| l).sum();
            if let Some(Ok(decision)) = apply(&mut engine, op, replicas, &mut next_request, &mut outstanding, &mut rng) {
                let bound = chwbl_bound(load_factor, total, healthy);
                let before = loads[&decision.replica].1;
                prop_assert!(before < bound, "load {before} + 1 > bound {bound}: {}", decision.reason);
            }
        }
    }

    #[test]
    fn same_seed_same_decisions(
        policy in 0..POLICY_NAMES.len(),
        extra in any::<u8>(),
        replicas in 1..10u8,
        ops in proptest::collection::vec(op(), 1..80),
        seed in any::<u64>(),
    ) {
        let first = run_workload(POLICY_NAMES[policy], extra, replicas, &ops, seed);
        let second = run_workload(POLICY_NAMES[policy], extra, replicas, &ops, seed);
        prop_assert_eq!(first, second);
    }

    #[test]
    fn kv_index_agrees_with_brute_force_reference(
        ops in proptest::collection::vec(op(), 1..300),
        replicas in 1..6u8,
        capacity in 16..40usize,
    ) {
        let ids: Vec<ReplicaId> = (0..u32::from(replicas)).map(ReplicaId).collect();
        let spec = PolicySpec::named("kv_precise").with("max_blocks_per_replica", capacity as i64);
        let mut engine = Engine::new(spec, &ids).expect("valid");
        // Reference: per replica, distinct blocks in least-recently-stored-first order.
        let mut reference: Vec<VecDeque<u64>> = vec![VecDeque::new(); usize::from(replicas)];
        let mut rng = StdRng::seed_from_u64(0);
        let (mut next_request, mut outstanding) = (1, Vec::new());
        for op in &ops {
            match op {
                Op::Store { replica, doc, len } => {
                    let held = &mut reference[usize::from(replica % replicas)];
                    for block in doc_blocks(*doc, *len) {
                        held.retain(|b| *b != block);
                        held.push_back(block);
                    }
                    while held.len() > capacity {
                        held.pop_front();
                    }
                }
                Op::Remove { replica, doc, from, len } => {
                    let blocks = doc_blocks(*doc, 10);
                    let from = usize::from(*from);
                    let removed = &blocks[from..(from + usize::from(*len)).min(blocks.len())];
                    reference[usize::from(replica % replicas)].retain(|b| !removed.contains(b));
                }
                Op::Clear { replica } => reference[usize::from(replica % replicas)].clear(),
                _ => {}
            }
            apply(&mut engine, op, replicas, &mut next_request, &mut outstanding, &mut rng);
            for doc in 0..6 {
                let prompt = doc_blocks(doc, 10);
                let mut matched = Vec::new();
                engine.kv_index(Medium::Gpu).match_prefix(&prompt, &mut matched);
                for (slot, held) in reference.iter().enumerate() {
                    let expected = prompt.iter().take_while(|b| held.contains(b)).count() as u32;
                    prop_assert_eq!(matched.get(slot).copied().unwrap_or(0), expected, "replica {}, doc {}", slot, doc);
                }
            }
            for (slot, held) in reference.iter().enumerate() {
                let status = engine.replica_status(ReplicaId(slot as u32)).expect("known");
                prop_assert_eq!(status.kv_blocks[0], held.len());
            }
        }
    }
}

proptest! {
    /// What routers share of a prompt (its prefix marks) tells how long a prefix another prompt shares with
    /// it to within an eighth, never more than it really shares, and exactly when the other prompt holds
    /// the whole of it (a conversation's next turn).
    #[test]
    fn prefix_marks_never_overstate_a_shared_prefix_and_miss_less_than_an_eighth(
        common in 0usize..3_000,
        theirs_extra in prop_oneof![Just(0usize), 0usize..500],
        ours_extra in 0usize..500,
    ) {
        let theirs: Vec<u64> = (0..common as u64).chain((0..theirs_extra as u64).map(|b| 1 << 40 | b)).collect();
        let ours: Vec<u64> = (0..common as u64).chain((0..ours_extra as u64).map(|b| 2 << 40 | b)).collect();
        let shared = fleet_policy::prefix_marks::shared_blocks(&fleet_policy::prefix_marks::marks_of(&theirs), &ours);
        prop_assert!(shared <= common, "{} > {}", shared, common);
        prop_assert!(8 * shared >= 7 * common, "{} of {}", shared, common);
        if theirs_extra == 0 {
            prop_assert_eq!(shared, common, "ours holds the whole of theirs");
        }
        prop_assert!(fleet_policy::prefix_marks::marks_of(&theirs).len() <= 16 + 8 * 12 + 1);
    }
}

#[test]
fn spec_round_trips_through_yaml_and_json_for_every_policy() {
    for policy in POLICY_NAMES {
        let spec = spec_for(policy, 7);
        assert_eq!(spec.to_yaml().parse::<PolicySpec>().expect("yaml"), spec);
        assert_eq!(spec.to_json().parse::<PolicySpec>().expect("json"), spec);
    }
}
