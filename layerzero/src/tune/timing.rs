//! Timing one point: synthesize its inputs, adapt them per kernel, and measure the kernels
//! together, interleaved, so drift in the machine's state hits them all alike.

use std::sync::Arc;
use std::time::Instant;

use super::measure::{self, Measurement};
use super::{DeviceMemory, Host, TuneOptions, synth};
use crate::exec::args::{OpArgs, Outputs};
use crate::exec::executor::{Executor, KernelError};
use crate::model::device::{DeviceKind, DeviceRef};
use crate::model::request::Request;
use crate::select::Selection;
use crate::transform::apply_transforms;

/// Whether the budget's deadline has passed; no deadline never passes.
pub(super) fn spent(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// A kernel ready to be timed: its executor and its adapted inputs.
type Prepared<'a> = (Synced<'a>, OpArgs);

/// The device a point's tensors live on, with the memory to make its inputs in, when it is
/// not the CPU (a request naming no device means the profile's primary device).
fn device_of<'h>(
    host: &'h Host,
    request: &Request,
) -> std::result::Result<Option<(DeviceRef, &'h dyn DeviceMemory)>, String> {
    let primary = host.selector.hardware().primary();
    let d = request.tensors.values().find_map(|t| t.device).unwrap_or(DeviceRef { kind: primary.kind, index: None });
    if d.kind == DeviceKind::Cpu {
        return Ok(None);
    }
    match host.device.as_deref() {
        Some(mem) => Ok(Some((d, mem))),
        None => Err(format!(
            "the inputs live on {d}, and this process allocates no device memory: tune a GPU's kernels \
             from Python (`layerzero.tune`), whose torch makes them"
        )),
    }
}

/// An executor whose calls on a device are waited for.
struct Synced<'a> {
    exec: &'a Arc<dyn Executor>,
    device: Option<(DeviceRef, &'a dyn DeviceMemory)>,
}

impl Executor for Synced<'_> {
    fn takes_device_memory(&self) -> bool {
        self.exec.takes_device_memory()
    }

    fn run(&self, args: &OpArgs) -> std::result::Result<Outputs, KernelError> {
        self.run_into(args, Outputs::new())
    }

    fn run_into(&self, args: &OpArgs, buffers: Outputs) -> std::result::Result<Outputs, KernelError> {
        let out = self.exec.run_into(args, buffers)?;
        if let Some((d, mem)) = self.device {
            mem.synchronize(d).map_err(KernelError::Failed)?;
        }
        Ok(out)
    }
}

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
    let device = match device_of(host, request) {
        Ok(d) => d,
        Err(e) => return sels.iter().map(|_| Err(e.clone())).collect(),
    };
    let base = synth::synthesize(request, seed).map_err(|e| format!("cannot synthesize inputs: {e}")).and_then(|a| {
        let Some((d, mem)) = device else { return Ok(a) };
        a.map_tensors(|_, t| mem.upload(t, d).map_err(crate::error::Error::invalid))
            .map_err(|e| format!("inputs on {d}: {e}"))
    });
    let base = match base {
        Ok(a) => a,
        Err(e) => return sels.iter().map(|_| Err(e.clone())).collect(),
    };
    // Per selection: its executor (each call on a GPU waited for: its time is the kernel's,
    // not its launch's) and adapted inputs, or why it cannot run.
    let prepared: Vec<std::result::Result<Prepared<'_>, String>> = sels
        .iter()
        .map(|sel| {
            let exec = host
                .registry
                .get(&sel.kernel)
                .ok_or_else(|| format!("no executor is registered for {}", sel.kernel))?;
            let args =
                apply_transforms(&base, &sel.transforms).map_err(|e| format!("transform before the kernel: {e}"))?;
            Ok((Synced { exec, device }, args))
        })
        .collect();
    let group: Vec<measure::Candidate<'_>> = prepared
        .iter()
        .filter_map(|p| p.as_ref().ok())
        .map(|(exec, args)| measure::Candidate { exec: exec as &dyn Executor, args })
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
