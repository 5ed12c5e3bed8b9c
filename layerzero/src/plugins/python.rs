//! Python plugins: a package declaring an entry point in the `layerzero.backends` group,
//! which returns its capabilities and its executors. The Python package finds and imports it;
//! this side decides, before anything of it is imported, whether it may be (locked, allowed,
//! its distribution's `RECORD` unchanged: `RECORD` lists a sha256 of every installed file,
//! which the Python side checks against the files), and turns its capabilities into a backend
//! in its namespace (`NAME@VERSION`).

use std::path::Path;

use super::{Loading, LockEntry, Lockfile, PluginKind};
use crate::backend::plugin::{declared_backend, plugin_error};
use crate::capabilities::spec::BackendSpec;
use crate::error::{ErrorKind, Result};
use crate::reason::ReasonCode;

fn blake3_file(path: &Path) -> Result<String> {
    let bytes = crate::files::read(path)?;
    Ok(blake3::hash(&bytes).to_hex().to_string())
}

/// May the Python plugin `name` at `version`, installed with the distribution `RECORD` at
/// `record` (absent: the locked one), be imported? It must be locked in `lock` (read from
/// `lock_path`; `PLUGIN_NOT_LOCKED`), allowed (`PLUGIN_NOT_ALLOWED`), and its `RECORD` the
/// one locked (`PLUGIN_HASH_MISMATCH`). Returns its entry.
pub fn check_python(
    lock: &Lockfile,
    lock_path: &Path,
    name: &str,
    version: &str,
    record: Option<&Path>,
    loading: &Loading,
) -> Result<LockEntry> {
    let base = lock_path.parent().unwrap_or(Path::new("."));
    let namespace = format!("{name}@{version}");
    let entry = lock.plugins.iter().find(|e| e.kind == PluginKind::Python && e.name == name && e.version == version);
    let Some(entry) = entry else {
        let at = record.map_or_else(|| lock_path.to_path_buf(), Path::to_path_buf);
        return Err(plugin_error(
            ReasonCode::PLUGIN_NOT_LOCKED,
            ErrorKind::InvalidInput,
            &at,
            format!(
                "the Python plugin {namespace} is installed but {} does not pin it, so it is not imported; \
                 pin it with `python -m layerzero.plugins lock {name}`",
                lock_path.display()
            ),
        ));
    };
    let record = record.map_or_else(|| entry.resolve(base), Path::to_path_buf);
    loading.check_allowed(&namespace, &record)?;
    if loading.isolated(name, version).is_some() {
        return Err(plugin_error(
            ReasonCode::PLUGIN_WORKER_FAILED,
            ErrorKind::InvalidInput,
            &record,
            format!(
                "the policy isolates {namespace}, but only C-ABI plugins run in a worker process; a Python plugin \
                 would run in this one, so it is not imported"
            ),
        ));
    }
    let hash = blake3_file(&record)?;
    if hash != entry.library_blake3 {
        return Err(plugin_error(
            ReasonCode::PLUGIN_HASH_MISMATCH,
            ErrorKind::InvalidInput,
            &record,
            format!(
                "the installed distribution's RECORD has blake3 {}, not the locked {}: the package changed after it \
                 was locked, so it is not imported",
                &hash[..16],
                entry.library_blake3.get(..16).unwrap_or(&entry.library_blake3)
            ),
        ));
    }
    Ok(entry.clone())
}

/// The backend the Python plugin of `entry` declares with `capabilities` (JSON), if they are
/// the ones locked (`PLUGIN_HASH_MISMATCH`), valid (`PLUGIN_CAPABILITIES_INVALID`) and of its
/// locked name and version.
pub fn python_backend(entry: &LockEntry, capabilities: &str, origin: &Path) -> Result<BackendSpec> {
    let hash = blake3::hash(capabilities.as_bytes()).to_hex().to_string();
    if hash != entry.capabilities_blake3 {
        return Err(plugin_error(
            ReasonCode::PLUGIN_HASH_MISMATCH,
            ErrorKind::InvalidInput,
            origin,
            format!("its capabilities hash {} is not the locked {}", &hash[..16], entry.capabilities_blake3),
        ));
    }
    let backend = declared_backend(capabilities, origin)?;
    if backend.backend != entry.namespace() {
        return Err(plugin_error(
            ReasonCode::PLUGIN_CAPABILITIES_INVALID,
            ErrorKind::InvalidInput,
            origin,
            format!("its capabilities declare {}, but it is locked as {}", backend.backend, entry.namespace()),
        ));
    }
    Ok(backend)
}

/// Pins the Python plugin `name` (distribution `source`, its `RECORD` at `record`) with the
/// `capabilities` it returned, in the lockfile at `lock_path` (created when absent). The
/// capabilities must be valid and declare backend `name`; the version is theirs.
pub fn lock_python(lock_path: &Path, name: &str, source: &str, record: &Path, capabilities: &str) -> Result<LockEntry> {
    let backend = declared_backend(capabilities, record)?;
    let declared = backend.backend.split('@').next().unwrap_or_default();
    if declared != name {
        return Err(plugin_error(
            ReasonCode::PLUGIN_CAPABILITIES_INVALID,
            ErrorKind::InvalidInput,
            record,
            format!(
                "entry point {name:?} declares backend {declared:?}; a plugin's entry point is named as its backend"
            ),
        ));
    }
    let mut lock = if lock_path.exists() { Lockfile::read(lock_path)? } else { Lockfile::default() };
    let mut entry = LockEntry {
        name: name.to_owned(),
        version: backend.version.clone(),
        source: source.to_owned(),
        path: std::path::absolute(record).unwrap_or_else(|_| record.to_path_buf()),
        library_blake3: blake3_file(record)?,
        capabilities_blake3: blake3::hash(capabilities.as_bytes()).to_hex().to_string(),
        variant: None,
        kind: PluginKind::Python,
        download_blake3: None,
    };
    // A re-lock keeps where the package came from (a hub's variant and download).
    if let Some(old) = lock.plugins.iter().find(|e| e.namespace() == entry.namespace() && e.kind == PluginKind::Python)
    {
        entry.variant.clone_from(&old.variant);
        entry.download_blake3.clone_from(&old.download_blake3);
    }
    lock.upsert(entry.clone());
    lock.write(lock_path)?;
    Ok(entry)
}
