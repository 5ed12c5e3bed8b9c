//! The lead-in call of `lz tune`: before a point's kernels are timed, each runs once on the
//! point's inputs (through the transforms selection planned for it) and its output is
//! compared with the reference's on a few rows of the same inputs, as a shadow check
//! compares. A tuned PerfDB so holds, next to each kernel's time, whether the kernel was
//! right on this machine for that kind of request: a parity record (`origin: lz tune`) that
//! the parity gate of selection reads.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::{Host, Planned, synth};
use crate::exec::args::OpArgs;
use crate::model::device::DeviceKind;
use crate::perfdb::{ParityRecord, ParityStatus};
use crate::runtime::shadow::agreement;
use crate::select::{REFERENCE_BACKEND, Selection, reference_kernel};
use crate::transform::{apply_transforms, cast_outputs_back};

/// Rows compared per kernel.
const ROWS: usize = 8;
/// The records' origin.
pub(super) const ORIGIN: &str = "lz tune";

/// The parity record of each of `sels` at `plan`'s point (none for a kernel that could not be
/// compared: no reference for the op, inputs on a device, a kernel that failed, which its
/// timing reports). `seed` draws the inputs.
pub(super) fn records(
    host: &Host,
    plan: &Planned<'_>,
    sels: &[&Selection],
    seed: u64,
    fingerprint: &str,
) -> Vec<ParityRecord> {
    let request = &plan.point.request;
    let catalog = host.selector.catalog();
    let on_cpu = request.tensors.values().all(|t| t.device.is_none_or(|d| d.kind == DeviceKind::Cpu))
        && host.selector.hardware().primary().kind == DeviceKind::Cpu;
    let reference = host.registry.get(&reference_kernel(request.op));
    let (Some(reference), true) = (reference, on_cpu) else { return Vec::new() };
    let Ok(base) = synth::synthesize(request, seed) else { return Vec::new() };
    let dtype = base.tensors().first().map(|(_, t)| t.dtype().to_string()).unwrap_or_default();
    let now = crate::time::now_unix();
    sels.iter()
        .filter(|sel| sel.backend != REFERENCE_BACKEND)
        .filter_map(|sel| {
            let (b, k) = catalog.kernel(catalog.find(&sel.kernel)?);
            let outputs = lead_in(host, sel, &base)?;
            let a = agreement(reference.as_ref(), k, &base, &outputs, ROWS).ok()?;
            let passed = a.problems.is_empty();
            Some(ParityRecord {
                kernel: sel.kernel.clone(),
                kernel_version: k.version.clone().unwrap_or_else(|| b.version.clone()),
                backend: b.backend.clone(),
                backend_version: b.version.clone(),
                fingerprint: fingerprint.to_owned(),
                op: request.op.as_str().to_owned(),
                dtype: dtype.clone(),
                key: plan.key.clone(),
                bucket: plan.bucket.clone(),
                case: format!("{} {}", plan.point.entry, plan.bucket),
                status: if passed { ParityStatus::Pass } else { ParityStatus::Fail },
                nmse: Some(a.nmse),
                max_abs: Some(a.max_abs),
                cosine: Some(a.cosine),
                rtol: a.rtol,
                atol: a.atol,
                detail: (!passed).then(|| format!("lead-in call on {}: {}", a.compared, a.problems.join("; "))),
                origin: ORIGIN.to_owned(),
                created_at: now,
            })
        })
        .collect()
}

/// One call of `sel`'s kernel on `base` as dispatch makes it (transforms applied, outputs
/// cast back), with the drills of `LAYERZERO_FAULTS` that corrupt outputs applied; `None`
/// when it fails.
fn lead_in(host: &Host, sel: &Selection, base: &OpArgs) -> Option<crate::exec::args::Outputs> {
    let exec = host.registry.get(&sel.kernel)?;
    let args = apply_transforms(base, &sel.transforms).ok()?;
    let out = catch_unwind(AssertUnwindSafe(|| exec.run(&args))).ok()?.ok()?;
    let out = if sel.transforms.is_empty() { out } else { cast_outputs_back(out, &sel.transforms).ok()? };
    Some(match crate::runtime::faults::rule_for(&host.faults, &sel.kernel, &sel.backend) {
        Some(rule) => crate::runtime::faults::corrupt(rule.mode, out),
        None => out,
    })
}
