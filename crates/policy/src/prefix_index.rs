//! The prefix index shared by the cache-aware policies: which location (replica) holds which chained block.
//!
//! Keys are chained block hashes (see [`crate::hashing`]): a hash names a whole prefix, so a prompt is
//! matched by looking its block hashes up in order and keeping the set of locations that still hold every
//! block so far. That is one table lookup per prompt block, O(prompt blocks), with no tree to walk, and it
//! stops as soon as no location is left.
//!
//! The same structure serves both feeds: `cache_aware_approx` inserts the blocks of each prompt it routed
//! (the router's guess of what the replica cached), `kv_precise` applies the replicas' own KV events.
//!
//! Memory is bounded per location: past `capacity_per_location` blocks, the least recently stored or
//! refreshed block of that location is evicted (exact LRU, kept with a stamped queue that is compacted
//! when stale entries pile up).

use std::collections::VecDeque;

use crate::table::WordTable;

/// A location in the index: the engine uses a replica's slot number.
pub type Location = u32;

/// What an [`PrefixIndex::insert`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InsertOutcome {
    /// Blocks the location did not hold before.
    pub added: usize,
    /// Blocks it held already; their recency was refreshed.
    pub refreshed: usize,
    /// Blocks evicted (least recently used first) to stay within capacity.
    pub evicted: usize,
}

#[derive(Clone, Debug)]
struct LocationBlocks {
    /// Block hash -> stamp of its latest store or refresh.
    stamps: WordTable,
    /// (block, stamp) in store order; an entry is stale when the block's stamp has moved on.
    recency: VecDeque<(u64, u64)>,
}

impl LocationBlocks {
    fn new() -> Self {
        Self { stamps: WordTable::new(1), recency: VecDeque::new() }
    }
}

/// The prefix index. See the module docs.
#[derive(Clone, Debug)]
pub struct PrefixIndex {
    /// Block hash -> bitset of the locations holding it.
    members: WordTable,
    locations: Vec<LocationBlocks>,
    capacity_per_location: usize,
    /// Monotonic stamp source for recency; counts block touches, not time, so it needs no clock.
    touches: u64,
}

impl PrefixIndex {
    /// An empty index that keeps at most `capacity_per_location` blocks per location (at least 1).
    pub fn new(capacity_per_location: usize) -> Self {
        Self {
            members: WordTable::new(1),
            locations: Vec::new(),
            capacity_per_location: capacity_per_location.max(1),
            touches: 0,
        }
    }

    /// The per-location capacity in blocks.
    pub fn capacity_per_location(&self) -> usize {
        self.capacity_per_location
    }

    /// Changes the per-location capacity, evicting least recently used blocks where now over it.
    pub fn set_capacity_per_location(&mut self, capacity: usize) {
        self.capacity_per_location = capacity.max(1);
        for location in 0..self.locations.len() {
            Self::evict_over_capacity(
                &mut self.members,
                &mut self.locations[location],
                location,
                self.capacity_per_location,
            );
        }
    }

    fn ensure_location(&mut self, location: Location) -> usize {
        let location = location as usize;
        if location >= self.locations.len() {
            self.locations.resize_with(location + 1, LocationBlocks::new);
            self.members.widen_values(location / 64 + 1);
        }
        location
    }

    /// Records that `location` holds `blocks` (in prompt order), refreshing the ones it held already.
    pub fn insert(&mut self, location: Location, blocks: &[u64]) -> InsertOutcome {
        let location = self.ensure_location(location);
        let (word, bit) = (location / 64, 1u64 << (location % 64));
        let held = &mut self.locations[location];
        let mut outcome = InsertOutcome::default();
        for &block in blocks {
            self.touches += 1;
            let (stamp, inserted) = held.stamps.get_or_insert(block);
            stamp[0] = self.touches;
            held.recency.push_back((block, self.touches));
            if inserted {
                self.members.get_or_insert(block).0[word] |= bit;
                outcome.added += 1;
            } else {
                outcome.refreshed += 1;
            }
        }
        outcome.evicted =
            Self::evict_over_capacity(&mut self.members, held, location, self.capacity_per_location);
        // Refreshes and removals leave stale queue entries behind; drop them once they outnumber live ones.
        if held.recency.len() > 2 * held.stamps.len() + 64 {
            let stamps = &held.stamps;
            held.recency.retain(|(block, stamp)| stamps.get(*block).is_some_and(|s| s[0] == *stamp));
        }
        outcome
    }

    fn evict_over_capacity(
        members: &mut WordTable,
        held: &mut LocationBlocks,
        location: usize,
        capacity: usize,
    ) -> usize {
        let mut evicted = 0;
        while held.stamps.len() > capacity {
            let Some((block, stamp)) = held.recency.pop_front() else {
                break;
            };
            if held.stamps.get(block).is_some_and(|s| s[0] == stamp) {
                held.stamps.remove(block);
                Self::clear_member(members, block, location);
                evicted += 1;
            }
        }
        evicted
    }

    fn clear_member(members: &mut WordTable, block: u64, location: usize) {
        if let Some(words) = members.get_mut(block) {
            words[location / 64] &= !(1u64 << (location % 64));
            if words.iter().all(|w| *w == 0) {
                members.remove(block);
            }
        }
    }

    /// Forgets that `location` holds `blocks`; returns how many it did hold.
    pub fn remove(&mut self, location: Location, blocks: &[u64]) -> usize {
        let Some(held) = self.locations.get_mut(location as usize) else {
            return 0;
        };
        let mut removed = 0;
        for &block in blocks {
            if held.stamps.remove(block) {
                Self::clear_member(&mut self.members, block, location as usize);
                removed += 1;
            }
        }
        removed
    }

    /// Forgets everything `location` holds; returns how many blocks that was.
    pub fn clear_location(&mut self, location: Location) -> usize {
        let Some(held) = self.locations.get_mut(location as usize) else {
            return 0;
        };
        let blocks: Vec<u64> = held.stamps.iter().map(|(block, _)| block).collect();
        for &block in &blocks {
            Self::clear_member(&mut self.members, block, location as usize);
        }
        *held = LocationBlocks::new();
        blocks.len()
    }

    /// For every location `0..location_count()`, how many leading blocks of `prompt` it holds
    /// consecutively; written into `matched` (resized to fit). O(prompt blocks), stops early once no
    /// location is left.
    pub fn match_prefix(&self, prompt: &[u64], matched: &mut Vec<u32>) {
        matched.clear();
        matched.resize(self.locations.len(), 0);
        self.match_prefix_into(prompt, matched);
    }

    /// [`Self::match_prefix`] into a caller's zeroed slice (the engine passes a stack buffer, so a pick
    /// allocates nothing here). Locations past `matched.len()` are ignored.
    pub(crate) fn match_prefix_into(&self, prompt: &[u64], matched: &mut [u32]) {
        let Some((&first, rest)) = prompt.split_first() else {
            return;
        };
        let words = self.members.value_words();
        if words == 1 {
            // Up to 64 locations, the usual fleet: the active set is one register, so each block costs a
            // load, a compare and an AND, with no slices or per-word loops.
            let Some(holders) = self.members.get(first) else {
                return;
            };
            return self.match_one_word(holders[0], rest, matched);
        }
        // Up to 512 locations live on the stack; more spill to the heap once per call.
        let mut inline = [0u64; 8];
        let mut spilled = Vec::new();
        let active: &mut [u64] = if words <= inline.len() {
            &mut inline[..words]
        } else {
            spilled.resize(words, 0);
            &mut spilled
        };
        let Some(holders) = self.members.get(first) else {
            return;
        };
        active.copy_from_slice(holders);
        if active.iter().all(|w| *w == 0) {
            return;
        }
        let mut depth = 1u32;
        let mut homes = [(0usize, 0u64); LOOKAHEAD];
        for chunk in rest.chunks(LOOKAHEAD) {
            // Issue this chunk's table loads first: they are independent, so their cache misses overlap
            // instead of being paid one after another in the matching loop below.
            for (home, block) in homes.iter_mut().zip(chunk) {
                *home = self.members.peek_home(*block);
            }
            for (block, (home, key_at_home)) in chunk.iter().zip(homes) {
                let Some(holders) = self.members.get_from_home(*block, home, key_at_home) else {
                    return finish(matched, active, depth);
                };
                let mut still_active = 0u64;
                for (word, (active_word, holder_word)) in active.iter_mut().zip(holders).enumerate() {
                    let dropped = *active_word & !holder_word;
                    if dropped != 0 {
                        record(matched, word, dropped, depth);
                        *active_word &= holder_word;
                    }
                    still_active |= *active_word;
                }
                if still_active == 0 {
                    return;
                }
                depth += 1;
            }
        }
        finish(matched, active, depth);
    }

    /// The walk after the first block when every bitset is one word (see `match_prefix_into`).
    fn match_one_word(&self, mut active: u64, rest: &[u64], matched: &mut [u32]) {
        // A plain loop: the only loop-carried state is `active`, and the found-at-home branch predicts
        // well, so the CPU runs ahead and overlaps the table loads of many blocks by itself. The general
        // walk's separate load-issuing pass measured ~35% slower here: it only added instructions.
        for (position, block) in rest.iter().enumerate() {
            let (key_at_home, value_at_home) = self.members.peek_home_word(*block);
            // A missing block has no holders: every active location drops out at this depth.
            let holders = self.members.word_from_home(*block, key_at_home, value_at_home);
            let dropped = active & !holders;
            if dropped != 0 {
                record(matched, 0, dropped, position as u32 + 1);
                active &= holders;
                if active == 0 {
                    return;
                }
            }
        }
        record(matched, 0, active, rest.len() as u32 + 1);
    }

    /// For an index of prefix marks (see [`crate::prefix_marks`]): for every location, the last mark
    /// position of `prompt` whose hash it holds, raised into `matched` (zeroed by the caller). Looks up
    /// only the mark positions and stops at the first no location holds: a location holding a later mark
    /// of the same chain held this one too. Then, after each location's last mark, it looks up the
    /// positions before the next, where a prompt that ended between marks left its last hash (at most an
    /// eighth of the prompt per distinct last mark).
    pub(crate) fn match_marks_into(&self, prompt: &[u64], matched: &mut [u32]) {
        fn raise(matched: &mut [u32], holders: &[u64], position: usize) {
            for (word, bits) in holders.iter().enumerate() {
                let mut bits = *bits;
                while bits != 0 {
                    let location = word * 64 + bits.trailing_zeros() as usize;
                    if let Some(slot) = matched.get_mut(location) {
                        *slot = (*slot).max(position as u32);
                    }
                    bits &= bits - 1;
                }
            }
        }
        for position in crate::prefix_marks::mark_positions(prompt.len()) {
            let Some(holders) = self.members.get(prompt[position - 1]) else { break };
            raise(matched, holders, position);
        }
        // The locations' last marks, each once (a location with none holds no prompt sharing block 1).
        let mut last_marks: Vec<u32> = matched.iter().copied().filter(|&last| last > 0).collect();
        last_marks.sort_unstable();
        last_marks.dedup();
        for last in last_marks {
            let last = last as usize;
            let next = crate::prefix_marks::next_mark_position(last).unwrap_or(usize::MAX);
            for position in last + 1..next.min(prompt.len() + 1) {
                if let Some(holders) = self.members.get(prompt[position - 1]) {
                    raise(matched, holders, position);
                }
            }
        }
    }

    /// For an index of prefix marks: how many leading blocks of `prompt` one location is known to hold,
    /// as [`PrefixIndex::match_marks_into`] finds for it (the last mark it holds, or further where a prompt
    /// sent there ended between marks).
    pub(crate) fn match_marks_location(&self, location: Location, prompt: &[u64]) -> usize {
        let Some(held) = self.locations.get(location as usize) else {
            return 0;
        };
        let holds = |position: usize| held.stamps.get(prompt[position - 1]).is_some();
        let mut last_held = 0;
        let mut first_unheld = prompt.len() + 1;
        for position in crate::prefix_marks::mark_positions(prompt.len()) {
            if !holds(position) {
                first_unheld = position;
                break;
            }
            last_held = position;
        }
        (last_held + 1..first_unheld).rev().find(|&position| holds(position)).unwrap_or(last_held)
    }

    /// How many leading blocks of `prompt` one location holds consecutively.
    pub fn match_location(&self, location: Location, prompt: &[u64]) -> usize {
        let Some(held) = self.locations.get(location as usize) else {
            return 0;
        };
        prompt.iter().take_while(|block| held.stamps.get(**block).is_some()).count()
    }

    /// Whether `location` holds `block`.
    pub fn contains(&self, location: Location, block: u64) -> bool {
        self.locations.get(location as usize).is_some_and(|held| held.stamps.get(block).is_some())
    }

    /// Blocks held by `location`.
    pub fn blocks_at(&self, location: Location) -> usize {
        self.locations.get(location as usize).map_or(0, |held| held.stamps.len())
    }

    /// Distinct blocks held by any location.
    pub fn distinct_blocks(&self) -> usize {
        self.members.len()
    }

    /// Locations the index has room for (one past the highest location ever used).
    pub fn location_count(&self) -> usize {
        self.locations.len()
    }

    /// Approximate heap bytes in use, for memory reports.
    pub fn heap_bytes(&self) -> usize {
        self.members.heap_bytes()
            + self
                .locations
                .iter()
                .map(|held| held.stamps.heap_bytes() + held.recency.capacity() * 16)
                .sum::<usize>()
    }
}

/// Blocks whose table loads the multi-word walk issues together before matching them (see `match_prefix_into`).
const LOOKAHEAD: usize = 32;

/// Locations still active at the end of the walk hold all `depth` matched blocks.
fn finish(matched: &mut [u32], active: &[u64], depth: u32) {
    for (word, active_word) in active.iter().enumerate() {
        if *active_word != 0 {
            record(matched, word, *active_word, depth);
        }
    }
}

#[inline]
fn record(matched: &mut [u32], word: usize, mut bits: u64, depth: u32) {
    while bits != 0 {
        let location = word * 64 + bits.trailing_zeros() as usize;
        if let Some(slot) = matched.get_mut(location) {
            *slot = depth;
        }
        bits &= bits - 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(index: &PrefixIndex, prompt: &[u64]) -> Vec<u32> {
        let mut out = Vec::new();
        index.match_prefix(prompt, &mut out);
        out
    }

    #[test]
    fn matches_longest_consecutive_prefix_per_location() {
        let mut index = PrefixIndex::new(100);
        index.insert(0, &[1, 2, 3]);
        index.insert(1, &[1, 2]);
        index.insert(2, &[9]);
        assert_eq!(matches(&index, &[1, 2, 3, 4]), vec![3, 2, 0]);
        assert_eq!(matches(&index, &[9, 2]), vec![0, 0, 1]);
        assert_eq!(matches(&index, &[]), vec![0, 0, 0]);
        assert_eq!(index.match_location(0, &[1, 2, 3, 4]), 3);
    }

    #[test]
    fn walk_agrees_with_per_location_matching_for_narrow_and_wide_bitsets() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(11);
        // 40 locations use one-word bitsets, 150 use three words: both walks are checked.
        for locations in [40u32, 150] {
            let mut index = PrefixIndex::new(300);
            // A small block space (including the key 0) forces shared prefixes, gaps and probe collisions.
            for _ in 0..2_000 {
                let location = rng.random_range(0..locations);
                let start = rng.random_range(0..4u64);
                let blocks: Vec<u64> = (start..start + rng.random_range(1..80)).collect();
                index.insert(location, &blocks);
                if rng.random_bool(0.3) {
                    index.remove(location, &[rng.random_range(0..90)]);
                }
            }
            for _ in 0..300 {
                let start = rng.random_range(0..3u64);
                let prompt: Vec<u64> = (start..start + rng.random_range(0..100)).collect();
                let out = matches(&index, &prompt);
                for location in 0..locations {
                    let expected = index.match_location(location, &prompt) as u32;
                    assert_eq!(out[location as usize], expected, "location {location}, prompt {prompt:?}");
                }
            }
        }
    }

    #[test]
    fn marks_match_one_location_as_they_match_all() {
        use crate::prefix_marks::marks_of;
        let prompt: Vec<u64> = (0..100).collect();
        let mut index = PrefixIndex::new(1_000);
        index.insert(0, &marks_of(&prompt[..45])); // ends between the marks 44 and 48
        index.insert(2, &marks_of(&prompt[..30]));
        index.insert(2, &marks_of(&[7, 8, 9]));
        let mut all = vec![0; 3];
        index.match_marks_into(&prompt, &mut all);
        assert_eq!(all, [45, 0, 30]);
        let one: Vec<usize> = (0..4).map(|location| index.match_marks_location(location, &prompt)).collect();
        assert_eq!(one, [45, 0, 30, 0]);
        assert_eq!(index.match_marks_location(0, &prompt[..44]), 44);
        // Another location holding more of the prompt does not hide the first one's last hash.
        index.insert(1, &marks_of(&prompt[..90]));
        let mut all = vec![0; 3];
        index.match_marks_into(&prompt, &mut all);
        assert_eq!(all, [45, 90, 30]);
        assert_eq!(index.match_marks_location(0, &prompt), 45);
    }

    #[test]
    fn a_gap_stops_the_match() {
        let mut index = PrefixIndex::new(100);
        index.insert(0, &[1, 2, 3]);
        assert_eq!(index.remove(0, &[2]), 1);
        assert_eq!(matches(&index, &[1, 2, 3]), vec![1]);
        assert_eq!(index.remove(0, &[2]), 0);
    }

    #[test]
    fn locations_beyond_64_use_wider_bitsets() {
        let mut index = PrefixIndex::new(100);
        index.insert(3, &[5, 6]);
        index.insert(130, &[5, 6, 7]);
        let out = matches(&index, &[5, 6, 7]);
        assert_eq!(out.len(), 131);
        assert_eq!(out[3], 2);
        assert_eq!(out[130], 3);
        assert_eq!(index.clear_location(130), 3);
        assert_eq!(matches(&index, &[5, 6, 7])[130], 0);
        assert_eq!(index.distinct_blocks(), 2);
    }

    #[test]
    fn lru_evicts_least_recently_touched_block() {
        let mut index = PrefixIndex::new(3);
        index.insert(0, &[1, 2, 3]);
        // Refresh 1, then store 4: block 2 is now the least recently used.
        let outcome = index.insert(0, &[1, 4]);
        assert_eq!(outcome, InsertOutcome { added: 1, refreshed: 1, evicted: 1 });
        assert!(index.contains(0, 1));
        assert!(!index.contains(0, 2));
        assert!(index.contains(0, 3));
        assert!(index.contains(0, 4));
        assert_eq!(index.blocks_at(0), 3);
        index.set_capacity_per_location(1);
        assert_eq!(index.blocks_at(0), 1);
        assert!(index.contains(0, 4));
    }

    #[test]
    fn stale_recency_entries_are_compacted() {
        let mut index = PrefixIndex::new(10);
        for _ in 0..1_000 {
            index.insert(0, &[1, 2]);
        }
        assert!(index.locations[0].recency.len() <= 2 * 2 + 64 + 2);
        assert_eq!(index.blocks_at(0), 2);
    }
}
