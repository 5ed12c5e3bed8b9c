//! `layerzero.LayerZero`: a handle of the runtime in Python, and the functions on the
//! process-wide one (`lz.select`, `lz.explain`, ...). A handle is shared by every thread that
//! holds it; its builders (`with_policy`, `with_plan`, `with_perfdb`) consume it and return the
//! new handle, as Rust's do.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use layerzero::capabilities::catalog::Catalog;
use layerzero::knobs::process_env;
use layerzero::plan::PlanMode;
use layerzero::policy::Policy;
use layerzero::readiness::{self, ReadinessInputs};
use layerzero::runtime::LayerZero;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::Serialize;

use crate::errors::{LayerZeroError, guard, invalid};
use crate::report::{Report, Selection};
use crate::request::describe;
use layerzero::model::request::Request;

/// The runtime a handle holds: the process-wide one, or one of its own.
#[derive(Clone)]
pub(crate) enum Runtime {
    Process(&'static LayerZero),
    Own(Arc<LayerZero>),
}

impl Runtime {
    pub(crate) fn get(&self) -> &LayerZero {
        match self {
            Runtime::Process(lz) => lz,
            Runtime::Own(lz) => lz,
        }
    }
}

/// LayerZero: selection and explanation on one machine under one policy.
#[pyclass(name = "LayerZero", module = "layerzero", frozen)]
pub struct Handle {
    /// `None` once a builder consumed the handle.
    runtime: Mutex<Option<Runtime>>,
}

impl Handle {
    fn of(lz: LayerZero) -> Handle {
        Handle { runtime: Mutex::new(Some(Runtime::Own(Arc::new(lz)))) }
    }

    /// The runtime, for one call.
    pub(crate) fn runtime(&self) -> PyResult<Runtime> {
        let held = self.runtime.lock().map_err(|_| LayerZeroError::new_err("the handle's lock was poisoned"))?;
        held.clone().ok_or_else(|| LayerZeroError::new_err("this handle was consumed by a builder (with_policy, ...)"))
    }

    /// Takes the runtime out to build another from it.
    fn take(&self) -> PyResult<LayerZero> {
        let mut held = self.runtime.lock().map_err(|_| LayerZeroError::new_err("the handle's lock was poisoned"))?;
        match held.take() {
            Some(Runtime::Own(lz)) => Arc::try_unwrap(lz).map_err(|lz| {
                *held = Some(Runtime::Own(lz));
                LayerZeroError::new_err("the handle is in use on another thread; build before sharing it")
            }),
            Some(p @ Runtime::Process(_)) => {
                *held = Some(p);
                Err(LayerZeroError::new_err(
                    "the process-wide handle cannot be rebuilt; start from LayerZero.host() for one of your own",
                ))
            }
            None => Err(LayerZeroError::new_err("this handle was consumed by a builder (with_policy, ...)")),
        }
    }

    /// A new handle of what `build` makes of this one's runtime.
    fn rebuild(
        &self,
        py: Python<'_>,
        build: impl FnOnce(LayerZero) -> layerzero::Result<LayerZero>,
    ) -> PyResult<Handle> {
        let lz = self.take()?;
        guard(py, || build(lz)).map(Handle::of)
    }
}

#[pymethods]
impl Handle {
    /// This machine, configured by the `LAYERZERO_*` variables of the environment.
    #[staticmethod]
    fn host(py: Python<'_>) -> PyResult<Handle> {
        // The Python backends register themselves on first use of the package.
        py.import("layerzero")?.call_method0("_ready")?;
        guard(py, crate::host::build).map(Handle::of)
    }

    /// This machine with the default policy and no variables read.
    #[staticmethod]
    fn detected(py: Python<'_>) -> PyResult<Handle> {
        guard(py, LayerZero::detected).map(Handle::of)
    }

    /// Plans for a named hardware profile (`h100`, `spr`, ...) or a profile file: every
    /// backend counts as installed.
    #[staticmethod]
    fn planning(py: Python<'_>, hardware: &str) -> PyResult<Handle> {
        guard(py, || LayerZero::planning(hardware)).map(Handle::of)
    }

    /// This handle under the policy file at `path`.
    fn with_policy(&self, py: Python<'_>, path: PathBuf) -> PyResult<Handle> {
        self.rebuild(py, |lz| lz.with_policy(Policy::load(&path)?))
    }

    /// This handle serving the dispatch table at `path` (`mode`: `off`, `prefer`, `strict`).
    #[pyo3(signature = (path, mode = "prefer"))]
    fn with_plan(&self, py: Python<'_>, path: PathBuf, mode: &str) -> PyResult<Handle> {
        let mode = match mode {
            "off" => PlanMode::Off,
            "prefer" => PlanMode::Prefer,
            "strict" => PlanMode::Strict,
            other => return Err(invalid(format!("argument `mode`: {other:?}: expected off, prefer or strict"))),
        };
        self.rebuild(py, |lz| lz.with_plan_file(&path, mode))
    }

    /// This handle with faults injected for drills (`LAYERZERO_FAULTS`' form:
    /// `KERNEL_OR_BACKEND=MODE[,...]`, modes error, panic, hang, slow:MS, nan, oom,
    /// device_lost, fail_first:N).
    fn with_faults(&self, py: Python<'_>, spec: &str) -> PyResult<Handle> {
        self.rebuild(py, |lz| lz.with_faults(spec))
    }

    /// This handle scoring with the measured times of the PerfDB at `path`.
    fn with_perfdb(&self, py: Python<'_>, path: PathBuf) -> PyResult<Handle> {
        self.rebuild(py, |lz| lz.with_perfdb(&path))
    }

    /// The kernel `op` gets for these tensors and attributes.
    #[pyo3(signature = (op, **kwargs))]
    fn select(&self, py: Python<'_>, op: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Selection> {
        select_on(py, self.runtime()?.get(), op, kwargs)
    }

    /// Every candidate's verdict for `op` on these tensors and attributes.
    #[pyo3(signature = (op, **kwargs))]
    fn explain(&self, py: Python<'_>, op: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Report> {
        explain_on(py, self.runtime()?.get(), op, kwargs)
    }

    /// The id of the kernel `op` gets.
    #[pyo3(signature = (op, **kwargs))]
    fn which(&self, py: Python<'_>, op: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
        Ok(select_on(py, self.runtime()?.get(), op, kwargs)?.kernel().to_owned())
    }

    /// Plan and cache hits and misses, live selections, fallbacks.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.runtime()?.get().counters())
    }

    /// The hardware profile's name (`host` on this machine).
    #[getter]
    fn hardware(&self) -> PyResult<String> {
        Ok(self.runtime()?.get().hardware().name.clone())
    }

    /// Whether this handle is ready to serve: its plan, executors, the PerfDB; each failed
    /// check names its fix.
    fn readiness<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let checks = self.runtime()?.get().readiness(None, None);
        to_python(py, &checks)
    }

    fn __repr__(&self) -> String {
        match self.runtime() {
            Ok(r) => format!("LayerZero({:?})", r.get().hardware().name),
            Err(_) => "LayerZero(consumed)".to_owned(),
        }
    }
}

fn select_on(py: Python<'_>, lz: &LayerZero, op: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Selection> {
    let req = describe_on(lz, op, kwargs)?;
    guard(py, || lz.select(&req).map(|hit| Selection::new(&hit, hit.source().as_str())))
}

fn explain_on(py: Python<'_>, lz: &LayerZero, op: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Report> {
    let req = describe_on(lz, op, kwargs)?;
    guard(py, || Ok(Report::from(lz.explain(&req))))
}

/// The request of `kwargs` as `lz` judges it: on a handle of this machine (`host`), CPU
/// tensors are host memory, the CPU's even where a GPU is the primary device; a planning
/// handle (a named profile) reads a tensor without a device as on its primary device.
fn describe_on(lz: &LayerZero, op: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Request> {
    let mut req = describe(op, kwargs)?;
    if lz.hardware().name == "host" {
        lz.pin_host_memory(&mut req);
    }
    Ok(req)
}

/// A serializable value as the Python object `json.loads` makes of it.
pub(crate) fn to_python<'py>(py: Python<'py>, value: &impl Serialize) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| invalid(e.to_string()))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// The process-wide handle (`LayerZero.host()`, made on first use and shared).
#[pyfunction]
pub fn host(py: Python<'_>) -> PyResult<Handle> {
    let lz = guard(py, crate::host::current)?;
    Ok(Handle { runtime: Mutex::new(Some(Runtime::Process(lz))) })
}

/// The kernel `op` gets on this machine.
#[pyfunction]
#[pyo3(signature = (op, **kwargs))]
pub fn select(py: Python<'_>, op: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Selection> {
    select_on(py, guard(py, crate::host::current)?, op, kwargs)
}

/// Every candidate's verdict for `op` on this machine.
#[pyfunction]
#[pyo3(signature = (op, **kwargs))]
pub fn explain(py: Python<'_>, op: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Report> {
    explain_on(py, guard(py, crate::host::current)?, op, kwargs)
}

/// The id of the kernel `op` gets on this machine.
#[pyfunction]
#[pyo3(signature = (op, **kwargs))]
pub fn which(py: Python<'_>, op: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
    Ok(select(py, op, kwargs)?.kernel().to_owned())
}

/// The process-wide handle's counters.
#[pyfunction]
pub fn counters(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    to_python(py, &guard(py, crate::host::current)?.counters())
}

/// This machine examined, as `lz doctor --json` reports it: hardware, backends, shipped
/// files, a sample selection, the PerfDB, the knobs and the policy.
#[pyfunction]
pub fn doctor(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let report = guard(py, || {
        let inputs = readiness::doctor::DoctorInputs { catalog: Catalog::builtin()?, perfdb: None, env: &process_env };
        readiness::doctor::doctor(&inputs)
    })?;
    to_python(py, &report.to_json())
}

/// The checks of `lz readiness-check`: the capabilities, shipped files, policy, the dispatch
/// table (and its coverage of a workload) and the PerfDB; each failed check names its fix.
#[pyfunction]
#[pyo3(signature = (*, table = None, policy = None, workload = None, perfdb = None, require_warm = false))]
pub fn readiness_check(
    py: Python<'_>,
    table: Option<PathBuf>,
    policy: Option<PathBuf>,
    workload: Option<PathBuf>,
    perfdb: Option<PathBuf>,
    require_warm: bool,
) -> PyResult<Bound<'_, PyAny>> {
    let checks = guard(py, || {
        let mut inputs = ReadinessInputs::new(Catalog::builtin());
        inputs.table = table.as_deref();
        inputs.policy = policy.as_deref();
        inputs.workload = workload.as_deref();
        inputs.perfdb = perfdb.as_deref();
        inputs.require_warm = require_warm;
        Ok(readiness::readiness(&inputs))
    })?;
    to_python(py, &checks)
}

/// A handle under `handle`'s policy (default: the process handle's) with graph-strict mode
/// on: only kernels safe to capture into a CUDA graph are selected, and an op with none fails
/// naming the op (`layerzero.graph_safe()`).
#[pyfunction]
#[pyo3(signature = (handle = None))]
pub fn graph_strict(py: Python<'_>, handle: Option<&Bound<'_, Handle>>) -> PyResult<Handle> {
    let held = handle.map(|h| h.get().runtime()).transpose()?;
    let base: &LayerZero = match &held {
        Some(r) => r.get(),
        None => guard(py, crate::host::current)?,
    };
    let mut policy = (*base.declared_policy()).clone();
    policy.graph_strict_mode = true;
    // A planning handle stays one (for the same profile); a host handle is rebuilt with the
    // executors Python registered.
    let planning = base.selector().availability().is_planning().then(|| base.hardware().name.clone());
    guard(py, || {
        let fresh = match &planning {
            Some(profile) => LayerZero::planning(profile)?,
            None => crate::host::build()?,
        };
        fresh.with_policy(policy)
    })
    .map(Handle::of)
}
