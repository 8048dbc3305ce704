//! The `fleetdeck` binary in headless mode: live rows, bad endpoints, stored history.

use std::time::Duration;

use anyhow::{Result, bail};
use fleet_sim::ModelConfig;
use fleet_test_support::endpoints::{garbage_metrics, silent_metrics, unreachable_url};
use fleet_test_support::process::spawn_headless_app;
use fleet_test_support::{eventually, spawn_router, spawn_sim};
use fleetdeck_api::{ApiError, FleetSnapshot, ScrapeState};
use serde_json::json;

pub(crate) async fn snapshot(client: &reqwest::Client, url: &str) -> Result<FleetSnapshot> {
    Ok(client.post(url).json(&json!({"window_s": 300})).send().await?.error_for_status()?.json().await?)
}

#[tokio::test]
async fn headless_app_shows_live_replicas_and_isolates_broken_endpoints() -> Result<()> {
    let sim = spawn_sim(2, ModelConfig::default()).await?;
    let router = spawn_router(sim.urls()).await?;
    let garbage = garbage_metrics().await?;
    let silent = silent_metrics().await?;
    let gone = unreachable_url().await?;
    let mut targets = sim.urls().to_vec();
    targets.extend([garbage.url(), silent.url(), gone.clone()]);
    let db_dir = tempfile::tempdir()?;
    let db = db_dir.path().join("history.sqlite");
    let app = spawn_headless_app(&targets, &db).await?;
    let client = app.client()?;

    // Traffic through the router, so the replicas have hits and TTFTs to report.
    let traffic = {
        let (client, url) = (client.clone(), router.url());
        tokio::spawn(async move {
            for i in 0..40 {
                let body = json!({"prompt": format!("{} question {i}", "same tenant prompt ".repeat(20)), "max_tokens": 4});
                let _ = client.post(format!("{url}/v1/completions")).json(&body).send().await;
            }
        })
    };

    let api = app.api("fleet_snapshot");
    let live = eventually("both replicas to report a hit rate and TTFT", Duration::from_secs(60), || async {
        let snap = snapshot(&client, &api).await?;
        let ready = snap.replicas[..2].iter().all(|r| {
            r.signals.hit_rate.is_some()
                && r.signals.ttft_p95_s.is_some()
                && r.engine.as_deref() == Some("vllm")
        });
        Ok(ready.then_some(snap))
    })
    .await?;
    traffic.await?;
    assert_eq!(live.replicas.len(), 5);
    assert_eq!(live.replicas[0].model.as_deref(), Some(fleet_sim::DEFAULT_MODEL));
    assert!(live.replicas[..2].iter().all(|r| matches!(r.scrape, ScrapeState::Ok { .. })));

    // Each broken endpoint shows its own error, with no last good scrape, on its own row.
    let broken = eventually("the broken endpoints to show errors", Duration::from_secs(30), || async {
        let snap = snapshot(&client, &api).await?;
        let messages: Vec<String> = snap.replicas[2..]
            .iter()
            .filter_map(|r| match &r.scrape {
                ScrapeState::Error { message, last_good_ms: None } => Some(message.clone()),
                _ => None,
            })
            .collect();
        Ok((messages.len() == 3).then_some(messages))
    })
    .await?;
    assert!(broken[0].contains("malformed exposition") && broken[0].contains("line 1"), "{}", broken[0]);
    assert!(broken[1].contains("no answer") && broken[1].contains(&silent.url()), "{}", broken[1]);
    assert!(broken[2].contains("cannot connect") && broken[2].contains(&gone), "{}", broken[2]);

    // The chart series come from the SQLite history, which holds the good scrapes.
    let snap = snapshot(&client, &api).await?;
    assert!(!snap.ttft_p95.is_empty());
    let store = fleet_store::Store::open(&db).await?;
    assert!(store.sample_count().await? >= 2);

    // A replica that dies keeps its last good time and signals, marked as an error.
    drop(sim);
    let after = eventually("the stopped replicas to show errors", Duration::from_secs(30), || async {
        let snap = snapshot(&client, &api).await?;
        Ok(matches!(snap.replicas[0].scrape, ScrapeState::Error { last_good_ms: Some(_), .. })
            .then_some(snap))
    })
    .await?;
    assert!(after.replicas[0].signals.queue_depth.is_some());
    Ok(())
}

#[tokio::test]
async fn headless_app_serves_the_ui_and_answers_bad_calls_with_code_and_message() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let db_dir = tempfile::tempdir()?;
    let app = spawn_headless_app(sim.urls(), &db_dir.path().join("h.sqlite")).await?;
    let client = app.client()?;

    let index = client.get(&app.url).send().await?;
    assert_eq!(index.status(), 200);
    let html = index.text().await?;
    assert!(html.contains("ui.js"), "index.html does not load the UI: {html}");
    let wasm = client.get(format!("{}ui_bg.wasm", app.url)).send().await?;
    assert_eq!(wasm.headers()["content-type"], "application/wasm");
    assert!(wasm.bytes().await?.starts_with(b"\0asm"));

    let bad = client.post(app.api("fleet_snapshot")).json(&json!({"window_s": 1})).send().await?;
    assert_eq!(bad.status(), 400);
    let error: ApiError = bad.json().await?;
    assert_eq!(error.code, "bad_request");
    assert!(error.message.contains("window_s"), "{}", error.message);

    let unknown = client.post(app.api("reboot_everything")).json(&json!({})).send().await?;
    assert_eq!(unknown.status(), 404);
    let error: ApiError = unknown.json().await?;
    if error.code != "unknown_command" {
        bail!("unexpected error {error:?}");
    }
    Ok(())
}
