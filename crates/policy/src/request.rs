//! What a policy sees of a request: its prompt as chained block hashes, its size, and an optional session key.

use serde::{Deserialize, Serialize};

use crate::hashing::{block_hashes_from_text, block_hashes_from_tokens};
use crate::spec::HashingParams;

/// The caller's id for a request, used to match `on_routed` with `on_first_token` and `on_completed`.
pub type RequestId = u64;

/// The routing-relevant view of one request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestView {
    /// Chained block hashes of the prompt (see [`crate::hashing`]).
    pub block_hashes: Vec<u64>,
    /// Prompt length in tokens (estimated by the caller for raw text).
    pub prompt_tokens: u32,
    /// A session or user key (for example a header); `consistent_hash` prefers it when present.
    pub session_key: Option<String>,
}

impl RequestView {
    /// A view of a tokenised prompt.
    pub fn from_tokens(tokens: &[u32], hashing: HashingParams) -> Self {
        Self {
            block_hashes: block_hashes_from_tokens(tokens, hashing.block_tokens),
            prompt_tokens: u32::try_from(tokens.len()).unwrap_or(u32::MAX),
            session_key: None,
        }
    }

    /// A view of a raw-text prompt; the token count is estimated as one token per 4 bytes.
    pub fn from_text(text: &[u8], hashing: HashingParams) -> Self {
        Self {
            block_hashes: block_hashes_from_text(text, hashing.chunk_bytes),
            prompt_tokens: u32::try_from(text.len().div_ceil(4)).unwrap_or(u32::MAX),
            session_key: None,
        }
    }

    /// The same view with a session key.
    pub fn with_session(mut self, key: impl Into<String>) -> Self {
        self.session_key = Some(key.into());
        self
    }
}
