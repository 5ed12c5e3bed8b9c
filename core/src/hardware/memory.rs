//! Live memory headroom as data (E2E spec §11): a [`MemoryGauge`] holds the last reading of
//! how much memory a device can still take, in atomics, so a selection reads it with one
//! load. The host's gauge is read by the runtime (`host::memory`); an engine that knows
//! better (a device's free memory) sets its own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A gauge reads as under pressure when less than this fraction of the memory is available.
pub const PRESSURE_FRACTION: f64 = 0.10;

/// The last reading of a device's available memory.
#[derive(Debug)]
pub struct MemoryGauge {
    /// Bytes; `u64::MAX` until the first reading.
    available: AtomicU64,
    /// The device's total memory (what pressure is measured against).
    total: u64,
    pressured: AtomicBool,
}

impl MemoryGauge {
    /// A gauge for a device of `total` bytes with nothing read yet (no limit applies).
    pub fn new(total: u64) -> MemoryGauge {
        MemoryGauge { available: AtomicU64::new(u64::MAX), total, pressured: AtomicBool::new(false) }
    }

    /// Records a reading.
    pub fn set_available(&self, bytes: u64) {
        self.available.store(bytes, Ordering::Relaxed);
        let pressured = (bytes as f64) < self.total as f64 * PRESSURE_FRACTION;
        self.pressured.store(pressured, Ordering::Relaxed);
    }

    /// The last reading (`None` before the first).
    #[inline]
    pub fn available(&self) -> Option<u64> {
        match self.available.load(Ordering::Relaxed) {
            u64::MAX => None,
            n => Some(n),
        }
    }

    /// Less than [`PRESSURE_FRACTION`] of the memory is available.
    #[inline]
    pub fn under_pressure(&self) -> bool {
        self.pressured.load(Ordering::Relaxed)
    }

    /// The device's total memory.
    pub fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_reports_pressure_below_a_tenth_of_the_memory() {
        let g = MemoryGauge::new(1000);
        assert_eq!((g.available(), g.under_pressure()), (None, false));
        g.set_available(500);
        assert_eq!((g.available(), g.under_pressure()), (Some(500), false));
        g.set_available(99);
        assert!(g.under_pressure());
    }
}
