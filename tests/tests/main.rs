//! LayerZero integration tests: through the public API and the `lz` CLI.

mod cli;
mod cli_plans;
mod concurrency;
mod determinism;
mod failure_injection;
mod faults;
mod file_safety;
mod files;
mod fixtures;
mod flips;
mod front_door;
mod health;
mod isa_cap;
mod measured;
mod memory;
mod models;
mod observability;
mod onednn;
mod plans;
mod policy;
mod policy_config;
mod properties;
mod runtime;
mod selection_table;
mod shipped_tables;
mod tune;
