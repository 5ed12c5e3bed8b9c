//! Constraints: a kernel's declared capabilities against a request on a device.
//!
//! Pure and total: every failure is reported (not the first), each with a reason code and
//! the numbers. Every `Constraints` field is read here and nowhere else.

mod attention;
mod hardware;
mod quant;
mod rows;
mod tensors;

use crate::capabilities::spec::KernelSpec;
use crate::hardware::profile::DeviceProfile;
use crate::model::problem::Problem;
use crate::model::request::Request;
use crate::reason::{Reason, ReasonCode};

/// Appends to `out` every reason `kernel` cannot run `req` on `device`. Without a device
/// (the request is on a device of another kind than the kernel's, which availability
/// already reports) the hardware checks are skipped: they would judge the wrong device.
pub fn check(
    kernel: &KernelSpec,
    req: &Request,
    problem: &Problem,
    device: Option<&DeviceProfile>,
    out: &mut impl Sink,
) {
    let c = &kernel.constraints;
    if let Some(device) = device {
        hardware::check(c, problem.dtype, device, out);
        if let Some(d) = problem.attention() {
            hardware::head_dims(c, d, device, out);
        }
    }
    tensors::check(c, req, problem, out);
    if req.op.is_attention() {
        attention::check(c, req, problem, device.and_then(|d| d.compute_capability), out);
    } else {
        rows::check(c, req, problem, out);
    }
}

/// Where checks put their verdicts. The message is a closure so that a sink which only
/// needs codes (the selection fast path) never formats one; `explain` formats them all.
pub trait Sink {
    /// Records a rejection.
    fn reject<M: Into<String>>(&mut self, code: ReasonCode, message: impl FnOnce() -> M);
    /// True when nothing was rejected.
    fn is_clear(&self) -> bool;
    /// True when every recorded code is in `codes` (and something was recorded).
    fn all_in(&self, codes: &[ReasonCode]) -> bool;
    /// Moves `other`'s verdicts after this sink's.
    fn append(&mut self, other: Self);
}

impl Sink for Vec<Reason> {
    fn reject<M: Into<String>>(&mut self, code: ReasonCode, message: impl FnOnce() -> M) {
        self.push(Reason::new(code, message()));
    }
    fn is_clear(&self) -> bool {
        self.is_empty()
    }
    fn all_in(&self, codes: &[ReasonCode]) -> bool {
        !self.is_empty() && self.iter().all(|r| codes.contains(&r.code()))
    }
    fn append(&mut self, mut other: Self) {
        Vec::append(self, &mut other);
    }
}

/// Codes only, no messages.
#[derive(Debug, Default, Clone)]
pub struct Codes(pub Vec<ReasonCode>);

impl Sink for Codes {
    fn reject<M: Into<String>>(&mut self, code: ReasonCode, _message: impl FnOnce() -> M) {
        self.0.push(code);
    }
    fn is_clear(&self) -> bool {
        self.0.is_empty()
    }
    fn all_in(&self, codes: &[ReasonCode]) -> bool {
        !self.0.is_empty() && self.0.iter().all(|c| codes.contains(c))
    }
    fn append(&mut self, mut other: Self) {
        self.0.append(&mut other.0);
    }
}

/// Formats a list for a message: `f16, bf16`.
fn list<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}
