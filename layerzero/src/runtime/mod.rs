//! The front door: [`LayerZero`], one handle that owns the catalog, the hardware, the
//! policy, availability, executors, the plan, the caches, health and counters; it selects,
//! explains and dispatches.
//!
//! Threads share one handle (`Arc<LayerZero>` or the process-wide one behind
//! [`crate::select()`]). The hot path — a plan or cache hit, from a `Request` key or typed
//! arguments — takes no lock, looks nothing up by string and writes only thread-owned
//! counters. The policy can be swapped on a shared handle ([`LayerZero::set_policy`]); a
//! choice made under the old policy is never served after the swap returns.
//!
//! Here: the handle and what it reads. Building it: `build.rs`; its policy while serving:
//! `policy.rs`; selection's hot path: `hot.rs` (concurrent misses: `flight.rs`); running a
//! kernel with fallback, health and faults: `dispatch.rs`, `deadline.rs`, `faults.rs`; a model's
//! scope: `scope.rs`; JIT warm-up: `warmup.rs`; the policy file watcher: `watch.rs`.

mod build;
mod counters;
mod deadline;
mod dispatch;
pub mod faults;
mod flight;
mod fusion;
mod hot;
mod plugins;
mod policy;
mod scope;
pub(crate) mod shadow;
mod warmup;
mod watch;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use serde::Serialize;

pub use crate::plan::PlanMode;
pub use counters::Counters;
use counters::{Counter, Striped};
pub use dispatch::{Attempt, Dispatch, InputFlag, Timing};
pub use fusion::RopeAttention;
pub use hot::Hit;
pub use scope::Scope;
pub use shadow::{Checked, MIN_COSINE, ShadowStats};
pub use warmup::{WarmError, WarmItem, WarmPoint, WarmVerify, WarmupReport, compilations};
pub use watch::PolicyWatch;

use crate::capabilities::catalog::{Catalog, KernelIndex};
use crate::error::{Error, ErrorKind};
use crate::exec::executor::{Executor, Registry};
use crate::hardware::profile::HardwareProfile;
use crate::health::{Health, HealthReport};
use crate::knobs::Settings;
use crate::plan::typed::KeyMemo;
use crate::plan::{DispatchTable, Plan, SelectionCache, cache};
use crate::policy::Policy;
use crate::reason::Reason;
use crate::score::measured::Measurements;
use crate::select::{Availability, SelectionReport, Selector, Verdict};

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
    /// A parity record learned while serving refuses a kernel the table names: the plan is
    /// not served again by this handle (a table is re-judged entry by entry at load).
    parity_refusal: Option<Reason>,
}

/// The parts a handle is built from; builder methods change them and rebuild.
#[derive(Debug, Clone)]
struct Parts {
    catalog: Arc<Catalog>,
    hardware: Arc<HardwareProfile>,
    availability: Availability,
    measurements: Option<Arc<Measurements>>,
    /// This machine's parity records, if loaded (the parity gate of selection).
    parity: Option<Arc<crate::select::ParityBook>>,
    /// The PerfDB they came from: a shadow check's failing record is written there.
    perfdb: Option<std::path::PathBuf>,
    /// This machine's cost-model calibration, if loaded.
    calibration: Option<Arc<crate::score::calibration::Calibration>>,
    table: Option<DispatchTable>,
    /// Why the configured table could not even be read.
    table_rejection: Option<Reason>,
    plan_mode: PlanMode,
    /// Live headroom of the host's memory (host handles; planning handles have none).
    memory: Option<Arc<crate::hardware::memory::MemoryGauge>>,
    /// Live free memory of the first CUDA device (requests on it only).
    gpu_memory: Option<Arc<crate::hardware::memory::MemoryGauge>>,
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
    /// Shadow checks: which calls are due, what they found and cost.
    shadow: shadow::Shadow,
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
    /// Whether dispatch times its selection and its kernel ([`Dispatch::timing`]).
    time_dispatches: AtomicBool,
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
    let mut context =
        cache::context(&selector.hardware().fingerprint, selector.catalog().hash(), selector.policy_hash());
    // Parity records refuse kernels: a choice cached before a record must not outlive it.
    if let Some(book) = selector.parity() {
        let d = blake3::hash(book.digest().as_bytes());
        let mut w = [0u8; 8];
        w.copy_from_slice(&d.as_bytes()[..8]);
        context ^= u64::from_le_bytes(w);
    }
    scope.map_or(context, |s| context ^ s.salt())
}

fn refused(reason: Reason) -> Error {
    Error::new(ErrorKind::InvalidInput, format!("dispatch table refused: {reason}")).with_reasons(vec![reason])
}
