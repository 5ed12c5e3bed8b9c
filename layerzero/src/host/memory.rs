//! This host's memory headroom, read: `MemAvailable` in `/proc/meminfo` and the cgroup limit
//! (v2 `memory.max` minus `memory.current`, v1 `memory.limit_in_bytes` minus
//! `memory.usage_in_bytes`), whichever is smaller, re-read by one sampler thread every
//! `LAYERZERO_MEMORY_POLL_MS` into the process-wide [`MemoryGauge`], never on a selection.
//!
//! The first CUDA device's free memory is read through its driver (`cuMemGetInfo`,
//! [`gpu_gauge`]) when a host handle is built, not polled (see there why); other GPUs keep
//! the profile's static figure.

use std::sync::{Arc, OnceLock};

use crate::hardware::memory::MemoryGauge;

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

/// The process-wide gauge of this host's memory, sampled every
/// `LAYERZERO_MEMORY_POLL_MS` (default 500) by one thread started on first use.
pub fn gauge(total: u64) -> Arc<MemoryGauge> {
    static HOST: OnceLock<Arc<MemoryGauge>> = OnceLock::new();
    HOST.get_or_init(|| {
        let gauge = Arc::new(MemoryGauge::new(total));
        if let Some(bytes) = read_host_available() {
            gauge.set_available(bytes);
        }
        let every = super::process().memory_poll.0;
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

/// The process-wide gauge of the first CUDA device's free memory, read through the driver
/// (`cuMemGetInfo`) when it is first asked for and again at every call (each host handle
/// built reads it); `None` without an NVIDIA driver or device.
///
/// Unlike the host's, it is not polled by a thread: `cuMemGetInfo` is not permitted while
/// another thread captures a CUDA graph in torch's default (global) capture mode, and a call
/// made then invalidates that capture. An engine that knows its quiet moments refreshes it
/// by building a handle, or feeds its own gauge (`LayerZero::with_gpu_memory_gauge`).
pub fn gpu_gauge() -> Option<Arc<MemoryGauge>> {
    type Reader = std::sync::Mutex<crate::backend::cuda::probe::FreeMemory>;
    static GPU: OnceLock<Option<(Reader, Arc<MemoryGauge>)>> = OnceLock::new();
    let (reader, gauge) = GPU
        .get_or_init(|| {
            let reader = crate::backend::cuda::probe::free_memory_reader(0).ok()?;
            let (_, total) = reader.read().ok()?;
            Some((std::sync::Mutex::new(reader), Arc::new(MemoryGauge::new(total))))
        })
        .as_ref()?;
    if let Ok(r) = reader.lock()
        && let Ok((free, _)) = r.read()
    {
        gauge.set_available(free);
    }
    Some(gauge.clone())
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

    #[cfg(target_os = "linux")]
    #[test]
    fn this_host_has_a_readable_headroom() {
        assert!(read_host_available().is_some_and(|b| b > 0));
    }
}
