//! Subprocess isolation: an isolated plugin is opened and run in a worker process
//! (`layerzero-plugin-worker`), never loaded into the host. Tensors cross in shared-memory
//! files (the data is copied once each way, never serialized); metadata, status codes and
//! messages cross as small JSON messages over the worker's stdin and stdout. A worker that
//! crashes (a signal, an abort) or runs past its deadline is killed: the call fails with
//! `KernelError::WorkerLost` (reason `KERNEL_WORKER_LOST`), the runtime falls back, and the
//! next call starts a new worker. The host process survives whatever the plugin does.

mod client;
mod serve;
mod shm;
mod wire;

pub use client::{IsolatedExecutor, Worker, WorkerOptions};
pub use serve::serve;

/// The elements a tensor of `shape` and `strides` reaches from its first: 0 when it has none,
/// `None` when a size or stride is negative or the span overflows.
pub(crate) fn extent(shape: &[i64], strides: &[i64]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().zip(strides).try_fold(1usize, |acc, (&d, &s)| {
        let (d, s) = (usize::try_from(d).ok()?, usize::try_from(s).ok()?);
        acc.checked_add((d - 1).checked_mul(s)?)
    })
}
