//! JIT warm-up (E2E §10.1, §10.4, §10.5): every kernel a workload's or a table's buckets
//! select that compiles at first use is compiled before the first request, for every size
//! of its bucket, and a verification pass proves it: a request of another size in each
//! bucket compiles nothing.
//!
//! A kernel compiles through its executor's [`Executor::warm`] (oneDNN creates its
//! primitives, which is when it JIT-compiles). A bucket is warmed at its largest size, which
//! the workload's and the table's representative requests are; the executor compiles what
//! every smaller size of it needs too.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use serde::Serialize;

use super::LayerZero;
use crate::error::Result;
use crate::exec::executor::KernelError;
use crate::key::SelectionKey;
use crate::key::axes;
use crate::model::request::Request;
use crate::reason::ReasonCode;

/// One bucket to warm: where it comes from and its representative (largest) request.
#[derive(Debug, Clone)]
pub struct WarmPoint {
    /// The workload or table entry.
    pub entry: String,
    /// The representative request: the bucket's largest size.
    pub request: Request,
}

/// What warm-up did for one bucket.
#[derive(Debug, Clone, Serialize)]
pub struct WarmItem {
    /// The workload or table entry.
    pub entry: String,
    /// The bucket (`m=129..256`).
    pub bucket: String,
    /// The kernel its request selects.
    pub kernel: String,
    /// Whether that kernel compiles at first use (`needs_jit`).
    pub needs_jit: bool,
    /// Compilations made now (0: none needed, or made for an earlier bucket).
    pub compiled: u64,
    /// Wall time of this bucket's warm-up, milliseconds.
    pub ms: f64,
    /// Why it could not be warmed (`JIT_COMPILE_FAILED`, a selection error), if it failed.
    pub error: Option<WarmError>,
}

/// A warm-up failure.
#[derive(Debug, Clone, Serialize)]
pub struct WarmError {
    /// The reason code (absent when no kernel was selected: the message says why).
    pub code: Option<&'static str>,
    /// What happened.
    pub message: String,
}

/// What warm-up did.
#[derive(Debug, Clone, Serialize)]
pub struct WarmupReport {
    /// One item per bucket, in the order given.
    pub items: Vec<WarmItem>,
    /// Compilations made, in all.
    pub compiled: u64,
    /// Wall time, milliseconds.
    pub ms: f64,
    /// Buckets whose kernel could not be warmed.
    pub failed: usize,
}

/// A verification pass after warm-up: one request per bucket at another size than the one
/// warmed, dispatched, with the compilations they made (0 when warm-up covered them).
#[derive(Debug, Clone, Serialize)]
pub struct WarmVerify {
    /// Requests dispatched.
    pub requests: usize,
    /// Compilations those dispatches made.
    pub compiled: u64,
    /// Requests that failed to dispatch, with why.
    pub errors: Vec<String>,
}

fn code_of(e: &KernelError) -> &'static str {
    match e {
        KernelError::CompileFailed(_) => ReasonCode::JIT_COMPILE_FAILED.as_str(),
        KernelError::InvalidInput(_) => ReasonCode::INVALID_REQUEST.as_str(),
        _ => ReasonCode::KERNEL_FAILED.as_str(),
    }
}

/// JIT compilations made in this process so far (every JIT backend's).
pub fn compilations() -> u64 {
    crate::backend::onednn::jit_stats().compiled
}

impl LayerZero {
    /// Compiles, for each point, what the kernel its request selects needs for every size of
    /// its bucket. A kernel whose JIT cannot compile a bucket is reported with
    /// `JIT_COMPILE_FAILED` and refuses that shape from then on, so dispatch falls back
    /// without compiling again.
    pub fn warmup(&self, points: &[WarmPoint]) -> WarmupReport {
        let started = Instant::now();
        let mut items = Vec::with_capacity(points.len());
        for p in points {
            items.push(self.warm_one(p));
        }
        let failed = items.iter().filter(|i| i.error.is_some()).count();
        WarmupReport {
            compiled: items.iter().map(|i| i.compiled).sum(),
            ms: started.elapsed().as_secs_f64() * 1e3,
            failed,
            items,
        }
    }

    fn warm_one(&self, p: &WarmPoint) -> WarmItem {
        let started = Instant::now();
        let bucket = SelectionKey::derive(&p.request).buckets().map_or("exact".to_owned(), |b| b.text(p.request.op));
        let mut item = WarmItem {
            entry: p.entry.clone(),
            bucket,
            kernel: String::new(),
            needs_jit: false,
            compiled: 0,
            ms: 0.0,
            error: None,
        };
        let fail = |code: &'static str, message: String| Some(WarmError { code: Some(code), message });
        let sel = match self.select(&p.request) {
            Ok(s) => s,
            Err(e) => {
                let code = e.reasons().first().map(|r| r.code().as_str());
                item.error = Some(WarmError { code, message: e.to_string() });
                return item;
            }
        };
        item.kernel = sel.kernel.clone();
        item.needs_jit = self.parts.catalog.kernel(sel.index).1.properties.needs_jit;
        let Some(exec) = self.executor(sel.index).cloned() else {
            item.error = fail(
                ReasonCode::EXECUTOR_NOT_REGISTERED.as_str(),
                format!("no executor is registered for {}", sel.kernel),
            );
            return item;
        };
        if item.needs_jit {
            let args = crate::exec::synth::synthesize(&p.request, 0)
                .and_then(|a| crate::transform::apply_transforms(&a, &sel.transforms));
            match args {
                Err(e) => item.error = fail(ReasonCode::INVALID_REQUEST.as_str(), e.to_string()),
                Ok(args) => match catch_unwind(AssertUnwindSafe(|| exec.warm(&args))) {
                    Ok(Ok(n)) => item.compiled = n,
                    Ok(Err(e)) => item.error = fail(code_of(&e), format!("{}: {e}", sel.kernel)),
                    Err(_) => item.error = fail(ReasonCode::KERNEL_FAILED.as_str(), format!("{} panicked", sel.kernel)),
                },
            }
        }
        item.ms = started.elapsed().as_secs_f64() * 1e3;
        item
    }

    /// Whether every JIT kernel the points select is warm for every size of its bucket:
    /// the buckets that are not (entry, bucket and kernel).
    pub fn cold(&self, points: &[WarmPoint]) -> Vec<String> {
        let mut out = Vec::new();
        for p in points {
            let Ok(sel) = self.select(&p.request) else { continue };
            if !self.parts.catalog.kernel(sel.index).1.properties.needs_jit {
                continue;
            }
            let warm = self.executor(sel.index).is_some_and(|exec| {
                crate::exec::synth::synthesize(&p.request, 0)
                    .and_then(|a| crate::transform::apply_transforms(&a, &sel.transforms))
                    .is_ok_and(|args| exec.is_warm(&args))
            });
            if !warm {
                let bucket =
                    SelectionKey::derive(&p.request).buckets().map_or("exact".to_owned(), |b| b.text(p.request.op));
                out.push(format!("{} {} -> {}", p.entry, bucket, sel.kernel));
            }
        }
        out
    }

    /// Dispatches, for each point, a request at the smallest size of its bucket (another
    /// size than the one warmed), preparing its constant operands first as an engine does at
    /// load, and counts the compilations those dispatches make.
    pub fn verify_warm(&self, points: &[WarmPoint]) -> Result<WarmVerify> {
        let mut v = WarmVerify { requests: 0, compiled: 0, errors: Vec::new() };
        for p in points {
            let Some(smallest) = smallest_of_bucket(&p.request)? else { continue };
            let args = crate::exec::synth::synthesize(&smallest, 1)?;
            let _ = self.prepare(&args);
            let before = compilations();
            match self.dispatch(&args) {
                Ok(_) => {}
                Err(e) => v.errors.push(format!("{}: {e}", p.entry)),
            }
            v.compiled += compilations() - before;
            v.requests += 1;
        }
        Ok(v)
    }
}

/// The request resized to the smallest size of each of its perf axes' buckets; `None` when
/// it has no perf axis (its key is exact: the warmed size is the only one).
fn smallest_of_bucket(req: &Request) -> Result<Option<Request>> {
    let op_axes = axes::axes(req.op);
    let Some((values, n)) = axes::values(req) else { return Ok(None) };
    if n == 0 {
        return Ok(None);
    }
    let mut to = [0u64; axes::MAX_AXES];
    for (i, axis) in op_axes.iter().enumerate().take(n) {
        to[i] = match axis.anchor.bucket(values[i]) {
            Some(b) => axis.anchor.range(b).0,
            None => values[i],
        };
    }
    axes::resize(req, &to[..n]).map(Some)
}
