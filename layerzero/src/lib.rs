//! LayerZero: a kernel-selection runtime for ML inference.
//!
//! It knows what every kernel of every backend can do (capabilities as data), selects the
//! fastest valid kernel for a request on a machine, and explains every verdict with stable
//! reason codes. See `DESIGN.md` for the one data path this crate implements.

#![deny(unsafe_code)]

pub mod backend;
pub mod canonical;
pub mod capabilities;
#[cfg(feature = "cli")]
pub mod cli;
pub mod constraint;
pub mod error;
pub mod hardware;
pub mod model;
pub mod policy;
pub mod reason;
pub mod schema;
pub mod score;
pub mod select;
pub mod transform;

pub use error::{Error, ErrorKind, Result};
pub use reason::{Category, Reason, ReasonCode};
