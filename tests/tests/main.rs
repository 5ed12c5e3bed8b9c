//! LayerZero integration tests: through the public API and the `lz` CLI.

mod determinism;
mod files;
mod flips;
mod cli;
mod policy;
mod properties;
