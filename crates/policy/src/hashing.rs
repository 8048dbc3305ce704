//! Block hashing: turns prompts (tokens or raw bytes) into chained block hashes, the keys of the prefix index.
//!
//! # The scheme (stable; other tools may re-implement it)
//!
//! Every hash is XXH3-64 (the reference `xxh3_64_with_seed`). Block `i` is hashed with the hash of block
//! `i - 1` as its seed, and block 0 with [`BLOCK_HASH_SEED`]. A block hash therefore identifies the
//! whole prefix up to and including that block, so two prompts share their first `k` block hashes exactly
//! when they share their first `k` blocks. That property is what lets the index match a prompt with one
//! lookup per block and no tree walk.
//!
//! - Tokens: a block is `block_tokens` consecutive token ids, each written as 4 little-endian bytes.
//!   A trailing partial block is dropped, because inference engines only cache (and report) full blocks.
//! - Raw text (no tokenizer at hand): a block is `chunk_bytes` consecutive bytes of the UTF-8 text, with
//!   no regard for character or token boundaries. The trailing partial chunk IS kept, so that two short
//!   identical prompts still match; it can only ever match an identical prompt tail.
//! - Pre-computed block ids (for example the `hash_ids` of a Mooncake trace): [`chain_block_ids`] chains
//!   them the same way, each id written as 8 little-endian bytes.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of the first block's hash: the bytes of "FleetDk!" read as a little-endian integer.
pub const BLOCK_HASH_SEED: u64 = u64::from_le_bytes(*b"FleetDk!");

/// Chained hashes of `text` cut into `chunk_bytes`-byte chunks (the last chunk may be shorter).
///
/// Returns an empty vector for empty text or `chunk_bytes == 0`.
pub fn block_hashes_from_text(text: &[u8], chunk_bytes: usize) -> Vec<u64> {
    if chunk_bytes == 0 {
        return Vec::new();
    }
    let mut previous = BLOCK_HASH_SEED;
    text.chunks(chunk_bytes)
        .map(|chunk| {
            previous = xxh3_64_with_seed(chunk, previous);
            previous
        })
        .collect()
}

/// Chained hashes of the full `block_tokens`-token blocks of `tokens` (a trailing partial block is dropped).
///
/// Returns an empty vector for `block_tokens == 0`.
pub fn block_hashes_from_tokens(tokens: &[u32], block_tokens: usize) -> Vec<u64> {
    if block_tokens == 0 {
        return Vec::new();
    }
    let mut previous = BLOCK_HASH_SEED;
    // One reusable byte buffer: the hash is defined over little-endian bytes on every platform.
    let mut bytes = Vec::with_capacity(block_tokens * 4);
    tokens
        .chunks_exact(block_tokens)
        .map(|block| {
            bytes.clear();
            for token in block {
                bytes.extend_from_slice(&token.to_le_bytes());
            }
            previous = xxh3_64_with_seed(&bytes, previous);
            previous
        })
        .collect()
}

/// Chains already-assigned per-block ids (for example Mooncake `hash_ids`) into prefix-identifying hashes.
pub fn chain_block_ids(ids: &[u64]) -> Vec<u64> {
    let mut previous = BLOCK_HASH_SEED;
    ids.iter()
        .map(|id| {
            previous = xxh3_64_with_seed(&id.to_le_bytes(), previous);
            previous
        })
        .collect()
}

/// Hash of a session key (for consistent hashing); seeded apart from block hashes.
pub(crate) fn session_key_hash(key: &str) -> u64 {
    xxh3_64_with_seed(key.as_bytes(), BLOCK_HASH_SEED ^ 0x5E55_1011)
}

/// A strong 64-bit finaliser (splitmix64), used where callers may hand in poorly spread keys.
pub(crate) fn mix64(mut value: u64) -> u64 {
    value = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    value = (value ^ (value >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    value ^ (value >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_token_prefix_gives_shared_leading_hashes() {
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[40] = 999;
        let ha = block_hashes_from_tokens(&a, 16);
        let hb = block_hashes_from_tokens(&b, 16);
        assert_eq!(ha.len(), 4);
        assert_eq!(ha[..2], hb[..2]);
        // Chaining: a change in block 2 changes every later hash too.
        assert_ne!(ha[2], hb[2]);
        assert_ne!(ha[3], hb[3]);
    }

    #[test]
    fn partial_token_block_is_dropped_but_partial_text_chunk_is_kept() {
        let tokens: Vec<u32> = (0..20).collect();
        assert_eq!(block_hashes_from_tokens(&tokens, 16).len(), 1);
        assert_eq!(block_hashes_from_text(b"abcdefghij", 4).len(), 3);
        assert!(block_hashes_from_text(b"", 4).is_empty());
        assert!(block_hashes_from_text(b"abc", 0).is_empty());
        assert!(block_hashes_from_tokens(&tokens, 0).is_empty());
    }

    #[test]
    fn text_scheme_is_chained_xxh3_as_documented() {
        let first = xxh3_64_with_seed(b"abcd", BLOCK_HASH_SEED);
        let second = xxh3_64_with_seed(b"ef", first);
        assert_eq!(block_hashes_from_text(b"abcdef", 4), vec![first, second]);
    }

    #[test]
    fn chained_ids_identify_prefixes() {
        let a = chain_block_ids(&[1, 2, 3]);
        let b = chain_block_ids(&[1, 2, 4]);
        let c = chain_block_ids(&[9, 2, 3]);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        assert_ne!(a[1], c[1]);
    }
}
