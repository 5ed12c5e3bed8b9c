//! Executors: the code that runs a kernel, bound to kernel ids in a registry.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::args::{OpArgs, Outputs};

/// Why a kernel did not produce a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// The inputs are invalid for this op (an out-of-range block-table entry, a mask that
    /// cannot broadcast); another kernel would fail the same way.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The kernel cannot take these inputs (a case its capability file should have ruled out).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The kernel failed (or panicked) while running.
    #[error("failed: {0}")]
    Failed(String),
    /// The kernel ran out of memory (its workspace or outputs could not be allocated): the
    /// runtime tries a kernel with a smaller workspace next.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// The kernel's device was lost or it made an illegal memory access: the runtime
    /// disables the whole backend until a probe succeeds.
    #[error("device lost: {0}")]
    DeviceLost(String),
    /// The kernel's JIT could not compile it for these inputs' shape on this machine. The
    /// kernel remembers the shape and refuses it at once afterwards; the runtime falls back
    /// without counting it against the kernel's health (other shapes still compile).
    #[error("JIT compilation failed: {0}")]
    CompileFailed(String),
    /// The worker process running the kernel (an isolated plugin's) crashed or hung past its
    /// deadline and was killed; the host survives and the next call starts a new worker.
    #[error("worker lost: {0}")]
    WorkerLost(String),
}

/// The message of a caught panic (`catch_unwind`'s payload), or "unknown panic".
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

/// Runs one kernel.
pub trait Executor: Send + Sync {
    /// Computes the outputs for `args`.
    fn run(&self, args: &OpArgs) -> Result<Outputs, KernelError>;

    /// Computes the outputs for `args`, given `buffers` by output name: a kernel that can
    /// writes an output into the buffer of its name when it holds the output's dtype, has
    /// room for it and is shared with no other tensor (then nothing is allocated);
    /// otherwise it allocates. Buffers it does not use are dropped. The default ignores
    /// them and runs [`run`](Executor::run).
    fn run_into(&self, args: &OpArgs, buffers: Outputs) -> Result<Outputs, KernelError> {
        drop(buffers);
        self.run(args)
    }

    /// True when the executor ends a late call itself (an isolated plugin's worker is killed
    /// at its deadline): the runtime then calls it directly rather than on a runner thread it
    /// would abandon at `kernel_timeout_ms`.
    fn kills_at_deadline(&self) -> bool {
        false
    }

    /// True when the executor runs on tensors in device memory (a Python executor handed
    /// torch's CUDA tensors): the runtime runs no other executor on such tensors, since
    /// LayerZero's own kernels read host memory only.
    fn takes_device_memory(&self) -> bool {
        false
    }

    /// Prepares what the kernel keeps between calls for arguments like `args` (a weight
    /// packed into the layout the kernel wants, once), so that the first call does not pay
    /// for it. Engines call it at load ([`LayerZero::prepare`](crate::LayerZero::prepare)).
    /// The default has nothing to prepare.
    fn prepare(&self, args: &OpArgs) -> Result<(), KernelError> {
        let _ = args;
        Ok(())
    }

    /// Compiles (JIT) everything a call with arguments like `args`, or with any smaller
    /// size along its perf axes, will need, so that no such call compiles; returns how many
    /// compilations it made now (0: all were done before). `lz warmup` calls it with each
    /// bucket's largest size. Kernels without a JIT have nothing to compile: the default.
    fn warm(&self, args: &OpArgs) -> Result<u64, KernelError> {
        let _ = args;
        Ok(0)
    }

    /// True when [`warm`](Executor::warm) would compile nothing for `args` (always, for a
    /// kernel without a JIT). Readiness asks it of every kernel a table names.
    fn is_warm(&self, args: &OpArgs) -> bool {
        let _ = args;
        true
    }
}

/// An executor from a function that writes into the caller's buffers
/// ([`Executor::run_into`]); `run` hands it none.
pub struct WritesInto<F>(pub F);

impl<F> Executor for WritesInto<F>
where
    F: Fn(&OpArgs, &mut Outputs) -> Result<Outputs, KernelError> + Send + Sync,
{
    fn run(&self, args: &OpArgs) -> Result<Outputs, KernelError> {
        (self.0)(args, &mut Outputs::new())
    }

    fn run_into(&self, args: &OpArgs, mut buffers: Outputs) -> Result<Outputs, KernelError> {
        (self.0)(args, &mut buffers)
    }
}

/// An executor that writes into the caller's buffers ([`WritesInto`]'s function) and
/// prepares its constant operands ([`Executor::prepare`]) with a second function.
pub struct Prepares<F, P>(pub F, pub P);

impl<F, P> Executor for Prepares<F, P>
where
    F: Fn(&OpArgs, &mut Outputs) -> Result<Outputs, KernelError> + Send + Sync,
    P: Fn(&OpArgs) -> Result<(), KernelError> + Send + Sync,
{
    fn run(&self, args: &OpArgs) -> Result<Outputs, KernelError> {
        (self.0)(args, &mut Outputs::new())
    }

    fn run_into(&self, args: &OpArgs, mut buffers: Outputs) -> Result<Outputs, KernelError> {
        (self.0)(args, &mut buffers)
    }

    fn prepare(&self, args: &OpArgs) -> Result<(), KernelError> {
        (self.1)(args)
    }
}

impl<F> Executor for F
where
    F: Fn(&OpArgs) -> Result<Outputs, KernelError> + Send + Sync,
{
    fn run(&self, args: &OpArgs) -> Result<Outputs, KernelError> {
        self(args)
    }
}

/// Kernel id -> executor.
#[derive(Clone, Default)]
pub struct Registry {
    executors: BTreeMap<String, Arc<dyn Executor>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("kernels", &self.executors.keys().collect::<Vec<_>>()).finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Binds `kernel` to `executor` (replacing any previous one).
    pub fn register(&mut self, kernel: &str, executor: Arc<dyn Executor>) {
        self.executors.insert(kernel.to_owned(), executor);
    }

    /// The executor of `kernel`.
    pub fn get(&self, kernel: &str) -> Option<&Arc<dyn Executor>> {
        self.executors.get(kernel)
    }

    /// Registered kernel ids.
    pub fn kernels(&self) -> impl Iterator<Item = &str> {
        self.executors.keys().map(|k| k.as_str())
    }

    /// True when `kernel` has an executor.
    pub fn contains(&self, kernel: &str) -> bool {
        self.executors.contains_key(kernel)
    }
}
