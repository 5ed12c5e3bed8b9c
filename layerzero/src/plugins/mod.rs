//! Plugins through a lockfile: `layerzero.lock` lists each plugin LayerZero may load (name,
//! version, source, the file, blake3 of the library and of its capabilities). Loading checks
//! the file's hash *before* the library is opened (a tampered file never runs its
//! initialisers), then the capabilities it returns; anything that does not match is refused
//! with a reason code. `lz lock --plugin PATH` writes an entry, `lz plugin list` shows them,
//! `lz plugin verify` checks every entry against the files.

mod http;
pub mod hub;
mod lock;

mod python;

pub use lock::{LOCK_SCHEMA_VERSION, LockEntry, Lockfile, PluginKind};
pub use python::{check_python, lock_python, python_backend};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::plugin::worker::WorkerOptions;
use crate::backend::plugin::{Plugin, plugin_error};
use crate::error::{ErrorKind, Result};
use crate::knobs::Settings;
use crate::policy::{Isolation, Policy};
use crate::reason::ReasonCode;

/// How locked plugins load: which the policy allows (`allow_plugins`), which run in a worker
/// process (`isolation`, `LAYERZERO_ISOLATE`), and the worker they run in.
#[derive(Debug, Clone)]
pub struct Loading {
    policy: Policy,
    worker: WorkerOptions,
}

/// A call of an isolated kernel may take this long when the policy sets no `kernel_timeout_ms`.
pub const ISOLATED_DEADLINE: Duration = Duration::from_secs(30);

impl Loading {
    /// Loading under `policy` (its knob overrides applied), the worker program as `settings`
    /// name it (`LAYERZERO_PLUGIN_WORKER`, else [`worker_program`]); a call of an isolated
    /// kernel may take the policy's `kernel_timeout_ms`, else [`ISOLATED_DEADLINE`].
    pub fn new(policy: &Policy, settings: &Settings) -> Loading {
        let deadline = policy.kernel_timeout_ms.map_or(ISOLATED_DEADLINE, Duration::from_millis);
        let program = settings.plugin_worker.clone().unwrap_or_else(worker_program);
        Loading { policy: policy.clone(), worker: WorkerOptions { program, deadline } }
    }

    /// Loading as the host started with `settings` loads: its policy file (`LAYERZERO_POLICY`)
    /// with the knobs' overrides.
    pub fn from_settings(settings: &Settings) -> Result<Loading> {
        let mut policy = match &settings.policy {
            Some(path) => Policy::load(path)?,
            None => Policy::default(),
        };
        policy.apply_overrides(&settings.policy_overrides());
        Ok(Loading::new(&policy, settings))
    }

    /// The worker options of the plugin `name@version` when it runs isolated.
    pub fn isolated(&self, name: &str, version: &str) -> Option<&WorkerOptions> {
        (self.policy.isolation_of(name, version) == Isolation::Subprocess).then_some(&self.worker)
    }

    fn allow(&self) -> Option<&[String]> {
        self.policy.allow_plugins.as_deref()
    }

    /// Refuses (`PLUGIN_NOT_ALLOWED`) the plugin `namespace` at `path` when the policy's
    /// `allow_plugins` globs do not name it.
    pub fn check_allowed(&self, namespace: &str, path: &Path) -> Result<()> {
        match self.allow() {
            Some(globs) if !globs.iter().any(|g| crate::policy::glob::glob_match(g, namespace)) => Err(plugin_error(
                ReasonCode::PLUGIN_NOT_ALLOWED,
                ErrorKind::InvalidInput,
                path,
                format!("{namespace} is locked, but the policy's allow_plugins {globs:?} does not name it"),
            )),
            _ => Ok(()),
        }
    }
}

/// `layerzero-plugin-worker` beside this program (or one folder up, where cargo puts a test
/// binary's), else the name alone (found on `PATH` when it is started).
pub fn worker_program() -> PathBuf {
    let name = format!("layerzero-plugin-worker{}", std::env::consts::EXE_SUFFIX);
    let beside = std::env::current_exe().ok().and_then(|exe| {
        let dir = exe.parent()?.to_path_buf();
        [dir.join(&name), dir.parent()?.join(&name)].into_iter().find(|p| p.is_file())
    });
    beside.unwrap_or_else(|| PathBuf::from(name))
}

/// Opens `entry`'s plugin if its file is still the one locked: the library's hash is checked
/// before it is loaded, the capabilities' hash and the name and version after. With
/// `isolated`, it is opened (and checked, by hash first) in a worker process instead.
pub fn open_locked(entry: &LockEntry, base: &Path, isolated: Option<&WorkerOptions>) -> Result<Plugin> {
    let path = entry.resolve(base);
    let plugin = match isolated {
        Some(options) => Plugin::open_isolated(&path, &entry.library_blake3, options.clone())?,
        None => Plugin::open_expecting(&path, Some(&entry.library_blake3))?,
    };
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

/// Every plugin of `lock` (read from `path`) that the policy's `allow_plugins` globs name
/// (absent: all), each checked, isolated ones opened in their worker; one it does not name is
/// refused before it is opened (`PLUGIN_NOT_ALLOWED`). The first refusal is the error.
/// Python packages (`kind: python`) are the Python package's to load ([`check_python`]).
pub fn open_all(lock: &Lockfile, path: &Path, loading: &Loading) -> Result<Vec<Arc<Plugin>>> {
    let base = path.parent().unwrap_or(Path::new("."));
    lock.plugins
        .iter()
        .filter(|e| e.kind == PluginKind::CAbi)
        .map(|e| {
            loading.check_allowed(&e.namespace(), &e.resolve(base))?;
            open_locked(e, base, loading.isolated(&e.name, &e.version)).map(Arc::new)
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
    /// True when it runs in a worker process (`isolation`).
    pub isolated: bool,
    /// Why it would be refused (with its reason code); `None`: it loads.
    pub error: Option<String>,
}

/// The state of every plugin the lockfile at `path` pins (empty when there is none), loaded as
/// `loading` says. Each is checked as loading checks it (hash before it is opened; an isolated
/// one in a worker).
pub fn states(path: &Path, loading: &Loading) -> Result<Vec<PluginState>> {
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
            let checked = match e.kind {
                PluginKind::CAbi => open_all(&single, path, loading).map(|_| ()),
                PluginKind::Python => check_python(&single, path, &e.name, &e.version, None, loading).map(|_| ()),
            };
            PluginState {
                namespace: e.namespace(),
                path: e.resolve(base),
                isolated: loading.isolated(&e.name, &e.version).is_some(),
                error: checked.err().map(|err| err.to_string()),
            }
        })
        .collect())
}
