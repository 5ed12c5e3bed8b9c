//! Tuning and solving from Python: `layerzero.tune` measures a workload's kernels on this
//! machine (the Python executors with LayerZero's own, by the protocol of `lz tune`) into the
//! PerfDB; `layerzero.solve` bakes a dispatch table from those measurements for the Python
//! host, whose executors serve its winners.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use layerzero::capabilities::catalog::Catalog;
use layerzero::error::{Error, Result};
use layerzero::model::device::DeviceRef;
use layerzero::perfdb::{self, PerfDb};
use layerzero::plan::solve::{Provenance, solve as solve_table};
use layerzero::plan::workload::Workload;
use layerzero::policy::Policy;
use layerzero::select::Selector;
use layerzero::tensor::HostTensor;
use layerzero::tune::{DeviceMemory, Host, TuneOptions};
use pyo3::prelude::*;

use crate::errors::guard;
use crate::handle::to_python;
use crate::host;
use crate::tensors::{lend, meta, to_torch};

/// The machine as the Python host sees it: its backends (Python's included) and executors,
/// a model-only selector under the default policy with the knobs' fields. With `hardware`
/// (a named profile or a profile file), the model ranks and the calibration is fitted
/// under that profile instead of the detected one (this machine's times held against a
/// profile's model), with this machine's backends and executors all the same.
fn tune_host(hardware: Option<&str>) -> Result<Host> {
    let lz = host::current()?;
    let selector = lz.selector();
    let mut policy = Policy::default();
    policy.apply_overrides(&layerzero::host::process().policy_overrides());
    let profile = match hardware {
        Some(name) => layerzero::hardware::named::load(name)?,
        None => selector.hardware().clone(),
    };
    let selector = Selector::new(
        Catalog::builtin()?,
        Arc::new(profile),
        Arc::new(policy),
        Arc::new(selector.availability().clone()),
    )?;
    let device: Arc<dyn DeviceMemory> = Arc::new(TorchDevice);
    Ok(Host { selector, registry: host::registry()?, device: Some(device), faults: Vec::new() })
}

/// GPU memory through torch: a tuning point on a GPU gets its inputs copied there, and each
/// timed call is waited for with `torch.cuda.synchronize`.
#[derive(Debug)]
struct TorchDevice;

impl DeviceMemory for TorchDevice {
    fn upload(&self, t: &HostTensor, device: DeviceRef) -> std::result::Result<HostTensor, String> {
        Python::attach(|py| -> PyResult<HostTensor> {
            let on_host = to_torch(py, t)?;
            let there = on_host.call_method1("to", (torch_device(device),))?;
            let m = meta("input", &there)?;
            lend("input", &there, &m, false, t.layout())
        })
        .map_err(|e| format!("copying an input to {device}: {e}"))
    }

    fn synchronize(&self, device: DeviceRef) -> std::result::Result<(), String> {
        Python::attach(|py| -> PyResult<()> {
            py.import("torch")?.getattr("cuda")?.call_method1("synchronize", (torch_device(device),))?;
            Ok(())
        })
        .map_err(|e| format!("waiting for {device}: {e}"))
    }
}

/// torch's name of a device (`cuda:0`; ROCm devices are `cuda` to torch too).
fn torch_device(d: DeviceRef) -> String {
    format!("cuda:{}", d.ordinal())
}

fn perfdb_or_default(perfdb: Option<PathBuf>) -> PathBuf {
    perfdb.unwrap_or_else(|| layerzero::host::process().perfdb_path())
}

/// Measures every eligible kernel with an executor at every bucket of `workload` into the
/// PerfDB (a GPU's kernels on inputs torch makes on the GPU, each call waited for); with
/// `verify`, re-times them and reports the regret of model-only and PerfDB-backed selection;
/// with `calibrate`, fits the cost model to the times and writes the calibration there.
/// Returns `lz tune --json`'s report.
#[pyfunction]
#[pyo3(signature = (workload, *, perfdb = None, budget = None, verify = true, refresh = false, calibrate = None, hardware = None))]
#[allow(clippy::too_many_arguments)]
pub fn tune(
    py: Python<'_>,
    workload: PathBuf,
    perfdb: Option<PathBuf>,
    budget: Option<f64>,
    verify: bool,
    refresh: bool,
    calibrate: Option<PathBuf>,
    hardware: Option<String>,
) -> PyResult<Bound<'_, PyAny>> {
    let report = py.detach(|| {
        guard_free(|| {
            let budget = budget
                .map(|b| {
                    if b.is_finite() && b > 0.0 {
                        Ok(Duration::from_secs_f64(b))
                    } else {
                        Err(Error::invalid(format!("argument `budget`: {b}: expected a positive number of seconds")))
                    }
                })
                .transpose()?;
            let loaded = Workload::load(&workload)?;
            let mut opts = TuneOptions::new(loaded, &workload.display().to_string(), perfdb_or_default(perfdb));
            opts.budget = budget;
            opts.verify = verify;
            opts.refresh = refresh;
            opts.calibrate = calibrate;
            let host = tune_host(hardware.as_deref())?;
            crate::fork::in_live_pool(|| layerzero::tune::tune_with(&host, &opts, &mut |_| {}))
                .map_err(Error::invalid)?
        })
    });
    let report = guard(py, || report)?;
    to_python(py, &report)
}

/// Solves `workload` into a dispatch table at `out` for the Python host, scoring with the
/// PerfDB's measurements for this machine (a plan `LayerZero.host().with_plan(out)` serves).
/// Returns the table's entry and unsolved counts.
#[pyfunction]
#[pyo3(signature = (workload, out, *, perfdb = None))]
pub fn solve(py: Python<'_>, workload: PathBuf, out: PathBuf, perfdb: Option<PathBuf>) -> PyResult<(usize, usize)> {
    let done = py.detach(|| {
        guard_free(|| {
            let loaded = Workload::load(&workload)?;
            let path = perfdb_or_default(perfdb);
            let base = host::build()?;
            let fingerprint = base.hardware().fingerprint.clone();
            let lz = base.with_perfdb(&path)?;
            let digest = match PerfDb::open_for_reading(&path)? {
                Ok(opened) => {
                    let rows = opened.db.rows_for(&fingerprint)?;
                    (!rows.is_empty()).then(|| perfdb::digest_rows(&rows))
                }
                Err(_) => None,
            };
            let provenance = Provenance {
                perfdb_digest: digest,
                created_at: layerzero::time::format_utc(layerzero::time::now_unix()),
                command: format!("layerzero.solve({})", workload.display()),
            };
            let table = solve_table(&loaded, &lz.selector(), provenance)?;
            layerzero::files::write(&out, table.to_json().as_bytes(), &[workload.as_path(), path.as_path()])?;
            Ok((table.entries.len(), table.unsolved.len()))
        })
    });
    guard(py, || done)
}

/// Runs `f`, turning a panic into an error (the caller holds no GIL).
fn guard_free<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Error::invalid(format!(
            "internal error (a bug in LayerZero; please report it): {}",
            layerzero::exec::executor::panic_text(p.as_ref())
        )))
    })
}

/// The workload one rank serves of the Hugging Face model folder `model`, split for `tp`
/// tensor-parallel ranks (heads, KV heads and MLP width per rank), as `lz workload --model DIR
/// --tp N` writes it; written to `out` when given. Returns the workload's JSON.
#[pyfunction]
#[pyo3(signature = (model, out = None, *, tp = 1, dtype = None, max_batch = 8, max_seq = None, page_size = 16))]
#[allow(clippy::too_many_arguments)]
pub fn workload(
    py: Python<'_>,
    model: PathBuf,
    out: Option<PathBuf>,
    tp: usize,
    dtype: Option<String>,
    max_batch: usize,
    max_seq: Option<usize>,
    page_size: usize,
) -> PyResult<String> {
    let done = py.detach(|| {
        guard_free(|| {
            let dtype = match dtype.as_deref() {
                None => None,
                Some(name) => {
                    Some(layerzero::model::dtype::DType::ALL.into_iter().find(|d| d.as_str() == name).ok_or_else(
                        || Error::invalid(format!("dtype {name:?} is not a LayerZero dtype (f32, bf16, ...)")),
                    )?)
                }
            };
            let lz = host::current()?;
            let w = layerzero_llm::workload::for_folder(lz, &model, tp, dtype, max_batch, max_seq, page_size)?;
            let json = serde_json::to_string_pretty(&w)
                .map_err(|e| Error::invalid(format!("cannot write the workload: {e}")))?;
            if let Some(file) = &out {
                layerzero::files::write(file, (json.clone() + "\n").as_bytes(), &[])?;
            }
            Ok(json)
        })
    });
    guard(py, || done)
}
