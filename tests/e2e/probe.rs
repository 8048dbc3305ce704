//! `fleetdeck probe`: the real binary against an emulated replica, the same metrics over HTTPS, a
//! garbage endpoint and an address where nothing listens.

use std::process::Output;
use std::time::Duration;

use anyhow::{Context, Result};
use fleet_sim::ModelConfig;
use fleet_test_support::endpoints::{garbage_metrics, unreachable_url};
use fleet_test_support::process::bin_path;
use fleet_test_support::spawn_sim;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

async fn probe(args: &[&str]) -> Result<Output> {
    let mut command = tokio::process::Command::new(bin_path("fleetdeck")?);
    command.arg("probe").args(args).kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .context("fleetdeck probe did not finish within 30 s")?
        .context("cannot run fleetdeck probe")
}

#[tokio::test]
async fn probe_prints_the_engine_and_signals_of_a_replica_as_json() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let url = sim.urls()[0].clone();
    // Traffic during the probe's interval, so hit rate and TTFT have data.
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let traffic = {
        let (url, stop) = (url.clone(), stop.clone());
        tokio::spawn(async move {
            let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client");
            for i in 0..500 {
                if stop.is_cancelled() {
                    return;
                }
                let body = json!({"prompt": format!("{} q{}", "same tenant prompt ".repeat(20), i % 5), "max_tokens": 4});
                let _ = client.post(format!("{url}/v1/completions")).json(&body).send().await;
            }
        })
    };
    let output = probe(&[&url, "--interval", "2", "--json"]).await?;
    stop.cancel();
    traffic.await?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "probe failed: {stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).context("probe --json printed no JSON")?;
    assert_eq!(report["engine"], "vllm", "{report}");
    assert_eq!(report["model"], fleet_sim::DEFAULT_MODEL);
    for key in ["queue_depth", "running", "kv_usage", "hit_rate", "ttft_p50_s", "ttft_p95_s"] {
        assert!(report[key].is_number(), "{key} should be a number: {report}");
    }
    assert!((0.0..=1.0).contains(&report["hit_rate"].as_f64().unwrap()));
    assert!(
        report["preemptions_per_s"].as_f64().is_some_and(|p| p >= 0.0),
        "fleet-sim exports vLLM's preemption counter: {report}"
    );

    // The table for people names the engine too.
    let output = probe(&[&url, "--interval", "0.2"]).await?;
    assert!(output.status.success());
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains("engine     vllm"), "{table}");
    Ok(())
}

#[tokio::test]
async fn probe_reads_https_endpoints_it_trusts_and_names_a_certificate_it_does_not() -> Result<()> {
    // A replica's real exposition, served over HTTPS by `openssl s_server` with a self-signed certificate.
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let metrics = reqwest::get(format!("{}/metrics", sim.urls()[0])).await?.text().await?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("metrics"), metrics)?;
    let (cert, key) = fleet_test_support::tls::self_signed_certificate(dir.path()).await?;
    let server = fleet_test_support::tls::https_file_server(dir.path(), &cert, &key).await?;

    // Trusted through SSL_CERT_FILE (as an operator would add a private CA): the engine is detected.
    let mut command = tokio::process::Command::new(bin_path("fleetdeck")?);
    command.args(["probe", &server.url, "--interval", "0.2", "--json"]).env("SSL_CERT_FILE", &cert);
    let output = tokio::time::timeout(Duration::from_secs(30), command.kill_on_drop(true).output())
        .await
        .context("fleetdeck probe did not finish within 30 s")??;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "probe over HTTPS failed: {stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).context("probe --json printed no JSON")?;
    assert_eq!(report["engine"], "vllm", "{report}");

    // Not trusted: a clear failure that says it is the certificate.
    let output = probe(&[&server.url, "--interval", "0.1"]).await?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "an untrusted certificate must fail");
    assert!(stderr.contains("certificate of") && stderr.contains("SSL_CERT_FILE"), "{stderr}");
    Ok(())
}

#[tokio::test]
async fn probe_of_a_malformed_or_missing_endpoint_exits_non_zero_naming_the_fault() -> Result<()> {
    let garbage = garbage_metrics().await?;
    let output = probe(&[&garbage.url(), "--interval", "0.1", "--json"]).await?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a malformed exposition must fail");
    assert!(stderr.contains("malformed exposition") && stderr.contains("line 1"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let gone = unreachable_url().await?;
    let output = probe(&[&gone, "--interval", "0.1"]).await?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("cannot connect"), "{stderr}");

    let output = probe(&[&gone, "--interval", "0"]).await?;
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--interval"));
    Ok(())
}
