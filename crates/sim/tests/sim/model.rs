//! The engine model through its public API: text prompts, prefix hits, KV events a router can use,
//! profiles by name or path. (Pure: no servers; the model's own unit tests cover LRU order, preemption and
//! chunked prefill in detail.)

use fleet_policy::{Engine, KvEvent, Medium, PolicySpec, ReplicaId, RequestView};
use fleet_sim::engine::tokenize::prompt_of_text;
use fleet_sim::engine::{EngineConfig, EngineEvent, EngineModel, EngineRequest, KvEventKind, Profile};
use rand::SeedableRng;

fn drain(engine: &mut EngineModel, events: &mut Vec<EngineEvent>) {
    while let Some(at) = engine.next_step_at() {
        engine.advance_to(at, &mut |e| events.push(e));
    }
}

fn system_prompt() -> String {
    (0..40).map(|i| format!("Rule {i}: answer briefly and cite the policy document. ")).collect()
}

#[test]
fn text_prompts_sharing_a_system_prompt_hit_and_report_what_the_model_holds() {
    let config = EngineConfig { kv_events: true, ..EngineConfig::default() };
    let mut engine = EngineModel::new(config).expect("valid default config");
    let mut events = Vec::new();
    let first = prompt_of_text(&format!("{}Question: what is a KV cache?", system_prompt()), 16);
    engine.add_request(EngineRequest::new(1, first, 4), 0, &mut |e| events.push(e)).expect("added");
    drain(&mut engine, &mut events);
    let second = prompt_of_text(&format!("{}Question: why route by prefix?", system_prompt()), 16);
    let expected = engine.cached_prefix_tokens(&second);
    let shared_blocks = system_prompt().len() / 64;
    assert_eq!(expected as usize, shared_blocks * 16, "every full block of the shared system prompt");
    engine.add_request(EngineRequest::new(2, second, 4), 1_000_000, &mut |e| events.push(e)).expect("added");
    drain(&mut engine, &mut events);
    let reported = events.iter().find_map(|e| match e {
        EngineEvent::Finished { id: 2, cached_tokens, .. } => Some(*cached_tokens),
        _ => None,
    });
    assert_eq!(reported, Some(expected), "the reported cached tokens are the model's");
    assert_eq!(engine.stats().prefix_cache_hits_tokens, u64::from(expected));
}

#[test]
fn kv_events_carry_the_routers_own_block_hashes() {
    let config = EngineConfig { kv_events: true, ..EngineConfig::default() };
    let mut engine = EngineModel::new(config).expect("valid");
    let mut text = format!("{}Question: which replica?", system_prompt());
    // Whole tokens only: a padded last token is the documented exception to hash equality.
    while text.len() % 4 != 0 {
        text.push(' ');
    }
    let mut events = Vec::new();
    engine
        .add_request(EngineRequest::new(7, prompt_of_text(&text, 16), 2), 0, &mut |e| events.push(e))
        .expect("added");
    drain(&mut engine, &mut events);
    let stored: Vec<(Vec<u64>, Option<u64>, usize)> = events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Kv {
                kind: KvEventKind::BlockStored { block_hashes, parent_block_hash, token_ids, block_size },
                ..
            } => {
                assert_eq!(*block_size, 16);
                Some((block_hashes.clone(), *parent_block_hash, token_ids.len()))
            }
            _ => None,
        })
        .collect();
    let hashes: Vec<u64> = stored.iter().flat_map(|(h, _, _)| h.clone()).collect();
    let text_hashes = fleet_policy::block_hashes_from_text(text.as_bytes(), 64);
    assert_eq!(hashes[..], text_hashes[..hashes.len()], "engine hashes = the router's text hashes");
    assert_eq!(hashes.len(), text.len() / 64);
    assert_eq!(stored[0].1, None, "the first stored block has no parent");
    assert!(stored.iter().all(|(h, _, tokens)| *tokens == h.len() * 16), "token ids ride along");
    // So a kv_precise router fed these events routes the same text to this replica.
    let mut router =
        Engine::new(PolicySpec::named("kv_precise"), &[ReplicaId(0), ReplicaId(1)]).expect("valid");
    for (block_hashes, _, _) in stored {
        router
            .on_kv_event(ReplicaId(1), &KvEvent::Stored { medium: Medium::Gpu, block_hashes }, 0)
            .expect("known");
    }
    router.on_kv_event(ReplicaId(0), &KvEvent::AllCleared { medium: None }, 0).expect("known");
    let view = RequestView::from_text(text.as_bytes(), router.policy().hashing());
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    assert_eq!(router.pick(&view, 0, &mut rng).expect("pick").replica, ReplicaId(1));
}

#[test]
fn profiles_load_by_name_or_path_and_bad_ones_are_named() {
    let builtin = Profile::load("llama-3.1-70b-8xh100").expect("built in");
    assert_eq!(builtin.model, "meta-llama/Llama-3.1-70B-Instruct");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tiny.yaml");
    let mut text = include_str!("../../profiles/llama-3.1-8b-h100.yaml")
        .replace("name: llama-3.1-8b-h100", "name: tiny");
    text = text.replace("kv_capacity_tokens: 426000", "kv_capacity_tokens: 1600");
    std::fs::write(&path, &text).expect("written");
    let tiny = Profile::load(path.to_str().expect("utf-8 path")).expect("loads from a path");
    assert_eq!((tiny.name.as_str(), tiny.capacity_blocks(16)), ("tiny", 100));
    std::fs::write(&path, text.replace("step_us: 6000", "step_us: -1")).expect("written");
    let err = Profile::load(path.to_str().expect("utf-8")).expect_err("negative step time");
    assert!(err.to_string().contains("cost.step_us"), "{err}");
    let err = "max_num_seqs: 0".parse::<EngineConfig>().expect_err("zero sequences");
    assert_eq!(err.field, "max_num_seqs");
}
