//! The Python process's handle: `LayerZero::host()` with the executors Python registered and
//! the backends Python probed (their import status and versions). Registering marks it stale
//! and the next call rebuilds it; a call reads the current one with one atomic load (no lock
//! on the hot path). A replaced
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
    /// Kernel, executor, and whether it passed its self-test here.
    executors: Vec<(String, Arc<dyn Executor>, bool)>,
    /// Python plugins' backends, in their namespaces.
    plugins: Vec<layerzero::capabilities::spec::BackendSpec>,
}

static INSTALLED: Mutex<Installed> =
    Mutex::new(Installed { backends: Vec::new(), executors: Vec::new(), plugins: Vec::new() });

/// The current handle, built on first use.
pub fn current() -> Result<&'static LayerZero> {
    let p = CURRENT.load(Ordering::Acquire);
    if p.is_null() {
        return rebuild();
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
    let settings = layerzero::knobs::Settings::from_env()?;
    let mut lz = LayerZero::host_with_backends(settings, installed.plugins.clone())?;
    for (backend, status, library) in &installed.backends {
        lz = lz.with_backend(backend, status.clone(), library.clone())?;
    }
    for (kernel, executor, verified) in &installed.executors {
        lz = if *verified {
            lz.register(kernel, executor.clone())?
        } else {
            lz.register_unverified(kernel, executor.clone())?
        };
    }
    Ok(lz)
}

/// LayerZero's own executors with those Python registered (what a tuning run times).
pub fn registry() -> Result<layerzero::exec::executor::Registry> {
    let installed = INSTALLED.lock().map_err(|_| Error::invalid("the registry lock was poisoned"))?;
    let mut registry = layerzero::builtin_registry();
    for (kernel, executor, _) in &installed.executors {
        registry.register(kernel, executor.clone());
    }
    Ok(registry)
}

/// Records a backend's status and library; the handle is rebuilt on next use.
pub fn set_backend(backend: String, status: BackendStatus, library: Option<LoadedLibrary>) -> Result<()> {
    check(|lz| lz.catalog().backend(&backend).is_some(), || format!("backend {backend:?} is not in the catalog"))?;
    record(|i| {
        i.backends.retain(|(b, ..)| *b != backend);
        i.backends.push((backend, status, library));
    })
}

/// Binds `kernel` to `executor` (refused by selection while unverified, unless the policy
/// allows it); the handle is rebuilt on next use.
pub fn register(kernel: String, executor: Arc<dyn Executor>, verified: bool) -> Result<()> {
    check(
        |lz| lz.catalog().find(&kernel).is_some(),
        || format!("kernel {kernel:?} is not in the catalog; an executor can only be registered for a declared kernel"),
    )?;
    record(|i| {
        i.executors.retain(|(k, ..)| *k != kernel);
        i.executors.push((kernel, executor, verified));
    })
}

/// Adds a Python plugin's backend (in its namespace) to the catalog; the handle is rebuilt on
/// next use, and refused there if the backend clashes.
pub fn add_plugin(backend: layerzero::capabilities::spec::BackendSpec) -> Result<()> {
    record(|i| {
        i.plugins.retain(|b| b.backend != backend.backend);
        i.plugins.push(backend);
    })
}

/// An error unless `ok` holds of the current handle (whose catalog every rebuild keeps).
fn check(ok: impl FnOnce(&LayerZero) -> bool, message: impl FnOnce() -> String) -> Result<()> {
    if ok(current()?) { Ok(()) } else { Err(Error::invalid(message())) }
}

/// Applies `change` to the record; the next call builds the handle from it (so a burst of
/// registrations at import costs one build).
fn record(change: impl FnOnce(&mut Installed)) -> Result<()> {
    let mut installed = INSTALLED.lock().map_err(|_| Error::invalid("the registry lock was poisoned"))?;
    change(&mut installed);
    CURRENT.store(std::ptr::null_mut(), Ordering::Release);
    Ok(())
}

/// Drops the current handle without freeing it (a forked child: its threads are the parent's
/// and do not exist here); the next call builds a new one.
pub fn forget_current() {
    CURRENT.store(std::ptr::null_mut(), Ordering::Release);
}

/// Builds the handle from the record and makes it current.
fn rebuild() -> Result<&'static LayerZero> {
    let installed = INSTALLED.lock().map_err(|_| Error::invalid("the registry lock was poisoned"))?;
    let p = CURRENT.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: as in `current`: leaked, never freed.
        return Ok(unsafe { &*p });
    }
    let lz: &'static LayerZero = Box::leak(Box::new(build_from(&installed)?));
    CURRENT.store(std::ptr::from_ref(lz).cast_mut(), Ordering::Release);
    Ok(lz)
}
