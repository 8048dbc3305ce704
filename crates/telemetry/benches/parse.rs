//! Criterion benches: parsing and reading each engine's fixture exposition (bytes per second),
//! and one window step with signal derivation, the per-scrape CPU work of the scheduler.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fleet_telemetry::exposition::parse;
use fleet_telemetry::{Window, read};

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn parse_and_read(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse_and_read");
    for stem in ["vllm", "sglang", "tgi", "llamacpp", "trtllm", "triton", "dynamo-frontend"] {
        let text = fixture(&format!("{stem}.2.prom"));
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_function(stem, |b| b.iter(|| read(&parse(black_box(&text)).unwrap()).unwrap()));
    }
    group.finish();
}

fn window_step(c: &mut Criterion) {
    let first = read(&parse(&fixture("vllm.1.prom")).unwrap()).unwrap();
    let second = read(&parse(&fixture("vllm.2.prom")).unwrap()).unwrap();
    c.bench_function("window_push_and_signals/vllm", |b| {
        let mut window = Window::new(Duration::from_secs(10));
        let mut at = 0.0;
        b.iter(|| {
            at += 1.0;
            window.push(at, if (at as u64).is_multiple_of(2) { &first } else { &second });
            black_box(window.signals())
        })
    });
}

criterion_group!(benches, parse_and_read, window_step);
criterion_main!(benches);
