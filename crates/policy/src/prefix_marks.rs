//! Prefix marks: a few of a prompt's chained block hashes, what routers tell each other of the prompts
//! they routed so that each can place a prefix where another one already sent it.
//!
//! A chained block hash names the whole prefix up to its block (see [`crate::hashing`]), so a replica
//! that holds the block at position `p` holds the prompt's first `p` blocks. Sending every hash of every
//! prompt to every other router costs too much (a 10,000-token prompt is 625 blocks of 16 tokens), so a
//! router sends only the hashes at *mark positions*: every position up to 16, then the positions with at
//! most four significant bits (18, 20, ..., 32, 36, ..., 64, 72, ...), eight per doubling of the prompt.
//! A prompt that does not end on a mark position also sends its last hash, the whole prompt's: the next
//! turn of a conversation holds the whole of the last one, and that match is then exact. A 625-block
//! prompt has 58 marks. Any other match found through marks is rounded down to the mark before it, so it
//! is short by less than an eighth of its length, and none claims more than the other router routed.
//!
//! The positions are fixed, so the receiver needs no positions on the wire: a prompt's marks are its
//! hashes at [`mark_positions`], in order, then its last hash when that is not one of them. The last one's
//! position is found by looking for it between the last mark matched and the next (at most an eighth of
//! the prompt), where a chained hash can only be found at its own position.

/// Significant bits a mark position may have past the first 16 positions (8 marks per doubling).
const MARK_SIGNIFICANT_BITS: u32 = 4;

/// The mark positions (1-based block counts) of a prompt of `blocks` blocks, in increasing order.
pub fn mark_positions(blocks: usize) -> impl Iterator<Item = usize> {
    std::iter::successors(Some(1usize), |&position| next_mark_position(position))
        .take_while(move |&position| position <= blocks)
}

/// The mark position after `position` (itself a mark position), or `None` past `usize::MAX`.
pub(crate) fn next_mark_position(position: usize) -> Option<usize> {
    let bits = usize::BITS - position.leading_zeros();
    position.checked_add(1 << bits.saturating_sub(MARK_SIGNIFICANT_BITS))
}

/// Whether `position` (a 1-based block count) is a mark position; 0 counts as one (it has no blocks).
fn is_mark_position(position: usize) -> bool {
    position <= 16
        || usize::BITS - position.leading_zeros() - position.trailing_zeros() <= MARK_SIGNIFICANT_BITS
}

/// The marks of a prompt: its chained block hashes at [`mark_positions`], in order, then its last hash
/// when the prompt does not end on a mark position.
pub fn marks_of(block_hashes: &[u64]) -> Vec<u64> {
    let mut marks: Vec<u64> =
        mark_positions(block_hashes.len()).map(|position| block_hashes[position - 1]).collect();
    if !is_mark_position(block_hashes.len()) {
        marks.extend(block_hashes.last());
    }
    marks
}

/// How many leading blocks of `block_hashes` the prompt with `marks` is known to share: the last mark
/// position, in order, at which both have the same hash (0 when the first differs), or further, where the
/// other prompt ended before the next mark position and `block_hashes` holds all of it.
pub fn shared_blocks(marks: &[u64], block_hashes: &[u64]) -> usize {
    let mut shared = 0;
    let mut next_mark = marks.iter();
    let mut unmatched = block_hashes.len() + 1;
    for position in mark_positions(block_hashes.len()) {
        if next_mark.next() != Some(&block_hashes[position - 1]) {
            unmatched = position;
            break;
        }
        shared = position;
    }
    let ended_before_next_mark = marks
        .last()
        .and_then(|last| block_hashes[shared..unmatched - 1].iter().position(|hash| hash == last));
    shared + ended_before_next_mark.map_or(0, |offset| offset + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_positions_are_dense_at_first_then_eight_per_doubling() {
        let positions: Vec<usize> = mark_positions(80).collect();
        let mut expected: Vec<usize> = (1..=16).collect();
        expected.extend([18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60, 64, 72, 80]);
        assert_eq!(positions, expected);
        assert_eq!(mark_positions(625).count(), 57);
        let prompt: Vec<u64> = (0..625).collect();
        assert_eq!(marks_of(&prompt).last(), Some(&624), "the last hash follows the 57 marks");
        assert_eq!(marks_of(&prompt[..64]).len(), 32, "64 is a mark position: no hash twice");
        assert_eq!(mark_positions(0).count(), 0);
        assert!(marks_of(&[]).is_empty());
        // Every mark position has at most four significant bits past 16, and the walk never overflows.
        let walked: Vec<usize> = mark_positions(usize::MAX).take(2_000).collect();
        assert!(walked.iter().all(|&position| is_mark_position(position)));
        let listed: Vec<usize> = (1..=10_000).filter(|&position| is_mark_position(position)).collect();
        assert_eq!(listed, mark_positions(10_000).collect::<Vec<_>>());
    }

    #[test]
    fn a_shared_prefix_is_found_to_within_an_eighth_and_never_overstated() {
        let ours: Vec<u64> = (0..100).collect();
        // The other prompt shares the first 45 blocks, then differs.
        let theirs: Vec<u64> = (0..45).chain(1_000..1_060).collect();
        let marks = marks_of(&theirs);
        assert_eq!(shared_blocks(&marks, &ours), 44, "the last mark position at or before 45");
        assert_eq!(shared_blocks(&marks, &theirs), 105, "its own prompt, to the end");
        assert_eq!(shared_blocks(&marks, &ours[..10]), 10, "a shorter prompt matches as far as it goes");
        // A prompt holding the whole of another (the next turn of its conversation) shares all of it, though
        // it ended between mark positions (45 lies between 44 and 48).
        assert_eq!(shared_blocks(&marks_of(&ours[..45]), &ours), 45);
        assert_eq!(shared_blocks(&marks_of(&ours[..45]), &ours[..46]), 45);
        assert_eq!(shared_blocks(&marks_of(&ours[..45]), &ours[..45]), 45);
        assert_eq!(shared_blocks(&marks_of(&ours[..45]), &ours[..44]), 44);
        assert_eq!(shared_blocks(&marks, &[7, 8]), 0);
        assert_eq!(shared_blocks(&[], &ours), 0);
    }
}
