//! Plugins: kernel libraries from outside LayerZero, opened over the C ABI of
//! `layerzero-plugin-abi` and run as executors. A plugin's kernels live in its namespace,
//! `NAME@VERSION` (its backend name and version), so two versions load side by side and a
//! policy can name either: `fusedops@0.1.0.rms_norm.add_fused`.
//!
//! Opening checks, in order, each refusal with its reason code: the file loads as a shared
//! library (`PLUGIN_NOT_LOADABLE`), speaks this ABI (`PLUGIN_ABI_UNSUPPORTED`), declares valid
//! capabilities in its own namespace (`PLUGIN_CAPABILITIES_INVALID`), and exports every kernel
//! it declares (`PLUGIN_KERNEL_MISSING`). Loading a library runs its initialisers, so only load
//! files you trust (the lockfile says which).

#![deny(unsafe_code)]

#[cfg(target_os = "linux")]
mod elf;
mod executor;
mod library;
#[cfg(unix)]
pub mod worker;

pub use executor::PluginExecutor;
pub use layerzero_plugin_abi as abi;
pub use library::{Plugin, declared_backend, plugin_error};
