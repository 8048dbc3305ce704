//! `fleet-sim bench`, the real binary, against an emulated fleet on port 0: the report's figures, the
//! replicas' own prefix hit rate, failures counted by kind, and clear errors for a dead target or a bad trace.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fleet_sim::{Faults, ReplicaConfig};
use fleet_trace::TraceRecord;
use serde_json::Value;

use super::serve::start_fleet;

/// A trace of `n` requests 40 ms apart in 16-token blocks: every request shares the same three leading
/// blocks (a system prompt), then has one block of its own.
fn shared_prefix_trace(dir: &Path, n: u64) -> Result<std::path::PathBuf> {
    let path = dir.join("trace.jsonl");
    let mut text = String::new();
    for i in 0..n {
        let record = TraceRecord {
            block_tokens: Some(16),
            ..TraceRecord::mooncake(i * 40, 60, 4, vec![1, 2, 3, 100 + i])
        };
        text.push_str(&serde_json::to_string(&record)?);
        text.push('\n');
    }
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Runs `fleet-sim bench ARGS`; returns the exit success, stdout and stderr.
async fn bench(args: &[&str]) -> Result<(bool, String, String)> {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleet-sim"))
        .arg("bench")
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output =
        tokio::time::timeout(Duration::from_secs(60), run).await.context("bench ran over 60 s")??;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

fn number(report: &Value, pointer: &str) -> f64 {
    report.pointer(pointer).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

#[tokio::test]
async fn bench_measures_a_replica_and_reads_its_prefix_hit_rate() -> Result<()> {
    let fleet = start_fleet(1, ReplicaConfig::default(), None).await?;
    let dir = tempfile::tempdir()?;
    let trace = shared_prefix_trace(dir.path(), 12)?;
    let url = fleet.url(0);
    let (ok, stdout, stderr) =
        bench(&["--target", url, "--trace", &trace.to_string_lossy(), "--metrics", url, "--json"]).await?;
    ensure!(ok, "bench failed: {stderr}");
    let report: Value = serde_json::from_str(&stdout).with_context(|| format!("not JSON: {stdout}"))?;
    assert_eq!(report["requests"], 12);
    assert_eq!(report["completed"], 12, "{report:#}");
    assert_eq!(report["failed"], 0);
    assert!(number(&report, "/ttft_ms/p50") > 0.0, "{report:#}");
    assert!(number(&report, "/ttft_ms/p99") >= number(&report, "/ttft_ms/p50"));
    // Four tokens each: three gaps per request.
    assert_eq!(report["itl_ms"]["count"], 36, "{report:#}");
    assert!(number(&report, "/e2e_ms/p50") >= number(&report, "/ttft_ms/p50"));
    assert!(number(&report, "/throughput/output_tokens_per_s") > 0.0);
    assert_eq!(report["goodput"]["met_slo"], 12, "no SLO given: every completed request counts");
    // Eleven of twelve requests find the shared 48-token prefix cached: the engine's own counters say so.
    let hit_rate = number(&report, "/prefix_cache/hit_rate");
    assert!(hit_rate > 0.3 && hit_rate < 1.0, "hit rate {hit_rate}: {report:#}");
    assert_eq!(report["prefix_cache"]["replicas"][0]["engine"], "vllm");
    assert!(number(&report, "/prefix_cache/usage_cached_share") > 0.3, "{report:#}");
    assert!(stderr.contains("bench: 12 requests"), "progress goes to stderr: {stderr}");
    Ok(())
}

#[tokio::test]
async fn bench_spreads_its_clients_over_every_target() -> Result<()> {
    // Two replicas stand for two routers of one fleet: each target's requests land on its own replica.
    let fleet = start_fleet(2, ReplicaConfig::default(), None).await?;
    let dir = tempfile::tempdir()?;
    let trace = shared_prefix_trace(dir.path(), 12)?;
    let (first, second) = (fleet.url(0), fleet.url(1));
    let (ok, stdout, stderr) = bench(&[
        "--target",
        first,
        "--also-target",
        second,
        "--trace",
        &trace.to_string_lossy(),
        "--metrics",
        first,
        "--metrics",
        second,
        "--json",
    ])
    .await?;
    ensure!(ok, "bench failed: {stderr}");
    let report: Value = serde_json::from_str(&stdout).with_context(|| format!("not JSON: {stdout}"))?;
    assert_eq!(report["completed"], 12, "{report:#}");
    for replica in 0..2 {
        // 6 requests of 64 prompt tokens each went through each target.
        let queries = number(&report, &format!("/prefix_cache/replicas/{replica}/queries"));
        assert!(queries >= 6.0 * 48.0, "replica {replica} saw {queries} prompt tokens: {report:#}");
    }
    assert!(stderr.contains(&format!("and {second}")), "{stderr}");
    Ok(())
}

#[tokio::test]
async fn bench_counts_failures_by_kind_and_overflow_at_its_in_flight_limit() -> Result<()> {
    let fleet = start_fleet(2, ReplicaConfig::default(), None).await?;
    fleet.fleet.set_faults(0, Faults { error_rate: 1.0, ..Faults::default() })?;
    fleet.fleet.set_faults(1, Faults { stall_ms: 2_000, ..Faults::default() })?;
    let dir = tempfile::tempdir()?;
    let trace = shared_prefix_trace(dir.path(), 6)?;
    let trace = trace.to_string_lossy();

    let (ok, stdout, stderr) = bench(&["--target", fleet.url(0), "--trace", &trace, "--json"]).await?;
    ensure!(ok, "bench failed: {stderr}");
    let report: Value = serde_json::from_str(&stdout)?;
    assert_eq!(report["completed"], 0);
    assert_eq!(report["errors"]["http_500"], 6, "every injected 500 is counted by kind: {report:#}");
    assert!(report["ttft_ms"]["p50"].is_null(), "no latency is made up for failed requests");

    // A stalled replica and two requests in flight at most: the other four arrivals are overflow.
    let args = ["--target", fleet.url(1), "--trace", &trace, "--max-in-flight", "2", "--json"];
    let (ok, stdout, stderr) = bench(&args).await?;
    ensure!(ok, "bench failed: {stderr}");
    let report: Value = serde_json::from_str(&stdout)?;
    assert_eq!((report["sent"].as_u64(), report["overflow"].as_u64()), (Some(2), Some(4)), "{report:#}");
    assert_eq!(report["completed"], 2);
    Ok(())
}

#[tokio::test]
async fn bench_refuses_a_dead_target_and_a_bad_trace_with_clear_errors() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let trace = shared_prefix_trace(dir.path(), 2)?;
    let dead = fleet_test_support::endpoints::unreachable_url().await?;
    let (ok, _, stderr) = bench(&["--target", &dead, "--trace", &trace.to_string_lossy()]).await?;
    assert!(!ok);
    assert!(stderr.contains(&format!("cannot reach the target {dead}")), "{stderr}");

    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\nnot json\n",
    )?;
    let (ok, _, stderr) = bench(&["--target", &dead, "--trace", &bad.to_string_lossy()]).await?;
    assert!(!ok);
    assert!(stderr.contains("line 2 is not a trace record"), "{stderr}");
    Ok(())
}
