//! Timing one point: synthesize its inputs, adapt them per kernel, and measure the kernels
//! together, interleaved, so drift in the machine's state hits them all alike.

use std::sync::Arc;
use std::time::Instant;

use super::measure::{self, Measurement};
use super::{Host, TuneOptions, synth};
use crate::exec::args::OpArgs;
use crate::model::request::Request;
use crate::select::Selection;
use crate::transform::apply_transforms;

/// Whether the budget's deadline has passed; no deadline never passes.
pub(super) fn spent(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// A kernel ready to be timed: its executor and its adapted inputs.
type Prepared<'a> = (&'a Arc<dyn crate::exec::executor::Executor>, OpArgs);

/// Synthesizes the point's inputs, applies each selection's transforms and times the
/// kernels together (interleaved). One result per selection, in order; errors are messages:
/// a failing kernel is reported, not fatal.
pub(super) fn time_group(
    host: &Host,
    request: &Request,
    sels: &[&Selection],
    opts: &TuneOptions,
    salt: u64,
    deadline: Option<Instant>,
) -> Vec<std::result::Result<Measurement, String>> {
    let seed = opts.seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let base = match synth::synthesize(request, seed) {
        Ok(a) => a,
        Err(e) => return sels.iter().map(|_| Err(format!("cannot synthesize inputs: {e}"))).collect(),
    };
    // Per selection: its executor and adapted inputs, or why it cannot run.
    let prepared: Vec<std::result::Result<Prepared<'_>, String>> = sels
        .iter()
        .map(|sel| {
            let exec = host
                .registry
                .get(&sel.kernel)
                .ok_or_else(|| format!("no executor is registered for {}", sel.kernel))?;
            let args =
                apply_transforms(&base, &sel.transforms).map_err(|e| format!("transform before the kernel: {e}"))?;
            Ok((exec, args))
        })
        .collect();
    let group: Vec<measure::Candidate<'_>> = prepared
        .iter()
        .filter_map(|p| p.as_ref().ok())
        .map(|(exec, args)| measure::Candidate { exec: exec.as_ref(), args })
        .collect();
    let mut measured = measure::measure_interleaved(&group, &opts.protocol, deadline).into_iter();
    prepared
        .iter()
        .map(|p| match p {
            Ok(_) => measured
                .next()
                .unwrap_or_else(|| Err(measure::Failure { message: "not measured".to_owned() }))
                .map_err(|f| f.message),
            Err(e) => Err(e.clone()),
        })
        .collect()
}
