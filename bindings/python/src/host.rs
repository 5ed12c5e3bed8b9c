//! The Python process's handle: `LayerZero::host()` with the executors Python registered and
//! the backends Python probed (their import status and versions). Registering rebuilds it;
//! a call reads the current one with one atomic load (no lock on the hot path). A replaced
//! handle is kept alive, never freed, so that a call still running on it stays valid: a
//! process registers its backends a handful of times, at import and first use.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};

use layerzero::error::{Error, Result};
use layerzero::exec::executor::Executor;
use layerzero::runtime::LayerZero;
use layerzero::select::{BackendStatus, LoadedLibrary};

static CURRENT: AtomicPtr<LayerZero> = AtomicPtr::new(std::ptr::null_mut());

/// What the handle is rebuilt from.
#[derive(Default)]
struct Installed {
    backends: Vec<(String, BackendStatus, Option<LoadedLibrary>)>,
    executors: Vec<(String, Arc<dyn Executor>)>,
}

static INSTALLED: Mutex<Installed> = Mutex::new(Installed { backends: Vec::new(), executors: Vec::new() });

/// The current handle, built on first use.
pub fn current() -> Result<&'static LayerZero> {
    let p = CURRENT.load(Ordering::Acquire);
    if p.is_null() {
        return rebuild(|_| Ok(()));
    }
    // SAFETY: a non-null pointer in CURRENT came from `Box::leak` in `rebuild` and is never
    // freed, so it stays a valid shared reference for the rest of the process.
    Ok(unsafe { &*p })
}

/// A handle of this process's settings with what Python installed: the process handle, or a
/// new one of the user's (`LayerZero.host()` in Python).
pub fn build() -> Result<LayerZero> {
    let installed = INSTALLED.lock().map_err(|_| Error::invalid("the registry lock was poisoned"))?;
    build_from(&installed)
}

fn build_from(installed: &Installed) -> Result<LayerZero> {
    let mut lz = LayerZero::host()?;
    for (backend, status, library) in &installed.backends {
        lz = lz.with_backend(backend, status.clone(), library.clone())?;
    }
    for (kernel, executor) in &installed.executors {
        lz = lz.register(kernel, executor.clone())?;
    }
    Ok(lz)
}

/// Records a backend's status and library; the handle is rebuilt.
pub fn set_backend(backend: String, status: BackendStatus, library: Option<LoadedLibrary>) -> Result<()> {
    rebuild(|i| {
        i.backends.retain(|(b, ..)| *b != backend);
        i.backends.push((backend, status, library));
        Ok(())
    })
    .map(|_| ())
}

/// Binds `kernel` to `executor`; the handle is rebuilt.
pub fn register(kernel: String, executor: Arc<dyn Executor>) -> Result<()> {
    rebuild(|i| {
        i.executors.retain(|(k, _)| *k != kernel);
        i.executors.push((kernel, executor));
        Ok(())
    })
    .map(|_| ())
}

/// Applies `change`, builds the handle and makes it current. A build that fails leaves the
/// record and the handle as they were.
fn rebuild(change: impl FnOnce(&mut Installed) -> Result<()>) -> Result<&'static LayerZero> {
    let mut installed = INSTALLED.lock().map_err(|_| Error::invalid("the registry lock was poisoned"))?;
    let mut next = Installed { backends: installed.backends.clone(), executors: installed.executors.clone() };
    change(&mut next)?;
    let lz: &'static LayerZero = Box::leak(Box::new(build_from(&next)?));
    *installed = next;
    CURRENT.store(std::ptr::from_ref(lz).cast_mut(), Ordering::Release);
    Ok(lz)
}
