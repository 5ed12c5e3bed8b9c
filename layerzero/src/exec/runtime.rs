//! The runtime: select, apply the planned transforms, execute, fall back when a kernel
//! fails, and say so. A kernel that errors or panics never takes the process down.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::args::{OpArgs, Outputs};
use super::executor::{KernelError, Registry, panic_text};
use crate::error::{Error, ErrorKind, Result};
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::problem::Problem;
use crate::model::request::Request;
use crate::plan::table::PlanKey;
use crate::plan::{DispatchTable, Plan, SelectionCache, SelectionKey, axes, cache};
use crate::policy::Policy;
use crate::reason::{Reason, ReasonCode};
use crate::score;
use crate::select::{Selection, Selector};
use crate::tensor::HostTensor;
use crate::transform::{Transform, TransformKind};

/// Consecutive failures after which a kernel's circuit opens.
pub const BREAKER_THRESHOLD: u32 = 3;
/// How long an open circuit stays open before one trial call.
pub const BREAKER_COOLDOWN: Duration = Duration::from_secs(30);

/// What happened to one kernel during a dispatch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    /// Kernel id.
    pub kernel: String,
    /// True when it produced the outputs.
    pub ok: bool,
    /// Why it did not (absent when ok).
    pub reason: Option<Reason>,
}

/// A float input containing NaN or Inf: computed anyway, flagged.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InputFlag {
    /// Tensor name.
    pub tensor: String,
    /// NaN count.
    pub nan: usize,
    /// Inf count.
    pub inf: usize,
}

/// Default number of selection-cache slots (`LAYERZERO_CACHE_CAPACITY`).
pub const DEFAULT_CACHE_CAPACITY: usize = 4096;

/// How a runtime uses a dispatch table (`LAYERZERO_PLAN_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanMode {
    /// Tables are not used.
    Off,
    /// A table serves what it has; a mismatched table or a miss selects live, with a reason.
    #[default]
    Prefer,
    /// A mismatched table is refused at load and a miss is an error.
    Strict,
}

impl std::str::FromStr for PlanMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<PlanMode, String> {
        match s {
            "off" => Ok(PlanMode::Off),
            "prefer" => Ok(PlanMode::Prefer),
            "strict" => Ok(PlanMode::Strict),
            other => Err(format!("plan mode {other:?} is not one of off, prefer, strict")),
        }
    }
}

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

/// A selection and how it was found.
#[derive(Debug, Clone)]
pub struct Chosen {
    /// The selection.
    pub selection: Arc<Selection>,
    /// Plan, cache or live.
    pub source: SelectionSource,
    /// Why it was not served by the plan (`PLAN_BUCKET_MISS`, a table mismatch).
    pub notes: Vec<Reason>,
}

/// Runtime counters (a snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Counters {
    /// Selections served by the dispatch table.
    pub plan_hits: u64,
    /// Lookups the table had no entry for (`PLAN_BUCKET_MISS`).
    pub plan_misses: u64,
    /// Selections served by the cache.
    pub cache_hits: u64,
    /// Cache lookups that missed.
    pub cache_misses: u64,
    /// Live selections not cached (a size outside the buckets, or near the memory limit).
    pub uncacheable: u64,
    /// Live selections.
    pub live: u64,
    /// Dispatches where the first choice did not run.
    pub fallbacks: u64,
}

#[derive(Debug, Default)]
struct AtomicCounters {
    plan_hits: AtomicU64,
    plan_misses: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    uncacheable: AtomicU64,
    live: AtomicU64,
    fallbacks: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The result of a dispatch.
#[derive(Debug, Clone)]
pub struct Dispatch {
    /// Named outputs.
    pub outputs: Outputs,
    /// The selection that produced them.
    pub selection: Arc<Selection>,
    /// Where the first choice came from.
    pub source: SelectionSource,
    /// Plan notes (`PLAN_BUCKET_MISS`, a rejected table).
    pub notes: Vec<Reason>,
    /// Every kernel tried, in order (the last one succeeded).
    pub attempts: Vec<Attempt>,
    /// Inputs with NaN/Inf.
    pub input_flags: Vec<InputFlag>,
}

impl Dispatch {
    /// True when the first choice did not run.
    pub fn fell_back(&self) -> bool {
        self.attempts.len() > 1
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Health {
    consecutive_failures: u32,
    opened_at: Option<Instant>,
}

/// Selection plus execution.
#[derive(Debug)]
pub struct Runtime {
    selector: Selector,
    registry: Registry,
    health: Mutex<BTreeMap<String, Health>>,
    plan: Option<Plan>,
    plan_mode: PlanMode,
    /// Why the last table given was not loaded (served as a note on every live selection).
    plan_rejection: Option<Reason>,
    cache: SelectionCache,
    context: u64,
    max_workspace: u64,
    counters: AtomicCounters,
}

impl Runtime {
    /// A runtime over a selector and the executors it may run, with a selection cache of
    /// [`DEFAULT_CACHE_CAPACITY`] slots and no plan.
    pub fn new(selector: Selector, registry: Registry) -> Runtime {
        let context = context_of(&selector);
        let max_workspace =
            selector.catalog().kernels().map(|(_, _, k)| k.properties.workspace_bytes).max().unwrap_or(0);
        Runtime {
            selector,
            registry,
            health: Mutex::new(BTreeMap::new()),
            plan: None,
            plan_mode: PlanMode::Prefer,
            plan_rejection: None,
            cache: SelectionCache::new(DEFAULT_CACHE_CAPACITY),
            context,
            max_workspace,
            counters: AtomicCounters::default(),
        }
    }

    /// The same runtime with a cache of `slots` slots (0 disables caching).
    pub fn with_cache_capacity(mut self, slots: usize) -> Runtime {
        self.cache = SelectionCache::new(slots);
        self
    }

    /// Loads a dispatch table. `Off` ignores it. A table whose schema version, hardware,
    /// capabilities or policy does not match is refused with the matching reason: in
    /// `Strict` mode as an error, in `Prefer` mode recorded (every live selection then
    /// carries the reason) while the runtime selects live.
    pub fn with_plan(mut self, table: &DispatchTable, mode: PlanMode) -> Result<Runtime> {
        self.plan_mode = mode;
        self.plan = None;
        self.plan_rejection = None;
        if mode == PlanMode::Off {
            return Ok(self);
        }
        match Plan::new(table, &self.selector) {
            Ok(plan) => self.plan = Some(plan),
            Err(reason) if mode == PlanMode::Strict => {
                return Err(Error::new(ErrorKind::InvalidInput, format!("dispatch table refused: {reason}"))
                    .with_reasons(vec![reason]));
            }
            Err(reason) => self.plan_rejection = Some(reason),
        }
        Ok(self)
    }

    /// Records a table that could not be read (Prefer mode: live selection with the reason).
    pub fn with_plan_rejection(mut self, reason: Reason, mode: PlanMode) -> Result<Runtime> {
        self.plan_mode = mode;
        self.plan = None;
        if mode == PlanMode::Strict {
            return Err(Error::new(ErrorKind::InvalidInput, format!("dispatch table refused: {reason}"))
                .with_reasons(vec![reason]));
        }
        self.plan_rejection = (mode != PlanMode::Off).then_some(reason);
        Ok(self)
    }

    /// Replaces the policy. Cached selections made under the old policy can never be served
    /// again (the cache context changes); a loaded plan made under another policy is dropped
    /// with `PLAN_POLICY_MISMATCH` (an error in `Strict` mode).
    pub fn set_policy(&mut self, policy: Arc<Policy>) -> Result<()> {
        let selector = self.selector.with_policy(policy)?;
        if let Some(plan) = &self.plan
            && plan.header().policy_hash != selector.policy_hash()
        {
            let reason = Reason::new(
                ReasonCode::PLAN_POLICY_MISMATCH,
                format!(
                    "the table was solved under policy {}; the new policy is {}",
                    &plan.header().policy_hash,
                    selector.policy_hash()
                ),
            );
            if self.plan_mode == PlanMode::Strict {
                return Err(Error::new(ErrorKind::InvalidInput, format!("dispatch table refused: {reason}"))
                    .with_reasons(vec![reason]));
            }
            self.plan = None;
            self.plan_rejection = Some(reason);
        }
        self.context = context_of(&selector);
        self.selector = selector;
        Ok(())
    }

    /// The loaded plan.
    pub fn plan(&self) -> Option<&Plan> {
        self.plan.as_ref()
    }

    /// Why the last table was refused.
    pub fn plan_rejection(&self) -> Option<&Reason> {
        self.plan_rejection.as_ref()
    }

    /// The selection cache.
    pub fn cache(&self) -> &SelectionCache {
        &self.cache
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counters {
            plan_hits: g(&c.plan_hits),
            plan_misses: g(&c.plan_misses),
            cache_hits: g(&c.cache_hits),
            cache_misses: g(&c.cache_misses),
            uncacheable: g(&c.uncacheable),
            live: g(&c.live),
            fallbacks: g(&c.fallbacks),
        }
    }

    /// The hot path without live selection: the plan's entry, else the cache's, for a key
    /// derived once (e.g. per layer) and re-bucketed per call.
    #[inline]
    pub fn lookup(&self, key: &SelectionKey) -> Option<(Arc<Selection>, SelectionSource)> {
        if let Some(plan) = &self.plan
            && let Some(s) = plan.get(key)
        {
            bump(&self.counters.plan_hits);
            return Some((s.clone(), SelectionSource::Plan));
        }
        let buckets = key.buckets()?;
        let hit = self.cache.get(&PlanKey { validity: key.validity, buckets }, self.context)?;
        bump(&self.counters.cache_hits);
        Some((hit, SelectionSource::Cache))
    }

    /// Selects for `req`: the plan, then the cache, then live selection (cached when every
    /// size of the bucket is known to give the same verdict).
    pub fn select(&self, req: &Request) -> Result<Chosen> {
        self.select_keyed(&SelectionKey::derive(req), req)
    }

    /// [`Runtime::select`] with the key already derived.
    pub fn select_keyed(&self, key: &SelectionKey, req: &Request) -> Result<Chosen> {
        let mut notes = Vec::new();
        let buckets = key.buckets();
        if let Some(plan) = &self.plan {
            if let Some(s) = plan.get(key) {
                bump(&self.counters.plan_hits);
                return Ok(Chosen { selection: s.clone(), source: SelectionSource::Plan, notes });
            }
            bump(&self.counters.plan_misses);
            let bucket = buckets.map_or_else(|| "outside every bucket".to_owned(), |b| b.text(key.op));
            let miss = Reason::new(
                ReasonCode::PLAN_BUCKET_MISS,
                format!("the dispatch table has no entry for {} key {} bucket {bucket}", key.op, key.validity_hex()),
            );
            if self.plan_mode == PlanMode::Strict {
                return Err(
                    Error::new(ErrorKind::NoKernel, format!("strict plan mode: {miss}")).with_reasons(vec![miss])
                );
            }
            notes.push(miss);
        } else if let Some(r) = &self.plan_rejection {
            notes.push(r.clone());
        }
        let pk = buckets.map(|b| PlanKey { validity: key.validity, buckets: b });
        if let Some(pk) = &pk {
            if let Some(hit) = self.cache.get(pk, self.context) {
                bump(&self.counters.cache_hits);
                return Ok(Chosen { selection: hit, source: SelectionSource::Cache, notes });
            }
            bump(&self.counters.cache_misses);
        }
        bump(&self.counters.live);
        let selection = Arc::new(self.selector.select(req)?);
        match pk {
            Some(pk) if self.bucket_fits_memory(key, req) => self.cache.insert(pk, self.context, selection.clone()),
            _ => bump(&self.counters.uncacheable),
        }
        Ok(Chosen { selection, source: SelectionSource::Live, notes })
    }

    /// The one check the key does not capture is the memory headroom, which grows with the
    /// sizes: a bucket is cached only when its largest request (each axis < 2x larger, so
    /// under 2^axes times the bytes) fits with every kernel's workspace and a copy of the
    /// inputs for transforms.
    fn bucket_fits_memory(&self, key: &SelectionKey, req: &Request) -> bool {
        let problem = Problem::describe(req);
        let out = score::output_elements(&problem).saturating_mul(problem.dtype.size_bytes());
        let growth = 1u64 << key.axes.min(axes::MAX_AXES as u8);
        let need = problem
            .input_bytes
            .saturating_mul(2)
            .saturating_add(out)
            .saturating_mul(growth)
            .saturating_add(self.max_workspace)
            .saturating_add(self.selector.policy().memory_reserve_bytes);
        need <= self.selector.hardware().primary().memory_bytes
    }

    /// The selector.
    pub fn selector(&self) -> &Selector {
        &self.selector
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Selects for `args`, runs the best eligible kernel, and falls back to the next one
    /// (in score order) when a kernel has no executor, its circuit is open, or it fails.
    pub fn dispatch(&self, args: &OpArgs) -> Result<Dispatch> {
        let request = args.describe();
        let chosen = self.select(&request)?;
        let input_flags = flags(args);
        let mut attempts: Vec<Attempt> = Vec::new();
        let first = chosen.selection.clone();
        let mut rest: Option<std::vec::IntoIter<Selection>> = None;
        loop {
            let sel: Arc<Selection> = if attempts.is_empty() {
                first.clone()
            } else {
                if rest.is_none() {
                    bump(&self.counters.fallbacks);
                    rest = Some(self.selector.ranked(&request)?.into_iter());
                }
                let tried = |k: &str| attempts.iter().any(|a| a.kernel == k);
                match rest.as_mut().and_then(|r| r.find(|s| !tried(&s.kernel))) {
                    Some(s) => Arc::new(s),
                    None => break,
                }
            };
            match self.try_run(&sel, args) {
                Ok(outputs) => {
                    attempts.push(Attempt { kernel: sel.kernel.clone(), ok: true, reason: None });
                    return Ok(Dispatch {
                        outputs,
                        selection: sel,
                        source: chosen.source,
                        notes: chosen.notes,
                        attempts,
                        input_flags,
                    });
                }
                Err(reason) => {
                    let invalid = reason.code() == ReasonCode::INVALID_REQUEST;
                    attempts.push(Attempt { kernel: sel.kernel.clone(), ok: false, reason: Some(reason.clone()) });
                    if invalid {
                        // The inputs are wrong for every kernel: falling back would only repeat it.
                        return Err(
                            Error::new(ErrorKind::InvalidInput, reason.message().to_owned()).with_reasons(vec![reason])
                        );
                    }
                }
            }
        }
        let reasons: Vec<Reason> = attempts.iter().filter_map(|a| a.reason.clone()).collect();
        let tried: Vec<String> = attempts.iter().map(|a| a.kernel.clone()).collect();
        Err(Error::new(ErrorKind::NoKernel, format!("every eligible kernel failed: {}", tried.join(", ")))
            .with_reasons(reasons))
    }

    /// Runs one selected kernel (transforms included), with the breaker and panic guard.
    pub fn run_selection(&self, sel: &Selection, args: &OpArgs) -> Result<Outputs> {
        self.try_run(sel, args).map_err(|r| {
            let kind =
                if r.code() == ReasonCode::INVALID_REQUEST { ErrorKind::InvalidInput } else { ErrorKind::NoKernel };
            Error::new(kind, r.to_string()).with_reasons(vec![r])
        })
    }

    fn try_run(&self, sel: &Selection, args: &OpArgs) -> std::result::Result<Outputs, Reason> {
        let Some(exec) = self.registry.get(&sel.kernel) else {
            return Err(Reason::new(
                ReasonCode::EXECUTOR_NOT_REGISTERED,
                format!("no executor is registered for {} in this process", sel.kernel),
            ));
        };
        if let Some(open) = self.circuit_open(&sel.kernel) {
            return Err(Reason::new(
                ReasonCode::BACKEND_UNHEALTHY,
                format!(
                    "{} failed {BREAKER_THRESHOLD} times in a row; its circuit is open for {}s more",
                    sel.kernel,
                    open.as_secs()
                ),
            ));
        }
        let adapted = apply_transforms(args, &sel.transforms)
            .map_err(|e| Reason::new(ReasonCode::KERNEL_FAILED, format!("transform before {}: {e}", sel.kernel)))?;
        let result = catch_unwind(AssertUnwindSafe(|| exec.run(&adapted)));
        let outcome = match result {
            Ok(Ok(outputs)) => cast_outputs_back(outputs, &sel.transforms)
                .map_err(|e| Reason::new(ReasonCode::KERNEL_FAILED, format!("{}: output cast: {e}", sel.kernel))),
            Ok(Err(KernelError::InvalidInput(m))) => {
                return Err(Reason::new(ReasonCode::INVALID_REQUEST, format!("{}: {m}", sel.kernel)));
            }
            Ok(Err(e)) => Err(Reason::new(ReasonCode::KERNEL_FAILED, format!("{}: {e}", sel.kernel))),
            Err(payload) => {
                let msg = panic_text(payload.as_ref());
                Err(Reason::new(ReasonCode::KERNEL_FAILED, format!("{} panicked: {msg}", sel.kernel)))
            }
        };
        self.record(&sel.kernel, outcome.is_ok());
        outcome
    }

    fn circuit_open(&self, kernel: &str) -> Option<Duration> {
        let health = self.health.lock().unwrap_or_else(|p| p.into_inner());
        let h = health.get(kernel)?;
        let opened = h.opened_at?;
        let elapsed = opened.elapsed();
        // After the cooldown one trial call goes through (half-open).
        if elapsed >= BREAKER_COOLDOWN { None } else { Some(BREAKER_COOLDOWN - elapsed) }
    }

    fn record(&self, kernel: &str, ok: bool) {
        let mut health = self.health.lock().unwrap_or_else(|p| p.into_inner());
        let h = health.entry(kernel.to_owned()).or_default();
        if ok {
            *h = Health::default();
        } else {
            h.consecutive_failures += 1;
            if h.consecutive_failures >= BREAKER_THRESHOLD {
                h.opened_at = Some(Instant::now());
            }
        }
    }

    /// Kernels whose circuit is open now.
    pub fn open_circuits(&self) -> Vec<String> {
        let health = self.health.lock().unwrap_or_else(|p| p.into_inner());
        health
            .iter()
            .filter(|(_, h)| h.opened_at.is_some_and(|t| t.elapsed() < BREAKER_COOLDOWN))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

fn context_of(selector: &Selector) -> u64 {
    cache::context(&selector.hardware().fingerprint, selector.catalog().hash(), selector.policy_hash())
}

fn flags(args: &OpArgs) -> Vec<InputFlag> {
    args.tensors()
        .into_iter()
        .filter_map(|(name, t)| {
            let (nan, inf) = t.non_finite();
            (nan + inf > 0).then(|| InputFlag { tensor: name.to_owned(), nan, inf })
        })
        .collect()
}

/// Applies the input transforms a selection planned.
pub fn apply_transforms(args: &OpArgs, transforms: &[Transform]) -> Result<OpArgs> {
    if transforms.is_empty() {
        return Ok(args.clone());
    }
    args.map_tensors(|name, t| {
        let mut t = t.clone();
        for tr in transforms.iter().filter(|tr| tr.tensor == name) {
            t = match tr.kind {
                TransformKind::Transpose => {
                    let to = if tr.to == Layout::Bhsd.as_str() { Layout::Bhsd } else { Layout::Bshd };
                    t.permute(&[0, 2, 1, 3])?.contiguous().with_layout(to)
                }
                TransformKind::MakeContiguous => {
                    let l = t.layout();
                    let c = t.contiguous();
                    match l {
                        Some(l) => c.with_layout(l),
                        None => c,
                    }
                }
                TransformKind::Cast => cast(&t, tr.to)?,
            };
        }
        Ok(t)
    })
}

fn cast(t: &HostTensor, to: &str) -> Result<HostTensor> {
    let d: DType = to.parse().map_err(Error::invalid)?;
    let c = HostTensor::from_f32_as(d, t.shape(), &t.to_f32_vec())?;
    Ok(match t.layout() {
        Some(l) => c.with_layout(l),
        None => c,
    })
}

fn cast_outputs_back(mut outputs: Outputs, transforms: &[Transform]) -> Result<Outputs> {
    if let Some(tr) = transforms.iter().find(|t| t.kind == TransformKind::Cast && t.tensor == "out") {
        for t in outputs.values_mut() {
            if t.dtype().is_float() {
                *t = cast(t, tr.to)?;
            }
        }
    }
    Ok(outputs)
}
