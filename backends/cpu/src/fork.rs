//! Forked children. A process forked after the `cpu` kernels ran (a pre-fork server, a
//! `multiprocessing` worker) inherits their memory but none of their threads: rayon's global
//! pool is gone, and a parallel kernel would wait forever for workers that do not exist. A
//! child hook (`pthread_atfork`, registered by [`watch`]) counts forks; a kernel run through
//! [`in_live_pool`] in a forked process runs inside a pool that process started itself, and
//! anything else that keeps threads (the runtime's deadline runners) compares [`generation`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};

use parking_lot::Mutex;

/// How many forks separate this process from the one that called [`watch`] (0 there).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// This process's own pool, once a forked one made it, with the generation that made it.
static POOL: Mutex<Option<(u64, Arc<rayon::ThreadPool>)>> = Mutex::new(None);

static HOOK: Once = Once::new();

/// Registers the child hook, once per process; call it before anything forks (building a
/// `LayerZero` handle does). The hook only increments a counter, which is what may run
/// between `fork` and `exec`.
#[allow(unsafe_code)]
pub fn watch() {
    HOOK.call_once(|| {
        // SAFETY: `pthread_atfork` stores three function pointers; ours is a plain `extern "C"`
        // function with no arguments that only does an atomic add (async-signal-safe), and it
        // lives for the whole program. A non-zero status (out of memory) leaves forks uncounted,
        // the behaviour before this hook.
        let _ = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
}

extern "C" fn after_fork_in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// 0 in the process that registered the hook, n in its n-th forked descendant.
#[inline]
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

/// Runs `f` where rayon's parallel iterators have live workers: directly in the process that
/// started them (one relaxed load) or on a worker of a pool already (a pool of this process),
/// else inside a pool this forked process starts on first use. `Err` when it cannot start
/// one: an error, rather than a call that never returns.
pub fn in_live_pool<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T, String> {
    let generation = generation();
    if generation == 0 || rayon::current_thread_index().is_some() {
        return Ok(f());
    }
    let pool = {
        let mut slot = POOL.lock();
        match slot.as_ref() {
            Some((g, pool)) if *g == generation => pool.clone(),
            _ => {
                // A pool made before the last fork has no threads here: forget it, never join it.
                if let Some(inherited) = slot.take() {
                    std::mem::forget(inherited);
                }
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("lz-forked-{i}"))
                    .build()
                    .map(Arc::new)
                    .map_err(|e| format!("this forked process cannot start worker threads for the cpu kernels: {e}"))?;
                *slot = Some((generation, pool.clone()));
                pool
            }
        }
    };
    Ok(pool.install(f))
}
