//! A flat open-addressing hash table from `u64` keys to a fixed number of `u64` value words.
//!
//! Why not `HashMap<u64, Vec<u64>>`: the prefix index does one lookup per prompt block on the pick path
//! and one per block event on the update path. Keeping a key and its value words side by side in one
//! `Vec<u64>` makes a lookup touch a single cache line (up to 7 value words), with no per-entry
//! allocation. Linear probing with backward-shift deletion keeps probe sequences short without tombstones.

/// Empty slots hold this key; a real key 0 is kept aside in `zero_key_values`.
const EMPTY: u64 = 0;
/// Smallest table, in slots (a power of two).
const MIN_SLOTS: usize = 16;

#[derive(Clone, Debug)]
pub(crate) struct WordTable {
    value_words: usize,
    /// `1 + value_words`: the key word then the value words of one slot.
    stride: usize,
    /// Number of slots minus one (slots are a power of two).
    slot_mask: usize,
    words: Vec<u64>,
    /// Entries stored in `words` (key 0 is counted separately).
    stored: usize,
    zero_key_values: Option<Box<[u64]>>,
}

#[inline]
fn spread(key: u64) -> u64 {
    // Folded 64 x 64 -> 128-bit multiply (one `mul`; it is on every lookup): every input bit reaches the
    // low bits we index with, so even sequential keys (raw trace ids) spread evenly.
    let product = u128::from(key) * 0x9E37_79B9_7F4A_7C15;
    (product as u64) ^ ((product >> 64) as u64)
}

impl WordTable {
    pub(crate) fn new(value_words: usize) -> Self {
        Self::with_slots(value_words, MIN_SLOTS)
    }

    fn with_slots(value_words: usize, slots: usize) -> Self {
        let stride = 1 + value_words;
        Self {
            value_words,
            stride,
            slot_mask: slots - 1,
            words: vec![EMPTY; slots * stride],
            stored: 0,
            zero_key_values: None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.stored + usize::from(self.zero_key_values.is_some())
    }

    pub(crate) fn value_words(&self) -> usize {
        self.value_words
    }

    /// Bytes held by the table, for memory reports.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.words.capacity() * 8
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        (spread(key) as usize) & self.slot_mask
    }

    /// Slot index holding `key`, if present (key must be non-zero).
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        let mut slot = self.home(key);
        loop {
            let found = self.words[slot * self.stride];
            if found == key {
                return Some(slot);
            }
            if found == EMPTY {
                return None;
            }
            slot = (slot + 1) & self.slot_mask;
        }
    }

    /// The home slot of `key` and the key word stored there: the first half of a lookup, split out so a
    /// caller can issue many independent loads before it needs any result (memory-level parallelism).
    #[inline]
    pub(crate) fn peek_home(&self, key: u64) -> (usize, u64) {
        let home = self.home(key);
        (home, self.words[home * self.stride])
    }

    /// For one-word values: the key stored at `key`'s home slot and that slot's value word, read together
    /// (one cache line) so a caller can issue many independent loads before it needs any result.
    #[inline]
    pub(crate) fn peek_home_word(&self, key: u64) -> (u64, u64) {
        debug_assert_eq!(self.value_words, 1);
        let at = self.home(key) * 2;
        match self.words.get(at..at + 2) {
            Some(&[found, value]) => (found, value),
            _ => (EMPTY, 0),
        }
    }

    /// The second half of a lookup started with [`Self::peek_home_word`]: `key`'s value word, 0 when absent.
    #[inline]
    pub(crate) fn word_from_home(&self, key: u64, key_at_home: u64, value_at_home: u64) -> u64 {
        // The common cases first: found at home, or an empty home. A real key 0 is stored aside, so it
        // never matches an empty home; anything else takes the probing path.
        if key_at_home == key && key != EMPTY {
            value_at_home
        } else if key_at_home == EMPTY && key != EMPTY {
            0
        } else {
            self.get(key).map_or(0, |values| values[0])
        }
    }

    /// The second half of a lookup started with [`Self::peek_home`].
    #[inline]
    pub(crate) fn get_from_home(&self, key: u64, home: usize, key_at_home: u64) -> Option<&[u64]> {
        if key == EMPTY {
            return self.zero_key_values.as_deref();
        }
        let slot = if key_at_home == key {
            home
        } else if key_at_home == EMPTY {
            return None;
        } else {
            let mut slot = home;
            loop {
                slot = (slot + 1) & self.slot_mask;
                let found = self.words[slot * self.stride];
                if found == key {
                    break slot;
                }
                if found == EMPTY {
                    return None;
                }
            }
        };
        let start = slot * self.stride + 1;
        Some(&self.words[start..start + self.value_words])
    }

    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<&[u64]> {
        if key == EMPTY {
            return self.zero_key_values.as_deref();
        }
        let slot = self.find(key)?;
        let start = slot * self.stride + 1;
        Some(&self.words[start..start + self.value_words])
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut [u64]> {
        if key == EMPTY {
            return self.zero_key_values.as_deref_mut();
        }
        let slot = self.find(key)?;
        let start = slot * self.stride + 1;
        Some(&mut self.words[start..start + self.value_words])
    }

    /// The value words of `key`, inserting zeroed words first if absent; the flag says whether it was inserted.
    #[inline]
    pub(crate) fn get_or_insert(&mut self, key: u64) -> (&mut [u64], bool) {
        if key == EMPTY {
            let inserted = self.zero_key_values.is_none();
            let words =
                self.zero_key_values.get_or_insert_with(|| vec![0; self.value_words].into_boxed_slice());
            return (words, inserted);
        }
        // Grow at 3/4 load: longer linear-probe runs would cost more than the memory saved.
        if (self.stored + 1) * 4 > (self.slot_mask + 1) * 3 {
            self.resize(self.value_words, (self.slot_mask + 1) * 2);
        }
        let mut slot = self.home(key);
        let inserted = loop {
            let found = self.words[slot * self.stride];
            if found == key {
                break false;
            }
            if found == EMPTY {
                self.words[slot * self.stride] = key;
                self.stored += 1;
                break true;
            }
            slot = (slot + 1) & self.slot_mask;
        };
        let start = slot * self.stride + 1;
        (&mut self.words[start..start + self.value_words], inserted)
    }

    /// Removes `key`; returns whether it was present.
    pub(crate) fn remove(&mut self, key: u64) -> bool {
        if key == EMPTY {
            return self.zero_key_values.take().is_some();
        }
        let Some(mut hole) = self.find(key) else {
            return false;
        };
        self.stored -= 1;
        // Backward-shift deletion: move later members of the probe run into the hole so every
        // remaining key stays reachable from its home slot without tombstones.
        let mut next = hole;
        loop {
            next = (next + 1) & self.slot_mask;
            let next_key = self.words[next * self.stride];
            if next_key == EMPTY {
                break;
            }
            let home = self.home(next_key);
            // Distance from home to `next` vs to `hole`, both modulo the table size.
            let distance_to_next = next.wrapping_sub(home) & self.slot_mask;
            let distance_to_hole = hole.wrapping_sub(home) & self.slot_mask;
            if distance_to_hole < distance_to_next {
                let (from, to) = (next * self.stride, hole * self.stride);
                self.words.copy_within(from..from + self.stride, to);
                hole = next;
            }
        }
        let start = hole * self.stride;
        self.words[start..start + self.stride].fill(EMPTY);
        true
    }

    /// Widens every value to `value_words` words (new words are zero). Never narrows.
    pub(crate) fn widen_values(&mut self, value_words: usize) {
        if value_words > self.value_words {
            self.resize(value_words, self.slot_mask + 1);
            if let Some(old) = self.zero_key_values.take() {
                let mut wider = vec![0; value_words];
                wider[..old.len()].copy_from_slice(&old);
                self.zero_key_values = Some(wider.into_boxed_slice());
            }
        }
    }

    fn resize(&mut self, value_words: usize, slots: usize) {
        let mut bigger = Self::with_slots(value_words, slots);
        bigger.zero_key_values = self.zero_key_values.take();
        for slot in self.words.chunks_exact(self.stride) {
            let key = slot[0];
            if key != EMPTY {
                let (values, _) = bigger.get_or_insert(key);
                values[..self.value_words].copy_from_slice(&slot[1..]);
            }
        }
        *self = bigger;
    }

    /// Every `(key, values)` pair in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &[u64])> {
        let zero = self.zero_key_values.as_deref().map(|values| (EMPTY, values));
        zero.into_iter().chain(
            self.words
                .chunks_exact(self.stride)
                .filter(|slot| slot[0] != EMPTY)
                .map(|slot| (slot[0], &slot[1..])),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use rand::{Rng, SeedableRng, rngs::StdRng};

    use super::*;

    #[test]
    fn agrees_with_std_hashmap_under_random_inserts_and_removes() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut table = WordTable::new(2);
        let mut reference: HashMap<u64, [u64; 2]> = HashMap::new();
        for step in 0..50_000u64 {
            // A small key space forces collisions, long probe runs and wrap-around.
            let key = rng.random_range(0..2_000u64);
            if rng.random_bool(0.6) {
                let (values, inserted) = table.get_or_insert(key);
                assert_eq!(inserted, !reference.contains_key(&key));
                values[0] = step;
                values[1] = key;
                reference.insert(key, [step, key]);
            } else {
                assert_eq!(table.remove(key), reference.remove(&key).is_some());
            }
            if step % 5_000 == 0 {
                table.widen_values(table.value_words() + usize::from(step == 25_000));
            }
        }
        assert_eq!(table.len(), reference.len());
        for (key, values) in &reference {
            assert_eq!(&table.get(*key).expect("present")[..2], values);
        }
        for key in 0..2_500u64 {
            let (home, seen) = table.peek_home(key);
            assert_eq!(table.get_from_home(key, home, seen), table.get(key));
        }
        let mut narrow = WordTable::new(1);
        for (key, values) in &reference {
            narrow.get_or_insert(*key).0[0] = values[0] + 1;
        }
        for key in 0..2_500u64 {
            let (seen, value) = narrow.peek_home_word(key);
            assert_eq!(narrow.word_from_home(key, seen, value), narrow.get(key).map_or(0, |v| v[0]));
        }
        assert_eq!(table.iter().count(), reference.len());
    }

    #[test]
    fn zero_key_is_supported() {
        let mut table = WordTable::new(1);
        assert!(table.get(0).is_none());
        table.get_or_insert(0).0[0] = 5;
        assert_eq!(table.get(0), Some(&[5][..]));
        table.widen_values(3);
        assert_eq!(table.get(0), Some(&[5, 0, 0][..]));
        assert!(table.remove(0));
        assert!(!table.remove(0));
    }
}
