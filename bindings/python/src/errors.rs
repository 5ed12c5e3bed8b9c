//! LayerZero's errors as Python exceptions: one class per kind under `LayerZeroError`, each
//! carrying the message and, for selection failures, every reason (`.reasons`). A Rust panic
//! inside a call is caught and raised as `LayerZeroError`, never left to take the interpreter
//! down.

use std::panic::{AssertUnwindSafe, catch_unwind};

use layerzero::error::{Error, ErrorKind};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::reason::Reason;

pyo3::create_exception!(_lz, LayerZeroError, PyException, "Every error LayerZero raises.");
pyo3::create_exception!(
    _lz,
    InvalidInputError,
    LayerZeroError,
    "A request, argument, capability, hardware or policy document is malformed or names an unknown value."
);
pyo3::create_exception!(_lz, IoError, LayerZeroError, "A file could not be read or written.");
pyo3::create_exception!(_lz, SchemaError, LayerZeroError, "A document does not satisfy its JSON Schema.");
pyo3::create_exception!(_lz, NoKernelError, LayerZeroError, "No kernel qualifies; `.reasons` says why, per candidate.");
pyo3::create_exception!(
    _lz,
    KernelFailedError,
    LayerZeroError,
    "Kernels qualified, but every eligible one failed when it ran; `.reasons` lists each attempt."
);
pyo3::create_exception!(_lz, LockViolationError, LayerZeroError, "A policy lock names a kernel that is not eligible.");
pyo3::create_exception!(_lz, UnknownHardwareError, LayerZeroError, "A named hardware profile does not exist.");
pyo3::create_exception!(
    _lz,
    PlanMismatchError,
    LayerZeroError,
    "The ranks of a distributed engine would not serve the same kernels; the message names the ranks and what differs."
);

/// The Python exception for `e`, with its reasons attached as `.reasons`.
pub fn to_py(py: Python<'_>, e: &Error) -> PyErr {
    let message = e.to_string();
    let err = match e.kind() {
        ErrorKind::InvalidInput => InvalidInputError::new_err(message),
        ErrorKind::Io => IoError::new_err(message),
        ErrorKind::Schema => SchemaError::new_err(message),
        ErrorKind::NoKernel => NoKernelError::new_err(message),
        ErrorKind::KernelFailed => KernelFailedError::new_err(message),
        ErrorKind::LockViolation => LockViolationError::new_err(message),
        ErrorKind::UnknownHardware => UnknownHardwareError::new_err(message),
        ErrorKind::PlanMismatch => PlanMismatchError::new_err(message),
        _ => LayerZeroError::new_err(message),
    };
    let reasons: Vec<Reason> = e.reasons().iter().map(Reason::from).collect();
    if let Ok(list) = PyList::new(py, reasons) {
        // Attaching the reasons can only fail when the interpreter is out of memory; the
        // exception is raised without them then.
        let _ = err.value(py).setattr("reasons", list);
    }
    err
}

/// An `InvalidInputError` with `message`.
pub fn invalid(message: impl Into<String>) -> PyErr {
    InvalidInputError::new_err(message.into())
}

/// Runs `f`, turning a LayerZero error into its exception and a panic into `LayerZeroError`.
pub fn guard<T>(py: Python<'_>, f: impl FnOnce() -> layerzero::Result<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(to_py(py, &e)),
        Err(payload) => Err(LayerZeroError::new_err(format!(
            "internal error (a bug in LayerZero; please report it): {}",
            layerzero::exec::executor::panic_text(payload.as_ref())
        ))),
    }
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("LayerZeroError", py.get_type::<LayerZeroError>())?;
    m.add("InvalidInputError", py.get_type::<InvalidInputError>())?;
    m.add("IoError", py.get_type::<IoError>())?;
    m.add("SchemaError", py.get_type::<SchemaError>())?;
    m.add("NoKernelError", py.get_type::<NoKernelError>())?;
    m.add("KernelFailedError", py.get_type::<KernelFailedError>())?;
    m.add("LockViolationError", py.get_type::<LockViolationError>())?;
    m.add("UnknownHardwareError", py.get_type::<UnknownHardwareError>())?;
    m.add("PlanMismatchError", py.get_type::<PlanMismatchError>())?;
    Ok(())
}
