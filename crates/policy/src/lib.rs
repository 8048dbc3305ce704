//! Fleetdeck's routing-policy engine: every policy operators use, with an explanation for every pick.
//!
//! The same engine runs in the router (live traffic), the simulator (replay) and the app (what-if), so it
//! is pure: no I/O, no clock, no global randomness. Time comes in as `now_ms`, randomness as a caller's
//! RNG, and the same state, inputs and random stream give the same decisions.
//!
//! - [`PolicySpec`]: the operator's YAML/JSON document; [`param_docs`] lists every parameter.
//! - [`Engine`]: built from a spec and a replica set; [`Engine::pick`] returns a [`Decision`] with its
//!   explanation; the `on_*`, `set_*`, `add_replica` and `remove_replica` calls are the only way state changes.
//! - [`PrefixIndex`]: the chained-block prefix index both cache-aware policies use.
//! - [`prefix_marks`]: the few hashes of a prompt routers share so each places a prefix where another sent it.
//! - [`block_hashes_from_tokens`] / [`block_hashes_from_text`]: how prompts become block hashes.
//!
//! See `README.md` beside this crate for the policies, parameters and invariants.

mod decision;
mod engine;
pub mod hashing;
mod kv_event;
mod pd;
mod prefix_index;
pub mod prefix_marks;
mod replica;
mod request;
mod spec;
mod table;

pub use decision::{Branch, CandidateExplanation, Decision, ObserveError, PickError};
pub use engine::{Engine, PeerLoad, ReplicaMetrics, ReplicaStatus, RoutedPrompt};
pub use hashing::{BLOCK_HASH_SEED, block_hashes_from_text, block_hashes_from_tokens, chain_block_ids};
pub use kv_event::{EngineHashTranslator, KvEvent, Medium};
pub use pd::{
    KvHandoff, PdDecision, PdInputs, PdParams, PdReason, Role, UnknownRole, decide_pd, pd_param_docs,
    prefill_spec,
};
pub use prefix_index::{InsertOutcome, Location, PrefixIndex};
pub use replica::{ReplicaId, ReplicaNames};
pub use request::{RequestId, RequestView};
pub use spec::{
    CACHE_AWARE_POLICY_NAMES, CacheAwareParams, ConsistentHashParams, HashingParams, KvPreciseParams,
    LoadGuardParams, LoadMetric, LoadParams, MAX_SPEC_BYTES, MAX_SPEC_DEPTH, POLICY_NAMES, ParamDoc,
    ParamKind, PolicySpec, PrefixSource, ResolvedPolicy, SCHEMA_VERSION, SPEC_PARSE_DEADLINE, SpecError,
    WeightedScorersParams, check_spec_text, param_docs, policy_summary,
};

/// The CHWBL load bound, exposed so callers and tests can check it: a replica may take a request while
/// `its load + 1 <= chwbl_bound(load_factor, total load of healthy replicas, healthy replicas)`.
pub fn chwbl_bound(load_factor: f64, total_load: u64, healthy_replicas: usize) -> u64 {
    engine::chwbl_bound(load_factor, total_load, healthy_replicas)
}
