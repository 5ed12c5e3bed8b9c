//! Shadow checks while serving (`shadow_check: {every: N, rows: R}` in the policy): every
//! N-th call of a kernel also runs the reference (`cpu_reference`) on R rows of the same
//! inputs and compares them with the kernel's rows. A kernel whose rows diverge beyond the
//! tolerance of its op and dtype (the E2E specification's §5 table, or the `error_bound` a
//! quantized kernel declares where that is looser), or whose float output
//! points elsewhere than the reference's (cosine below [`MIN_COSINE`], seed 004's figure),
//! is quarantined through the health system (`KERNEL_OUTPUT_DIVERGED`), the call falls back,
//! and a failing parity record is written (to the handle's PerfDB when it has one) and
//! learned at once, so selection refuses the kernel for that kind of request from then on.
//!
//! Off, a call pays one relaxed load. On, one atomic add per call; a checked call pays the
//! reference on R rows, counted in [`ShadowStats`].

mod slice;

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

use super::LayerZero;
use crate::capabilities::catalog::{Catalog, KernelIndex};
use crate::compare::{Category, compare, cosine, real_call_tolerance};
use crate::exec::args::{OpArgs, Outputs};
use crate::model::op::Op;
use crate::plan::SelectionKey;
use crate::policy::ShadowCheck;
use crate::select::{ParityFact, REFERENCE_BACKEND, Selection, reference_kernel};

/// Float outputs whose cosine with the reference is below this diverged, whatever the
/// elementwise tolerance says.
pub const MIN_COSINE: f64 = 0.999;
/// Calls that cannot be cut to rows are compared whole only up to this many input elements
/// (the reference is naive: a large call compared whole would stall the caller).
const WHOLE_LIMIT: usize = 1 << 22;

/// What the shadow checks of a handle did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ShadowStats {
    /// Check one call in this many per kernel (0: off).
    pub every: u32,
    /// Rows compared per checked call.
    pub rows: u32,
    /// Calls checked.
    pub checks: u64,
    /// Checks that found the kernel diverged.
    pub diverged: u64,
    /// Due checks not made: no reference for the op, a call too large to compare whole, a
    /// sampling op, device memory.
    pub skipped: u64,
    /// Time the checks added to their calls, nanoseconds in all.
    pub checked_ns: u64,
}

impl ShadowStats {
    /// The time one check adds to its call, microseconds (mean; 0 before the first).
    pub fn added_us_per_check(&self) -> f64 {
        if self.checks == 0 { 0.0 } else { self.checked_ns as f64 / self.checks as f64 / 1e3 }
    }
}

/// One shadow check: what was compared and how close it was (a dispatch carries the checks
/// made while it ran: [`crate::runtime::Dispatch::shadow_checks`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Checked {
    /// The kernel checked.
    pub kernel: String,
    /// Its op.
    pub op: Op,
    /// What was compared: `3 of 16 rows`, `4 query positions`, `the whole call`.
    pub compared: String,
    /// The lowest cosine of a float output with the reference's (1 when none is float).
    pub cosine: f64,
    /// The largest NMSE of an output.
    pub nmse: f64,
    /// The largest absolute difference.
    pub max_abs: f64,
    /// Whether the kernel diverged (and the call fell back).
    pub diverged: bool,
}

thread_local! {
    /// The checks made on this thread since its dispatch began (a dispatch runs its kernels'
    /// checks on the calling thread).
    static CHECKED: RefCell<Vec<Checked>> = const { RefCell::new(Vec::new()) };
}

/// Takes the checks made on this thread since the last call.
pub(super) fn drain() -> Vec<Checked> {
    CHECKED.with(|c| std::mem::take(&mut *c.borrow_mut()))
}

/// The shadow-check state of one handle.
#[derive(Debug)]
pub(crate) struct Shadow {
    every: AtomicU32,
    rows: AtomicU32,
    /// Calls per kernel, by dense index.
    calls: Box<[AtomicU32]>,
    checks: AtomicU64,
    diverged: AtomicU64,
    skipped: AtomicU64,
    checked_ns: AtomicU64,
}

/// How a checked call ended.
pub(crate) enum Verdict {
    /// Within tolerance (or not checked).
    Agrees,
    /// Diverged: what, in words, and the parity record to write.
    Diverged(String, Box<Divergence>),
}

/// A diverged check's record.
#[derive(Debug, Clone)]
pub(crate) struct Divergence {
    fact: ParityFact,
    dtype: String,
    rtol: f64,
    atol: f64,
}

impl Shadow {
    pub(crate) fn new(catalog: &Catalog) -> Shadow {
        Shadow {
            every: AtomicU32::new(0),
            rows: AtomicU32::new(0),
            calls: catalog.kernels().map(|_| AtomicU32::new(0)).collect(),
            checks: AtomicU64::new(0),
            diverged: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            checked_ns: AtomicU64::new(0),
        }
    }

    /// Applies the policy's setting (`None`: off); counts carry over.
    pub(crate) fn configure(&self, check: Option<ShadowCheck>) {
        let (every, rows) = check.map_or((0, 0), |c| (c.every.max(1), c.rows.max(1)));
        self.rows.store(rows, Ordering::Relaxed);
        self.every.store(every, Ordering::Relaxed);
    }

    /// Whether checks are on.
    #[inline]
    pub(super) fn on(&self) -> bool {
        self.every.load(Ordering::Relaxed) != 0
    }

    /// Whether this call of `kernel` is to be checked (the N-th since the last).
    #[inline]
    fn due(&self, kernel: KernelIndex) -> bool {
        let every = self.every.load(Ordering::Relaxed);
        if every == 0 {
            return false;
        }
        let Some(c) = self.calls.get(kernel) else { return false };
        (c.fetch_add(1, Ordering::Relaxed) % every) + 1 == every
    }

    pub(crate) fn stats(&self) -> ShadowStats {
        ShadowStats {
            every: self.every.load(Ordering::Relaxed),
            rows: self.rows.load(Ordering::Relaxed),
            checks: self.checks.load(Ordering::Relaxed),
            diverged: self.diverged.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            checked_ns: self.checked_ns.load(Ordering::Relaxed),
        }
    }
}

impl LayerZero {
    /// What the shadow checks of this handle did, and the setting in force.
    pub fn shadow_stats(&self) -> ShadowStats {
        self.shadow.stats()
    }

    /// The shadow check of one successful call of `sel`: `Agrees` unless it was due and the
    /// kernel's rows diverged. A diverged check has already learned its parity record and,
    /// unless `drilled` (an injected fault corrupted the output: the drill's doing, not the
    /// kernel's), written it to the PerfDB.
    #[inline]
    pub(super) fn shadow(&self, sel: &Selection, args: &OpArgs, outputs: &Outputs, drilled: bool) -> Verdict {
        if !self.shadow.due(sel.index) {
            return Verdict::Agrees;
        }
        self.shadow_slow(sel, args, outputs, drilled)
    }

    #[cold]
    fn shadow_slow(&self, sel: &Selection, args: &OpArgs, outputs: &Outputs, drilled: bool) -> Verdict {
        if sel.backend == REFERENCE_BACKEND {
            // The reference checked against itself says nothing.
            return Verdict::Agrees;
        }
        let start = Instant::now();
        let verdict = self.shadow_compare(sel, args, outputs);
        let s = &self.shadow;
        match &verdict {
            None => {
                s.skipped.fetch_add(1, Ordering::Relaxed);
                return Verdict::Agrees;
            }
            Some(Verdict::Diverged(..)) => {
                s.diverged.fetch_add(1, Ordering::Relaxed);
            }
            Some(Verdict::Agrees) => {}
        }
        s.checks.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        s.checked_ns.fetch_add(ns, Ordering::Relaxed);
        let verdict = verdict.unwrap_or(Verdict::Agrees);
        if let Verdict::Diverged(_, d) = &verdict {
            self.record_divergence(d, !drilled);
        }
        verdict
    }

    /// Runs the reference on a cut of `args` and compares; `None` when the check cannot be
    /// made (skipped).
    fn shadow_compare(&self, sel: &Selection, args: &OpArgs, outputs: &Outputs) -> Option<Verdict> {
        let op = args.op();
        if args.on_device().is_some() {
            return None;
        }
        let reference = self.parts.catalog.find(&reference_kernel(op)).and_then(|k| self.executor(k))?;
        let rows = usize::try_from(self.shadow.rows.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
        let spec = self.parts.catalog.kernel(sel.index).1;
        let a = agreement(reference.as_ref(), spec, args, outputs, rows).map_err(|why| {
            tracing::warn!(target: "layerzero::shadow", kernel = %sel.kernel, why = %why, "shadow check skipped");
        });
        let a = a.ok()?;
        CHECKED.with(|c| {
            c.borrow_mut().push(Checked {
                kernel: sel.kernel.clone(),
                op,
                compared: a.compared.clone(),
                cosine: a.cosine,
                nmse: a.nmse,
                max_abs: a.max_abs,
                diverged: !a.problems.is_empty(),
            })
        });
        if a.problems.is_empty() {
            return Some(Verdict::Agrees);
        }
        let message = format!("{}: shadow check on {}: {}", sel.kernel, a.compared, a.problems.join("; "));
        let request = self.describe(args);
        let key = SelectionKey::derive(&request);
        let (b, k) = self.parts.catalog.kernel(sel.index);
        let fact = ParityFact {
            kernel: sel.kernel.clone(),
            kernel_version: k.version.clone().unwrap_or_else(|| b.version.clone()),
            backend_version: b.version.clone(),
            fingerprint: self.parts.hardware.fingerprint.clone(),
            key: key.validity_hex(),
            bucket: key.buckets().map(|bk| bk.text(op)).unwrap_or_default(),
            passed: false,
            nmse: Some(a.nmse),
            max_abs: Some(a.max_abs),
            cosine: Some(a.cosine),
            detail: Some(format!("shadow check on {}: {}", a.compared, a.problems.join("; "))),
            origin: "shadow check".to_owned(),
            created_at: crate::time::now_unix(),
        };
        let dtype = args.tensors().first().map(|(_, t)| t.dtype().to_string()).unwrap_or_default();
        Some(Verdict::Diverged(message, Box::new(Divergence { fact, dtype, rtol: a.rtol, atol: a.atol })))
    }

    /// Writes a diverged check's failing record to the PerfDB (when the handle has one) and
    /// makes selection refuse the kernel for that kind of request from now on.
    #[cold]
    fn record_divergence(&self, d: &Divergence, persist: bool) {
        #[cfg(feature = "perfdb")]
        if persist
            && let Some(path) = &self.parts.perfdb
            && let Err(e) = write_record(path, d, &self.parts.catalog)
        {
            tracing::warn!(target: "layerzero::shadow", perfdb = %path.display(), error = %e,
                "could not write the shadow check's parity record");
        }
        self.learn_parity(vec![d.fact.clone()]);
    }
}

/// How a kernel's outputs compare with the reference's on a cut of the same inputs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Agreement {
    /// What was compared: `3 of 16 rows`, `4 query positions`, `the whole call`.
    pub(crate) compared: String,
    /// The lowest cosine of a float output (1 when none is float).
    pub(crate) cosine: f64,
    /// The largest NMSE.
    pub(crate) nmse: f64,
    /// The largest absolute difference.
    pub(crate) max_abs: f64,
    /// The loosest tolerance applied.
    pub(crate) rtol: f64,
    /// Its absolute part.
    pub(crate) atol: f64,
    /// What is wrong, in words; empty when the kernel agrees.
    pub(crate) problems: Vec<String>,
}

/// Runs `reference` on `rows` rows of `args` (see [`slice`]) and compares its outputs with
/// the same rows of `outputs`, a call of the kernel `spec` on `args`: the §5 tolerance of the
/// op and dtype (the kernel's `error_bound` where looser) and, for float outputs, a cosine of
/// at least [`MIN_COSINE`]. An error says why no comparison could be made.
pub(crate) fn agreement(
    reference: &dyn crate::exec::executor::Executor,
    spec: &crate::capabilities::spec::KernelSpec,
    args: &OpArgs,
    outputs: &Outputs,
    rows: usize,
) -> std::result::Result<Agreement, String> {
    let op = args.op();
    let category = Category::of(op).ok_or_else(|| format!("{op} has no tolerance"))?;
    if op == Op::Sample {
        return Err("sampling is random: not compared".to_owned());
    }
    let (cut_args, cut) = slice::cut(args, rows, WHOLE_LIMIT).ok_or("too large to compare whole")?;
    let ran = layerzero_cpu::fork::in_live_pool(|| catch_unwind(AssertUnwindSafe(|| reference.run(&cut_args))));
    let expected = match ran {
        Ok(Ok(Ok(o))) => o,
        Ok(Ok(Err(e))) => return Err(format!("the reference refused the inputs: {e}")),
        Ok(Err(_)) => return Err("the reference panicked".to_owned()),
        Err(e) => return Err(e),
    };
    let mut a = Agreement {
        compared: match cut {
            slice::Cut::Whole => "the whole call".to_owned(),
            slice::Cut::Rows(p) => format!("{} of {} rows", p.count, p.total),
            slice::Cut::Queries { len, .. } => format!("{len} query positions"),
        },
        cosine: 1.0,
        nmse: 0.0,
        max_abs: 0.0,
        rtol: 0.0,
        atol: 0.0,
        problems: Vec::new(),
    };
    for (name, want) in expected.iter() {
        let Some(got) = outputs.get(name).and_then(|t| slice::cut_output(t, cut)) else {
            a.problems.push(format!("output `{name}` is missing or not of the reference's shape"));
            continue;
        };
        if got.shape() != want.shape() {
            a.problems.push(format!("output `{name}` has shape {:?}, the reference's {:?}", got.shape(), want.shape()));
            continue;
        }
        let mut tol = real_call_tolerance(category, want.dtype());
        // A quantized kernel is held to the bound it declares where that is looser.
        if let Some(b) = spec.properties.error_bound.as_ref().and_then(|e| e.get(&want.dtype())) {
            (tol.rtol, tol.atol) = (tol.rtol.max(b.rtol), tol.atol.max(b.atol));
        }
        (a.rtol, a.atol) = (a.rtol.max(tol.rtol), a.atol.max(tol.atol));
        let (w, g) = (want.to_f64_vec(), got.to_f64_vec());
        let d = compare(&w, &g, tol);
        a.nmse = a.nmse.max(d.nmse);
        a.max_abs = a.max_abs.max(d.max_abs);
        if d.violations > 0 {
            a.problems.push(format!(
                "`{name}`: {} of {} elements outside rtol {:e} atol {:e} (max |diff| {:.3e})",
                d.violations, d.elements, tol.rtol, tol.atol, d.max_abs
            ));
        }
        if want.dtype().is_float() {
            let c = cosine(&w, &g);
            a.cosine = a.cosine.min(c);
            if c < MIN_COSINE {
                a.problems.push(format!("`{name}`: cosine {c:.4} with the reference (at least {MIN_COSINE})"));
            }
        }
    }
    Ok(a)
}

/// Stores `fact` as a failing parity record in the PerfDB at `path`.
#[cfg(feature = "perfdb")]
fn write_record(path: &std::path::Path, d: &Divergence, catalog: &Catalog) -> crate::error::Result<()> {
    use crate::perfdb::{ParityRecord, ParityStatus, PerfDb};
    let fact = &d.fact;
    let (backend, op) = catalog.find(&fact.kernel).map_or((String::new(), String::new()), |i| {
        let (b, k) = catalog.kernel(i);
        (b.backend.clone(), k.op.as_str().to_owned())
    });
    let record = ParityRecord {
        kernel: fact.kernel.clone(),
        kernel_version: fact.kernel_version.clone(),
        backend,
        backend_version: fact.backend_version.clone(),
        fingerprint: fact.fingerprint.clone(),
        op,
        dtype: d.dtype.clone(),
        key: fact.key.clone(),
        bucket: fact.bucket.clone(),
        case: "shadow check".to_owned(),
        status: ParityStatus::Fail,
        nmse: fact.nmse,
        max_abs: fact.max_abs,
        cosine: fact.cosine,
        rtol: d.rtol,
        atol: d.atol,
        detail: fact.detail.clone(),
        origin: fact.origin.clone(),
        created_at: fact.created_at,
    };
    PerfDb::open(path)?.db.insert_parity(&[record])
}
