//! KV-cache events (for `kv_precise` and `weighted_scorers` with `prefix_source: kv_events`): one ZMQ SUB
//! socket per replica, decoded with `fleet-kv-events`, applied to the replica's group engine.
//!
//! Endpoints come from the replica spec (`kv=tcp://HOST:PORT`, optional `kv_replay=tcp://HOST:PORT`) or from
//! `--kv-events-port-offset` (HTTP port + offset). Hashes: a `BlockStored` with token ids is re-hashed into
//! fleet-policy's chained token scheme by an `EngineHashTranslator` (what the router computes for the same
//! prompt when it hashes tokens); without token ids, or when the parent's chain is unknown, the engine's own
//! hash is indexed as it is (right for engines that already use fleet-policy's scheme, like fleet-sim).
//!
//! Sequence numbers must rise by one. On a gap the subscriber asks the replica's replay socket (when
//! configured) for the missed batches, vLLM's protocol: send the first missing seq, read `[seq, payload]`
//! replies until the end marker. If there is no replay socket, the replay fails, the sequence goes
//! backwards (the publisher restarted: vLLM counts from 0 again), or the publisher's connection drops (its
//! process died or restarted, and events will be missed), it resyncs: it clears everything indexed for that
//! replica and its translator and continues from the next batch. A resync loses cache knowledge, never
//! correctness: the index only ever under-reports what a replica holds until new events arrive. Clearing
//! on the dropped connection matters for restarts: the restarted engine's cache is empty, and the index
//! is cleared before the first request reaches it, not when its first events arrive.
//!
//! vLLM's own block hashes (SHA-256 of a pickle of the parent hash, the block's tokens and extra keys, its
//! first parent seeded from `PYTHONHASHSEED` or a constant, or xxHash with a random per-process seed; cut to
//! 64 bits) are not reproduced: they depend on the engine's `--prefix-caching-hash-algo` and process. The
//! token ids its `BlockStored` events carry are hashed into the router's own scheme instead, so the index
//! holds the keys the router computes for a prompt whatever the engine's hash.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fleet_kv_events::{BlockHash, EventBatch, KvEvent as WireEvent, decode_batch, decode_published, replay};
use fleet_policy::{EngineHashTranslator, KvEvent, Medium};
use futures_util::StreamExt;
use zeromq::{Socket, SocketEvent, SocketRecv, SocketSend, ZmqMessage};

use crate::state::{Replica, RouterState, lock};

/// Time allowed to (re)connect or to finish a replay.
const ZMQ_TIMEOUT: Duration = Duration::from_secs(2);
/// Most batches one replay may return before the subscriber gives up and resyncs.
const MAX_REPLAY_BATCHES: usize = 100_000;

/// Subscribes to a replica's KV events until it is removed or the router stops.
pub fn spawn_subscriber(state: Arc<RouterState>, replica: Arc<Replica>) {
    let Some(endpoint) = replica.spec.kv_events.clone() else { return };
    let stop = replica.removed.clone();
    tokio::spawn(async move {
        let mut subscriber = Subscriber::new(state, replica.clone());
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = subscriber.run(&endpoint) => {}
        }
    });
}

/// One replica's subscription state.
struct Subscriber {
    state: Arc<RouterState>,
    replica: Arc<Replica>,
    translator: EngineHashTranslator,
    next_seq: Option<u64>,
}

/// What to do about a batch's sequence number.
#[derive(Debug, PartialEq, Eq)]
pub enum SeqCheck {
    /// The expected one (or the first seen).
    InOrder,
    /// Batches `from..seq` were missed.
    Gap {
        /// First missed seq.
        from: u64,
    },
    /// The batch just applied, again: skip it.
    Duplicate,
    /// The sequence went backwards further: the publisher restarted (a restarted publisher counts from 0
    /// again, and the first batches may be gone before the subscription reconnects).
    Restarted,
}

/// Classifies `seq` given the next expected one (pure, for tests).
pub fn check_seq(expected: Option<u64>, seq: u64) -> SeqCheck {
    match expected {
        None => SeqCheck::InOrder,
        Some(expected) if seq == expected => SeqCheck::InOrder,
        Some(expected) if seq > expected => SeqCheck::Gap { from: expected },
        Some(expected) if seq + 1 == expected => SeqCheck::Duplicate,
        Some(_) => SeqCheck::Restarted,
    }
}

fn medium(name: Option<&str>) -> Medium {
    match name.map(str::to_ascii_lowercase).as_deref() {
        Some("cpu") => Medium::Cpu,
        Some("disk") => Medium::Disk,
        _ => Medium::Gpu,
    }
}

impl Subscriber {
    fn new(state: Arc<RouterState>, replica: Arc<Replica>) -> Self {
        Self { state, replica, translator: EngineHashTranslator::new(), next_seq: None }
    }

    async fn run(&mut self, endpoint: &str) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let mut socket = zeromq::SubSocket::new();
            let connected = tokio::time::timeout(ZMQ_TIMEOUT, socket.connect(endpoint)).await;
            if !matches!(connected, Ok(Ok(()))) || socket.subscribe("").await.is_err() {
                tracing::debug!(replica = %self.replica.spec.url, endpoint, "KV event endpoint not reachable yet");
                tokio::time::sleep(backoff).await;
                // Capped low: a restarted engine publishes only a second or two before it serves, and events
                // published before the subscription are missed.
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
            backoff = Duration::from_millis(100);
            tracing::info!(replica = %self.replica.spec.url, endpoint, "subscribed to KV events");
            let mut monitor = socket.monitor();
            loop {
                tokio::select! {
                    received = socket.recv() => match received {
                        Ok(message) => self.on_message(&message).await,
                        Err(error) => {
                            tracing::warn!(replica = %self.replica.spec.url, %error, "KV event stream failed; reconnecting");
                            self.lost_publisher();
                            break;
                        }
                    },
                    Some(event) = monitor.next() => {
                        if let SocketEvent::Disconnected(_) = event {
                            tracing::info!(replica = %self.replica.spec.url, "KV event publisher disconnected (engine stopped or restarted); index cleared, reconnecting");
                            self.lost_publisher();
                            break;
                        }
                    }
                }
            }
        }
    }

    async fn on_message(&mut self, message: &ZmqMessage) {
        let frames: Vec<&[u8]> = message.iter().map(|frame| frame.as_ref()).collect();
        let published = match decode_published(&frames) {
            Ok(published) => published,
            Err(error) => {
                tracing::warn!(replica = %self.replica.spec.url, %error, "undecodable KV event message skipped; resyncing");
                self.resync();
                return;
            }
        };
        match check_seq(self.next_seq, published.seq) {
            SeqCheck::InOrder => {}
            SeqCheck::Duplicate => return,
            SeqCheck::Restarted => self.resync(),
            SeqCheck::Gap { from } => {
                if !self.replay(from, published.seq).await {
                    self.resync();
                }
            }
        }
        self.apply(&published.batch);
        self.next_seq = Some(published.seq + 1);
    }

    /// Fetches batches `from..until` from the replay socket and applies them; false when that failed.
    async fn replay(&mut self, from: u64, until: u64) -> bool {
        let Some(endpoint) = self.replica.spec.kv_replay.clone() else { return false };
        let fetched = tokio::time::timeout(ZMQ_TIMEOUT, fetch_replay(&endpoint, from)).await;
        let Ok(Ok(batches)) = fetched else {
            tracing::warn!(replica = %self.replica.spec.url, from, "KV event replay failed; resyncing");
            return false;
        };
        let mut expected = from;
        for (seq, batch) in batches {
            if seq >= until {
                break;
            }
            if seq != expected {
                return false;
            }
            self.apply(&batch);
            expected += 1;
        }
        expected == until
    }

    /// The publisher went away: events will be missed, and a restarted engine starts with an empty cache.
    fn lost_publisher(&mut self) {
        self.resync();
        self.next_seq = None;
    }

    /// Forgets everything indexed for this replica (after events were lost).
    fn resync(&mut self) {
        self.translator.cleared();
        self.replica.kv_resyncs.fetch_add(1, Ordering::Relaxed);
        if let Some(group) = self.state.fleet.load().groups.get(&self.replica.model) {
            let now = self.state.now_ms();
            let _ = lock(group.engine_for(self.replica.spec.role)).engine.on_kv_event(
                self.replica.id,
                &KvEvent::AllCleared { medium: None },
                now,
            );
        }
    }

    fn apply(&mut self, batch: &EventBatch) {
        let mut events = Vec::with_capacity(batch.events.len());
        for event in &batch.events {
            match event {
                WireEvent::BlockStored(stored) => {
                    let engine: Vec<u64> = stored.block_hashes.iter().map(BlockHash::as_u64).collect();
                    let translated = self.translator.stored(
                        stored.parent_block_hash.as_ref().map(BlockHash::as_u64),
                        &engine,
                        &stored.token_ids,
                        stored.block_size as usize,
                    );
                    events.push(KvEvent::Stored {
                        medium: medium(stored.medium.as_deref()),
                        block_hashes: translated.unwrap_or(engine),
                    });
                }
                WireEvent::BlockRemoved(removed) => {
                    let engine: Vec<u64> = removed.block_hashes.iter().map(BlockHash::as_u64).collect();
                    let mut ours = self.translator.removed(&engine);
                    ours.extend(engine);
                    events.push(KvEvent::Removed {
                        medium: medium(removed.medium.as_deref()),
                        block_hashes: ours,
                    });
                }
                WireEvent::AllBlocksCleared => {
                    self.translator.cleared();
                    events.push(KvEvent::AllCleared { medium: None });
                }
            }
        }
        let Some(group) = self.state.fleet.load().groups.get(&self.replica.model).cloned() else { return };
        let now = self.state.now_ms();
        let mut engine = lock(group.engine_for(self.replica.spec.role));
        for event in &events {
            if engine.engine.on_kv_event(self.replica.id, event, now).is_ok() {
                self.replica.kv_events.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Asks a replay socket for every buffered batch from `from` on.
async fn fetch_replay(endpoint: &str, from: u64) -> Result<Vec<(u64, EventBatch)>, String> {
    let mut socket = zeromq::ReqSocket::new();
    socket.connect(endpoint).await.map_err(|error| error.to_string())?;
    socket
        .send(ZmqMessage::from(replay::request_frame(from).to_vec()))
        .await
        .map_err(|error| error.to_string())?;
    let mut batches = Vec::new();
    loop {
        let reply = socket.recv().await.map_err(|error| error.to_string())?;
        let frames: Vec<&[u8]> = reply.iter().map(|frame| frame.as_ref()).collect();
        match replay::parse_reply(&frames).map_err(|error| error.to_string())? {
            replay::Reply::End => return Ok(batches),
            replay::Reply::Batch { seq, payload } => {
                batches.push((seq, decode_batch(&payload).map_err(|error| error.to_string())?));
                if batches.len() > MAX_REPLAY_BATCHES {
                    return Err("the replay is longer than the router accepts".to_owned());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_are_classified() {
        assert_eq!(check_seq(None, 7), SeqCheck::InOrder);
        assert_eq!(check_seq(Some(7), 7), SeqCheck::InOrder);
        assert_eq!(check_seq(Some(7), 9), SeqCheck::Gap { from: 7 });
        assert_eq!(check_seq(Some(7), 6), SeqCheck::Duplicate);
        assert_eq!(check_seq(Some(7), 5), SeqCheck::Restarted);
        assert_eq!(check_seq(Some(7), 0), SeqCheck::Restarted);
        assert_eq!(medium(Some("GPU")), Medium::Gpu);
        assert_eq!(medium(Some("CPU")), Medium::Cpu);
        assert_eq!(medium(None), Medium::Gpu);
    }
}
