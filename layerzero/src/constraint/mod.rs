//! Constraints: a kernel's declared capabilities against a request on a device.
//!
//! Pure and total: every failure is reported (not the first), each with a reason code and
//! the numbers. Every `Constraints` field is read here and nowhere else.

mod attention;
mod hardware;
mod rows;
mod tensors;

use crate::capabilities::spec::KernelSpec;
use crate::hardware::profile::DeviceProfile;
use crate::model::problem::Problem;
use crate::model::request::Request;
use crate::reason::Reason;

/// Appends to `out` every reason `kernel` cannot run `req` on `device`. Without a device
/// (the request is on a device of another kind than the kernel's, which availability
/// already reports) the hardware checks are skipped: they would judge the wrong device.
pub fn check(
    kernel: &KernelSpec,
    req: &Request,
    problem: &Problem,
    device: Option<&DeviceProfile>,
    out: &mut Vec<Reason>,
) {
    let c = &kernel.constraints;
    if let Some(device) = device {
        hardware::check(c, problem.dtype, device, out);
    }
    tensors::check(c, req, problem, out);
    if req.op.is_attention() {
        attention::check(c, req, problem, out);
    } else {
        rows::check(c, req, problem, out);
    }
}

/// Formats a list for a message: `f16, bf16`.
fn list<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}
