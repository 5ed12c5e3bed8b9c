//! Execution: typed arguments and the executors bound to kernel ids. The semantics every
//! kernel implements are in `semantics`; the runtime that selects, runs and falls back is
//! [`crate::runtime`].

pub mod args;
pub mod check;
pub mod executor;
pub mod outputs;
pub mod quant;
pub mod semantics;
pub mod synth;
