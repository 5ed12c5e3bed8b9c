//! A process group from Python (`layerzero.distributed`): a `Collective` whose operations call
//! an object's methods (`rank`, `size`, `all_reduce_min_max`, `all_gather`, `broadcast`), which
//! the package implements with torch.distributed. `layerzero.distributed.agree` runs the
//! runtime's agreement over it.

use std::path::PathBuf;

use layerzero::distributed::{self, Collective};
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
    let rank: usize = group.bind(py).call_method0("rank")?.extract()?;
    let size: usize = group.bind(py).call_method0("size")?.extract()?;
    let held = handle.map(|h| h.get().runtime()).transpose()?;
    let facts = {
        let lz = match &held {
            Some(r) => r.get(),
            None => crate::host::current().map_err(|e| to_py(py, &e))?,
        };
        let w = workload.as_deref().map(Workload::load).transpose().map_err(|e| to_py(py, &e))?;
        lz.agreement_facts(w.as_ref()).map_err(|e| to_py(py, &e))?
    };
    let g = PyGroup { obj: group, rank, size };
    py.detach(|| distributed::agree(&facts, &g)).map_err(|e| to_py(py, &e))
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
