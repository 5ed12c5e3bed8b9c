//! Selection: availability -> constraints -> transforms -> policy -> capacity -> score ->
//! pick. Pure and deterministic: same inputs, byte-identical report.

mod availability;
pub mod parity;
mod report;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use crate::score::{Score, ScoreSource};
pub use availability::{Availability, BackendStatus, LoadedLibrary};
pub use parity::{ParityBook, ParityFact, ParityVerdict};
pub use report::{CandidateReport, HardwareRef, LockRef, SelectionReport, Verdict, fused_ops};

use crate::capabilities::catalog::{Catalog, KernelIndex};
use crate::capabilities::spec::{BackendSpec, KernelSpec};
use crate::capacity;
use crate::constraint::{self, Codes, Sink};
use crate::error::{Error, ErrorKind, Result};
use crate::hardware::memory::MemoryGauge;
use crate::hardware::profile::{DeviceProfile, HardwareProfile};
use crate::key::SelectionKey;
use crate::model::device::DeviceRef;
use crate::model::problem::Problem;
use crate::model::request::Request;
use crate::policy::stage::Matched;
use crate::policy::{self, Policy, Subject, glob_match};
use crate::reason::{Reason, ReasonCode};
use crate::score;
use crate::score::calibration::Calibration;
use crate::score::measured::{Measurements, RowVerdict};
use crate::transform::{self, Transform};

/// The outcome of a successful selection: the kernel, the adaptations to apply, and the
/// arithmetic that made it win. The full account of every candidate is
/// [`Selector::explain`]; `select` formats no message on its way (DESIGN: hot path).
#[derive(Debug, Clone)]
pub struct Selection {
    /// The chosen kernel id.
    pub kernel: String,
    /// The kernel's dense index in the selector's catalog (fixed while the catalog lives):
    /// the runtime finds its executor and health by this index, never by the id string.
    pub index: KernelIndex,
    /// Its backend.
    pub backend: String,
    /// Adaptations to apply before running it.
    pub transforms: Vec<Transform>,
    /// Its score.
    pub score: Score,
    /// How many candidates the op has.
    pub candidates: usize,
    /// How many of them were not eligible (rejected by a check, or passed over by a lock).
    pub rejected: usize,
}

/// A candidate a selection passed over, and why (every code, in check order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passed {
    /// The kernel's dense index in the selector's catalog.
    pub index: KernelIndex,
    /// The codes of every check it failed.
    pub codes: Vec<ReasonCode>,
}

/// Selects kernels for requests on one machine under one policy.
#[derive(Debug, Clone)]
pub struct Selector {
    catalog: Arc<Catalog>,
    hardware: Arc<HardwareProfile>,
    policy: Arc<Policy>,
    availability: Arc<Availability>,
    policy_hash: String,
    measurements: Option<Arc<Measurements>>,
    /// Live headroom of the host's memory (CPU requests only); absent: the profile's figure.
    memory: Option<Arc<MemoryGauge>>,
    /// Live free memory of the first CUDA device, read through its driver (its requests
    /// only); absent: the profile's figure.
    gpu_memory: Option<Arc<MemoryGauge>>,
    /// This machine's fitted cost-model coefficients, if any.
    calibration: Option<Arc<Calibration>>,
    /// This machine's parity records, if any were handed in.
    parity: Option<Arc<ParityBook>>,
}

/// The backend of the reference kernels parity is measured against: right by definition,
/// never gated on parity records (nor shadow-checked against itself).
pub const REFERENCE_BACKEND: &str = "cpu_reference";

/// The reference kernel of an op: what `lz parity`, the shadow checks and `lz tune`'s
/// lead-in calls compare kernels with.
pub fn reference_kernel(op: crate::model::op::Op) -> String {
    format!("{REFERENCE_BACKEND}.{op}.naive")
}

/// One candidate's verdict, before it is written into a report.
struct Judged<S> {
    reasons: S,
    transforms: Vec<Transform>,
    score: Option<Score>,
}

/// Everything decided about a request before candidates are judged.
struct Context<'a> {
    problem: Problem,
    request_errors: Vec<Reason>,
    device_ref: DeviceRef,
    device: Option<&'a DeviceProfile>,
    rules: Matched<'a>,
    /// PerfDB rows for the request's key and bucket, by kernel.
    measured: Option<&'a BTreeMap<String, RowVerdict>>,
    /// Parity verdicts for the request's key and bucket, by kernel.
    parity: Option<&'a BTreeMap<String, ParityVerdict>>,
    /// The live headroom, read once for the whole selection, and whether it is under pressure.
    headroom: Option<(u64, bool)>,
}

impl Selector {
    /// A selector. Fails when a policy rule names no kernel of the catalog.
    pub fn new(
        catalog: Arc<Catalog>,
        hardware: Arc<HardwareProfile>,
        policy: Arc<Policy>,
        availability: Arc<Availability>,
    ) -> Result<Selector> {
        policy.check_against(&catalog)?;
        let policy_hash = policy.hash();
        Ok(Selector {
            catalog,
            hardware,
            policy,
            availability,
            policy_hash,
            measurements: None,
            memory: None,
            gpu_memory: None,
            calibration: None,
            parity: None,
        })
    }

    /// A planning selector for a named or given profile: every backend counts as installed.
    pub fn planning(catalog: Arc<Catalog>, hardware: Arc<HardwareProfile>, policy: Arc<Policy>) -> Result<Selector> {
        let availability = Arc::new(Availability::planning(&catalog));
        Selector::new(catalog, hardware, policy, availability)
    }

    /// The same selector scoring with measured times where PerfDB has confident rows.
    pub fn with_measurements(mut self, measurements: Arc<Measurements>) -> Selector {
        self.measurements = (!measurements.is_empty()).then_some(measurements);
        self
    }

    /// The same selector gating kernels on `book`'s parity records (see [`parity`]).
    pub fn with_parity(mut self, book: Arc<ParityBook>) -> Selector {
        self.parity = (!book.is_empty()).then_some(book);
        self
    }

    /// The parity records in use, if any.
    pub fn parity(&self) -> Option<&ParityBook> {
        self.parity.as_deref()
    }

    /// The same selector modeling with `calibration`'s coefficients where it has them; a
    /// calibration fitted on another machine (fingerprint) is not used.
    pub fn with_calibration(mut self, calibration: Arc<Calibration>) -> Selector {
        self.calibration = (calibration.fingerprint == self.hardware.fingerprint).then_some(calibration);
        self
    }

    /// The calibration in use, if any.
    pub fn calibration(&self) -> Option<&Calibration> {
        self.calibration.as_deref()
    }

    /// The same selector checking workspaces of CPU requests against `gauge`'s live headroom
    /// (and preferring smaller workspaces while it reads under pressure).
    pub fn with_memory(mut self, gauge: Arc<MemoryGauge>) -> Selector {
        self.memory = Some(gauge);
        self
    }

    /// The memory gauge in use, if any.
    pub fn memory(&self) -> Option<&MemoryGauge> {
        self.memory.as_deref()
    }

    /// The same selector checking workspaces of requests on the first CUDA device against
    /// `gauge`'s live free memory (read through the driver), as `with_memory` does for the
    /// CPU's.
    pub fn with_gpu_memory(mut self, gauge: Arc<MemoryGauge>) -> Selector {
        self.gpu_memory = Some(gauge);
        self
    }

    /// The measurements in use, if any.
    pub fn measurements(&self) -> Option<&Measurements> {
        self.measurements.as_deref()
    }

    /// The same selector under another policy (catalog, hardware, availability and
    /// measurements shared). Fails when a rule names no kernel of the catalog.
    pub fn with_policy(&self, policy: Arc<Policy>) -> Result<Selector> {
        policy.check_against(&self.catalog)?;
        let policy_hash = policy.hash();
        Ok(Selector { policy, policy_hash, ..self.clone() })
    }

    /// The shared parts: catalog, hardware, policy, availability, measurements.
    #[allow(clippy::type_complexity)]
    pub fn into_parts(
        self,
    ) -> (Arc<Catalog>, Arc<HardwareProfile>, Arc<Policy>, Arc<Availability>, Option<Arc<Measurements>>) {
        (self.catalog, self.hardware, self.policy, self.availability, self.measurements)
    }

    /// The catalog.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The hardware profile.
    pub fn hardware(&self) -> &HardwareProfile {
        &self.hardware
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The availability map.
    pub fn availability(&self) -> &Availability {
        &self.availability
    }

    /// The policy hash.
    pub fn policy_hash(&self) -> &str {
        &self.policy_hash
    }

    /// Selects a kernel. Errors: `InvalidInput` (the request is inconsistent), `LockViolation`
    /// (the locked kernel's reasons), `NoKernel` (every candidate's reasons). Errors carry
    /// the formatted reasons of [`Selector::explain`].
    pub fn select(&self, req: &Request) -> Result<Selection> {
        self.select_noting(req, None)
    }

    /// [`Selector::select`], noting in `passed` every candidate it passes over with the codes
    /// of every check the candidate failed (`POLICY_LOCKED_OTHER` for one a lock passed
    /// over): the selection log's rejections, gathered without a second selection.
    pub fn select_noting(&self, req: &Request, mut passed: Option<&mut Vec<Passed>>) -> Result<Selection> {
        let cx = self.context(req);
        let candidates = self.catalog.candidates(req.op);
        let mut best: Option<(usize, Judged<Codes>)> = None;
        let mut memo = Adapted::new();
        let lock = cx.rules.lock.map(|(_, r)| r.kernels.as_str());
        let mut eligible = 0;
        for (i, &ki) in candidates.iter().enumerate() {
            let (backend, kernel) = self.catalog.kernel(ki);
            if lock.is_some_and(|l| l != kernel.id) {
                if let Some(p) = passed.as_deref_mut() {
                    p.push(Passed { index: ki, codes: vec![ReasonCode::POLICY_LOCKED_OTHER] });
                }
                continue;
            }
            let j: Judged<Codes> = self.judge(backend, kernel, req, &cx, &mut memo);
            let Some(s) = &j.score else {
                if let Some(p) = passed.as_deref_mut() {
                    p.push(Passed { index: ki, codes: j.reasons.0 });
                }
                continue;
            };
            eligible += 1;
            let better = match &best {
                Some((_, b)) => b.score.as_ref().is_none_or(|bs| s.total_ns < bs.total_ns),
                None => true,
            };
            if better {
                best = Some((i, j));
            }
        }
        match best {
            Some((i, j)) => {
                let (backend, kernel) = self.catalog.kernel(candidates[i]);
                let score = j
                    .score
                    .ok_or_else(|| Error::new(ErrorKind::NoKernel, "internal: a best candidate without a score"))?;
                Ok(Selection {
                    kernel: kernel.id.clone(),
                    index: candidates[i],
                    backend: backend.backend.clone(),
                    transforms: j.transforms,
                    score,
                    candidates: candidates.len(),
                    rejected: candidates.len() - eligible,
                })
            }
            None => Err(self.failure(req)),
        }
    }

    /// Every eligible kernel for `req`, best first: the order dispatch falls back in.
    /// Errors as [`Selector::select`] when none is eligible.
    pub fn ranked(&self, req: &Request) -> Result<Vec<Selection>> {
        let cx = self.context(req);
        let candidates = self.catalog.candidates(req.op);
        let lock = cx.rules.lock.map(|(_, r)| r.kernels.as_str());
        let mut memo = Adapted::new();
        let mut out = Vec::new();
        for &ki in candidates {
            let (backend, kernel) = self.catalog.kernel(ki);
            if lock.is_some_and(|l| l != kernel.id) {
                continue;
            }
            let j: Judged<Codes> = self.judge(backend, kernel, req, &cx, &mut memo);
            if let Some(score) = j.score {
                out.push(Selection {
                    kernel: kernel.id.clone(),
                    index: ki,
                    backend: backend.backend.clone(),
                    transforms: j.transforms,
                    score,
                    candidates: candidates.len(),
                    rejected: 0,
                });
            }
        }
        if out.is_empty() {
            return Err(self.failure(req));
        }
        let rejected = candidates.len() - out.len();
        for s in &mut out {
            s.rejected = rejected;
        }
        out.sort_by(|a, b| a.score.total_ns.total_cmp(&b.score.total_ns).then_with(|| a.kernel.cmp(&b.kernel)));
        Ok(out)
    }

    /// Judges one kernel for `req` (a dispatch-table entry, a forced kernel): its selection
    /// with transforms and score when eligible, every reason when not.
    pub fn evaluate(&self, req: &Request, kernel_id: &str) -> std::result::Result<Selection, Vec<Reason>> {
        let Some(ki) = self.catalog.find(kernel_id) else {
            return Err(vec![Reason::new(
                ReasonCode::PLAN_KERNEL_INELIGIBLE,
                format!("kernel {kernel_id} is not in the catalog"),
            )]);
        };
        let (backend, kernel) = self.catalog.kernel(ki);
        if kernel.op != req.op {
            return Err(vec![Reason::new(
                ReasonCode::PLAN_KERNEL_INELIGIBLE,
                format!("kernel {kernel_id} runs {}, not {}", kernel.op, req.op),
            )]);
        }
        let cx = self.context(req);
        let mut memo = Adapted::new();
        let j: Judged<Vec<Reason>> = self.judge(backend, kernel, req, &cx, &mut memo);
        match j.score {
            Some(score) => Ok(Selection {
                kernel: kernel.id.clone(),
                index: ki,
                backend: backend.backend.clone(),
                transforms: j.transforms,
                score,
                candidates: 1,
                rejected: 0,
            }),
            None => Err(j.reasons),
        }
    }

    /// The error for a request nothing qualifies for, with every reason formatted.
    fn failure(&self, req: &Request) -> Error {
        let report = self.explain(req);
        if let Some(first) = report.request_errors.first() {
            return Error::new(ErrorKind::InvalidInput, format!("invalid request: {first}"))
                .with_reasons(report.request_errors.clone());
        }
        if let Some(lock) = &report.lock {
            let reasons = report.candidate(&lock.kernel).map(|c| c.reasons.clone()).unwrap_or_default();
            let why: Vec<String> = reasons.iter().map(|r| r.to_string()).collect();
            return Error::new(
                ErrorKind::LockViolation,
                format!("policy rule {} locks {} but it is not eligible: {}", lock.rule, lock.kernel, why.join("; ")),
            )
            .with_reasons(reasons);
        }
        let reasons: Vec<Reason> = report.candidates.iter().flat_map(|c| c.reasons.iter().cloned()).collect();
        let msg = if report.candidates.is_empty() {
            format!("no kernel is declared for op {}", req.op)
        } else {
            format!(
                "no kernel qualifies for {} on {} ({} candidates rejected; see `lz explain`)",
                req.op,
                self.hardware.name,
                report.candidates.len()
            )
        };
        Error::new(ErrorKind::NoKernel, msg).with_reasons(reasons)
    }

    /// The full report for a request: every candidate's verdict, reasons and score.
    pub fn explain(&self, req: &Request) -> SelectionReport {
        let cx = self.context(req);
        let lock = cx.rules.lock.map(|(i, r)| LockRef { kernel: r.kernels.clone(), rule: i });
        let mut candidates = Vec::with_capacity(self.catalog.candidates(req.op).len());
        let mut memo = Adapted::new();
        for &ki in self.catalog.candidates(req.op) {
            let (backend, kernel) = self.catalog.kernel(ki);
            let j: Judged<Vec<Reason>> = self.judge(backend, kernel, req, &cx, &mut memo);
            let parity = (backend.backend != REFERENCE_BACKEND)
                .then(|| parity::standing(&self.policy, cx.parity.and_then(|p| p.get(&kernel.id)), kernel))
                .flatten();
            candidates.push(CandidateReport {
                kernel: kernel.id.clone(),
                backend: backend.backend.clone(),
                verdict: if j.score.is_some() { Verdict::Eligible } else { Verdict::Rejected },
                reasons: j.reasons,
                transforms: j.transforms,
                score: j.score,
                parity,
            });
        }
        let mut best: Option<usize> = None;
        for (i, c) in candidates.iter().enumerate() {
            let Some(s) = &c.score else { continue };
            match best {
                Some(b) if candidates[b].score.as_ref().is_some_and(|bs| bs.total_ns <= s.total_ns) => {}
                _ => best = Some(i),
            }
        }
        if let Some(b) = best {
            candidates[b].verdict = Verdict::Selected;
        }
        let mut report = SelectionReport {
            request: req.clone(),
            hardware: HardwareRef { name: self.hardware.name.clone(), fingerprint: self.hardware.fingerprint.clone() },
            device: cx.device_ref.to_string(),
            mode: if self.availability.is_planning() { "planning" } else { "host" },
            capabilities_hash: self.catalog.hash().to_owned(),
            policy_hash: self.policy_hash.clone(),
            selected: best.map(|b| candidates[b].kernel.clone()),
            request_errors: cx.request_errors,
            lock,
            candidates,
            transform_cost_total: 0.0,
            fused_ops: Vec::new(),
        };
        report.summarize(&self.catalog);
        report
    }

    fn context<'a>(&'a self, req: &Request) -> Context<'a> {
        let problem = Problem::describe(req);
        let mut request_errors = problem.errors.clone();
        let (device_ref, device) = self.resolve_device(req, &mut request_errors);
        let subject = Subject { problem: &problem, hardware: &self.hardware, device: device_ref.kind };
        let rules = self.matching_rules(&subject, req);
        let point = (self.measurements.is_some() || self.parity.is_some())
            .then(|| {
                let key = SelectionKey::derive(req);
                key.buckets().map(|b| (key.validity, b.text(req.op)))
            })
            .flatten();
        let measured = self.measurements.as_deref().zip(point.as_ref()).and_then(|(m, (k, b))| m.point(*k, b));
        let parity = self.parity.as_deref().zip(point.as_ref()).and_then(|(p, (k, b))| p.point(*k, b));
        let gauge = match device_ref.kind {
            crate::model::device::DeviceKind::Cpu => self.memory.as_deref(),
            crate::model::device::DeviceKind::Cuda if device_ref.ordinal() == 0 => self.gpu_memory.as_deref(),
            _ => None,
        };
        let headroom = gauge.and_then(|g| g.available().map(|a| (a, g.under_pressure())));
        Context { problem, request_errors, device_ref, device, rules, measured, parity, headroom }
    }

    /// The device every tensor lives on; records DEVICE_MIXED.
    fn resolve_device(&self, req: &Request, errors: &mut Vec<Reason>) -> (DeviceRef, Option<&DeviceProfile>) {
        let primary = self.hardware.primary();
        let primary_ref = DeviceRef { kind: primary.kind, index: Some(0) };
        let norm =
            |d: Option<DeviceRef>| d.map_or(primary_ref, |d| DeviceRef { kind: d.kind, index: Some(d.ordinal()) });
        let mut first: Option<(&str, DeviceRef)> = None;
        for (name, t) in &req.tensors {
            let d = norm(t.device);
            match first {
                None => first = Some((name, d)),
                Some((fname, fd)) if fd != d => {
                    errors.push(Reason::new(
                        ReasonCode::DEVICE_MIXED,
                        format!(
                            "tensor `{fname}` is on {fd} but tensor `{name}` is on {d}; one request runs on one device"
                        ),
                    ));
                    break;
                }
                Some(_) => {}
            }
        }
        let d = first.map_or(primary_ref, |(_, d)| d);
        (d, self.hardware.device(Some(d)))
    }

    fn matching_rules<'p>(&'p self, subject: &Subject<'_>, req: &Request) -> Matched<'p> {
        policy::stage::matching(&self.policy, subject, |pattern| {
            self.catalog.candidates(req.op).iter().any(|&k| glob_match(pattern, &self.catalog.kernel(k).1.id))
        })
    }

    /// Runs every stage for one kernel, in the order of the data path: the request's own
    /// errors, availability, constraints with transforms, policy, capacity, then the score
    /// of a kernel nothing rejected. `S` decides whether messages are formatted.
    fn judge<S: Sink + Default>(
        &self,
        backend: &BackendSpec,
        kernel: &KernelSpec,
        req: &Request,
        cx: &Context<'_>,
        memo: &mut Adapted,
    ) -> Judged<S> {
        let mut reasons = S::default();
        for e in &cx.request_errors {
            reasons.reject(e.code(), || e.message().to_owned());
        }
        availability::judge(
            &self.availability,
            &self.hardware,
            backend,
            kernel,
            cx.device_ref,
            cx.device,
            &mut reasons,
        );
        availability::judge_verified(&self.availability, self.policy.allow_unverified, kernel, &mut reasons);
        let (transforms, adapted) = self.constraints(kernel, req, cx, memo, &mut reasons, kernel.device_kind(backend));
        policy::stage::judge(&self.policy, &cx.rules, kernel, &mut reasons);
        if backend.backend != REFERENCE_BACKEND {
            parity::judge(&self.policy, cx.parity.and_then(|p| p.get(&kernel.id)), kernel, &mut reasons);
        }
        let free = cx.device.map(|dev| {
            capacity::check(kernel, &cx.problem, &transforms, dev, &self.policy, cx.headroom.map(|h| h.0), &mut reasons)
        });
        let score = match (reasons.is_clear(), cx.device) {
            (true, Some(dev)) => {
                let (r, pb) = match adapted {
                    Some(slot) => (&memo[slot].1, &memo[slot].2),
                    None => (req, &cx.problem),
                };
                let measured = cx.measured.and_then(|m| m.get(&kernel.id));
                let mut factor = policy::stage::factor(&cx.rules, &kernel.id);
                if let (Some((_, true)), Some(free)) = (cx.headroom, free) {
                    factor *= capacity::pressure_factor(kernel, free);
                }
                let model = score::modeled(kernel, r, pb, dev, self.calibration.as_deref());
                Some(score::total(model, measured, &transforms, factor))
            }
            _ => None,
        };
        Judged { reasons, transforms, score }
    }

    /// The constraint stage, with the transform stage where it can help: every failed
    /// check, unless an allowed adaptation makes the kernel pass them all (then the
    /// transforms and the adapted request's slot). Hardware checks run only against a
    /// device of the kernel's kind.
    fn constraints<S: Sink + Default>(
        &self,
        kernel: &KernelSpec,
        req: &Request,
        cx: &Context<'_>,
        memo: &mut Adapted,
        reasons: &mut S,
        kernel_device: crate::model::device::DeviceKind,
    ) -> (Vec<Transform>, Option<usize>) {
        // Constraints are only meaningful for a consistent request.
        if !cx.request_errors.is_empty() {
            return (Vec::new(), None);
        }
        let own_device = cx.device.filter(|d| d.kind == kernel_device);
        let mut found = S::default();
        constraint::check(kernel, req, &cx.problem, own_device, &mut found);
        let mut transforms = Vec::new();
        let mut adapted = None;
        if let Some(dev) = own_device
            && self.policy.allow_adaptation
            && found.all_in(transform::ADAPTABLE)
            && let Some(planned) = transform::plan(kernel, req, &cx.problem, dev)
        {
            let slot = adapted_index(memo, req, &planned);
            let (_, adapted_req, adapted_problem) = &memo[slot];
            let mut recheck = Codes::default();
            constraint::check(kernel, adapted_req, adapted_problem, Some(dev), &mut recheck);
            if recheck.is_clear() {
                found = S::default();
                if self.policy.strict_mode {
                    found.reject(ReasonCode::TRANSFORM_REJECTED_STRICT, || {
                        let what: Vec<String> = planned
                            .iter()
                            .map(|t| format!("{} {} {}->{}", t.kind.as_str(), t.tensor, t.from, t.to))
                            .collect();
                        format!("needs {} and strict_mode forbids implicit transforms", what.join(", "))
                    });
                }
                transforms = planned;
                adapted = Some(slot);
            }
        }
        reasons.append(found);
        (transforms, adapted)
    }
}

/// Adapted requests of one selection, by the transforms that made them: kernels that need
/// the same adaptation share one adapted request and its problem.
type Adapted = Vec<(Vec<Transform>, Request, Problem)>;

fn adapted_index(memo: &mut Adapted, req: &Request, planned: &[Transform]) -> usize {
    if let Some(i) = memo.iter().position(|(t, _, _)| t.as_slice() == planned) {
        return i;
    }
    let adapted = transform::apply(req, planned);
    let problem = Problem::describe(&adapted);
    memo.push((planned.to_vec(), adapted, problem));
    memo.len() - 1
}
