//! Deterministic tokenisation of request text, and prompts as the engine sees them (block hashes).
//!
//! # The scheme (documented; tests and the router rely on it)
//! - Token `i` of a text is bytes `4i..4i+4` of its UTF-8, read as a little-endian `u32`; a trailing
//!   group of 1 to 3 bytes is zero-padded. A text of `n` bytes therefore has `ceil(n / 4)` tokens, as the
//!   foundation model (`model.rs`) counted them.
//! - Block hashes are fleet-policy's chained token hashes ([`fleet_policy::block_hashes_from_tokens`]) over
//!   full blocks of `block_tokens` tokens; a trailing partial block has no hash (engines cache full blocks
//!   only).
//!
//! Because a token is exactly its 4 bytes, a full 16-token block hashes to the same value as fleet-policy's
//! `block_hashes_from_text` over the same 64 bytes: the router's text hashes, the engine's KV-event hashes
//! and a re-hash of the events' token ids all agree, so `kv_precise` needs no translation table.
//! (The one exception: a text whose length is not a multiple of 4 ends in a padded token; its last full
//! block, if it contains that token, differs from the text hash of the 61-63 byte chunk. Such a block is
//! the prompt's last one and only ever matches an identical prompt.)

use std::sync::Arc;

use super::TokenIds;

/// Bytes of UTF-8 per emulated token.
pub const BYTES_PER_TOKEN: usize = 4;

/// Tokens of `text` (see the module docs).
pub fn tokenize(text: &str) -> Vec<u32> {
    text.as_bytes()
        .chunks(BYTES_PER_TOKEN)
        .map(|group| {
            let mut bytes = [0u8; 4];
            bytes[..group.len()].copy_from_slice(group);
            u32::from_le_bytes(bytes)
        })
        .collect()
}

/// A prompt as the engine needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    /// Prompt length in tokens.
    pub tokens: u32,
    /// Chained hashes of the full blocks, in order (at most `tokens / block_tokens` of them; fewer is
    /// allowed and means the rest is not cacheable).
    pub block_hashes: Vec<u64>,
    /// Token ids, when known (serve mode), for KV events' `token_ids`.
    pub token_ids: Option<TokenIds>,
}

impl Prompt {
    /// A prompt known only by its size and block hashes (replay of a trace).
    pub fn from_hashes(tokens: u32, block_hashes: Vec<u64>) -> Self {
        Self { tokens, block_hashes, token_ids: None }
    }

    /// A prompt from its token ids.
    pub fn from_tokens(token_ids: Vec<u32>, block_tokens: u32) -> Self {
        let block_hashes = fleet_policy::block_hashes_from_tokens(&token_ids, block_tokens as usize);
        Self {
            tokens: u32::try_from(token_ids.len()).unwrap_or(u32::MAX),
            block_hashes,
            token_ids: Some(Arc::from(token_ids)),
        }
    }
}

/// The prompt of a request text: tokenised as documented, hashed in `block_tokens`-token blocks.
pub fn prompt_of_text(text: &str, block_tokens: u32) -> Prompt {
    Prompt::from_tokens(tokenize(text), block_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_bytes_per_token_and_partial_tokens_are_padded() {
        assert_eq!(tokenize(""), Vec::<u32>::new());
        assert_eq!(tokenize("abcd"), vec![u32::from_le_bytes(*b"abcd")]);
        assert_eq!(tokenize("abcde"), vec![u32::from_le_bytes(*b"abcd"), u32::from(b'e')]);
        assert_eq!(tokenize(&"x".repeat(9)).len(), 3);
    }

    #[test]
    fn full_blocks_hash_like_the_routers_text_hashes() {
        let text: String = (0..200).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let prompt = prompt_of_text(&text, 16);
        assert_eq!(prompt.tokens, 50);
        assert_eq!(prompt.block_hashes.len(), 3, "50 tokens = 3 full blocks of 16");
        let text_hashes = fleet_policy::block_hashes_from_text(text.as_bytes(), 64);
        assert_eq!(prompt.block_hashes[..], text_hashes[..3]);
    }

    #[test]
    fn the_same_prefix_gives_the_same_blocks() {
        let shared = "system prompt ".repeat(20);
        let a = prompt_of_text(&format!("{shared}question one"), 16);
        let b = prompt_of_text(&format!("{shared}another question"), 16);
        let common = shared.len() / 64;
        assert!(common >= 4);
        assert_eq!(a.block_hashes[..common], b.block_hashes[..common]);
    }
}
