//! The data plane: model groups, routing keys and cache affinity, streaming, limits.

use std::collections::BTreeSet;

use anyhow::Result;
use fleet_router::RouterConfig;
use fleet_sim::{Fleet, ModelConfig};
use fleet_test_support::{loopback_listener, spawn_sim};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::{chat, client, router, sse_data};

#[tokio::test]
async fn replicas_are_grouped_by_model_and_unknown_models_get_the_list() -> Result<()> {
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    let small = Fleet::spawn(
        vec![loopback_listener().await?, loopback_listener().await?],
        "small",
        &ModelConfig::default(),
        &stop,
    )?;
    let large = Fleet::spawn(vec![loopback_listener().await?], "large", &ModelConfig::default(), &stop)?;
    let mut replicas: Vec<String> = small.urls.clone();
    // One replica names its model, the others are asked for it.
    replicas.push(format!("{},model=large", large.urls[0]));
    let router = router(RouterConfig { replicas, ..RouterConfig::default() }).await?;
    let http = client();

    let models: Value = http.get(format!("{}/v1/models", router.url)).send().await?.json().await?;
    let ids: BTreeSet<&str> =
        models["data"].as_array().unwrap().iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, BTreeSet::from(["large", "small"]));

    for _ in 0..3 {
        let response = http
            .post(format!("{}/v1/completions", router.url))
            .json(&json!({"model": "large", "prompt": "hello", "max_tokens": 1}))
            .send()
            .await?;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-fleet-replica"], large.urls[0].as_str());
    }
    let mut small_served = BTreeSet::new();
    for _ in 0..4 {
        let response = http
            .post(format!("{}/v1/completions", router.url))
            .json(&json!({"model": "small", "prompt": "hello", "max_tokens": 1}))
            .send()
            .await?;
        small_served.insert(response.headers()["x-fleet-replica"].to_str()?.to_owned());
    }
    assert_eq!(small_served, small.urls.iter().cloned().collect());

    let response = http
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&json!({"model": "medium", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await?;
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await?;
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("medium") && message.contains("large") && message.contains("small"),
        "{message}"
    );

    let response = http
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await?;
    assert_eq!(response.status(), 400, "two models and none named");
    Ok(())
}

#[tokio::test]
async fn bad_requests_are_explained_and_bodies_are_limited() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let router = router(RouterConfig {
        replicas: sim.urls().to_vec(),
        max_body_bytes: 4096,
        ..RouterConfig::default()
    })
    .await?;
    let http = client();
    let response = http.post(format!("{}/v1/chat/completions", router.url)).body("{oops").send().await?;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await?;
    assert!(body["error"]["message"].as_str().unwrap().contains("JSON"));
    let response = http
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&json!({"messages": "not a list"}))
        .send()
        .await?;
    assert_eq!(response.status(), 400);
    let huge = chat(&"x".repeat(10_000), "hi", 1, false);
    let response = http.post(format!("{}/v1/chat/completions", router.url)).json(&huge).send().await?;
    assert_eq!(response.status(), 413);
    let body: Value = response.json().await?;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("4096 bytes") && message.contains("--max-body-bytes"), "{body}");
    // A replica's own 4xx is passed through untouched, not retried.
    let response = http
        .post(format!("{}/v1/completions", router.url))
        .json(&json!({"prompt": "x", "max_tokens": -1}))
        .send()
        .await?;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await?;
    assert_eq!(body["error"]["param"], "max_tokens");
    Ok(())
}

/// The proxy routes skip axum (see `serve::Routes`); what axum decided for them must not change.
#[tokio::test]
async fn proxy_routes_answer_as_their_axum_routes_would() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let router = router(RouterConfig { replicas: sim.urls().to_vec(), ..RouterConfig::default() }).await?;
    let http = client();
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let response = http.get(format!("{}{path}", router.url)).send().await?;
        assert_eq!(response.status(), 405, "GET {path}");
        assert_eq!(response.headers()["allow"], "POST", "GET {path}");
    }
    // A query string does not change the route, as in axum.
    let response = http
        .post(format!("{}/v1/completions?trace=1", router.url))
        .json(&json!({"prompt": "x", "max_tokens": 1}))
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    assert!(response.headers().contains_key("x-fleet-replica"), "proxied, not answered by the router");
    // A path that only looks like a proxy route is not one.
    let response = http.post(format!("{}/v1/completions/", router.url)).json(&json!({})).send().await?;
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await?;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("POST /v1/completions/") && message.contains("serves"), "{body}");
    Ok(())
}

#[tokio::test]
async fn streams_pass_through_unbuffered_and_sessions_stick_with_consistent_hashing() -> Result<()> {
    let sim = spawn_sim(3, ModelConfig::default()).await?;
    let router = router(RouterConfig {
        replicas: sim.urls().to_vec(),
        policy: "policy: consistent_hash\n".parse()?,
        ..RouterConfig::default()
    })
    .await?;
    let http = client();
    let response = http
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&chat("You are terse.", "Say hi", 30, true))
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str()?.starts_with("text/event-stream"));
    assert_eq!(response.headers()["x-fleet-branch"], "hash");
    let mut stream = response.bytes_stream();
    let first = stream.next().await.expect("a first chunk")?;
    // The first event arrived while the replica is still generating: nothing was buffered.
    let outstanding: u64 = {
        let state: Value = serde_json::from_str(&serde_json::to_string(&router.state.state_document())?)?;
        state["replicas"].as_array().unwrap().iter().filter_map(|r| r["outstanding"].as_u64()).sum()
    };
    assert_eq!(outstanding, 1, "the request is still in flight after the first chunk");
    let mut body = String::from_utf8(first.to_vec())?;
    while let Some(chunk) = stream.next().await {
        body.push_str(std::str::from_utf8(&chunk?)?);
    }
    let events = sse_data(&body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(events.len(), 30 + 2, "30 tokens, the finish chunk and [DONE]");

    // The same session key lands on the same replica whatever the prompt.
    let mut served = BTreeSet::new();
    for i in 0..6 {
        let response = http
            .post(format!("{}/v1/completions", router.url))
            .header("x-session-id", "user-42")
            .json(&json!({"prompt": format!("unrelated prompt {i}"), "max_tokens": 1}))
            .send()
            .await?;
        served.insert(response.headers()["x-fleet-replica"].to_str()?.to_owned());
    }
    assert_eq!(served.len(), 1, "{served:?}");
    Ok(())
}
