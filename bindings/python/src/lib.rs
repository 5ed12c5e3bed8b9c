//! The `layerzero` Python package's extension module (`layerzero._lz`): the runtime's front
//! door over torch tensors. torch is never linked or imported here: tensors are read through
//! their attributes.

mod collective;
mod errors;
mod fork;
mod handle;
mod host;
mod ops;
mod plugins;
mod pyexec;
mod reason;
mod report;
mod request;
mod tensors;
mod tune;

use pyo3::prelude::*;

/// The version of the LayerZero runtime this extension is built from.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Where LayerZero keeps run-time state: `LAYERZERO_HOME`, else the user cache folder (the
/// PerfDB, the calibration, the Python executors' self-test record).
#[pyfunction]
fn home() -> std::path::PathBuf {
    layerzero::host::process().home()
}

/// Every reason code as (name, category), in declaration order: what `layerzero.ReasonCode`
/// is made of.
#[pyfunction]
fn reason_codes() -> Vec<(&'static str, &'static str)> {
    layerzero::ReasonCode::ALL.iter().map(|c| (c.as_str(), c.category().as_str())).collect()
}

/// The process's telemetry (`LAYERZERO_LOG`, `LAYERZERO_OTEL`), installed at import and
/// flushed at exit (`atexit` calls `_flush_telemetry`).
static TELEMETRY: std::sync::Mutex<Option<layerzero::telemetry::Telemetry>> = std::sync::Mutex::new(None);

/// Flushes and shuts the span export down (the package registers it with `atexit`).
#[pyfunction]
fn _flush_telemetry() {
    if let Ok(mut t) = TELEMETRY.lock() {
        t.take();
    }
}

/// Installs the telemetry the knobs ask for; a failure (a bad `LAYERZERO_LOG`) is a warning
/// at import, not an import error.
fn init_telemetry(py: Python<'_>) -> PyResult<()> {
    let settings = layerzero::host::process();
    if settings.log.is_none() && settings.otel.is_none() {
        return Ok(());
    }
    match layerzero::telemetry::init(settings) {
        Ok(t) => {
            if let Ok(mut slot) = TELEMETRY.lock() {
                *slot = Some(t);
            }
            Ok(())
        }
        Err(e) => {
            let warnings = py.import("warnings")?;
            warnings.call_method1("warn", (format!("layerzero: telemetry is off: {e}"),))?;
            Ok(())
        }
    }
}

#[pymodule]
fn _lz(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_telemetry(m.py())?;
    m.add_function(wrap_pyfunction!(_flush_telemetry, m)?)?;
    errors::register(m)?;
    m.add_class::<handle::Handle>()?;
    m.add_class::<report::Selection>()?;
    m.add_class::<report::Report>()?;
    m.add_class::<report::Candidate>()?;
    m.add_class::<reason::Reason>()?;
    m.add_class::<ops::Call>()?;
    m.add_function(wrap_pyfunction!(ops::dispatch, m)?)?;
    m.add_function(wrap_pyfunction!(ops::run_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(ops::register_executor, m)?)?;
    m.add_function(wrap_pyfunction!(ops::set_backend, m)?)?;
    m.add_function(wrap_pyfunction!(handle::graph_strict, m)?)?;
    m.add_function(wrap_pyfunction!(fork::_after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(tune::tune, m)?)?;
    m.add_function(wrap_pyfunction!(tune::solve, m)?)?;
    m.add_function(wrap_pyfunction!(tune::workload, m)?)?;
    m.add_function(wrap_pyfunction!(collective::agree_by_capability, m)?)?;
    m.add_function(wrap_pyfunction!(home, m)?)?;
    m.add_function(wrap_pyfunction!(collective::agree, m)?)?;
    m.add_function(wrap_pyfunction!(collective::agreement_facts, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(reason_codes, m)?)?;
    m.add_function(wrap_pyfunction!(handle::host, m)?)?;
    m.add_function(wrap_pyfunction!(handle::select, m)?)?;
    m.add_function(wrap_pyfunction!(handle::explain, m)?)?;
    m.add_function(wrap_pyfunction!(handle::which, m)?)?;
    m.add_function(wrap_pyfunction!(handle::counters, m)?)?;
    m.add_function(wrap_pyfunction!(handle::doctor, m)?)?;
    m.add_function(wrap_pyfunction!(handle::readiness_check, m)?)?;
    m.add_function(wrap_pyfunction!(plugins::plugin_check, m)?)?;
    m.add_function(wrap_pyfunction!(plugins::plugin_add, m)?)?;
    m.add_function(wrap_pyfunction!(plugins::plugin_lock, m)?)?;
    Ok(())
}
