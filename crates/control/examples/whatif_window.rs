//! Measures the what-if the app runs for a 10-minute window of a 16-replica fleet: 12,000
//! generated requests (20 req/s for 600 s, fleet-sim's mixed chat/RAG workload) replayed under
//! a candidate and the active policy side by side, as `Control::start_whatif` does.
//!
//! `cargo run --release -p fleetdeck-control --example whatif_window [REPLICAS] [REQUESTS]`

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Instant;

use anyhow::{Context, Result};
use fleet_policy::PolicySpec;
use fleet_sim::replay;
use fleet_sim::workload::{GenConfig, generate};
use fleetdeck_control::whatif::replay_both;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let replicas: u32 =
        args.next().map(|a| a.parse()).transpose().context("REPLICAS must be a number")?.unwrap_or(16);
    let requests: usize =
        args.next().map(|a| a.parse()).transpose().context("REQUESTS must be a number")?.unwrap_or(12_000);
    let config = GenConfig { requests, rate_rps: requests as f64 / 600.0, ..GenConfig::default() };
    let trace = fleet_trace::Trace::from_records(generate(&config)?)?;
    println!("trace: {} requests over {:.0} s", trace.len(), trace.duration_ms() as f64 / 1000.0);
    let cancel = AtomicBool::new(false);
    let routed = [AtomicU64::new(0), AtomicU64::new(0)];
    for (candidate, active) in [("cache_aware_approx", "round_robin"), ("kv_precise", "consistent_hash")] {
        let started = Instant::now();
        let prepared = replay::prepare(&trace, None, 1.0)?;
        let base = replay::ReplayConfig::new(replicas, PolicySpec::default());
        let (c, a) = replay_both(
            &prepared,
            &base,
            &PolicySpec::named(candidate),
            &PolicySpec::named(active),
            &cancel,
            &routed,
            0,
        )
        .map_err(anyhow::Error::msg)?;
        println!(
            "{candidate} vs {active} on {replicas} replicas: {:.2} s (hit {:.3} vs {:.3}, ttft p95 {:.3} s vs {:.3} s)",
            started.elapsed().as_secs_f64(),
            c.hit_rate,
            a.hit_rate,
            c.ttft_p95_s,
            a.ttft_p95_s
        );
    }
    Ok(())
}
