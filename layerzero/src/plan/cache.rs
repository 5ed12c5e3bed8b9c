//! The bounded selection cache: direct-mapped slots, each holding one (key, context,
//! selection). A new entry replaces whatever shares its slot, so the cache never grows past
//! its capacity and needs no eviction bookkeeping on the hot path.
//!
//! The context is a hash of the hardware fingerprint, the capabilities hash and the policy
//! hash (DESIGN invariant 5): a selection made under another policy or catalog can share a
//! slot but never matches.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, RwLock};

use super::FoldHasher;
use super::table::PlanKey;
use crate::select::Selection;

#[derive(Debug)]
struct Slot {
    key: PlanKey,
    context: u64,
    selection: Arc<Selection>,
}

/// A bounded, thread-safe map from (key, context) to a selection.
#[derive(Debug)]
pub struct SelectionCache {
    slots: Box<[RwLock<Option<Slot>>]>,
    mask: usize,
}

impl SelectionCache {
    /// A cache of `capacity` slots (rounded up to a power of two); 0 caches nothing.
    pub fn new(capacity: usize) -> SelectionCache {
        let n = if capacity == 0 { 0 } else { capacity.next_power_of_two() };
        SelectionCache { slots: (0..n).map(|_| RwLock::new(None)).collect(), mask: n.saturating_sub(1) }
    }

    #[inline]
    fn index(&self, key: &PlanKey, context: u64) -> usize {
        let mut h = FoldHasher::default();
        key.hash(&mut h);
        h.write_u64(context);
        h.finish() as usize & self.mask
    }

    /// The cached selection for (key, context).
    #[inline]
    pub fn get(&self, key: &PlanKey, context: u64) -> Option<Arc<Selection>> {
        let slot = self.slots.get(self.index(key, context))?.read().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(s) if s.key == *key && s.context == context => Some(s.selection.clone()),
            _ => None,
        }
    }

    /// Stores a selection, replacing the slot's previous entry.
    pub fn insert(&self, key: PlanKey, context: u64, selection: Arc<Selection>) {
        if let Some(slot) = self.slots.get(self.index(&key, context)) {
            *slot.write().unwrap_or_else(|p| p.into_inner()) = Some(Slot { key, context, selection });
        }
    }

    /// Slots in use.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.read().unwrap_or_else(|p| p.into_inner()).is_some()).count()
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
            *s.write().unwrap_or_else(|p| p.into_inner()) = None;
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

    fn sel(kernel: &str) -> Arc<Selection> {
        let model =
            Estimate { flops: 0.0, bytes: 0.0, compute_ns: 0.0, memory_ns: 0.0, launch_ns: 0.0, estimated_ns: 1.0 };
        Arc::new(Selection {
            kernel: kernel.into(),
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
        })
    }

    fn key(v: u128) -> PlanKey {
        PlanKey { validity: v, buckets: Buckets([1, 2, 3]) }
    }

    #[test]
    fn a_hit_needs_the_same_key_and_the_same_context() {
        let c = SelectionCache::new(64);
        c.insert(key(1), 10, sel("a"));
        assert_eq!(c.get(&key(1), 10).unwrap().kernel, "a");
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
