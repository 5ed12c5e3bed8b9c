//! The bounded selection cache: direct-mapped slots, each holding one (key, context,
//! selection). A new entry replaces whatever shares its slot, so the cache never grows past
//! its capacity and needs no eviction bookkeeping on the hot path.
//!
//! The context is a hash of the hardware fingerprint, the capabilities hash and the policy
//! hash (DESIGN invariant 5): a selection made under another policy or catalog can share a
//! slot but never matches.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use super::table::PlanKey;
use super::{FoldHasher, Resolved};
use crate::select::Selection;

#[derive(Debug)]
struct Slot {
    key: PlanKey,
    context: u64,
    /// False for the shared vacant entry every slot starts with.
    occupied: bool,
    resolved: Resolved,
}

/// A cached entry, held without touching its reference count: readers on many threads
/// hitting the same entry write no shared cache line.
#[derive(Debug)]
pub struct CacheHit(Guard<Arc<Slot>>);

impl CacheHit {
    /// The entry.
    #[inline]
    pub fn resolved(&self) -> &Resolved {
        &self.0.resolved
    }
}

/// A bounded, thread-safe map from (key, context) to a resolved selection. Reads take no
/// lock: each slot is an atomically swapped pointer.
#[derive(Debug)]
pub struct SelectionCache {
    slots: Box<[ArcSwap<Slot>]>,
    vacant: Arc<Slot>,
    mask: usize,
}

impl SelectionCache {
    /// A cache of `capacity` slots (rounded up to a power of two); 0 caches nothing.
    pub fn new(capacity: usize) -> SelectionCache {
        let n = if capacity == 0 { 0 } else { capacity.next_power_of_two() };
        let vacant = Arc::new(Slot {
            key: PlanKey { validity: 0, buckets: super::Buckets([0; super::axes::MAX_AXES]) },
            context: 0,
            occupied: false,
            resolved: Resolved { selection: Arc::new(Selection::vacant()), executor: None },
        });
        SelectionCache {
            slots: (0..n).map(|_| ArcSwap::new(vacant.clone())).collect(),
            vacant,
            mask: n.saturating_sub(1),
        }
    }

    #[inline]
    fn index(&self, key: &PlanKey, context: u64) -> usize {
        let mut h = FoldHasher::default();
        key.hash(&mut h);
        h.write_u64(context);
        h.finish() as usize & self.mask
    }

    /// The cached entry for (key, context).
    #[inline]
    pub fn get(&self, key: &PlanKey, context: u64) -> Option<CacheHit> {
        let slot = self.slots.get(self.index(key, context))?.load();
        (slot.occupied && slot.key == *key && slot.context == context).then(|| CacheHit(slot))
    }

    /// Stores an entry, replacing the slot's previous one.
    pub fn insert(&self, key: PlanKey, context: u64, resolved: Resolved) {
        if let Some(slot) = self.slots.get(self.index(&key, context)) {
            slot.store(Arc::new(Slot { key, context, occupied: true, resolved }));
        }
    }

    /// Slots in use.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.load().occupied).count()
    }

    /// True when no slot is in use.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Empties every slot.
    pub fn clear(&self) {
        for s in self.slots.iter() {
            s.store(self.vacant.clone());
        }
    }
}

/// The cache context of a selector: fingerprint, capabilities hash, policy hash.
pub fn context(fingerprint: &str, capabilities_hash: &str, policy_hash: &str) -> u64 {
    let mut h = super::key::StableHasher::new();
    h.bytes(fingerprint.as_bytes());
    h.bytes(capabilities_hash.as_bytes());
    h.bytes(policy_hash.as_bytes());
    h.finish128() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::key::Buckets;
    use crate::score::Estimate;
    use crate::select::{Score, ScoreSource};

    fn sel(kernel: &str) -> Resolved {
        let model =
            Estimate { flops: 0.0, bytes: 0.0, compute_ns: 0.0, memory_ns: 0.0, launch_ns: 0.0, estimated_ns: 1.0 };
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
        });
        Resolved { selection, executor: None }
    }

    fn key(v: u128) -> PlanKey {
        PlanKey { validity: v, buckets: Buckets([1, 2, 3]) }
    }

    #[test]
    fn a_hit_needs_the_same_key_and_the_same_context() {
        let c = SelectionCache::new(64);
        c.insert(key(1), 10, sel("a"));
        assert_eq!(c.get(&key(1), 10).unwrap().resolved().selection.kernel, "a");
        assert!(c.get(&key(1), 11).is_none(), "another policy or catalog never matches");
        assert!(c.get(&key(2), 10).is_none());
    }

    #[test]
    fn the_cache_never_holds_more_than_its_capacity() {
        let c = SelectionCache::new(8);
        for v in 0..1000 {
            c.insert(key(v), 0, sel("k"));
        }
        assert_eq!(c.capacity(), 8);
        assert!(c.len() <= 8);
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
