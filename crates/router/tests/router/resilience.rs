//! Failing replicas: health with hysteresis, retries before the first byte, death mid-stream.

use std::time::{Duration, Instant};

use anyhow::Result;
use fleet_router::RouterConfig;
use fleet_sim::ModelConfig;
use fleet_test_support::endpoints::{failing_replica, peer_recording_replica, silent_replica};
use fleet_test_support::{eventually, spawn_sim};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::support::{SimProcess, TOKEN, chat, client, router, sse_data};

async fn healthy_of(http: &reqwest::Client, router: &str, url: &str) -> Result<bool> {
    let replicas: Value =
        http.get(format!("{router}/admin/replicas")).bearer_auth(TOKEN).send().await?.json().await?;
    let replica = replicas.as_array().and_then(|all| all.iter().find(|r| r["url"] == url)).cloned();
    Ok(replica.and_then(|r| r["healthy"].as_bool()).unwrap_or(false))
}

#[tokio::test]
async fn a_killed_replica_leaves_rotation_within_two_seconds_and_returns_after_restart() -> Result<()> {
    let mut sims = Vec::new();
    for _ in 0..3 {
        sims.push(SimProcess::start(0).await?);
    }
    let urls: Vec<String> = sims.iter().map(|s| s.url.clone()).collect();
    let router = router(RouterConfig {
        replicas: urls.clone(),
        admin_token: Some(TOKEN.into()),
        ..RouterConfig::default()
    })
    .await?;
    let http = client();
    let victim = sims.remove(1);
    let victim_url = victim.url.clone();
    let port = victim.kill();
    let killed_at = Instant::now();
    eventually("the killed replica out of rotation", Duration::from_secs(2), || {
        let http = http.clone();
        let (router_url, victim_url) = (router.url.clone(), victim_url.clone());
        async move { Ok((!healthy_of(&http, &router_url, &victim_url).await?).then_some(())) }
    })
    .await?;
    let out_after = killed_at.elapsed();
    assert!(out_after < Duration::from_secs(2), "{out_after:?}");

    // Meanwhile and afterwards every request is served, by the others.
    for i in 0..6 {
        let response = http
            .post(format!("{}/v1/completions", router.url))
            .json(&json!({"prompt": format!("p{i}"), "max_tokens": 1}))
            .send()
            .await?;
        assert_eq!(response.status(), 200);
        assert_ne!(response.headers()["x-fleet-replica"], victim_url.as_str());
    }

    let restarted = SimProcess::start(port).await?;
    assert_eq!(restarted.url, victim_url);
    eventually("the restarted replica back in rotation", Duration::from_secs(10), || {
        let http = http.clone();
        let (router_url, victim_url) = (router.url.clone(), victim_url.clone());
        async move { Ok(healthy_of(&http, &router_url, &victim_url).await?.then_some(())) }
    })
    .await?;
    let mut served_by_restarted = 0;
    for i in 0..6 {
        let response = http
            .post(format!("{}/v1/completions", router.url))
            .json(&json!({"prompt": format!("q{i}"), "max_tokens": 1}))
            .send()
            .await?;
        assert_eq!(response.status(), 200);
        served_by_restarted += usize::from(response.headers()["x-fleet-replica"] == victim_url.as_str());
    }
    assert_eq!(served_by_restarted, 2, "round robin over three replicas again");
    Ok(())
}

#[tokio::test]
async fn connect_failures_and_5xx_before_the_first_byte_are_retried_elsewhere() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let dead = fleet_test_support::endpoints::unreachable_url().await?;
    let failing_endpoint = failing_replica().await?;
    let failing = failing_endpoint.url();
    let model = fleet_sim::DEFAULT_MODEL;
    let router = router(RouterConfig {
        replicas: vec![
            format!("{dead},model={model}"),
            format!("{failing},model={model}"),
            sim.urls()[0].clone(),
        ],
        admin_token: Some(TOKEN.into()),
        ..RouterConfig::default()
    })
    .await?;
    let http = client();
    for i in 0..9 {
        let response = http
            .post(format!("{}/v1/chat/completions", router.url))
            .json(&chat("sys", &format!("q{i}"), 2, i % 2 == 0))
            .send()
            .await?;
        assert_eq!(response.status(), 200, "request {i}");
        assert_eq!(response.headers()["x-fleet-replica"], sim.urls()[0].as_str());
        response.bytes().await?;
    }
    let metrics = http.get(format!("{}/metrics", router.url)).send().await?.text().await?;
    let retries: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("fleet_router_retries_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(retries >= 2, "{metrics}");
    // The retried decisions list their attempts.
    let decisions = router.admin_get(&http, "/admin/decisions?limit=9").await?;
    assert!(
        decisions.as_array().unwrap().iter().any(|d| d["attempts"].as_array().is_some_and(|a| a.len() >= 2))
    );

    // With attempts capped at 1 and only failing replicas, the client gets a clear 502.
    let only_failing = router_with_attempts(vec![format!("{failing},model=m")], 1).await?;
    let response = http
        .post(format!("{}/v1/completions", only_failing.url))
        .json(&json!({"model": "m", "prompt": "x"}))
        .send()
        .await?;
    assert_eq!(response.status(), 502);
    let body: Value = response.json().await?;
    assert!(body["error"]["message"].as_str().unwrap().contains("500"), "{body}");
    Ok(())
}

async fn router_with_attempts(
    replicas: Vec<String>,
    max_attempts: usize,
) -> Result<crate::support::TestRouter> {
    router(RouterConfig { replicas, max_attempts, ..RouterConfig::default() }).await
}

#[tokio::test]
async fn a_replica_dying_mid_stream_ends_the_stream_with_an_error_event() -> Result<()> {
    let sim = SimProcess::start(0).await?;
    let router = router(RouterConfig { replicas: vec![sim.url.clone()], ..RouterConfig::default() }).await?;
    let http = client();
    let response = http
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&chat("sys", "tell me a long story", 2000, true))
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let mut body = String::from_utf8(stream.next().await.expect("a first chunk")?.to_vec())?;
    sim.kill();
    let rest = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(chunk) => body.push_str(std::str::from_utf8(&chunk)?),
                Err(error) => {
                    anyhow::bail!("the client's stream broke instead of ending with an event: {error}")
                }
            }
        }
        Ok(body)
    })
    .await
    .map_err(|_| anyhow::anyhow!("the stream hung after its replica died"))??;
    let events = sse_data(&rest);
    let last: Value = serde_json::from_str(events.last().expect("events"))?;
    assert_eq!(last["error"]["type"], "upstream_error", "{rest}");
    assert!(events.len() < 2000, "the stream ended early");
    let metrics = http.get(format!("{}/metrics", router.url)).send().await?.text().await?;
    assert!(metrics.contains("fleet_router_stream_errors_total 1"), "{metrics}");
    Ok(())
}

#[tokio::test]
async fn a_replica_silent_for_the_read_timeout_is_given_up_never_waited_on_forever() -> Result<()> {
    let silent_endpoint = silent_replica().await?;
    let silent = silent_endpoint.url();
    let router = router(RouterConfig {
        replicas: vec![format!("{silent},model=m")],
        read_timeout: Duration::from_millis(300),
        max_attempts: 1,
        ..RouterConfig::default()
    })
    .await?;
    let http = client();
    let deadline = Duration::from_secs(10);

    // Silent before its answer: the client gets a 502 that names the timeout.
    let response = tokio::time::timeout(
        deadline,
        http.post(format!("{}/v1/completions", router.url))
            .json(&json!({"model": "m", "prompt": "x"}))
            .send(),
    )
    .await
    .map_err(|_| anyhow::anyhow!("the router waited on a silent replica"))??;
    assert_eq!(response.status(), 502);
    let body: Value = response.json().await?;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no answer for 300 ms"), "{body}");

    // Silent mid-stream: the stream ends with the router's error event.
    let mut request = chat("sys", "q", 50, true);
    request["model"] = json!("m");
    let response = http.post(format!("{}/v1/chat/completions", router.url)).json(&request).send().await?;
    assert_eq!(response.status(), 200);
    let text = tokio::time::timeout(deadline, response.text())
        .await
        .map_err(|_| anyhow::anyhow!("the stream hung on a silent replica"))??;
    let events = sse_data(&text);
    assert_eq!(events.len(), 2, "{text}");
    let last: Value = serde_json::from_str(&events[1])?;
    assert_eq!(last["error"]["type"], "upstream_error", "{text}");
    assert!(last["error"]["message"].as_str().unwrap_or_default().contains("no answer for 300 ms"), "{text}");
    Ok(())
}

#[tokio::test]
async fn sequential_requests_share_one_replica_connection_streamed_or_sized() -> Result<()> {
    let replica = peer_recording_replica().await?;
    let router = router(RouterConfig {
        replicas: vec![format!("{},model=m", replica.endpoint.url())],
        ..RouterConfig::default()
    })
    .await?;
    let http = client();
    for round in 0..10 {
        let sized = http
            .post(format!("{}/v1/completions", router.url))
            .json(&json!({"model": "m", "prompt": format!("round {round}")}))
            .send()
            .await?;
        assert_eq!(sized.status(), 200);
        let answer: Value = sized.json().await?;
        assert_eq!(answer["choices"][0]["text"], "ok", "{answer}");
        let streamed = http
            .post(format!("{}/v1/chat/completions", router.url))
            .json(&json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await?;
        assert_eq!(streamed.status(), 200);
        let events = sse_data(&streamed.text().await?);
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    }
    // Each answer was read to its end before the next request, so its connection was back in the
    // pool: twenty requests, one connection (a connection per request would show twenty).
    assert_eq!(replica.connections(), 1);
    Ok(())
}

#[tokio::test]
async fn stale_idle_replica_connections_are_closed_and_replaced() -> Result<()> {
    let replica = peer_recording_replica().await?;
    let idle_timeout = Duration::from_secs(60);
    let router = router(RouterConfig {
        replicas: vec![format!("{},model=m", replica.endpoint.url())],
        upstream_idle_timeout: idle_timeout,
        ..RouterConfig::default()
    })
    .await?;
    let http = client();
    let complete = || async {
        let response = http
            .post(format!("{}/v1/completions", router.url))
            .json(&json!({"model": "m", "prompt": "hi"}))
            .send()
            .await?;
        assert_eq!(response.status(), 200);
        anyhow::Ok(response.text().await?)
    };
    complete().await?;
    let pooled = router.state.fleet.load().replicas[0].clone();
    assert_eq!(pooled.connections.idle_count(), 1, "the answer was read, its connection is back");
    // Time comes in as an argument: a sweep now keeps it, one past the idle timeout closes it.
    let now = tokio::time::Instant::now();
    assert_eq!(pooled.connections.close_idle(now), 1);
    assert_eq!(pooled.connections.close_idle(now + idle_timeout + Duration::from_secs(1)), 0);
    let metrics = http.get(format!("{}/metrics", router.url)).send().await?.text().await?;
    let gauge = format!("fleet_router_upstream_idle_connections{{replica=\"{}\"}} 0", replica.endpoint.url());
    assert!(metrics.contains(&gauge), "{metrics}");
    // The next request goes out on a new connection (the replica sees a second peer).
    complete().await?;
    assert_eq!(replica.connections(), 2);
    assert_eq!(pooled.connections.idle_count(), 1);
    Ok(())
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_cut_off() -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let router = router(RouterConfig {
        replicas: sim.urls().to_vec(),
        header_read_timeout: Duration::from_millis(300),
        ..RouterConfig::default()
    })
    .await?;
    let address = router.url.trim_start_matches("http://").to_owned();
    let mut slow = tokio::net::TcpStream::connect(&address).await?;
    // Half a request head (slowloris): the blank line that ends the headers never comes.
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n")
        .await?;
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the router kept a connection with unfinished headers open for 10 s");
    // Clients that do send their headers are still served.
    let answer = client()
        .post(format!("{}/v1/completions", router.url))
        .json(&json!({"prompt": "hello", "max_tokens": 2}))
        .send()
        .await?;
    assert_eq!(answer.status(), 200);
    Ok(())
}
