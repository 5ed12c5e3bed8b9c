//! Watching the policy file: a thread that checks the file's size and modification time
//! every poll interval, hashes the content when they change, and reloads the policy when the
//! content did change. A reload that fails keeps the policy in force and is recorded on the
//! handle (`LayerZero::policy_error`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use super::LayerZero;
use crate::error::{Error, Result};

/// The handle a watcher reloads.
pub(crate) enum Target {
    /// A shared handle; the watcher ends when the last `Arc` is dropped.
    Shared(Weak<LayerZero>),
    /// The process-wide handle.
    Static(&'static LayerZero),
}

/// Stops the watcher when dropped.
#[derive(Debug)]
pub struct PolicyWatch {
    stop: Arc<AtomicBool>,
    path: PathBuf,
}

impl PolicyWatch {
    /// The file watched.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PolicyWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// What says a file may have changed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp { len: m.len(), modified: m.modified().ok() })
}

fn content_hash(path: &Path) -> Option<blake3::Hash> {
    crate::files::read(path).ok().map(|bytes| blake3::hash(&bytes))
}

pub(crate) fn spawn(target: Target, path: &Path, every: Duration) -> Result<PolicyWatch> {
    let stop = Arc::new(AtomicBool::new(false));
    let path = path.to_path_buf();
    let (theirs, file) = (stop.clone(), path.clone());
    let mut seen = (stamp(&file), content_hash(&file));
    std::thread::Builder::new()
        .name("lz-policy-watch".to_owned())
        .spawn(move || {
            while !theirs.load(Ordering::Acquire) {
                std::thread::sleep(every);
                let lz = match &target {
                    Target::Shared(weak) => match weak.upgrade() {
                        Some(lz) => Guard::Owned(lz),
                        None => return,
                    },
                    Target::Static(lz) => Guard::Static(lz),
                };
                let now = stamp(&file);
                if now == seen.0 {
                    continue;
                }
                let hash = content_hash(&file);
                if hash.is_some() && hash != seen.1 {
                    // A failed reload is recorded on the handle; the old policy stays.
                    let _ = lz.get().reload_policy(&file);
                } else if hash.is_none() {
                    lz.get().note_policy_error(format!(
                        "the policy file {} cannot be read; the policy in force is kept",
                        file.display()
                    ));
                }
                seen = (now, hash);
            }
        })
        .map_err(|e| Error::invalid(format!("cannot start the policy watcher for {}: {e}", path.display())))?;
    Ok(PolicyWatch { stop, path })
}

enum Guard {
    Owned(Arc<LayerZero>),
    Static(&'static LayerZero),
}

impl Guard {
    fn get(&self) -> &LayerZero {
        match self {
            Guard::Owned(lz) => lz,
            Guard::Static(lz) => lz,
        }
    }
}
