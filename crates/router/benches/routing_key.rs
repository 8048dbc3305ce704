//! Criterion bench: reading a request's routing key (`routing_input`) from request bodies of the sizes
//! real traffic has: a tiny completion, a chat with a 4 KB system prompt and a few turns, a 16 KB
//! completion prompt (RAG), and a chat whose strings all hold escapes (the copying case).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fleet_policy::HashingParams;
use fleet_router::routing_key::{Route, routing_input};
use serde_json::json;

/// Varied English-like text of about `bytes` bytes (no escapes needed in JSON).
fn prose(bytes: usize, seed: usize) -> String {
    const WORDS: [&str; 12] = [
        "invoice", "the", "customer", "billing", "period", "and", "refund", "policy", "of", "a", "team",
        "answers",
    ];
    let mut text = String::with_capacity(bytes + 16);
    let mut i = seed;
    while text.len() < bytes {
        text.push_str(WORDS[i % WORDS.len()]);
        text.push(if i.is_multiple_of(17) { '.' } else { ' ' });
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    text
}

fn bodies() -> Vec<(&'static str, Route, Vec<u8>)> {
    let system = prose(4096, 1);
    let chat = json!({
        "model": "llama-3.1-8b",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": prose(300, 2)},
            {"role": "assistant", "content": prose(500, 3)},
            {"role": "user", "content": [{"type": "text", "text": prose(200, 4)}]},
        ],
        "stream": true,
        "max_tokens": 256,
        "temperature": 0.7,
    });
    let rag = json!({"model": "llama-3.1-8b", "prompt": prose(16384, 5), "max_tokens": 128});
    let escaped = json!({
        "model": "llama-3.1-8b",
        "messages": [
            {"role": "system", "content": prose(4096, 1).replace(". ", ".\n\"quoted\"\t")},
            {"role": "user", "content": "line one\nline two"},
        ],
    });
    vec![
        ("tiny completion", Route::Completions, br#"{"prompt": "hello", "max_tokens": -1}"#.to_vec()),
        ("chat 5 KB", Route::Chat, chat.to_string().into_bytes()),
        ("completion 16 KB", Route::Completions, rag.to_string().into_bytes()),
        ("chat 4 KB escaped", Route::Chat, escaped.to_string().into_bytes()),
    ]
}

fn routing_key(c: &mut Criterion) {
    let hashing = HashingParams::default();
    let mut group = c.benchmark_group("routing_input");
    for (name, route, body) in bodies() {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| {
                routing_input(route, black_box(&body), None, hashing, None)
                    .expect("the bench bodies are valid")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, routing_key);
criterion_main!(benches);
