//! Execution: typed arguments, executors bound to kernel ids, and the runtime that selects,
//! runs and falls back. The semantics every kernel implements are in `semantics`.

pub mod args;
pub mod executor;
pub mod quant;
pub mod runtime;
pub mod semantics;
