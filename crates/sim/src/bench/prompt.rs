//! Prompt text synthesised from a trace record's block ids (pure).
//!
//! A Mooncake record carries no text, only `hash_ids`: one id per block of `block_tokens` tokens, where an
//! equal id at the same position means an equal prefix up to that block. To make real engines' prefix caches
//! hit exactly where the trace says they would, each (position, id) pair becomes the same text every time,
//! and different pairs become different text.
//!
//! Size: a block should be about `block_tokens` tokens to whatever tokeniser serves it. The text is made of
//! common three-letter English words, each with its leading space: four bytes, which is one token in
//! fleet-sim's documented tokenisation (4 bytes per token) and one token in the BPE vocabularies of the
//! models people serve (Llama 3's, Qwen's, GPT's all hold " the", " and", " for", ... as single tokens). So a
//! block is `block_tokens` words, `4 * block_tokens` bytes, and roughly `block_tokens` tokens everywhere.

/// Bytes of one word of synthesised text, leading space included.
pub const WORD_BYTES: usize = 4;

/// Common English words that BPE vocabularies keep whole (with their leading space).
const WORDS: [&str; 64] = [
    " the", " and", " for", " are", " but", " not", " you", " all", " any", " can", " her", " was", " one",
    " our", " out", " day", " get", " has", " him", " his", " how", " man", " new", " now", " old", " see",
    " two", " way", " who", " boy", " did", " its", " let", " put", " say", " she", " too", " use", " car",
    " dog", " cat", " run", " sun", " red", " big", " end", " far", " few", " got", " own", " set", " try",
    " why", " ask", " men", " yes", " top", " low", " war", " eye", " air", " job", " lot", " art",
];

/// A fast, well-mixed 64-bit hash step (SplitMix64's finaliser).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Appends `tokens` words of the block at `position` with id `id`. The words depend only on
/// (`position`, `id`), and a shorter block is a prefix of the longer one, so a trailing partial block
/// shares its text with the full block of the same id.
pub fn push_block(out: &mut String, position: usize, id: u64, tokens: usize) {
    let mut state = mix(mix(id) ^ (position as u64).wrapping_mul(0xd6e8_feb8_6659_fd93));
    for _ in 0..tokens {
        state = mix(state);
        out.push_str(WORDS[(state % WORDS.len() as u64) as usize]);
    }
}

/// The prompt of one request: its blocks' text in order, the last block cut to what is left of
/// `input_length`, then, for tokens the ids do not cover, text unique to `request` (no other request shares
/// it, as no id names it). `input_length` tokens in all.
pub fn prompt_text(hash_ids: &[u64], block_tokens: u32, input_length: u32, request: u64) -> String {
    let block = block_tokens.max(1) as usize;
    let total = input_length as usize;
    let mut text = String::with_capacity(total * WORD_BYTES);
    let mut covered = 0;
    for (position, id) in hash_ids.iter().enumerate() {
        if covered >= total {
            break;
        }
        let tokens = block.min(total - covered);
        push_block(&mut text, position, *id, tokens);
        covered += tokens;
    }
    if covered < total {
        // A position no trace id can take (ids are at most u64::MAX, positions of real blocks are small).
        push_block(&mut text, usize::MAX - 1, mix(request ^ 0x5eed), total - covered);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_is_four_bytes() {
        assert!(WORDS.iter().all(|w| w.len() == WORD_BYTES && w.starts_with(' ')));
    }

    #[test]
    fn a_prompt_has_input_length_tokens_of_text() {
        let text = prompt_text(&[1, 2, 3], 16, 40, 0);
        assert_eq!(text.len(), 40 * WORD_BYTES);
        // Ids that cover less than the prompt get a unique tail.
        assert_eq!(prompt_text(&[1], 16, 40, 0).len(), 40 * WORD_BYTES);
    }

    #[test]
    fn equal_ids_at_equal_positions_give_equal_text_and_others_differ() {
        let a = prompt_text(&[7, 8, 9], 16, 48, 1);
        let b = prompt_text(&[7, 8, 10], 16, 48, 2);
        let shared = 2 * 16 * WORD_BYTES;
        assert_eq!(a[..shared], b[..shared], "the shared two-block prefix is equal text");
        assert_ne!(a[shared..], b[shared..], "a different third id is different text");
        // The same id at another position is other text: ids name prefixes, not contents.
        let moved = prompt_text(&[8, 7], 16, 32, 3);
        assert_ne!(moved[..16 * WORD_BYTES], a[..16 * WORD_BYTES]);
    }

    #[test]
    fn a_partial_last_block_is_a_prefix_of_the_full_one() {
        let full = prompt_text(&[4, 5], 16, 32, 0);
        let partial = prompt_text(&[4, 5], 16, 20, 9);
        assert!(full.starts_with(&partial));
    }

    #[test]
    fn unique_tails_differ_between_requests() {
        assert_ne!(prompt_text(&[], 16, 8, 1), prompt_text(&[], 16, 8, 2));
    }
}
