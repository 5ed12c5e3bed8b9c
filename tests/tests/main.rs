//! LayerZero integration tests: through the public API and the `lz` CLI.

mod flips;
