//! The builtin backends, each a crate of its own on the core's execution vocabulary, none
//! importing another: the reference oracle, the fast `cpu` kernels, oneDNN loaded at run time,
//! the CUDA and ROCm device probes, the shared-library probe they load with, and the host of
//! plugins (kernel libraries from outside, over a C ABI).

pub use layerzero_cpu as cpu;
pub use layerzero_dylib as library;
pub use layerzero_gpu::{cuda, rocm};
pub use layerzero_onednn as onednn;
pub use layerzero_plugin as plugin;
pub use layerzero_reference as cpu_reference;
