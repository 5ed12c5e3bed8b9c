//! Building a handle: for this machine (`host`, `host_with`, `detected`), for a named one
//! (`planning`), over an explicit selector (`new`), and the builders that change its parts and
//! rebuild what derives from them (selector, executors by index, plan, cache context).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::counters::Striped;
use super::{LayerZero, Live, MEMO_SLOTS, Parts, RECENT_DECISIONS, context_of, faults, flight, refused};
use crate::capabilities::catalog::Catalog;
use crate::error::{Error, Result};
use crate::exec::executor::{Executor, Registry};
use crate::hardware::named;
use crate::hardware::profile::HardwareProfile;
use crate::health::{Health, HealthConfig};
use crate::host::detect;
use crate::knobs::Settings;
use crate::plan::PlanMode;
use crate::plan::typed::KeyMemo;
use crate::plan::{DispatchTable, Plan, SelectionCache};
use crate::policy::Policy;
use crate::reason::Reason;
use crate::score::calibration::Calibration;
use crate::score::measured::Measurements;
use crate::select::{Availability, Selector};

impl LayerZero {
    /// This machine: the shipped capabilities, detected hardware, probed backends and the
    /// builtin executors, configured by the `LAYERZERO_*` knobs of the process environment
    /// ([`LayerZero::host_with`] of [`Settings::from_env`]; a bad value is an error naming it).
    pub fn host() -> Result<LayerZero> {
        LayerZero::host_with(Settings::from_env()?)
    }

    /// This machine configured by `settings`: `LAYERZERO_POLICY` (a policy file) and the knobs
    /// that override its fields (health thresholds, deadline, output checks, rules),
    /// `LAYERZERO_DISPATCH_TABLE` with `LAYERZERO_PLAN_MODE`, `LAYERZERO_CACHE_CAPACITY`,
    /// `LAYERZERO_FAULTS`, the PerfDB (`LAYERZERO_PERFDB`, else `$LAYERZERO_HOME/perfdb.sqlite`)
    /// and the cost-model calibration (`LAYERZERO_CALIBRATION`, else
    /// `$LAYERZERO_HOME/calibration.json`) when their files exist, and the plugins of the
    /// lockfile (`LAYERZERO_LOCK`, else `./layerzero.lock`) when it exists.
    pub fn host_with(settings: Settings) -> Result<LayerZero> {
        LayerZero::host_with_backends(settings, Vec::new())
    }

    /// [`LayerZero::host_with`] with `extra` backends in the catalog (a Python plugin's, in its
    /// namespace, whose executors the caller registers). One named as a builtin backend, or
    /// as another backend, is refused (`PLUGIN_NAMESPACE_CLASH`).
    pub fn host_with_backends(
        settings: Settings,
        extra: Vec<crate::capabilities::spec::BackendSpec>,
    ) -> Result<LayerZero> {
        let catalog = super::plugins::with_backends(Catalog::builtin()?, extra)?;
        let mut policy = match &settings.policy {
            Some(path) => Policy::load(path)?,
            None => Policy::default(),
        };
        // The plugins the lockfile pins (none without one) and the policy allows, each checked
        // before it is opened.
        let lock = settings.lock_path();
        let mut lz = if lock.exists() {
            let locked = crate::plugins::Lockfile::read(&lock)?;
            // Loaded under the policy as the knobs leave it (LAYERZERO_ISOLATE, the deadline).
            let mut effective = policy.clone();
            effective.apply_overrides(&settings.policy_overrides());
            let loading = crate::plugins::Loading::new(&effective, &settings);
            let plugins = crate::plugins::open_all(&locked, &lock, &loading)?;
            LayerZero::detected_with_plugins(catalog, &plugins)?
        } else {
            LayerZero::detected_with(catalog)?
        };
        // A drill checks outputs, so an injected `nan` falls back instead of flowing on
        // (LAYERZERO_VALIDATE_OUTPUTS, applied next, still has the last word).
        if settings.faults.is_some() {
            policy.validate_outputs = true;
        }
        policy.apply_overrides(&settings.policy_overrides());
        lz = lz.with_policy(policy)?;
        lz = lz.with_cache_capacity(usize::try_from(settings.cache_capacity).unwrap_or(usize::MAX));
        #[cfg(feature = "perfdb")]
        if settings.perfdb_path().exists() {
            lz = lz.with_perfdb(&settings.perfdb_path())?;
        }
        // A calibration that does not load is left out (`lz doctor` says why): the capability
        // files' coefficients still model every kernel.
        let calibration = settings.calibration_path();
        if calibration.exists()
            && let Ok(c) = Calibration::load(&calibration)
        {
            lz = lz.with_calibration(Arc::new(c))?;
        }
        if let Some(path) = &settings.dispatch_table {
            lz = lz.with_plan_file(path, settings.plan_mode)?;
        }
        if let Some(spec) = &settings.faults {
            lz = lz.with_faults(spec)?;
        }
        lz.parts.settings = Arc::new(settings);
        Ok(lz)
    }

    /// The settings this handle was configured with (for a handle not built by
    /// [`LayerZero::host`], the process's: `host::process`).
    pub fn settings(&self) -> &Settings {
        &self.parts.settings
    }

    /// Injects the faults `spec` describes (`KERNEL_OR_BACKEND=MODE[,...]`, the syntax of
    /// `LAYERZERO_FAULTS`) into this handle's dispatches: a drill of fallback, breakers and
    /// reports on a healthy machine. An empty spec removes them.
    pub fn with_faults(mut self, spec: &str) -> Result<LayerZero> {
        let rules = faults::parse(spec)?;
        self.faults = if rules.is_empty() {
            None
        } else {
            Some(Arc::new(faults::Faults::resolve(spec, &rules, &self.parts.catalog)?))
        };
        Ok(self)
    }

    /// The fault spec in force, if any (`lz doctor` shows it).
    pub fn faults(&self) -> Option<&str> {
        self.faults.as_deref().map(faults::Faults::spec)
    }

    /// This machine with the default policy and no knobs read: detected hardware, probed
    /// backends, builtin executors.
    pub fn detected() -> Result<LayerZero> {
        LayerZero::detected_with(Catalog::builtin()?)
    }

    /// [`LayerZero::detected`] over another catalog (capability files of your own).
    pub fn detected_with(catalog: Arc<Catalog>) -> Result<LayerZero> {
        let hardware = Arc::new(detect::detect_host().profile);
        let availability = crate::host::probe::probe(&catalog, &hardware);
        let cpu_memory =
            hardware.devices.iter().find(|d| d.kind == crate::model::device::DeviceKind::Cpu).map(|d| d.memory_bytes);
        let lz = LayerZero::build(
            catalog,
            hardware,
            availability,
            Arc::new(Policy::default()),
            crate::host::builtin_registry(),
        )?;
        let lz = match cpu_memory {
            Some(total) => lz.with_memory_gauge(crate::host::memory::gauge(total))?,
            None => lz,
        };
        let has_cuda = lz.parts.hardware.devices.iter().any(|d| d.kind == crate::model::device::DeviceKind::Cuda);
        match crate::host::memory::gpu_gauge().filter(|_| has_cuda) {
            Some(g) => lz.with_gpu_memory_gauge(g),
            None => Ok(lz),
        }
    }

    /// Checks workspaces of requests on the first CUDA device against `gauge`'s live free
    /// memory (host handles use `host::memory::gpu_gauge`, read through the driver).
    pub fn with_gpu_memory_gauge(mut self, gauge: Arc<crate::hardware::memory::MemoryGauge>) -> Result<LayerZero> {
        self.parts.gpu_memory = Some(gauge);
        self.rebuilt(None)
    }

    /// Checks workspaces of CPU requests against `gauge`'s live headroom instead of the
    /// profile's memory, and prefers smaller workspaces while it reads under pressure. Host
    /// handles use the process-wide gauge (`host::memory::gauge`); an engine may feed its own.
    pub fn with_memory_gauge(mut self, gauge: Arc<crate::hardware::memory::MemoryGauge>) -> Result<LayerZero> {
        self.parts.memory = Some(gauge);
        self.rebuilt(None)
    }

    /// Plans for a named hardware profile (`lz hardware --list`) or a profile file: every
    /// backend counts as installed; only the builtin executors can run.
    pub fn planning(hardware: &str) -> Result<LayerZero> {
        let catalog = Catalog::builtin()?;
        let availability = Availability::planning(&catalog);
        let hardware = Arc::new(named::load(hardware)?);
        LayerZero::build(catalog, hardware, availability, Arc::new(Policy::default()), crate::host::builtin_registry())
    }

    /// A handle over an explicit selector (a custom catalog, a test profile) and executors.
    /// Backends with a registered executor count as available where the host has their device.
    pub fn new(selector: Selector, registry: Registry) -> Result<LayerZero> {
        let calibration = selector.calibration().cloned().map(Arc::new);
        let (catalog, hardware, policy, availability, measurements) = selector.into_parts();
        let mut availability = (*availability).clone();
        for kernel in registry.kernels() {
            availability.mark_registered(&catalog, &hardware, kernel);
        }
        let mut lz = LayerZero::build(catalog, hardware, availability, policy, registry)?;
        if measurements.is_some() || calibration.is_some() {
            lz.parts.measurements = measurements;
            lz.parts.calibration = calibration;
            lz = lz.rebuilt(None)?;
        }
        Ok(lz)
    }

    fn build(
        catalog: Arc<Catalog>,
        hardware: Arc<HardwareProfile>,
        availability: Availability,
        policy: Arc<Policy>,
        registry: Registry,
    ) -> Result<LayerZero> {
        // Before anything forks: a forked child then runs kernels on threads of its own.
        layerzero_cpu::fork::watch();
        let health = Arc::new(Health::new(&catalog, HealthConfig::of(&policy)));
        let parts = Parts {
            catalog,
            hardware,
            availability,
            measurements: None,
            parity: None,
            perfdb: None,
            calibration: None,
            table: None,
            table_rejection: None,
            plan_mode: PlanMode::Prefer,
            memory: None,
            gpu_memory: None,
            scope: None,
            settings: Arc::new(crate::host::process().clone()),
        };
        let slots = usize::try_from(*crate::knobs::CACHE_CAPACITY.default()).unwrap_or(usize::MAX);
        LayerZero::assemble(parts, registry, health, policy, slots)
    }

    /// A handle of `parts` with empty caches and counters, sharing `health`.
    pub(super) fn assemble(
        parts: Parts,
        registry: Registry,
        health: Arc<Health>,
        policy: Arc<Policy>,
        cache_slots: usize,
    ) -> Result<LayerZero> {
        let selector = Selector::new(
            parts.catalog.clone(),
            parts.hardware.clone(),
            policy.clone(),
            Arc::new(parts.availability.clone()),
        )?;
        let context = context_of(&selector, parts.scope.as_deref());
        let max_workspace = parts.catalog.kernels().map(|(_, _, k)| k.properties.workspace_bytes).max().unwrap_or(0);
        let shadow = super::shadow::Shadow::new(&parts.catalog);
        let lz = LayerZero {
            parts,
            executors: Box::new([]),
            registry,
            health,
            shadow,
            runners: OnceLock::new(),
            live: ArcSwap::from_pointee(Live {
                declared: policy,
                selector: Arc::new(selector),
                context,
                plan_rejection: None,
                plan_on: false,
                parity_refusal: None,
            }),
            swap: Mutex::new(()),
            plan: None,
            plan_on: AtomicBool::new(false),
            quiet: AtomicBool::new(false),
            context: AtomicU64::new(context),
            next_expiry: AtomicI64::new(i64::MAX),
            policy_swaps: AtomicU64::new(0),
            policy_error: Mutex::new(None),
            cache: SelectionCache::new(cache_slots),
            typed_cache: SelectionCache::new(cache_slots),
            memo: KeyMemo::new(MEMO_SLOTS),
            flights: flight::Flights::default(),
            max_workspace,
            check_inputs: AtomicBool::new(false),
            time_dispatches: AtomicBool::new(false),
            counters: Striped::default(),
            faults: None,
            recent: crate::telemetry::Recent::new(RECENT_DECISIONS),
        };
        lz.rebuilt(None)
    }

    /// Recomputes everything derived from the parts (under `policy`, else the current one):
    /// the selector, executors by index, the verified plan, the cache context.
    fn rebuilt(mut self, policy: Option<Arc<Policy>>) -> Result<LayerZero> {
        self.rebuild(policy)?;
        Ok(self)
    }

    /// [`rebuilt`](LayerZero::rebuilt) in place.
    pub(super) fn rebuild(&mut self, policy: Option<Arc<Policy>>) -> Result<()> {
        let p = &self.parts;
        let declared = policy.unwrap_or_else(|| self.live.load().declared.clone());
        let now = crate::time::now_unix();
        let policy = Arc::new(declared.in_force_at(now));
        let health = HealthConfig::of(&policy);
        let mut selector =
            Selector::new(p.catalog.clone(), p.hardware.clone(), policy.clone(), Arc::new(p.availability.clone()))?;
        if let Some(m) = &p.measurements {
            selector = selector.with_measurements(m.clone());
        }
        if let Some(b) = &p.parity {
            selector = selector.with_parity(b.clone());
        }
        if let Some(c) = &p.calibration {
            selector = selector.with_calibration(c.clone());
        }
        if let Some(g) = &p.memory {
            selector = selector.with_memory(g.clone());
        }
        if let Some(g) = &p.gpu_memory {
            selector = selector.with_gpu_memory(g.clone());
        }
        self.health.configure(health);
        self.shadow.configure(policy.shadow_check);
        self.executors = p.catalog.kernels().map(|(_, _, k)| self.registry.get(&k.id).cloned()).collect();
        let mut rejection = p.table_rejection.clone();
        self.plan = None;
        if let (Some(table), true) = (&p.table, p.plan_mode != PlanMode::Off) {
            match super::scope::tokenizer_check(table, p.scope.as_deref()).and_then(|()| Plan::new(table, &selector)) {
                Ok(mut plan) => {
                    plan.bind(|k| self.executors.get(k).cloned().flatten());
                    self.plan = Some(plan);
                }
                Err(reason) if p.plan_mode == PlanMode::Strict => return Err(refused(reason)),
                Err(reason) => rejection = Some(reason),
            }
        }
        let context = context_of(&selector, self.parts.scope.as_deref());
        self.plan_on = AtomicBool::new(self.plan.is_some());
        self.quiet = AtomicBool::new(self.plan.is_none() && rejection.is_none());
        self.context = AtomicU64::new(context);
        self.next_expiry = AtomicI64::new(declared.next_expiry_after(now).unwrap_or(i64::MAX));
        let plan_on = self.plan.is_some();
        self.live = ArcSwap::from_pointee(Live {
            declared,
            selector: Arc::new(selector),
            context,
            plan_rejection: rejection,
            plan_on,
            parity_refusal: None,
        });
        self.cache = SelectionCache::new(self.cache.capacity());
        self.typed_cache = SelectionCache::new(self.cache.capacity());
        Ok(())
    }

    /// The same handle under `policy`. Fails when a rule names no kernel of the catalog, or
    /// (strict plan mode) when the plan was solved under another policy.
    pub fn with_policy(self, policy: Policy) -> Result<LayerZero> {
        self.rebuilt(Some(Arc::new(policy)))
    }

    /// Loads a dispatch table. `Off` ignores it. A table whose schema version, hardware,
    /// capabilities or policy does not match is refused with the matching reason: in
    /// `Strict` mode as an error, in `Prefer` mode recorded (every live selection then
    /// carries the reason) while the handle selects live. Each entry is re-judged here, so a
    /// table can never run an ineligible kernel.
    pub fn with_plan(mut self, table: &DispatchTable, mode: PlanMode) -> Result<LayerZero> {
        self.parts.table = Some(table.clone());
        self.parts.table_rejection = None;
        self.parts.plan_mode = mode;
        self.rebuilt(None)
    }

    /// Reads and loads a dispatch table file; an unreadable or invalid file is an error in
    /// `Strict` mode and a recorded reason otherwise.
    pub fn with_plan_file(self, path: &Path, mode: PlanMode) -> Result<LayerZero> {
        match DispatchTable::read(path) {
            Ok(table) => self.with_plan(&table, mode),
            Err(rejected) if mode == PlanMode::Strict => Err(rejected.error),
            Err(rejected) => self.with_plan_rejection(rejected.reason, mode),
        }
    }

    /// Records a table that could not be read (`Prefer`: live selection with the reason).
    pub fn with_plan_rejection(mut self, reason: Reason, mode: PlanMode) -> Result<LayerZero> {
        if mode == PlanMode::Strict {
            return Err(refused(reason));
        }
        self.parts.table = None;
        self.parts.plan_mode = mode;
        self.parts.table_rejection = (mode != PlanMode::Off).then_some(reason);
        self.rebuilt(None)
    }

    /// Scores with measured times from the PerfDB at `path` (rows for this hardware's
    /// fingerprint) and gates kernels on its parity records (see [`crate::select::parity`]).
    /// A damaged file is moved aside and rebuilt, as `lz doctor` reports.
    #[cfg(feature = "perfdb")]
    pub fn with_perfdb(mut self, path: &Path) -> Result<LayerZero> {
        let opened = crate::perfdb::PerfDb::open(path)?;
        let fingerprint = &self.parts.hardware.fingerprint;
        let rows = opened.db.rows_for(fingerprint)?;
        let m = Measurements::build(
            rows.iter().map(crate::score::measured::Measured::from),
            &self.parts.catalog,
            &self.parts.hardware,
        );
        let records = opened.db.parity_for(fingerprint)?;
        let book = crate::select::ParityBook::build(
            records.iter().map(crate::perfdb::ParityRecord::fact),
            &self.parts.catalog,
            &self.parts.hardware,
        );
        self.parts.parity = (!book.is_empty()).then(|| Arc::new(book));
        self.parts.perfdb = Some(path.to_owned());
        self.with_measurements(Arc::new(m))
    }

    /// Gates kernels on these parity records (see [`crate::select::parity`]).
    pub fn with_parity(mut self, book: Arc<crate::select::ParityBook>) -> Result<LayerZero> {
        self.parts.parity = (!book.is_empty()).then_some(book);
        self.rebuilt(None)
    }

    /// Models with `calibration`'s fitted coefficients where it has them (only when it was
    /// fitted on this handle's machine: same hardware fingerprint).
    pub fn with_calibration(mut self, calibration: Arc<crate::score::calibration::Calibration>) -> Result<LayerZero> {
        self.parts.calibration = Some(calibration);
        self.rebuilt(None)
    }

    /// The calibration the selector uses, if any.
    pub fn calibration(&self) -> Option<&crate::score::calibration::Calibration> {
        self.parts.calibration.as_deref().filter(|c| c.fingerprint == self.parts.hardware.fingerprint)
    }

    /// Scores with these measurements where they are confident.
    pub fn with_measurements(mut self, measurements: Arc<Measurements>) -> Result<LayerZero> {
        self.parts.measurements = (!measurements.is_empty()).then_some(measurements);
        self.rebuilt(None)
    }

    /// Binds `kernel_id` to `executor` and marks its backend available (where this machine
    /// has the backend's device). Fails when the catalog has no such kernel.
    pub fn register(mut self, kernel_id: &str, executor: Arc<dyn Executor>) -> Result<LayerZero> {
        if self.parts.catalog.find(kernel_id).is_none() {
            return Err(Error::invalid(format!(
                "kernel {kernel_id:?} is not in the catalog; an executor can only be registered for a declared kernel"
            )));
        }
        self.registry.register(kernel_id, executor);
        let p = &mut self.parts;
        p.availability.mark_registered(&p.catalog, &p.hardware, kernel_id);
        self.rebuilt(None)
    }

    /// Binds `kernel_id` to an executor that has not passed its self-test on this machine:
    /// as [`register`](LayerZero::register), but selection refuses the kernel
    /// (`EXECUTOR_UNVERIFIED`) unless the policy sets `allow_unverified`.
    pub fn register_unverified(self, kernel_id: &str, executor: Arc<dyn Executor>) -> Result<LayerZero> {
        let mut lz = self.register(kernel_id, executor)?;
        lz.parts.availability.mark_unverified(kernel_id);
        lz.rebuilt(None)
    }

    /// Records what the host found of an external backend it loads itself (a Python library
    /// the Python package imported, or failed to): its status, and the library and version it
    /// loaded, which kernels' `library_versions` are checked against
    /// (`BACKEND_VERSION_UNSUPPORTED`). Register the backend's executors after this.
    pub fn with_backend(
        mut self,
        backend: &str,
        status: crate::select::BackendStatus,
        library: Option<crate::select::LoadedLibrary>,
    ) -> Result<LayerZero> {
        if self.parts.catalog.backend(backend).is_none() {
            return Err(Error::invalid(format!("backend {backend:?} is not in the catalog")));
        }
        if !self.parts.availability.is_planning() {
            self.parts.availability.set(backend, status);
        }
        if let Some(lib) = library {
            self.parts.availability.set_library(backend, lib);
        }
        self.rebuilt(None)
    }

    /// The same handle with a selection cache of `slots` slots (0 disables caching).
    pub fn with_cache_capacity(mut self, slots: usize) -> LayerZero {
        self.cache = SelectionCache::new(slots);
        self.typed_cache = SelectionCache::new(slots);
        self
    }

    /// Whether dispatch scans float inputs for NaN/Inf and reports them
    /// ([`Dispatch::input_flags`]). Off by default: the scan reads every input element.
    pub fn with_input_check(mut self, on: bool) -> LayerZero {
        self.check_inputs = AtomicBool::new(on);
        self
    }

    /// Turns the NaN/Inf scan of dispatch inputs on or off on a shared handle (`lz run`
    /// scans the inputs of its first dispatch, not of every repeat).
    pub fn set_input_check(&self, on: bool) {
        self.check_inputs.store(on, Ordering::Relaxed);
    }

    /// Turns the timing of each dispatch's selection and kernel on or off
    /// ([`Dispatch::timing`]; `lz generate --profile`). Off by default: it reads the clock
    /// three times per call.
    pub fn set_dispatch_timing(&self, on: bool) {
        self.time_dispatches.store(on, Ordering::Relaxed);
    }
}
