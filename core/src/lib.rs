//! The core of LayerZero, the kernel-selection runtime for ML inference: the vocabulary
//! (ops, dtypes, layouts, tensors, requests, typed arguments and the executor interface),
//! capabilities as data, constraints, policy, transforms, the cost model, selection, keys,
//! buckets and plans, reasons and errors.
//!
//! It is pure: no I/O beyond the files it is handed, no environment read, no clock read
//! (instants are passed in; [`time`] is where the edges read the clock), no backend. The
//! backends build on its execution vocabulary; the runtime (crate `layerzero`) wires them
//! into a handle and re-exports every module here, which is how engines use it.

#![deny(unsafe_code)]
#![warn(missing_docs)]

// The vocabulary.
pub mod error;
pub mod model;
pub mod reason;
pub mod tensor;
pub mod time;

// Execution: typed arguments, their checks and the executor interface.
pub mod compare;
pub mod exec;

// Capabilities and hardware as data.
pub mod capabilities;
pub mod files;
pub mod hardware;

// The stages of selection, in path order.
pub mod capacity;
pub mod constraint;
pub mod key;
pub mod plan;
pub mod policy;
pub mod score;
pub mod select;
pub mod transform;

// Tools rather than API: file formats and canonical hashing.
#[doc(hidden)]
pub mod canonical;
#[doc(hidden)]
pub mod schema;

/// What a unit test, or a helper of one, returns: a failed call is an `Err` the harness
/// prints, not a panic.
#[cfg(test)]
type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;
