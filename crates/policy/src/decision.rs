//! What a pick returns: the chosen replica and the explanation behind it, or why nothing could be chosen.

use serde::{Deserialize, Serialize};

use crate::replica::ReplicaId;
use crate::request::RequestId;

/// Which rule decided a pick.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Branch {
    /// `round_robin`: the next healthy replica in turn.
    RoundRobin,
    /// `random`: a uniformly drawn healthy replica.
    Random,
    /// The least loaded healthy replica.
    LeastLoad,
    /// `power_of_two`: the less loaded of two drawn replicas.
    PowerOfTwo,
    /// `consistent_hash`: the first replica clockwise from the key that is under the load bound.
    Hash,
    /// Load decided over cache: `cache_aware_approx`'s request counts were imbalanced, or the load guard of
    /// any cache-aware policy found the chosen replica too busy and spread the prefix to the replica that
    /// would start the request soonest.
    Balance,
    /// A cache-aware policy followed the longest prefix match.
    Cache,
    /// `kv_precise`: the minimum cost.
    Cost,
    /// `kv_precise` with a temperature: sampled by cost.
    Sampled,
    /// `weighted_scorers`: the highest combined score.
    Score,
    /// The policy's main rule did not apply (no cache match, no key, no KV events, everything filtered)
    /// and a simpler rule decided; the reason says which.
    Fallback,
}

/// One replica as the pick saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateExplanation {
    /// The replica.
    pub replica: ReplicaId,
    /// Whether it was healthy.
    pub healthy: bool,
    /// Whether it was allowed to win (healthy, not filtered).
    pub eligible: bool,
    /// Requests routed to it and not completed.
    pub outstanding: u64,
    /// Prompt tokens of its requests still in prefill.
    pub prefill_tokens: u64,
    /// Requests it holds (queue + running) by its fresh reported metrics, with those routed here since
    /// (see `Engine::seen_metrics`): load other routers sent included; or, when higher, this engine's own
    /// plus those other routers published (`Engine::set_peer_load`). `None` with neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_load: Option<f64>,
    /// The load figure the policy compared, when it compared loads.
    pub load: Option<f64>,
    /// Leading prompt blocks it holds, for cache-aware policies.
    pub matched_blocks: Option<u32>,
    /// Score (higher wins) or sampling probability, when the policy scores.
    pub score: Option<f64>,
    /// Cost (lower wins), for `kv_precise`.
    pub cost: Option<f64>,
    /// Whether it was chosen.
    pub chosen: bool,
    /// A short remark (sampled, filtered and why, over the bound, ...).
    pub note: Option<String>,
}

/// The outcome of a pick with its explanation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The chosen replica.
    pub replica: ReplicaId,
    /// The policy that decided.
    pub policy: String,
    /// The rule that decided.
    pub branch: Branch,
    /// One sentence saying why.
    pub reason: String,
    /// Blocks in the prompt.
    pub prompt_blocks: u32,
    /// Every replica, in the engine's order, as the pick saw it.
    pub candidates: Vec<CandidateExplanation>,
    /// Caveats (for example: no KV events received, so cache overlap is unknown).
    pub notes: Vec<String>,
}

impl Decision {
    /// The chosen replica's explanation.
    pub fn chosen(&self) -> Option<&CandidateExplanation> {
        self.candidates.iter().find(|candidate| candidate.chosen)
    }
}

/// Why no replica could be picked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PickError {
    /// The engine has no replicas.
    #[error("no replicas are configured; add at least one replica")]
    NoReplicas,
    /// Every replica is unhealthy.
    #[error("none of the {replicas} replicas is healthy; wait for a health check to pass or add a replica")]
    NoHealthyReplica {
        /// How many replicas there are.
        replicas: usize,
    },
    /// `route` was given a request id that is still outstanding.
    #[error("request {0} was already routed and has not completed; use a fresh request id")]
    DuplicateRequest(RequestId),
}

/// Why an observe call was not applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ObserveError {
    /// The replica is not in the engine.
    #[error("replica {0} is not known to the engine; add it first")]
    UnknownReplica(ReplicaId),
    /// The request is not outstanding (never routed, already completed or expired).
    #[error("request {0} is not outstanding (never routed, already completed or expired)")]
    UnknownRequest(RequestId),
    /// The request id is already outstanding.
    #[error("request {0} is already outstanding; use a fresh request id")]
    DuplicateRequest(RequestId),
}
