//! Replay speed: 12,000 generated requests over 16 replicas, once per policy (target: <= 1 s each on one core).

use criterion::{Criterion, criterion_group, criterion_main};
use fleet_policy::{POLICY_NAMES, PolicySpec};
use fleet_sim::replay::{self, ReplayConfig, ReplayControl};
use fleet_sim::workload::{GenConfig, generate};

fn replay_12k_x16(c: &mut Criterion) {
    let records = generate(&GenConfig { requests: 12_000, ..GenConfig::default() }).expect("valid workload");
    let trace = fleet_trace::Trace::from_records(records).expect("valid trace");
    // Four times the generated rate (48 req/s): 16 replicas under load, so queues and preemption run too.
    let prepared = replay::prepare(&trace, None, 4.0).expect("prepared");
    let mut group = c.benchmark_group("replay_12k_requests_16_replicas");
    group.sample_size(10);
    for policy in POLICY_NAMES {
        let config = ReplayConfig::new(16, PolicySpec::named(policy));
        group.bench_function(policy, |b| {
            b.iter(|| replay::replay(&prepared, &config, ReplayControl::default()).expect("replayed"))
        });
    }
    group.finish();
}

criterion_group!(benches, replay_12k_x16);
criterion_main!(benches);
