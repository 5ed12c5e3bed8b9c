//! A child forked after the parent used LayerZero (a `multiprocessing` worker, a DataLoader
//! worker, a gunicorn worker) inherits the parent's memory but none of its threads: rayon's
//! global pool, the deadline runners and the memory sampler are gone, and a parallel kernel
//! would wait forever for workers that do not exist. So the package registers an
//! after-fork hook (`os.register_at_fork`) that marks the child: its process handle is built
//! afresh on next use (new runners and sampler), and every dispatch in it runs inside a rayon
//! pool of its own, made on first use in that process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;

/// Set in a forked child (and its children).
static FORKED: AtomicBool = AtomicBool::new(false);

/// The pool of this process, once a forked child made one; with the pid that made it.
static POOL: Mutex<Option<(u32, Arc<rayon::ThreadPool>)>> = Mutex::new(None);

/// Runs `f` where rayon's parallel iterators have live workers: the global pool in the
/// process that started it, a pool of this process's own in a forked child (an error when
/// the child cannot start one, rather than a call that waits forever).
pub fn in_live_pool<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T, String> {
    if !FORKED.load(Ordering::Relaxed) {
        return Ok(f());
    }
    match child_pool() {
        Some(pool) => Ok(pool.install(f)),
        None => Err("this forked process could not start worker threads for LayerZero's kernels".to_owned()),
    }
}

fn child_pool() -> Option<Arc<rayon::ThreadPool>> {
    let pid = std::process::id();
    let mut slot = POOL.lock().ok()?;
    if let Some((owner, pool)) = slot.as_ref()
        && *owner == pid
    {
        return Some(pool.clone());
    }
    // A pool inherited from the parent has no threads here: forget it, never join it.
    if let Some(inherited) = slot.take() {
        std::mem::forget(inherited);
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = Arc::new(rayon::ThreadPoolBuilder::new().num_threads(threads).build().ok()?);
    *slot = Some((pid, pool.clone()));
    Some(pool)
}

/// The after-fork hook: this process is a forked child.
#[pyfunction]
pub fn _after_fork_in_child() {
    FORKED.store(true, Ordering::Relaxed);
    crate::host::forget_current();
}
