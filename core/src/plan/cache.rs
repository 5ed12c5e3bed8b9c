//! The bounded selection cache. Decisions are interned: each distinct (key, context) gets
//! one entry in an append-only table that lives as long as the cache, and direct-mapped
//! slots point into it. A slot is a sequence lock over four words, so a reader copies four
//! words and follows an index: no lock, no reference count, no write to shared memory, and
//! a hit is borrowed for as long as the cache lives.
//!
//! The context is a hash of the hardware fingerprint, the capabilities hash and the policy
//! hash (DESIGN invariant 5): a selection made under another policy or catalog can share a
//! slot but never matches. A policy that comes back finds its entries again.
//!
//! Bounds: `capacity` slots, and at most `2 * capacity` interned entries. Once the table is
//! full, new decisions are not cached (selection stays live and correct, counted as
//! uncacheable); building a new handle starts a new table.
//!
//! Writers meet only on the insert path, and there only per shard of the intern index: two
//! threads caching different keys rarely take the same lock. Reads take none.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::seqlock::SeqWords;
use super::table::PlanKey;
use super::{Buckets, Resolved};

/// A bounded, thread-safe map from (key, context) to a resolved selection.
#[derive(Debug)]
pub struct SelectionCache {
    /// validity (2 words), buckets and entry index (1), context (1).
    slots: Box<[SeqWords]>,
    mask: usize,
    entries: Box<[OnceLock<Resolved>]>,
    next: AtomicUsize,
    /// Where each interned (key, context) lives (insert path only), sharded by [`spread`].
    index: Box<[Mutex<Interned>]>,
}

/// One shard of the intern index: (key, context) to entry.
type Interned = HashMap<(PlanKey, u64), u32>;

/// Shards of the intern index.
const INDEX_SHARDS: usize = 16;

/// One word from a key and its context. The key's validity is already a 128-bit hash (and so
/// is the context): one multiply spreads the buckets, which are small numbers.
#[inline]
pub fn spread(key: &PlanKey, context: u64) -> u64 {
    let v = key.validity;
    let b = key.buckets.word().wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (v as u64) ^ ((v >> 64) as u64).rotate_left(29) ^ b ^ b >> 32 ^ context
}

impl SelectionCache {
    /// A cache of `capacity` slots (rounded up to a power of two); 0 caches nothing.
    pub fn new(capacity: usize) -> SelectionCache {
        let n = if capacity == 0 { 0 } else { capacity.next_power_of_two() };
        SelectionCache {
            slots: (0..n).map(|_| SeqWords::default()).collect(),
            mask: n.saturating_sub(1),
            entries: (0..n.saturating_mul(2)).map(|_| OnceLock::new()).collect(),
            next: AtomicUsize::new(0),
            index: (0..INDEX_SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    #[inline]
    fn slot(&self, key: &PlanKey, context: u64) -> Option<&SeqWords> {
        self.slots.get(spread(key, context) as usize & self.mask)
    }

    /// The cached entry for (key, context).
    #[inline]
    pub fn get(&self, key: &PlanKey, context: u64) -> Option<&Resolved> {
        let w = self.slot(key, context)?.read()?;
        let validity = (u128::from(w[0]) << 64) | u128::from(w[1]);
        let buckets = Buckets::from_word(w[2] >> 32);
        if validity != key.validity || buckets != key.buckets || w[3] != context {
            return None;
        }
        self.entries.get((w[2] & 0xffff_ffff) as usize)?.get()
    }

    /// The entry interned for (key, context) when its slot holds another key: two keys that
    /// share a slot evict each other there, and without this each would be selected live
    /// again on every other call. Takes one shard lock of the index: the miss path only.
    pub fn interned(&self, key: &PlanKey, context: u64) -> Option<&Resolved> {
        let s = self.slot(key, context)?;
        let e = *self.index.get(shard_of(key, context))?.lock().get(&(*key, context))?;
        let resolved = self.entries.get(e as usize)?.get()?;
        s.write(words(key, context, e));
        Some(resolved)
    }

    /// Caches an entry (the first one made for a (key, context) is kept). False when the
    /// cache holds nothing new any more (no slots, or its entry table is full).
    pub fn insert(&self, key: PlanKey, context: u64, resolved: Resolved) -> bool {
        let Some(s) = self.slot(&key, context) else { return false };
        let Some(index) = self.index.get(shard_of(&key, context)) else { return false };
        let entry = {
            let mut index = index.lock();
            match index.get(&(key, context)) {
                Some(&e) => e,
                None => {
                    let e = self.next.fetch_add(1, Ordering::Relaxed);
                    let Some(cell) = self.entries.get(e) else {
                        self.next.store(self.entries.len(), Ordering::Relaxed);
                        return false;
                    };
                    let _ = cell.set(resolved);
                    let e = e as u32;
                    index.insert((key, context), e);
                    e
                }
            }
        };
        // A slot being written by another thread is left to it: the entry is interned
        // either way.
        s.write(words(&key, context, entry));
        true
    }

    /// Entries interned (decisions cached so far, under every context).
    pub fn len(&self) -> usize {
        self.next.load(Ordering::Relaxed).min(self.entries.len())
    }

    /// True when nothing was cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
}

/// The shard of the intern index: high bits, as the low ones already chose the slot.
fn shard_of(key: &PlanKey, context: u64) -> usize {
    (spread(key, context) >> 48) as usize % INDEX_SHARDS
}

/// A slot's words for `entry`, interned for (key, context).
fn words(key: &PlanKey, context: u64, entry: u32) -> [u64; 4] {
    [(key.validity >> 64) as u64, key.validity as u64, (key.buckets.word() << 32) | u64::from(entry), context]
}

/// The cache context of a selector: fingerprint, capabilities hash, policy hash.
pub fn context(fingerprint: &str, capabilities_hash: &str, policy_hash: &str) -> u64 {
    let mut h = crate::key::StableHasher::new();
    h.bytes(fingerprint.as_bytes());
    h.bytes(capabilities_hash.as_bytes());
    h.bytes(policy_hash.as_bytes());
    h.finish128() as u64
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::TestResult;
    use crate::key::Buckets;
    use crate::score::Estimate;
    use crate::select::Selection;
    use crate::select::{Score, ScoreSource};

    fn sel(kernel: &str) -> Resolved {
        let model = Estimate { estimated_ns: 1.0, ..Estimate::default() };
        let selection = Arc::new(Selection {
            kernel: kernel.into(),
            index: 0,
            backend: "cpu".into(),
            transforms: Vec::new(),
            score: Score {
                estimated_ns: 1.0,
                source: ScoreSource::Model,
                transform_ns: 0.0,
                policy_factor: 1.0,
                total_ns: 1.0,
                model,
                measurement: None,
                notes: Vec::new(),
            },
            candidates: 1,
            rejected: 0,
        });
        Resolved { selection, executor: None }
    }

    fn key(v: u128) -> PlanKey {
        PlanKey { validity: v, buckets: Buckets([1, 2, 3]) }
    }

    #[test]
    fn a_hit_needs_the_same_key_and_the_same_context() -> TestResult {
        let c = SelectionCache::new(64);
        c.insert(key(1), 10, sel("a"));
        assert_eq!(c.get(&key(1), 10).ok_or("a miss on the key just inserted")?.selection.kernel, "a");
        assert!(c.get(&key(1), 11).is_none(), "another policy or catalog never matches");
        assert!(c.get(&key(2), 10).is_none());
        Ok(())
    }

    #[test]
    fn the_cache_never_holds_more_than_twice_its_slots() {
        let c = SelectionCache::new(8);
        let stored = (0..1000).filter(|&v| c.insert(key(v), 0, sel("k"))).count();
        assert_eq!(c.capacity(), 8);
        assert_eq!(stored, 16, "two entries per slot, then nothing new is cached");
        assert_eq!(c.len(), 16);
        assert!(c.get(&key(999), 0).is_none());
    }

    #[test]
    fn a_decision_made_again_reuses_its_entry() {
        let c = SelectionCache::new(2);
        for _ in 0..100 {
            // Two keys on a 2-slot cache evict each other; the table does not grow.
            assert!(c.insert(key(1), 10, sel("a")));
            assert!(c.insert(key(2), 10, sel("b")));
        }
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(&key(2), 10).map(|r| r.selection.kernel.as_str()), Some("b"));
    }

    #[test]
    fn a_key_evicted_from_its_slot_is_found_again_in_the_index() {
        let c = SelectionCache::new(1);
        assert!(c.insert(key(1), 10, sel("a")));
        assert!(c.insert(key(2), 10, sel("b")));
        assert!(c.get(&key(1), 10).is_none(), "one slot: the second key took it");
        assert_eq!(c.interned(&key(1), 10).map(|r| r.selection.kernel.as_str()), Some("a"));
        assert_eq!(c.get(&key(1), 10).map(|r| r.selection.kernel.as_str()), Some("a"), "and it is back in the slot");
        assert!(c.interned(&key(3), 10).is_none(), "a key never cached is not found");
        assert!(c.interned(&key(1), 11).is_none(), "nor one cached under another context");
    }

    #[test]
    fn a_cache_of_zero_slots_caches_nothing() {
        let c = SelectionCache::new(0);
        c.insert(key(1), 10, sel("a"));
        assert!(c.get(&key(1), 10).is_none());
        assert_eq!(c.capacity(), 0);
    }

    #[test]
    fn contexts_differ_when_any_hash_differs() {
        let base = context("fp", "caps", "pol");
        assert_ne!(base, context("fp2", "caps", "pol"));
        assert_ne!(base, context("fp", "caps2", "pol"));
        assert_ne!(base, context("fp", "caps", "pol2"));
    }
}
