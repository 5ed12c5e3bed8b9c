//! Which backends this host can run: builtin ones are available, dynamic-library ones are
//! probed (loaded, their versions read), external ones wait for the host to register an
//! executor. The result is data the pure selector is handed.

use crate::capabilities::catalog::Catalog;
use crate::capabilities::spec::Execution;
use crate::hardware::profile::HardwareProfile;
use crate::select::{Availability, BackendStatus, LoadedLibrary};

/// This host: builtin backends are available, dynamic-library backends are probed,
/// external ones are available only once the host registers an executor for one of their
/// kernels ([`Availability::mark_registered`], done by `LayerZero::register`).
pub fn probe(catalog: &Catalog, hw: &HardwareProfile) -> Availability {
    let mut availability = Availability::default();
    for b in catalog.backends() {
        let has_device = b.kernels.iter().any(|k| hw.devices.iter().any(|d| d.kind == k.device_kind(b)));
        let status = if !has_device {
            BackendStatus::NotInstalled(format!("this host has no {} device", b.device))
        } else {
            match b.execution {
                Execution::Builtin => BackendStatus::Available,
                Execution::DynamicLibrary => match &b.probe {
                    Some(p) if p.loader.as_deref() == Some("onednn") => {
                        match crate::backend::onednn::find(&super::onednn_search(super::process()), &p.libraries) {
                            Ok(l) => {
                                let version = l.version.to_string();
                                availability.set_library(
                                    &b.backend,
                                    LoadedLibrary { path: l.path.clone(), version, isa: l.isa.map(str::to_owned) },
                                );
                                BackendStatus::Available
                            }
                            Err(why) => BackendStatus::NotInstalled(why),
                        }
                    }
                    Some(p) => match crate::backend::library::first_loadable(&p.libraries) {
                        Ok(_) => BackendStatus::Available,
                        Err(why) => BackendStatus::NotInstalled(why),
                    },
                    None => BackendStatus::NotInstalled("no probe declared".to_owned()),
                },
                Execution::External => BackendStatus::NotInstalled(format!(
                    "{} is another project's library; it runs when the host registers an executor for it",
                    b.backend
                )),
            }
        };
        availability.set(&b.backend, status);
    }
    availability
}
