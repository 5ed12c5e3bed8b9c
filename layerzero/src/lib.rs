//! LayerZero: a kernel-selection runtime for ML inference.
//!
//! It knows what every kernel of every backend can do (capabilities as data), selects the
//! fastest valid kernel for a request on a machine, explains every verdict with stable
//! reason codes, and runs it, falling back when a kernel fails.
//!
//! Start with one `use` line and three calls on the process-wide handle for this machine:
//!
//! ```
//! use layerzero as lz;
//!
//! let request = lz::Request::from_json(r#"{"op": "rms_norm",
//!     "tensors": {"x": {"dtype": "f32", "shape": [4, 4096]}, "weight": {"dtype": "f32", "shape": [4096]}}}"#)?;
//! let selection = lz::select(&request)?;               // the kernel, its transforms, its score
//! println!("{} ({})", selection.kernel, selection.backend);
//! let report = lz::explain(&request)?;                 // every candidate with its reasons
//! assert_eq!(report.selected.as_deref(), Some(selection.kernel.as_str()));
//!
//! let x = lz::HostTensor::from_f32(&[4, 4096], vec![1.0; 4 * 4096])?;
//! let weight = lz::HostTensor::from_f32(&[4096], vec![0.5; 4096])?;
//! let args = lz::OpArgs::RmsNorm(lz::NormArgs { x, weight, bias: None, residual: None, attrs: Default::default() });
//! let ran = lz::dispatch(&args)?;                      // selects from the typed arguments and runs
//! assert_eq!(ran.outputs["out"].shape(), &[4, 4096]);
//! # Ok::<(), lz::Error>(())
//! ```
//!
//! For a handle of your own (another policy, a dispatch table, your executors, planning for
//! another machine) build a [`LayerZero`]: [`LayerZero::host`], [`LayerZero::planning`],
//! then `.with_policy(..)`, `.with_plan(..)`, `.with_perfdb(..)`, `.register(..)`. The
//! repository's `ARCHITECTURE.md` maps every stage of the data path to its module.

#![deny(unsafe_code)]
#![warn(missing_docs)]

#[doc(hidden)]
pub use layerzero_core::{canonical, schema};
pub use layerzero_core::{
    capabilities, capacity, compare, constraint, error, exec, files, hardware, key, model, plan, policy, reason, score,
    select, tensor, time, transform,
};

pub mod backend;
pub mod distributed;
pub mod health;
pub mod host;
pub mod knobs;
#[cfg(feature = "perfdb")]
pub mod perfdb;
pub mod plugins;
pub mod readiness;
pub mod runtime;
pub mod snapshot;
pub mod telemetry;
#[cfg(feature = "perfdb")]
pub mod tune;

use std::sync::OnceLock;

pub use capabilities::catalog::Catalog;
pub use error::{Error, ErrorKind, Result};
pub use exec::args::{
    AttentionArgs, EmbeddingArgs, LinearArgs, MlpArgs, NormArgs, OpArgs, Outputs, PagedAttentionArgs, RopeArgs,
    SampleArgs, SwigluArgs,
};
pub use exec::executor::{Executor, KernelError, Registry};
pub use hardware::profile::HardwareProfile;
pub use host::builtin_registry;
pub use model::attrs::{AttentionAttrs, Attrs, NormAttrs};
pub use model::device::DeviceKind;
pub use model::dtype::DType;
pub use model::layout::Layout;
pub use model::op::Op;
pub use model::request::Request;
pub use model::tensor::TensorDesc;
pub use plan::{DispatchTable, SelectionKey};
pub use policy::Policy;
pub use reason::{Category, Reason, ReasonCode};
pub use runtime::{Counters, Dispatch, Hit, LayerZero, PlanMode, SelectionSource};
pub use select::{Selection, SelectionReport, Verdict};
pub use tensor::HostTensor;

/// The types an engine needs: `use layerzero::prelude::*;`.
pub mod prelude {
    pub use crate::{
        AttentionArgs, AttentionAttrs, DType, Dispatch, Error, ErrorKind, Executor, HostTensor, KernelError, LayerZero,
        Layout, NormArgs, Op, OpArgs, Outputs, PlanMode, Policy, Reason, ReasonCode, Request, Result, Selection,
        SelectionReport, SelectionSource, TensorDesc,
    };
}

/// The process-wide handle for this machine, created on first use by [`LayerZero::host`].
/// A configuration error (an invalid `LAYERZERO_POLICY` file, say) is returned by every
/// call, unchanged.
///
/// When `LAYERZERO_POLICY` names a file, the handle watches it (every
/// `LAYERZERO_POLICY_POLL_MS`) and swaps in a changed, valid policy while serving.
pub fn host() -> Result<&'static LayerZero> {
    static HOST: OnceLock<Result<LayerZero>> = OnceLock::new();
    static WATCH: OnceLock<Option<runtime::PolicyWatch>> = OnceLock::new();
    let lz = HOST.get_or_init(LayerZero::host).as_ref().map_err(Clone::clone)?;
    WATCH.get_or_init(|| lz.settings().policy.clone().and_then(|path| lz.watch_policy_static(&path).ok()));
    Ok(lz)
}

/// Selects a kernel for `request` on this machine ([`LayerZero::select`] on [`host`]).
pub fn select(request: &Request) -> Result<Hit<'static>> {
    host()?.select(request)
}

/// Every candidate's verdict for `request` on this machine ([`LayerZero::explain`] on
/// [`host`]; an error only when the handle cannot be created).
pub fn explain(request: &Request) -> Result<SelectionReport> {
    Ok(host()?.explain(request))
}

/// Selects for typed arguments and runs the kernel, falling back when it fails
/// ([`LayerZero::dispatch`] on [`host`]).
pub fn dispatch(args: &OpArgs) -> Result<Dispatch<'static>> {
    host()?.dispatch(args)
}

/// Selects for typed arguments without building a request on a hit
/// ([`LayerZero::select_args`] on [`host`]).
pub fn select_args(args: &OpArgs) -> Result<Hit<'static>> {
    host()?.select_args(args)
}

/// What a unit test, or a helper of one, returns: a failed call is an `Err` the harness
/// prints, not a panic.
#[cfg(test)]
type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;
