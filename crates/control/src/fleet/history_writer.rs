//! The history writer: scrape rounds go from the scheduler's batcher to SQLite through a bounded queue that
//! never makes scraping wait.
//!
//! A locked or slow database must not stall the scrapes (the fleet view would show old values as fresh),
//! and a failed write must not vanish into a log line. So: [`HistoryQueue::push`] never waits; when the
//! queue is full it sheds the oldest unwritten round (the newest data is worth most to an operator) and
//! counts it. The writer retries a failed round with backoff, at most [`MAX_ATTEMPTS`] times, counting every
//! failure and keeping the last error; all of it is in [`HistoryHealth`], which the fleet view shows as a
//! banner and the app's `/metrics` exports.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use fleet_store::{SampleRow, Store};
use fleetdeck_api::HistoryWriteStatus;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::lock;

/// Attempts at one round before it is given up (and counted as dropped).
pub const MAX_ATTEMPTS: u32 = 5;
/// First wait after a failed write; doubles up to [`MAX_RETRY_WAIT`].
const FIRST_RETRY_WAIT: Duration = Duration::from_millis(250);
const MAX_RETRY_WAIT: Duration = Duration::from_secs(5);

/// One round waiting to be written, with the attempts made so far.
#[derive(Debug)]
struct Pending {
    rows: Vec<SampleRow>,
    attempts: u32,
}

#[derive(Debug, Default)]
struct State {
    rounds: VecDeque<Pending>,
    written_rounds: u64,
    shed_rounds: u64,
    failed_writes: u64,
    dropped_rounds: u64,
    last_error: Option<(i64, String)>,
    /// The last attempt failed (cleared by the next good write).
    failing: bool,
}

/// The bounded queue between the batchers and the writer, and the writer's counters.
#[derive(Debug)]
pub struct HistoryQueue {
    state: Mutex<State>,
    capacity: usize,
    ready: Notify,
    /// The database file, shown with the counters.
    db_path: String,
}

/// A copy of the counters.
pub type HistoryHealth = HistoryWriteStatus;

impl HistoryQueue {
    pub fn new(capacity: usize, db_path: String) -> Self {
        Self { state: Mutex::default(), capacity: capacity.max(1), ready: Notify::new(), db_path }
    }

    /// Queues a round without waiting; when the queue is full the oldest unwritten round is shed.
    pub fn push(&self, rows: Vec<SampleRow>) {
        if rows.is_empty() {
            return;
        }
        {
            let mut state = lock(&self.state);
            while state.rounds.len() >= self.capacity {
                state.rounds.pop_front();
                state.shed_rounds += 1;
            }
            state.rounds.push_back(Pending { rows, attempts: 0 });
        }
        self.ready.notify_one();
    }

    /// Counts a round that never reached the queue (a source's readings the batcher had no room for) as
    /// shed: it is lost for the same reason, a writer that fell behind.
    pub fn count_dropped_source_round(&self) {
        lock(&self.state).shed_rounds += 1;
    }

    /// The counters as the fleet view shows them.
    pub fn health(&self) -> HistoryHealth {
        let state = lock(&self.state);
        HistoryWriteStatus {
            db_path: self.db_path.clone(),
            pending_rounds: state.rounds.len() as u64,
            written_rounds: state.written_rounds,
            shed_rounds: state.shed_rounds,
            failed_writes: state.failed_writes,
            dropped_rounds: state.dropped_rounds,
            last_error: state.last_error.as_ref().map(|(_, e)| e.clone()),
            last_error_ms: state.last_error.as_ref().map(|(at, _)| *at),
            failing: state.failing,
            scrape_observations_dropped: 0,
        }
    }

    async fn next(&self) -> Pending {
        loop {
            let notified = self.ready.notified();
            if let Some(round) = lock(&self.state).rounds.pop_front() {
                return round;
            }
            notified.await;
        }
    }

    /// Writes rounds in order until `cancel` fires, retrying failures with backoff.
    pub async fn run(&self, store: Store, cancel: CancellationToken) {
        let mut wait = FIRST_RETRY_WAIT;
        loop {
            let mut round = tokio::select! {
                () = cancel.cancelled() => return,
                round = self.next() => round,
            };
            round.attempts += 1;
            match store.insert_samples(&round.rows).await {
                Ok(()) => {
                    let mut state = lock(&self.state);
                    state.written_rounds += 1;
                    state.failing = false;
                    wait = FIRST_RETRY_WAIT;
                }
                Err(error) => {
                    let message = error.to_string();
                    tracing::error!(
                        error = %message,
                        rows = round.rows.len(),
                        attempt = round.attempts,
                        "could not store a scrape round; retrying"
                    );
                    {
                        let mut state = lock(&self.state);
                        state.failed_writes += 1;
                        state.failing = true;
                        state.last_error = Some((crate::fleet::unix_ms_now(), message));
                        if round.attempts >= MAX_ATTEMPTS {
                            state.dropped_rounds += 1;
                        } else if state.rounds.len() >= self.capacity {
                            // Newer rounds fill the queue: this one is the oldest unwritten, so it goes.
                            state.shed_rounds += 1;
                        } else {
                            state.rounds.push_front(round);
                        }
                    }
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(MAX_RETRY_WAIT);
                }
            }
        }
    }

    /// The counters in Prometheus text format.
    pub fn render_metrics(&self, out: &mut String) {
        let h = self.health();
        let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"));
        };
        metric(
            "fleetdeck_history_rounds_written_total",
            "counter",
            "Scrape rounds stored.",
            h.written_rounds,
        );
        metric(
            "fleetdeck_history_rounds_shed_total",
            "counter",
            "Unwritten scrape rounds dropped, oldest first, because the writer's queue was full.",
            h.shed_rounds,
        );
        metric(
            "fleetdeck_history_write_failures_total",
            "counter",
            "Failed attempts to store a scrape round (each is retried).",
            h.failed_writes,
        );
        metric(
            "fleetdeck_history_rounds_dropped_total",
            "counter",
            "Scrape rounds given up after every retry failed.",
            h.dropped_rounds,
        );
        metric(
            "fleetdeck_history_queue_rounds",
            "gauge",
            "Scrape rounds waiting to be stored.",
            h.pending_rounds,
        );
        metric("fleetdeck_history_failing", "gauge", "1 while the last write failed.", u64::from(h.failing));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(ts: i64) -> Vec<SampleRow> {
        vec![SampleRow { url: "http://r".into(), ts_ms: ts, ..SampleRow::default() }]
    }

    #[test]
    fn a_full_queue_sheds_its_oldest_rounds_and_counts_them() {
        let queue = HistoryQueue::new(3, "h.sqlite".into());
        for ts in 0..5 {
            queue.push(round(ts));
        }
        queue.push(Vec::new());
        let health = queue.health();
        assert_eq!((health.pending_rounds, health.shed_rounds), (3, 2));
        let kept: Vec<i64> = lock(&queue.state).rounds.iter().map(|p| p.rows[0].ts_ms).collect();
        assert_eq!(kept, [2, 3, 4], "the newest rounds stay");
        let mut text = String::new();
        queue.render_metrics(&mut text);
        assert!(text.contains("fleetdeck_history_rounds_shed_total 2"), "{text}");
        assert!(text.contains("fleetdeck_history_queue_rounds 3"), "{text}");
    }
}
