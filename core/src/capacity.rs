//! Capacity: does a kernel's workspace, plus the copies its transforms make, fit in the
//! device memory left after the request's tensors and the policy's reserve? One stage of
//! selection ([`check`]) and the score factor under memory pressure ([`pressure_factor`]).

use crate::capabilities::spec::KernelSpec;
use crate::constraint::Sink;
use crate::hardware::profile::DeviceProfile;
use crate::model::problem::Problem;
use crate::policy::Policy;
use crate::reason::ReasonCode;
use crate::transform::Transform;

/// The capacity stage: rejects with `MEMORY_HEADROOM_EXCEEDED` when the kernel's workspace
/// and its transform copies do not fit on `dev`. `available` is the live headroom when a
/// gauge reads one (the request's inputs already live in memory, so only its outputs, the
/// reserve and the workspace must still fit in it). Returns the bytes free for workspace.
pub fn check<S: Sink>(
    kernel: &KernelSpec,
    problem: &Problem,
    transforms: &[Transform],
    dev: &DeviceProfile,
    policy: &Policy,
    available: Option<u64>,
    sink: &mut S,
) -> u64 {
    let out_bytes = problem.output_elements().saturating_mul(problem.dtype.size_bytes());
    let transform_bytes = transforms.iter().fold(0u64, |acc, t| acc.saturating_add(t.bytes / 2));
    let need = kernel.properties.workspace_bytes.saturating_add(transform_bytes);
    let on_paper = dev.memory_bytes.saturating_sub(problem.input_bytes);
    let room = available.map_or(on_paper, |a| a.min(on_paper));
    let kept = out_bytes.saturating_add(policy.memory_reserve_bytes);
    let free = room.saturating_sub(kept);
    if need > free || kept > room {
        sink.reject(ReasonCode::MEMORY_HEADROOM_EXCEEDED, || {
            let live = if available.is_some() { " (live reading)" } else { "" };
            format!(
                "needs {need} bytes of workspace and copies; {free} bytes are free{live} after the request's tensors and the reserve"
            )
        });
    }
    free
}

/// The score factor of a kernel under memory pressure: `1 + workspace / free`, so a kernel
/// whose workspace would take most of what is left loses to one that needs less, while a
/// small workspace costs next to nothing.
pub fn pressure_factor(kernel: &KernelSpec, free: u64) -> f64 {
    1.0 + kernel.properties.workspace_bytes as f64 / free.max(1) as f64
}
