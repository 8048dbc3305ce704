//! The demo fleet shows why routing matters: under round_robin its replicas thrash their KV caches and
//! queue; under the cache-aware policy the same traffic hits the cache and answers sooner.

use std::time::Duration;

use anyhow::{Context, Result};
use fleet_test_support::eventually;
use fleetdeck_control::admin::AdminClient;
use fleetdeck_control::demo::{DemoConfig, DemoFleet};
use tokio_util::sync::CancellationToken;

/// Hit rate (cached over prompt tokens) and median TTFT (ms) of the requests the demo's router recorded
/// after the first `skip`, once at least `count` more have completed.
async fn measure(policy: &str, skip: usize, count: usize) -> Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let config = DemoConfig { policy: format!("policy: {policy}\n"), ..DemoConfig::default() };
    let demo = DemoFleet::start(&config, dir.path(), &cancel).await?;
    let token = std::fs::read_to_string(demo.router.token_file.as_ref().context("token file")?)?;
    let client = AdminClient::new(reqwest::Client::new(), &demo.router_url, Some(token.trim().into()));
    let records = eventually(&format!("{count} requests under {policy}"), Duration::from_secs(120), || {
        let client = client.clone();
        async move {
            let records = client.trace_since(0).await?;
            let done: Vec<_> = records.into_iter().filter(|r| r.status == Some(200)).collect();
            Ok((done.len() >= skip + count).then_some(done))
        }
    })
    .await?;
    let measured = &records[skip..];
    let prompt: u64 = measured.iter().map(|r| u64::from(r.input_length)).sum();
    let cached: u64 = measured.iter().map(|r| u64::from(r.cached_tokens.unwrap_or(0))).sum();
    let mut ttft: Vec<f64> = measured.iter().filter_map(|r| r.ttft_ms).collect();
    ttft.sort_by(f64::total_cmp);
    Ok((cached as f64 / prompt.max(1) as f64, ttft[ttft.len() / 2]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_the_demo_round_robin_thrashes_the_cache_and_cache_aware_routing_fixes_it() -> Result<()> {
    let (rr_hit, rr_ttft) = measure("round_robin", 60, 150).await?;
    let (ca_hit, ca_ttft) = measure("cache_aware_approx", 60, 150).await?;
    eprintln!(
        "round_robin: hit {rr_hit:.3} ttft p50 {rr_ttft:.1} ms; cache_aware_approx: hit {ca_hit:.3} ttft p50 {ca_ttft:.1} ms"
    );
    assert!(
        ca_hit >= rr_hit + 0.2,
        "hit rate {rr_hit:.3} -> {ca_hit:.3}: the demo must show the cache thrash"
    );
    assert!(
        ca_ttft <= rr_ttft * 0.7,
        "TTFT p50 {rr_ttft:.1} -> {ca_ttft:.1} ms: the demo must show queueing"
    );
    Ok(())
}
