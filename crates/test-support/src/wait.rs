//! Waiting for a condition with a deadline: the only way tests wait for live systems.
//!
//! A condition is polled until it holds or the deadline passes; the error says what was
//! awaited and the last thing seen, so a failing test explains itself.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// How often a condition is re-checked.
const POLL_EVERY: Duration = Duration::from_millis(100);

/// Polls `check` until it returns `Ok(Some(value))`, or fails after `deadline`. `Ok(None)`
/// and `Err(_)` both mean "not yet"; the last error is reported on timeout.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let start = Instant::now();
    let mut last = String::from("the condition never held");
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(error) => last = format!("{error:#}"),
        }
        if start.elapsed() > deadline {
            bail!("timed out after {deadline:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}
