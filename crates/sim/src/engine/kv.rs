//! The paged KV cache: fixed blocks, prefix caching by block hash, reference counts, LRU free queue.
//!
//! Mirrors vLLM V1's block pool: a block is either held by running requests (`ref_count > 0`) or free. Free
//! blocks sit in one queue ordered by when they were freed; allocation takes the head (least recently
//! freed), and if that block still holds a cached prefix, the prefix is evicted then (and reported). A
//! prefix hit on a free block takes it out of the queue. So eviction is exactly LRU over free blocks, and
//! blocks of running requests are never evicted.

use std::collections::HashMap;

/// End of the intrusive free list.
const NIL: u32 = u32::MAX;

/// A block index in the cache.
pub type BlockId = u32;

/// How many leading blocks of a `tokens`-token sequence a prefix-cache hit may cover, of the `hashed` full
/// blocks it has. At least one token is always computed (vLLM caps a hit at `num_tokens - 1`), so a prompt
/// of exactly N blocks can hit N - 1 of them. The one rule for the engine model and the pooled bound.
pub fn cacheable_blocks(tokens: u32, block_tokens: u32, hashed: usize) -> usize {
    let whole = tokens.saturating_sub(1) / block_tokens.max(1);
    hashed.min(whole as usize)
}

/// The block pool.
#[derive(Clone, Debug)]
pub struct KvCache {
    /// Hash of each block's content, if it is a full, computed, cached block.
    hash: Vec<Option<u64>>,
    ref_count: Vec<u32>,
    /// Free queue as a doubly linked list over block ids.
    prev: Vec<u32>,
    next: Vec<u32>,
    in_free: Vec<bool>,
    head: u32,
    tail: u32,
    free_len: u32,
    /// Cached block by hash.
    cached: HashMap<u64, BlockId>,
}

impl KvCache {
    /// A cache of `blocks` free, empty blocks (`blocks >= 1`).
    pub fn new(blocks: u32) -> Self {
        let n = blocks as usize;
        let mut cache = Self {
            hash: vec![None; n],
            ref_count: vec![0; n],
            prev: vec![NIL; n],
            next: vec![NIL; n],
            in_free: vec![false; n],
            head: NIL,
            tail: NIL,
            free_len: 0,
            cached: HashMap::new(),
        };
        for block in 0..blocks {
            cache.push_free(block);
        }
        cache
    }

    /// Blocks in the cache.
    pub fn capacity(&self) -> u32 {
        self.hash.len() as u32
    }

    /// Blocks not held by any request (cached or empty).
    pub fn free_blocks(&self) -> u32 {
        self.free_len
    }

    /// Blocks held by requests.
    pub fn used_blocks(&self) -> u32 {
        self.capacity() - self.free_len
    }

    /// Cached blocks (held or free).
    pub fn cached_blocks(&self) -> usize {
        self.cached.len()
    }

    /// Free blocks that still hold a cached prefix.
    pub fn cached_free_blocks(&self) -> u32 {
        self.cached.values().filter(|&&b| self.ref_count[b as usize] == 0).count() as u32
    }

    /// Whether a block with this hash is cached.
    pub fn contains(&self, hash: u64) -> bool {
        self.cached.contains_key(&hash)
    }

    /// How many leading hashes of `hashes` are cached, and how many of those blocks are free (a hit on a
    /// free block takes it out of the free pool). Changes nothing.
    pub fn lookup(&self, hashes: &[u64]) -> (usize, u32) {
        let mut free_hits = 0;
        let mut matched = 0;
        for hash in hashes {
            let Some(&block) = self.cached.get(hash) else { break };
            matched += 1;
            free_hits += u32::from(self.ref_count[block as usize] == 0);
        }
        (matched, free_hits)
    }

    /// Takes a reference on the cached block with `hash` (a prefix hit). Returns it, or `None` if not cached.
    pub fn acquire_cached(&mut self, hash: u64) -> Option<BlockId> {
        let block = *self.cached.get(&hash)?;
        if self.ref_count[block as usize] == 0 {
            self.unlink(block);
        }
        self.ref_count[block as usize] += 1;
        Some(block)
    }

    /// Allocates an empty block (reference count 1) from the head of the free queue. When that block
    /// held a cached prefix, its hash is evicted and returned as the second value.
    pub fn allocate(&mut self) -> Option<(BlockId, Option<u64>)> {
        let block = self.head;
        if block == NIL {
            return None;
        }
        self.unlink(block);
        let evicted = self.hash[block as usize].take();
        if let Some(hash) = evicted {
            self.cached.remove(&hash);
        }
        self.ref_count[block as usize] = 1;
        Some((block, evicted))
    }

    /// Records that a held block is full and computed with content `hash`. Returns false (and leaves the
    /// block uncached) when another block already caches that hash, as vLLM keeps the first copy.
    pub fn commit(&mut self, block: BlockId, hash: u64) -> bool {
        if self.hash[block as usize].is_some() || self.cached.contains_key(&hash) {
            return false;
        }
        self.hash[block as usize] = Some(hash);
        self.cached.insert(hash, block);
        true
    }

    /// Drops one reference; a block no one holds joins the tail of the free queue (most recently used).
    pub fn release(&mut self, block: BlockId) {
        let count = &mut self.ref_count[block as usize];
        debug_assert!(*count > 0, "release of a free block");
        *count = count.saturating_sub(1);
        if *count == 0 && !self.in_free[block as usize] {
            self.push_free(block);
        }
    }

    /// Forgets every cached prefix if no block is held (vLLM's `reset_prefix_cache` refuses otherwise).
    /// Returns whether it reset.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.used_blocks() > 0 {
            return false;
        }
        self.cached.clear();
        self.hash.iter_mut().for_each(|h| *h = None);
        true
    }

    /// Free cached hashes from least to most recently used (the eviction order), for tests and display.
    pub fn eviction_order(&self) -> Vec<u64> {
        let mut order = Vec::new();
        let mut block = self.head;
        while block != NIL {
            if let Some(hash) = self.hash[block as usize] {
                order.push(hash);
            }
            block = self.next[block as usize];
        }
        order
    }

    fn push_free(&mut self, block: BlockId) {
        let b = block as usize;
        self.prev[b] = self.tail;
        self.next[b] = NIL;
        if self.tail == NIL {
            self.head = block;
        } else {
            self.next[self.tail as usize] = block;
        }
        self.tail = block;
        self.in_free[b] = true;
        self.free_len += 1;
    }

    fn unlink(&mut self, block: BlockId) {
        let b = block as usize;
        debug_assert!(self.in_free[b]);
        let (prev, next) = (self.prev[b], self.next[b]);
        if prev == NIL {
            self.head = next;
        } else {
            self.next[prev as usize] = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.prev[next as usize] = prev;
        }
        self.prev[b] = NIL;
        self.next[b] = NIL;
        self.in_free[b] = false;
        self.free_len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_always_leaves_the_last_token_to_compute() {
        assert_eq!(cacheable_blocks(0, 16, 4), 0);
        assert_eq!(cacheable_blocks(32, 16, 2), 1, "exactly two blocks: the second is recomputed");
        assert_eq!(cacheable_blocks(33, 16, 2), 2);
        assert_eq!(cacheable_blocks(1000, 16, 3), 3, "no more than the hashed blocks");
    }

    /// Allocates, commits and releases one block per hash (a finished request of those blocks).
    fn cache_blocks(cache: &mut KvCache, hashes: &[u64]) {
        let blocks: Vec<BlockId> = hashes
            .iter()
            .map(|&h| {
                let (block, _) = cache.allocate().expect("free block");
                assert!(cache.commit(block, h));
                block
            })
            .collect();
        for block in blocks {
            cache.release(block);
        }
    }

    #[test]
    fn eviction_is_lru_over_free_blocks_and_held_blocks_are_never_evicted() {
        let mut cache = KvCache::new(4);
        cache_blocks(&mut cache, &[1, 2, 3, 4]);
        assert_eq!(cache.eviction_order(), vec![1, 2, 3, 4]);
        // A hit on 1 holds it: it leaves the free queue; releasing makes it the most recent.
        let one = cache.acquire_cached(1).expect("cached");
        assert_eq!(cache.free_blocks(), 3);
        let (_, evicted) = cache.allocate().expect("block");
        assert_eq!(evicted, Some(2), "the least recently used free block goes first");
        cache.release(one);
        assert_eq!(cache.eviction_order(), vec![3, 4, 1]);
        assert_eq!(cache.lookup(&[1, 2, 3]), (1, 1));
        assert_eq!(cache.lookup(&[3, 4]), (2, 2));
    }

    #[test]
    fn duplicates_are_not_cached_twice_and_reset_needs_an_idle_cache() {
        let mut cache = KvCache::new(2);
        let (a, _) = cache.allocate().expect("a");
        let (b, _) = cache.allocate().expect("b");
        assert!(cache.commit(a, 7));
        assert!(!cache.commit(b, 7));
        assert_eq!(cache.cached_blocks(), 1);
        assert!(!cache.reset_prefix_cache(), "blocks are held");
        cache.release(a);
        cache.release(b);
        assert_eq!(cache.cached_free_blocks(), 1);
        assert!(cache.reset_prefix_cache());
        assert_eq!(cache.lookup(&[7]), (0, 0));
        assert!(cache.allocate().is_some() && cache.allocate().is_some() && cache.allocate().is_none());
    }
}
