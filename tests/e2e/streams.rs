//! Streams cut short: what a client reading an SSE stream through fleet-router sees when the replica
//! behind it dies mid-stream, shared by the real-engine tests.

use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use serde_json::Value;

/// Reads `response`'s SSE stream until three events have come, calls `kill` (the replica dies), then reads
/// the rest: the stream must end within a minute, not look finished (`[DONE]`), and end with an error event.
pub async fn kill_mid_stream_and_expect_an_error_event(
    response: reqwest::Response,
    kill: impl FnOnce(),
) -> Result<()> {
    anyhow::ensure!(response.status() == 200, "the stream did not start: {}", response.status());
    let mut stream = response.bytes_stream();
    let mut sse = String::new();
    // Some tokens arrive, then the replica dies.
    while sse.matches("data: ").count() < 3 {
        let chunk = stream.next().await.context("the stream ended before three events")??;
        sse.push_str(std::str::from_utf8(&chunk)?);
    }
    kill();
    let rest = tokio::time::timeout(Duration::from_secs(60), async {
        let mut rest = String::new();
        while let Some(Ok(bytes)) = stream.next().await {
            rest.push_str(&String::from_utf8_lossy(&bytes));
        }
        rest
    })
    .await
    .context("the client's stream hung after the replica died")?;
    anyhow::ensure!(!rest.contains("[DONE]"), "a cut stream must not look finished: {rest}");
    let last = rest.split("\n\n").filter(|e| e.starts_with("data: ")).last().unwrap_or_default();
    let event: Value =
        serde_json::from_str(last.trim_start_matches("data: ")).context(format!("last event {last:?}"))?;
    anyhow::ensure!(event["error"].is_object(), "the stream ends with an error event: {last}");
    Ok(())
}
