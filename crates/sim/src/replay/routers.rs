//! Several routers over one replayed fleet: one policy engine per router, as N fleet-routers are.
//!
//! Each router keeps its own engine and its own random draws. A request goes through the router that
//! recorded it when the trace names one, else the router its session maps to (a client keeps its
//! connection; `fleet-sim bench --also-target` spreads clients the same way), or by arrival index without a
//! session. Its first token and completion reach only that router; every replica's KV events reach every
//! router (engines publish them to any subscriber); each router reads the replicas' metrics on its own
//! schedule, the routers' scrapes spread over the interval. So a router sees other routers' requests only
//! as the replicas report them, as live; and, with `peer_load_interval_ms`, as the other routers publish
//! them (fleet-router's `--peer-load-prefix`): each router on its own schedule hands every other its own
//! in-flight blocks per replica, and the prefix marks of the prompts it routed since, which reach them at
//! once (an etcd watch delivers in about a millisecond).

use fleet_policy::{
    Decision, Engine as PolicyEngine, KvEvent, PickError, PolicySpec, ReplicaId, ReplicaMetrics, RequestView,
    SpecError,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::prepare::PreparedRequest;

/// The routers of a replay.
pub(crate) struct Routers {
    routers: Vec<Router>,
    /// The router that routed each request, by request id (`u32::MAX`: not routed by any).
    owner: Vec<u32>,
}

struct Router {
    policy: PolicyEngine,
    rng: StdRng,
    /// Virtual time of this router's next metrics read, in ms (`None`: before its first).
    next_metrics_ms: Option<u64>,
    /// Virtual time of this router's next published summary, in ms (`None`: before its first).
    next_summary_ms: Option<u64>,
}

impl Routers {
    /// `count` routers running `spec` over `replicas`, their draws seeded from `seed` (router 0 draws as a
    /// single router would).
    pub(crate) fn new(
        spec: &PolicySpec,
        replicas: &[ReplicaId],
        count: u32,
        seed: u64,
    ) -> Result<Self, SpecError> {
        let routers = (0..u64::from(count.max(1)))
            .map(|k| {
                Ok(Router {
                    policy: PolicyEngine::new(spec.clone(), replicas)?,
                    rng: StdRng::seed_from_u64(seed ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                    next_metrics_ms: None,
                    next_summary_ms: None,
                })
            })
            .collect::<Result<_, SpecError>>()?;
        Ok(Self { routers, owner: Vec::new() })
    }

    /// The router a request goes through: the one that recorded it when the trace says (the app's what-if
    /// of several routers' traffic), else its session's (as `fleet-sim bench` spreads clients), else by
    /// arrival index.
    pub(crate) fn router_for(&self, index: usize, request: &PreparedRequest) -> usize {
        match request.router {
            Some(router) => router as usize % self.routers.len(),
            None => crate::bench::client_of(index, request.session, self.routers.len()),
        }
    }

    /// Routes request `id` through `router`.
    pub(crate) fn route(
        &mut self,
        router: usize,
        id: u64,
        view: &RequestView,
        now_ms: u64,
    ) -> Result<Decision, PickError> {
        let Router { policy, rng, .. } = &mut self.routers[router];
        let decision = policy.route(id, view, now_ms, rng)?;
        let slot = id as usize;
        if self.owner.len() <= slot {
            self.owner.resize(slot + 1, u32::MAX);
        }
        self.owner[slot] = router as u32;
        Ok(decision)
    }

    /// The engine of the router that routed `id`.
    fn owner_of(&mut self, id: u64) -> Option<&mut PolicyEngine> {
        let router = *self.owner.get(id as usize)?;
        self.routers.get_mut(router as usize).map(|r| &mut r.policy)
    }

    pub(crate) fn on_first_token(&mut self, id: u64, at_ms: u64) {
        if let Some(policy) = self.owner_of(id) {
            let _ = policy.on_first_token(id, at_ms);
        }
    }

    pub(crate) fn on_completed(&mut self, id: u64, at_ms: u64) {
        if let Some(policy) = self.owner_of(id) {
            let _ = policy.on_completed(id, at_ms);
        }
    }

    /// A replica's KV event, which every router subscribes to.
    pub(crate) fn on_kv_event(&mut self, replica: ReplicaId, event: &KvEvent, at_ms: u64) {
        for router in &mut self.routers {
            let _ = router.policy.on_kv_event(replica, event, at_ms);
        }
    }

    /// Lets each router whose metrics read is due at `now_ms` (every `interval_ms`; 0: before every pick)
    /// read the replicas' figures from `read`. The routers' first reads are spread over one interval,
    /// shifted by `phase_ms`.
    pub(crate) fn read_metrics(
        &mut self,
        now_ms: u64,
        interval_ms: u64,
        phase_ms: u64,
        read: impl Fn() -> Vec<(ReplicaId, ReplicaMetrics)>,
    ) {
        let count = self.routers.len() as u64;
        let mut figures: Option<Vec<(ReplicaId, ReplicaMetrics)>> = None;
        for (k, router) in self.routers.iter_mut().enumerate() {
            let offset = (interval_ms * k as u64 / count + phase_ms) % interval_ms.max(1);
            let due = *router.next_metrics_ms.get_or_insert(now_ms + offset);
            if now_ms < due {
                continue;
            }
            router.next_metrics_ms = Some(now_ms + interval_ms);
            for (replica, metrics) in figures.get_or_insert_with(&read).iter() {
                // The replica ids are the engines' own, so this cannot fail.
                let _ = router.policy.set_metrics(*replica, *metrics, now_ms);
            }
        }
    }
    /// Lets each router whose summary is due at `now_ms` (every `interval_ms`; 0: before every pick) hand
    /// its own in-flight load per replica to every other router, named by its index, and with `prompts`
    /// the prompts it routed since and which of its requests are still in prefill, as fleet-router's
    /// summaries carry them. The routers' first summaries are spread over one interval, shifted by
    /// `phase_ms`, as their metrics reads are.
    pub(crate) fn share_peer_load(&mut self, now_ms: u64, interval_ms: u64, phase_ms: u64, prompts: bool) {
        let count = self.routers.len();
        if count < 2 {
            return;
        }
        for k in 0..count {
            let offset = (interval_ms * k as u64 / count as u64 + phase_ms) % interval_ms.max(1);
            let router = &mut self.routers[k];
            let due = *router.next_summary_ms.get_or_insert(now_ms + offset);
            if now_ms < due {
                continue;
            }
            router.next_summary_ms = Some(now_ms + interval_ms);
            router.policy.set_prompt_sharing(prompts);
            let summary = router.policy.own_load();
            let routed = router.policy.take_routed_prompts();
            let in_prefill = router.policy.own_in_prefill();
            let name = format!("router-{k}");
            for (j, other) in self.routers.iter_mut().enumerate() {
                if j != k {
                    other.policy.set_peer_load(&name, &summary, now_ms);
                    if prompts {
                        other.policy.observe_peer_prompts(&name, &routed, &in_prefill, now_ms);
                    }
                }
            }
        }
    }
}
