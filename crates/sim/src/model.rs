//! The replica model: tokenisation, a prefix cache of KV blocks, and the latency model.
//!
//! Pure and synchronous: the server feeds it requests and reads back what a vLLM engine
//! would report. No I/O and no clock here; durations are computed, never slept.
//!
//! This is the foundation's deliberately simple model (an LRU set of cached blocks and a
//! linear cost per uncached token); it is enough for prefix-aware routing to change hit
//! rates and TTFT visibly. The paged, continuously-batched engine model replaces it later.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Bytes of UTF-8 text that make one emulated token.
///
/// Documented tokenisation: a prompt of `n` bytes has `ceil(n / 4)` tokens, and token `i`
/// covers bytes `4i..4i+4`. Four bytes per token is the usual rule of thumb for English
/// text with BPE tokenisers; exactness does not matter, determinism does: the same prefix
/// always yields the same tokens and therefore the same blocks.
pub const BYTES_PER_TOKEN: usize = 4;

/// Tunables of one emulated replica.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Tokens per KV block (vLLM's default block size is 16).
    pub block_tokens: usize,
    /// KV capacity of the replica, in blocks.
    pub capacity_blocks: usize,
    /// Concurrent sequences in the running batch (vLLM's `max_num_seqs`).
    pub max_num_seqs: usize,
    /// Prefill cost per uncached prompt token.
    pub prefill_per_token: Duration,
    /// Fixed cost of scheduling a request (tokenisation, first step overhead).
    pub step_overhead: Duration,
    /// Decode step time with a batch of one.
    pub decode_base: Duration,
    /// Extra decode step time per additional running sequence.
    pub decode_per_seq: Duration,
}

impl Default for ModelConfig {
    /// Roughly an 8B model on one modern GPU, scaled to show effects at demo traffic rates.
    fn default() -> Self {
        Self {
            block_tokens: 16,
            capacity_blocks: 4096,
            max_num_seqs: 32,
            prefill_per_token: Duration::from_micros(60),
            step_overhead: Duration::from_millis(4),
            decode_base: Duration::from_millis(8),
            decode_per_seq: Duration::from_micros(150),
        }
    }
}

/// Number of emulated tokens in `text` (see [`BYTES_PER_TOKEN`]).
pub fn token_count(text: &str) -> usize {
    text.len().div_ceil(BYTES_PER_TOKEN)
}

/// Chained hashes of the *full* blocks of `text`: block `i`'s hash covers every byte of
/// blocks `0..=i`, so equal hashes mean equal prefixes, as vLLM's prefix caching requires.
/// A trailing partial block is not cacheable and yields no hash.
pub fn block_hashes(text: &str, block_tokens: usize) -> Vec<u64> {
    let block_bytes = block_tokens.max(1) * BYTES_PER_TOKEN;
    let bytes = text.as_bytes();
    let mut parent = 0xcbf2_9ce4_8422_2325_u64; // FNV offset basis as the root
    bytes
        .chunks_exact(block_bytes)
        .map(|chunk| {
            parent = fnv1a(parent, chunk);
            parent
        })
        .collect()
}

fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    let mut hash = seed;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// An LRU set of cached block hashes with a fixed capacity.
///
/// Recency is a monotonically increasing tick; `order` maps tick -> hash so the least
/// recently used block is the first entry. Both maps stay in step (an invariant the tests
/// check), so memory is bounded by `capacity` entries each.
#[derive(Debug, Clone)]
pub struct PrefixCache {
    capacity: usize,
    tick: u64,
    last_used: HashMap<u64, u64>,
    order: BTreeMap<u64, u64>,
}

impl PrefixCache {
    pub fn new(capacity: usize) -> Self {
        Self { capacity, tick: 0, last_used: HashMap::new(), order: BTreeMap::new() }
    }

    pub fn len(&self) -> usize {
        self.last_used.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last_used.is_empty()
    }

    /// How many leading blocks of `hashes` are cached. Does not touch recency.
    pub fn matched_prefix(&self, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|h| self.last_used.contains_key(h)).count()
    }

    /// Marks every block of `hashes` as most recently used, inserting missing ones and
    /// evicting the least recently used blocks beyond capacity.
    pub fn insert_all(&mut self, hashes: &[u64]) {
        for &hash in hashes {
            self.tick += 1;
            if let Some(old) = self.last_used.insert(hash, self.tick) {
                self.order.remove(&old);
            }
            self.order.insert(self.tick, hash);
        }
        while self.last_used.len() > self.capacity {
            let Some((_, victim)) = self.order.pop_first() else { break };
            self.last_used.remove(&victim);
        }
    }

    pub fn clear(&mut self) {
        self.last_used.clear();
        self.order.clear();
    }
}

/// What the model decides for one admitted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache (a multiple of the block size).
    pub cached_tokens: usize,
    /// Blocks the request holds while it runs (prompt plus room for its output).
    pub held_blocks: usize,
}

/// Cost of the prefill for a request, given how much of its prompt was cached.
pub fn prefill_time(config: &ModelConfig, admission: &Admission) -> Duration {
    let uncached = (admission.prompt_tokens - admission.cached_tokens) as u32;
    config.step_overhead + config.prefill_per_token * uncached
}

/// Time of one decode step with `running` sequences in the batch.
pub fn decode_step_time(config: &ModelConfig, running: usize) -> Duration {
    config.decode_base + config.decode_per_seq * running.saturating_sub(1) as u32
}

/// Admits a request against the cache: counts cached tokens, then records its blocks as
/// most recently used (vLLM caches a prompt's full blocks once they are computed).
pub fn admit(config: &ModelConfig, cache: &mut PrefixCache, prompt: &str, max_tokens: usize) -> Admission {
    let hashes = block_hashes(prompt, config.block_tokens);
    let prompt_tokens = token_count(prompt);
    let cached_tokens = cache.matched_prefix(&hashes) * config.block_tokens;
    cache.insert_all(&hashes);
    let held_blocks = (prompt_tokens + max_tokens).div_ceil(config.block_tokens);
    Admission { prompt_tokens, cached_tokens, held_blocks }
}

/// The emulated output: deterministic words derived from the prompt, so the same request
/// always produces the same completion (streamed or not) and tests can compare them.
pub fn output_tokens(prompt: &str, max_tokens: usize) -> Vec<String> {
    const WORDS: [&str; 16] = [
        "the", "cache", "routes", "tokens", "fleet", "prefix", "replica", "warm", "queue", "batch", "block",
        "latency", "decode", "prefill", "load", "hit",
    ];
    let mut state = fnv1a(0x9e37_79b9_7f4a_7c15, prompt.as_bytes());
    (0..max_tokens)
        .map(|i| {
            // xorshift keeps the sequence deterministic without a dependency.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let word = WORDS[(state % WORDS.len() as u64) as usize];
            if i == 0 { word.to_string() } else { format!(" {word}") }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of_blocks(n: usize, seed: u8) -> String {
        // One block is 16 tokens x 4 bytes = 64 bytes.
        (0..n * 64).map(|i| char::from(b'a' + ((i as u8).wrapping_add(seed)) % 26)).collect()
    }

    #[test]
    fn equal_prefixes_share_block_hashes_and_partial_blocks_are_not_cached() {
        let a = text_of_blocks(3, 0);
        let mut b = text_of_blocks(2, 0);
        b.push_str(&text_of_blocks(1, 7));
        let (ha, hb) = (block_hashes(&a, 16), block_hashes(&b, 16));
        assert_eq!(ha.len(), 3);
        assert_eq!(ha[..2], hb[..2]);
        assert_ne!(ha[2], hb[2]);
        assert!(block_hashes(&a[..63], 16).is_empty());
    }

    #[test]
    fn a_repeated_prefix_hits() {
        let config = ModelConfig::default();
        let mut cache = PrefixCache::new(100);
        let prompt = text_of_blocks(4, 1);
        let first = admit(&config, &mut cache, &prompt, 8);
        assert_eq!(first.cached_tokens, 0);
        let second = admit(&config, &mut cache, &prompt, 8);
        assert_eq!(second.cached_tokens, 64);
        assert!(prefill_time(&config, &second) < prefill_time(&config, &first));
    }

    #[test]
    fn eviction_is_least_recently_used_and_memory_is_bounded() {
        let mut cache = PrefixCache::new(3);
        cache.insert_all(&[1, 2, 3]);
        cache.insert_all(&[1]); // 2 is now the oldest
        cache.insert_all(&[4]);
        assert_eq!(cache.matched_prefix(&[2]), 0);
        assert_eq!(cache.matched_prefix(&[1]), 1);
        assert_eq!(cache.matched_prefix(&[3]), 1);
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.order.len(), cache.last_used.len());
    }

    #[test]
    fn output_is_deterministic_per_prompt() {
        assert_eq!(output_tokens("hello", 5), output_tokens("hello", 5));
        assert_ne!(output_tokens("hello", 5), output_tokens("world", 5));
        assert_eq!(output_tokens("x", 3).len(), 3);
    }

    #[test]
    fn decode_slows_with_batch_size() {
        let config = ModelConfig::default();
        assert!(decode_step_time(&config, 32) > decode_step_time(&config, 1));
        assert_eq!(decode_step_time(&config, 0), config.decode_base);
    }
}
