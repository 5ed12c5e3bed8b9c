//! A scenario case dispatched for real on this machine: the same request (shapes, dtypes,
//! layouts, attributes, policy) selected on the host, synthesized inputs run through
//! `LayerZero::dispatch`, and every output held to the `cpu_reference` oracle at the
//! tolerance table of the specification (§5). What the host cannot run is reported as
//! selected only, with the reason.

use std::panic::{AssertUnwindSafe, catch_unwind};

use layerzero::LayerZero;
use layerzero::compare::{Category, check};
use layerzero::exec::args::{OpArgs, Outputs};
use layerzero::exec::synth::synthesize;
use layerzero::model::device::DeviceKind;
use layerzero::model::request::Request;
use layerzero::policy::Policy;
use layerzero::select::{SelectionReport, Verdict};
use layerzero::transform::{apply_transforms, cast_outputs_back};
use layerzero_tests::cases::{Case, check_report, policy_of};

/// The seed of every synthesized input.
pub const SEED: u64 = 0x4532_4552_554e_4e45;

/// Largest modeled memory traffic (bytes) a case is executed at: the inputs, the output and
/// the oracle's f64 copies must fit this machine beside the suite.
pub const BYTES_BUDGET: f64 = 2e9;

/// What happened to a case on this machine.
#[derive(Debug, Clone, PartialEq)]
pub enum HostRun {
    /// Dispatched here and held to the reference.
    Executed {
        /// The kernel that ran (the one the host selected).
        kernel: String,
        /// What was compared.
        detail: String,
    },
    /// Refused here with the request errors the profile refuses it with, by dispatch itself.
    Refused {
        /// The codes of the refusal.
        codes: Vec<String>,
    },
    /// Not executed here; why.
    SelectedOnly {
        /// The reason, as a sentence.
        why: String,
    },
}

fn codes(reasons: &[layerzero::reason::Reason]) -> Vec<String> {
    let mut c: Vec<String> = reasons.iter().map(|r| r.code().as_str().to_owned()).collect();
    c.sort();
    c.dedup();
    c
}

/// Runs `case` on `host` (whose policy is replaced by the case's); `Err` lists every
/// failed check.
/// `gflop` is the most modeled work (GFLOP) executed here (`LAYERZERO_E2E_GFLOP`): the
/// oracle is a naive f64 loop, so a larger case is reported as selected only.
pub fn execute(host: LayerZero, case: &Case, gflop: u64) -> Result<HostRun, Vec<String>> {
    let one = |m: String| vec![m];
    let policy = policy_of(case).map_err(one)?;
    let req = Request::from_value(case.request.clone()).map_err(|e| one(e.to_string()))?;
    // The oracle is judged under the default policy: a case's policy may deny its backend.
    let unpoliced = host.explain(&req);
    let lz = host.with_policy(policy).map_err(|e| one(e.to_string()))?;
    let report = lz.explain(&req);
    let mut errors = case.host.as_ref().map(|e| check_report(&report, e)).unwrap_or_default();
    let run = if let Some(why) = on_a_device(&req) {
        // Host tensors carry no device: a refusal about devices is checked by selection here.
        expected_errors(&report, case, &mut errors);
        HostRun::SelectedOnly { why }
    } else if !report.request_errors.is_empty() {
        refused(&lz, &req, &report, case, &mut errors)
    } else if let Some(why) = not_here(&lz, &report, gflop as f64 * 1e9) {
        HostRun::SelectedOnly { why }
    } else {
        match dispatched(&lz, &req, &report, &unpoliced) {
            Ok(run) => run,
            Err(e) => {
                errors.push(e);
                HostRun::SelectedOnly { why: "failed".to_owned() }
            }
        }
    };
    if errors.is_empty() { Ok(run) } else { Err(errors) }
}

/// A request invalid on the profile is invalid here too, and dispatch refuses it with the
/// same codes.
fn refused(lz: &LayerZero, req: &Request, report: &SelectionReport, case: &Case, errors: &mut Vec<String>) -> HostRun {
    let here = expected_errors(report, case, errors);
    let refusal = match synthesize(req, SEED) {
        Err(e) => codes(e.reasons()),
        Ok(args) => match lz.dispatch(&args) {
            Ok(d) => {
                errors.push(format!("dispatch ran {} on a request selection refuses", d.selection().kernel));
                Vec::new()
            }
            Err(e) => codes(e.reasons()),
        },
    };
    if !errors.is_empty() {
        return HostRun::Refused { codes: refusal };
    }
    if !here.iter().any(|c| refusal.contains(c)) {
        errors.push(format!("dispatch refused with {refusal:?}, none of the request errors {here:?}"));
    }
    HostRun::Refused { codes: refusal }
}

/// The request errors on this machine, each code the case expects among them.
fn expected_errors(report: &SelectionReport, case: &Case, errors: &mut Vec<String>) -> Vec<String> {
    let here = codes(&report.request_errors);
    for want in &case.expect.request_errors {
        if !here.contains(want) {
            errors.push(format!("on this machine the request errors are {here:?}, without {want}"));
        }
    }
    here
}

/// A tensor of the request on a device this suite cannot hand a kernel.
fn on_a_device(req: &Request) -> Option<String> {
    let (name, t) = req.tensors.iter().find(|(_, t)| t.device.is_some_and(|d| d.kind != DeviceKind::Cpu))?;
    let d = t.device.map(|d| d.kind.as_str()).unwrap_or_default();
    Some(format!("needs a GPU: tensor `{name}` is on {d}"))
}

/// Why the host does not execute a valid request, if it does not.
fn not_here(lz: &LayerZero, report: &SelectionReport, flops_budget: f64) -> Option<String> {
    let Some(chosen) = report.selected_candidate() else {
        let available: Vec<String> = report
            .candidates
            .iter()
            .filter(|c| lz.registry().get(&c.kernel).is_some() && !c.backend.starts_with("cpu_reference"))
            .map(|c| format!("{}: {}", c.kernel, codes(&c.reasons).join(" ")))
            .collect();
        return Some(format!("no kernel of this machine takes it ({})", available.join("; ")));
    };
    let model = chosen.score.as_ref().map(|s| s.model).unwrap_or_default();
    if model.flops > flops_budget || model.bytes > BYTES_BUDGET {
        return Some(format!(
            "{:.1} GFLOP / {:.0} MB modeled for {}, above this run's budget ({:.0} GFLOP: LAYERZERO_E2E_GFLOP; {:.0} MB)",
            model.flops / 1e9,
            model.bytes / 1e6,
            chosen.kernel,
            flops_budget / 1e9,
            BYTES_BUDGET / 1e6
        ));
    }
    None
}

/// Dispatches synthesized inputs and holds every output to the oracle.
fn dispatched(
    lz: &LayerZero,
    req: &Request,
    report: &SelectionReport,
    unpoliced: &SelectionReport,
) -> Result<HostRun, String> {
    let selected = report.selected.clone().unwrap_or_default();
    let args = synthesize(req, SEED).map_err(|e| format!("synthesizing the inputs: {e}"))?;
    let d = lz.dispatch(&args).map_err(|e| format!("dispatch: {e}"))?;
    if d.selection().kernel != selected || d.fell_back() {
        return Err(format!(
            "explain selected {selected}, dispatch ran {} (fell back: {:?})",
            d.selection().kernel,
            d.failed()
        ));
    }
    let reference = oracle(lz, unpoliced, &args)?;
    let cat = Category::of(req.op).ok_or_else(|| format!("{} has no row in the tolerance table", req.op))?;
    let mut compared = Vec::new();
    for (name, r) in &reference {
        let o = d.outputs.get(name).ok_or_else(|| format!("{selected}: output `{name}` missing"))?;
        if o.shape() != r.shape() {
            return Err(format!("{selected}: output `{name}` shape {:?}, reference {:?}", o.shape(), r.shape()));
        }
        check(&format!("{selected} `{name}`"), cat, r.dtype(), &r.to_f64_vec(), &o.to_f64_vec())?;
        compared.push(format!("{name} {}{:?}", r.dtype(), r.shape()));
    }
    if compared.is_empty() {
        return Err(format!("the oracle of {} has no outputs to compare", req.op));
    }
    Ok(HostRun::Executed { kernel: selected, detail: format!("{} within {cat:?} tolerance", compared.join(", ")) })
}

/// The oracle's outputs for `args`, through the adaptations selection plans for it.
fn oracle(lz: &LayerZero, report: &SelectionReport, args: &OpArgs) -> Result<Outputs, String> {
    if let OpArgs::Attention(a) = args
        && a.attrs.rope.is_some()
    {
        return rope_chain(a);
    }
    let kernel = format!("cpu_reference.{}.naive", args.op());
    let verdict = report.candidate(&kernel).ok_or_else(|| format!("{kernel} is not a candidate"))?;
    if verdict.verdict == Verdict::Rejected {
        return Err(format!("the oracle {kernel} refuses the request: {:?}", codes(&verdict.reasons)));
    }
    let exec = lz.registry().get(&kernel).ok_or_else(|| format!("no executor for {kernel}"))?;
    let adapted;
    let input = if verdict.transforms.is_empty() {
        args
    } else {
        adapted = apply_transforms(args, &verdict.transforms).map_err(|e| e.to_string())?;
        &adapted
    };
    let out = match catch_unwind(AssertUnwindSafe(|| exec.run(input))) {
        Ok(r) => r.map_err(|e| format!("{kernel}: {e}"))?,
        Err(_) => return Err(format!("{kernel} panicked")),
    };
    if verdict.transforms.is_empty() {
        Ok(out)
    } else {
        cast_outputs_back(out, &verdict.transforms).map_err(|e| e.to_string())
    }
}

/// The oracle of attention with RoPE fused into it: the f64 chain (the oracle's `rope` on q
/// and on k at their positions, then its attention), run by `attention_with_rope` on a handle
/// allowed the oracle's kernels only.
fn rope_chain(a: &layerzero::exec::args::AttentionArgs) -> Result<Outputs, String> {
    let only = r#"{"rules": [{"action": "allow", "kernels": "cpu_reference.*"}]}"#;
    let policy = Policy::from_json(only, "the oracle's chain").map_err(|e| e.to_string())?;
    let f64_only = LayerZero::detected().and_then(|h| h.with_policy(policy)).map_err(|e| e.to_string())?;
    let ran = f64_only.attention_with_rope(a).map_err(|e| format!("the oracle's RoPE chain: {e}"))?;
    if ran.fused() || ran.kernels.iter().any(|k| !k.starts_with("cpu_reference.")) {
        return Err(format!("the oracle's RoPE chain ran {:?}", ran.kernels));
    }
    Ok(Outputs::one("out", ran.out))
}
