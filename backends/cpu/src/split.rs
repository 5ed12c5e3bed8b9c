//! When memory-bound work is worth splitting across threads: from the bytes it moves and a
//! threshold measured on this machine, not from a fixed row count.
//!
//! Splitting costs a fork-join (waking workers, and the caller waiting on a latch) and pays
//! back only when the work outlasts it several times over. A fixed threshold of 32 Ki
//! elements put a cliff into `rms_norm` over 2048 f32 columns on a 2-core VM: 9.6 µs for 16
//! rows on one thread, 21.9 µs for 24 rows on two, and millisecond stalls whenever the other
//! core was busy. Here, once per process, the fork-join's cost is measured (a split of
//! almost no work, from the calling thread as kernels split) with one thread's streaming
//! rate in cache (read one buffer, write another, as a norm or an activation does); work is
//! split when one thread would need [`OUTLAST`] fork-joins' time for it. On that VM a
//! fork-join from outside the pool costs 16-30 µs, so splitting starts near 2 MB; a
//! many-core server with cheap wake-ups splits far smaller work.
//!
//! The decode step's chain of ops splits on the spinning team ([`crate::team`]) instead,
//! whose call costs a few atomic operations while its helpers are awake; its threshold is
//! measured the same way from a call on the warm team ([`worth_teaming`]).

use std::sync::OnceLock;
use std::time::Instant;

use rayon::prelude::*;

/// Work is split when one thread would take this many fork-joins' time: at the threshold
/// a two-way split takes `T/2 + T/OUTLAST`, a third less than `T`, so time still grows
/// with size across it (no cliff, at most a small step down), and work near the fork-join's
/// own cost never pays it.
const OUTLAST: f64 = 3.0;
/// Bytes (read + written) of the fork-join probe: work that takes a thread well under a
/// microsecond, so the split's time is its overhead.
const FORK_BYTES: usize = 16 << 10;
/// Bytes (read + written) of the serial-rate probe: in cache, as the small work whose
/// split is in question is.
const RATE_BYTES: usize = 256 << 10;
/// Interleaved repetitions of each probe (the median of these).
const REPS: usize = 15;

/// What the probe found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SplitCost {
    /// Threads the work would be split across.
    pub threads: usize,
    /// Bytes (read + written) from which work is split; `usize::MAX` with one thread.
    pub min_bytes: usize,
    /// Median time of the smallest split pass, ns: the fork-join's cost with almost no work.
    pub fork_join_ns: f64,
    /// One thread's streaming rate in cache, GB/s (bytes read + written).
    pub serial_gbps: f64,
    /// Median time of the smallest call on the warm team, ns.
    pub team_ns: f64,
    /// Bytes (read + written) from which work is split on the warm team; `usize::MAX` with
    /// one thread.
    pub team_min_bytes: usize,
}

/// The threshold of this process (measured on first use, about a millisecond).
pub fn split_cost() -> SplitCost {
    static COST: OnceLock<SplitCost> = OnceLock::new();
    *COST.get_or_init(measure)
}

/// True when work moving `bytes` (read + written) is worth splitting across threads.
#[inline]
pub(super) fn worth_splitting(bytes: usize) -> bool {
    bytes >= split_cost().min_bytes
}

/// True when work moving `bytes` (read + written), run as one of a chain of calls on the
/// team ([`crate::team`]), is worth splitting across its threads.
#[inline]
pub(super) fn worth_teaming(bytes: usize) -> bool {
    bytes >= split_cost().team_min_bytes
}

/// Measures the threshold now (about a millisecond).
pub fn measure() -> SplitCost {
    let threads = rayon::current_num_threads().max(1);
    let src: Vec<f32> = (0..RATE_BYTES / 8).map(|i| (i % 251) as f32).collect();
    let mut dst = vec![0f32; RATE_BYTES / 8];
    let pass = |s: &[f32], d: &mut [f32]| {
        for (o, &x) in d.iter_mut().zip(s) {
            *o = x * 1.000_1 + 0.5;
        }
    };
    let (mut fork_join, mut serial, mut team) =
        (Vec::with_capacity(REPS), Vec::with_capacity(REPS), Vec::with_capacity(REPS));
    let n = FORK_BYTES / 8;
    let per = n.div_ceil(threads).div_ceil(16) * 16;
    // The team's first call starts it; the probe measures calls that follow calls.
    let team_pass = |d: &mut [f32]| crate::team::chunks_mut(&mut d[..n], per, |c, d| pass(&src[c * per..], d));
    team_pass(&mut dst);
    for _ in 0..REPS {
        let t = Instant::now();
        dst[..n].par_chunks_mut(per).zip(src[..n].par_chunks(per)).for_each(|(d, s)| pass(s, d));
        fork_join.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        pass(std::hint::black_box(&src), &mut dst);
        serial.push(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
        let t = Instant::now();
        team_pass(&mut dst);
        team.push(t.elapsed().as_secs_f64());
    }
    let fork_join_ns = median(&mut fork_join) * 1e9;
    let serial_gbps = RATE_BYTES as f64 / (median(&mut serial) * 1e9).max(1e-3);
    // bytes / (bytes per ns) = ns of serial work; split from OUTLAST fork-joins' worth.
    let team_ns = median(&mut team) * 1e9;
    let at = |ns: f64| if threads == 1 { usize::MAX } else { (OUTLAST * ns * serial_gbps) as usize };
    SplitCost { threads, min_bytes: at(fork_join_ns), fork_join_ns, serial_gbps, team_ns, team_min_bytes: at(team_ns) }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_is_the_work_of_several_fork_joins_and_one_thread_never_splits() {
        let c = measure();
        assert!(c.fork_join_ns > 0.0 && c.serial_gbps > 0.0, "{c:?}");
        if c.threads > 1 {
            assert!(c.min_bytes as f64 >= c.fork_join_ns * c.serial_gbps, "{c:?}: split below one fork-join's work");
        }
        if c.threads == 1 {
            assert_eq!(c.min_bytes, usize::MAX, "one thread never splits");
        }
    }
}
