//! Capabilities as data: the typed capability files and the catalog built from them.

pub mod catalog;
pub mod spec;
mod version;

pub use version::Version;
