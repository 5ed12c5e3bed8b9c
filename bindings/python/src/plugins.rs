//! Python plugins (`layerzero.plugins`): the checks before a `layerzero.backends` entry point
//! is imported, its backend added in its namespace once it is, and pinning one in the lockfile.

use std::path::PathBuf;

use layerzero::knobs::Settings;
use layerzero::plugins::{Loading, Lockfile};
use pyo3::prelude::*;

use crate::errors::guard;

fn lock_path(lock: Option<PathBuf>) -> layerzero::Result<PathBuf> {
    Ok(lock.unwrap_or(Settings::from_env()?.lock_path()))
}

fn checked(name: &str, version: &str, record: &std::path::Path) -> layerzero::Result<layerzero::plugins::LockEntry> {
    let settings = Settings::from_env()?;
    let path = settings.lock_path();
    let lock = if path.exists() { Lockfile::read(&path)? } else { Lockfile::default() };
    layerzero::plugins::check_python(&lock, &path, name, version, Some(record), &Loading::from_settings(&settings)?)
}

/// Refuses, before it is imported, the Python plugin `name` at `version` whose distribution
/// `RECORD` is at `record`: not locked (`PLUGIN_NOT_LOCKED`), not allowed (`PLUGIN_NOT_ALLOWED`),
/// or changed since it was locked (`PLUGIN_HASH_MISMATCH`).
#[pyfunction]
pub fn plugin_check(py: Python<'_>, name: String, version: String, record: PathBuf) -> PyResult<()> {
    guard(py, || checked(&name, &version, &record).map(|_| ()))
}

/// Adds the imported Python plugin's backend from the `capabilities` (JSON) it returned, once
/// they are the locked ones; returns `[(declared id, namespaced id)]` of its kernels.
#[pyfunction]
pub fn plugin_add(
    py: Python<'_>,
    name: String,
    version: String,
    record: PathBuf,
    capabilities: String,
) -> PyResult<Vec<(String, String)>> {
    guard(py, || {
        let entry = checked(&name, &version, &record)?;
        let backend = layerzero::plugins::python_backend(&entry, &capabilities, &record)?;
        let ids = backend
            .kernels
            .iter()
            .map(|k| (format!("{name}{}", &k.id[entry.namespace().len()..]), k.id.clone()))
            .collect();
        crate::host::add_plugin(backend)?;
        Ok(ids)
    })
}

/// Pins the Python plugin `name` (distribution `source`, `RECORD` at `record`) with the
/// `capabilities` it returned, in `lock` (default: `LAYERZERO_LOCK`, else `./layerzero.lock`);
/// returns the lockfile's path and the plugin's `NAME@VERSION`.
#[pyfunction]
#[pyo3(signature = (name, source, record, capabilities, lock = None))]
pub fn plugin_lock(
    py: Python<'_>,
    name: String,
    source: String,
    record: PathBuf,
    capabilities: String,
    lock: Option<PathBuf>,
) -> PyResult<(PathBuf, String)> {
    guard(py, || {
        let path = lock_path(lock)?;
        let entry = layerzero::plugins::lock_python(&path, &name, &source, &record, &capabilities)?;
        Ok((path, entry.namespace()))
    })
}
