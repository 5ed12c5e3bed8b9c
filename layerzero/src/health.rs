//! Kernel health: one circuit breaker per kernel, kept as atomics in an array indexed by
//! the catalog's dense kernel index. A dispatch reads one word to learn whether a kernel's
//! circuit is open and writes only when something changed, so threads that run healthy
//! kernels never contend here.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::capabilities::catalog::KernelIndex;

/// Consecutive failures after which a kernel's circuit opens.
pub const BREAKER_THRESHOLD: u32 = 3;
/// How long an open circuit stays open before one trial call goes through (half-open).
pub const BREAKER_COOLDOWN: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct KernelHealth {
    consecutive_failures: AtomicU32,
    /// Nanoseconds since the table's epoch at which the circuit opened, plus one; 0 = closed.
    opened_at: AtomicU64,
}

/// The breakers of every kernel of one catalog.
#[derive(Debug)]
pub struct HealthTable {
    epoch: Instant,
    kernels: Box<[KernelHealth]>,
}

impl HealthTable {
    /// Closed breakers for `kernels` kernels.
    pub fn new(kernels: usize) -> HealthTable {
        HealthTable { epoch: Instant::now(), kernels: (0..kernels).map(|_| KernelHealth::default()).collect() }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// How long `kernel`'s circuit stays open; `None` when it is closed or its cooldown has
    /// passed (the next call is the trial).
    #[inline]
    pub fn open_for(&self, kernel: KernelIndex) -> Option<Duration> {
        let opened = self.kernels.get(kernel)?.opened_at.load(Ordering::Acquire);
        if opened == 0 {
            return None;
        }
        let elapsed = Duration::from_nanos(self.now().saturating_sub(opened - 1));
        (elapsed < BREAKER_COOLDOWN).then(|| BREAKER_COOLDOWN - elapsed)
    }

    /// Records the outcome of one call of `kernel`.
    #[inline]
    pub fn record(&self, kernel: KernelIndex, ok: bool) {
        let Some(h) = self.kernels.get(kernel) else { return };
        if ok {
            // Healthy calls only read: no shared cache line is written on the hot path.
            if h.consecutive_failures.load(Ordering::Relaxed) != 0 {
                h.consecutive_failures.store(0, Ordering::Relaxed);
            }
            if h.opened_at.load(Ordering::Relaxed) != 0 {
                h.opened_at.store(0, Ordering::Release);
            }
            return;
        }
        let failures = h.consecutive_failures.fetch_add(1, Ordering::AcqRel).saturating_add(1);
        if failures >= BREAKER_THRESHOLD {
            h.opened_at.store(self.now().saturating_add(1), Ordering::Release);
        }
    }

    /// Kernels whose circuit is open now.
    pub fn open_kernels(&self) -> impl Iterator<Item = KernelIndex> + '_ {
        (0..self.kernels.len()).filter(|&k| self.open_for(k).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_circuit_opens_after_the_threshold_and_a_success_closes_it() {
        let h = HealthTable::new(2);
        for _ in 0..BREAKER_THRESHOLD - 1 {
            h.record(1, false);
        }
        assert!(h.open_for(1).is_none(), "below the threshold the circuit stays closed");
        h.record(1, false);
        assert!(h.open_for(1).is_some_and(|d| d <= BREAKER_COOLDOWN));
        assert_eq!(h.open_kernels().collect::<Vec<_>>(), vec![1]);
        assert!(h.open_for(0).is_none(), "other kernels are unaffected");
        h.record(1, true);
        assert!(h.open_for(1).is_none());
    }

    #[test]
    fn an_unknown_kernel_index_is_never_open() {
        let h = HealthTable::new(1);
        h.record(7, false);
        assert!(h.open_for(7).is_none());
    }
}
