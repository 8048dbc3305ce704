//! What-if replay of a disaggregated (P/D) fleet: a prefill pool beside the decode replicas, fleet-router's
//! per-request split decision, and the KV transfer between them, on the same virtual clock.
//!
//! Per request, as fleet-router does it (`crates/router/src/pd.rs`): the policy picks a decode replica; the
//! spec's `pd` thresholds decide ([`fleet_policy::decide_pd`]) from the prompt's length, the part the decode
//! pick does not hold (its matched blocks) and the least loaded prefill replica's outstanding requests. A
//! split sends a one-token prefill leg to the prefill pool's pick ([`fleet_policy::prefill_spec`], cache-aware)
//! whose blocks stay held after it; when the leg finishes, the request joins the decode replica with its KV
//! remote: the decode engine pulls what it lacks over the link ([`crate::engine::TransferCost`]), then
//! computes the last prompt token and decodes. When the pull ends, the prefill replica's hold is released.
//!
//! Ordering: prefill engines never wait on decode engines, so at each arrival the prefill pool is advanced
//! first, the legs it finished join their decode replicas in time order, then the decode replicas advance.
//! One simplification: a hold is released when the decode side's pull is seen, which can be after the prefill
//! engine's clock has passed it; the blocks are then freed at that later time (KV held a little longer).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use fleet_policy::{Decision, Engine as PolicyEngine, PdInputs, PdParams, ReplicaId, RequestView, decide_pd};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use super::{Outcome, ReplayError, on_event};
use crate::engine::{
    EngineConfig, EngineEvent, EngineModel, EngineRequest, Micros, Prompt, RemoteKv, TransferCost,
};

/// The prefill pool of a P/D replay; the replay's `replicas` are then the decode replicas.
#[derive(Clone, Debug, PartialEq)]
pub struct PdReplay {
    /// Prefill replicas (0: no pool, every request is local, as fleet-router with no healthy prefill replica).
    pub prefill_replicas: u32,
    /// What moving KV between the pools costs.
    pub transfer: TransferCost,
    /// How long a prefill replica holds a finished leg's blocks for the pull.
    pub lease_us: Micros,
}

impl Default for PdReplay {
    fn default() -> Self {
        Self { prefill_replicas: 1, transfer: TransferCost::default(), lease_us: 30_000_000 }
    }
}

/// What a P/D replay adds to the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PdReport {
    /// Prefill replicas beside the decode ones.
    pub prefill_replicas: u32,
    /// Decisions per reason (`split`, `short_prompt`, `cached_at_decode`, `prefill_pool_busy`,
    /// `no_prefill_replica`).
    pub decisions: BTreeMap<String, u64>,
    /// Split requests / all requests.
    pub split_share: f64,
    /// Mean prefill leg (arrival to the leg's end), seconds; 0 without splits.
    pub prefill_leg_mean_s: f64,
    /// Mean KV transfer, seconds; 0 without splits.
    pub transfer_mean_s: f64,
    /// Prompt tokens the prefill pool computed.
    pub prefill_pool_tokens: u64,
}

/// A split request between its legs.
#[derive(Debug)]
struct Leg {
    decode: u32,
    prompt: Prompt,
    output_tokens: u32,
}

/// The prefill side of a P/D replay and its bookkeeping.
pub(super) struct PdSide {
    engines: Vec<EngineModel>,
    policy: PolicyEngine,
    rng: StdRng,
    params: PdParams,
    lease_us: Micros,
    block_tokens: u32,
    /// Engine blocks per replica and tokens per engine block: a decode leg must fit its whole request.
    capacity_blocks: u32,
    engine_block_tokens: u32,
    /// Split requests whose prefill leg is running, by id.
    legs: HashMap<u64, Leg>,
    /// Finished prefill legs waiting to join their decode replica: (when, id).
    ready: BinaryHeap<Reverse<(Micros, u64)>>,
    decisions: BTreeMap<String, u64>,
    /// Total and count of prefill legs (arrival to the leg's end).
    leg_us: (u64, u64),
}

impl PdSide {
    pub(super) fn new(
        pd: &PdReplay,
        spec: &fleet_policy::PolicySpec,
        engine_config: &EngineConfig,
        block_tokens: u32,
        seed: u64,
    ) -> Result<Self, ReplayError> {
        let params = spec.pd_params()?;
        let ids: Vec<ReplicaId> = (0..pd.prefill_replicas).map(ReplicaId).collect();
        let policy = PolicyEngine::new(fleet_policy::prefill_spec(spec), &ids)?;
        let engines = (0..pd.prefill_replicas)
            .map(|_| EngineModel::new(engine_config.clone()))
            .collect::<Result<_, _>>()
            .map_err(|e| ReplayError::Config {
                field: e.field,
                message: format!("{} ({})", e.value, e.fix),
            })?;
        Ok(Self {
            engines,
            policy,
            // Its own stream, so adding a prefill pool does not change the decode picks' draws.
            rng: StdRng::seed_from_u64(seed ^ 0x5eed_0f9e_f111),
            params,
            lease_us: pd.lease_us,
            block_tokens,
            capacity_blocks: engine_config.num_gpu_blocks,
            engine_block_tokens: engine_config.block_tokens.max(1),
            legs: HashMap::new(),
            ready: BinaryHeap::new(),
            decisions: BTreeMap::new(),
            leg_us: (0, 0),
        })
    }

    /// Advances the prefill pool to `now`, then moves every finished leg into its decode replica in time
    /// order (the decode replicas advanced to each join first). Pulls the decode side finishes are added to
    /// `pulled`; [`PdSide::release_pulled`] frees their holds.
    pub(super) fn advance_to(
        &mut self,
        now: Micros,
        decode: &mut [EngineModel],
        policy: &mut super::Routers,
        outcomes: &mut [Outcome],
        pulled: &mut Vec<(u64, Micros)>,
    ) {
        for (r, engine) in self.engines.iter_mut().enumerate() {
            let (policy, ready, outcomes) = (&mut self.policy, &mut self.ready, &mut *outcomes);
            engine.advance_to(now, &mut |event| on_prefill_event(policy, ready, outcomes, r as u32, event));
        }
        while let Some(Reverse((at, id))) = self.ready.peek().copied().filter(|Reverse((at, _))| *at <= now) {
            self.ready.pop();
            let Some(leg) = self.legs.remove(&id) else { continue };
            for (r, engine) in decode.iter_mut().enumerate() {
                engine.advance_to(at, &mut |event| decode_event(policy, outcomes, pulled, r as u32, event));
            }
            self.leg_us.0 += at.saturating_sub(outcomes[id as usize].arrival);
            self.leg_us.1 += 1;
            let mut request = EngineRequest::new(id, leg.prompt, leg.output_tokens);
            // vLLM's NIXL pull reuses what the decode replica already caches and pulls the rest.
            request.remote = Some(RemoteKv { use_local_cache: true, fail: false });
            // It fits: `try_split` checked the whole request against a replica's capacity.
            let _ = decode[leg.decode as usize].add_request(request, at, &mut |event| {
                decode_event(policy, outcomes, pulled, leg.decode, event)
            });
        }
        self.release_pulled(pulled);
    }

    /// Frees the prefill holds of finished pulls.
    pub(super) fn release_pulled(&mut self, pulled: &mut Vec<(u64, Micros)>) {
        for (id, at) in pulled.drain(..) {
            for engine in &mut self.engines {
                if engine.release_held(id, at, &mut |_| {}) {
                    break;
                }
            }
        }
    }

    /// Decides split or local for a request the policy sent to `decision`'s replica at `now`. On a split the
    /// prefill leg is queued at the prefill pool's pick and `true` is returned (the decode leg follows when
    /// it ends); else the caller serves it locally.
    pub(super) fn try_split(
        &mut self,
        id: u64,
        view: &RequestView,
        output_tokens: u32,
        decision: &Decision,
        now: Micros,
        outcomes: &mut [Outcome],
    ) -> bool {
        // A request that cannot fit a decode replica whole is not split: served locally, the replay names it
        // as too large, as a plain replay does, rather than dropping it after its prefill leg.
        let needed = (u64::from(view.prompt_tokens) + u64::from(output_tokens.max(1)))
            .div_ceil(u64::from(self.engine_block_tokens));
        if needed > u64::from(self.capacity_blocks) {
            return false;
        }
        let now_ms = now / 1000;
        let matched = decision.chosen().and_then(|chosen| chosen.matched_blocks).unwrap_or(0);
        let cached_at_decode = matched.saturating_mul(self.block_tokens).min(view.prompt_tokens);
        let loads: Vec<u64> = self
            .policy
            .replicas()
            .into_iter()
            .filter_map(|r| self.policy.replica_status_at(r, now_ms))
            .map(|status| status.outstanding)
            .collect();
        let inputs = PdInputs {
            prompt_tokens: view.prompt_tokens,
            cached_at_decode,
            prefill_replicas: loads.len(),
            prefill_pool_load: loads.iter().copied().min().unwrap_or(0),
        };
        let pd = decide_pd(&self.params, &inputs);
        *self.decisions.entry(pd.reason.as_str().to_owned()).or_default() += 1;
        if !pd.split {
            return false;
        }
        let Ok(pick) = self.policy.route(id, view, now_ms, &mut self.rng) else {
            // No prefill replica could be picked: local, as fleet-router falls back.
            *self.decisions.entry("transfer_failed".to_owned()).or_default() += 1;
            return false;
        };
        let prefill = pick.replica.0;
        let prompt = Prompt::from_hashes(view.prompt_tokens, view.block_hashes.clone());
        let mut leg = EngineRequest::new(id, prompt.clone(), 1);
        leg.hold_for = Some(self.lease_us);
        let (policy, ready) = (&mut self.policy, &mut self.ready);
        let added = self.engines[prefill as usize]
            .add_request(leg, now, &mut |event| on_prefill_event(policy, ready, outcomes, prefill, event));
        if added.is_err() {
            let _ = self.policy.on_completed(id, now_ms);
            *self.decisions.entry("transfer_failed".to_owned()).or_default() += 1;
            return false;
        }
        outcomes[id as usize].split = true;
        self.legs.insert(id, Leg { decode: decision.replica.0, prompt, output_tokens });
        true
    }

    /// The figures for the report.
    pub(super) fn report(&self, outcomes: &[Outcome]) -> PdReport {
        let mean = |(total, n): (u64, u64)| if n == 0 { 0.0 } else { total as f64 / n as f64 / 1e6 };
        let transfers =
            outcomes.iter().filter_map(|o| o.transfer_us).fold((0, 0), |(t, n), us| (t + us, n + 1));
        PdReport {
            prefill_replicas: self.engines.len() as u32,
            decisions: self.decisions.clone(),
            split_share: self.decisions.get("split").copied().unwrap_or(0) as f64
                / outcomes.len().max(1) as f64,
            prefill_leg_mean_s: mean(self.leg_us),
            transfer_mean_s: mean(transfers),
            prefill_pool_tokens: self.engines.iter().map(|e| e.stats().computed_prefill_tokens).sum(),
        }
    }
}

/// A prefill-side event: the pool's policy learns loads and KV; a finished leg is ready for its decode leg.
/// The client's figures (first token, cached tokens) come from the decode side, except the prompt's cached
/// tokens, which are what the prefill replica found (the decode side's count includes what it pulled).
fn on_prefill_event(
    policy: &mut PolicyEngine,
    ready: &mut BinaryHeap<Reverse<(Micros, u64)>>,
    outcomes: &mut [Outcome],
    replica: u32,
    event: EngineEvent,
) {
    match event {
        EngineEvent::FirstToken { id, at, cached_tokens } => {
            outcomes[id as usize].cached_tokens = cached_tokens;
            let _ = policy.on_first_token(id, at / 1000);
        }
        EngineEvent::Finished { id, at, .. } => {
            let _ = policy.on_completed(id, at / 1000);
            ready.push(Reverse((at, id)));
        }
        EngineEvent::Kv { at, kind } => {
            let _ = policy.on_kv_event(ReplicaId(replica), &super::kv_event(kind), at / 1000);
        }
        _ => {}
    }
}

/// A decode-side event in a P/D replay: a plain replay's handling, and pulls noted for their holds.
pub(super) fn decode_event(
    policy: &mut super::Routers,
    outcomes: &mut [Outcome],
    pulled: &mut Vec<(u64, Micros)>,
    replica: u32,
    event: EngineEvent,
) {
    if let EngineEvent::LoadDone { id, at, started_at, .. } = &event {
        pulled.push((*id, *at));
        outcomes[*id as usize].transfer_us = Some(at.saturating_sub(*started_at));
    }
    on_event(policy, outcomes, replica, event);
}
