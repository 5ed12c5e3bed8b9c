//! PyTorch golden fixtures (`tests/fixtures/*.safetensors`, made by `tools/gen_fixtures.py`):
//! every builtin kernel of a fixture's op runs on the stored inputs (through the transforms
//! selection plans for it) and must match the stored
//! `expected` (and every `expected_*` output) within the tolerance of the specification's
//! table (§5); integer and fp8 outputs must match exactly.
//! A fixture that no kernel checked is a failure too.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use layerzero::compare::{Category, compare, output_tolerance};
use layerzero::exec::args::OpArgs;
use layerzero::exec::executor::{KernelError, Registry};
use layerzero::model::request::Request;
use layerzero::schema::{SchemaKind, violations};
use layerzero::select::{Selector, Verdict};
use layerzero::tensor::{HostTensor, io};
use layerzero::transform::{apply_transforms, cast_outputs_back};
use layerzero_tests::{TestResult, repo_root};
use safetensors::SafeTensors;

/// Where the fixtures live.
pub(crate) fn fixture_dir() -> PathBuf {
    repo_root().join("tests").join("fixtures")
}

fn fixture_paths() -> TestResult<Vec<PathBuf>> {
    let dir = fixture_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}

/// One fixture file, decoded.
pub(crate) struct Fixture {
    name: String,
    pub(crate) request_json: String,
    category: String,
    source: String,
    /// Input tensors by request role name.
    pub(crate) inputs: BTreeMap<String, HostTensor>,
    /// Expected outputs by output name (`out`, `out_k`, `residual_out`, `scale`, `experts`, ...).
    pub(crate) expected: BTreeMap<String, HostTensor>,
}

pub(crate) fn load(path: &Path) -> Result<Fixture, String> {
    let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| format!("bad safetensors header: {e}"))?;
    let meta = meta.metadata().clone().unwrap_or_default();
    let field = |k: &str| meta.get(k).cloned().ok_or_else(|| format!("metadata has no `{k}`"));
    let (request_json, category, source) = (field("request")?, field("op_category")?, field("source")?);
    let mut inputs = io::parse(&bytes, &path.display().to_string()).map_err(|e| e.to_string())?;
    // `expected` is the output `out`, `expected_k` RoPE's `out_k`, `expected_<name>` the output `<name>`.
    let mut expected = BTreeMap::new();
    let stored: Vec<String> = inputs.keys().filter(|k| k.starts_with("expected")).cloned().collect();
    for key in stored {
        let out = match key.as_str() {
            "expected" => "out",
            "expected_k" => "out_k",
            other => match other.strip_prefix("expected_") {
                Some(suffix) if !suffix.is_empty() => suffix,
                _ => return Err(format!("tensor `{other}` is neither an input nor `expected_<output>`")),
            },
        }
        .to_owned();
        if let Some(t) = inputs.remove(&key) {
            expected.insert(out, t);
        }
    }
    if expected.is_empty() {
        return Err("no `expected` or `expected_*` tensor".to_owned());
    }
    Ok(Fixture { name, request_json, category, source, inputs, expected })
}

/// The tolerance-table row of a fixture's `op_category`.
fn category(name: &str) -> Option<Category> {
    match name {
        "attention" => Some(Category::Attention),
        "rope" => Some(Category::Rope),
        "norms" => Some(Category::Norms),
        "gemm" => Some(Category::Gemm),
        _ => None,
    }
}

/// A row of the failure table.
struct Failure {
    fixture: String,
    kernel: String,
    nmse: Option<f64>,
    max_abs: Option<f64>,
    what: String,
}

fn fail(fixture: &str, kernel: &str, what: impl Into<String>) -> Failure {
    Failure { fixture: fixture.to_owned(), kernel: kernel.to_owned(), nmse: None, max_abs: None, what: what.into() }
}

/// Runs every builtin kernel of the fixture's op; returns the failures and the kernels that
/// produced a checked output.
fn check(fx: &Fixture, registry: &Registry, host: &Selector, failures: &mut Vec<Failure>) -> TestResult<Vec<String>> {
    let name = fx.name.as_str();
    let json: serde_json::Value = match serde_json::from_str(&fx.request_json) {
        Ok(v) => v,
        Err(e) => {
            failures.push(fail(name, "-", format!("request metadata is not JSON: {e}")));
            return Ok(Vec::new());
        }
    };
    match violations(SchemaKind::Request, &json) {
        Ok(errs) if errs.is_empty() => {}
        Ok(errs) => failures.push(fail(name, "-", format!("request violates the schema: {errs:?}"))),
        Err(e) => failures.push(fail(name, "-", format!("schema: {e}"))),
    }
    let request = match Request::from_json(&fx.request_json) {
        Ok(r) => r,
        Err(e) => {
            failures.push(fail(name, "-", format!("request does not parse: {e}")));
            return Ok(Vec::new());
        }
    };
    // A fixture is a valid request: selection must not call it inconsistent.
    if let Some(e) = layerzero::model::problem::Problem::describe(&request).errors.first() {
        failures.push(fail(name, "-", format!("the request is invalid for selection: {e}")));
    }
    let op = request.op.as_str();
    // The row of `op` (the rows of `parity::cases`); tokenization's fixtures say `tokenizers`.
    let named = category(&fx.category);
    if named != Category::of(request.op) || (named.is_none() && fx.category != "tokenizers") {
        failures.push(fail(name, "-", format!("op_category `{}` for op {op}", fx.category)));
    }
    let args = match OpArgs::from_request(&request, fx.inputs.clone()) {
        Ok(a) => a,
        Err(e) => {
            failures.push(fail(name, "-", format!("arguments: {e}")));
            return Ok(Vec::new());
        }
    };
    // The capabilities say which kernels must take this request on this machine (its detected
    // profile, every backend counted as installed): an ISA the CPU lacks refuses the dtypes
    // that need it.
    let report = host.explain(&request);
    let admitted = |kernel: &str| report.candidate(kernel).is_some_and(|c| c.verdict != Verdict::Rejected);
    let mut checked = Vec::new();
    let kernels: Vec<String> =
        registry.kernels().filter(|k| k.split('.').nth(1) == Some(op)).map(str::to_owned).collect();
    for kernel in &kernels {
        let Some(exec) = registry.get(kernel) else { continue };
        // As dispatch runs it: through the transforms selection plans for it (an NCHW image
        // copied to NHWC for a channels-last kernel), its outputs cast back.
        let transforms = report.candidate(kernel).map(|c| c.transforms.clone()).unwrap_or_default();
        let run = || {
            let adapted = apply_transforms(&args, &transforms).map_err(|e| KernelError::Failed(e.to_string()))?;
            let outputs = exec.run(&adapted)?;
            cast_outputs_back(outputs, &transforms).map_err(|e| KernelError::Failed(e.to_string()))
        };
        let outputs = match catch_unwind(AssertUnwindSafe(run)) {
            Ok(Ok(o)) => o,
            Ok(Err(KernelError::Unsupported(why) | KernelError::CompileFailed(why))) if !admitted(kernel) => {
                eprintln!("fixture {name}: {kernel} skipped (refused here, and its capabilities agree): {why}");
                continue;
            }
            Ok(Err(e)) => {
                failures.push(fail(name, kernel, format!("error: {e}")));
                continue;
            }
            Err(_) => {
                failures.push(fail(name, kernel, "panicked"));
                continue;
            }
        };
        for (out_name, exp) in &fx.expected {
            let Some(got) = outputs.get(out_name) else {
                failures.push(fail(name, kernel, format!("no output `{out_name}`")));
                continue;
            };
            if got.shape() != exp.shape() || got.dtype() != exp.dtype() {
                failures.push(fail(
                    name,
                    kernel,
                    format!(
                        "`{out_name}` is {} {:?}; expected {} {:?}",
                        got.dtype(),
                        got.shape(),
                        exp.dtype(),
                        exp.shape()
                    ),
                ));
                continue;
            }
            let Some(tol) = category(&fx.category).map(|c| output_tolerance(c, exp.dtype())) else {
                failures.push(fail(name, kernel, format!("no tolerance for {} {}", fx.category, exp.dtype())));
                continue;
            };
            let d = compare(&exp.to_f64_vec(), &got.to_f64_vec(), tol);
            if d.violations > 0 {
                let (i, r, o) = d.first_violation.unwrap_or((0, 0.0, 0.0));
                failures.push(Failure {
                    fixture: name.to_owned(),
                    kernel: kernel.clone(),
                    nmse: Some(d.nmse),
                    max_abs: Some(d.max_abs),
                    what: format!(
                        "`{out_name}`: {} of {} elements outside rtol={:e} atol={:e} (first: [{i}] expected {r} got {o})",
                        d.violations,
                        exp.numel(),
                        tol.rtol,
                        tol.atol
                    ),
                });
            } else {
                eprintln!("fixture {name}: {kernel} `{out_name}` nmse={:.3e} max_abs={:.3e}", d.nmse, d.max_abs);
            }
        }
        // A wrong answer counts as a run too: its failure is already recorded.
        checked.push(kernel.clone());
    }
    if checked.is_empty() {
        failures.push(fail(
            name,
            "-",
            format!("no kernel checked this fixture (kernels of op {op}: {kernels:?}; source: {})", fx.source),
        ));
    }
    Ok(checked)
}

#[test]
fn every_builtin_kernel_matches_the_pytorch_fixtures() -> TestResult {
    let paths = fixture_paths()?;
    assert!(
        paths.len() >= 30,
        "{} fixtures in {}; regenerate with `tools/.venv/bin/python tools/gen_fixtures.py`",
        paths.len(),
        fixture_dir().display()
    );
    let registry = layerzero::builtin_registry();
    let catalog = layerzero::Catalog::builtin()?;
    let profile = Arc::new(layerzero::host::detect::detect_host().profile);
    let host = Selector::planning(catalog, profile, Arc::new(layerzero::Policy::default()))?;
    let mut failures = Vec::new();
    let mut runs = 0;
    let mut ran = std::collections::BTreeSet::new();
    for path in &paths {
        match load(path) {
            Ok(fx) => {
                let checked = check(&fx, &registry, &host, &mut failures)?;
                runs += checked.len();
                ran.extend(checked);
            }
            Err(e) => failures.push(fail(&path.display().to_string(), "-", e)),
        }
    }
    // With oneDNN loaded (`.ci/run` runs this test again with LAYERZERO_ONEDNN_LIB), each of
    // its kernels whose op has fixtures must have been checked against PyTorch.
    if std::env::var_os("LAYERZERO_ONEDNN_LIB").is_some() {
        let onednn: Vec<&str> = registry.kernels().filter(|k| k.starts_with("onednn.")).collect();
        assert!(!onednn.is_empty(), "LAYERZERO_ONEDNN_LIB is set but no oneDNN executor registered");
        let ops: std::collections::BTreeSet<String> =
            ran.iter().filter_map(|k| k.split('.').nth(1)).map(str::to_owned).collect();
        for k in onednn.iter().filter(|k| k.split('.').nth(1).is_some_and(|op| ops.contains(op))) {
            assert!(ran.iter().any(|r| r == k), "{k} checked no PyTorch fixture of its op");
        }
        eprintln!(
            "oneDNN kernels checked against PyTorch: {:?}",
            ran.iter().filter(|k| k.starts_with("onednn.")).collect::<Vec<_>>()
        );
    }
    let table = || {
        let num = |x: Option<f64>| x.map(|v| format!("{v:.3e}")).unwrap_or_else(|| "-".to_owned());
        let mut table = format!(
            "{} failure(s) over {} fixtures ({runs} kernel runs checked):\n{:<56} {:<38} {:>10} {:>10}  what\n",
            failures.len(),
            paths.len(),
            "fixture",
            "kernel",
            "nmse",
            "max_abs"
        );
        for f in &failures {
            table.push_str(&format!(
                "{:<56} {:<38} {:>10} {:>10}  {}\n",
                f.fixture,
                f.kernel,
                num(f.nmse),
                num(f.max_abs),
                f.what
            ));
        }
        table
    };
    assert!(failures.is_empty(), "{}", table());
    Ok(())
}

#[test]
fn every_fixture_is_selected_and_dispatched_end_to_end() -> TestResult {
    // Selection plus execution through the runtime on a CPU profile: every op of every
    // fixture is selectable and executable, backends without an executor here (oneDNN,
    // ZenDNN, PyTorch SDPA) are skipped with a reason, and the result matches PyTorch.
    use layerzero::compare::output_tolerance;
    let catalog = layerzero_tests::catalog()?;
    let hw = std::sync::Arc::new(layerzero::hardware::named::load("spr")?);
    let selector =
        layerzero::select::Selector::planning(catalog, hw, std::sync::Arc::new(layerzero::policy::Policy::default()))?;
    let runtime = layerzero::LayerZero::new(selector, layerzero::builtin_registry())?;
    let mut failures = Vec::new();
    for path in fixture_paths()? {
        let fx = match load(&path) {
            Ok(f) => f,
            Err(e) => {
                failures.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let Some(category) = category(&fx.category) else { continue };
        let request = Request::from_json(&fx.request_json).map_err(|e| format!("{}: {e}", fx.name))?;
        let args = OpArgs::from_request(&request, fx.inputs.clone()).map_err(|e| format!("{}: {e}", fx.name))?;
        let d = match runtime.dispatch(&args) {
            Ok(d) => d,
            Err(e) => {
                failures.push(format!("{}: dispatch failed: {e}", fx.name));
                continue;
            }
        };
        for a in d.failed() {
            let code = a.reason.as_ref().map(|r| r.code().as_str()).unwrap_or_default();
            if code != "EXECUTOR_NOT_REGISTERED" {
                failures.push(format!("{}: {} failed at dispatch: {code}", fx.name, a.kernel));
            }
        }
        for (name, exp) in &fx.expected {
            let Some(got) = d.outputs.get(name) else {
                failures.push(format!("{}: {} produced no `{name}`", fx.name, d.selection().kernel));
                continue;
            };
            let diff = compare(&exp.to_f64_vec(), &got.to_f64_vec(), output_tolerance(category, exp.dtype()));
            if diff.violations > 0 || got.shape() != exp.shape() {
                failures.push(format!(
                    "{}: {} `{name}`: {} elements outside the tolerance",
                    fx.name,
                    d.selection().kernel,
                    diff.violations
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}
