//! Availability: which backends can run here. Computed at the edge (probes) or assumed
//! (planning for a named profile), then handed to the pure selector as data.

use std::collections::{BTreeMap, BTreeSet};

use crate::capabilities::catalog::Catalog;
use crate::capabilities::spec::{BackendSpec, Execution, KernelSpec};
use crate::constraint::Sink;
use crate::hardware::profile::{DeviceProfile, HardwareProfile};
use crate::model::device::DeviceRef;
use crate::reason::ReasonCode;

/// The availability stage for one kernel: its backend is installed and healthy, it runs on
/// the kind of device the request's tensors are on, and the profile has that device.
pub(crate) fn judge<S: Sink>(
    availability: &Availability,
    hardware: &HardwareProfile,
    backend: &BackendSpec,
    kernel: &KernelSpec,
    device_ref: DeviceRef,
    device: Option<&DeviceProfile>,
    sink: &mut S,
) {
    match availability.status(&backend.backend) {
        BackendStatus::Available => {
            if let (Some(range), Some(lib)) = (&kernel.library_versions, availability.library(&backend.backend)) {
                let parse = crate::capabilities::Version::parse;
                let inside = matches!((parse(&range.min), parse(&range.below), parse(&lib.version)),
                    (Some(lo), Some(hi), Some(v)) if lo <= v && v < hi);
                if !inside {
                    sink.reject(ReasonCode::BACKEND_VERSION_UNSUPPORTED, || {
                        format!(
                            "{} {} is loaded ({}); {} was checked against versions >= {} and < {}",
                            backend.backend, lib.version, lib.path, kernel.id, range.min, range.below
                        )
                    });
                }
            }
            if kernel.execution(backend) == Execution::External
                && backend.execution != Execution::External
                && !availability.planning
                && !availability.registered.contains(&kernel.id)
            {
                sink.reject(ReasonCode::EXECUTOR_NOT_REGISTERED, || {
                    format!(
                        "{} is loaded, but LayerZero has no executor for {}; it runs when the host registers one",
                        backend.backend, kernel.id
                    )
                });
            }
        }
        BackendStatus::NotInstalled(why) => sink.reject(ReasonCode::BACKEND_NOT_INSTALLED, || why),
        BackendStatus::Unhealthy(why) => sink.reject(ReasonCode::BACKEND_UNHEALTHY, || why),
    }
    let kernel_device = kernel.device_kind(backend);
    if kernel_device != device_ref.kind {
        sink.reject(ReasonCode::DEVICE_KIND_MISMATCH, || {
            format!("the kernel runs on {kernel_device}; the request's tensors are on {device_ref}")
        });
    }
    if device.is_none() {
        sink.reject(ReasonCode::DEVICE_NOT_PRESENT, || {
            format!("hardware profile {} has no device {device_ref}", hardware.name)
        });
    }
}

/// Refuses a kernel whose executor is registered unverified (`EXECUTOR_UNVERIFIED`) unless
/// the policy allows unverified executors.
pub(crate) fn judge_verified<S: Sink>(availability: &Availability, allow: bool, kernel: &KernelSpec, sink: &mut S) {
    if !allow && availability.unverified.contains(&kernel.id) {
        sink.reject(ReasonCode::EXECUTOR_UNVERIFIED, || {
            format!(
                "{}'s executor has not passed its self-test against the reference on this machine \
                 (run layerzero.selftest(), or set allow_unverified in the policy)",
                kernel.id
            )
        });
    }
}

/// Whether a backend can run, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendStatus {
    /// Installed and usable.
    Available,
    /// Not installed; the message says what was looked for.
    NotInstalled(String),
    /// Installed but marked unhealthy by the runtime.
    Unhealthy(String),
}

/// A library a backend was loaded from at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedLibrary {
    /// The name or path it was opened by.
    pub path: String,
    /// Its version, `major.minor.patch`.
    pub version: String,
    /// The instruction set the library generates code for here, when it reports one.
    pub isa: Option<String>,
}

/// Backend statuses by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Availability {
    statuses: BTreeMap<String, BackendStatus>,
    /// Libraries loaded by a versioned probe (`probe.loader`), by backend.
    libraries: BTreeMap<String, LoadedLibrary>,
    /// Kernels the host registered an executor for.
    registered: BTreeSet<String>,
    /// Registered kernels whose executor has not passed its self-test on this machine.
    unverified: BTreeSet<String>,
    planning: bool,
}

impl Availability {
    /// Planning mode (a named profile): every backend whose device kind the profile has
    /// counts as installed. Device kinds are checked per request by the selector.
    pub fn planning(catalog: &Catalog) -> Availability {
        let statuses = catalog.backends().iter().map(|b| (b.backend.clone(), BackendStatus::Available)).collect();
        Availability {
            statuses,
            libraries: BTreeMap::new(),
            registered: BTreeSet::new(),
            unverified: BTreeSet::new(),
            planning: true,
        }
    }

    /// Records that the executor registered for `kernel_id` has not passed its self-test here:
    /// selection refuses it (`EXECUTOR_UNVERIFIED`) unless the policy allows unverified ones.
    pub fn mark_unverified(&mut self, kernel_id: &str) {
        self.unverified.insert(kernel_id.to_owned());
    }

    /// True when `kernel_id`'s executor is registered unverified.
    pub fn is_unverified(&self, kernel_id: &str) -> bool {
        self.unverified.contains(kernel_id)
    }

    /// Records that the host registered an executor for `kernel_id`, and marks its backend
    /// available where this machine has a device the kernel runs on (planning availability
    /// is unchanged: every backend already counts as installed).
    pub fn mark_registered(&mut self, catalog: &Catalog, hw: &HardwareProfile, kernel_id: &str) {
        let Some(ki) = catalog.find(kernel_id) else { return };
        let (backend, kernel) = catalog.kernel(ki);
        self.registered.insert(kernel.id.clone());
        self.unverified.remove(&kernel.id);
        if self.planning || !hw.devices.iter().any(|d| d.kind == kernel.device_kind(backend)) {
            return;
        }
        self.statuses.insert(backend.backend.clone(), BackendStatus::Available);
    }

    /// Sets one backend's status (tests, runtime health).
    pub fn set(&mut self, backend: &str, status: BackendStatus) {
        self.statuses.insert(backend.to_owned(), status);
    }

    /// The status of a backend (unknown backends are not installed).
    pub fn status(&self, backend: &str) -> BackendStatus {
        self.statuses
            .get(backend)
            .cloned()
            .unwrap_or_else(|| BackendStatus::NotInstalled(format!("backend {backend} was not probed")))
    }

    /// Records the library `backend` was loaded from (tests, hosts that load it themselves).
    pub fn set_library(&mut self, backend: &str, library: LoadedLibrary) {
        self.libraries.insert(backend.to_owned(), library);
    }

    /// The library `backend` was loaded from, when its probe reads versions.
    pub fn library(&self, backend: &str) -> Option<&LoadedLibrary> {
        self.libraries.get(backend)
    }

    /// True in planning mode.
    pub fn is_planning(&self) -> bool {
        self.planning
    }

    /// All statuses, by backend name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &BackendStatus)> {
        self.statuses.iter().map(|(k, v)| (k.as_str(), v))
    }
}
