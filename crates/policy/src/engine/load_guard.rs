//! The load guard the cache-aware policies share (consistent_hash's ring included): the owner of a prefix
//! keeps new work only while the request would start there within a bound of where it would start
//! soonest; otherwise it goes there and the prefix is copied.
//!
//! Expected wait is counted in blocks of prefill, the work every replica does at about the same rate:
//! a replica's queued prefill (`active_prefill_blocks`: blocks of its requests still in prefill that were
//! not cached there when routed), plus `decode_wait_weight` per block its decoding requests hold (every
//! engine step also runs their attention over those blocks, which slows the prefill behind them), plus,
//! for this request, the blocks it would recompute there (prompt blocks minus the replica's match). A
//! policy's choice `o` stands when `wait(o) + uncached(o) <= wait(l) + uncached(l) + bound`, where `l` is
//! the eligible replica with the least `wait + uncached` and `bound` is `spread_wait_tokens` in this
//! request's blocks.
//!
//! The bound is set in tokens because a block's size is not the guard's to know: the router cuts 16-token
//! blocks (or 64-byte text chunks), engines 32 or more, a Mooncake trace 512. Set in blocks, one default
//! meant 512 tokens behind a router and 16,384 in a trace replay: the guard tuned on the one spread far too
//! eagerly on the other (2-4 points of hit rate lost on `bench peers`' gen workload for no TTFT gain). The
//! request's own size converts it: tokens per block = prompt tokens / prompt blocks.
//!
//! Requests other routers sent are in none of this engine's counts. Where a replica's reported metrics
//! are fresh, what they hold beyond this engine's own outstanding requests is added to its wait, each
//! request taken to weigh what this engine's own weigh (`Engine::foreign_weights`): a waiting one the mean
//! prefill of the requests this engine routed, a running one what this engine's outstanding requests hold
//! on average now in prefill, plus `decode_wait_weight` x what they hold in decode. Without it, each of
//! several routers over one fleet lets an owner queue up to the bound by itself, so together they queue it
//! to that many times the bound (`cargo xtask bench routers`: kv_precise's TTFT p95 2.02x with 4 routers
//! against 1; 1.10-1.18x with it).
//!
//! The average misjudges traffic whose prompts differ widely in size (a Mooncake prompt's prefill ranges
//! over two orders of magnitude). Routers that publish their own in-flight blocks per replica
//! (`Engine::set_peer_load`; fleet-router through etcd) are counted by those instead, and only the
//! requests the metrics show beyond them by the average.
//!
//! SGLang's balance thresholds and llm-d's queue filter compare request counts, which say nothing of how
//! long the queued prompts are; Dynamo's cost counts the blocks but weighs cache overlap so strongly
//! (overlap_weight 4) that a hot prefix's owner wins until it is several prompts behind. The guard states
//! the trade in the one unit that matters for TTFT and bounds it.

use super::cache_aware::Fixed;
use super::{Engine, PickInProgress, argmin_by};
use crate::decision::Branch;
use crate::request::RequestView;
use crate::spec::{DEFAULT_BLOCK_TOKENS, LoadGuardParams};

/// One eligible replica's figures, in prefill blocks.
#[derive(Clone, Copy)]
struct Start {
    wait: f64,
    uncached: u64,
    /// Of `wait`, the blocks counted for requests other routers sent (their fresh summaries and the
    /// replica's fresh metrics only).
    foreign: f64,
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
    let wait = pick.wait_blocks(engine, position, guard.decode_wait_weight);
    let matched = u64::from(pick.candidates[position].matched_blocks.unwrap_or(0));
    Start { wait: wait.total(), uncached: prompt_blocks.saturating_sub(matched), foreign: wait.foreign }
}

/// `spread_wait_tokens` in blocks of this request's size: the prompt's tokens over its blocks, or the
/// router's default block (`DEFAULT_BLOCK_TOKENS`) for a prompt shorter than one block (whose size says
/// nothing of a block's).
fn bound_blocks(guard: &LoadGuardParams, view: &RequestView) -> f64 {
    let tokens_per_block = match view.block_hashes.len() {
        0 => DEFAULT_BLOCK_TOKENS as f64,
        blocks => (f64::from(view.prompt_tokens) / blocks as f64).max(1.0),
    };
    guard.spread_wait_tokens as f64 / tokens_per_block
}

/// Reviews the policy's choice in `pick` (already decided, matches filled) and moves it when the chosen
/// replica would start this request more than `spread_wait_tokens` later than the soonest eligible one.
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
    let bound = bound_blocks(guard, view);
    if owner.total() <= best.total() + bound {
        return;
    }
    let policy_reason = std::mem::take(&mut pick.reason);
    pick.notes.push(format!("load guard overrode the policy's choice ({policy_reason})"));
    let others = if owner.foreign > 0.0 {
        format!(", {} of them from other routers", Fixed(owner.foreign, 1))
    } else {
        String::new()
    };
    pick.candidates[chosen].note = Some(format!(
        "too busy: {} blocks of queued work{others} + {} to prefill for this prompt",
        Fixed(owner.wait, 1),
        owner.uncached
    ));
    let reason = format!(
        "balance: {} (the policy's choice) would start this prompt after {} blocks of prefill ({} queued{others} + {} \
         uncached), more than spread_wait_tokens {} ({} blocks of this prompt) beyond {}'s {} ({} queued + {} \
         to recompute), so the prefix was spread to {}",
        pick.replica(chosen),
        Fixed(owner.total(), 1),
        Fixed(owner.wait, 1),
        owner.uncached,
        guard.spread_wait_tokens,
        Fixed(bound, 1),
        pick.replica(soonest),
        Fixed(best.total(), 1),
        Fixed(best.wait, 1),
        best.uncached,
        pick.replica(soonest),
    );
    pick.decide(soonest, Branch::Balance, reason);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(prompt_tokens: u32, blocks: u64) -> RequestView {
        RequestView { block_hashes: (0..blocks).collect(), prompt_tokens, session_key: None }
    }

    #[test]
    fn the_bound_is_the_same_tokens_whatever_the_block_size() {
        let guard = LoadGuardParams { enabled: true, spread_wait_tokens: 8192, decode_wait_weight: 0.1 };
        // The router's 16-token blocks, an engine's 32, a Mooncake trace's 512.
        assert_eq!(bound_blocks(&guard, &view(32_000, 2_000)), 512.0);
        assert_eq!(bound_blocks(&guard, &view(32_000, 1_000)), 256.0);
        assert_eq!(bound_blocks(&guard, &view(32_768, 64)), 16.0);
        // A partial last block makes a block look a little longer, never shorter than a token.
        assert!((bound_blocks(&guard, &view(1_010, 63)) - 8192.0 * 63.0 / 1_010.0).abs() < 1e-9);
        assert_eq!(bound_blocks(&guard, &view(3, 8)), 8192.0);
        // A prompt shorter than one block says nothing of a block's size: the nominal one.
        assert_eq!(bound_blocks(&guard, &view(10, 0)), 8192.0 / 16.0);
    }
}
