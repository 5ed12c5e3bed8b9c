//! Selections and reports as Python objects: the kernel a call gets, and every candidate with
//! its verdict and reasons.

use layerzero::score::Score;
use layerzero::select::{CandidateReport, Selection as CoreSelection, SelectionReport};
use layerzero::transform::Transform;
use pyo3::prelude::*;

use crate::reason::Reason;

/// Plain text of a planned adaptation: `transpose q BSHD -> BHSD`.
fn transform_text(t: &Transform) -> String {
    format!("{} {} {} -> {}", t.kind.as_str(), t.tensor, t.from, t.to)
}

/// The kernel a call gets, where the choice came from, and its score.
#[pyclass(module = "layerzero", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct Selection {
    /// The kernel id, `backend.op.variant`.
    kernel: String,
    /// Its backend.
    backend: String,
    /// `plan`, `cache` or `live`.
    source: &'static str,
    /// The adaptations applied before it runs.
    transforms: Vec<String>,
    /// Its estimated time, ns (measured or modeled).
    estimated_ns: f64,
    /// Where the estimate comes from: `model`, `perfdb` or `blended`.
    score_source: &'static str,
    /// Estimated plus transforms, times the policy's factor: what it won by.
    total_ns: f64,
    /// How many candidates the op has, and how many were not eligible.
    candidates: usize,
    rejected: usize,
}

impl Selection {
    /// `s` served from `source`.
    pub fn new(s: &CoreSelection, source: &'static str) -> Selection {
        Selection {
            kernel: s.kernel.clone(),
            backend: s.backend.clone(),
            source,
            transforms: s.transforms.iter().map(transform_text).collect(),
            estimated_ns: s.score.estimated_ns,
            score_source: s.score.source.as_str(),
            total_ns: s.score.total_ns,
            candidates: s.candidates,
            rejected: s.rejected,
        }
    }

    /// The kernel id.
    pub fn kernel(&self) -> &str {
        &self.kernel
    }
}

#[pymethods]
impl Selection {
    fn __repr__(&self) -> String {
        format!("Selection({} ({}), {}, {:.1} us)", self.kernel, self.backend, self.source, self.total_ns / 1e3)
    }
}

/// One candidate kernel's verdict.
#[pyclass(module = "layerzero", frozen)]
#[derive(Debug, Clone)]
pub struct Candidate {
    inner: CandidateReport,
}

#[pymethods]
impl Candidate {
    /// The kernel id.
    #[getter]
    fn kernel(&self) -> &str {
        &self.inner.kernel
    }

    /// Its backend.
    #[getter]
    fn backend(&self) -> &str {
        &self.inner.backend
    }

    /// `selected`, `eligible` or `rejected`.
    #[getter]
    fn verdict(&self) -> &'static str {
        self.inner.verdict.as_str()
    }

    /// Every reason it was rejected (empty when eligible).
    #[getter]
    fn reasons(&self) -> Vec<Reason> {
        self.inner.reasons.iter().map(Reason::from).collect()
    }

    /// The adaptations it needs.
    #[getter]
    fn transforms(&self) -> Vec<String> {
        self.inner.transforms.iter().map(transform_text).collect()
    }

    /// Its total score, ns, when eligible.
    #[getter]
    fn total_ns(&self) -> Option<f64> {
        self.inner.score.as_ref().map(|s: &Score| s.total_ns)
    }

    fn __repr__(&self) -> String {
        let why = self.inner.reasons.first().map(|r| format!(": {r}")).unwrap_or_default();
        format!("Candidate({} {}{why})", self.inner.kernel, self.inner.verdict.as_str())
    }
}

/// The full account of one selection: every candidate, every reason, the arithmetic.
#[pyclass(module = "layerzero", frozen)]
#[derive(Debug, Clone)]
pub struct Report {
    inner: SelectionReport,
}

impl From<SelectionReport> for Report {
    fn from(inner: SelectionReport) -> Report {
        Report { inner }
    }
}

#[pymethods]
impl Report {
    /// The chosen kernel, if any qualified.
    #[getter]
    fn selected(&self) -> Option<&str> {
        self.inner.selected.as_deref()
    }

    /// Every candidate of the op, in the catalog's order.
    #[getter]
    fn candidates(&self) -> Vec<Candidate> {
        self.inner.candidates.iter().map(|c| Candidate { inner: c.clone() }).collect()
    }

    /// What is wrong with the request itself (no kernel is judged then).
    #[getter]
    fn request_errors(&self) -> Vec<Reason> {
        self.inner.request_errors.iter().map(Reason::from).collect()
    }

    /// The candidate `kernel`, if the op has it.
    fn candidate(&self, kernel: &str) -> Option<Candidate> {
        self.inner.candidates.iter().find(|c| c.kernel == kernel).map(|c| Candidate { inner: c.clone() })
    }

    /// The report as `lz explain --json` prints it (schema `selection_report.schema.json`).
    fn to_json(&self) -> PyResult<String> {
        serde_json::to_string_pretty(&self.inner).map_err(|e| crate::errors::invalid(e.to_string()))
    }

    fn __repr__(&self) -> String {
        let rejected = self.inner.candidates.iter().filter(|c| !c.reasons.is_empty()).count();
        format!(
            "Report(selected={:?}, {} candidates, {rejected} rejected)",
            self.inner.selected.as_deref().unwrap_or("none"),
            self.inner.candidates.len()
        )
    }
}
