//! Table-driven selection cases: a request on a hardware profile under a policy, and what
//! the verdict must be (the selected kernel or backend, exact reason codes per kernel,
//! request errors). Shared by the selection table of this crate and the E2E runner.

use std::collections::BTreeMap;
use std::sync::Arc;

use layerzero::capabilities::catalog::Catalog;
use layerzero::hardware::named;
use layerzero::model::request::Request;
use layerzero::policy::Policy;
use layerzero::select::{SelectionReport, Selector};
use serde::Deserialize;

/// What a scenario expects.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// The exact kernel selected (`null` = none qualifies).
    #[serde(default, deserialize_with = "some")]
    pub selected: Option<Option<String>>,
    /// The selected kernel's backend is one of these.
    #[serde(default)]
    pub selected_backend_in: Vec<String>,
    /// The selected kernel's backend is none of these.
    #[serde(default)]
    pub selected_backend_not_in: Vec<String>,
    /// For each named kernel, the exact set of reason codes it is rejected with.
    #[serde(default)]
    pub rejected: BTreeMap<String, Vec<String>>,
    /// Codes that must appear among the request's errors.
    #[serde(default)]
    pub request_errors: Vec<String>,
    /// Kernels that must be eligible (or selected).
    #[serde(default)]
    pub eligible: Vec<String>,
    /// Every candidate of these backends carries this code.
    #[serde(default)]
    pub backend_codes: BTreeMap<String, String>,
}

fn some<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

impl Expect {
    /// True when the case checks nothing (such a case is refused).
    pub fn is_empty(&self) -> bool {
        self.selected.is_none()
            && self.selected_backend_in.is_empty()
            && self.selected_backend_not_in.is_empty()
            && self.rejected.is_empty()
            && self.request_errors.is_empty()
            && self.eligible.is_empty()
            && self.backend_codes.is_empty()
    }
}

/// One case of a scenario.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// What it shows.
    pub name: String,
    /// Hardware profile name.
    pub hardware: String,
    /// Policy (inline JSON), default policy if absent.
    #[serde(default)]
    pub policy: Option<serde_json::Value>,
    /// The request (the public request form).
    pub request: serde_json::Value,
    /// The checks, on the named profile.
    pub expect: Expect,
    /// Checks of the same request selected on this machine (the E2E runner dispatches it
    /// here); absent: only that what ran is what was selected and that it matches the
    /// reference.
    #[serde(default)]
    pub host: Option<Expect>,
}

/// Runs one case; `Err` lists every failed check.
pub fn run_case(catalog: &Arc<Catalog>, case: &Case) -> Result<(), Vec<String>> {
    let fail = |m: String| Err(vec![m]);
    let hw = match named::load(&case.hardware) {
        Ok(h) => Arc::new(h),
        Err(e) => return fail(e.to_string()),
    };
    let policy = match policy_of(case) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let sel = match Selector::planning(catalog.clone(), hw, Arc::new(policy)) {
        Ok(s) => s,
        Err(e) => return fail(e.to_string()),
    };
    let req = match Request::from_value(case.request.clone()) {
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    let errors = check_report(&sel.explain(&req), &case.expect);
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}

/// Every check of `e` that the report `r` fails, as sentences.
pub fn check_report(r: &SelectionReport, e: &Expect) -> Vec<String> {
    let mut errors = Vec::new();
    if let Some(want) = &e.selected
        && &r.selected != want
    {
        errors.push(format!("selected {:?}, expected {want:?}", r.selected));
    }
    let backend = r.selected_candidate().map(|c| c.backend.clone());
    if !e.selected_backend_in.is_empty() && !backend.as_ref().is_some_and(|b| e.selected_backend_in.contains(b)) {
        errors.push(format!("selected backend {backend:?} not in {:?}", e.selected_backend_in));
    }
    if backend.as_ref().is_some_and(|b| e.selected_backend_not_in.contains(b)) {
        errors.push(format!("selected backend {backend:?} is excluded"));
    }
    for (kernel, want) in &e.rejected {
        match r.candidate(kernel) {
            None => errors.push(format!("{kernel} is not a candidate")),
            Some(c) => {
                let mut got: Vec<&str> = c.reasons.iter().map(|x| x.code().as_str()).collect();
                got.sort();
                got.dedup();
                let mut want: Vec<&str> = want.iter().map(|s| s.as_str()).collect();
                want.sort();
                if got != want {
                    errors.push(format!("{kernel}: codes {got:?}, expected {want:?}"));
                }
            }
        }
    }
    for code in &e.request_errors {
        if !r.request_errors.iter().any(|x| x.code().as_str() == code) {
            errors.push(format!("request error {code} missing; got {:?}", r.request_errors));
        }
    }
    for k in &e.eligible {
        if r.candidate(k).is_none_or(|c| c.score.is_none()) {
            errors.push(format!("{k} is not eligible: {:?}", r.candidate(k).map(|c| &c.reasons)));
        }
    }
    for (b, code) in &e.backend_codes {
        let cands: Vec<_> = r.candidates.iter().filter(|c| &c.backend == b).collect();
        if cands.is_empty() {
            errors.push(format!("backend {b} has no candidates"));
        }
        for c in cands {
            if !c.reasons.iter().any(|x| x.code().as_str() == code) {
                errors.push(format!("{}: no {code} among {:?}", c.kernel, c.reasons));
            }
        }
    }
    errors
}

/// The case's policy (the default policy when it names none).
pub fn policy_of(case: &Case) -> Result<Policy, String> {
    match &case.policy {
        Some(p) => Policy::from_json(&p.to_string(), "scenario policy").map_err(|e| e.to_string()),
        None => Ok(Policy::default()),
    }
}

/// Loads a case list (a JSON array); refuses a case that checks nothing.
pub fn load_cases(path: &std::path::Path) -> Result<Vec<Case>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let cases: Vec<Case> = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(c) = cases.iter().find(|c| c.expect.is_empty()) {
        return Err(format!("{}: case {:?} checks nothing", path.display(), c.name));
    }
    Ok(cases)
}
