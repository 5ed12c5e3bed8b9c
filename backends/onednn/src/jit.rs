//! oneDNN's JIT as LayerZero's: a primitive is compiled when it is created, so every
//! primitive is created once per key and kept in one bounded, process-wide cache, with
//! counters that prove warm-up (a warmed bucket compiles nothing on its first request).
//! The cache is read with one atomic load (no lock on a call's path); a compilation
//! publishes a new copy of it. A key whose primitive could not be created is remembered: later calls fail at once with
//! the first failure (`JIT_COMPILE_FAILED`), never compiling again, and the runtime falls
//! back to the next kernel.
//!
//! Keys are chosen so that a bucket of sizes needs a bounded set of them: the matmul's row
//! count is a runtime dimension (one primitive serves every m), and row-wise kernels run
//! their rows in power-of-two chunks (rows = sum of the powers of two in its binary form),
//! so a bucket `(2^(i-1), 2^i]` needs the chunks `1, 2, .., 2^i` and no other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::api::Prim;
use layerzero_core::exec::executor::KernelError;

/// Created primitives kept at most; past it a call creates its own and drops it (counted).
pub const MAX_PRIMITIVES: usize = 1024;

/// What a primitive is made for: the kernel, its dims, and a word of flags (dtype codes,
/// layout, presence of optional operands), all exact.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Key {
    pub kernel: &'static str,
    pub dims: [i64; 4],
    pub flags: u64,
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?} flags {:#x}", self.kernel, self.dims, self.flags)
    }
}

#[derive(Clone)]
enum Slot {
    Ready(Arc<Prim>),
    Failed(Arc<str>),
}

/// The cache, read without a lock (a call finds its primitive with one atomic load); a
/// compilation publishes a new map under `WRITE` (rare: once per key).
static CACHE: LazyLock<ArcSwap<HashMap<Key, Slot>>> = LazyLock::new(|| ArcSwap::from_pointee(HashMap::new()));
static WRITE: Mutex<()> = Mutex::new(());
static COMPILED: AtomicU64 = AtomicU64::new(0);
static COMPILE_NS: AtomicU64 = AtomicU64::new(0);
static FAILURES: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);
static UNCACHED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Primitives this thread created: what one warm-up call compiled.
    static HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Primitives the calling thread has created so far.
pub(super) fn compiled_here() -> u64 {
    HERE.with(std::cell::Cell::get)
}

/// What oneDNN's JIT has done in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct JitStats {
    /// Primitives created (each one a JIT compilation).
    pub compiled: u64,
    /// Total time spent creating them, in nanoseconds.
    pub compile_ns: u64,
    /// Keys whose primitive could not be created.
    pub failures: u64,
    /// Calls refused at once because their key failed before (never compiled again).
    pub refused: u64,
    /// Primitives created past the cache's bound (created per call and dropped).
    pub uncached: u64,
    /// Primitives held now.
    pub entries: u64,
}

/// The JIT counters.
pub fn jit_stats() -> JitStats {
    let entries = CACHE.load().values().filter(|s| matches!(s, Slot::Ready(_))).count() as u64;
    JitStats {
        compiled: COMPILED.load(Ordering::Relaxed),
        compile_ns: COMPILE_NS.load(Ordering::Relaxed),
        failures: FAILURES.load(Ordering::Relaxed),
        refused: REFUSED.load(Ordering::Relaxed),
        uncached: UNCACHED.load(Ordering::Relaxed),
        entries,
    }
}

/// True when `key`'s primitive is created and kept.
pub(super) fn is_ready(key: &Key) -> bool {
    matches!(CACHE.load().get(key), Some(Slot::Ready(_)))
}

/// The primitive of `key`: kept, or created now by `make` (and kept while the cache has
/// room). A key that failed before fails again at once with its first error.
pub(super) fn primitive(key: Key, make: impl FnOnce() -> Result<Prim, KernelError>) -> Result<Arc<Prim>, KernelError> {
    let found = CACHE.load().get(&key).cloned();
    match found {
        Some(Slot::Ready(p)) => return Ok(p),
        Some(Slot::Failed(why)) => {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            return Err(KernelError::CompileFailed(format!("{why} (failed when first created; not retried)")));
        }
        None => {}
    }
    let started = Instant::now();
    let made = make();
    let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    match made {
        Ok(p) => {
            COMPILED.fetch_add(1, Ordering::Relaxed);
            HERE.with(|h| h.set(h.get() + 1));
            COMPILE_NS.fetch_add(ns, Ordering::Relaxed);
            let p = Arc::new(p);
            if !publish(key, Slot::Ready(Arc::clone(&p))) {
                UNCACHED.fetch_add(1, Ordering::Relaxed);
            }
            Ok(p)
        }
        Err(e) => {
            FAILURES.fetch_add(1, Ordering::Relaxed);
            let why = format!("{key}: {e}");
            publish(key, Slot::Failed(why.as_str().into()));
            Err(match e {
                KernelError::CompileFailed(_) => KernelError::CompileFailed(why),
                other => other,
            })
        }
    }
}

/// Publishes `slot` for `key` (a new map, copied: keys are few and compilations rare);
/// false when the cache is full.
fn publish(key: Key, slot: Slot) -> bool {
    let _writer = WRITE.lock();
    let current = CACHE.load_full();
    if current.len() >= MAX_PRIMITIVES && !current.contains_key(&key) {
        return false;
    }
    let mut next = HashMap::clone(&current);
    next.insert(key, slot);
    CACHE.store(Arc::new(next));
    true
}

/// The power-of-two chunks of `rows` (its binary form, largest first): row-wise primitives
/// run one chunk at a time, so a bucket needs only the powers of two up to its bound.
pub(super) fn chunks(rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut start = 0;
    (0..usize::BITS).rev().filter_map(move |b| {
        let size = 1usize << b;
        (rows & size != 0).then(|| {
            let at = start;
            start += size;
            (at, size)
        })
    })
}

/// The chunk sizes every row count up to `rows` needs: the powers of two up to `rows`.
pub(super) fn chunk_sizes_up_to(rows: usize) -> impl Iterator<Item = usize> {
    (0..usize::BITS).map(|b| 1usize << b).take_while(move |&s| s <= rows.max(1))
}

/// [`chunks`] with no chunk larger than `cap` (a power of two): whole caps first, then the
/// binary form of the rest. A bucket then needs the powers of two up to `min(bound, cap)`.
pub(super) fn capped_chunks(rows: usize, cap: usize) -> impl Iterator<Item = (usize, usize)> {
    let whole = rows / cap;
    let rest = rows % cap;
    (0..whole).map(move |i| (i * cap, cap)).chain(chunks(rest).map(move |(at, size)| (whole * cap + at, size)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_run_in_the_powers_of_two_of_their_binary_form() {
        assert_eq!(chunks(13).collect::<Vec<_>>(), [(0, 8), (8, 4), (12, 1)]);
        assert_eq!(chunks(1).collect::<Vec<_>>(), [(0, 1)]);
        assert_eq!(chunks(0).count(), 0);
        assert_eq!(chunk_sizes_up_to(12).collect::<Vec<_>>(), [1, 2, 4, 8]);
        assert_eq!(chunk_sizes_up_to(16).collect::<Vec<_>>(), [1, 2, 4, 8, 16]);
        assert_eq!(capped_chunks(21, 8).collect::<Vec<_>>(), [(0, 8), (8, 8), (16, 4), (20, 1)]);
        assert_eq!(capped_chunks(3, 8).collect::<Vec<_>>(), [(0, 2), (2, 1)]);
    }

    #[test]
    fn a_key_that_failed_to_compile_is_refused_at_once_and_never_compiled_again() {
        let key = Key { kernel: "test.failing", dims: [3, 5, 7, 0], flags: 1 };
        let before = jit_stats();
        let first = primitive(key.clone(), || Err(KernelError::CompileFailed("no implementation".into())));
        assert!(
            matches!(&first, Err(KernelError::CompileFailed(m)) if m.contains("test.failing")),
            "{:?}",
            first.err()
        );
        let mut called = false;
        let again = primitive(key, || {
            called = true;
            Err(KernelError::CompileFailed("tried again".into()))
        });
        assert!(!called, "the failed key was compiled again");
        assert!(matches!(&again, Err(KernelError::CompileFailed(m)) if m.contains("not retried")), "{:?}", again.err());
        let after = jit_stats();
        assert!(after.failures > before.failures && after.refused > before.refused, "{before:?} -> {after:?}");
    }

    #[test]
    fn every_row_count_of_a_bucket_uses_only_the_chunks_of_its_upper_edge() {
        for hi in [1usize, 2, 4, 8, 64, 1024] {
            let warmed: Vec<usize> = chunk_sizes_up_to(hi).collect();
            for rows in (hi / 2 + 1)..=hi {
                assert!(chunks(rows).all(|(_, s)| warmed.contains(&s)), "rows {rows} of bucket ..{hi}");
            }
        }
    }
}
