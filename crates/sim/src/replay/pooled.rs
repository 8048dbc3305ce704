//! The pooled bound: the hit rate of one LRU cache holding the whole fleet's capacity, on the same trace.
//!
//! No routing can do better than pooling every replica's memory into one cache seen by every request,
//! so this is the reference a policy's hit rate is judged against. Precisely: requests in arrival order;
//! each looks up its leading full blocks (capped, as engines cap, so at least one prompt token is computed),
//! counts the matched blocks' tokens as cached, then caches all its blocks, touching them from the last to
//! the first (so under pressure a prefix loses its tail before its head, as engines free tail blocks
//! first). Beyond capacity the least recently touched block is evicted.
//!
//! Its TTFT counterpart ([`reference`]'s `unqueued_ttft_p95_s`): each request's prefill of what the pooled cache misses, run
//! alone on an idle engine. No queueing, no batching, the pooled cache's hits: what a policy's TTFT p95
//! would be with nothing left to win by placement. When round_robin's p95 is already near it, no policy
//! can cut much from it; the gap between the two is what routing can win.

use std::collections::{BTreeMap, HashMap};

use super::prepare::PreparedTrace;
use crate::engine::EngineConfig;
use crate::engine::kv::cacheable_blocks;

/// An LRU set of block hashes with stamps (O(log n) per touch).
#[derive(Debug, Default)]
struct Lru {
    capacity: usize,
    tick: u64,
    stamp: HashMap<u64, u64>,
    order: BTreeMap<u64, u64>,
}

impl Lru {
    fn touch(&mut self, hash: u64) {
        self.tick += 1;
        if let Some(old) = self.stamp.insert(hash, self.tick) {
            self.order.remove(&old);
        }
        self.order.insert(self.tick, hash);
        while self.stamp.len() > self.capacity {
            let Some((_, victim)) = self.order.pop_first() else { break };
            self.stamp.remove(&victim);
        }
    }
}

/// Tokens of each request served from the pooled cache of `capacity_blocks` blocks.
pub fn pooled_cached_tokens(trace: &PreparedTrace, capacity_blocks: u64) -> Vec<u64> {
    let mut lru = Lru { capacity: capacity_blocks as usize, ..Lru::default() };
    let block = u64::from(trace.block_tokens);
    trace
        .requests
        .iter()
        .map(|request| {
            let cacheable =
                cacheable_blocks(request.prompt_tokens, trace.block_tokens, request.block_hashes.len());
            let lookup = &request.block_hashes[..cacheable];
            let matched = lookup.iter().take_while(|h| lru.stamp.contains_key(h)).count() as u64;
            for &hash in request.block_hashes.iter().rev() {
                lru.touch(hash);
            }
            matched * block
        })
        .collect()
}

/// The pooled cache's reference figures for one trace and fleet capacity, from one pass of the pooled LRU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PooledReference {
    /// Pooled cached tokens / prompt tokens: the hit rate no routing passes.
    pub hit_rate: f64,
    /// TTFT p95 (nearest rank, seconds) with the pooled cache's hits and no queueing (see the module docs).
    pub unqueued_ttft_p95_s: f64,
}

/// The pooled cache of `capacity_blocks` blocks over `trace`, with `engine`'s cost model and token budget
/// for the unqueued TTFT: each request's uncached tokens prefilled alone, in chunks of that budget.
pub fn reference(trace: &PreparedTrace, capacity_blocks: u64, engine: &EngineConfig) -> PooledReference {
    let cached = pooled_cached_tokens(trace, capacity_blocks);
    let budget = engine.max_num_batched_tokens.max(1);
    let mut ttfts: Vec<f64> = cached
        .iter()
        .zip(&trace.requests)
        .map(|(&cached, request)| {
            let mut start =
                u32::try_from(cached).unwrap_or(u32::MAX).min(request.prompt_tokens.saturating_sub(1));
            let mut micros = 0;
            while start < request.prompt_tokens {
                let chunk = budget.min(request.prompt_tokens - start);
                micros += engine.cost.step_time(&[(start, chunk)], 0, 0);
                start += chunk;
            }
            micros as f64 / 1e6
        })
        .collect();
    ttfts.sort_by(f64::total_cmp);
    let prompt: u64 = trace.requests.iter().map(|r| u64::from(r.prompt_tokens)).sum();
    let cached: u64 = cached.iter().sum();
    PooledReference {
        hit_rate: if prompt == 0 { 0.0 } else { cached as f64 / prompt as f64 },
        unqueued_ttft_p95_s: fleet_base::quantile::nearest_rank(&ttfts, 0.95).unwrap_or(0.0),
    }
}
