//! API-level checks: explanations, round-robin turns, serde of decisions, and the hashing helpers together.

use fleet_policy::{
    Branch, Engine, KvEvent, Medium, POLICY_NAMES, PolicySpec, ReplicaId, RequestView,
    block_hashes_from_text, param_docs,
};
use rand::{SeedableRng, rngs::StdRng};

fn ids(n: u32) -> Vec<ReplicaId> {
    (0..n).map(ReplicaId).collect()
}

#[test]
fn round_robin_turn_advances_only_on_routed() {
    let mut engine = Engine::new(PolicySpec::default(), &ids(3)).expect("valid");
    let view = RequestView::default();
    let first = engine.pick(&view, 0, &mut StdRng::seed_from_u64(0)).expect("pick").replica;
    assert_eq!(
        engine.pick(&view, 0, &mut StdRng::seed_from_u64(0)).expect("pick").replica,
        first,
        "a pick alone changes nothing"
    );
    // The turn starts where the draw says, then goes round in order.
    let mut rng = StdRng::seed_from_u64(0);
    let mut order = Vec::new();
    for request in 0..6 {
        order.push(engine.route(request, &view, 0, &mut rng).expect("route").replica.0);
    }
    let expected: Vec<u32> = (0..6).map(|i| (first.0 + i) % 3).collect();
    assert_eq!(order, expected);
}

#[test]
fn round_robin_turns_of_independent_routers_start_apart() {
    // Routers that all started at the first replica would move in step, sending their next requests to
    // the same replica at once: each router's turn starts at a replica its own draw picks.
    let view = RequestView::default();
    let starts: std::collections::BTreeSet<u32> = (0..32)
        .map(|seed| {
            let engine = Engine::new(PolicySpec::default(), &ids(4)).expect("valid");
            engine.pick(&view, 0, &mut StdRng::seed_from_u64(seed)).expect("pick").replica.0
        })
        .collect();
    assert_eq!(starts, (0..4).collect());
}

#[test]
fn every_policy_explains_every_replica_and_serialises() {
    for policy in POLICY_NAMES {
        let mut engine = Engine::new(PolicySpec::named(policy), &ids(4)).expect("valid");
        engine.set_health(ReplicaId(3), false).expect("known");
        let view = RequestView::from_text(b"hello world, a prompt of a few blocks", Default::default());
        let decision = engine.pick(&view, 0, &mut StdRng::seed_from_u64(9)).expect("pick");
        assert_eq!(decision.policy, policy);
        assert_eq!(decision.candidates.len(), 4, "{policy}");
        assert_eq!(decision.candidates.iter().filter(|c| c.chosen).count(), 1);
        assert!(!decision.candidates[3].eligible);
        assert!(!decision.reason.is_empty());
        let json = serde_json::to_string(&decision).expect("serialises");
        let back: fleet_policy::Decision = serde_json::from_str(&json).expect("deserialises");
        assert_eq!(back, decision);
        assert!(param_docs(policy).iter().all(|doc| !doc.meaning.is_empty()));
    }
}

#[test]
fn kv_events_drive_kv_precise_and_clearing_forgets() {
    let mut engine = Engine::new(PolicySpec::named("kv_precise"), &ids(2)).expect("valid");
    let text = b"a long shared system prompt that many requests start with, and then a question";
    let blocks = block_hashes_from_text(text, 64);
    let stored = KvEvent::Stored { medium: Medium::Gpu, block_hashes: blocks.clone() };
    engine.on_kv_event(ReplicaId(1), &stored, 0).expect("known");
    engine.on_kv_event(ReplicaId(0), &KvEvent::AllCleared { medium: None }, 0).expect("known");
    let view = RequestView::from_text(text, Default::default());
    let decision = engine.pick(&view, 0, &mut StdRng::seed_from_u64(0)).expect("pick");
    assert_eq!((decision.replica, decision.branch), (ReplicaId(1), Branch::Cost));
    assert_eq!(decision.chosen().and_then(|c| c.matched_blocks), Some(blocks.len() as u32));
    assert!(decision.notes.is_empty(), "both replicas sent events: {:?}", decision.notes);
    engine.on_kv_event(ReplicaId(1), &KvEvent::AllCleared { medium: Some(Medium::Gpu) }, 0).expect("known");
    let decision = engine.pick(&view, 0, &mut StdRng::seed_from_u64(0)).expect("pick");
    assert_eq!(decision.chosen().and_then(|c| c.matched_blocks), Some(0));
}

#[test]
fn kv_precise_with_temperature_samples_reproducibly() {
    let spec = PolicySpec::named("kv_precise").with("temperature", 1.0);
    let mut engine = Engine::new(spec, &ids(3)).expect("valid");
    let stored = KvEvent::Stored { medium: Medium::Gpu, block_hashes: vec![1, 2, 3] };
    for replica in 0..3 {
        engine.on_kv_event(ReplicaId(replica), &KvEvent::AllCleared { medium: None }, 0).expect("known");
    }
    engine.on_kv_event(ReplicaId(2), &stored, 0).expect("known");
    let view = RequestView { block_hashes: vec![1, 2, 3, 4], prompt_tokens: 64, session_key: None };
    let picks = |seed| {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..200).map(|_| engine.pick(&view, 0, &mut rng).expect("pick").replica.0).collect::<Vec<_>>()
    };
    let first = picks(5);
    assert_eq!(first, picks(5));
    let favoured = first.iter().filter(|r| **r == 2).count();
    assert!(favoured > 70, "the cheapest replica is drawn most often: {favoured}/200");
    assert!(first.iter().any(|r| *r != 2), "but not always at temperature 1");
}
