//! Criterion benches: pick latency of every policy at 8, 64 and 256 replicas with 10k and 1M indexed blocks
//! and 500-block prompts, and index update throughput (block events per second) on a Mooncake-derived stream.
//!
//! The Mooncake trace is read from `$FLEET_TRACE`, or `shared/traces/synthetic_trace.jsonl` beside or above
//! the repository; when it is absent an equivalent stream is generated deterministically (same request
//! count and shape: shared prefixes, multi-turn growth), and the bench says which it used.

use std::collections::VecDeque;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fleet_policy::{
    Engine, KvEvent, Medium, POLICY_NAMES, PolicySpec, PrefixIndex, ReplicaId, RequestView, chain_block_ids,
};
use rand::{Rng, SeedableRng, rngs::StdRng};

const PROMPT_BLOCKS: usize = 500;
/// Shared "system prompt" blocks at the head of every indexed sequence.
const SHARED_PREFIX_BLOCKS: usize = 100;
const SHARED_PREFIXES: u64 = 10;
/// Distinct prompts a bench rotates through, so one hot prompt does not live in L1.
const ROTATING_PROMPTS: usize = 32;

/// Block ids of indexed sequence `sequence`: one of a few shared prefixes, then unique blocks.
fn sequence_ids(sequence: u64) -> Vec<u64> {
    (0..PROMPT_BLOCKS as u64)
        .map(|i| {
            if (i as usize) < SHARED_PREFIX_BLOCKS {
                (sequence % SHARED_PREFIXES) << 32 | i
            } else {
                (sequence + 1_000) << 32 | i
            }
        })
        .collect()
}

/// An engine over `replicas` replicas whose routed and KV indexes each hold `indexed_blocks` block entries
/// (sequence `s` lives on replica `s % replicas`), with a little outstanding load everywhere.
fn filled_engine(replicas: u32, indexed_blocks: usize) -> (Engine, Vec<RequestView>) {
    let ids: Vec<ReplicaId> = (0..replicas).map(ReplicaId).collect();
    let spec = PolicySpec::named("cache_aware_approx");
    let mut engine = Engine::new(spec, &ids).expect("valid spec");
    // Every replica's KV event stream starts (with an empty cache), as a live fleet's does.
    for replica in &ids {
        engine.on_kv_event(*replica, &KvEvent::AllCleared { medium: None }, 0).expect("known replica");
    }
    let sequences = (indexed_blocks / PROMPT_BLOCKS) as u64;
    let mut prompts = Vec::new();
    for sequence in 0..sequences {
        let replica = ReplicaId((sequence % u64::from(replicas)) as u32);
        let view = RequestView {
            block_hashes: chain_block_ids(&sequence_ids(sequence)),
            prompt_tokens: 8_000,
            session_key: None,
        };
        // on_routed feeds the approximate index under cache_aware_approx.
        engine.on_routed(sequence, replica, &view, 0).expect("known replica");
        engine.on_completed(sequence, 0).expect("outstanding");
        let event = KvEvent::Stored { medium: Medium::Gpu, block_hashes: view.block_hashes.clone() };
        engine.on_kv_event(replica, &event, 0).expect("known replica");
        if prompts.len() < ROTATING_PROMPTS {
            prompts.push(view);
        }
    }
    let mut rng = StdRng::seed_from_u64(1);
    for request in 0..u64::from(replicas) * 3 {
        let replica = ReplicaId(rng.random_range(0..replicas));
        engine.on_routed(1 << 40 | request, replica, &RequestView::default(), 0).expect("known replica");
    }
    (engine, prompts)
}

fn pick_latency(c: &mut Criterion) {
    let mut group = c.benchmark_group("pick");
    group.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    for replicas in [8u32, 64, 256] {
        for (label, blocks) in [("10k", 10_000usize), ("1M", 1_000_000)] {
            let (base, prompts) = filled_engine(replicas, blocks);
            // The index walk alone, to separate it from building the explanation.
            let index = base.kv_index(Medium::Gpu);
            let mut matched = Vec::new();
            let mut turn = 0usize;
            group.bench_function(
                BenchmarkId::new("prefix_match_only", format!("{replicas}r/{label}")),
                |b| {
                    b.iter(|| {
                        turn = (turn + 1) % prompts.len();
                        index.match_prefix(&prompts[turn].block_hashes, &mut matched);
                        black_box(matched[0])
                    })
                },
            );
            for policy in POLICY_NAMES {
                let mut engine = base.clone();
                engine.reconfigure(PolicySpec::named(policy)).expect("valid spec");
                let mut rng = StdRng::seed_from_u64(7);
                let mut turn = 0usize;
                group.bench_function(BenchmarkId::new(policy, format!("{replicas}r/{label}")), |b| {
                    b.iter(|| {
                        turn = (turn + 1) % prompts.len();
                        black_box(engine.pick(&prompts[turn], 0, &mut rng).expect("pick"))
                    })
                });
            }
        }
    }
    group.finish();
}

/// Finds the Mooncake trace, if present.
fn trace_path() -> Option<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    std::env::var_os("FLEET_TRACE")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            manifest.join("../../shared/traces/synthetic_trace.jsonl"),
            manifest.join("../../../shared/traces/synthetic_trace.jsonl"),
        ])
        .find(|path| path.is_file())
}

/// Per-request `hash_ids` of the Mooncake trace, or a generated equivalent (3,993 requests, ~30 blocks each,
/// shared prefixes and multi-turn growth).
fn mooncake_requests() -> Vec<Vec<u64>> {
    if let Some(path) = trace_path() {
        let text = std::fs::read_to_string(&path).expect("trace readable");
        let requests: Vec<Vec<u64>> = text
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                let value: serde_json::Value = serde_json::from_str(line).expect("trace line is JSON");
                value["hash_ids"]
                    .as_array()
                    .expect("hash_ids")
                    .iter()
                    .filter_map(serde_json::Value::as_u64)
                    .collect()
            })
            .collect();
        eprintln!(
            "index_update: using the Mooncake trace at {} ({} requests)",
            path.display(),
            requests.len()
        );
        return requests;
    }
    eprintln!("index_update: Mooncake trace not found; generating an equivalent stream deterministically");
    let mut rng = StdRng::seed_from_u64(42);
    let mut next_id = 10_000u64;
    let mut sessions: Vec<Vec<u64>> = Vec::new();
    (0..3_993)
        .map(|_| {
            if !sessions.is_empty() && rng.random_bool(0.4) {
                // A later turn: the session's blocks plus a few new ones.
                let session = rng.random_range(0..sessions.len());
                let grow = rng.random_range(1..8);
                sessions[session].extend((0..grow).map(|_| {
                    next_id += 1;
                    next_id
                }));
                sessions[session].clone()
            } else {
                let shared = rng.random_range(0..20u64);
                let mut ids: Vec<u64> = (0..rng.random_range(2..12)).map(|i| shared * 100 + i).collect();
                ids.extend((0..rng.random_range(4..40)).map(|_| {
                    next_id += 1;
                    next_id
                }));
                sessions.push(ids.clone());
                ids
            }
        })
        .collect()
}

/// The KV event stream a fleet of `replicas` would emit for the trace: each request's blocks stored on its
/// replica (round robin), and removals when a replica's `capacity`-block cache evicts (least recently used).
fn event_stream(replicas: u32, capacity: usize) -> (Vec<(ReplicaId, KvEvent)>, usize) {
    let mut caches: Vec<VecDeque<u64>> = vec![VecDeque::new(); replicas as usize];
    let mut events = Vec::new();
    let mut block_events = 0;
    for (index, ids) in mooncake_requests().iter().enumerate() {
        let replica = index % replicas as usize;
        let blocks = chain_block_ids(ids);
        let cache = &mut caches[replica];
        cache.retain(|b| !blocks.contains(b));
        cache.extend(blocks.iter().copied());
        block_events += blocks.len();
        events
            .push((ReplicaId(replica as u32), KvEvent::Stored { medium: Medium::Gpu, block_hashes: blocks }));
        if cache.len() > capacity {
            let evicted: Vec<u64> = cache.drain(..cache.len() - capacity).collect();
            block_events += evicted.len();
            events.push((
                ReplicaId(replica as u32),
                KvEvent::Removed { medium: Medium::Gpu, block_hashes: evicted },
            ));
        }
    }
    (events, block_events)
}

fn index_update(c: &mut Criterion) {
    let mut group = c.benchmark_group("index_update");
    group.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    let replicas = 16u32;
    let (events, block_events) = event_stream(replicas, 4_096);
    group.throughput(Throughput::Elements(block_events as u64));
    let ids: Vec<ReplicaId> = (0..replicas).map(ReplicaId).collect();
    group.bench_function("engine_kv_events/mooncake", |b| {
        b.iter_batched(
            || Engine::new(PolicySpec::named("kv_precise"), &ids).expect("valid spec"),
            |mut engine| {
                for (replica, event) in &events {
                    engine.on_kv_event(*replica, event, 0).expect("known replica");
                }
                engine
            },
            BatchSize::LargeInput,
        )
    });
    group.bench_function("prefix_index/mooncake", |b| {
        b.iter_batched(
            || PrefixIndex::new(1 << 22),
            |mut index| {
                for (replica, event) in &events {
                    match event {
                        KvEvent::Stored { block_hashes, .. } => {
                            index.insert(replica.0, block_hashes);
                        }
                        KvEvent::Removed { block_hashes, .. } => {
                            index.remove(replica.0, block_hashes);
                        }
                        KvEvent::AllCleared { .. } => {
                            index.clear_location(replica.0);
                        }
                    }
                }
                index
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, index_update, pick_latency);
criterion_main!(benches);
