//! LayerZero: a kernel-selection runtime for ML inference.
//!
//! It knows what every kernel of every backend can do (capabilities as data), selects the
//! fastest valid kernel for a request on a machine, and explains every verdict with stable
//! reason codes. See `DESIGN.md` for the one data path this crate implements.
//!
//! ```
//! use std::sync::Arc;
//! use layerzero::capabilities::catalog::Catalog;
//! use layerzero::hardware::named;
//! use layerzero::model::request::Request;
//! use layerzero::policy::Policy;
//! use layerzero::select::Selector;
//!
//! // Plan for an H100 from any machine: every backend counts as installed.
//! let selector = Selector::planning(
//!     Catalog::builtin()?,
//!     Arc::new(named::load("h100")?),
//!     Arc::new(Policy::default()),
//! )?;
//! let request = Request::from_json(r#"{"op": "attention",
//!     "tensors": {"q": {"dtype": "bf16", "shape": [1, 4096, 32, 128], "layout": "BSHD"},
//!                 "k": {"dtype": "bf16", "shape": [1, 4096, 8, 128], "layout": "BSHD"},
//!                 "v": {"dtype": "bf16", "shape": [1, 4096, 8, 128], "layout": "BSHD"}},
//!     "attrs": {"causal": true, "dropout_p": 0.1}}"#)?;
//! let selection = selector.select(&request)?;
//! // FlashAttention-3 has no dropout, so it cannot be the answer; the report says why.
//! assert_ne!(selection.kernel, "flash_attn_3.attention.fwd");
//! let report = selector.explain(&request);
//! let fa3 = report.candidate("flash_attn_3.attention.fwd").unwrap();
//! assert_eq!(fa3.reasons[0].code().as_str(), "DROPOUT_UNSUPPORTED");
//! # Ok::<(), layerzero::Error>(())
//! ```

#![deny(unsafe_code)]

pub mod backend;
pub mod canonical;
pub mod capabilities;
#[cfg(feature = "cli")]
pub mod cli;
pub mod constraint;
pub mod error;
pub mod exec;
pub mod hardware;
pub mod knobs;
pub mod model;
pub mod parity;
pub mod perfdb;
pub mod plan;
pub mod policy;
pub mod readiness;
pub mod reason;
pub mod schema;
pub mod score;
pub mod select;
pub mod tensor;
pub mod transform;
pub mod tune;

pub use error::{Error, ErrorKind, Result};
pub use reason::{Category, Reason, ReasonCode};
