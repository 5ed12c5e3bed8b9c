//! `layerzero.lock`: the plugins LayerZero may load, pinned by hash.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backend::plugin::Plugin;
use crate::error::{Error, ErrorKind, Result};

/// The lockfile format this build reads and writes.
pub const LOCK_SCHEMA_VERSION: u32 = 1;

/// The lockfile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lockfile {
    /// Format version.
    pub schema_version: u32,
    /// One entry per plugin namespace (`name@version`), sorted.
    pub plugins: Vec<LockEntry>,
}

/// One locked plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockEntry {
    /// The plugin's name (its namespace without the version).
    pub name: String,
    /// Its version.
    pub version: String,
    /// Where it came from (a path, or the hub and repository it was added from).
    pub source: String,
    /// The library file; relative paths are relative to the lockfile's folder.
    pub path: PathBuf,
    /// blake3 of the library file, hex.
    pub library_blake3: String,
    /// blake3 of the capabilities JSON the library returns, hex.
    pub capabilities_blake3: String,
    /// The hub variant chosen (none for a local file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// What it is: a C-ABI library (the default), or a Python package whose entry point in
    /// the `layerzero.backends` group the Python package loads (then `path` is the
    /// distribution's `RECORD` and `library_blake3` its blake3).
    #[serde(default, skip_serializing_if = "PluginKind::is_c_abi")]
    pub kind: PluginKind,
    /// blake3 of the file a hub served for it when that is not the locked file (a Python
    /// package's wheel); a later `lz plugin add` of another file is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download_blake3: Option<String>,
}

/// A locked plugin's kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PluginKind {
    /// A shared library speaking the plugin C ABI.
    #[default]
    CAbi,
    /// A Python package declaring a `layerzero.backends` entry point.
    Python,
}

impl PluginKind {
    fn is_c_abi(&self) -> bool {
        *self == PluginKind::CAbi
    }
}

impl LockEntry {
    /// The entry of an opened plugin, from `source`.
    pub fn of(plugin: &Plugin, source: String) -> LockEntry {
        LockEntry {
            name: plugin.name.clone(),
            version: plugin.version.clone(),
            source,
            path: plugin.path.clone(),
            library_blake3: plugin.library_hash.clone(),
            capabilities_blake3: plugin.capabilities_hash.clone(),
            variant: None,
            kind: PluginKind::CAbi,
            download_blake3: None,
        }
    }

    /// `name@version`.
    pub fn namespace(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    /// The library's path, relative paths taken from `base` (the lockfile's folder).
    pub fn resolve(&self, base: &Path) -> PathBuf {
        if self.path.is_absolute() { self.path.clone() } else { base.join(&self.path) }
    }
}

impl Default for Lockfile {
    fn default() -> Lockfile {
        Lockfile { schema_version: LOCK_SCHEMA_VERSION, plugins: Vec::new() }
    }
}

impl Lockfile {
    /// Reads `path` (absent: an empty lockfile).
    pub fn read(path: &Path) -> Result<Lockfile> {
        if !path.exists() {
            return Ok(Lockfile::default());
        }
        let text = crate::files::read_to_string(path)?;
        let lock: Lockfile = serde_json::from_str(&text).map_err(|e| {
            Error::new(ErrorKind::InvalidInput, format!("{}: not a LayerZero lockfile: {e}", path.display()))
        })?;
        if lock.schema_version != LOCK_SCHEMA_VERSION {
            return Err(Error::new(
                ErrorKind::Schema,
                format!(
                    "{}: field `schema_version` is {}; this LayerZero reads lockfiles of version {LOCK_SCHEMA_VERSION}",
                    path.display(),
                    lock.schema_version
                ),
            ));
        }
        Ok(lock)
    }

    /// Writes it to `path` atomically (a reader sees the old file or the new one).
    pub fn write(&self, path: &Path) -> Result<()> {
        let text =
            serde_json::to_string_pretty(self).map_err(|e| Error::invalid(format!("encoding the lockfile: {e}")))?;
        crate::files::write(path, (text + "\n").as_bytes(), &[])
    }

    /// Adds `entry`, replacing the entry of the same namespace; returns the one replaced.
    pub fn upsert(&mut self, entry: LockEntry) -> Option<LockEntry> {
        let old = self.plugins.iter().position(|e| e.namespace() == entry.namespace()).map(|i| self.plugins.remove(i));
        self.plugins.push(entry);
        self.plugins.sort_by_key(LockEntry::namespace);
        old
    }
}
