//! Criterion bench: a chat's routing key with the model's tokenizer and chat template, every prompt
//! tokenized whole against the memo of prompt chunks (`token_memo.rs`), on the model `cargo xtask engines
//! vllm` makes (a byte-level BPE with Llama 3's template). Two chats: `bench real`'s shape (one user message
//! whose first ~1,000 of ~1,500 tokens are shared) and a 4 KB system prompt before a short question. Each
//! iteration's chat differs from the last in its unshared part, so the memo serves only what is shared.
//! Run: `cargo bench -p fleet-router --features tokenizer --bench tokenize`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use fleet_policy::HashingParams;
use fleet_router::routing_key::{HfTokenizer, Route, routing_input};
use serde_json::json;

/// English-like words, different for each `seed`.
fn prose(words: usize, seed: u64) -> String {
    const WORDS: [&str; 16] = [
        " the", " fleet", " routes", " each", " prompt", " to", " a", " replica", " that", " holds", " its",
        " prefix", ",", " and", " cache", ".",
    ];
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..words)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            WORDS[(state % WORDS.len() as u64) as usize]
        })
        .collect()
}

fn chats(round: u64) -> [(&'static str, Vec<u8>); 2] {
    let shared_user = json!({"model": "m", "stream": true, "messages": [
        {"role": "user", "content": format!("{}{}", prose(1000, 1), prose(480, 1000 + round))},
    ]});
    let system = json!({"model": "m", "stream": true, "messages": [
        {"role": "system", "content": prose(1000, 2)},
        {"role": "user", "content": prose(40, 2000 + round)},
    ]});
    [
        ("one shared user message", shared_user.to_string().into_bytes()),
        ("system prompt", system.to_string().into_bytes()),
    ]
}

fn tokenize(c: &mut Criterion) {
    let model = match fleet_test_support::vllm::vllm_build() {
        Ok(build) => build.tokenizer(),
        Err(error) => {
            eprintln!("skipping the tokenize bench: {error}");
            return;
        }
    };
    let hashing = HashingParams { block_tokens: 32, ..HashingParams::default() };
    let mut group = c.benchmark_group("tokenized_routing_input");
    for (memo, memo_bytes) in [("whole", 0), ("memo", 64 << 20)] {
        let tokenizer =
            HfTokenizer::from_file(&model, None, memo_bytes).expect("the model's tokenizer loads");
        for case in 0..2 {
            let name = chats(0)[case].0;
            let mut round = 0;
            group.bench_function(format!("{name}, {memo}"), |b| {
                b.iter(|| {
                    round += 1;
                    let body = &chats(round)[case].1;
                    routing_input(Route::Chat, black_box(body), None, hashing, Some(&tokenizer))
                        .expect("valid")
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, tokenize);
criterion_main!(benches);
