//! GPU device probes: what CUDA and ROCm devices this host has, read through their drivers
//! loaded at run time (`cudarc`, `rocmrc`), so LayerZero builds and runs where neither is
//! installed and reports why. No GPU kernel of LayerZero's own lives here yet.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod cuda;
mod gpus;
pub mod rocm;

/// What a unit test, or a helper of one, returns: a failed call is an `Err` the harness
/// prints, not a panic.
#[cfg(test)]
type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;
