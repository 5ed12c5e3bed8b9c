//! `lz run`: load inputs, select (or force) a kernel, execute it, write the outputs.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::{Outcome, print_json, render};
use layerzero::capabilities::catalog::Catalog;
use layerzero::error::{Error, Result};
use layerzero::exec::args::OpArgs;
use layerzero::health::HealthReport;
use layerzero::policy::{Action, Policy, Rule};
use layerzero::runtime::{Dispatch, LayerZero, PlanMode, SelectionSource};
use layerzero::tensor::HostTensor;
use layerzero::tensor::io;

/// What the repeated dispatches did.
#[derive(Debug, Default, serde::Serialize)]
struct Repeats {
    /// Dispatches whose first choice did not run.
    fell_back: usize,
    /// Kernels that produced the outputs, with counts.
    kernels: BTreeMap<String, usize>,
    /// Reason codes of the attempts that did not run, with counts.
    reasons: BTreeMap<String, usize>,
}

impl Repeats {
    fn count(&mut self, d: &Dispatch<'_>) {
        self.fell_back += usize::from(d.fell_back());
        *self.kernels.entry(d.selection().kernel.clone()).or_default() += 1;
        for r in d.failed().iter().filter_map(|a| a.reason.as_ref()) {
            *self.reasons.entry(r.code().as_str().to_owned()).or_default() += 1;
        }
    }
}

/// What `lz run` was asked to do.
pub(super) struct RunArgs<'a> {
    pub request: &'a str,
    pub inputs: &'a Path,
    pub out: &'a Path,
    pub kernel: Option<&'a str>,
    pub policy: Option<Policy>,
    pub repeat: usize,
    pub table: Option<&'a Path>,
    pub plan_mode: PlanMode,
    pub json: bool,
}

pub(super) fn run(mut a: RunArgs<'_>, catalog: Arc<Catalog>) -> Result<Outcome> {
    let args = load_args(&a)?;
    let policy = policy(a.policy.take(), a.kernel, &catalog)?;
    let runtime = runtime(&a, catalog, policy)?;
    let dispatch = runtime.dispatch(&args)?;
    let (timing, repeats) = repeat(&runtime, &args, a.repeat)?;
    let health = runtime.health_report();
    let outputs: BTreeMap<String, HostTensor> = dispatch.outputs.clone().into_map();
    io::write_output(a.out, &outputs, &[a.inputs, Path::new(a.request)])?;
    let report = Report { dispatch, outputs, timing, repeats, health };
    if a.json {
        print_json(&report.to_json(&a));
    } else {
        report.print(&a);
    }
    Ok(Outcome::Ok)
}

/// The request with its input tensors.
fn load_args(a: &RunArgs<'_>) -> Result<OpArgs> {
    let request = super::load_request(a.request)?;
    let inputs = io::read(a.inputs)?;
    OpArgs::from_request(&request, inputs).map_err(|e| Error::invalid(format!("{}: {e}", a.inputs.display())))
}

/// The policy given (or the default) with a forced kernel locked in and outputs checked.
fn policy(given: Option<Policy>, kernel: Option<&str>, catalog: &Catalog) -> Result<Policy> {
    let mut policy = given.unwrap_or_default();
    if let Some(k) = kernel {
        if catalog.find(k).is_none() {
            return Err(Error::invalid(format!(
                "--kernel {k:?} is not a kernel of the catalog (see `lz list-kernels`)"
            )));
        }
        // A forced kernel is a lock: it must still pass every check.
        policy.rules.insert(0, Rule::new(Action::Lock, k).from_origin(format!("--kernel {k:?}")));
    }
    // `lz run` checks outputs for NaN/Inf from finite inputs unless told otherwise; the knobs
    // that override policy fields apply on top.
    policy.validate_outputs = true;
    policy.apply_overrides(&super::knobs().policy_overrides());
    Ok(policy)
}

/// The handle that selects and runs: `policy`, the knobs' cache size and faults, and the
/// dispatch table if one is given.
fn runtime(a: &RunArgs<'_>, catalog: Arc<Catalog>, policy: Policy) -> Result<LayerZero> {
    let slots = usize::try_from(super::knobs().cache_capacity).unwrap_or(usize::MAX);
    let mut runtime = LayerZero::detected_with(catalog)?
        .with_policy(policy)?
        .with_cache_capacity(slots)
        // `lz run` reports NaN/Inf inputs; serving handles skip the scan.
        .with_input_check(true);
    if let Some(path) = a.table {
        runtime = runtime.with_plan_file(path, a.plan_mode)?;
    }
    if let Some(spec) = &super::knobs().faults {
        runtime = runtime.with_faults(spec)?;
    }
    Ok(runtime)
}

/// Dispatches `args` `n` more times: the median, min and max time (none when `n` is 0), and
/// what the dispatches did. Each is a whole dispatch (selection, health, fallback), so a
/// drill with LAYERZERO_FAULTS sees breakers open and close across them.
fn repeat(runtime: &LayerZero, args: &OpArgs, n: usize) -> Result<(Option<serde_json::Value>, Repeats)> {
    let mut repeats = Repeats::default();
    if n == 0 {
        return Ok((None, repeats));
    }
    // The inputs were scanned once already; the repeats time the dispatch, not the scan.
    runtime.set_input_check(false);
    let mut ns = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let d = runtime.dispatch(args)?;
        ns.push(t.elapsed().as_nanos() as f64);
        repeats.count(&d);
    }
    ns.sort_by(f64::total_cmp);
    let timing = serde_json::json!({
        "repeat": n,
        "median_ns": ns[ns.len() / 2],
        "min_ns": ns[0],
        "max_ns": ns[ns.len() - 1],
    });
    Ok((Some(timing), repeats))
}

/// What `lz run` did, to report.
struct Report<'r> {
    /// The first dispatch, whose outputs were written.
    dispatch: Dispatch<'r>,
    outputs: BTreeMap<String, HostTensor>,
    /// Of the repeats, if any.
    timing: Option<serde_json::Value>,
    repeats: Repeats,
    /// After every dispatch.
    health: HealthReport,
}

impl Report<'_> {
    /// The `--json` document (`schemas/run_report.schema.json`).
    fn to_json(&self, a: &RunArgs<'_>) -> serde_json::Value {
        let sel = self.dispatch.selection();
        let outs: serde_json::Map<String, serde_json::Value> = self
            .outputs
            .iter()
            .map(|(k, t)| (k.clone(), serde_json::json!({"dtype": t.dtype(), "shape": t.shape()})))
            .collect();
        serde_json::json!({
            "kernel": sel.kernel,
            "backend": sel.backend,
            "source": self.dispatch.source(),
            "plan_notes": self.dispatch.notes(),
            "fell_back": self.dispatch.fell_back(),
            "attempts": self.dispatch.attempts(),
            "transforms": sel.transforms,
            "score": sel.score,
            "input_flags": self.dispatch.input_flags(),
            "outputs": outs,
            "out_file": a.out.display().to_string(),
            "timing": self.timing,
            "repeats": self.repeats,
            "health": self.health,
        })
    }

    /// The text report: what ran and how it was chosen, then what it produced.
    fn print(&self, a: &RunArgs<'_>) {
        self.print_selection();
        self.print_results(a);
    }

    /// The kernel and where its selection came from, the plan's notes, the fallbacks, the
    /// transforms and the input warnings.
    fn print_selection(&self) {
        let (d, sel) = (&self.dispatch, self.dispatch.selection());
        let source = match d.source() {
            SelectionSource::Plan => "dispatch table",
            SelectionSource::Cache => "selection cache",
            SelectionSource::Live => "live selection",
        };
        println!("kernel:    {} ({}, from the {source})", sel.kernel, sel.backend);
        for n in d.notes() {
            println!("plan:      {n}");
        }
        for at in d.failed() {
            if let Some(r) = &at.reason {
                println!("fallback:  {} did not run: {r}", at.kernel);
            }
        }
        for t in &sel.transforms {
            println!("transform: {} {} {} -> {}", t.kind.as_str(), t.tensor, t.from, t.to);
        }
        for f in d.input_flags() {
            println!("warning:   input `{}` has {} NaN and {} Inf values; computed anyway", f.tensor, f.nan, f.inf);
        }
    }

    /// The outputs written, the repeats' time and fallbacks, and the breakers not closed.
    fn print_results(&self, a: &RunArgs<'_>) {
        for (name, t) in &self.outputs {
            println!("output:    {name} {} {:?} -> {}", t.dtype(), t.shape(), a.out.display());
        }
        if let Some(t) = &self.timing {
            let med = t["median_ns"].as_f64().unwrap_or(0.0);
            println!("timing:    median {} over {} dispatches", render::duration(med), a.repeat);
        }
        let repeats = &self.repeats;
        if repeats.fell_back > 0 {
            let kernels: Vec<String> = repeats.kernels.iter().map(|(k, n)| format!("{k} x{n}")).collect();
            let reasons: Vec<String> = repeats.reasons.iter().map(|(c, n)| format!("{c} x{n}")).collect();
            println!(
                "repeats:   {} of {} fell back; ran {}; reasons {}",
                repeats.fell_back,
                a.repeat,
                kernels.join(", "),
                reasons.join(", ")
            );
        }
        let health = &self.health;
        for b in health.kernels.iter().chain(&health.backends).filter(|b| b.state != "closed") {
            println!("health:    {} is {} ({})", b.name, b.state, b.last_failure.as_deref().unwrap_or(""));
        }
    }
}
