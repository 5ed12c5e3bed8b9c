//! The front door: [`LayerZero`], one handle that owns the catalog, the hardware, the
//! policy, availability, executors, the plan, the caches, health and counters; it selects,
//! explains and dispatches.
//!
//! Threads share one handle (`Arc<LayerZero>` or the process-wide one behind
//! [`crate::select()`]). The hot path — a plan or cache hit, from a `Request` key or typed
//! arguments — takes no lock, looks nothing up by string and writes only thread-owned
//! counters. The policy can be swapped on a shared handle ([`LayerZero::set_policy`]); a
//! choice made under the old policy is never served after the swap returns.

mod counters;
mod deadline;
mod dispatch;
pub mod faults;
mod flight;
mod hot;
mod scope;
mod warmup;
mod watch;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use serde::Serialize;

pub use crate::plan::PlanMode;
pub use counters::Counters;
use counters::{Counter, Striped};
pub use dispatch::{Attempt, Dispatch, InputFlag};
pub use hot::Hit;
pub use scope::Scope;
pub use warmup::{WarmError, WarmItem, WarmPoint, WarmVerify, WarmupReport, compilations};
pub use watch::PolicyWatch;

use crate::capabilities::catalog::{Catalog, KernelIndex};
use crate::error::{Error, ErrorKind, Result};
use crate::exec::executor::{Executor, Registry};
use crate::hardware::named;
use crate::hardware::profile::HardwareProfile;
use crate::health::{Health, HealthConfig, HealthReport};
use crate::host::detect;
use crate::knobs::Settings;
use crate::plan::typed::KeyMemo;
use crate::plan::{DispatchTable, Plan, SelectionCache, cache};
use crate::policy::{Overrides, Policy};
use crate::reason::{Reason, ReasonCode};
use crate::score::calibration::Calibration;
use crate::score::measured::Measurements;
use crate::select::{Availability, Selection, SelectionReport, Selector, Verdict};

/// Decisions kept for [`LayerZero::recent_decisions`].
pub const RECENT_DECISIONS: usize = 256;
/// Slots of the typed-argument key memo.
const MEMO_SLOTS: usize = 1024;

/// Where a selection came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectionSource {
    /// The loaded dispatch table.
    Plan,
    /// The selection cache.
    Cache,
    /// Live selection.
    Live,
}

impl SelectionSource {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            SelectionSource::Plan => "plan",
            SelectionSource::Cache => "cache",
            SelectionSource::Live => "live",
        }
    }
}

/// What changes when the policy changes: swapped as one value.
#[derive(Debug)]
struct Live {
    /// The policy as set, time-boxed rules included; the selector holds the part of it in
    /// force (`Policy::in_force_at`).
    declared: Arc<Policy>,
    selector: Arc<Selector>,
    context: u64,
    /// Why the plan is not served (a refused table, a policy it was not solved under).
    plan_rejection: Option<Reason>,
    /// The plan is served under this policy (what `LayerZero::plan_on` mirrors).
    plan_on: bool,
}

/// The parts a handle is built from; builder methods change them and rebuild.
#[derive(Debug, Clone)]
struct Parts {
    catalog: Arc<Catalog>,
    hardware: Arc<HardwareProfile>,
    availability: Availability,
    measurements: Option<Arc<Measurements>>,
    /// This machine's cost-model calibration, if loaded.
    calibration: Option<Arc<crate::score::calibration::Calibration>>,
    table: Option<DispatchTable>,
    /// Why the configured table could not even be read.
    table_rejection: Option<Reason>,
    plan_mode: PlanMode,
    /// Live headroom of the host's memory (host handles; planning handles have none).
    memory: Option<Arc<crate::hardware::memory::MemoryGauge>>,
    /// The model this handle serves, when it is a model's scope ([`LayerZero::scoped`]).
    scope: Option<Arc<Scope>>,
    /// The knobs it was configured with.
    settings: Arc<Settings>,
}

/// LayerZero: selection, explanation and dispatch on one machine under one policy.
///
/// ```
/// use layerzero::prelude::*;
///
/// // Plan for an H100 from any machine: every backend counts as installed.
/// let lz = LayerZero::planning("h100")?;
/// let request = Request::from_json(r#"{"op": "attention",
///     "tensors": {"q": {"dtype": "bf16", "shape": [1, 4096, 32, 128], "layout": "BSHD"},
///                 "k": {"dtype": "bf16", "shape": [1, 4096, 8, 128], "layout": "BSHD"},
///                 "v": {"dtype": "bf16", "shape": [1, 4096, 8, 128], "layout": "BSHD"}},
///     "attrs": {"causal": true, "dropout_p": 0.1}}"#)?;
/// let selection = lz.select(&request)?;
/// // FlashAttention-3 has no dropout, so it cannot be the answer; the report says why.
/// assert_ne!(selection.kernel, "flash_attn_3.attention.fwd");
/// let report = lz.explain(&request);
/// let fa3 = report.candidate("flash_attn_3.attention.fwd").unwrap();
/// assert_eq!(fa3.reasons[0].code(), ReasonCode::DROPOUT_UNSUPPORTED);
/// # Ok::<(), layerzero::Error>(())
/// ```
pub struct LayerZero {
    parts: Parts,
    registry: Registry,
    /// Executors by dense kernel index, fixed when the handle is built.
    executors: Box<[Option<Arc<dyn Executor>>]>,
    /// Breakers per kernel and backend, deadlines, output checks.
    health: Arc<Health>,
    /// Threads that run kernels under a deadline (started at the first such call).
    runners: OnceLock<deadline::Runners>,
    live: ArcSwap<Live>,
    /// Serializes policy swaps (readers never take it).
    swap: Mutex<()>,
    plan: Option<Plan>,
    // `plan_on`, `quiet` and `context` mirror what `live` implies, as plain atomics: the hot
    // path reads them without loading the swapped state. `set_policy` stores them after it.
    /// The plan was solved under the policy in force.
    plan_on: AtomicBool,
    /// No plan and no refused table: nothing a selection must carry as a note, so typed
    /// selection may be served by `typed_cache` without deriving the validity hash.
    quiet: AtomicBool,
    /// The cache context of the policy in force.
    context: AtomicU64,
    /// Unix seconds at which a time-boxed rule of the declared policy expires next
    /// (`i64::MAX`: none); selection entry points check it with one load.
    next_expiry: AtomicI64,
    /// Policy swaps since the handle was built (`set_policy`, reloads, expiries).
    policy_swaps: AtomicU64,
    /// Why the last policy change was refused (the old policy was kept).
    policy_error: Mutex<Option<String>>,
    cache: SelectionCache,
    /// The selection cache keyed by typed fingerprints instead of validity hashes.
    typed_cache: SelectionCache,
    memo: KeyMemo,
    /// Live selections in flight, so concurrent misses of one key select once.
    flights: flight::Flights,
    max_workspace: u64,
    check_inputs: AtomicBool,
    counters: Striped,
    /// Injected faults (`LAYERZERO_FAULTS`, `with_faults`): drills only.
    faults: Option<Arc<faults::Faults>>,
    /// The last decisions (live selections, fallbacks), for snapshots and reports.
    recent: crate::telemetry::Recent,
}

impl std::fmt::Debug for LayerZero {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerZero")
            .field("hardware", &self.parts.hardware.name)
            .field("mode", &if self.parts.availability.is_planning() { "planning" } else { "host" })
            .field("policy_hash", &self.live.load().selector.policy_hash())
            .field("plan", &self.plan.as_ref().map(Plan::len))
            .field("cache_slots", &self.cache.capacity())
            .finish()
    }
}

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
    /// `$LAYERZERO_HOME/calibration.json`) when their files exist.
    pub fn host_with(settings: Settings) -> Result<LayerZero> {
        let mut lz = LayerZero::detected()?;
        let mut policy = match &settings.policy {
            Some(path) => Policy::load(path)?,
            None => Policy::default(),
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
        match cpu_memory {
            Some(total) => lz.with_memory_gauge(crate::host::memory::gauge(total)),
            None => Ok(lz),
        }
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
        let health = Arc::new(Health::new(&catalog, HealthConfig::of(&policy)));
        let parts = Parts {
            catalog,
            hardware,
            availability,
            measurements: None,
            calibration: None,
            table: None,
            table_rejection: None,
            plan_mode: PlanMode::Prefer,
            memory: None,
            scope: None,
            settings: Arc::new(crate::host::process().clone()),
        };
        let slots = usize::try_from(*crate::knobs::CACHE_CAPACITY.default()).unwrap_or(usize::MAX);
        LayerZero::assemble(parts, registry, health, policy, slots)
    }

    /// A handle of `parts` with empty caches and counters, sharing `health`.
    fn assemble(
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
        let lz = LayerZero {
            parts,
            executors: Box::new([]),
            registry,
            health,
            runners: OnceLock::new(),
            live: ArcSwap::from_pointee(Live {
                declared: policy,
                selector: Arc::new(selector),
                context,
                plan_rejection: None,
                plan_on: false,
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
    fn rebuild(&mut self, policy: Option<Arc<Policy>>) -> Result<()> {
        let p = &self.parts;
        let declared = policy.unwrap_or_else(|| self.live.load().declared.clone());
        let now = crate::time::now_unix();
        let policy = Arc::new(declared.in_force_at(now));
        let health = HealthConfig::of(&policy);
        let mut selector =
            Selector::new(p.catalog.clone(), p.hardware.clone(), policy, Arc::new(p.availability.clone()))?;
        if let Some(m) = &p.measurements {
            selector = selector.with_measurements(m.clone());
        }
        if let Some(c) = &p.calibration {
            selector = selector.with_calibration(c.clone());
        }
        if let Some(g) = &p.memory {
            selector = selector.with_memory(g.clone());
        }
        self.health.configure(health);
        self.executors = p.catalog.kernels().map(|(_, _, k)| self.registry.get(&k.id).cloned()).collect();
        let mut rejection = p.table_rejection.clone();
        self.plan = None;
        if let (Some(table), true) = (&p.table, p.plan_mode != PlanMode::Off) {
            match scope::tokenizer_check(table, p.scope.as_deref()).and_then(|()| Plan::new(table, &selector)) {
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
    /// fingerprint). A damaged file is moved aside and rebuilt, as `lz doctor` reports.
    #[cfg(feature = "perfdb")]
    pub fn with_perfdb(self, path: &Path) -> Result<LayerZero> {
        let opened = crate::perfdb::PerfDb::open(path)?;
        let rows = opened.db.rows_for(&self.parts.hardware.fingerprint)?;
        let m = Measurements::build(
            rows.iter().map(crate::score::measured::Measured::from),
            &self.parts.catalog,
            &self.parts.hardware,
        );
        self.with_measurements(Arc::new(m))
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

    /// Replaces the policy on a shared handle. Choices cached under the old policy are never
    /// served again (the cache context changes); a plan solved under another policy stops
    /// being served with `PLAN_POLICY_MISMATCH` (an error in `Strict` mode, and the handle
    /// is unchanged), and is served again if its policy comes back.
    ///
    /// The policy is validated before anything changes: an invalid one (a rule naming no
    /// kernel, a refused plan in strict mode) is an error, recorded in
    /// [`LayerZero::policy_error`], and the old policy stays in force. Rules with an
    /// `expires_at` stop applying at that instant: the first selection after it swaps in the
    /// policy without them.
    pub fn set_policy(&self, policy: Policy) -> Result<()> {
        let result = self.swap_policy(Arc::new(policy));
        *self.policy_error.lock() = result.as_ref().err().map(ToString::to_string);
        result
    }

    fn swap_policy(&self, declared: Arc<Policy>) -> Result<()> {
        let _one_at_a_time = self.swap.lock();
        let now = crate::time::now_unix();
        let policy = declared.in_force_at(now);
        let health = HealthConfig::of(&policy);
        let selector = self.live.load().selector.with_policy(Arc::new(policy))?;
        let mut rejection = self.parts.table_rejection.clone();
        let mut plan_on = false;
        if let Some(plan) = &self.plan {
            if plan.header().policy_hash == selector.policy_hash() {
                plan_on = true;
            } else {
                let reason = Reason::new(
                    ReasonCode::PLAN_POLICY_MISMATCH,
                    format!(
                        "the table was solved under policy {}; the new policy is {}",
                        &plan.header().policy_hash,
                        selector.policy_hash()
                    ),
                );
                if self.parts.plan_mode == PlanMode::Strict {
                    return Err(refused(reason));
                }
                rejection = Some(reason);
            }
        }
        let context = context_of(&selector, self.parts.scope.as_deref());
        let quiet = self.plan.is_none() && rejection.is_none();
        let next_expiry = declared.next_expiry_after(now).unwrap_or(i64::MAX);
        self.live.store(Arc::new(Live {
            declared,
            selector: Arc::new(selector),
            context,
            plan_rejection: rejection,
            plan_on,
        }));
        self.health.configure(health);
        self.next_expiry.store(next_expiry, Ordering::Release);
        self.policy_swaps.fetch_add(1, Ordering::Relaxed);
        self.plan_on.store(plan_on, Ordering::Release);
        self.quiet.store(quiet, Ordering::Release);
        self.context.store(context, Ordering::Release);
        Ok(())
    }

    /// Reads the policy file at `path`, applies the knobs that override policy fields (of
    /// [`LayerZero::settings`]), and swaps it in. A file that cannot be read or
    /// is invalid is an error (recorded in [`LayerZero::policy_error`]); the policy in force
    /// is kept.
    pub fn reload_policy(&self, path: &Path) -> Result<()> {
        let overrides = self.parts.settings.policy_overrides();
        let loaded = Policy::load(path).map(|mut p| {
            p.apply_overrides(&overrides);
            p
        });
        match loaded {
            Ok(p) => self.set_policy(p),
            Err(e) => {
                *self.policy_error.lock() = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Watches the policy file at `path` and reloads it when its content changes, every
    /// `LAYERZERO_POLICY_POLL_MS` of [`LayerZero::settings`] (default 1 s), until the returned guard is dropped or the
    /// handle is. A reload that fails keeps the policy in force (see
    /// [`LayerZero::policy_error`]).
    pub fn watch_policy(self: &Arc<Self>, path: &Path) -> Result<PolicyWatch> {
        watch::spawn(watch::Target::Shared(Arc::downgrade(self)), path, self.parts.settings.policy_poll.0)
    }

    /// [`LayerZero::watch_policy`] for a handle that lives as long as the process (the one
    /// behind [`crate::host`]).
    pub fn watch_policy_static(&'static self, path: &Path) -> Result<PolicyWatch> {
        watch::spawn(watch::Target::Static(self), path, self.parts.settings.policy_poll.0)
    }

    /// Why the last policy change (a `set_policy`, a reload) was refused, if it was; `None`
    /// once a later change succeeds.
    pub fn policy_error(&self) -> Option<String> {
        self.policy_error.lock().clone()
    }

    pub(crate) fn note_policy_error(&self, why: String) {
        *self.policy_error.lock() = Some(why);
    }

    /// How many times the policy was swapped since the handle was built.
    pub fn policy_swaps(&self) -> u64 {
        self.policy_swaps.load(Ordering::Relaxed)
    }

    /// The policy as set, time-boxed rules included (the selector holds the part in force).
    pub fn declared_policy(&self) -> Arc<Policy> {
        self.live.load().declared.clone()
    }

    /// Selects for `req` under the policy in force with `overrides` on top (per-request
    /// rules come first, so a per-request lock wins). Always live: the selection cache holds
    /// only choices of the handle's own policy.
    pub fn select_with(&self, req: &crate::model::request::Request, overrides: &Overrides) -> Result<Selection> {
        self.expire_due();
        let selector = self.selector();
        let derived = selector.with_policy(Arc::new(overrides.apply(selector.policy())))?;
        self.bump(Counter::Live);
        derived.select(req)
    }

    /// [`LayerZero::explain`] with `overrides` on top of the policy in force.
    pub fn explain_with(&self, req: &crate::model::request::Request, overrides: &Overrides) -> Result<SelectionReport> {
        let selector = self.selector();
        Ok(selector.with_policy(Arc::new(overrides.apply(selector.policy())))?.explain(req))
    }

    /// Swaps in the declared policy again when a time-boxed rule has expired: one load on
    /// the selection path while no rule is time-boxed.
    #[inline]
    pub(crate) fn expire_due(&self) {
        let due = self.next_expiry.load(Ordering::Relaxed);
        if due != i64::MAX {
            self.expire_slow(due);
        }
    }

    #[cold]
    fn expire_slow(&self, due: i64) {
        if crate::time::now_unix() < due {
            return;
        }
        let declared = self.live.load().declared.clone();
        if let Err(e) = self.swap_policy(declared) {
            // Not retried on every call: the error stays visible until the next change.
            self.next_expiry.store(i64::MAX, Ordering::Release);
            *self.policy_error.lock() =
                Some(format!("a time-boxed rule expired, but the policy without it was refused: {e}"));
        }
    }

    /// The full report for a request: every candidate's verdict, reasons and score, with
    /// the health of this handle: a quarantined kernel (`KERNEL_QUARANTINED`) or one whose
    /// backend is disabled (`BACKEND_UNHEALTHY`) is rejected with the time left, and the
    /// best remaining candidate is the one dispatch would run.
    pub fn explain(&self, req: &crate::model::request::Request) -> SelectionReport {
        let mut report = self.live.load().selector.explain(req);
        let mut changed = false;
        for c in &mut report.candidates {
            let Some(k) = self.parts.catalog.find(&c.kernel) else { continue };
            if let Some(refusal) = self.health.refused_now(k) {
                c.reasons.push(self.health.refusal_reason(k, &refusal));
                changed |= c.verdict == Verdict::Selected;
                c.verdict = Verdict::Rejected;
            }
        }
        if changed {
            let best = report
                .candidates
                .iter()
                .enumerate()
                .filter(|(_, c)| c.verdict == Verdict::Eligible)
                .filter_map(|(i, c)| c.score.as_ref().map(|s| (i, s.total_ns)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            report.selected = best.map(|(i, _)| report.candidates[i].kernel.clone());
            if let Some((i, _)) = best {
                report.candidates[i].verdict = Verdict::Selected;
            }
            report.summarize(&self.parts.catalog);
        }
        report
    }

    /// The selector under the current policy.
    pub fn selector(&self) -> Arc<Selector> {
        self.live.load().selector.clone()
    }

    /// The catalog.
    pub fn catalog(&self) -> &Catalog {
        &self.parts.catalog
    }

    /// The hardware profile.
    pub fn hardware(&self) -> &HardwareProfile {
        &self.parts.hardware
    }

    /// The registered executors.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The loaded plan (also while a policy it was not solved under is in force).
    pub fn plan(&self) -> Option<&Plan> {
        self.plan.as_ref()
    }

    /// The dispatch table the plan was made from, as loaded.
    pub fn table(&self) -> Option<&DispatchTable> {
        self.parts.table.as_ref()
    }

    /// The plan mode.
    pub fn plan_mode(&self) -> PlanMode {
        self.parts.plan_mode
    }

    /// Why the plan is not served, if it is not.
    pub fn plan_rejection(&self) -> Option<Reason> {
        self.live.load().plan_rejection.clone()
    }

    /// The selection cache.
    pub fn cache(&self) -> &SelectionCache {
        &self.cache
    }

    /// The last decisions of this handle (at most [`RECENT_DECISIONS`]): live selections,
    /// dispatches that fell back or failed, oldest first, redacted as `LAYERZERO_REDACT` says.
    pub fn recent_decisions(&self) -> Vec<crate::telemetry::SelectionRecord> {
        self.recent.snapshot()
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        self.counters.snapshot()
    }

    /// Kernels quarantined now (their breaker is open), by id.
    pub fn open_circuits(&self) -> Vec<String> {
        self.health.quarantined().map(|(k, _)| self.parts.catalog.kernel(k).1.id.clone()).collect()
    }

    /// The health system: settings, breakers, abandoned calls.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// Every breaker with something to say, and the settings in force.
    pub fn health_report(&self) -> HealthReport {
        self.health.report()
    }

    #[inline]
    fn bump(&self, c: Counter) {
        self.counters.bump(c);
    }

    fn executor(&self, kernel: KernelIndex) -> Option<&Arc<dyn Executor>> {
        self.executors.get(kernel).and_then(Option::as_ref)
    }
}

/// The cache context: what every cached choice depends on, and, in a model's scope, the
/// model and its tokenizer (so no entry is served across models or tokenizers).
fn context_of(selector: &Selector, scope: Option<&Scope>) -> u64 {
    let context = cache::context(&selector.hardware().fingerprint, selector.catalog().hash(), selector.policy_hash());
    scope.map_or(context, |s| context ^ s.salt())
}

fn refused(reason: Reason) -> Error {
    Error::new(ErrorKind::InvalidInput, format!("dispatch table refused: {reason}")).with_reasons(vec![reason])
}
