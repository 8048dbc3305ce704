//! Watching etcd until shutdown, one session after another: what the policy watcher (`etcd_policy.rs`) and
//! the shared-load watcher (`peer_load.rs`) both do, written once, with the backoff both share with the
//! shared-load publisher.
//!
//! A session reads what it watches, then watches it from the next revision until etcd ends the stream, the
//! connection drops or a call fails. Then the watcher is told why and the next session starts after a wait
//! that doubles from 100 ms to 2 s, back to 100 ms once a session is watching again. [`Connection`] keeps
//! each one's last outcome for `/admin/state`.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fleet_etcd::EtcdError;
use tokio_util::sync::CancellationToken;

use crate::state::lock;

/// Longest error text kept for `/admin/state`.
const MAX_ERROR_CHARS: usize = 300;

/// Whether a watcher's (or a publisher's) last call to etcd succeeded, and its last error, for
/// `/admin/state` and `/metrics`.
#[derive(Debug, Default)]
pub struct Connection {
    connected: AtomicBool,
    last_error: Mutex<Option<String>>,
}

impl Connection {
    /// Records the last call's outcome: `None` when it succeeded (the error is cleared).
    pub fn set_error(&self, error: Option<String>) {
        self.connected.store(error.is_none(), Ordering::Relaxed);
        *lock(&self.last_error) = error.map(|e| e.chars().take(MAX_ERROR_CHARS).collect());
    }

    /// Whether the last call succeeded (false before the first).
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// The last call's error, if it failed.
    pub fn error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }
}

/// The wait before the next attempt to reach etcd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff(Duration);

impl Backoff {
    /// First wait after a failure.
    pub const FIRST: Duration = Duration::from_millis(100);
    /// Longest wait between two attempts.
    pub const MAX: Duration = Duration::from_secs(2);

    /// The first wait.
    pub fn new() -> Self {
        Self(Self::FIRST)
    }

    /// The wait now.
    pub fn wait(self) -> Duration {
        self.0
    }

    /// Back to the first wait (etcd answered).
    pub fn reset(&mut self) {
        self.0 = Self::FIRST;
    }

    /// Twice the wait, at most [`Backoff::MAX`] (etcd failed again).
    pub fn grow(&mut self) {
        self.0 = (self.0 * 2).min(Self::MAX);
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// Something that watches etcd in sessions (see the module docs).
pub trait Sessions: Send + Sync {
    /// One session; resets `backoff` once it is watching. Ends with the reason the watch stopped, or an
    /// error.
    fn session(&self, backoff: &mut Backoff) -> impl Future<Output = Result<String, EtcdError>> + Send;

    /// A session ended for `reason`; the next starts in `retry_in` (log it, show it).
    fn ended(&self, reason: String, retry_in: Duration);
}

/// Runs `watcher`'s sessions until `shutdown` fires.
pub async fn run(shutdown: &CancellationToken, watcher: &impl Sessions) {
    let mut backoff = Backoff::new();
    loop {
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return,
            outcome = watcher.session(&mut backoff) => outcome,
        };
        let reason = match outcome {
            Ok(reason) => reason,
            Err(error) => error.to_string(),
        };
        watcher.ended(reason, backoff.wait());
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff.wait()) => {}
        }
        backoff.grow();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_to_its_cap_and_resets() {
        let mut backoff = Backoff::new();
        let mut waits = Vec::new();
        for _ in 0..7 {
            waits.push(backoff.wait().as_millis());
            backoff.grow();
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000]);
        backoff.reset();
        assert_eq!(backoff.wait(), Backoff::FIRST);
    }
}
