//! Runtime counters, striped per thread: a thread owns one stripe (its own cache lines) in
//! every handle and counts there with a plain load and store, so counting a plan hit costs
//! no locked instruction and two threads never write one line. Threads beyond the stripes
//! share one more stripe and count atomically. A snapshot sums the stripes.

use std::cell::{Cell, RefCell};
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
    /// Kernel calls that failed (errors, panics, timeouts, invalid outputs, OOM, lost devices).
    pub kernel_failures: u64,
    /// Calls not made because the kernel was quarantined or its backend disabled.
    pub refused_by_health: u64,
    /// Breakers that opened (a kernel quarantined, a backend disabled).
    pub breaker_opens: u64,
    /// Calls abandoned at their deadline.
    pub timeouts: u64,
    /// Outputs rejected by `validate_outputs`.
    pub invalid_outputs: u64,
    /// Cache misses answered by another thread's live selection of the same key, made at
    /// the same time (single flight), instead of selecting again.
    pub shared: u64,
    /// Cache misses that waited for another thread's selection of their key for the longest
    /// allowed and then selected live themselves.
    pub wait_timeouts: u64,
    /// Calls refused because the kernel's JIT could not compile their shape
    /// (`JIT_COMPILE_FAILED`; the runtime fell back).
    pub jit_compile_failures: u64,
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
    KernelFailures,
    RefusedByHealth,
    BreakerOpens,
    Timeouts,
    InvalidOutputs,
    Shared,
    WaitTimeouts,
    JitCompileFailures,
}

const COUNTERS: usize = 15;
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

/// Stripe numbers: the next never used, and those freed by threads that ended.
static FREE: Mutex<(usize, Vec<usize>)> = Mutex::new((0, Vec::new()));

/// Not yet claimed.
const UNCLAIMED: usize = usize::MAX;

/// Gives the stripe back when its thread ends.
struct Release(usize);

impl Drop for Release {
    fn drop(&mut self) {
        MINE.set(UNCLAIMED);
        FREE.lock().1.push(self.0);
    }
}

thread_local! {
    /// The stripe this thread owns (`STRIPES`: the shared one), read with one load.
    static MINE: Cell<usize> = const { Cell::new(UNCLAIMED) };
    static RELEASE: RefCell<Option<Release>> = const { RefCell::new(None) };
}

/// Claims a stripe for this thread, once.
#[cold]
fn claim() -> usize {
    let mut free = FREE.lock();
    let i = match free.1.pop() {
        Some(i) => i,
        None if free.0 < STRIPES => {
            free.0 += 1;
            free.0 - 1
        }
        None => STRIPES,
    };
    drop(free);
    if i < STRIPES && RELEASE.try_with(|r| *r.borrow_mut() = Some(Release(i))).is_err() {
        // The thread is ending: count in the shared stripe, and give the stripe back now.
        FREE.lock().1.push(i);
        return STRIPES;
    }
    let _ = MINE.try_with(|m| m.set(i));
    i
}

impl Striped {
    #[inline]
    pub(crate) fn bump(&self, c: Counter) {
        let mine = MINE.try_with(Cell::get).unwrap_or(STRIPES);
        let i = if mine == UNCLAIMED { claim() } else { mine };
        if i < STRIPES
            && let Some(s) = self.stripes.get(i)
        {
            // Only this thread writes this stripe: a plain read-modify-write is exact.
            let a = &s.0[c as usize];
            a.store(a.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        } else if let Some(s) = self.stripes.get(STRIPES) {
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
            kernel_failures: sum(Counter::KernelFailures),
            refused_by_health: sum(Counter::RefusedByHealth),
            breaker_opens: sum(Counter::BreakerOpens),
            timeouts: sum(Counter::Timeouts),
            invalid_outputs: sum(Counter::InvalidOutputs),
            shared: sum(Counter::Shared),
            wait_timeouts: sum(Counter::WaitTimeouts),
            jit_compile_failures: sum(Counter::JitCompileFailures),
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
