//! Emulated replicas behind fleet-router: streaming, ordering, round-robin and counters.

use std::time::Duration;

use anyhow::Result;
use fleet_sim::ModelConfig;
use fleet_telemetry::exposition;
use fleet_test_support::{spawn_router, spawn_sim};
use futures_util::StreamExt;
use serde_json::{Value, json};

async fn counter(client: &reqwest::Client, replica: &str, name: &str) -> Result<f64> {
    let text = client.get(format!("{replica}/metrics")).send().await?.error_for_status()?.text().await?;
    Ok(exposition::parse(&text)?.samples_named(name).map(|s| s.value).sum())
}

/// The `content` deltas of an OpenAI chat stream, and whether it ended with `[DONE]`.
fn chat_deltas(sse: &str) -> (Vec<String>, bool) {
    let mut deltas = Vec::new();
    let mut done = false;
    for data in sse.split("\n\n").filter_map(|event| event.strip_prefix("data: ")) {
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(data).expect("every event is JSON");
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
            deltas.push(text.to_string());
        }
    }
    (deltas, done)
}

#[tokio::test]
async fn a_streamed_chat_passes_through_the_router_in_order_and_moves_the_replicas_counters() -> Result<()> {
    let sim = spawn_sim(2, ModelConfig::default()).await?;
    let router = spawn_router(sim.urls()).await?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let tokens_before = counter(&client, &sim.urls()[0], "vllm:generation_tokens_total").await?
        + counter(&client, &sim.urls()[1], "vllm:generation_tokens_total").await?;

    let messages =
        json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"}]);
    let body =
        json!({"model": fleet_sim::DEFAULT_MODEL, "messages": messages, "max_tokens": 40, "stream": true});
    let response = client.post(format!("{}/v1/chat/completions", router.url())).json(&body).send().await?;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str()?.starts_with("text/event-stream"));
    let served_by = response.headers()[fleet_router::proxy::REPLICA_HEADER].to_str()?.to_string();

    // Read the first event, then ask the replica whether the request is still running: if
    // the router buffered the stream, the replica would have finished before we saw a byte.
    let mut stream = response.bytes_stream();
    let mut sse = String::from_utf8(stream.next().await.expect("a first chunk")?.to_vec())?;
    assert!(sse.starts_with("data: "), "{sse}");
    assert_eq!(counter(&client, &served_by, "vllm:num_requests_running").await?, 1.0, "stream was buffered");
    while let Some(chunk) = stream.next().await {
        sse.push_str(std::str::from_utf8(&chunk?)?);
    }
    let (deltas, done) = chat_deltas(&sse);
    assert!(done, "stream did not end with [DONE]: {sse}");
    assert_eq!(deltas.len(), 40);

    // The same request without streaming yields the same text: the tokens arrived in order.
    let body = json!({"messages": messages, "max_tokens": 40});
    let whole: Value =
        client.post(format!("{}/v1/chat/completions", router.url())).json(&body).send().await?.json().await?;
    assert_eq!(whole["choices"][0]["message"]["content"].as_str(), Some(deltas.concat().as_str()));
    assert_eq!(whole["usage"]["completion_tokens"], 40);

    let tokens_after = counter(&client, &sim.urls()[0], "vllm:generation_tokens_total").await?
        + counter(&client, &sim.urls()[1], "vllm:generation_tokens_total").await?;
    assert_eq!(tokens_after - tokens_before, 80.0);
    Ok(())
}

#[tokio::test]
async fn round_robin_alternates_and_a_repeated_prompt_hits_the_prefix_cache() -> Result<()> {
    let sim = spawn_sim(2, ModelConfig::default()).await?;
    let router = spawn_router(sim.urls()).await?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let prompt = "shared system prompt ".repeat(40);
    let mut served = Vec::new();
    let mut cached = Vec::new();
    for _ in 0..4 {
        let body = json!({"prompt": prompt, "max_tokens": 2});
        let response = client.post(format!("{}/v1/completions", router.url())).json(&body).send().await?;
        served.push(response.headers()[fleet_router::proxy::REPLICA_HEADER].to_str()?.to_string());
        let answer: Value = response.json().await?;
        cached.push(answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0));
    }
    assert_eq!(served[0], served[2]);
    assert_eq!(served[1], served[3]);
    assert_ne!(served[0], served[1]);
    // Each replica misses the first time and hits the second: round-robin wastes the cache
    // once per replica, which is exactly what cache-aware routing avoids.
    assert_eq!(&cached[..2], &[0, 0]);
    assert!(cached[2] > 0 && cached[3] > 0, "{cached:?}");
    let hits = counter(&client, &served[0], "vllm:prefix_cache_hits_total").await?;
    assert_eq!(hits, cached[2] as f64);
    Ok(())
}

#[tokio::test]
async fn an_unreachable_replica_is_skipped_and_bad_requests_are_explained() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let dead = fleet_test_support::endpoints::unreachable_url().await?;
    let router = spawn_router(&[dead, sim.urls()[0].clone()]).await?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    for _ in 0..2 {
        let response = client
            .post(format!("{}/v1/completions", router.url()))
            .json(&json!({"prompt": "x"}))
            .send()
            .await?;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()[fleet_router::proxy::REPLICA_HEADER], sim.urls()[0].as_str());
    }
    let bad = client
        .post(format!("{}/v1/completions", router.url()))
        .json(&json!({"prompt": "x", "max_tokens": -1}))
        .send()
        .await?;
    assert_eq!(bad.status(), 400);
    let error: Value = bad.json().await?;
    assert_eq!(error["error"]["param"], "max_tokens");
    Ok(())
}
