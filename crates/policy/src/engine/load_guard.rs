//! The load guard the cache-aware policies share (consistent_hash's ring included): the owner of a prefix
//! keeps new work only while the request would start there within a bound of where it would start
//! soonest; otherwise it goes there and the prefix is copied.
//!
//! Expected wait is counted in blocks of prefill, the work every replica does at about the same rate:
//! a replica's queued prefill (`active_prefill_blocks`: blocks of its requests still in prefill that were
//! not cached there when routed), plus `decode_wait_weight` per block its decoding requests hold (every
//! engine step also runs their attention over those blocks, which slows the prefill behind them), plus,
//! for this request, the blocks it would recompute there (prompt blocks minus the replica's match). A policy's choice `o` stands when
//! `wait(o) + uncached(o) <= wait(l) + uncached(l) + spread_wait_blocks`, where `l` is the eligible
//! replica with the least `wait + uncached`. SGLang's balance thresholds and llm-d's queue filter compare
//! request counts, which say nothing of how long the queued prompts are; Dynamo's cost counts the blocks
//! but weighs cache overlap so strongly (overlap_weight 4) that a hot prefix's owner wins until it is
//! several prompts behind. The guard states the trade in the one unit that matters for TTFT and bounds it.

use super::cache_aware::Fixed;
use super::{Engine, PickInProgress, argmin_by};
use crate::decision::Branch;
use crate::request::RequestView;
use crate::spec::LoadGuardParams;

/// One eligible replica's figures, in prefill blocks.
#[derive(Clone, Copy)]
struct Start {
    wait: f64,
    uncached: u64,
}

impl Start {
    fn total(self) -> f64 {
        self.wait + self.uncached as f64
    }
}

fn start_of(
    engine: &Engine,
    pick: &PickInProgress,
    guard: &LoadGuardParams,
    position: usize,
    prompt_blocks: u64,
) -> Start {
    let wait = engine.slots[pick.slots[position] as usize].as_ref().map_or(0.0, |s| {
        s.active_prefill_blocks as f64 + guard.decode_wait_weight * s.active_decode_blocks as f64
    });
    let matched = u64::from(pick.candidates[position].matched_blocks.unwrap_or(0));
    Start { wait, uncached: prompt_blocks.saturating_sub(matched) }
}

/// Reviews the policy's choice in `pick` (already decided, matches filled) and moves it when the chosen
/// replica would start this request more than `spread_wait_blocks` later than the soonest eligible one.
pub(super) fn review(
    engine: &Engine,
    pick: &mut PickInProgress,
    guard: &LoadGuardParams,
    view: &RequestView,
) {
    if !guard.enabled {
        return;
    }
    let prompt_blocks = view.block_hashes.len() as u64;
    // Replicas a policy filtered out (weighted_scorers' overload filters) stay out, unless it had to
    // score them all.
    let mut eligible: Vec<usize> =
        pick.healthy.iter().copied().filter(|&p| pick.candidates[p].eligible).collect();
    if eligible.is_empty() {
        eligible = pick.healthy.clone();
    }
    let chosen = pick.chosen;
    let owner = start_of(engine, pick, guard, chosen, prompt_blocks);
    // The soonest start; ties to fewer outstanding requests, then to the policy's own choice, then order.
    let soonest = argmin_by(&eligible, |p| {
        let start = start_of(engine, pick, guard, p, prompt_blocks);
        (start.total(), pick.candidates[p].outstanding, p != chosen)
    });
    let best = start_of(engine, pick, guard, soonest, prompt_blocks);
    if owner.total() <= best.total() + guard.spread_wait_blocks as f64 {
        return;
    }
    let policy_reason = std::mem::take(&mut pick.reason);
    pick.notes.push(format!("load guard overrode the policy's choice ({policy_reason})"));
    pick.candidates[chosen].note = Some(format!(
        "too busy: {} blocks of queued work + {} to prefill for this prompt",
        Fixed(owner.wait, 1),
        owner.uncached
    ));
    let reason = format!(
        "balance: {} (the policy's choice) would start this prompt after {} blocks of prefill ({} queued + {} \
         uncached), more than spread_wait_blocks {} beyond {}'s {} ({} queued + {} to recompute), so the \
         prefix was spread to {}",
        pick.replica(chosen),
        Fixed(owner.total(), 1),
        Fixed(owner.wait, 1),
        owner.uncached,
        guard.spread_wait_blocks,
        pick.replica(soonest),
        Fixed(best.total(), 1),
        Fixed(best.wait, 1),
        best.uncached,
        pick.replica(soonest),
    );
    pick.decide(soonest, Branch::Balance, reason);
}
