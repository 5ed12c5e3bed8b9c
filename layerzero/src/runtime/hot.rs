//! The hot path: plan, then cache, then live selection; from a key derived once, from a
//! `Request`, or from typed arguments. A hit is served by reference: no lock, no string
//! lookup, no reference count touched.

use std::borrow::Cow;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::counters::Counter;
use super::flight::{Role, Waited};
use super::{LayerZero, PlanMode, SelectionSource};
use crate::capabilities::catalog::Catalog;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::args::OpArgs;
use crate::exec::executor::Executor;
use crate::model::device::{DeviceKind, DeviceRef};
use crate::model::problem::Problem;
use crate::model::request::Request;
use crate::plan::table::PlanKey;
use crate::plan::{Resolved, SelectionKey, typed};
use crate::reason::{Reason, ReasonCode};
use crate::select::{Passed, Selection, Selector};
use crate::telemetry;

/// A selection as served: borrowed from the plan or the cache, or made live.
/// Dereferences to the [`Selection`].
#[derive(Debug)]
pub struct Hit<'a> {
    entry: Entry<'a>,
    source: SelectionSource,
    notes: Vec<Reason>,
}

#[derive(Debug)]
enum Entry<'a> {
    /// The plan's or the cache's entry, borrowed from the handle.
    Held(&'a Resolved),
    /// Made for this call (not cached).
    Live(Resolved),
}

impl Deref for Hit<'_> {
    type Target = Selection;
    #[inline]
    fn deref(&self) -> &Selection {
        &self.resolved().selection
    }
}

impl Hit<'_> {
    /// Plan, cache or live.
    pub fn source(&self) -> SelectionSource {
        self.source
    }

    /// Why the plan did not serve it (`PLAN_BUCKET_MISS`, a refused table); empty for hits.
    pub fn notes(&self) -> &[Reason] {
        &self.notes
    }

    /// The selection, shared (one reference-count increment).
    pub fn selection(&self) -> Arc<Selection> {
        self.resolved().selection.clone()
    }

    /// The executor of the selected kernel, resolved when the entry was made.
    pub fn executor(&self) -> Option<&Arc<dyn Executor>> {
        self.resolved().executor.as_ref()
    }

    #[inline]
    pub(crate) fn resolved(&self) -> &Resolved {
        match &self.entry {
            Entry::Held(r) => r,
            Entry::Live(r) => r,
        }
    }

    pub(crate) fn into_notes(self) -> Vec<Reason> {
        self.notes
    }

    /// A fallback that ran in place of a first choice: it reports that choice's source and
    /// plan notes.
    pub(crate) fn standing_in_for(mut self, source: SelectionSource, notes: Vec<Reason>) -> Self {
        self.source = source;
        self.notes = notes;
        self
    }
}

impl LayerZero {
    /// The plan's entry, else the cache's, for a key derived once (per layer, say) and
    /// re-bucketed per call; `None` on a miss (then [`LayerZero::select_keyed`]).
    #[inline]
    pub fn lookup(&self, key: &SelectionKey) -> Option<Hit<'_>> {
        self.expire_due();
        if let Some(hit) = self.plan_hit(key) {
            return Some(hit);
        }
        let buckets = key.buckets()?;
        let hit = self
            .cache
            .get(&PlanKey { validity: key.validity, buckets }, self.salted(self.context.load(Ordering::Acquire)))?;
        self.bump(Counter::CacheHits);
        Some(Hit { entry: Entry::Held(hit), source: SelectionSource::Cache, notes: Vec::new() })
    }

    /// The plan's entry for `key`, when a plan is being served and has its bucket.
    #[inline(always)]
    fn plan_hit(&self, key: &SelectionKey) -> Option<Hit<'_>> {
        if !self.plan_on.load(Ordering::Acquire) {
            return None;
        }
        self.plan_entry(key)
    }

    /// The plan's entry for `key`, whether or not the plan is served.
    #[inline(always)]
    fn plan_entry(&self, key: &SelectionKey) -> Option<Hit<'_>> {
        let r = self.plan.as_ref()?.get(key)?;
        self.bump(Counter::PlanHits);
        Some(Hit { entry: Entry::Held(r), source: SelectionSource::Plan, notes: Vec::new() })
    }

    /// Selects for `req`: the plan, then the cache, then live selection (cached when every
    /// size of the bucket is known to get the same verdict). Errors: `InvalidInput`,
    /// `LockViolation`, `NoKernel` (with every candidate's reasons); in strict plan mode a
    /// plan miss is `NoKernel` with `PLAN_BUCKET_MISS`.
    pub fn select(&self, req: &Request) -> Result<Hit<'_>> {
        self.expire_due();
        let span = telemetry::select_span();
        let hit = self.select_keyed_untraced(&SelectionKey::derive(req), req);
        record_select(&span, &hit, || req.clone(), &self.parts.catalog);
        hit
    }

    /// The request `args` pose on this handle. Host memory is the CPU's: where the profile's
    /// primary device is a GPU (a request without a device means that GPU), tensors in host
    /// memory are pinned to the CPU, and tensors in device memory name their device.
    pub fn describe(&self, args: &OpArgs) -> Request {
        let mut req = args.describe();
        self.pin_host_memory(&mut req);
        req
    }

    /// Marks the tensors of `req` that name no device as the CPU's, where the profile's
    /// primary device is not the CPU: for a request that describes real tensors, whose
    /// memory without a device is host memory (a workload's request without a device means
    /// the primary device, and is not pinned).
    pub fn pin_host_memory(&self, req: &mut Request) {
        if self.parts.hardware.primary().kind != DeviceKind::Cpu {
            for t in req.tensors.values_mut().filter(|t| t.device.is_none()) {
                t.device = Some(DeviceRef { kind: DeviceKind::Cpu, index: None });
            }
        }
    }

    /// Selects for typed arguments without building a `Request` on a hit: the key comes
    /// from a fingerprint of the arguments (see `plan::typed`), memoized per handle.
    pub fn select_args(&self, args: &OpArgs) -> Result<Hit<'_>> {
        let span = telemetry::select_span();
        let hit = self.select_args_untraced(args);
        record_select(&span, &hit, || self.describe(args), &self.parts.catalog);
        hit
    }

    fn select_args_untraced(&self, args: &OpArgs) -> Result<Hit<'_>> {
        self.expire_due();
        let typed = typed::fingerprint(args);
        let quiet = self.quiet.load(Ordering::Acquire);
        // Keyed by the fingerprint itself (no plan to consult, no note to carry).
        let typed_key = typed.as_ref().filter(|_| quiet).and_then(|t| {
            let buckets = t.buckets()?;
            Some(PlanKey { validity: t.fingerprint, buckets })
        });
        if let Some(pk) = &typed_key
            && let Some(r) = self.typed_cache.get(pk, self.salted(self.context.load(Ordering::Acquire)))
        {
            self.bump(Counter::CacheHits);
            return Ok(Hit { entry: Entry::Held(r), source: SelectionSource::Cache, notes: Vec::new() });
        }
        if !quiet
            && let Some(t) = &typed
            && let Some(validity) = self.memo.get(t.fingerprint)
        {
            // A plan to consult or a note to carry: the full order, the request built only
            // if the selection is live.
            let key = t.key(validity);
            if let Some(hit) = self.plan_hit(&key) {
                return Ok(hit);
            }
            return self.past_the_plan(&key, || Cow::Owned(self.describe(args)));
        }
        let req = self.describe(args);
        let key = SelectionKey::derive(&req);
        if let Some(t) = &typed
            && (t.perf, t.axes, t.order) == (key.perf, key.axes, key.order)
        {
            self.memo.insert(t.fingerprint, key.validity);
        }
        let hit = self.select_keyed_untraced(&key, &req)?;
        // What the validity-keyed cache holds, the typed one may serve: same bucket, same
        // context, so the same verdict.
        if let (Some(pk), Some(buckets)) = (typed_key, key.buckets()) {
            let context = self.salted(self.live.load().context);
            if let Some(r) = self.cache.get(&PlanKey { validity: key.validity, buckets }, context) {
                self.typed_cache.insert(pk, context, r.clone());
            }
        }
        Ok(hit)
    }

    /// [`LayerZero::select`] with the key already derived.
    pub fn select_keyed(&self, key: &SelectionKey, req: &Request) -> Result<Hit<'_>> {
        self.expire_due();
        let span = telemetry::select_span();
        let hit = self.select_keyed_untraced(key, req);
        record_select(&span, &hit, || req.clone(), &self.parts.catalog);
        hit
    }

    fn select_keyed_untraced(&self, key: &SelectionKey, req: &Request) -> Result<Hit<'_>> {
        match self.plan_hit(key) {
            Some(hit) => Ok(hit),
            None => self.past_the_plan(key, || Cow::Borrowed(req)),
        }
    }

    /// After the plan had no answer: the plan-miss note (or a refused table's), then the
    /// cache, then live selection; the request is only built for a live selection.
    fn past_the_plan<'r>(&self, key: &SelectionKey, req: impl FnOnce() -> Cow<'r, Request>) -> Result<Hit<'_>> {
        let mut notes = Vec::new();
        let buckets = key.buckets();
        let live = self.live.load();
        let context = self.salted(live.context);
        // Whether the plan is served is decided again from this snapshot: the flag read
        // before may predate a policy swap, and a policy's cache must never answer for a key
        // its plan holds (a live answer where the plan's is due, cached for that policy).
        if live.plan_on
            && let Some(hit) = self.plan_entry(key)
        {
            return Ok(hit);
        }
        if self.plan.is_some() && live.plan_on {
            self.bump(Counter::PlanMisses);
            let bucket = buckets.map_or_else(|| "outside every bucket".to_owned(), |b| b.text(key.op));
            let miss = Reason::new(
                ReasonCode::PLAN_BUCKET_MISS,
                format!("the dispatch table has no entry for {} key {} bucket {bucket}", key.op, key.validity_hex()),
            );
            if self.parts.plan_mode == PlanMode::Strict {
                return Err(
                    Error::new(ErrorKind::NoKernel, format!("strict plan mode: {miss}")).with_reasons(vec![miss])
                );
            }
            notes.push(miss);
        } else if let Some(r) = &live.plan_rejection {
            notes.push(r.clone());
        }
        let pk = buckets.map(|b| PlanKey { validity: key.validity, buckets: b });
        let mut lead = None;
        if let Some(pk) = &pk {
            if let Some(hit) = self.cache.get(pk, context).or_else(|| self.cache.interned(pk, context)) {
                self.bump(Counter::CacheHits);
                return Ok(Hit { entry: Entry::Held(hit), source: SelectionSource::Cache, notes });
            }
            self.bump(Counter::CacheMisses);
            match self.flights.join(*pk, context) {
                Role::Leader(l) => {
                    // A leader that finished between our miss and our join has cached it.
                    if let Some(hit) = self.cache.get(pk, context) {
                        l.finish(hit);
                        self.bump(Counter::Shared);
                        return Ok(Hit { entry: Entry::Held(hit), source: SelectionSource::Cache, notes });
                    }
                    lead = Some(l);
                }
                Role::Waiter(flight) => match flight.wait() {
                    Waited::Answer(resolved) => {
                        self.bump(Counter::Shared);
                        return Ok(Hit { entry: Entry::Live(resolved), source: SelectionSource::Live, notes });
                    }
                    Waited::TimedOut => self.bump(Counter::WaitTimeouts),
                    Waited::Abandoned => {}
                },
            }
        }
        self.bump(Counter::Live);
        let req = req();
        // On an error `lead` drops unfinished and its waiters select for themselves.
        let mut passed = Vec::new();
        let selection = Arc::new(live.selector.select_noting(&req, Some(&mut passed))?);
        self.log_live(&req, &selection, &passed);
        let resolved = Resolved { executor: self.executor(selection.index).cloned(), selection };
        let fits = bucket_fits(key, &req, self.max_workspace, &live.selector);
        match pk {
            Some(pk) if fits && self.cache.insert(pk, context, resolved.clone()) => {}
            _ => self.bump(Counter::Uncacheable),
        }
        if let Some(lead) = lead {
            lead.finish(&resolved);
        }
        Ok(Hit { entry: Entry::Live(resolved), source: SelectionSource::Live, notes })
    }

    /// The cache context under the memory gauge's current state: a choice made while memory
    /// was plentiful is not served under pressure (and back), where the verdicts differ.
    #[inline]
    fn salted(&self, context: u64) -> u64 {
        const PRESSURE_SALT: u64 = 0x9e37_79b9_7f4a_7c15;
        let pressed =
            |g: &Option<Arc<crate::hardware::memory::MemoryGauge>>| g.as_ref().is_some_and(|g| g.under_pressure());
        if pressed(&self.parts.memory) || pressed(&self.parts.gpu_memory) { context ^ PRESSURE_SALT } else { context }
    }

    /// The selection log's record of a live selection: an event for the subscriber, a record
    /// for the handle's recent decisions.
    #[cold]
    fn log_live(&self, req: &Request, selection: &Selection, passed: &[Passed]) {
        let mut record = telemetry::SelectionRecord::of("select", req, Some(selection), &self.parts.catalog);
        record.passed_over(passed, &self.parts.catalog);
        tracing::info!(
            target: telemetry::SELECTION_TARGET,
            op = %record.op,
            kernel = %record.kernel,
            backend = %record.backend,
            source = "live",
            candidates = record.candidates,
            rejected = record.rejected,
            rejections = %record.rejections_text(),
            transform_cost_total = record.transform_cost_total,
            fused_ops = %record.fused_ops.join(","),
            shapes = %record.shapes,
            "selected"
        );
        self.recent.push(record);
    }

    /// A live selection outside plan and cache (fallback candidates, forced kernels).
    pub(crate) fn live_hit(&self, selection: Selection) -> Hit<'_> {
        let resolved = Resolved { executor: self.executor(selection.index).cloned(), selection: Arc::new(selection) };
        Hit { entry: Entry::Live(resolved), source: SelectionSource::Live, notes: Vec::new() }
    }
}

/// Fills the `lz.select` span of `hit` (nothing is computed when the span is disabled).
#[inline]
fn record_select(span: &tracing::Span, hit: &Result<Hit<'_>>, req: impl FnOnce() -> Request, catalog: &Catalog) {
    if span.is_disabled() {
        return;
    }
    let outcome = hit.as_ref().map(|h| telemetry::Selected {
        kernel: &h.kernel,
        backend: &h.backend,
        source: h.source().as_str(),
        candidates: h.candidates,
        rejected: h.rejected,
        transform_ns: h.score.transform_ns,
    });
    telemetry::record_select(span, outcome, &req(), catalog);
}

/// True when the bucket's largest request (each axis < 2x larger, so under 2^axes times
/// the bytes) still fits with every kernel's workspace and a copy of the inputs for
/// transforms: only then may a live selection be cached for the whole bucket.
fn bucket_fits(key: &SelectionKey, req: &Request, max_workspace: u64, selector: &Selector) -> bool {
    let problem = Problem::describe(req);
    let total = selector.hardware().primary().memory_bytes;
    // With a live reading, the inputs are already resident: what is left is the headroom.
    let limit = match selector.memory().and_then(|g| g.available()) {
        Some(a) => total.min(a.saturating_add(problem.input_bytes)),
        None => total,
    };
    let out = problem.output_elements().saturating_mul(problem.dtype.size_bytes());
    let growth = 1u64 << key.axes.min(crate::key::axes::MAX_AXES as u8);
    let need = problem
        .input_bytes
        .saturating_mul(2)
        .saturating_add(out)
        .saturating_mul(growth)
        .saturating_add(max_workspace)
        .saturating_add(selector.policy().memory_reserve_bytes);
    need <= limit
}
