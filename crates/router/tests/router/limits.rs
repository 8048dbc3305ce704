//! The router's own refusals: a client trickling its body is cut off while others are served, the
//! connection cap answers 503 at once, each refusal is counted in `/metrics`, and every answer the
//! router makes itself carries `x-fleet-request-id`.

use std::time::Duration;

use anyhow::{Context, Result};
use fleet_router::RouterConfig;
use fleet_router::metrics::Refusal;
use fleet_sim::ModelConfig;
use fleet_test_support::{eventually, spawn_sim};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{TOKEN, client, router};

/// Reads what the router sends on `stream` until it closes the connection, within `deadline`.
async fn read_until_closed(stream: &mut TcpStream, deadline: Duration) -> Result<String> {
    let mut answer = Vec::new();
    tokio::time::timeout(deadline, stream.read_to_end(&mut answer))
        .await
        .context("the router kept the connection open")??;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

#[tokio::test]
async fn a_client_trickling_its_body_is_cut_off_while_others_are_served() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let router = router(RouterConfig {
        replicas: sim.urls().to_vec(),
        admin_token: Some(TOKEN.into()),
        body_read_timeout: Duration::from_millis(500),
        ..RouterConfig::default()
    })
    .await?;
    let addr = router.url.trim_start_matches("http://").to_owned();

    // The headers and a few bytes of a 1,000-byte body, then nothing more.
    let mut slow = TcpStream::connect(&addr).await?;
    slow.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n\
          content-length: 1000\r\n\r\n{\"prompt\": \"",
    )
    .await?;

    // Meanwhile other clients are served as usual.
    let http = client();
    for i in 0..5 {
        let body = json!({"prompt": format!("a quick question {i}"), "max_tokens": 2});
        let answer = http.post(format!("{}/v1/completions", router.url)).json(&body).send().await?;
        assert_eq!(answer.status(), 200);
    }

    let answer = read_until_closed(&mut slow, Duration::from_secs(10)).await?;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("--body-read-timeout-s"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("x-fleet-request-id:"), "{answer}");
    assert_eq!(router.state.metrics.refusals(Refusal::BodyReadTimeout), 1);
    let metrics = http.get(format!("{}/metrics", router.url)).send().await?.text().await?;
    assert!(metrics.contains("fleet_router_refused_total{reason=\"body_read_timeout\"} 1"), "{metrics}");
    Ok(())
}

#[tokio::test]
async fn connections_over_the_cap_are_answered_503_and_counted() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let router =
        router(RouterConfig { replicas: sim.urls().to_vec(), max_connections: 2, ..RouterConfig::default() })
            .await?;
    let addr = router.url.trim_start_matches("http://").to_owned();

    // Two idle connections take both places (each is proven open by a request answered on it).
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(&addr).await?;
        stream.write_all(b"GET /v1/models HTTP/1.1\r\nhost: router\r\n\r\n").await?;
        let mut first = [0u8; 12];
        stream.read_exact(&mut first).await?;
        assert_eq!(&first, b"HTTP/1.1 200");
        held.push(stream);
    }
    let mut third = TcpStream::connect(&addr).await?;
    let answer = read_until_closed(&mut third, Duration::from_secs(10)).await?;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("--max-connections") && answer.contains("x-fleet-request-id:"), "{answer}");
    assert_eq!(router.state.metrics.refusals(Refusal::ConnectionLimit), 1);

    // A place freed is a place taken: the next client is served.
    drop(held.pop());
    let http = client();
    let served = eventually("a connection to be served again", Duration::from_secs(10), || async {
        Ok(http.get(format!("{}/v1/models", router.url)).send().await.ok().filter(|r| r.status() == 200))
    })
    .await?;
    assert!(served.headers().contains_key("x-fleet-request-id"));
    Ok(())
}

#[tokio::test]
async fn a_client_behind_a_flood_of_idle_sockets_reads_its_refusal_cleanly() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let router =
        router(RouterConfig { replicas: sim.urls().to_vec(), max_connections: 2, ..RouterConfig::default() })
            .await?;
    let addr = router.url.trim_start_matches("http://").to_owned();
    // Far more idle sockets than the cap and than the refusals kept in progress: the oldest are closed.
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(TcpStream::connect(&addr).await?);
    }
    // The newest connection is a real HTTP client's: it must read a 503 with a JSON body, never a
    // connection error (an answer written before its request, or reset away by a close).
    for attempt in 0..3 {
        let answer = client()
            .get(format!("{}/v1/models", router.url))
            .send()
            .await
            .with_context(|| format!("attempt {attempt}: the refusal did not reach the client"))?;
        assert_eq!(answer.status(), 503);
        let body: serde_json::Value = answer.json().await?;
        assert_eq!(body["error"]["code"], 503, "{body}");
    }
    drop(idle);
    Ok(())
}

#[tokio::test]
async fn the_routers_own_error_answers_carry_a_request_id() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let router = router(RouterConfig {
        replicas: sim.urls().to_vec(),
        admin_token: Some(TOKEN.into()),
        max_body_bytes: 1024,
        ..RouterConfig::default()
    })
    .await?;
    let http = client();
    let url = &router.url;
    let cases = [
        (http.post(format!("{url}/v1/completions")).body("{not json"), 400),
        (http.post(format!("{url}/v1/completions")).json(&json!({"model": "nope", "prompt": "x"})), 404),
        (http.post(format!("{url}/v1/completions")).body("x".repeat(4096)), 413),
        (http.get(format!("{url}/no/such/route")), 404),
        (http.get(format!("{url}/admin/state")), 401),
        (http.get(format!("{url}/metrics")), 200),
    ];
    let mut ids = Vec::new();
    for (request, status) in cases {
        let answer = request.send().await?;
        assert_eq!(answer.status(), status, "{}", answer.url());
        let id =
            answer.headers().get("x-fleet-request-id").with_context(|| format!("no id on a {status}"))?;
        ids.push(id.to_str()?.parse::<u64>()?);
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 6, "every answer has its own id");
    assert_eq!(router.state.metrics.refusals(Refusal::BodyTooLarge), 1);
    Ok(())
}
