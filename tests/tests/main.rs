//! LayerZero integration tests: through the public API and the `lz` CLI.

mod cli;
mod cli_plans;
mod concurrency;
mod determinism;
mod faults;
mod file_safety;
mod files;
mod fixtures;
mod flips;
mod front_door;
mod measured;
mod models;
mod plans;
mod policy;
mod properties;
mod runtime;
mod selection_table;
mod shipped_tables;
mod tune;
