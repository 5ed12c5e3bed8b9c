//! Ops on torch tensors through the runtime (`layerzero.ops`): the tensors are lent in place,
//! the kernel is selected on a plan or cache hit and run with the GIL released, and the
//! outputs are written into the buffers the caller hands in (no copy) whenever the kernel can;
//! otherwise they come back as views of lent memory, or are copied into the buffers once.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use layerzero::exec::args::{OpArgs, Outputs};
use layerzero::exec::executor::panic_text;
use layerzero::model::attrs::Attrs;
use layerzero::model::layout::Layout;
use layerzero::model::op::Op;
use layerzero::model::request::Request;
use layerzero::tensor::HostTensor;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::{LayerZeroError, invalid, to_py};
use crate::handle::Handle;
use crate::host;
use crate::pyexec::PyExecutor;
use crate::tensors::{Lent, lend, meta, output_name, to_torch};

/// One shape of call: the op, its attributes (parsed and checked once), the tensor roles in
/// argument order, the layout the attention tensors are in, and the outputs. `layerzero.ops`
/// makes one per distinct set of attributes and keeps it.
#[pyclass(module = "layerzero", frozen)]
pub struct Call {
    op: Op,
    attrs: Attrs,
    inputs: Vec<String>,
    layout: Option<Layout>,
    /// Layout tags of other inputs by name (a paged cache's NHD or HND).
    layouts: Vec<(String, Layout)>,
    outputs: Vec<&'static str>,
}

#[pymethods]
impl Call {
    #[new]
    #[pyo3(signature = (op, attrs, inputs, outputs, layout = None, layouts = None))]
    fn new(
        op: &str,
        attrs: &Bound<'_, PyDict>,
        inputs: Vec<String>,
        outputs: Vec<String>,
        layout: Option<&str>,
        layouts: Option<Vec<(String, String)>>,
    ) -> PyResult<Call> {
        let attrs_json: String = attrs.py().import("json")?.call_method1("dumps", (attrs,))?.extract()?;
        let value = serde_json::json!({"op": op, "tensors": {}, "attrs": serde_json::from_str::<serde_json::Value>(&attrs_json)
            .map_err(|e| invalid(e.to_string()))?});
        let request = Request::from_value(value).map_err(|e| invalid(e.to_string()))?;
        let layout = layout
            .map(|l| {
                Layout::from_name(l).ok_or_else(|| invalid(format!("argument `layout`: {l:?}: expected BSHD or BHSD")))
            })
            .transpose()?;
        let outputs = outputs
            .iter()
            .map(|o| output_name(o).ok_or_else(|| invalid(format!("{o:?} is not an output name"))))
            .collect::<PyResult<_>>()?;
        let layouts = layouts
            .unwrap_or_default()
            .into_iter()
            .map(|(name, l)| match Layout::from_name(&l) {
                Some(layout) if inputs.contains(&name) => Ok((name, layout)),
                Some(_) => Err(invalid(format!("argument `layouts`: {name:?} is not a tensor of {op}"))),
                None => Err(invalid(format!("argument `layouts`: {name}={l:?} is not a layout"))),
            })
            .collect::<PyResult<_>>()?;
        Ok(Call { op: request.op, attrs: request.attrs, inputs, layout, layouts, outputs })
    }

    fn __repr__(&self) -> String {
        format!("Call({}, {:?})", self.op, self.attrs)
    }
}

impl Call {
    /// The layout tag of input `name` (attention's q, k, v).
    fn layout_of(&self, name: &str) -> Option<Layout> {
        if let Some((_, l)) = self.layouts.iter().find(|(n, _)| n == name) {
            return Some(*l);
        }
        matches!(name, "q" | "k" | "v").then_some(self.layout).flatten()
    }
}

/// Runs one call: `inputs` in the call's role order (None for an absent optional tensor),
/// `outs` the output buffers in the call's output order (None: the kernel allocates), on
/// `handle` (default: the process handle). Returns the outputs: the buffers themselves where
/// the kernel wrote them.
#[pyfunction]
#[pyo3(signature = (call, inputs, outs, handle = None))]
pub fn dispatch<'py>(
    py: Python<'py>,
    call: &Bound<'py, Call>,
    inputs: &Bound<'py, PyTuple>,
    outs: &Bound<'py, PyTuple>,
    handle: Option<&Bound<'py, Handle>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let call = call.get();
    let held;
    let lz: &layerzero::runtime::LayerZero = match handle {
        Some(h) => {
            held = h.get().runtime()?;
            held.get()
        }
        None => host::current().map_err(|e| to_py(py, &e))?,
    };
    let Prepared { args, buffers, given } = prepare(py, call, inputs, outs)?;
    let ran = py.detach(|| {
        crate::fork::in_live_pool(|| {
            catch_unwind(AssertUnwindSafe(|| lz.dispatch_into(&args, buffers).map(|d| d.outputs)))
        })
    });
    drop(args);
    let outputs = match ran.map_err(LayerZeroError::new_err)? {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(to_py(py, &e)),
        Err(p) => return Err(internal(&p)),
    };
    collect(py, call, outputs, given)
}

/// Runs one of LayerZero's own kernels directly: no selection, health, deadline or fallback
/// (what `dispatch` adds is measured against it: `tools/bench_python_overhead.py`).
#[pyfunction]
pub fn run_kernel<'py>(
    py: Python<'py>,
    kernel: &str,
    call: &Bound<'py, Call>,
    inputs: &Bound<'py, PyTuple>,
    outs: &Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyTuple>> {
    static REGISTRY: std::sync::OnceLock<layerzero::exec::executor::Registry> = std::sync::OnceLock::new();
    let registry = REGISTRY.get_or_init(layerzero::builtin_registry);
    let exec =
        registry.get(kernel).ok_or_else(|| invalid(format!("{kernel:?} is not one of LayerZero's own kernels")))?;
    let call = call.get();
    let Prepared { args, buffers, given } = prepare(py, call, inputs, outs)?;
    if let Some((n, d)) = args.on_device() {
        return Err(invalid(format!("argument `{n}` is on {d}; {kernel} reads host memory only")));
    }
    let ran =
        py.detach(|| crate::fork::in_live_pool(|| catch_unwind(AssertUnwindSafe(|| exec.run_into(&args, buffers)))));
    drop(args);
    let outputs = match ran.map_err(LayerZeroError::new_err)? {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(crate::errors::KernelFailedError::new_err(format!("{kernel}: {e}"))),
        Err(p) => return Err(internal(&p)),
    };
    collect(py, call, outputs, given)
}

fn internal(p: &Box<dyn std::any::Any + Send>) -> PyErr {
    LayerZeroError::new_err(format!(
        "internal error (a bug in LayerZero; please report it): {}",
        panic_text(p.as_ref())
    ))
}

/// A call's arguments lent to the runtime, its output buffers, and those buffers as given.
struct Prepared<'py> {
    args: OpArgs,
    buffers: Outputs,
    given: Vec<Option<Bound<'py, PyAny>>>,
}

/// Lends the inputs and output buffers (CPU tensors' memory in place, CUDA tensors as device
/// memory that only the Python executors are handed).
fn prepare<'py>(
    py: Python<'py>,
    call: &Call,
    inputs: &Bound<'py, PyTuple>,
    outs: &Bound<'py, PyTuple>,
) -> PyResult<Prepared<'py>> {
    let mut tensors: BTreeMap<&str, HostTensor> = BTreeMap::new();
    for (name, value) in call.inputs.iter().zip(inputs.iter()) {
        if value.is_none() {
            continue;
        }
        let m = meta(name, &value)?;
        tensors.insert(name, lend(name, &value, &m, false, call.layout_of(name))?);
    }
    let args = OpArgs::from_tensors(call.op, &call.attrs, tensors).map_err(|e| to_py(py, &e))?;
    let mut buffers = Outputs::new();
    let mut given: Vec<Option<Bound<'py, PyAny>>> = Vec::with_capacity(call.outputs.len());
    for (name, value) in call.outputs.iter().zip(outs.iter()) {
        if value.is_none() {
            given.push(None);
            continue;
        }
        let m = meta(name, &value)?;
        buffers.insert(name, lend(name, &value, &m, true, None)?);
        given.push(Some(value));
    }
    Ok(Prepared { args, buffers, given })
}

/// The outputs as torch tensors: each buffer the kernel wrote, a view of lent memory, or a
/// copy (into the buffer when one was given).
fn collect<'py>(
    py: Python<'py>,
    call: &Call,
    mut outputs: Outputs,
    given: Vec<Option<Bound<'py, PyAny>>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let mut result = Vec::with_capacity(call.outputs.len());
    for (name, buffer) in call.outputs.iter().zip(given) {
        let t = outputs
            .remove(name)
            .ok_or_else(|| LayerZeroError::new_err(format!("the kernel did not produce output `{name}`")))?;
        result.push(match buffer {
            Some(b) if written_in(&t, &b)? => b,
            Some(b) => {
                b.call_method1("copy_", (to_torch(py, &t)?,))?;
                b
            }
            None => to_torch(py, &t)?,
        });
    }
    PyTuple::new(py, result)
}

/// True when the kernel wrote output `t` into the buffer `b` the caller handed in.
fn written_in(t: &HostTensor, b: &Bound<'_, PyAny>) -> PyResult<bool> {
    let Some(lent) = t.storage().region().and_then(|r| r.as_any().downcast_ref::<Lent>()) else {
        return Ok(false);
    };
    Ok(lent.owned_by(b))
}

/// Binds a declared kernel to a Python callable `fn(tensors: dict, attrs: dict)` returning the
/// output tensor or a dict of outputs. An executor not `verified` on this machine (by
/// `layerzero.selftest()`) is refused by selection (`EXECUTOR_UNVERIFIED`) unless the policy
/// sets `allow_unverified`.
#[pyfunction]
#[pyo3(signature = (kernel, func, *, verified = true))]
pub fn register_executor(py: Python<'_>, kernel: String, func: Py<PyAny>, verified: bool) -> PyResult<()> {
    let executor = Arc::new(PyExecutor::new(kernel.clone(), func));
    py.detach(|| host::register(kernel, executor, verified)).map_err(|e| to_py(py, &e))
}

/// Records what Python found of an external backend: installed (its library's `version`
/// and where it was imported from), or not, with `error` (the import error). Kernels whose
/// `library_versions` exclude `version` are refused (`BACKEND_VERSION_UNSUPPORTED`); those of
/// a backend that is not installed, `BACKEND_NOT_INSTALLED` with the error.
#[pyfunction]
#[pyo3(signature = (backend, installed, *, version = None, path = None, error = None))]
pub fn set_backend(
    py: Python<'_>,
    backend: String,
    installed: bool,
    version: Option<String>,
    path: Option<String>,
    error: Option<String>,
) -> PyResult<()> {
    use layerzero::select::{BackendStatus, LoadedLibrary};
    let status = if installed {
        BackendStatus::Available
    } else {
        BackendStatus::NotInstalled(
            error.unwrap_or_else(|| format!("the Python library of {backend} is not installed")),
        )
    };
    let library = version.map(|version| LoadedLibrary { path: path.unwrap_or_default(), version, isa: None });
    py.detach(|| host::set_backend(backend, status, library)).map_err(|e| to_py(py, &e))
}
