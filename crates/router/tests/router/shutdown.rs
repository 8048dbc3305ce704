//! Shutting down: requests in flight finish (SIGTERM to the real binary), and the grace bounds the wait.

use std::time::Duration;

use anyhow::{Context, Result};
use fleet_router::RouterConfig;
use fleet_test_support::endpoints::{gated_replica, silent_replica};
use fleet_test_support::eventually;
use fleet_test_support::process::{bin_path, spawn_and_await_line};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::client;

/// Bounds every wait below, so a broken shutdown fails the test instead of hanging it.
const HANG_GUARD: Duration = Duration::from_secs(20);

#[tokio::test]
async fn sigterm_lets_the_request_in_flight_finish_then_the_router_exits_cleanly() -> Result<()> {
    let replica = gated_replica().await?;
    let args: Vec<String> = ["--listen", "127.0.0.1:0", "--replica", &replica.endpoint.url()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (mut router, line) =
        spawn_and_await_line(&bin_path("fleet-router")?, &args, &[], "fleet-router listening on", HANG_GUARD)
            .await?;
    let url = line.split_whitespace().next().context("no URL in the router's line")?.to_owned();
    let http = client();
    let in_flight = tokio::spawn({
        let http = http.clone();
        let url = url.clone();
        async move {
            let response =
                http.post(format!("{url}/v1/completions")).json(&json!({"prompt": "hold on"})).send().await?;
            anyhow::Ok((response.status(), response.json::<Value>().await?))
        }
    });
    tokio::time::timeout(HANG_GUARD, replica.arrived())
        .await
        .context("the request never reached the replica")?;

    let pid = router.child.id().context("the router has no pid")?;
    let killed = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status()?;
    assert!(killed.success());
    // The answer is let through only once the router has stopped accepting, so the request was in
    // flight when the shutdown began.
    let address = url.trim_start_matches("http://").to_owned();
    eventually("the router to refuse new connections", HANG_GUARD, || {
        let address = address.clone();
        async move { Ok(tokio::net::TcpStream::connect(&address).await.is_err().then_some(())) }
    })
    .await?;
    replica.open();

    let (status, body) = tokio::time::timeout(HANG_GUARD, in_flight).await???;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], "after the gate", "the answer came through whole");
    let exit = tokio::time::timeout(HANG_GUARD, router.child.wait()).await??;
    assert!(exit.success(), "a SIGTERM is a clean stop, not a kill: {exit}");
    Ok(())
}

#[tokio::test]
async fn a_stream_still_running_after_the_grace_is_cut_off() -> Result<()> {
    let replica = silent_replica().await?;
    let listener = fleet_test_support::loopback_listener().await?;
    let url = format!("http://{}", listener.local_addr()?);
    let stop = CancellationToken::new();
    let config = RouterConfig {
        replicas: vec![replica.url()],
        shutdown_grace: Duration::from_millis(200),
        ..RouterConfig::default()
    };
    let (_state, server) = fleet_router::start(listener, config, stop.clone().cancelled_owned()).await?;
    let response = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let first = tokio::time::timeout(HANG_GUARD, body.next()).await?.context("no first event")??;
    assert!(first.starts_with(b"data:"), "the stream is under way");

    // The replica never sends another byte (and the read timeout is two minutes): only the grace ends it.
    stop.cancel();
    tokio::time::timeout(HANG_GUARD, server).await.context("the server outlived its grace")???;
    let rest = tokio::time::timeout(HANG_GUARD, async {
        let mut rest = Vec::new();
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(bytes) => rest.extend_from_slice(&bytes),
                Err(_) => break,
            }
        }
        rest
    })
    .await
    .context("the client's stream was left hanging")?;
    assert!(!rest.windows(6).any(|w| w == b"[DONE]"), "the stream was cut, not finished");
    Ok(())
}
