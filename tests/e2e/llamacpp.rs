//! A real engine in the loop: three llama.cpp servers (`llama-server` built by `cargo xtask engines
//! llamacpp`, a small random-weight model) probed, watched by the headless app, and routed to by
//! fleet-router, with the official `openai` Python client as the client.

use std::time::Duration;

use anyhow::{Context, Result};
use fleet_router::RouterConfig;
use fleet_test_support::admin_router::spawn_router_with;
use fleet_test_support::eventually;
use fleet_test_support::llamacpp::{
    LLAMACPP_MODEL, LlamaCppOptions, spawn_llama_server, spawn_llama_servers,
};
use fleet_test_support::process::{bin_path, spawn_headless_app};
use serde_json::{Value, json};

const TOKEN: &str = "llamacpp-e2e-admin-token";

/// Streams chat completions that share a long system prompt through `argv[1]` with the official client,
/// asking for usage in the stream; prints one JSON line per request: its content length and cached tokens.
const CLIENT: &str = r#"
import json, sys
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", timeout=60, max_retries=0)
system = " ".join(f"rule {i} says the fleet keeps its cache warm" for i in range(40))
for question in ["what is the first rule", "what is the second rule", "what is the third rule"]:
    stream = client.chat.completions.create(
        model=sys.argv[2],
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks, usage = 0, None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
        if chunk.usage:
            usage = chunk.usage
    details = usage.prompt_tokens_details if usage else None
    print(json.dumps({
        "chunks": chunks,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "cached_tokens": details.cached_tokens if details else None,
    }))
"#;

async fn probe_json(url: &str, traffic_to: &str) -> Result<Value> {
    // Requests during the probe's interval, so the rates and the hit rate have data.
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
    let target = format!("{traffic_to}/v1/completions");
    let prompt = "the shared head of every prompt in this probe ".repeat(20);
    let traffic = tokio::spawn(async move {
        // Until the probe is done (aborted below); bounded in case it never is.
        for i in 0..2000 {
            let body = json!({"model": LLAMACPP_MODEL, "prompt": format!("{prompt} q{i}"), "max_tokens": 3});
            if let Ok(response) = client.post(&target).json(&body).send().await {
                let _ = response.bytes().await;
            }
        }
    });
    let mut command = tokio::process::Command::new(bin_path("fleetdeck")?);
    command.args(["probe", url, "--interval", "3", "--json"]).kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .context("fleetdeck probe did not finish within 60 s")??;
    traffic.abort();
    anyhow::ensure!(output.status.success(), "probe failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).context("probe --json printed no JSON")
}

#[tokio::test]
async fn llamacpp_replicas_are_probed_watched_and_routed_with_cached_tokens_recorded() -> Result<()> {
    let servers = spawn_llama_servers(3, LlamaCppOptions::default()).await?;
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();

    // `fleetdeck probe`: detected as llama.cpp; what it exposes is a number, what it lacks is null.
    let report = probe_json(&urls[0], &urls[0]).await?;
    assert_eq!(report["engine"], "llamacpp", "{report}");
    for key in
        ["queue_depth", "running", "hit_rate", "itl_mean_s", "prompt_tokens_per_s", "generation_tokens_per_s"]
    {
        assert!(report[key].is_number(), "llama.cpp exposes {key}: {report}");
    }
    assert!(report["hit_rate"].as_f64().is_some_and(|h| h > 0.0 && h <= 1.0), "{report}");
    for key in ["kv_usage", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "preemptions_per_s"] {
        assert!(report[key].is_null(), "llama.cpp does not expose {key}: it must be null, not 0: {report}");
    }

    // The app watches all three live.
    let db_dir = tempfile::tempdir()?;
    let app = spawn_headless_app(&urls, &db_dir.path().join("history.sqlite")).await?;
    let client = app.client()?;
    let api = app.api("fleet_snapshot");
    let snap = eventually("the app to show three llama.cpp replicas", Duration::from_secs(60), || async {
        let snap = crate::app::snapshot(&client, &api).await?;
        let ready = snap.replicas.len() == 3
            && snap
                .replicas
                .iter()
                .all(|r| r.engine.as_deref() == Some("llamacpp") && r.signals.running.is_some());
        Ok(ready.then_some(snap))
    })
    .await?;
    assert!(
        snap.replicas.iter().all(|r| r.signals.kv_usage.is_none()),
        "no KV usage is exposed: None, not 0"
    );

    // fleet-router over them (cache-aware), the official client streaming through it.
    let router = spawn_router_with(RouterConfig {
        replicas: urls.clone(),
        policy: r#"{"policy": "cache_aware_approx"}"#.parse()?,
        admin_token: Some(TOKEN.into()),
        ..RouterConfig::default()
    })
    .await?;
    let output = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new("python3")
            .args(["-c", CLIENT, &router.url(), LLAMACPP_MODEL])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("the python client hung")?
    .context("cannot run python3 (with `pip install openai`)")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let answers: Vec<Value> = stdout.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    assert_eq!(answers.len(), 3, "{stdout}");
    assert!(answers.iter().all(|a| a["chunks"].as_u64() > Some(0)), "{stdout}");
    // The shared system prompt is computed once: the later requests land where it is cached.
    assert!(answers[1..].iter().all(|a| a["cached_tokens"].as_u64() > Some(100)), "{stdout}");

    // The app sees that traffic live: the replica that served the shared prefix reports llama.cpp's hits.
    eventually("the app to show a llama.cpp replica's hit rate", Duration::from_secs(60), || async {
        let snap = crate::app::snapshot(&client, &api).await?;
        Ok(snap.replicas.iter().any(|r| r.signals.hit_rate.is_some_and(|h| h > 0.0)).then_some(()))
    })
    .await?;

    // The router recorded llama.cpp's cached tokens, and its decision log shows the picks.
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let trace_url = format!("{}/admin/trace", router.url());
    let trace = eventually("three recorded requests", Duration::from_secs(20), || async {
        let text = http.get(&trace_url).bearer_auth(TOKEN).send().await?.text().await?;
        let records: Vec<Value> = text.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
        Ok((records.len() >= 3).then_some(records))
    })
    .await?;
    let cached: Vec<Option<u64>> = trace.iter().map(|r| r["cached_tokens"].as_u64()).collect();
    assert!(cached[1..].iter().all(|c| *c > Some(100)), "{cached:?}");
    let decisions: Value = http
        .get(format!("{}/admin/decisions?limit=3", router.url()))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .json()
        .await?;
    let decisions = decisions.as_array().context("a list")?;
    assert_eq!(decisions.len(), 3);
    assert!(decisions.iter().all(|d| d["policy"] == "cache_aware_approx"), "{decisions:?}");
    assert!(decisions.iter().all(|d| urls.iter().any(|u| d["replica"] == u.as_str())), "{decisions:?}");
    assert_eq!(decisions[0]["replica"], decisions[1]["replica"], "the shared prefix stays on one replica");
    Ok(())
}

#[tokio::test]
async fn a_llamacpp_replica_killed_mid_stream_ends_the_clients_stream_with_an_error_event() -> Result<()> {
    let mut server = spawn_llama_server(LlamaCppOptions { slots: 1, ..LlamaCppOptions::default() }).await?;
    let router =
        spawn_router_with(RouterConfig { replicas: vec![server.url.clone()], ..RouterConfig::default() })
            .await?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
    let body = json!({
        "model": LLAMACPP_MODEL,
        "messages": [{"role": "user", "content": "tell a long story"}],
        "max_tokens": 3000,
        "ignore_eos": true,
        "stream": true,
    });
    let response = client.post(format!("{}/v1/chat/completions", router.url())).json(&body).send().await?;
    crate::streams::kill_mid_stream_and_expect_an_error_event(response, || server.kill()).await?;
    Ok(())
}
