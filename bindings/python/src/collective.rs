//! A process group from Python (`layerzero.distributed`): a `Collective` whose operations call
//! an object's methods (`rank`, `size`, `all_reduce_min_max`, `all_gather`, `broadcast`), which
//! the package implements with torch.distributed. `layerzero.distributed.agree` runs the
//! runtime's agreement over it.

use std::path::PathBuf;

use std::collections::BTreeMap;

use layerzero::distributed::{self, Collective, Facts};
use layerzero::error::{Error, ErrorKind, Result};
use layerzero::plan::workload::Workload;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::to_py;
use crate::handle::Handle;

struct PyGroup {
    obj: Py<PyAny>,
    rank: usize,
    size: usize,
}

/// A failed collective (a rank died, the group timed out) is an I/O error of the transport.
fn py_err(op: &str, e: &PyErr) -> Error {
    Error::new(ErrorKind::Io, format!("the process group's {op} failed (did a rank die or time out?): {e}"))
}

impl Collective for PyGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_min_max(&self, words: &[i64]) -> Result<(Vec<i64>, Vec<i64>)> {
        Python::attach(|py| {
            self.obj
                .bind(py)
                .call_method1("all_reduce_min_max", (words.to_vec(),))
                .and_then(|r| r.extract::<(Vec<i64>, Vec<i64>)>())
                .map_err(|e| py_err("all-reduce", &e))
        })
    }

    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        Python::attach(|py| {
            self.obj
                .bind(py)
                .call_method1("all_gather", (PyBytes::new(py, bytes),))
                .and_then(|r| r.extract::<Vec<Vec<u8>>>())
                .map_err(|e| py_err("all-gather", &e))
        })
    }

    fn broadcast(&self, bytes: &[u8], root: usize) -> Result<Vec<u8>> {
        Python::attach(|py| {
            self.obj
                .bind(py)
                .call_method1("broadcast", (PyBytes::new(py, bytes), root))
                .and_then(|r| r.extract::<Vec<u8>>())
                .map_err(|e| py_err("broadcast", &e))
        })
    }
}

/// Agrees this rank's handle (default: the process handle) with the other ranks of `group`;
/// with `workload`, on the kernel of every bucket too. Raises `PlanMismatchError` on every
/// rank when they differ.
#[pyfunction]
#[pyo3(signature = (group, handle = None, workload = None))]
pub fn agree(
    py: Python<'_>,
    group: Py<PyAny>,
    handle: Option<&Bound<'_, Handle>>,
    workload: Option<PathBuf>,
) -> PyResult<()> {
    let g = group_of(py, group)?;
    // A rank whose facts do not list (a bad workload) still takes part, so no rank waits on it.
    let facts = facts_of(py, handle, workload.as_deref())?;
    py.detach(|| distributed::agree_listed(facts, &g)).map_err(|e| to_py(py, &e))
}

/// Agreement by capability group: ranks grouped by hardware fingerprint, each group agreeing
/// internally; with `one_plan` (default: this handle's policy, `one_plan_across_ranks`) one
/// plan across every rank. Returns `(groups, differences)`.
#[pyfunction]
#[pyo3(signature = (group, handle = None, workload = None, one_plan = None))]
pub fn agree_by_capability(
    py: Python<'_>,
    group: Py<PyAny>,
    handle: Option<&Bound<'_, Handle>>,
    workload: Option<PathBuf>,
    one_plan: Option<bool>,
) -> PyResult<Report> {
    let g = group_of(py, group)?;
    let held = handle.map(|h| h.get().runtime()).transpose()?;
    let policy_wants = match &held {
        Some(r) => r.get().selector().policy().one_plan_across_ranks,
        None => crate::host::current().map_err(|e| to_py(py, &e))?.selector().policy().one_plan_across_ranks,
    };
    let facts = facts_of(py, handle, workload.as_deref())?;
    let one_plan = one_plan.unwrap_or(policy_wants);
    let report = py.detach(|| distributed::agree_by_capability_listed(facts, &g, one_plan));
    let report = report.map_err(|e| to_py(py, &e))?;
    Ok((report.groups, report.differences))
}

/// `(groups, differences)`: fingerprint -> ranks; fact -> fingerprint -> value.
type Report = (BTreeMap<String, Vec<usize>>, BTreeMap<String, BTreeMap<String, String>>);

fn group_of(py: Python<'_>, group: Py<PyAny>) -> PyResult<PyGroup> {
    let rank: usize = group.bind(py).call_method0("rank")?.extract()?;
    let size: usize = group.bind(py).call_method0("size")?.extract()?;
    Ok(PyGroup { obj: group, rank, size })
}

/// The facts of `handle` (default: the process handle), or why they could not be listed.
fn facts_of(
    py: Python<'_>,
    handle: Option<&Bound<'_, Handle>>,
    workload: Option<&std::path::Path>,
) -> PyResult<Result<Facts>> {
    let held = handle.map(|h| h.get().runtime()).transpose()?;
    let lz = match &held {
        Some(r) => r.get(),
        None => crate::host::current().map_err(|e| to_py(py, &e))?,
    };
    Ok(workload.map(Workload::load).transpose().and_then(|w| lz.agreement_facts(w.as_ref())))
}

/// What decides this rank's choices (the facts `agree` compares), by name: `catalog`,
/// `policy`, `table`, `hardware`, `library:<backend>`, and with `workload` `bucket:<entry>
/// <bucket>` naming the kernel.
#[pyfunction]
#[pyo3(signature = (handle = None, workload = None))]
pub fn agreement_facts(
    py: Python<'_>,
    handle: Option<&Bound<'_, Handle>>,
    workload: Option<PathBuf>,
) -> PyResult<std::collections::BTreeMap<String, String>> {
    let held = handle.map(|h| h.get().runtime()).transpose()?;
    let lz = match &held {
        Some(r) => r.get(),
        None => crate::host::current().map_err(|e| to_py(py, &e))?,
    };
    let w = workload.as_deref().map(Workload::load).transpose().map_err(|e| to_py(py, &e))?;
    Ok(lz.agreement_facts(w.as_ref()).map_err(|e| to_py(py, &e))?.items)
}
