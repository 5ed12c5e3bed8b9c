//! A handle with plugins: their namespaced backends added to the catalog, their kernels bound
//! to their executors.

use std::sync::Arc;

use super::LayerZero;
use crate::backend::plugin::{Plugin, plugin_error};
use crate::capabilities::catalog::Catalog;
use crate::error::{ErrorKind, Result};
use crate::reason::ReasonCode;

impl LayerZero {
    /// [`LayerZero::detected_with`] over `catalog` plus `plugins`' kernels, each bound to its
    /// plugin's executor. A plugin whose name is a backend of `catalog`, or whose namespace
    /// (`NAME@VERSION`) another plugin has, is refused (`PLUGIN_NAMESPACE_CLASH`); two versions
    /// of one plugin load side by side. A plugin needing another major version of a native
    /// runtime than a plugin before it (`requires`) is refused (`PLUGIN_REQUIREMENTS_CONFLICT`),
    /// naming both, unless one of the two runs in a worker process of its own.
    pub fn detected_with_plugins(catalog: Arc<Catalog>, plugins: &[Arc<Plugin>]) -> Result<LayerZero> {
        let mut backends = catalog.backends().to_vec();
        for p in plugins {
            let clash = if catalog.backend(&p.name).is_some() {
                Some(format!("its name {:?} is a builtin backend's", p.name))
            } else if backends.iter().any(|b| b.backend == p.namespace()) {
                Some(format!("namespace {} is already loaded (from another file?)", p.namespace()))
            } else {
                None
            };
            if let Some(why) = clash {
                return Err(plugin_error(ReasonCode::PLUGIN_NAMESPACE_CLASH, ErrorKind::InvalidInput, &p.path, why));
            }
            // Only plugins loaded here share this process's runtimes.
            let here: Vec<_> = (catalog.backends().iter().cloned())
                .chain(
                    plugins
                        .iter()
                        .take_while(|q| !Arc::ptr_eq(q, p))
                        .filter(|q| !q.is_isolated())
                        .map(|q| q.backend().clone()),
                )
                .collect();
            if let Some(why) = conflict(p.backend(), &here).filter(|_| !p.is_isolated()) {
                return Err(plugin_error(
                    ReasonCode::PLUGIN_REQUIREMENTS_CONFLICT,
                    ErrorKind::InvalidInput,
                    &p.path,
                    why,
                ));
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

/// The first backend of `loaded` that needs another major version of a runtime `b` needs.
fn conflict(
    b: &crate::capabilities::spec::BackendSpec,
    loaded: &[crate::capabilities::spec::BackendSpec],
) -> Option<String> {
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
