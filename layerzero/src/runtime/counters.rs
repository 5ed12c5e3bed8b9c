//! Runtime counters, striped per thread: every thread adds to its own cache line, so
//! counting a plan hit on two threads costs what it costs on one. A snapshot sums the
//! stripes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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
const STRIPES: usize = 16;

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
        Striped { stripes: (0..STRIPES).map(|_| Stripe::default()).collect() }
    }
}

/// The stripe of the calling thread (threads are numbered as they first count).
fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    MINE.with(|m| *m)
}

impl Striped {
    #[inline]
    pub(crate) fn bump(&self, c: Counter) {
        if let Some(s) = self.stripes.get(stripe()) {
            s.0[c as usize].fetch_add(1, Ordering::Relaxed);
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
            for _ in 0..4 {
                s.spawn(|| (0..1000).for_each(|_| c.bump(Counter::CacheHits)));
            }
        });
        c.bump(Counter::Fallbacks);
        let snap = c.snapshot();
        assert_eq!(snap.cache_hits, 4000);
        assert_eq!(snap.fallbacks, 1);
        assert_eq!(snap.plan_hits, 0);
    }
}
