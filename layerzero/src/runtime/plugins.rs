//! A handle with plugins: their namespaced backends added to the catalog, their kernels bound
//! to their executors.

use std::sync::Arc;

use super::LayerZero;
use crate::backend::plugin::{Plugin, plugin_error};
use crate::capabilities::catalog::Catalog;
use crate::capabilities::spec::BackendSpec;
use crate::error::{Error, ErrorKind, Result};
use crate::reason::{Reason, ReasonCode};

impl LayerZero {
    /// [`LayerZero::detected_with`] over `catalog` plus `plugins`' kernels, each bound to its
    /// plugin's executor. A plugin whose name is a backend of `catalog`, or whose namespace
    /// (`NAME@VERSION`) another plugin has, is refused (`PLUGIN_NAMESPACE_CLASH`); two versions
    /// of one plugin load side by side. A plugin needing another major version of a native
    /// runtime than a plugin before it (`requires`) is refused (`PLUGIN_REQUIREMENTS_CONFLICT`),
    /// naming both, unless one of the two runs in a worker process of its own.
    pub fn detected_with_plugins(catalog: Arc<Catalog>, plugins: &[Arc<Plugin>]) -> Result<LayerZero> {
        let mut backends = catalog.backends().to_vec();
        // Only the backends loaded here share this process's runtimes.
        let mut here = backends.clone();
        for p in plugins {
            if let Some(why) = namespace_clash(&catalog, &backends, &p.name, &p.namespace()) {
                return Err(plugin_error(ReasonCode::PLUGIN_NAMESPACE_CLASH, ErrorKind::InvalidInput, &p.path, why));
            }
            if !p.is_isolated() {
                if let Some(why) = conflict(p.backend(), &here) {
                    return Err(plugin_error(
                        ReasonCode::PLUGIN_REQUIREMENTS_CONFLICT,
                        ErrorKind::InvalidInput,
                        &p.path,
                        why,
                    ));
                }
                here.push(p.backend().clone());
            }
            backends.push(p.backend().clone());
        }
        let mut lz = LayerZero::detected_with(Arc::new(Catalog::from_backends(backends)?))?;
        for p in plugins {
            for (id, executor) in p.executors() {
                lz = lz.register(&id, executor)?;
            }
        }
        Ok(lz)
    }
}

/// Why a plugin `name` (namespace `NAME@VERSION`) cannot join `loaded` over the builtin
/// `catalog`: its name is a builtin backend's, or its namespace is already loaded.
fn namespace_clash(catalog: &Catalog, loaded: &[BackendSpec], name: &str, namespace: &str) -> Option<String> {
    if catalog.backend(name).is_some() {
        Some(format!("its name {name:?} is a builtin backend's"))
    } else if loaded.iter().any(|b| b.backend == namespace) {
        Some(format!("namespace {namespace} is already loaded (from another file?)"))
    } else {
        None
    }
}

/// `catalog` with `extra` plugin backends (a Python plugin's, already in their namespaces)
/// added; one that clashes is refused (`PLUGIN_NAMESPACE_CLASH`).
pub(super) fn with_backends(catalog: Arc<Catalog>, extra: Vec<BackendSpec>) -> Result<Arc<Catalog>> {
    if extra.is_empty() {
        return Ok(catalog);
    }
    let mut backends = catalog.backends().to_vec();
    for b in extra {
        let name = b.backend.split('@').next().unwrap_or_default();
        if let Some(why) = namespace_clash(&catalog, &backends, name, &b.backend) {
            let message = format!("plugin {}: {why} ({})", b.backend, ReasonCode::PLUGIN_NAMESPACE_CLASH);
            return Err(Error::invalid(message.clone())
                .with_reasons(vec![Reason::new(ReasonCode::PLUGIN_NAMESPACE_CLASH, message)]));
        }
        backends.push(b);
    }
    Ok(Arc::new(Catalog::from_backends(backends)?))
}

/// The first backend of `loaded` that needs another major version of a runtime `b` needs.
fn conflict(b: &BackendSpec, loaded: &[BackendSpec]) -> Option<String> {
    let mine = b.requires.as_ref()?;
    loaded.iter().find_map(|other| {
        let theirs = other.requires.as_ref()?;
        mine.iter().find_map(|(runtime, major)| {
            let other_major = theirs.get(runtime).filter(|m| *m != major)?;
            Some(format!(
                "{} needs {runtime} {major}, but {} (loaded) needs {runtime} {other_major}: one process cannot hold both",
                b.backend, other.backend
            ))
        })
    })
}
