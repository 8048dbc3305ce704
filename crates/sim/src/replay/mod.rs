//! What-if replay: a trace through one engine model per replica, routed by a fleet-policy engine, all on
//! a virtual clock.
//!
//! For each request in arrival order, every replica's engine is advanced to the arrival (their first-token,
//! completion and KV events are fed to the policy engine as they happen), the policy picks a replica with
//! the request's block hashes, and the request joins that replica's engine. When the trace is exhausted the
//! engines run dry. The report measures what clients would have seen: hit rate, TTFT percentiles, time per
//! output token, throughput, load imbalance, and the pooled bound ([`pooled`]).
//!
//! Deterministic: the same trace, configuration and seed give the same report. Library callers (the app)
//! get progress callbacks and cancellation through [`ReplayControl`].

mod overhead;
mod pd;
pub mod pooled;
pub mod prepare;
mod report;
mod routers;

use std::sync::atomic::{AtomicBool, Ordering};

use fleet_policy::{KvEvent, Medium, PolicySpec, ReplicaId, ReplicaMetrics, RequestView};
use routers::Routers;

pub use overhead::{MIN_TIMED_REQUESTS, unmodelled_overhead_s};
pub use pd::{PdReplay, PdReport};
pub use prepare::{PreparedRequest, PreparedTrace, prepare};
pub use report::{ReplayReport, ReplicaReport, RequestReport, format_comparison, format_report};

use crate::engine::{
    EngineConfig, EngineEvent, EngineModel, EngineRequest, KvEventKind, Micros, Profile, Prompt, SharedHost,
};

/// How to replay.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayConfig {
    /// Replicas in the fleet.
    pub replicas: u32,
    /// The routing policy.
    pub policy: PolicySpec,
    /// Engine limits and costs.
    pub profile: Profile,
    /// KV capacity of one replica in engine blocks (`None`: the profile's capacity at that block size).
    pub capacity_blocks: Option<u32>,
    /// Seed of the policy's random draws.
    pub seed: u64,
    /// How often replicas' metrics (queue, running, KV usage) reach the policy, in virtual milliseconds
    /// (0 = before every pick), as a router that scrapes them would see them; `None` (the default): never,
    /// as a fleet-router with `--engine-metrics-ms 0`, whose policies count their own outstanding requests
    /// instead. The model must match the router: feeding metrics the live router never saw made the
    /// what-if of metric-weighted policies predict another fleet (19 pp of hit rate off for
    /// weighted_scorers, `cargo xtask bench fidelity`).
    pub metrics_interval_ms: Option<u64>,
    /// When in its interval each router reads the metrics, in virtual ms after the first request (taken
    /// modulo the interval). A live router's reads fall anywhere relative to its traffic; a what-if
    /// replays several phases to show how much that alone moves the outcome.
    pub metrics_phase_ms: u64,
    /// A prefill pool beside the `replicas` (which are then the decode replicas), split per request by the
    /// policy's `pd` thresholds as fleet-router does; `None`: every replica serves whole requests.
    pub pd: Option<PdReplay>,
    /// Routers over the fleet, each with its own policy engine (`routers.rs`): a request goes through its
    /// session's router and only that router hears of it, except through the replicas' KV events and
    /// metrics (`metrics_interval_ms`). 1 (the default) is one router.
    pub routers: u32,
    /// With several routers: how often each hands the others what it has in flight per replica (prefill
    /// and decode blocks, `Engine::set_peer_load`), in virtual milliseconds (0: before every pick), as
    /// fleet-routers publishing through etcd do; `None` (the default): never, as routers without etcd.
    pub peer_load_interval_ms: Option<u64>,
    /// With `peer_load_interval_ms`: whether the routers also hand each other the prompts they routed
    /// (prefix marks, `Engine::observe_peer_prompts`), as fleet-routers sharing load do. On by default;
    /// off shows what that part of the sharing is worth.
    pub peer_prompts: bool,
}

impl ReplayConfig {
    /// A configuration with the default profile, capacity and seed.
    pub fn new(replicas: u32, policy: PolicySpec) -> Self {
        Self {
            replicas,
            policy,
            profile: Profile::builtin(crate::engine::cost::DEFAULT_PROFILE).expect("built in"),
            capacity_blocks: None,
            seed: 1,
            metrics_interval_ms: None,
            metrics_phase_ms: 0,
            pd: None,
            routers: 1,
            peer_load_interval_ms: None,
            peer_prompts: true,
        }
    }

    /// Capacity per replica in blocks of `block_tokens`.
    pub fn capacity_for(&self, block_tokens: u32) -> u32 {
        self.capacity_blocks.unwrap_or_else(|| self.profile.capacity_blocks(block_tokens))
    }

    /// The engine configuration of one replica for a trace prepared at `block_tokens`.
    pub fn engine_config(&self, block_tokens: u32) -> EngineConfig {
        let mut config = self.profile.engine_config();
        config.block_tokens = block_tokens;
        config.num_gpu_blocks = self.capacity_for(block_tokens);
        config.kv_events = true;
        config.token_events = false;
        if let Some(pd) = &self.pd {
            config.kv_transfer = pd.transfer.clone();
        }
        config
    }
}

/// Progress of a replay, for a progress bar.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Progress {
    /// Requests routed so far.
    pub routed: usize,
    /// Requests in the trace.
    pub total: usize,
    /// Virtual time reached, in seconds.
    pub virtual_s: f64,
}

/// Progress reporting and cancellation for library callers. `Default` is neither.
#[derive(Clone, Copy, Default)]
pub struct ReplayControl<'a> {
    /// Called about every 1% of the trace (and at the end).
    pub progress: Option<&'a (dyn Fn(Progress) + Sync)>,
    /// Checked about every 1% of the trace; set it to stop with [`ReplayError::Cancelled`].
    pub cancel: Option<&'a AtomicBool>,
}

impl std::fmt::Debug for ReplayControl<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayControl")
            .field("progress", &self.progress.is_some())
            .field("cancel", &self.cancel.is_some())
            .finish()
    }
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The trace has no requests.
    #[error("the trace has no requests")]
    EmptyTrace,
    /// A setting is unusable.
    #[error("invalid replay setting `{field}`: {message}")]
    Config {
        /// The setting.
        field: &'static str,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The policy spec is invalid.
    #[error("invalid policy: {0}")]
    Policy(#[from] fleet_policy::SpecError),
    /// A request can never fit a replica.
    #[error(
        "request {index} (0-based, in arrival order) needs {needed} blocks of {block_tokens} tokens but a \
         replica holds {capacity}; raise --capacity-blocks or drop the request from the trace"
    )]
    TooLarge {
        /// Request index.
        index: usize,
        /// Blocks it needs.
        needed: u64,
        /// Tokens per block.
        block_tokens: u32,
        /// Blocks per replica.
        capacity: u32,
    },
    /// Cancelled through [`ReplayControl::cancel`].
    #[error("replay cancelled")]
    Cancelled,
}

/// What happened to one request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Outcome {
    pub replica: u32,
    pub arrival: Micros,
    /// When its engine first scheduled it (its queueing ends).
    pub scheduled: Option<Micros>,
    pub first_token: Option<Micros>,
    pub finished: Option<Micros>,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub output_tokens: u32,
    /// Prefilled in the prefill pool (P/D): `cached_tokens` is what the prefill replica found.
    pub split: bool,
    /// The KV transfer of a split request, when it ran.
    pub transfer_us: Option<Micros>,
    /// The profile's extra latency drawn for it, already in `first_token` and `finished`.
    pub extra_us: Micros,
}

/// Replays a prepared trace under one configuration.
pub fn replay(
    trace: &PreparedTrace,
    config: &ReplayConfig,
    control: ReplayControl<'_>,
) -> Result<ReplayReport, ReplayError> {
    if config.replicas == 0 {
        return Err(ReplayError::Config {
            field: "replicas",
            message: "a fleet needs at least one replica".into(),
        });
    }
    let engine_config = config.engine_config(trace.block_tokens);
    engine_config
        .validate()
        .map_err(|e| ReplayError::Config { field: e.field, message: format!("{} ({})", e.value, e.fix) })?;
    if config.pd.is_some() && config.profile.shared_host.is_some() {
        return Err(ReplayError::Config {
            field: "profile",
            message: format!(
                "profile {} shares one host's cores among the replicas (shared_host), which a P/D replay does \
                 not model; drop shared_host from the profile or replay without a prefill pool",
                config.profile.name
            ),
        });
    }
    if config.routers == 0 || (config.routers > 1 && config.pd.is_some()) {
        return Err(ReplayError::Config {
            field: "routers",
            message: format!(
                "{} routers: a replay runs at least one, and a P/D replay exactly one; set --routers 1 or more \
                 (1 with a prefill pool)",
                config.routers
            ),
        });
    }
    let capacity = engine_config.num_gpu_blocks;
    let ids: Vec<ReplicaId> = (0..config.replicas).map(ReplicaId).collect();
    let mut policy = Routers::new(&config.policy, &ids, config.routers, config.seed)?;
    let mut engines: Vec<EngineModel> = (0..config.replicas)
        .map(|_| EngineModel::new(engine_config.clone()))
        .collect::<Result<_, _>>()
        .map_err(|e| ReplayError::Config { field: e.field, message: format!("{} ({})", e.value, e.fix) })?;
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(trace.requests.len());
    let mut prefill = match &config.pd {
        Some(pd) => {
            Some(pd::PdSide::new(pd, &config.policy, &engine_config, trace.block_tokens, config.seed)?)
        }
        None => None,
    };
    // KV pulls finished on the decode side (P/D), whose prefill holds are then released.
    let mut pulled: Vec<(u64, Micros)> = Vec::new();
    let total = trace.requests.len();
    let tick = (total / 100).max(1);
    let host = config.profile.shared_host.as_ref();
    // With a shared host: the time up to which every engine's rate is settled.
    let mut host_clock: Micros = 0;

    for (index, request) in trace.requests.iter().enumerate() {
        if index % tick == 0 {
            if control.cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                return Err(ReplayError::Cancelled);
            }
            if let Some(progress) = control.progress {
                progress(Progress { routed: index, total, virtual_s: request.arrival_us as f64 / 1e6 });
            }
        }
        let now = request.arrival_us;
        let now_ms = now / 1000;
        if let Some(prefill) = prefill.as_mut() {
            prefill.advance_to(now, &mut engines, &mut policy, &mut outcomes, &mut pulled);
        }
        advance_engines(&mut engines, now, host, &mut host_clock, &mut |r, event| {
            pd::decode_event(&mut policy, &mut outcomes, &mut pulled, r, event)
        });
        if let Some(prefill) = prefill.as_mut() {
            prefill.release_pulled(&mut pulled);
        }
        if let Some(interval_ms) = config.metrics_interval_ms {
            policy.read_metrics(now_ms, interval_ms, config.metrics_phase_ms, || {
                engines
                    .iter()
                    .enumerate()
                    .map(|(r, engine)| {
                        let stats = engine.stats();
                        let metrics = ReplicaMetrics {
                            queue_depth: stats.waiting,
                            running: stats.running,
                            kv_usage: stats.kv_usage(),
                        };
                        (ReplicaId(r as u32), metrics)
                    })
                    .collect()
            });
        }
        if let Some(interval_ms) = config.peer_load_interval_ms {
            policy.share_peer_load(now_ms, interval_ms, config.metrics_phase_ms, config.peer_prompts);
        }
        let view = RequestView {
            block_hashes: request.block_hashes.to_vec(),
            prompt_tokens: request.prompt_tokens,
            session_key: request.session.map(|s| format!("{s:016x}")),
        };
        let id = index as u64;
        let router = policy.router_for(index, request);
        let decision = policy.route(router, id, &view, now_ms).map_err(|e| ReplayError::Config {
            field: "replicas",
            message: format!("the policy could not pick a replica: {e}"),
        })?;
        let replica = decision.replica.0;
        outcomes.push(Outcome {
            replica,
            arrival: now,
            prompt_tokens: request.prompt_tokens,
            output_tokens: 0,
            ..Outcome::default()
        });
        if let Some(prefill) = prefill.as_mut()
            && prefill.try_split(id, &view, request.output_tokens, &decision, now, &mut outcomes)
        {
            continue;
        }
        let prompt = Prompt::from_hashes(request.prompt_tokens, view.block_hashes);
        let engine_request = EngineRequest::new(id, prompt, request.output_tokens);
        engines[replica as usize]
            .add_request(engine_request, now, &mut |event| {
                pd::decode_event(&mut policy, &mut outcomes, &mut pulled, replica, event)
            })
            .map_err(|e| match e {
                crate::engine::AddError::TooLarge { needed, capacity, .. } => {
                    ReplayError::TooLarge { index, needed, block_tokens: trace.block_tokens, capacity }
                }
                other => ReplayError::Config { field: "trace", message: other.to_string() },
            })?;
    }
    if let Some(prefill) = prefill.as_mut() {
        prefill.advance_to(Micros::MAX, &mut engines, &mut policy, &mut outcomes, &mut pulled);
    }
    advance_engines(&mut engines, Micros::MAX, host, &mut host_clock, &mut |r, event| {
        pd::decode_event(&mut policy, &mut outcomes, &mut pulled, r, event)
    });
    if let Some(progress) = control.progress {
        let end = outcomes.iter().filter_map(|o| o.finished).max().unwrap_or(0);
        progress(Progress { routed: total, total, virtual_s: end as f64 / 1e6 });
    }
    add_extra_latency(&mut outcomes, &config.profile.extra_latency_us, config.seed);
    let pooled = pooled::reference(trace, u64::from(capacity) * u64::from(config.replicas), &engine_config);
    let mut report = report::build(&outcomes, &engines, pooled);
    report.pd = prefill.map(|prefill| prefill.report(&outcomes));
    Ok(report)
}

/// Advances every engine to `now`. On a shared host ([`SharedHost`]) they advance together, event by event:
/// between two events each engine that is computing runs at the share of the cores it gets with the others
/// computing then, so one replica's work slows the rest (`clock`: the time the rates were last settled).
fn advance_engines(
    engines: &mut [EngineModel],
    now: Micros,
    host: Option<&SharedHost>,
    clock: &mut Micros,
    on_event: &mut impl FnMut(u32, EngineEvent),
) {
    let Some(host) = host else {
        for (r, engine) in engines.iter_mut().enumerate() {
            engine.advance_to(now, &mut |event| on_event(r as u32, event));
        }
        return;
    };
    loop {
        let computing = engines.iter().filter(|e| e.is_stepping()).count();
        let rate = host.rate(computing);
        for engine in engines.iter_mut() {
            engine.set_rate(*clock, rate);
        }
        // The next thing any engine does at these rates; every engine meets it, so the rates change there.
        let next = engines.iter().filter_map(EngineModel::next_step_at).min().filter(|&at| at <= now);
        let until = next.unwrap_or(now);
        for (r, engine) in engines.iter_mut().enumerate() {
            engine.advance_to(until, &mut |event| on_event(r as u32, event));
        }
        *clock = (*clock).max(until);
        if next.is_none() {
            return;
        }
    }
}

/// Adds one draw of the profile's extra latency ([`Profile::extra_latency_us`]) to each request's first token
/// and completion, after the engines ran: it is time the client waits that the engine's schedule does not
/// see. Drawn in arrival order from the replay's seed, so a replay repeats and other seeds give the spread.
fn add_extra_latency(outcomes: &mut [Outcome], sample: &[u64], seed: u64) {
    use rand::{Rng, SeedableRng};
    if sample.is_empty() {
        return;
    }
    // Its own stream: the policy's draws stay what they are without the extra latency.
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x6578_7472_615f_6c61);
    for outcome in outcomes {
        let extra = sample[rng.random_range(0..sample.len())];
        outcome.first_token = outcome.first_token.map(|at| at + extra);
        outcome.finished = outcome.finished.map(|at| at + extra);
        outcome.extra_us = extra;
    }
}

/// Feeds one engine event to the policy and the outcome table.
fn on_event(policy: &mut Routers, outcomes: &mut [Outcome], replica: u32, event: EngineEvent) {
    match event {
        EngineEvent::FirstToken { id, at, cached_tokens } => {
            let outcome = &mut outcomes[id as usize];
            outcome.first_token = Some(at);
            // A split request's decode side counts the pulled KV as cached; the prefill side's count stands.
            if !outcome.split {
                outcome.cached_tokens = cached_tokens;
            }
            policy.on_first_token(id, at / 1000);
        }
        EngineEvent::Finished { id, at, output_tokens, cached_tokens, .. } => {
            let outcome = &mut outcomes[id as usize];
            outcome.finished = Some(at);
            outcome.output_tokens = output_tokens;
            if !outcome.split {
                outcome.cached_tokens = cached_tokens;
            }
            policy.on_completed(id, at / 1000);
        }
        EngineEvent::Kv { at, kind } => {
            policy.on_kv_event(ReplicaId(replica), &kv_event(kind), at / 1000);
        }
        EngineEvent::Scheduled { id, at, .. } => {
            let scheduled = &mut outcomes[id as usize].scheduled;
            scheduled.get_or_insert(at);
        }
        EngineEvent::Token { .. }
        | EngineEvent::Preempted { .. }
        | EngineEvent::Held { .. }
        | EngineEvent::HoldReleased { .. }
        | EngineEvent::LoadStarted { .. }
        | EngineEvent::LoadDone { .. } => {}
    }
}

/// An engine's KV event as the policy engine takes it.
fn kv_event(kind: KvEventKind) -> KvEvent {
    match kind {
        KvEventKind::BlockStored { block_hashes, .. } => {
            KvEvent::Stored { medium: Medium::Gpu, block_hashes }
        }
        KvEventKind::BlockRemoved { block_hashes } => KvEvent::Removed { medium: Medium::Gpu, block_hashes },
        KvEventKind::AllBlocksCleared => KvEvent::AllCleared { medium: None },
    }
}

/// Replays the same trace under several policies in parallel (one thread each, at most `threads` at once),
/// returning the reports in the order of `policies`.
pub fn compare(
    trace: &PreparedTrace,
    base: &ReplayConfig,
    policies: &[PolicySpec],
    threads: usize,
    cancel: Option<&AtomicBool>,
) -> Vec<Result<ReplayReport, ReplayError>> {
    let threads = threads.max(1);
    let mut results: Vec<Option<Result<ReplayReport, ReplayError>>> =
        (0..policies.len()).map(|_| None).collect();
    for (chunk_index, chunk) in policies.chunks(threads).enumerate() {
        std::thread::scope(|scope| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|spec| {
                    let config = ReplayConfig { policy: spec.clone(), ..base.clone() };
                    scope.spawn(move || replay(trace, &config, ReplayControl { progress: None, cancel }))
                })
                .collect();
            for (offset, handle) in handles.into_iter().enumerate() {
                let result = handle.join().unwrap_or_else(|_| {
                    Err(ReplayError::Config { field: "policy", message: "the replay thread panicked".into() })
                });
                results[chunk_index * threads + offset] = Some(result);
            }
        });
    }
    results.into_iter().map(|r| r.unwrap_or(Err(ReplayError::Cancelled))).collect()
}
