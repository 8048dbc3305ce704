//! kv_precise over real KV events: fleet-sim processes publish vLLM-format events over ZMQ, the router
//! subscribes, indexes them and routes a repeated prefix to the replica that holds it; every encoding
//! fleet-sim writes (vLLM 0.32's array batch of tagged maps, arrays throughout, maps throughout) fills the
//! index.

use std::time::Duration;

use anyhow::Result;
use fleet_router::RouterConfig;
use fleet_test_support::eventually;
use serde_json::{Value, json};

use crate::support::{SimProcess, TOKEN, client, router};

fn counter(metrics: &str, name: &str, replica: &str) -> u64 {
    let prefix = format!("{name}{{replica=\"{replica}\"}} ");
    metrics.lines().find_map(|line| line.strip_prefix(&prefix)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn kv_precise_routes_by_the_replicas_own_kv_events() -> Result<()> {
    let mut replicas = Vec::new();
    let mut sims = Vec::new();
    for _ in 0..2 {
        let (sim, publish, replay) = SimProcess::start_with_kv_events().await?;
        replicas.push(format!("{},kv={publish},kv_replay={replay}", sim.url));
        sims.push(sim);
    }
    let router = router(RouterConfig {
        replicas,
        admin_token: Some(TOKEN.into()),
        policy: "policy: kv_precise\n".parse()?,
        ..RouterConfig::default()
    })
    .await?;
    let http = client();
    let prompt = "The shared system prompt of tenant seven. ".repeat(24);
    let ask = |suffix: &str| json!({"prompt": format!("{prompt}{suffix}"), "max_tokens": 1});

    let first = http.post(format!("{}/v1/completions", router.url)).json(&ask("first")).send().await?;
    assert_eq!(first.status(), 200);
    let holder = first.headers()["x-fleet-replica"].to_str()?.to_owned();
    first.bytes().await?;

    // The replica that prefilled the prompt publishes BlockStored events; the router indexes them.
    eventually("KV events from the replica that served", Duration::from_secs(10), || {
        let (http, url, holder) = (http.clone(), format!("{}/metrics", router.url), holder.clone());
        async move {
            let metrics = http.get(url).send().await?.text().await?;
            Ok((counter(&metrics, "fleet_router_kv_events_total", &holder) > 0).then_some(()))
        }
    })
    .await?;

    for suffix in ["second", "third", "fourth"] {
        let response = http.post(format!("{}/v1/completions", router.url)).json(&ask(suffix)).send().await?;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-fleet-replica"], holder.as_str(), "the prefix's holder serves it");
        assert_eq!(response.headers()["x-fleet-branch"], "cost");
        let body: Value = response.json().await?;
        assert!(body["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0), "{body}");
    }
    let decisions = router.admin_get(&http, "/admin/decisions?limit=1").await?;
    let chosen = decisions[0]["decision"]["candidates"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["chosen"] == true).cloned())
        .expect("a chosen candidate");
    assert!(chosen["matched_blocks"].as_u64() >= Some(10), "{chosen}");
    let state = router.admin_get(&http, "/admin/state").await?;
    let indexed = state["replicas"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["url"] == holder.as_str()))
        .and_then(|r| r["indexed_blocks"].as_u64());
    assert!(indexed >= Some(10), "{state}");
    Ok(())
}

#[tokio::test]
async fn the_index_reads_kv_events_in_every_encoding() -> Result<()> {
    let mut replicas = Vec::new();
    let mut sims = Vec::new();
    for encoding in ["vllm", "array", "map"] {
        let (sim, publish, replay) = SimProcess::start_with_kv_events_as(encoding).await?;
        replicas.push(format!("{},kv={publish},kv_replay={replay}", sim.url));
        sims.push((encoding, sim));
    }
    let router = router(RouterConfig {
        replicas,
        admin_token: Some(TOKEN.into()),
        policy: "policy: kv_precise\n".parse()?,
        ..RouterConfig::default()
    })
    .await?;
    let http = client();
    // Each replica prefills a prompt of its own, sent to it directly: only its events can index it.
    for (encoding, sim) in &sims {
        let prompt = format!("The system prompt of the {encoding} tenant. ").repeat(24);
        let response = http
            .post(format!("{}/v1/completions", sim.url))
            .json(&json!({"prompt": prompt, "max_tokens": 1}))
            .send()
            .await?;
        assert_eq!(response.status(), 200, "{encoding}");
        response.bytes().await?;
    }
    let urls: Vec<String> = sims.iter().map(|(_, sim)| sim.url.clone()).collect();
    eventually("every replica's blocks indexed", Duration::from_secs(20), || {
        let (http, router, urls) = (http.clone(), &router, &urls);
        async move {
            let state = router.admin_get(&http, "/admin/state").await?;
            let indexed: Vec<u64> = urls
                .iter()
                .map(|url| {
                    state["replicas"]
                        .as_array()
                        .and_then(|r| r.iter().find(|r| r["url"] == url.as_str()))
                        .and_then(|r| r["indexed_blocks"].as_u64())
                        .unwrap_or(0)
                })
                .collect();
            Ok(indexed.iter().all(|&n| n >= 10).then_some(()))
        }
    })
    .await?;
    let metrics = http.get(format!("{}/metrics", router.url)).send().await?.text().await?;
    for (encoding, sim) in &sims {
        assert!(counter(&metrics, "fleet_router_kv_events_total", &sim.url) > 0, "{encoding}: {metrics}");
        assert_eq!(counter(&metrics, "fleet_router_kv_resyncs_total", &sim.url), 0, "{encoding}");
    }
    Ok(())
}
