//! Runtime counters, striped per thread: a thread owns one stripe (its own cache lines) in
//! every handle and counts there with a plain load and store, so counting a plan hit costs
//! no locked instruction and two threads never write one line. Threads beyond the stripes
//! share one more stripe and count atomically. A snapshot sums the stripes.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use serde::Serialize;

/// A snapshot of the runtime counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Counters {
    /// Selections served by the dispatch table.
    pub plan_hits: u64,
    /// Lookups the table had no entry for (`PLAN_BUCKET_MISS`).
    pub plan_misses: u64,
    /// Selections served by the cache.
    pub cache_hits: u64,
    /// Cache lookups that missed.
    pub cache_misses: u64,
    /// Live selections not cached (a size outside the buckets, or near the memory limit).
    pub uncacheable: u64,
    /// Live selections.
    pub live: u64,
    /// Dispatches where the first choice did not run.
    pub fallbacks: u64,
}

/// Which counter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Counter {
    PlanHits,
    PlanMisses,
    CacheHits,
    CacheMisses,
    Uncacheable,
    Live,
    Fallbacks,
}

const COUNTERS: usize = 7;
/// Stripes owned by one thread each; one more is shared by the rest.
const STRIPES: usize = 64;

/// One thread's counters, alone on its cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe([AtomicU64; COUNTERS]);

/// The counters of one runtime.
#[derive(Debug)]
pub(crate) struct Striped {
    stripes: Box<[Stripe]>,
}

impl Default for Striped {
    fn default() -> Striped {
        Striped { stripes: (0..=STRIPES).map(|_| Stripe::default()).collect() }
    }
}

/// The stripe a thread owns while it lives (`None`: every stripe is taken).
struct Owned(Option<usize>);

/// Stripe numbers: the next never used, and those freed by threads that ended.
static FREE: Mutex<(usize, Vec<usize>)> = Mutex::new((0, Vec::new()));

impl Owned {
    fn claim() -> Owned {
        let mut free = FREE.lock();
        if let Some(i) = free.1.pop() {
            return Owned(Some(i));
        }
        let i = free.0;
        (i < STRIPES).then(|| free.0 += 1);
        Owned((i < STRIPES).then_some(i))
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            FREE.lock().1.push(i);
        }
    }
}

thread_local! {
    static MINE: Owned = Owned::claim();
}

impl Striped {
    #[inline]
    pub(crate) fn bump(&self, c: Counter) {
        let owned = MINE.try_with(|m| m.0).ok().flatten();
        match owned.and_then(|i| self.stripes.get(i)) {
            Some(s) => {
                // Only this thread writes this stripe: a plain read-modify-write is exact.
                let a = &s.0[c as usize];
                a.store(a.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
            }
            None => {
                if let Some(s) = self.stripes.get(STRIPES) {
                    s.0[c as usize].fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    pub(crate) fn snapshot(&self) -> Counters {
        let sum = |c: Counter| self.stripes.iter().map(|s| s.0[c as usize].load(Ordering::Relaxed)).sum();
        Counters {
            plan_hits: sum(Counter::PlanHits),
            plan_misses: sum(Counter::PlanMisses),
            cache_hits: sum(Counter::CacheHits),
            cache_misses: sum(Counter::CacheMisses),
            uncacheable: sum(Counter::Uncacheable),
            live: sum(Counter::Live),
            fallbacks: sum(Counter::Fallbacks),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_every_thread_add_up() {
        let c = Striped::default();
        std::thread::scope(|s| {
            // More threads than stripes: the rest share the atomic stripe.
            for _ in 0..STRIPES + 6 {
                s.spawn(|| (0..1000).for_each(|_| c.bump(Counter::CacheHits)));
            }
        });
        c.bump(Counter::Fallbacks);
        let snap = c.snapshot();
        assert_eq!(snap.cache_hits, 1000 * (STRIPES as u64 + 6));
        assert_eq!(snap.fallbacks, 1);
        assert_eq!(snap.plan_hits, 0);
    }
}
