//! Selection: availability -> constraints -> transforms -> policy -> capacity -> score ->
//! pick. Pure and deterministic: same inputs, byte-identical report.

mod availability;
mod report;

use std::sync::Arc;

pub use availability::{Availability, BackendStatus};
pub use report::{CandidateReport, HardwareRef, LockRef, Score, ScoreSource, SelectionReport, Verdict};

use crate::capabilities::catalog::Catalog;
use crate::capabilities::spec::{BackendSpec, KernelSpec};
use crate::constraint;
use crate::error::{Error, ErrorKind, Result};
use crate::hardware::profile::{DeviceProfile, HardwareProfile};
use crate::model::device::DeviceRef;
use crate::model::problem::Problem;
use crate::model::request::Request;
use crate::policy::{Action, Policy, Rule, Subject, glob_match};
use crate::reason::{Reason, ReasonCode};
use crate::score;
use crate::transform::{self, Transform};

/// The outcome of a successful selection.
#[derive(Debug, Clone)]
pub struct Selection {
    /// The chosen kernel id.
    pub kernel: String,
    /// Its backend.
    pub backend: String,
    /// Adaptations to apply before running it.
    pub transforms: Vec<Transform>,
    /// Its score.
    pub score: Score,
    /// The full report.
    pub report: SelectionReport,
}

/// Selects kernels for requests on one machine under one policy.
#[derive(Debug, Clone)]
pub struct Selector {
    catalog: Arc<Catalog>,
    hardware: Arc<HardwareProfile>,
    policy: Arc<Policy>,
    availability: Arc<Availability>,
    policy_hash: String,
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
        Ok(Selector { catalog, hardware, policy, availability, policy_hash })
    }

    /// A planning selector for a named or given profile: every backend counts as installed.
    pub fn planning(catalog: Arc<Catalog>, hardware: Arc<HardwareProfile>, policy: Arc<Policy>) -> Result<Selector> {
        let availability = Arc::new(Availability::planning(&catalog, &hardware));
        Selector::new(catalog, hardware, policy, availability)
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

    /// Selects a kernel. Errors: `NoKernel` (reasons of every candidate), `LockViolation`
    /// (the locked kernel's reasons), `InvalidInput` (the request is inconsistent).
    pub fn select(&self, req: &Request) -> Result<Selection> {
        let report = self.explain(req);
        if !report.request_errors.is_empty() {
            let first = report.request_errors[0].to_string();
            return Err(Error::new(ErrorKind::InvalidInput, format!("invalid request: {first}"))
                .with_reasons(report.request_errors.clone()));
        }
        if let Some(lock) = &report.lock
            && report.selected.is_none()
        {
            let reasons = report.candidate(&lock.kernel).map(|c| c.reasons.clone()).unwrap_or_default();
            let why: Vec<String> = reasons.iter().map(|r| r.to_string()).collect();
            return Err(Error::new(
                ErrorKind::LockViolation,
                format!("policy rule {} locks {} but it is not eligible: {}", lock.rule, lock.kernel, why.join("; ")),
            )
            .with_reasons(reasons));
        }
        let Some(chosen) = report.selected_candidate() else {
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
            return Err(Error::new(ErrorKind::NoKernel, msg).with_reasons(reasons));
        };
        let (kernel, backend, transforms) = (chosen.kernel.clone(), chosen.backend.clone(), chosen.transforms.clone());
        let Some(score) = chosen.score.clone() else {
            return Err(Error::new(ErrorKind::NoKernel, "internal: the selected candidate has no score"));
        };
        Ok(Selection { kernel, backend, transforms, score, report })
    }

    /// The full report for a request: every candidate's verdict, reasons and score.
    pub fn explain(&self, req: &Request) -> SelectionReport {
        let problem = Problem::describe(req);
        let mut request_errors = problem.errors.clone();
        let (device_ref, device) = self.resolve_device(req, &mut request_errors);
        let subject = Subject { problem: &problem, hardware: &self.hardware, device: device_ref.kind };
        let rules = self.matching_rules(&subject, req);
        let lock = rules.lock.map(|(i, r)| LockRef { kernel: r.kernels.clone(), rule: i });

        let mut candidates = Vec::with_capacity(self.catalog.candidates(req.op).len());
        for &ki in self.catalog.candidates(req.op) {
            let (backend, kernel) = self.catalog.kernel(ki);
            candidates.push(self.judge(backend, kernel, req, &problem, device, device_ref, &request_errors, &rules));
        }
        let mut best: Option<usize> = None;
        for (i, c) in candidates.iter().enumerate() {
            let Some(s) = &c.score else { continue };
            if let Some(l) = &lock
                && l.kernel != c.kernel
            {
                continue;
            }
            match best {
                Some(b) if candidates[b].score.as_ref().is_some_and(|bs| bs.total_ns <= s.total_ns) => {}
                _ => best = Some(i),
            }
        }
        if let Some(b) = best {
            candidates[b].verdict = Verdict::Selected;
        }
        SelectionReport {
            request: req.clone(),
            hardware: HardwareRef { name: self.hardware.name.clone(), fingerprint: self.hardware.fingerprint.clone() },
            device: device_ref.to_string(),
            mode: if self.availability.is_planning() { "planning" } else { "host" },
            capabilities_hash: self.catalog.hash().to_owned(),
            policy_hash: self.policy_hash.clone(),
            selected: best.map(|b| candidates[b].kernel.clone()),
            request_errors,
            lock,
            candidates,
        }
    }

    /// The device every tensor lives on; records DEVICE_MIXED / DEVICE_NOT_PRESENT.
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

    fn matching_rules<'p>(&'p self, subject: &Subject<'_>, req: &Request) -> MatchedRules<'p> {
        let mut m = MatchedRules { lock: None, allow: Vec::new(), deny: Vec::new(), factors: Vec::new() };
        let names_candidate = |pattern: &str| {
            self.catalog.candidates(req.op).iter().any(|&k| glob_match(pattern, &self.catalog.kernel(k).1.id))
        };
        for (i, r) in self.policy.rules.iter().enumerate() {
            if !r.when.matches(subject) || !names_candidate(&r.kernels) {
                continue;
            }
            match r.action {
                Action::Lock if m.lock.is_none() => m.lock = Some((i, r)),
                Action::Lock => {}
                Action::Allow => m.allow.push(r),
                Action::Deny => m.deny.push(r),
                Action::Prefer | Action::Avoid => m.factors.push(r),
            }
        }
        m
    }

    #[allow(clippy::too_many_arguments)]
    fn judge(
        &self,
        backend: &BackendSpec,
        kernel: &KernelSpec,
        req: &Request,
        problem: &Problem,
        device: Option<&DeviceProfile>,
        device_ref: DeviceRef,
        request_errors: &[Reason],
        rules: &MatchedRules<'_>,
    ) -> CandidateReport {
        let mut reasons: Vec<Reason> = request_errors.to_vec();
        let mut transforms = Vec::new();
        let mut adapted: Option<Request> = None;
        // Availability.
        match self.availability.status(&backend.backend) {
            BackendStatus::Available => {}
            BackendStatus::NotInstalled(why) => reasons.push(Reason::new(ReasonCode::BACKEND_NOT_INSTALLED, why)),
            BackendStatus::Unhealthy(why) => reasons.push(Reason::new(ReasonCode::BACKEND_UNHEALTHY, why)),
        }
        if backend.device != device_ref.kind {
            reasons.push(Reason::new(
                ReasonCode::DEVICE_KIND_MISMATCH,
                format!(
                    "{} kernels run on {}; the request's tensors are on {device_ref}",
                    backend.backend, backend.device
                ),
            ));
        }
        if device.is_none() {
            reasons.push(Reason::new(
                ReasonCode::DEVICE_NOT_PRESENT,
                format!("hardware profile {} has no device {device_ref}", self.hardware.name),
            ));
        }
        // Constraints (only meaningful for a consistent request); hardware checks only
        // against a device of the kernel's kind.
        if request_errors.is_empty() {
            let own_device = device.filter(|d| d.kind == backend.device);
            let mut found = Vec::new();
            constraint::check(kernel, req, problem, own_device, &mut found);
            if let Some(dev) = own_device
                && self.policy.allow_adaptation
                && transform::all_adaptable(&found)
                && let Some((planned, adapted_req)) = transform::plan(kernel, req, problem, dev)
            {
                let adapted_problem = Problem::describe(&adapted_req);
                let mut recheck = Vec::new();
                constraint::check(kernel, &adapted_req, &adapted_problem, Some(dev), &mut recheck);
                if recheck.is_empty() {
                    found.clear();
                    if self.policy.strict_mode {
                        let what: Vec<String> = planned
                            .iter()
                            .map(|t| format!("{} {} {}->{}", t.kind.as_str(), t.tensor, t.from, t.to))
                            .collect();
                        found.push(Reason::new(
                            ReasonCode::TRANSFORM_REJECTED_STRICT,
                            format!("needs {} and strict_mode forbids implicit transforms", what.join(", ")),
                        ));
                    }
                    transforms = planned;
                    adapted = Some(adapted_req);
                }
            }
            reasons.extend(found);
        }
        // Policy.
        let p = &self.policy;
        if let Some(r) = rules.deny.iter().find(|r| glob_match(&r.kernels, &kernel.id)) {
            reasons.push(Reason::new(ReasonCode::POLICY_DENIED, format!("denied by policy rule `deny {}`", r.kernels)));
        }
        if !rules.allow.is_empty() && !rules.allow.iter().any(|r| glob_match(&r.kernels, &kernel.id)) {
            let names: Vec<&str> = rules.allow.iter().map(|r| r.kernels.as_str()).collect();
            reasons.push(Reason::new(
                ReasonCode::POLICY_NOT_ALLOWED,
                format!("the policy allows only {}", names.join(", ")),
            ));
        }
        if let Some((i, r)) = rules.lock
            && r.kernels != kernel.id
        {
            reasons.push(Reason::new(ReasonCode::POLICY_LOCKED_OTHER, format!("policy rule {i} locks {}", r.kernels)));
        }
        if p.require_deterministic && !kernel.properties.deterministic {
            reasons.push(Reason::new(
                ReasonCode::NON_DETERMINISTIC,
                "the policy requires deterministic kernels; this one is not",
            ));
        }
        if !p.allow_jit && kernel.properties.needs_jit {
            reasons.push(Reason::new(
                ReasonCode::JIT_DISALLOWED,
                "the kernel compiles at first use and the policy forbids JIT",
            ));
        }
        if p.graph_strict_mode && !kernel.properties.graph_safe {
            reasons.push(Reason::new(
                ReasonCode::GRAPH_UNSAFE,
                "graph_strict_mode is on and the kernel allocates or synchronizes",
            ));
        }
        // Capacity.
        if let Some(dev) = device {
            let out_bytes = score::output_elements(problem).saturating_mul(problem.dtype.size_bytes());
            let transform_bytes: u64 = transforms.iter().map(|t| t.bytes / 2).sum();
            let need = kernel.properties.workspace_bytes.saturating_add(transform_bytes);
            let free = dev
                .memory_bytes
                .saturating_sub(problem.input_bytes)
                .saturating_sub(out_bytes)
                .saturating_sub(p.memory_reserve_bytes);
            if need > free {
                reasons.push(Reason::new(
                    ReasonCode::MEMORY_HEADROOM_EXCEEDED,
                    format!("needs {need} bytes of workspace and copies; {free} bytes are free after the request's tensors and the reserve"),
                ));
            }
        }
        let score = match (reasons.is_empty(), device) {
            (true, Some(dev)) => {
                let (r, pb) = match &adapted {
                    Some(a) => (a, Problem::describe(a)),
                    None => (req, problem.clone()),
                };
                let model = score::estimate(kernel, r, &pb, dev);
                let transform_ns = transforms.iter().fold(0.0, |a, t| a + t.ns);
                let policy_factor: f64 = rules
                    .factors
                    .iter()
                    .filter(|r| glob_match(&r.kernels, &kernel.id))
                    .map(|r| r.effective_factor())
                    .product();
                let total_ns = (model.estimated_ns + transform_ns) * policy_factor;
                Some(Score {
                    estimated_ns: model.estimated_ns,
                    source: ScoreSource::Model,
                    transform_ns,
                    policy_factor,
                    total_ns,
                    model,
                })
            }
            _ => None,
        };
        CandidateReport {
            kernel: kernel.id.clone(),
            backend: backend.backend.clone(),
            verdict: if score.is_some() { Verdict::Eligible } else { Verdict::Rejected },
            reasons,
            transforms,
            score,
        }
    }
}

struct MatchedRules<'p> {
    lock: Option<(usize, &'p Rule)>,
    allow: Vec<&'p Rule>,
    deny: Vec<&'p Rule>,
    factors: Vec<&'p Rule>,
}
