//! Data-driven decision tests: each case in `decisions.yaml` sets up replicas, loads and cached prefixes,
//! makes one pick, and states the expected replica, branch and reason sentence.

use std::collections::BTreeMap;

use fleet_policy::{
    Branch, Engine, KvEvent, Medium, PeerLoad, PolicySpec, ReplicaId, ReplicaMetrics, RequestView,
    RoutedPrompt, prefix_marks,
};
use rand::{SeedableRng, rngs::StdRng};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    spec: serde_json::Value,
    replicas: Vec<u32>,
    #[serde(default)]
    unhealthy: Vec<u32>,
    /// Outstanding requests per replica (routed, not completed).
    #[serde(default)]
    outstanding: BTreeMap<u32, u32>,
    /// Requests in decode per replica: (count, blocks each).
    #[serde(default)]
    decoding: BTreeMap<u32, (u32, u32)>,
    /// Texts the router already sent to a replica (feeds the approximate index via on_routed).
    #[serde(default)]
    routed: BTreeMap<u32, Vec<String>>,
    /// Texts routed to a replica whose prefill has not ended (on_routed without first token).
    #[serde(default)]
    prefilling: BTreeMap<u32, Vec<String>>,
    /// Texts a replica reported as stored through KV events.
    #[serde(default)]
    kv_stored: BTreeMap<u32, Vec<String>>,
    #[serde(default)]
    metrics: BTreeMap<u32, ReplicaMetrics>,
    /// What other routers published of their requests, by router then replica (`set_peer_load`).
    #[serde(default)]
    peers: BTreeMap<String, BTreeMap<u32, PeerLoad>>,
    /// Prompts other routers routed, by router (`observe_peer_prompts`, with their prefix marks).
    #[serde(default)]
    peer_prompts: BTreeMap<String, Vec<PeerPrompt>>,
    prompt: String,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    seed: u64,
    expect: Expect,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerPrompt {
    replica: u32,
    text: String,
    /// Still in prefill by that router's word (what `kv_precise` counts).
    #[serde(default)]
    in_prefill: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    replica: u32,
    branch: Branch,
    reason: Option<String>,
    #[serde(default)]
    notes: Vec<String>,
}

fn run(case: &Case) -> fleet_policy::Decision {
    let spec: PolicySpec = case.spec.to_string().parse().unwrap_or_else(|e| panic!("{}: {e}", case.name));
    let hashing = spec.resolve().expect("valid").hashing();
    let view_of = |text: &str| RequestView::from_text(text.as_bytes(), hashing);
    let replicas: Vec<ReplicaId> = case.replicas.iter().copied().map(ReplicaId).collect();
    let mut engine = Engine::new(spec, &replicas).expect("valid spec");
    let mut next_request = 1_000_u64;
    for (replica, texts) in &case.routed {
        for text in texts {
            engine.on_routed(next_request, ReplicaId(*replica), &view_of(text), 0).expect("known");
            engine.on_completed(next_request, 0).expect("outstanding");
            next_request += 1;
        }
    }
    for (replica, texts) in &case.prefilling {
        for text in texts {
            engine.on_routed(next_request, ReplicaId(*replica), &view_of(text), 0).expect("known");
            next_request += 1;
        }
    }
    for (replica, texts) in &case.kv_stored {
        for text in texts {
            let event = KvEvent::Stored { medium: Medium::Gpu, block_hashes: view_of(text).block_hashes };
            engine.on_kv_event(ReplicaId(*replica), &event, 0).expect("known");
        }
    }
    for (replica, count) in &case.outstanding {
        for _ in 0..*count {
            engine.on_routed(next_request, ReplicaId(*replica), &RequestView::default(), 0).expect("known");
            next_request += 1;
        }
    }
    for (replica, (count, blocks)) in &case.decoding {
        for _ in 0..*count {
            let view =
                RequestView { block_hashes: (1..=u64::from(*blocks)).collect(), ..RequestView::default() };
            engine.on_routed(next_request, ReplicaId(*replica), &view, 0).expect("known");
            engine.on_first_token(next_request, 0).expect("outstanding");
            next_request += 1;
        }
    }
    for (replica, metrics) in &case.metrics {
        engine.set_metrics(ReplicaId(*replica), *metrics, 0).expect("known");
    }
    for (peer, loads) in &case.peers {
        let loads: Vec<(ReplicaId, PeerLoad)> =
            loads.iter().map(|(replica, load)| (ReplicaId(*replica), *load)).collect();
        engine.set_peer_load(peer, &loads, 0);
    }
    for (peer, prompts) in &case.peer_prompts {
        let routed: Vec<RoutedPrompt> = (next_request..)
            .zip(prompts)
            .map(|(request, prompt)| RoutedPrompt {
                request,
                replica: ReplicaId(prompt.replica),
                marks: prefix_marks::marks_of(&view_of(&prompt.text).block_hashes),
            })
            .collect();
        let in_prefill: Vec<u64> =
            routed.iter().zip(prompts).filter(|(_, p)| p.in_prefill).map(|(r, _)| r.request).collect();
        engine.observe_peer_prompts(peer, &routed, &in_prefill, 0);
        next_request += prompts.len() as u64;
    }
    for replica in &case.unhealthy {
        engine.set_health(ReplicaId(*replica), false).expect("known");
    }
    let mut view = view_of(&case.prompt);
    view.session_key = case.session.clone();
    let mut rng = StdRng::seed_from_u64(case.seed);
    engine.pick(&view, 0, &mut rng).unwrap_or_else(|e| panic!("{}: {e}", case.name))
}

#[test]
fn decision_fixtures() {
    let cases: Vec<Case> =
        serde_norway::from_str(include_str!("decisions.yaml")).expect("decisions.yaml is a list of cases");
    assert!(cases.len() >= 12, "the fixture covers every policy and branch");
    let mut failures = Vec::new();
    for case in &cases {
        let decision = run(case);
        let actual = (decision.replica.0, decision.branch, decision.reason.as_str());
        let expected_reason = case.expect.reason.as_deref().unwrap_or("<missing>");
        if actual != (case.expect.replica, case.expect.branch, expected_reason)
            || decision.notes != case.expect.notes
        {
            failures.push(format!(
                "case {:?}\n  expected: replica {} {:?} reason: {expected_reason}\n  actual:   replica {} {:?} reason: {}\n  notes: {:?}",
                case.name, case.expect.replica, case.expect.branch, actual.0, actual.1, actual.2, decision.notes
            ));
        }
        assert!(
            decision.chosen().is_some_and(|c| c.healthy && c.eligible || decision.branch == Branch::Fallback)
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} decision cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
