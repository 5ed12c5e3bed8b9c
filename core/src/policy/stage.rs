//! The policy stage of selection: which rules apply to a request, and what they do to one
//! kernel (deny, allow-list, lock, determinism, JIT, graph safety; prefer/avoid factors).

use super::{Action, Policy, Rule, Subject, glob_match};
use crate::capabilities::spec::KernelSpec;
use crate::constraint::Sink;
use crate::reason::ReasonCode;

/// The rules whose conditions hold for one request and that name one of its candidates.
#[derive(Debug)]
pub struct Matched<'p> {
    /// The first matching lock, with its index in the policy.
    pub lock: Option<(usize, &'p Rule)>,
    /// Matching allow rules.
    pub allow: Vec<&'p Rule>,
    /// Matching deny rules.
    pub deny: Vec<&'p Rule>,
    /// Matching prefer and avoid rules.
    pub factors: Vec<&'p Rule>,
}

/// The rules of `policy` that apply to `subject`; `names_candidate` says whether a rule's
/// kernel pattern names a candidate of the request (rules naming none are ignored).
pub fn matching<'p>(policy: &'p Policy, subject: &Subject<'_>, names_candidate: impl Fn(&str) -> bool) -> Matched<'p> {
    let mut m = Matched { lock: None, allow: Vec::new(), deny: Vec::new(), factors: Vec::new() };
    for (i, r) in policy.rules.iter().enumerate() {
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

/// The policy stage for one kernel: every rule and switch that rejects it.
pub fn judge<S: Sink>(policy: &Policy, rules: &Matched<'_>, kernel: &KernelSpec, sink: &mut S) {
    if let Some(r) = rules.deny.iter().find(|r| glob_match(&r.kernels, &kernel.id)) {
        sink.reject(ReasonCode::POLICY_DENIED, || format!("denied by policy rule `deny {}`", r.kernels));
    }
    if !rules.allow.is_empty() && !rules.allow.iter().any(|r| glob_match(&r.kernels, &kernel.id)) {
        sink.reject(ReasonCode::POLICY_NOT_ALLOWED, || {
            let names: Vec<&str> = rules.allow.iter().map(|r| r.kernels.as_str()).collect();
            format!("the policy allows only {}", names.join(", "))
        });
    }
    if let Some((i, r)) = rules.lock
        && r.kernels != kernel.id
    {
        sink.reject(ReasonCode::POLICY_LOCKED_OTHER, || format!("policy rule {i} locks {}", r.kernels));
    }
    if policy.require_deterministic && !kernel.properties.deterministic {
        sink.reject(ReasonCode::NON_DETERMINISTIC, || "the policy requires deterministic kernels; this one is not");
    }
    if !policy.allow_jit && kernel.properties.needs_jit {
        sink.reject(ReasonCode::JIT_DISALLOWED, || "the kernel compiles at first use and the policy forbids JIT");
    }
    if policy.graph_strict_mode && !kernel.properties.graph_safe {
        sink.reject(ReasonCode::GRAPH_UNSAFE, || "graph_strict_mode is on and the kernel allocates or synchronizes");
    }
}

/// The product of the prefer/avoid factors that name `kernel_id`.
pub fn factor(rules: &Matched<'_>, kernel_id: &str) -> f64 {
    rules.factors.iter().filter(|r| glob_match(&r.kernels, kernel_id)).map(|r| r.effective_factor()).product()
}
