//! `lz run`: load inputs, select (or force) a kernel, execute it, write the outputs.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::{Outcome, print_json, render};
use layerzero::capabilities::catalog::Catalog;
use layerzero::error::{Error, Result};
use layerzero::exec::args::OpArgs;
use layerzero::policy::{Action, Policy, Rule};
use layerzero::runtime::{LayerZero, PlanMode, SelectionSource};
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
    fn count(&mut self, d: &layerzero::runtime::Dispatch<'_>) {
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

pub(super) fn run(a: RunArgs<'_>, catalog: Arc<Catalog>) -> Result<Outcome> {
    let request = super::load_request(a.request)?;
    let inputs = io::read(a.inputs)?;
    let args =
        OpArgs::from_request(&request, inputs).map_err(|e| Error::invalid(format!("{}: {e}", a.inputs.display())))?;
    let mut policy = a.policy.unwrap_or_default();
    if let Some(k) = a.kernel {
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
    let dispatch = runtime.dispatch(&args)?;
    // Each repeat is a whole dispatch (selection, health, fallback), so a drill with
    // LAYERZERO_FAULTS sees breakers open and close across the repeats.
    let mut timing = None;
    let mut repeats = Repeats::default();
    if a.repeat > 0 {
        // The inputs were scanned once above; the repeats time the dispatch, not the scan.
        runtime.set_input_check(false);
        let mut ns = Vec::with_capacity(a.repeat);
        for _ in 0..a.repeat {
            let t = Instant::now();
            let d = runtime.dispatch(&args)?;
            ns.push(t.elapsed().as_nanos() as f64);
            repeats.count(&d);
        }
        ns.sort_by(f64::total_cmp);
        timing = Some(serde_json::json!({
            "repeat": a.repeat,
            "median_ns": ns[ns.len() / 2],
            "min_ns": ns[0],
            "max_ns": ns[ns.len() - 1],
        }));
    }
    let health = runtime.health_report();
    let outputs: BTreeMap<String, _> = dispatch.outputs.clone().into_map();
    io::write_output(a.out, &outputs, &[a.inputs, Path::new(a.request)])?;
    let sel = dispatch.selection();
    if a.json {
        let outs: serde_json::Map<String, serde_json::Value> = outputs
            .iter()
            .map(|(k, t)| (k.clone(), serde_json::json!({"dtype": t.dtype(), "shape": t.shape()})))
            .collect();
        print_json(&serde_json::json!({
            "kernel": sel.kernel,
            "backend": sel.backend,
            "source": dispatch.source(),
            "plan_notes": dispatch.notes(),
            "fell_back": dispatch.fell_back(),
            "attempts": dispatch.attempts(),
            "transforms": sel.transforms,
            "score": sel.score,
            "input_flags": dispatch.input_flags(),
            "outputs": outs,
            "out_file": a.out.display().to_string(),
            "timing": timing,
            "repeats": repeats,
            "health": health,
        }));
    } else {
        println!(
            "kernel:    {} ({}, from the {})",
            sel.kernel,
            sel.backend,
            match dispatch.source() {
                SelectionSource::Plan => "dispatch table",
                SelectionSource::Cache => "selection cache",
                SelectionSource::Live => "live selection",
            }
        );
        for n in dispatch.notes() {
            println!("plan:      {n}");
        }
        for at in dispatch.failed() {
            if let Some(r) = &at.reason {
                println!("fallback:  {} did not run: {r}", at.kernel);
            }
        }
        for t in &sel.transforms {
            println!("transform: {} {} {} -> {}", t.kind.as_str(), t.tensor, t.from, t.to);
        }
        for f in dispatch.input_flags() {
            println!("warning:   input `{}` has {} NaN and {} Inf values; computed anyway", f.tensor, f.nan, f.inf);
        }
        for (name, t) in &outputs {
            println!("output:    {name} {} {:?} -> {}", t.dtype(), t.shape(), a.out.display());
        }
        if let Some(t) = &timing {
            let med = t["median_ns"].as_f64().unwrap_or(0.0);
            println!("timing:    median {} over {} dispatches", render::duration(med), a.repeat);
        }
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
        for b in health.kernels.iter().chain(&health.backends).filter(|b| b.state != "closed") {
            println!("health:    {} is {} ({})", b.name, b.state, b.last_failure.as_deref().unwrap_or(""));
        }
    }
    Ok(Outcome::Ok)
}
