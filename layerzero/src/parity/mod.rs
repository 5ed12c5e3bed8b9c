//! The parity harness: every executable kernel against `cpu_reference` over the case
//! matrix, with NMSE, max-abs and PASS/FAIL against the specification's tolerance table.

pub mod cases;
pub use crate::compare;
pub use crate::tensor::rng;

use std::panic::{AssertUnwindSafe, catch_unwind};

use serde::Serialize;

use crate::exec::args::Outputs;
use crate::exec::executor::Registry;
use crate::model::op::Op;
use crate::select::{Selector, Verdict};
use cases::Case;
use compare::{Diff, Tolerance, compare, output_tolerance, tolerance};

/// The fixed seed of the case matrix.
pub const SEED: u64 = 0x4C5A_5041_5249_5459;

/// Outcome of one (case, kernel) pair.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Case name.
    pub case: String,
    /// Kernel id.
    pub kernel: String,
    /// `pass`, `fail`, `skip` (the kernel's constraints reject the case), or `error`.
    pub status: &'static str,
    /// Output dtype.
    pub dtype: String,
    /// The tolerance applied.
    pub tolerance: Tolerance,
    /// The comparison (absent when skipped or errored).
    pub diff: Option<Diff>,
    /// Why it was skipped or errored.
    pub detail: Option<String>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Seed of the case matrix.
    pub seed: u64,
    /// Every row.
    pub rows: Vec<Row>,
    /// Rows that passed.
    pub passed: usize,
    /// Rows that failed or errored.
    pub failed: usize,
    /// Rows skipped.
    pub skipped: usize,
}

/// The oracle's kernel id for an op.
pub fn reference_kernel(op: Op) -> String {
    format!("cpu_reference.{op}.naive")
}

fn run_kernel(registry: &Registry, kernel: &str, case: &Case) -> Result<Outputs, String> {
    run_adapted(registry, kernel, case, &[])
}

/// Runs `kernel` on the case as dispatch would: through the transforms selection planned for
/// it (a dtype cast, a contiguous copy), with the outputs cast back.
fn run_adapted(
    registry: &Registry,
    kernel: &str,
    case: &Case,
    transforms: &[crate::transform::Transform],
) -> Result<Outputs, String> {
    let exec = registry.get(kernel).ok_or_else(|| format!("no executor for {kernel}"))?;
    let adapted;
    let args = if transforms.is_empty() {
        &case.args
    } else {
        adapted = crate::transform::apply_transforms(&case.args, transforms).map_err(|e| e.to_string())?;
        &adapted
    };
    match catch_unwind(AssertUnwindSafe(|| exec.run(args))) {
        Ok(Ok(o)) if transforms.is_empty() => Ok(o),
        Ok(Ok(o)) => crate::transform::cast_outputs_back(o, transforms).map_err(|e| e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("{kernel} panicked")),
    }
}

/// Runs every executable kernel of `registry` (but the oracle) matching the filters against
/// the oracle on every case. `selector` judges whether a kernel accepts a case.
pub fn run(registry: &Registry, selector: &Selector, op: Option<Op>, kernel: Option<&str>) -> Report {
    let mut rows = Vec::new();
    for case in cases::matrix(op, SEED) {
        let op = case.args.op();
        let oracle = reference_kernel(op);
        let kernels: Vec<String> = registry
            .kernels()
            .filter(|k| k.split('.').nth(1) == Some(op.as_str()) && *k != oracle)
            .filter(|k| kernel.is_none_or(|want| want == *k))
            .map(str::to_owned)
            .collect();
        if kernels.is_empty() {
            continue;
        }
        let report = selector.explain(&case.args.describe());
        let reference = run_kernel(registry, &oracle, &case);
        for k in kernels {
            let dtype = case.args.tensors().first().map(|(_, t)| t.dtype()).unwrap_or(crate::model::dtype::DType::F32);
            let tol = tolerance(case.category, dtype);
            let mut row = Row {
                case: case.name.clone(),
                kernel: k.clone(),
                status: "pass",
                dtype: dtype.to_string(),
                tolerance: tol,
                diff: None,
                detail: None,
            };
            if let Some(e) = report.request_errors.first() {
                // Every case of the matrix is meant to be valid: an invalid one is a bug.
                row.status = "error";
                row.detail = Some(format!("the case's request is invalid: {e}"));
                rows.push(row);
                continue;
            }
            let verdict = report.candidate(&k);
            if let Some(c) = verdict.filter(|c| c.verdict == Verdict::Rejected) {
                row.status = "skip";
                row.detail = Some(c.reasons.iter().map(|r| r.code().as_str()).collect::<Vec<_>>().join(" "));
                rows.push(row);
                continue;
            }
            let reference = match &reference {
                Ok(r) => r,
                Err(e) => {
                    row.status = "error";
                    row.detail = Some(format!("reference failed: {e}"));
                    rows.push(row);
                    continue;
                }
            };
            let transforms = verdict.map(|c| c.transforms.as_slice()).unwrap_or_default();
            match run_adapted(registry, &k, &case, transforms) {
                Err(e) => {
                    row.status = "error";
                    row.detail = Some(e);
                }
                Ok(out) => {
                    let mut worst: Option<Diff> = None;
                    for (name, r) in reference {
                        let Some(o) = out.get(name) else {
                            row.status = "error";
                            row.detail = Some(format!("output `{name}` missing"));
                            break;
                        };
                        if o.shape() != r.shape() {
                            row.status = "error";
                            row.detail =
                                Some(format!("output `{name}` shape {:?} != reference {:?}", o.shape(), r.shape()));
                            break;
                        }
                        let d = compare(&r.to_f64_vec(), &o.to_f64_vec(), output_tolerance(case.category, r.dtype()));
                        if worst.is_none_or(|w| {
                            d.violations > w.violations || (d.violations == w.violations && d.nmse > w.nmse)
                        }) {
                            worst = Some(d);
                        }
                    }
                    if row.status == "pass" {
                        if worst.is_some_and(|w| w.violations > 0) {
                            row.status = "fail";
                        }
                        row.diff = worst;
                    }
                }
            }
            rows.push(row);
        }
    }
    let count = |s: &str| rows.iter().filter(|r| r.status == s).count();
    let (passed, skipped) = (count("pass"), count("skip"));
    let failed = count("fail") + count("error");
    Report { seed: SEED, rows, passed, failed, skipped }
}
