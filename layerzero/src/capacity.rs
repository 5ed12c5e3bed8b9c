//! Capacity: does a kernel's workspace, plus the copies its transforms make, fit in the
//! device memory left after the request's tensors and the policy's reserve? One stage of
//! selection ([`check`]), and the rule deciding whether a live selection may be cached for
//! its whole bucket ([`bucket_fits`]): memory headroom is the one verdict that grows with
//! the sizes a bucket spans.

use crate::capabilities::spec::KernelSpec;
use crate::constraint::Sink;
use crate::hardware::profile::DeviceProfile;
use crate::model::problem::Problem;
use crate::model::request::Request;
use crate::plan::{SelectionKey, axes};
use crate::policy::Policy;
use crate::reason::ReasonCode;
use crate::score;
use crate::select::Selector;
use crate::transform::Transform;

/// The capacity stage: rejects with `MEMORY_HEADROOM_EXCEEDED` when the kernel's workspace
/// and its transform copies do not fit on `dev`.
pub fn check<S: Sink>(
    kernel: &KernelSpec,
    problem: &Problem,
    transforms: &[Transform],
    dev: &DeviceProfile,
    policy: &Policy,
    sink: &mut S,
) {
    let out_bytes = score::output_elements(problem).saturating_mul(problem.dtype.size_bytes());
    let transform_bytes: u64 = transforms.iter().map(|t| t.bytes / 2).sum();
    let need = kernel.properties.workspace_bytes.saturating_add(transform_bytes);
    let free = dev
        .memory_bytes
        .saturating_sub(problem.input_bytes)
        .saturating_sub(out_bytes)
        .saturating_sub(policy.memory_reserve_bytes);
    if need > free {
        sink.reject(ReasonCode::MEMORY_HEADROOM_EXCEEDED, || {
            format!("needs {need} bytes of workspace and copies; {free} bytes are free after the request's tensors and the reserve")
        });
    }
}

/// True when the bucket's largest request (each axis < 2x larger, so under 2^axes times
/// the bytes) still fits with every kernel's workspace and a copy of the inputs for
/// transforms: only then may a live selection be cached for the whole bucket.
pub fn bucket_fits(key: &SelectionKey, req: &Request, max_workspace: u64, selector: &Selector) -> bool {
    let problem = Problem::describe(req);
    let out = score::output_elements(&problem).saturating_mul(problem.dtype.size_bytes());
    let growth = 1u64 << key.axes.min(axes::MAX_AXES as u8);
    let need = problem
        .input_bytes
        .saturating_mul(2)
        .saturating_add(out)
        .saturating_mul(growth)
        .saturating_add(max_workspace)
        .saturating_add(selector.policy().memory_reserve_bytes);
    need <= selector.hardware().primary().memory_bytes
}
