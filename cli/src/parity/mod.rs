//! The parity harness: every executable kernel against `cpu_reference` over the case
//! matrix, with NMSE, max-abs and PASS/FAIL against the specification's tolerance table.

pub mod cases;
pub(crate) mod command;

use std::panic::{AssertUnwindSafe, catch_unwind};

use serde::Serialize;

use cases::Case;
use layerzero::compare::{Diff, Tolerance, compare, cosine, output_tolerance, tolerance};
use layerzero::exec::args::Outputs;
use layerzero::exec::executor::Registry;
use layerzero::model::op::Op;
use layerzero::plan::SelectionKey;
use layerzero::runtime::faults::{self, FaultRule};
use layerzero::select::{Selector, Verdict};

/// The fixed seed of the case matrix.
pub const SEED: u64 = 0x4C5A_5041_5249_5459;

/// Outcome of one (case, kernel) pair.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Case name.
    pub case: String,
    /// Kernel id.
    pub kernel: String,
    /// The case's op.
    pub op: Op,
    /// `pass`, `fail`, `skip` (the kernel's constraints reject the case), or `error`.
    pub status: &'static str,
    /// Output dtype.
    pub dtype: String,
    /// The tolerance applied.
    pub tolerance: Tolerance,
    /// The comparison (absent when skipped or errored).
    pub diff: Option<Diff>,
    /// The lowest cosine similarity of an output with the reference's (absent when skipped
    /// or errored).
    pub cosine: Option<f64>,
    /// The validity key of the case's request (what a parity record is kept under).
    pub key: String,
    /// The perf bucket of the case's request.
    pub bucket: String,
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
pub use layerzero::select::reference_kernel;

fn run_kernel(registry: &Registry, kernel: &str, case: &Case) -> Result<Outputs, String> {
    run_adapted(registry, kernel, case, &[])
}

/// Runs `kernel` on the case as dispatch would: through the transforms selection planned for
/// it (a dtype cast, a contiguous copy), with the outputs cast back.
fn run_adapted(
    registry: &Registry,
    kernel: &str,
    case: &Case,
    transforms: &[layerzero::transform::Transform],
) -> Result<Outputs, String> {
    let exec = registry.get(kernel).ok_or_else(|| format!("no executor for {kernel}"))?;
    let adapted;
    let args = if transforms.is_empty() {
        &case.args
    } else {
        adapted = layerzero::transform::apply_transforms(&case.args, transforms).map_err(|e| e.to_string())?;
        &adapted
    };
    match catch_unwind(AssertUnwindSafe(|| exec.run(args))) {
        Ok(Ok(o)) if transforms.is_empty() => Ok(o),
        Ok(Ok(o)) => layerzero::transform::cast_outputs_back(o, transforms).map_err(|e| e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("{kernel} panicked")),
    }
}

/// Runs every executable kernel of `registry` (but the oracle) matching the filters against
/// the oracle on every case. `selector` judges whether a kernel accepts a case. `faults`
/// (`LAYERZERO_FAULTS`' rules) corrupt the outputs of the kernels they name under the silent
/// modes (`garbage`, `transpose_noop`), as dispatch would: a drill's kernel fails here too.
pub fn run(
    registry: &Registry,
    selector: &Selector,
    op: Option<Op>,
    kernel: Option<&str>,
    faults: &[FaultRule],
) -> Report {
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
        let request = case.args.describe();
        let report = selector.explain(&request);
        let sk = SelectionKey::derive(&request);
        let (key, bucket) = (sk.validity_hex(), sk.buckets().map(|b| b.text(op)).unwrap_or_default());
        let reference = run_kernel(registry, &oracle, &case);
        for k in kernels {
            let dtype =
                case.args.tensors().first().map(|(_, t)| t.dtype()).unwrap_or(layerzero::model::dtype::DType::F32);
            let tol = tolerance(case.category, dtype);
            let mut row = Row {
                case: case.name.clone(),
                kernel: k.clone(),
                op,
                status: "pass",
                dtype: dtype.to_string(),
                tolerance: tol,
                diff: None,
                cosine: None,
                key: key.clone(),
                bucket: bucket.clone(),
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
            let backend = verdict.map(|c| c.backend.as_str()).unwrap_or_default();
            let fault = faults::rule_for(faults, &k, backend).map(|r| r.mode);
            let ran = run_adapted(registry, &k, &case, transforms).map(|o| match fault {
                Some(mode) => faults::corrupt(mode, o),
                None => o,
            });
            match ran {
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
                        let (want, got) = (r.to_f64_vec(), o.to_f64_vec());
                        let d = compare(&want, &got, output_tolerance(case.category, r.dtype()));
                        let c = cosine(&want, &got);
                        row.cosine = Some(row.cosine.map_or(c, |was: f64| was.min(c)));
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

/// Synthesized inputs ([`layerzero::exec::synth`]) for every request of the parity matrix and of
/// the selection table run on the reference kernels.
#[cfg(test)]
mod synth_runs {
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use super::cases;
    use crate::TestResult;
    use layerzero::exec::executor::Registry;
    use layerzero::exec::synth::synthesize;
    use layerzero::model::op::Op;
    use layerzero::model::request::Request;

    fn reference(op: Op) -> String {
        format!("cpu_reference.{}.naive", op.as_str())
    }

    /// Synthesizes inputs for `req` and runs the reference kernel of its op on them.
    fn run_reference(registry: &Registry, req: &Request, what: &str) -> TestResult {
        let args = synthesize(req, 7).map_err(|e| format!("{what}: {e}"))?;
        assert_eq!(args.describe().op, req.op);
        let kernel = reference(req.op);
        let exec = registry.get(&kernel).ok_or_else(|| format!("{what}: no executor {kernel}"))?;
        let out = catch_unwind(AssertUnwindSafe(|| exec.run(&args))).map_err(|_| format!("{what}: panicked"))?;
        let out = out.map_err(|e| format!("{what}: {kernel} failed: {e}"))?;
        assert!(!out.is_empty(), "{what}: no outputs");
        Ok(())
    }

    #[test]
    fn every_parity_case_request_synthesizes_and_runs_on_the_reference() -> TestResult {
        // The parity matrix covers every executable op with its variants (masks, ragged
        // packs, paged caches in both layouts and fp8, strided views, int4/int8 weights).
        let registry = layerzero::host::builtin_registry();
        let mut ops = std::collections::BTreeSet::new();
        for case in cases::matrix(None, 1) {
            let req = case.args.describe();
            ops.insert(req.op);
            run_reference(&registry, &req, &case.name)?;
        }
        let executable: Vec<Op> = Op::ALL.iter().copied().filter(|o| *o != Op::Tokenize).collect();
        for op in executable {
            assert!(ops.contains(&op), "no case covers {op}");
        }
        Ok(())
    }

    #[test]
    fn the_cpu_requests_of_the_selection_table_synthesize_and_run() -> TestResult {
        let text = include_str!("../../../tests/data/selection_cases.json");
        let cases: serde_json::Value = serde_json::from_str(text)?;
        let registry = layerzero::host::builtin_registry();
        let cpu = ["zen4", "zen3", "spr", "icx"];
        let mut ran = 0;
        for c in cases.as_array().ok_or("the selection cases are a list")? {
            if !cpu.contains(&c["hardware"].as_str().unwrap_or("")) {
                continue;
            }
            let Ok(req) = Request::from_value(c["request"].clone()) else { continue };
            let name = c["name"].as_str().unwrap_or("?");
            // Some cases are rejected by every kernel on purpose; they must still synthesize.
            let args = synthesize(&req, 3).map_err(|e| format!("{name}: {e}"))?;
            assert_eq!(args.op(), req.op);
            // Keep the test quick in debug builds: run the reference on the request with its
            // perf axes (batch, sequence, tokens) cut to at most 8, when that is small enough.
            let small = match layerzero::key::axes::values(&req) {
                Some((v, n)) if n > 0 => {
                    let to: Vec<u64> = v[..n].iter().map(|&x| x.min(8)).collect();
                    layerzero::key::axes::resize(&req, &to).map_err(|e| format!("{name}: {e}"))?
                }
                _ => req.clone(),
            };
            if small.tensors.values().map(|t| t.numel()).sum::<u64>() > 1 << 20 {
                continue;
            }
            let args = synthesize(&small, 3).map_err(|e| format!("{name}: {e}"))?;
            if req.op != Op::Tokenize && registry.contains(&reference(req.op)) {
                let exec = registry.get(&reference(req.op)).ok_or("the reference is registered")?;
                // The run may refuse the request (some are refused on purpose); it must not panic.
                let _ = catch_unwind(AssertUnwindSafe(|| exec.run(&args))).map_err(|_| format!("{name}: panic"))?;
                ran += 1;
            }
        }
        assert!(ran >= 5, "only {ran} CPU requests ran");
        Ok(())
    }
}
