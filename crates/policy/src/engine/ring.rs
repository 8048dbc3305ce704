//! `consistent_hash`: consistent hashing with bounded load (CHWBL), as KubeAI routes.
//!
//! Each replica owns `virtual_nodes` points on a 64-bit ring, placed by hashing its [`ReplicaId`], so a
//! replica keeps its points across restarts and membership changes move only its own keys. A request's key
//! is its session key (when present and enabled) or the chained hash of its first K blocks, which names
//! that whole prefix. The request goes to the first replica clockwise from the key that is healthy and
//! whose load + 1 stays within `ceil(load_factor x (total load + 1) / healthy replicas)`. That bound is
//! always met by the least loaded replica, so the walk always ends.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{Engine, PickInProgress, ReplicaState, argmin_by};
use crate::decision::Branch;
use crate::hashing::{BLOCK_HASH_SEED, mix64, session_key_hash};
use crate::replica::ReplicaId;
use crate::request::RequestView;
use crate::spec::ConsistentHashParams;

fn point(replica: ReplicaId, virtual_node: u32) -> u64 {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&replica.0.to_le_bytes());
    bytes[4..].copy_from_slice(&virtual_node.to_le_bytes());
    xxh3_64_with_seed(&bytes, BLOCK_HASH_SEED ^ 0x0000_5249_4E47)
}

pub(super) fn build(slots: &[Option<ReplicaState>], virtual_nodes: u32) -> Vec<(u64, u32)> {
    let mut ring: Vec<(u64, u32)> = slots
        .iter()
        .enumerate()
        .filter_map(|(slot, state)| Some((slot as u32, state.as_ref()?.id)))
        .flat_map(|(slot, id)| (0..virtual_nodes).map(move |node| (point(id, node), slot)))
        .collect();
    // Sorting by (point, slot) keeps the ring identical whatever order replicas were added in.
    ring.sort_unstable();
    ring
}

/// The load bound of CHWBL: a replica may take a request while `load + 1 <= bound`.
pub fn chwbl_bound(load_factor: f64, total_load: u64, healthy_replicas: usize) -> u64 {
    let healthy = healthy_replicas.max(1) as f64;
    (load_factor * (total_load + 1) as f64 / healthy).ceil() as u64
}

pub(super) fn consistent_hash(
    engine: &Engine,
    pick: &mut PickInProgress,
    params: &ConsistentHashParams,
    view: &RequestView,
) {
    let total: u64 = pick.healthy.iter().map(|&p| pick.candidates[p].outstanding).sum();
    let bound = chwbl_bound(params.load_factor, total, pick.healthy.len());
    for index in 0..pick.healthy.len() {
        let candidate = &mut pick.candidates[pick.healthy[index]];
        candidate.load = Some(candidate.outstanding as f64);
        // Over the bound is out for this request, the load guard's review included: the guard also counts
        // other routers' requests, and may find the least wait on a replica this router already filled.
        candidate.eligible = candidate.outstanding < bound;
    }
    let session = view.session_key.as_deref().filter(|_| params.use_session_key);
    // The chained hash of block K-1 names the whole K-block prefix: one number, no re-hashing.
    let prefix_blocks = params.prefix_blocks.min(view.block_hashes.len());
    let (key, key_source) = match (session, prefix_blocks) {
        (Some(key), _) => (session_key_hash(key), "session key".to_owned()),
        (None, blocks) if blocks > 0 => {
            (mix64(view.block_hashes[blocks - 1]), format!("first {blocks} prompt blocks"))
        }
        (None, _) => {
            let position = argmin_by(&pick.healthy, |p| pick.candidates[p].outstanding);
            let reason = format!(
                "fallback: the request has neither a session key nor prompt blocks to hash, so the least loaded \
                 replica {} was chosen",
                pick.replica(position)
            );
            pick.decide(position, Branch::Fallback, reason);
            return;
        }
    };
    // Candidate position of each slot (`usize::MAX` for free slots); only the ring walk needs it, so it
    // is built here rather than in every pick.
    let mut position_by_slot = vec![usize::MAX; engine.slots.len()];
    for (position, slot) in pick.slots.iter().enumerate() {
        position_by_slot[*slot as usize] = position;
    }
    let start = engine.ring.partition_point(|(point, _)| *point < key);
    let mut visited = vec![false; pick.candidates.len()];
    let mut skipped = Vec::new();
    for step in 0..engine.ring.len() {
        let (_, slot) = engine.ring[(start + step) % engine.ring.len()];
        let position = position_by_slot[slot as usize];
        if std::mem::replace(&mut visited[position], true) {
            continue;
        }
        let (replica, outstanding, healthy) = {
            let candidate = &pick.candidates[position];
            (candidate.replica, candidate.outstanding, candidate.healthy)
        };
        if !healthy {
            skipped.push(format!("{replica} (unhealthy)"));
            continue;
        }
        if outstanding + 1 > bound {
            skipped.push(format!("{replica} (load {outstanding} at bound {bound})"));
            pick.candidates[position].note = Some(format!("over the load bound {bound}"));
            continue;
        }
        pick.candidates[position].note =
            Some(if skipped.is_empty() { "hash home" } else { "walked to" }.to_owned());
        let reason = if skipped.is_empty() {
            format!(
                "hash: the {key_source} hash to {replica} on the ring, whose load {outstanding} is within the bound \
                 {bound}"
            )
        } else {
            format!(
                "hash: the {key_source} hash past {}, so the ring walk went on to {replica} (load {outstanding}, \
                 bound {bound})",
                skipped.join(", ")
            )
        };
        pick.decide(position, Branch::Hash, reason);
        return;
    }
    // Unreachable while the bound holds for the least loaded replica; kept so a pick never panics.
    let position = argmin_by(&pick.healthy, |p| pick.candidates[p].outstanding);
    let reason = format!(
        "fallback: no ring replica was under the bound {bound}; least loaded {}",
        pick.replica(position)
    );
    pick.decide(position, Branch::Fallback, reason);
}
