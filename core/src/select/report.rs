//! The selection report: every candidate, every reason, the arithmetic.
//! Its JSON form is described by `schemas/selection_report.schema.json`.

use serde::Serialize;

use crate::model::request::Request;
use crate::reason::Reason;
use crate::score::Score;
use crate::transform::Transform;

/// A candidate's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The chosen kernel.
    Selected,
    /// Passed every check, not chosen.
    Eligible,
    /// Failed at least one check.
    Rejected,
}

impl Verdict {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Selected => "selected",
            Verdict::Eligible => "eligible",
            Verdict::Rejected => "rejected",
        }
    }
}

/// One candidate kernel's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateReport {
    /// Kernel id.
    pub kernel: String,
    /// Backend name.
    pub backend: String,
    /// Verdict.
    pub verdict: Verdict,
    /// Every reason it was rejected (empty when eligible).
    pub reasons: Vec<Reason>,
    /// Adaptations it needs.
    pub transforms: Vec<Transform>,
    /// Its score, when eligible.
    pub score: Option<Score>,
    /// Its parity standing on this machine for this kind of request (`passed`, `failed`,
    /// `failed, allowed`, `unverified`), when parity records are in use or the policy
    /// requires them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parity: Option<&'static str>,
}

/// The hardware a report was made for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HardwareRef {
    /// Profile name.
    pub name: String,
    /// Profile fingerprint.
    pub fingerprint: String,
}

/// A policy lock that applied to the request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LockRef {
    /// The locked kernel.
    pub kernel: String,
    /// Index of the rule in the policy.
    pub rule: usize,
}

/// The full account of one selection.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SelectionReport {
    /// The request, as understood (defaults written out).
    pub request: Request,
    /// The hardware.
    pub hardware: HardwareRef,
    /// The device the request runs on (`cuda:0`, `cpu:0`).
    pub device: String,
    /// `planning` (named profile: backends assumed installed) or `host` (probed).
    pub mode: &'static str,
    /// Capabilities hash.
    pub capabilities_hash: String,
    /// Policy hash.
    pub policy_hash: String,
    /// The chosen kernel, or null.
    pub selected: Option<String>,
    /// Problems with the request itself (each candidate carries them too).
    pub request_errors: Vec<Reason>,
    /// The policy lock that applied, if any.
    pub lock: Option<LockRef>,
    /// Every kernel of the op, sorted by id.
    pub candidates: Vec<CandidateReport>,
    /// Time the selected kernel's transforms cost (layout, contiguity, dtype adaptations),
    /// ns; 0 when it needs none or nothing is selected.
    pub transform_cost_total: f64,
    /// Work the selected kernel does in the same call beyond its op (`residual_add` before
    /// a norm, `gate_up_proj` / `activation` / `down_proj` kept in cache by a fused MLP).
    pub fused_ops: Vec<&'static str>,
}

/// What `kernel` fuses into one call for `req`.
pub fn fused_ops(kernel: &crate::capabilities::spec::KernelSpec, req: &Request) -> Vec<&'static str> {
    use crate::model::op::Op;
    match req.op {
        Op::RmsNorm | Op::LayerNorm if kernel.constraints.fused_residual && req.get("residual").is_some() => {
            vec!["residual_add"]
        }
        Op::Mlp | Op::MoeExperts if kernel.perf.fused => vec!["gate_up_proj", "activation", "down_proj"],
        _ => Vec::new(),
    }
}

impl SelectionReport {
    /// Fills `transform_cost_total` and `fused_ops` from the selected candidate.
    pub fn summarize(&mut self, catalog: &crate::capabilities::catalog::Catalog) {
        let selected = self.selected.as_deref().and_then(|k| self.candidates.iter().find(|c| c.kernel == k));
        self.transform_cost_total = selected.and_then(|c| c.score.as_ref()).map_or(0.0, |s| s.transform_ns);
        self.fused_ops = selected
            .and_then(|c| catalog.find(&c.kernel))
            .map(|k| fused_ops(catalog.kernel(k).1, &self.request))
            .unwrap_or_default();
    }

    /// The report as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// The selected candidate.
    pub fn selected_candidate(&self) -> Option<&CandidateReport> {
        self.candidates.iter().find(|c| c.verdict == Verdict::Selected)
    }

    /// The candidate for a kernel id.
    pub fn candidate(&self, kernel: &str) -> Option<&CandidateReport> {
        self.candidates.iter().find(|c| c.kernel == kernel)
    }
}
