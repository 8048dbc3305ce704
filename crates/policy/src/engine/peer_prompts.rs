//! Prompts shared between the routers of one fleet: each tells the others where it sent which prefix, so
//! that every router's cache-aware policy places a prefix where any of them sent it.
//!
//! Without this, each of N routers learns only from its own share of the traffic: `cache_aware_approx`
//! and `weighted_scorers` (routed prefix source) place a tenant's shared prompt once per router, and
//! `kv_precise` counts only its own requests still in prefill as a prefix's coming owners. What travels
//! is a prompt's prefix marks (see [`crate::prefix_marks`]), about 8 hashes per doubling of the prompt:
//!
//! - a router hands the others the prompts it routed since it last did ([`Engine::take_routed_prompts`])
//!   and which of its requests are still in prefill ([`Engine::own_in_prefill`]);
//! - the others take them in with [`Engine::observe_peer_prompts`]: the learning policies keep the marks
//!   as that replica's, in an index of their own beside the routed one, bounded and least recently used
//!   out as it is; `kv_precise` keeps the marks of that router's requests still in prefill, as it keeps
//!   its own pending blocks, until that router says their prefill ended, it is removed, or it ages out.
//!
//! A match found through marks counts as a match of the routed index does (rounded down to a mark).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::{Engine, PeerSummary, PickInProgress};
use crate::prefix_marks;
use crate::replica::ReplicaId;
use crate::request::{RequestId, RequestView};
use crate::spec::ResolvedPolicy;

/// Routed prompts kept for the other routers at most; past it the oldest go unshared (a publisher that
/// cannot reach etcd must not grow without end).
const OUTBOX_PROMPTS: usize = 1024;
/// Another router's requests in prefill kept at most per router (its list is cut there).
const PEER_IN_PREFILL: usize = 4096;

/// A prompt this engine routed, as it hands it to the other routers ([`Engine::take_routed_prompts`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutedPrompt {
    /// The request, by this engine's id (what [`Engine::own_in_prefill`] names it by).
    pub request: RequestId,
    /// Where it was sent.
    pub replica: ReplicaId,
    /// Its prefix marks (see [`crate::prefix_marks::marks_of`]).
    pub marks: Vec<u64>,
}

impl Engine {
    /// Starts (or stops) keeping the prompts this engine routes for [`Engine::take_routed_prompts`]. Off
    /// by default: a router that shares with no one keeps nothing.
    pub fn set_prompt_sharing(&mut self, on: bool) {
        self.prompt_sharing = on;
        if !on {
            self.prompt_outbox.clear();
        }
    }

    pub(super) fn share_routed_prompt(&mut self, request: RequestId, replica: ReplicaId, blocks: &[u64]) {
        if self.prompt_outbox.len() >= OUTBOX_PROMPTS {
            self.prompt_outbox.pop_front();
        }
        self.prompt_outbox.push_back(RoutedPrompt {
            request,
            replica,
            marks: prefix_marks::marks_of(blocks),
        });
    }

    /// The prompts routed since the last call (oldest first; at most 1,024), for the other routers'
    /// [`Engine::observe_peer_prompts`]. Only the policies that use them keep any: `cache_aware_approx`,
    /// `weighted_scorers` with the routed prefix source, and `kv_precise`.
    pub fn take_routed_prompts(&mut self) -> Vec<RoutedPrompt> {
        self.prompt_outbox.drain(..).collect()
    }

    /// This engine's requests still in prefill, under `kv_precise` (empty under the other policies: only
    /// it counts requests in prefill as a prefix's coming owners).
    pub fn own_in_prefill(&self) -> Vec<RequestId> {
        if !matches!(self.policy, ResolvedPolicy::KvPrecise(_)) {
            return Vec::new();
        }
        self.requests.iter().filter(|(_, active)| !active.in_decode).map(|(id, _)| *id).collect()
    }

    /// Takes in what router `peer` shared at `now_ms`: the prompts it routed since its last share
    /// (`routed`) and which of its requests are still in prefill (`in_prefill`, the whole list). Prompts
    /// sent to replicas this engine does not know are skipped. Returns how many prompts it kept.
    pub fn observe_peer_prompts(
        &mut self,
        peer: &str,
        routed: &[RoutedPrompt],
        in_prefill: &[RequestId],
        now_ms: u64,
    ) -> usize {
        let learns = self.learns_from_routing();
        let tracks_pending = matches!(self.policy, ResolvedPolicy::KvPrecise(_));
        let still_in_prefill: BTreeSet<RequestId> =
            in_prefill.iter().take(PEER_IN_PREFILL).copied().collect();
        let mut kept = 0;
        let mut pending = Vec::new();
        for prompt in routed {
            let Some(&slot) = self.slot_of.get(&prompt.replica) else { continue };
            if learns {
                self.peer_routed_index.insert(slot, &prompt.marks);
                kept += 1;
            } else if tracks_pending && still_in_prefill.contains(&prompt.request) {
                pending.push((prompt.request, (slot, prompt.marks.clone())));
                kept += 1;
            }
        }
        let summary = self.peer_summary_mut(peer);
        summary.at_ms = now_ms;
        summary.in_prefill.extend(pending);
        summary.in_prefill.retain(|request, _| still_in_prefill.contains(request));
        kept
    }

    /// Router `peer`'s entry, made empty when it has none yet.
    pub(super) fn peer_summary_mut(&mut self, peer: &str) -> &mut PeerSummary {
        self.peers.entry(peer.to_owned()).or_insert_with(|| PeerSummary {
            at_ms: 0,
            by_slot: Vec::new(),
            in_prefill: Default::default(),
        })
    }
}

/// Raises each candidate's matched blocks to what the marks of other routers' routed prompts show.
pub(super) fn fill_peer_routed(engine: &Engine, pick: &mut PickInProgress, view: &RequestView) {
    let index = &engine.peer_routed_index;
    if index.distinct_blocks() == 0 {
        return;
    }
    let before = matches_now(pick);
    super::cache_aware::fill_matches_with(pick, index.location_count(), |matched| {
        index.match_marks_into(&view.block_hashes, matched)
    });
    note_raised(pick, &before, "prompts other routers routed");
}

/// Raises each candidate's matched blocks to what the fresh peers' requests still in prefill will have
/// cached there (`kv_precise`), as its own pending blocks do.
pub(super) fn fill_peer_pending(engine: &Engine, pick: &mut PickInProgress, view: &RequestView) {
    let mut before = None;
    for summary in engine.peers.values() {
        if summary.in_prefill.is_empty() || !engine.peer_fresh(summary, pick.now_ms) {
            continue;
        }
        for (slot, marks) in summary.in_prefill.values() {
            let shared = prefix_marks::shared_blocks(marks, &view.block_hashes) as u32;
            if shared > 0 {
                before.get_or_insert_with(|| matches_now(pick));
                raise_matches(pick, |candidate| if candidate == *slot { shared } else { 0 });
            }
        }
    }
    if let Some(before) = before {
        note_raised(pick, &before, "other routers' requests still in prefill");
    }
}

fn matches_now(pick: &PickInProgress) -> Vec<Option<u32>> {
    pick.candidates.iter().map(|candidate| candidate.matched_blocks).collect()
}

/// Says which candidates' matches `source` raised, so that a pick made on another router's word reads
/// as such in the decision log.
fn note_raised(pick: &mut PickInProgress, before: &[Option<u32>], source: &str) {
    let raised: Vec<ReplicaId> = pick
        .candidates
        .iter()
        .zip(before)
        .filter(|(candidate, before)| candidate.matched_blocks.unwrap_or(0) > before.unwrap_or(0))
        .map(|(candidate, _)| candidate.replica)
        .collect();
    if !raised.is_empty() {
        pick.notes.push(format!("{source} raised the match of {}", super::cache_aware::name_list(&raised)));
    }
}

fn raise_matches(pick: &mut PickInProgress, found_at: impl Fn(u32) -> u32) {
    for (candidate, slot) in pick.candidates.iter_mut().zip(&pick.slots) {
        let found = found_at(*slot);
        if found > 0 {
            candidate.matched_blocks =
                Some(candidate.matched_blocks.map_or(found, |before| before.max(found)));
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::decision::Branch;
    use crate::spec::PolicySpec;

    fn engine(policy: &str) -> Engine {
        let replicas: Vec<ReplicaId> = (0..4).map(ReplicaId).collect();
        let mut engine = Engine::new(PolicySpec::named(policy), &replicas).expect("valid");
        engine.set_prompt_sharing(true);
        engine
    }

    fn view(blocks: impl IntoIterator<Item = u64>) -> RequestView {
        let block_hashes: Vec<u64> = blocks.into_iter().collect();
        RequestView { prompt_tokens: block_hashes.len() as u32 * 16, block_hashes, session_key: None }
    }

    fn matched_at(engine: &Engine, view: &RequestView, now_ms: u64, replica: u32) -> u32 {
        let decision = engine.pick(view, now_ms, &mut StdRng::seed_from_u64(1)).expect("a pick");
        let candidate = decision.candidates.iter().find(|c| c.replica == ReplicaId(replica)).expect("known");
        candidate.matched_blocks.unwrap_or(0)
    }

    #[test]
    fn a_router_places_a_prefix_where_another_router_sent_it() {
        let (mut a, mut b) = (engine("cache_aware_approx"), engine("cache_aware_approx"));
        // Router a sends a 40-block prompt to r2; b has never seen it.
        a.on_routed(1, ReplicaId(2), &view(0..40), 0).expect("routed");
        let shared = a.take_routed_prompts();
        assert_eq!(shared.len(), 1);
        assert_eq!(shared[0].replica, ReplicaId(2));
        assert_eq!(shared[0].marks, prefix_marks::marks_of(&(0..40).collect::<Vec<_>>()));
        assert!(a.take_routed_prompts().is_empty(), "taken once");
        let follow_up = view((0..40).chain(500..520));
        let before = b.pick(&follow_up, 1, &mut StdRng::seed_from_u64(1)).expect("a pick");
        assert_eq!(before.branch, Branch::Fallback, "{}", before.reason);

        assert_eq!(b.observe_peer_prompts("a", &shared, &[], 1), 1);
        let after = b.pick(&follow_up, 2, &mut StdRng::seed_from_u64(1)).expect("a pick");
        assert_eq!((after.replica, after.branch), (ReplicaId(2), Branch::Cache), "{}", after.reason);
        // 40 is a mark position: the whole shared prefix counts, no more.
        assert_eq!(matched_at(&b, &follow_up, 2, 2), 40);
        // Routed there, it counts as 20 blocks to prefill, not 60: its replica is no busier to b's load
        // guard, or to the routers b publishes its load to, than it would be to a.
        b.on_routed(9, ReplicaId(2), &follow_up, 2).expect("routed");
        let load_at = |engine: &Engine, replica| {
            engine.own_load().into_iter().find(|(id, _)| *id == replica).expect("known").1
        };
        assert_eq!(load_at(&b, ReplicaId(2)).prefill_blocks, 20);
        b.on_completed(9, 2).expect("outstanding");
        assert_eq!(b.replica_status(ReplicaId(2)).expect("known").peer_prompt_marks, shared[0].marks.len());
        // The next turn of a conversation whose last prompt ended between mark positions (45, between 44
        // and 48) matches all of it, by that prompt's last hash; a prompt sharing less is rounded down.
        a.on_routed(3, ReplicaId(1), &view(1_000..1_045), 3).expect("routed");
        b.observe_peer_prompts("a", &a.take_routed_prompts(), &[], 3);
        assert_eq!(matched_at(&b, &view((1_000..1_045).chain(600..650)), 3, 1), 45);
        assert_eq!(matched_at(&b, &view((1_000..1_046).chain(600..650)), 3, 1), 45);
        assert_eq!(matched_at(&b, &view((1_000..1_043).chain(600..650)), 3, 1), 40);
        // A prompt to a replica b does not know is skipped; removing the replica forgets its marks.
        let elsewhere = RoutedPrompt { request: 2, replica: ReplicaId(9), marks: vec![1, 2] };
        assert_eq!(b.observe_peer_prompts("a", &[elsewhere], &[], 3), 0);
        assert!(b.remove_replica(ReplicaId(2)));
        b.add_replica(ReplicaId(2));
        assert_eq!(matched_at(&b, &follow_up, 4, 2), 0);
    }

    #[test]
    fn only_the_policies_that_use_prompts_keep_them_and_only_while_sharing() {
        let mut quiet = engine("cache_aware_approx");
        quiet.set_prompt_sharing(false);
        quiet.on_routed(1, ReplicaId(0), &view(0..8), 0).expect("routed");
        assert!(quiet.take_routed_prompts().is_empty());
        let mut load_only = engine("least_load");
        load_only.on_routed(1, ReplicaId(0), &view(0..8), 0).expect("routed");
        assert!(load_only.take_routed_prompts().is_empty());
        assert!(load_only.own_in_prefill().is_empty(), "only kv_precise counts requests in prefill");
        let routed = vec![RoutedPrompt { request: 1, replica: ReplicaId(0), marks: vec![0, 1] }];
        assert_eq!(load_only.observe_peer_prompts("a", &routed, &[1], 0), 0);
        // A full outbox drops its oldest prompt.
        let mut busy = engine("kv_precise");
        for request in 0..OUTBOX_PROMPTS as u64 + 5 {
            busy.on_routed(request, ReplicaId(0), &view([request]), 0).expect("routed");
        }
        let taken = busy.take_routed_prompts();
        assert_eq!(taken.len(), OUTBOX_PROMPTS);
        assert_eq!(taken[0].request, 5);
    }

    #[test]
    fn kv_precise_counts_another_routers_prompt_in_prefill_until_it_says_the_prefill_ended() {
        let (mut a, mut b) = (engine("kv_precise"), engine("kv_precise"));
        b.set_peer_load_max_age(Some(1_000));
        a.on_routed(7, ReplicaId(1), &view(0..24), 0).expect("routed");
        a.on_routed(8, ReplicaId(3), &view(100..124), 0).expect("routed");
        a.on_first_token(8, 5).expect("first token");
        assert_eq!(a.own_in_prefill(), vec![7]);
        let shared = a.take_routed_prompts();
        assert_eq!(b.observe_peer_prompts("a", &shared, &a.own_in_prefill(), 10), 1, "8's prefill ended");
        let same_prefix = view(0..30);
        assert_eq!(matched_at(&b, &same_prefix, 10, 1), 24);
        assert_eq!(matched_at(&b, &view(100..124), 10, 3), 0);
        // It ages out with the router's summary...
        assert_eq!(matched_at(&b, &same_prefix, 1_011, 1), 0);
        // ...and leaves when the router's next share no longer lists it (its prefill ended).
        a.on_first_token(7, 20).expect("first token");
        assert_eq!(matched_at(&b, &same_prefix, 20, 1), 24);
        b.observe_peer_prompts("a", &a.take_routed_prompts(), &a.own_in_prefill(), 30);
        assert_eq!(matched_at(&b, &same_prefix, 30, 1), 0);
        // A removed router's prompts go with it.
        b.observe_peer_prompts("c", &shared, &[7], 40);
        assert_eq!(matched_at(&b, &same_prefix, 40, 1), 24);
        assert!(b.remove_peer("c"));
        assert_eq!(matched_at(&b, &same_prefix, 40, 1), 0);
    }
}
