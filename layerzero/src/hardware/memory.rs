//! Live memory headroom (E2E spec §11): how much memory the process can still take, from
//! `MemAvailable` in `/proc/meminfo` and the cgroup limit (v2 `memory.max` minus
//! `memory.current`, v1 `memory.limit_in_bytes` minus `memory.usage_in_bytes`), whichever is
//! smaller. A [`MemoryGauge`] holds the last reading in atomics: the process-wide one is
//! re-read by one sampler thread every `LAYERZERO_MEMORY_POLL_MS`, never on a selection;
//! an engine that knows better (a device's free memory) sets its own gauge.
//!
//! The device's free memory through a GPU driver is not read here: no GPU was available to
//! verify it, so CUDA devices keep the profile's static figure.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A gauge reads as under pressure when less than this fraction of the memory is available.
pub const PRESSURE_FRACTION: f64 = 0.10;

/// `MemAvailable` of `/proc/meminfo` text, in bytes.
pub fn parse_meminfo_available(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut parts = line["MemAvailable:".len()..].split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB" | "KB" | "kb") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// What a cgroup still allows: `limit - usage`, from the texts of the limit and usage files;
/// `None` without a limit (`max`, or v1's "no limit" sentinel near `i64::MAX`).
pub fn parse_cgroup_room(limit: &str, usage: &str) -> Option<u64> {
    let limit = limit.trim();
    if limit == "max" {
        return None;
    }
    let limit: u64 = limit.parse().ok()?;
    if limit >= 1 << 60 {
        return None;
    }
    let usage: u64 = usage.trim().parse().ok()?;
    Some(limit.saturating_sub(usage))
}

/// This host's headroom now: the smaller of `MemAvailable` and the cgroup's room, if either
/// can be read.
pub fn read_host_available() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let meminfo = read("/proc/meminfo").as_deref().and_then(parse_meminfo_available);
    let v2 = match (read("/sys/fs/cgroup/memory.max"), read("/sys/fs/cgroup/memory.current")) {
        (Some(l), Some(u)) => parse_cgroup_room(&l, &u),
        _ => None,
    };
    let v1 = match (
        read("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        read("/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ) {
        (Some(l), Some(u)) => parse_cgroup_room(&l, &u),
        _ => None,
    };
    [meminfo, v2, v1].into_iter().flatten().min()
}

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

    /// The process-wide gauge of this host's memory, sampled every
    /// `LAYERZERO_MEMORY_POLL_MS` (default 500) by one thread started on first use.
    pub fn host(total: u64) -> Arc<MemoryGauge> {
        static HOST: OnceLock<Arc<MemoryGauge>> = OnceLock::new();
        HOST.get_or_init(|| {
            let gauge = Arc::new(MemoryGauge::new(total));
            if let Some(bytes) = read_host_available() {
                gauge.set_available(bytes);
            }
            let every = crate::knobs::memory_poll().unwrap_or(Duration::from_millis(500));
            let sampled = gauge.clone();
            // Without the thread the first reading stays; selection still works.
            let _ = std::thread::Builder::new().name("lz-memory".to_owned()).spawn(move || {
                loop {
                    std::thread::sleep(every);
                    if let Some(bytes) = read_host_available() {
                        sampled.set_available(bytes);
                    }
                }
            });
            gauge
        })
        .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_and_cgroup_texts_give_the_headroom() {
        assert_eq!(parse_meminfo_available("MemTotal: 8 kB\nMemAvailable:   2048 kB\n"), Some(2048 * 1024));
        assert_eq!(parse_meminfo_available("MemTotal: 8 kB\n"), None);
        assert_eq!(parse_cgroup_room("1073741824\n", "73741824\n"), Some(1_000_000_000));
        assert_eq!(parse_cgroup_room("max\n", "5\n"), None);
        assert_eq!(parse_cgroup_room("9223372036854771712", "5"), None, "cgroup v1's no-limit sentinel");
        assert_eq!(parse_cgroup_room("100", "150"), Some(0));
    }

    #[test]
    fn a_gauge_reports_pressure_below_a_tenth_of_the_memory() {
        let g = MemoryGauge::new(1000);
        assert_eq!((g.available(), g.under_pressure()), (None, false));
        g.set_available(500);
        assert_eq!((g.available(), g.under_pressure()), (Some(500), false));
        g.set_available(99);
        assert!(g.under_pressure());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_host_has_a_readable_headroom() {
        assert!(read_host_available().is_some_and(|b| b > 0));
    }
}
