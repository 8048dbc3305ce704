//! KV-cache events from replicas (block stored, removed, all cleared) and a translator from engine hashes.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::hashing::BLOCK_HASH_SEED;

/// Where a replica holds a block. Matching uses the GPU tier; the others are tracked for display.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Medium {
    /// Accelerator memory: what prefill can reuse directly.
    Gpu,
    /// Host-memory offload tier.
    Cpu,
    /// Disk or remote offload tier.
    Disk,
}

impl Medium {
    /// Every medium, in index order.
    pub const ALL: [Medium; 3] = [Medium::Gpu, Medium::Cpu, Medium::Disk];

    pub(crate) fn index(self) -> usize {
        match self {
            Medium::Gpu => 0,
            Medium::Cpu => 1,
            Medium::Disk => 2,
        }
    }
}

/// One KV-cache event from one replica, with block hashes in this crate's chained scheme.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KvEvent {
    /// The replica now holds these blocks (prompt order).
    Stored {
        /// Tier.
        medium: Medium,
        /// Chained block hashes.
        block_hashes: Vec<u64>,
    },
    /// The replica dropped these blocks.
    Removed {
        /// Tier.
        medium: Medium,
        /// Chained block hashes.
        block_hashes: Vec<u64>,
    },
    /// The replica dropped everything in one tier, or in every tier when `medium` is `None`.
    AllCleared {
        /// Tier, or all.
        medium: Option<Medium>,
    },
}

/// Turns an inference engine's own block hashes (vLLM-style events carrying a parent hash and token ids)
/// into this crate's chained hashes, one translator per replica.
///
/// Why: engines hash blocks their own way (and may salt them per process), so the router cannot compare
/// them with hashes of incoming prompts. Re-hashing the event's tokens with the crate's scheme, chained
/// from the translated parent, gives the hash the router computes for the same prompt prefix.
#[derive(Clone, Debug, Default)]
pub struct EngineHashTranslator {
    ours_by_engine: HashMap<u64, u64>,
}

impl EngineHashTranslator {
    /// An empty translator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Translates a "blocks stored" event: `engine_hashes[i]` covers `token_ids[i*block_tokens..][..block_tokens]`.
    /// Returns `None` when the parent was never seen (its chain is unknown, so nothing can be indexed) or
    /// the token count does not cover the blocks.
    pub fn stored(
        &mut self,
        parent_engine_hash: Option<u64>,
        engine_hashes: &[u64],
        token_ids: &[u32],
        block_tokens: usize,
    ) -> Option<Vec<u64>> {
        if block_tokens == 0 || token_ids.len() < engine_hashes.len() * block_tokens {
            return None;
        }
        let mut previous = match parent_engine_hash {
            Some(parent) => *self.ours_by_engine.get(&parent)?,
            None => BLOCK_HASH_SEED,
        };
        let mut bytes = Vec::with_capacity(block_tokens * 4);
        let mut ours = Vec::with_capacity(engine_hashes.len());
        for (engine_hash, block) in engine_hashes.iter().zip(token_ids.chunks_exact(block_tokens)) {
            bytes.clear();
            for token in block {
                bytes.extend_from_slice(&token.to_le_bytes());
            }
            previous = xxh3_64_with_seed(&bytes, previous);
            self.ours_by_engine.insert(*engine_hash, previous);
            ours.push(previous);
        }
        Some(ours)
    }

    /// Translates a "blocks removed" event, forgetting the mapping; unknown hashes are skipped.
    pub fn removed(&mut self, engine_hashes: &[u64]) -> Vec<u64> {
        engine_hashes.iter().filter_map(|hash| self.ours_by_engine.remove(hash)).collect()
    }

    /// Forgets every mapping (the replica cleared its cache).
    pub fn cleared(&mut self) {
        self.ours_by_engine.clear();
    }

    /// Engine hashes currently mapped.
    pub fn len(&self) -> usize {
        self.ours_by_engine.len()
    }

    /// Whether no engine hash is mapped.
    pub fn is_empty(&self) -> bool {
        self.ours_by_engine.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::block_hashes_from_tokens;

    #[test]
    fn translated_hashes_equal_prompt_hashes() {
        let tokens: Vec<u32> = (100..164).collect();
        let mut translator = EngineHashTranslator::new();
        let first = translator.stored(None, &[901, 902], &tokens[..32], 16).expect("root event");
        let rest = translator.stored(Some(902), &[903, 904], &tokens[32..], 16).expect("child event");
        let ours: Vec<u64> = first.into_iter().chain(rest).collect();
        assert_eq!(ours, block_hashes_from_tokens(&tokens, 16));
        assert_eq!(translator.stored(Some(777), &[1], &tokens[..16], 16), None, "unknown parent");
        assert_eq!(translator.removed(&[903, 12345]), vec![ours[2]]);
        assert_eq!(translator.len(), 3);
        translator.cleared();
        assert!(translator.is_empty());
    }
}
