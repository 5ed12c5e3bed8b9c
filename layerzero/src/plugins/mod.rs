//! Plugins through a lockfile: `layerzero.lock` lists each plugin LayerZero may load (name,
//! version, source, the file, blake3 of the library and of its capabilities). Loading checks
//! the file's hash *before* the library is opened (a tampered file never runs its
//! initialisers), then the capabilities it returns; anything that does not match is refused
//! with a reason code. `lz lock --plugin PATH` writes an entry, `lz plugin list` shows them,
//! `lz plugin verify` checks every entry against the files.

mod http;
pub mod hub;
mod lock;

pub use lock::{LOCK_SCHEMA_VERSION, LockEntry, Lockfile};

use std::path::Path;
use std::sync::Arc;

use crate::backend::plugin::{Plugin, plugin_error};
use crate::error::{ErrorKind, Result};
use crate::reason::ReasonCode;

/// Opens `entry`'s plugin if its file is still the one locked: the library's hash is checked
/// before it is loaded, the capabilities' hash and the name and version after.
pub fn open_locked(entry: &LockEntry, base: &Path) -> Result<Plugin> {
    let path = entry.resolve(base);
    let plugin = Plugin::open_expecting(&path, Some(&entry.library_blake3))?;
    let mismatch = |what: String| {
        plugin_error(
            ReasonCode::PLUGIN_HASH_MISMATCH,
            ErrorKind::InvalidInput,
            &path,
            format!("{what}; re-lock it (`lz lock --plugin {}`) if the change is yours", path.display()),
        )
    };
    if plugin.capabilities_hash != entry.capabilities_blake3 {
        return Err(mismatch(format!(
            "its capabilities hash {} is not the locked {}",
            short(&plugin.capabilities_hash),
            short(&entry.capabilities_blake3)
        )));
    }
    if plugin.name != entry.name || plugin.version != entry.version {
        return Err(mismatch(format!("it is {} now, locked as {}@{}", plugin.namespace(), entry.name, entry.version)));
    }
    Ok(plugin)
}

/// Every plugin of `lock` (read from `path`) that `allow` (the policy's `allow_plugins`
/// globs; `None`: all) names, each checked; one it does not name is refused before it is
/// opened (`PLUGIN_NOT_ALLOWED`). The first refusal is the error.
pub fn open_all(lock: &Lockfile, path: &Path, allow: Option<&[String]>) -> Result<Vec<Arc<Plugin>>> {
    let base = path.parent().unwrap_or(Path::new("."));
    lock.plugins
        .iter()
        .map(|e| {
            if let Some(globs) = allow
                && !globs.iter().any(|g| crate::policy::glob::glob_match(g, &e.namespace()))
            {
                return Err(plugin_error(
                    ReasonCode::PLUGIN_NOT_ALLOWED,
                    ErrorKind::InvalidInput,
                    &e.resolve(base),
                    format!("{} is locked, but the policy's allow_plugins {globs:?} does not name it", e.namespace()),
                ));
            }
            open_locked(e, base).map(Arc::new)
        })
        .collect()
}

fn short(hash: &str) -> &str {
    hash.get(..16).unwrap_or(hash)
}

/// A locked plugin's state, as doctor and readiness show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PluginState {
    /// `NAME@VERSION`.
    pub namespace: String,
    /// Its library file.
    pub path: std::path::PathBuf,
    /// Why it would be refused (with its reason code); `None`: it loads.
    pub error: Option<String>,
}

/// The state of every plugin the lockfile at `path` pins (empty when there is none), under the
/// policy's `allow` globs. Each is checked as loading checks it (hash before it is opened).
pub fn states(path: &Path, allow: Option<&[String]>) -> Result<Vec<PluginState>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let lock = Lockfile::read(path)?;
    let base = path.parent().unwrap_or(Path::new("."));
    Ok(lock
        .plugins
        .iter()
        .map(|e| {
            let single = Lockfile { schema_version: lock.schema_version, plugins: vec![e.clone()] };
            PluginState {
                namespace: e.namespace(),
                path: e.resolve(base),
                error: open_all(&single, path, allow).err().map(|err| err.to_string()),
            }
        })
        .collect())
}
