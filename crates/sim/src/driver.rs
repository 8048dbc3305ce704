//! The per-replica task that runs the engine model on the wall clock.
//!
//! One tokio task owns one [`EngineModel`]: it sleeps until the step in flight ends, commits it,
//! and fans the engine's events out: tokens to the request's stream, KV events to the publisher,
//! latencies into the replica's metrics. HTTP handlers talk to it only through a channel
//! ([`DriverHandle::submit`]), so the model itself stays single-threaded and pure.
//!
//! Virtual time is microseconds since the driver started. Metrics use the engine's event times
//! (what a GPU would have measured), streams deliver at the wall time the driver wakes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleet_kv_events as wire;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::{
    AddError, EngineConfig, EngineEvent, EngineModel, EngineRequest, FinishReason, KvEventKind, Micros,
    Prompt, RemoteKv,
};
use crate::exposition::ReplicaMetrics;

/// What a request's stream receives from the engine.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// The prefill finished: the first token exists. `cached_tokens` is what `usage` reports.
    FirstToken { cached_tokens: u32 },
    /// Output token `index` (1-based after the first, which is index 0) was sampled.
    Token { index: u32 },
    /// The request left the engine.
    Finished { reason: FinishReason, prompt_tokens: u32, output_tokens: u32, cached_tokens: u32 },
}

/// A request the engine refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    Engine(#[from] AddError),
    #[error("the replica is shutting down")]
    Stopped,
}

enum Command {
    Add {
        request: EngineRequest,
        events: mpsc::UnboundedSender<StreamEvent>,
        accepted: tokio::sync::oneshot::Sender<Result<(), AddError>>,
    },
    Abort {
        id: u64,
    },
    ResetPrefixCache {
        done: tokio::sync::oneshot::Sender<bool>,
    },
    ReleaseHeld {
        id: u64,
        done: tokio::sync::oneshot::Sender<bool>,
    },
}

/// The disaggregated-serving part of a submission: hold the blocks when done (prefill side), or pull the
/// prompt's KV first (decode side).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PdOptions {
    /// Prefill side: keep the finished request's blocks held this long, in microseconds.
    pub hold_for: Option<Micros>,
    /// Decode side: the prompt's KV comes from a prefill replica.
    pub remote: Option<RemoteKv>,
}

/// The handlers' side of a driver.
#[derive(Debug)]
pub struct DriverHandle {
    commands: mpsc::UnboundedSender<Command>,
    next_id: AtomicU64,
    metrics: Arc<Mutex<ReplicaMetrics>>,
    config: EngineConfig,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Add { request, .. } => write!(f, "Add({})", request.id),
            Command::Abort { id } => write!(f, "Abort({id})"),
            Command::ResetPrefixCache { .. } => f.write_str("ResetPrefixCache"),
            Command::ReleaseHeld { id, .. } => write!(f, "ReleaseHeld({id})"),
        }
    }
}

/// A submitted request: its event stream. Dropping it before `Finished` aborts the request in
/// the engine (the client went away), which frees its slot and blocks.
#[derive(Debug)]
pub struct RequestStream {
    pub id: u64,
    pub events: mpsc::UnboundedReceiver<StreamEvent>,
    commands: mpsc::UnboundedSender<Command>,
    finished: bool,
}

impl RequestStream {
    /// The next event, `None` if the driver stopped.
    pub async fn next(&mut self) -> Option<StreamEvent> {
        let event = self.events.recv().await;
        if matches!(event, Some(StreamEvent::Finished { .. }) | None) {
            self.finished = true;
        }
        event
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.commands.send(Command::Abort { id: self.id });
        }
    }
}

impl DriverHandle {
    /// Queues a request; resolves once the engine accepted or refused it.
    pub async fn submit(&self, prompt: Prompt, max_output_tokens: u32) -> Result<RequestStream, SubmitError> {
        self.submit_pd(prompt, max_output_tokens, PdOptions::default()).await
    }

    /// Queues a request with its disaggregated-serving options.
    pub async fn submit_pd(
        &self,
        prompt: Prompt,
        max_output_tokens: u32,
        pd: PdOptions,
    ) -> Result<RequestStream, SubmitError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (events_tx, events) = mpsc::unbounded_channel();
        let (accepted_tx, accepted) = tokio::sync::oneshot::channel();
        let request = EngineRequest {
            hold_for: pd.hold_for,
            remote: pd.remote,
            ..EngineRequest::new(id, prompt, max_output_tokens)
        };
        self.commands
            .send(Command::Add { request, events: events_tx, accepted: accepted_tx })
            .map_err(|_| SubmitError::Stopped)?;
        accepted.await.map_err(|_| SubmitError::Stopped)??;
        Ok(RequestStream { id, events, commands: self.commands.clone(), finished: false })
    }

    /// Drops every cached prefix if no request holds blocks (vLLM's `/reset_prefix_cache`).
    pub async fn reset_prefix_cache(&self) -> Result<bool, SubmitError> {
        let (done, result) = tokio::sync::oneshot::channel();
        self.commands.send(Command::ResetPrefixCache { done }).map_err(|_| SubmitError::Stopped)?;
        result.await.map_err(|_| SubmitError::Stopped)
    }

    /// Prefill side: frees the blocks held for request `id` (the decode side pulled them). False when
    /// nothing is held under `id` (unknown, already pulled, or the lease ran out).
    pub async fn release_held(&self, id: u64) -> Result<bool, SubmitError> {
        let (done, result) = tokio::sync::oneshot::channel();
        self.commands.send(Command::ReleaseHeld { id, done }).map_err(|_| SubmitError::Stopped)?;
        result.await.map_err(|_| SubmitError::Stopped)
    }

    /// The replica's metrics, locked for reading (render and release quickly).
    pub fn metrics(&self) -> MutexGuard<'_, ReplicaMetrics> {
        lock(&self.metrics)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The driver never panics while holding the lock in a way that leaves counters worth
    // refusing service for; a poisoned lock is taken over.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Starts the driver task for one replica. `kv_out` receives one batch per engine step that
/// produced KV events (only when `config.kv_events`); `rank` is its `data_parallel_rank`.
pub fn spawn(
    config: EngineConfig,
    metrics: ReplicaMetrics,
    rank: u32,
    kv_out: Option<mpsc::Sender<wire::EventBatch>>,
    shutdown: CancellationToken,
) -> Result<Arc<DriverHandle>, crate::engine::ConfigError> {
    let engine = EngineModel::new(config.clone())?;
    let (commands, rx) = mpsc::unbounded_channel();
    let metrics = Arc::new(Mutex::new(metrics));
    let handle =
        Arc::new(DriverHandle { commands, next_id: AtomicU64::new(1), metrics: metrics.clone(), config });
    let driver = Driver {
        engine,
        start: Instant::now(),
        live: HashMap::new(),
        metrics,
        kv_out,
        kv_batch: Vec::new(),
        rank,
        tokens_seen: 0,
    };
    tokio::spawn(driver.run(rx, shutdown));
    Ok(handle)
}

/// What the driver remembers of a live request to time it the way vLLM does.
struct Live {
    events: mpsc::UnboundedSender<StreamEvent>,
    arrived_at: Micros,
    scheduled_at: Option<Micros>,
    first_token_at: Option<Micros>,
    last_token_at: Micros,
    max_tokens: u32,
}

struct Driver {
    engine: EngineModel,
    start: Instant,
    live: HashMap<u64, Live>,
    metrics: Arc<Mutex<ReplicaMetrics>>,
    kv_out: Option<mpsc::Sender<wire::EventBatch>>,
    kv_batch: Vec<wire::KvEvent>,
    rank: u32,
    /// Prompt + generation tokens at the last wake-up, for `iteration_tokens_total`.
    tokens_seen: u64,
}

impl Driver {
    fn now(&self) -> Micros {
        self.start.elapsed().as_micros() as Micros
    }

    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>, shutdown: CancellationToken) {
        loop {
            let deadline = self.engine.next_step_at().map(|at| self.start + Duration::from_micros(at));
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                command = commands.recv() => {
                    let Some(command) = command else { break };
                    let now = self.now();
                    let mut sink = Sink::new(&mut self.live, &mut self.kv_batch);
                    self.engine.advance_to(now, &mut |e| sink.on(e));
                    sink.flush(&self.metrics);
                    self.apply(command, now);
                    // Take whatever else is queued in the same wake-up.
                    while let Ok(command) = commands.try_recv() {
                        self.apply(command, now);
                    }
                }
                () = sleep_until(deadline) => {
                    let now = self.now();
                    let mut sink = Sink::new(&mut self.live, &mut self.kv_batch);
                    self.engine.advance_to(now, &mut |e| sink.on(e));
                    sink.flush(&self.metrics);
                }
            }
            self.publish_stats();
            self.flush_kv();
        }
        // Streams still open see their channel close; handlers end them with an error event.
        self.live.clear();
    }

    fn apply(&mut self, command: Command, now: Micros) {
        match command {
            Command::Add { request, events, accepted } => {
                let id = request.id;
                let max_tokens = request.max_output_tokens;
                self.live.insert(
                    id,
                    Live {
                        events,
                        arrived_at: now,
                        scheduled_at: None,
                        first_token_at: None,
                        last_token_at: now,
                        max_tokens,
                    },
                );
                let mut sink = Sink::new(&mut self.live, &mut self.kv_batch);
                let result = self.engine.add_request(request, now, &mut |e| sink.on(e));
                sink.flush(&self.metrics);
                if result.is_err() {
                    self.live.remove(&id);
                }
                let _ = accepted.send(result);
            }
            Command::Abort { id } => {
                let mut sink = Sink::new(&mut self.live, &mut self.kv_batch);
                self.engine.abort(id, now, &mut |e| sink.on(e));
                sink.flush(&self.metrics);
            }
            Command::ResetPrefixCache { done } => {
                let mut sink = Sink::new(&mut self.live, &mut self.kv_batch);
                let reset = self.engine.reset_prefix_cache(now, &mut |e| sink.on(e));
                sink.flush(&self.metrics);
                let _ = done.send(reset);
            }
            Command::ReleaseHeld { id, done } => {
                let mut sink = Sink::new(&mut self.live, &mut self.kv_batch);
                let released = self.engine.release_held(id, now, &mut |e| sink.on(e));
                sink.flush(&self.metrics);
                let _ = done.send(released);
            }
        }
    }

    /// Copies the engine's gauges and counters into the metrics `/metrics` renders.
    fn publish_stats(&mut self) {
        let stats = self.engine.stats();
        let mut m = lock(&self.metrics);
        m.running = stats.running;
        m.waiting = stats.waiting;
        m.kv_usage = stats.kv_usage();
        m.used_blocks = stats.used_blocks;
        m.num_gpu_blocks = stats.num_gpu_blocks;
        m.prefix_queries_tokens = stats.prefix_cache_queries_tokens;
        m.prefix_hits_tokens = stats.prefix_cache_hits_tokens;
        m.prompt_tokens = stats.prompt_tokens;
        m.generation_tokens = stats.generation_tokens;
        m.preemptions = stats.preemptions;
        m.finished_length = stats.finished_length;
        m.finished_abort = stats.finished_abort;
        m.finished_error = stats.finished_error;
        m.kv_loading = stats.loading;
        m.kv_held = stats.held;
        m.kv_expired_holds = stats.kv_expired_holds;
        // One observation per wake-up that computed tokens: a step, or a few when the driver lagged.
        let tokens = stats.computed_prefill_tokens + stats.generation_tokens;
        if tokens > self.tokens_seen {
            m.iteration_tokens.observe((tokens - self.tokens_seen) as f64);
            self.tokens_seen = tokens;
        }
    }

    fn flush_kv(&mut self) {
        if self.kv_batch.is_empty() {
            return;
        }
        let events = std::mem::take(&mut self.kv_batch);
        let Some(out) = &self.kv_out else { return };
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        let batch = wire::EventBatch { ts, events, data_parallel_rank: Some(i64::from(self.rank)) };
        if out.try_send(batch).is_err() {
            // The publisher is behind (a stalled subscriber) or gone: drop rather than stall the
            // engine. Subscribers see no gap because sequence numbers are assigned at publish.
            tracing::warn!(rank = self.rank, "KV event publisher is behind; dropped one batch");
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Routes engine events during one engine call; metrics observations are collected and applied
/// under one lock at the end.
struct Sink<'a> {
    live: &'a mut HashMap<u64, Live>,
    kv_batch: &'a mut Vec<wire::KvEvent>,
    observations: Vec<Observation>,
}

enum Observation {
    Queue(f64),
    Ttft(f64),
    Itl(f64),
    /// A KV transfer ended (decode side).
    Transfer {
        seconds: f64,
        bytes: u64,
        blocks: u32,
        failed: bool,
    },
    Finished {
        e2e: f64,
        inference: f64,
        prefill: f64,
        decode: f64,
        tpot: Option<f64>,
        prompt: u32,
        output: u32,
        max_tokens: u32,
    },
}

fn seconds(from: Micros, to: Micros) -> f64 {
    to.saturating_sub(from) as f64 / 1e6
}

impl<'a> Sink<'a> {
    fn new(live: &'a mut HashMap<u64, Live>, kv_batch: &'a mut Vec<wire::KvEvent>) -> Self {
        Self { live, kv_batch, observations: Vec::new() }
    }

    fn on(&mut self, event: EngineEvent) {
        match event {
            EngineEvent::Scheduled { id, at, .. } => {
                if let Some(live) = self.live.get_mut(&id)
                    && live.scheduled_at.is_none()
                {
                    live.scheduled_at = Some(at);
                    self.observations.push(Observation::Queue(seconds(live.arrived_at, at)));
                }
            }
            EngineEvent::FirstToken { id, at, cached_tokens } => {
                if let Some(live) = self.live.get_mut(&id)
                    && live.first_token_at.is_none()
                {
                    live.first_token_at = Some(at);
                    live.last_token_at = at;
                    self.observations.push(Observation::Ttft(seconds(live.arrived_at, at)));
                    let _ = live.events.send(StreamEvent::FirstToken { cached_tokens });
                }
            }
            EngineEvent::Token { id, at, index } => {
                if let Some(live) = self.live.get_mut(&id) {
                    self.observations.push(Observation::Itl(seconds(live.last_token_at, at)));
                    live.last_token_at = at;
                    let _ = live.events.send(StreamEvent::Token { index });
                }
            }
            EngineEvent::LoadDone { at, started_at, bytes, blocks, failed, .. } => {
                self.observations.push(Observation::Transfer {
                    seconds: seconds(started_at, at),
                    bytes,
                    blocks,
                    failed,
                });
            }
            EngineEvent::Preempted { .. }
            | EngineEvent::Held { .. }
            | EngineEvent::HoldReleased { .. }
            | EngineEvent::LoadStarted { .. } => {}
            EngineEvent::Finished {
                id,
                at,
                reason,
                prompt_tokens,
                output_tokens,
                cached_tokens,
                first_token_at,
                ..
            } => {
                let Some(live) = self.live.remove(&id) else { return };
                if reason == FinishReason::Length {
                    let scheduled = live.scheduled_at.unwrap_or(live.arrived_at);
                    let first = first_token_at.unwrap_or(at);
                    let decode = seconds(first, at);
                    self.observations.push(Observation::Finished {
                        e2e: seconds(live.arrived_at, at),
                        inference: seconds(scheduled, at),
                        prefill: seconds(scheduled, first),
                        decode,
                        tpot: (output_tokens > 1).then(|| decode / f64::from(output_tokens - 1)),
                        prompt: prompt_tokens,
                        output: output_tokens,
                        max_tokens: live.max_tokens,
                    });
                }
                let _ = live.events.send(StreamEvent::Finished {
                    reason,
                    prompt_tokens,
                    output_tokens,
                    cached_tokens,
                });
            }
            EngineEvent::Kv { kind, .. } => self.kv_batch.push(kv_event(kind)),
        }
    }

    fn flush(self, metrics: &Mutex<ReplicaMetrics>) {
        if self.observations.is_empty() {
            return;
        }
        let mut m = lock(metrics);
        for observation in self.observations {
            match observation {
                Observation::Queue(s) => m.queue.observe(s),
                Observation::Ttft(s) => m.ttft.observe(s),
                Observation::Itl(s) => m.itl.observe(s),
                Observation::Transfer { seconds, bytes, blocks, failed } => {
                    m.pd.observe_transfer(seconds, bytes, blocks, failed);
                }
                Observation::Finished {
                    e2e,
                    inference,
                    prefill,
                    decode,
                    tpot,
                    prompt,
                    output,
                    max_tokens,
                } => {
                    m.e2e.observe(e2e);
                    m.inference.observe(inference);
                    m.prefill.observe(prefill);
                    m.decode.observe(decode);
                    if let Some(tpot) = tpot {
                        m.tpot.observe(tpot);
                    }
                    m.request_prompt_tokens.observe(f64::from(prompt));
                    m.request_generation_tokens.observe(f64::from(output));
                    m.request_max_tokens.observe(f64::from(max_tokens));
                    m.request_n.observe(1.0);
                }
            }
        }
    }
}

/// The engine's KV event as vLLM puts it on the wire (`medium` "GPU", no LoRA).
pub fn kv_event(kind: KvEventKind) -> wire::KvEvent {
    match kind {
        KvEventKind::BlockStored { block_hashes, parent_block_hash, token_ids, block_size } => {
            wire::KvEvent::BlockStored(wire::BlockStored {
                block_hashes: block_hashes.into_iter().map(wire::BlockHash::from).collect(),
                parent_block_hash: parent_block_hash.map(wire::BlockHash::from),
                token_ids,
                block_size,
                lora_id: None,
                medium: Some("GPU".into()),
            })
        }
        KvEventKind::BlockRemoved { block_hashes } => wire::KvEvent::BlockRemoved(wire::BlockRemoved {
            block_hashes: block_hashes.into_iter().map(wire::BlockHash::from).collect(),
            medium: Some("GPU".into()),
        }),
        KvEventKind::AllBlocksCleared => wire::KvEvent::AllBlocksCleared,
    }
}
