//! The handle's recent decisions: a bounded ring of selection records (live selections,
//! dispatches that fell back or failed), redacted as configured. Written on cold paths only.

use std::collections::VecDeque;

use parking_lot::Mutex;
use serde::Serialize;

use super::redact;
use crate::capabilities::catalog::Catalog;
use crate::model::request::Request;
use crate::select::{Passed, Selection};

/// One decision, as the selection log writes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SelectionRecord {
    /// Milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// `select` (a live selection) or `dispatch` (a dispatch that fell back or failed).
    pub event: &'static str,
    /// The op.
    pub op: String,
    /// The tensors' dtypes and shapes (`q=f32[1,64,8,64] ...`).
    pub shapes: String,
    /// The kernel that was selected or ran (empty when none could).
    pub kernel: String,
    /// Its backend.
    pub backend: String,
    /// Candidates of the op, and how many were not eligible.
    pub candidates: usize,
    /// Candidates not eligible.
    pub rejected: usize,
    /// Transform time of the chosen kernel, ns.
    pub transform_cost_total: f64,
    /// What the chosen kernel fuses.
    pub fused_ops: Vec<&'static str>,
    /// Candidates not eligible, each with the codes of every check it failed (live
    /// selections; empty for a dispatch record).
    pub rejections: Vec<Rejection>,
    /// Attempts that did not run: kernel and reason code.
    pub failed: Vec<(String, String)>,
    /// The error, when nothing ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl SelectionRecord {
    /// A record of `sel` made for `req`, redacted as configured.
    pub fn of(event: &'static str, req: &Request, sel: Option<&Selection>, catalog: &Catalog) -> SelectionRecord {
        let r = redact::current();
        let fused = sel
            .and_then(|s| catalog.find(&s.kernel))
            .map(|k| crate::select::fused_ops(catalog.kernel(k).1, req))
            .unwrap_or_default();
        SelectionRecord {
            at_unix_ms: crate::time::now_unix_ms(),
            event,
            op: redact::field(req.op.as_str(), r.ops()),
            shapes: redact::field(&shapes(req), r.shapes()),
            kernel: sel.map(|s| redact::field(&s.kernel, r.kernels())).unwrap_or_default(),
            backend: sel.map(|s| redact::field(&s.backend, r.backends())).unwrap_or_default(),
            candidates: sel.map_or(0, |s| s.candidates),
            rejected: sel.map_or(0, |s| s.rejected),
            transform_cost_total: sel.map_or(0.0, |s| s.score.transform_ns),
            fused_ops: fused,
            rejections: Vec::new(),
            failed: Vec::new(),
            error: None,
        }
    }

    /// Adds the candidates a live selection passed over (kernels redacted as configured).
    pub fn passed_over(&mut self, passed: &[Passed], catalog: &Catalog) {
        let r = redact::current();
        self.rejections = passed
            .iter()
            .map(|p| Rejection {
                kernel: redact::field(&catalog.kernel(p.index).1.id, r.kernels()),
                reasons: p.codes.iter().map(|c| c.as_str()).collect(),
            })
            .collect();
    }

    /// The rejections as one log field: `kernel:CODE|CODE kernel:CODE`.
    pub fn rejections_text(&self) -> String {
        let items: Vec<String> =
            self.rejections.iter().map(|r| format!("{}:{}", r.kernel, r.reasons.join("|"))).collect();
        items.join(" ")
    }

    /// Adds a failed attempt (kernel redacted as configured).
    pub fn failed_attempt(&mut self, kernel: &str, code: &str) {
        self.failed.push((redact::field(kernel, redact::current().kernels()), code.to_owned()));
    }
}

/// A candidate a live selection passed over, as the selection log writes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejection {
    /// The kernel.
    pub kernel: String,
    /// The codes of every check it failed.
    pub reasons: Vec<&'static str>,
}

/// `name=dtype[shape]` for every tensor of `req`.
pub fn shapes(req: &Request) -> String {
    let mut out = String::new();
    for (name, t) in &req.tensors {
        if !out.is_empty() {
            out.push(' ');
        }
        let dims: Vec<String> = t.shape.iter().map(u64::to_string).collect();
        out.push_str(&format!("{name}={}[{}]", t.dtype, dims.join(",")));
    }
    out
}

/// The last `capacity` records.
#[derive(Debug)]
pub struct Recent {
    capacity: usize,
    records: Mutex<VecDeque<SelectionRecord>>,
}

impl Recent {
    /// An empty ring of `capacity` records.
    pub fn new(capacity: usize) -> Recent {
        Recent { capacity, records: Mutex::new(VecDeque::with_capacity(capacity.min(1024))) }
    }

    /// Adds one, dropping the oldest when full.
    pub fn push(&self, record: SelectionRecord) {
        if self.capacity == 0 {
            return;
        }
        let mut r = self.records.lock();
        if r.len() == self.capacity {
            r.pop_front();
        }
        r.push_back(record);
    }

    /// Every record, oldest first.
    pub fn snapshot(&self) -> Vec<SelectionRecord> {
        self.records.lock().iter().cloned().collect()
    }
}
