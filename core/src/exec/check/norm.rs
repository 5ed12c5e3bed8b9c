//! Norms: `x`, `weight`, `bias` and `residual` against each other.

use super::{expect_float, invalid};
use crate::exec::args::NormArgs;
use crate::exec::executor::KernelError;
use crate::model::op::Op;
use crate::tensor::HostTensor;

/// Default epsilon of `rms_norm` (inside the root).
pub const RMS_EPS: f64 = 1e-6;
/// Default epsilon of `layer_norm`.
pub const LAYER_EPS: f64 = 1e-5;

impl NormArgs {
    /// Checks norm arguments: (rows, H, eps) with eps defaulting to 1e-6 (rms) or 1e-5 (layer).
    pub fn check(&self, op: Op) -> Result<(usize, usize, f64), KernelError> {
        let a = self;
        let default_eps = if op == Op::RmsNorm { RMS_EPS } else { LAYER_EPS };
        let x = &a.x;
        expect_float("x", x)?;
        let Some(&h) = x.shape().last() else {
            return Err(invalid(format!("tensor `x` has shape {:?}; {op} needs at least one dim [..., H]", x.shape())));
        };
        let vector = |name: &str, t: &HostTensor| -> Result<(), KernelError> {
            expect_float(name, t)?;
            if t.shape() != [h] {
                return Err(invalid(format!("tensor `{name}` has shape {:?}; expected [H] = [{h}]", t.shape())));
            }
            Ok(())
        };
        vector("weight", &a.weight)?;
        match (op, &a.bias) {
            (Op::RmsNorm, Some(b)) => {
                return Err(invalid(format!("rms_norm takes no `bias` (one of shape {:?} was given)", b.shape())));
            }
            (_, Some(b)) => vector("bias", b)?,
            (_, None) => {}
        }
        if let Some(r) = &a.residual {
            expect_float("residual", r)?;
            if r.shape() != x.shape() {
                return Err(invalid(format!(
                    "tensor `residual` has shape {:?}; it must match x's shape {:?}",
                    r.shape(),
                    x.shape()
                )));
            }
        }
        let eps = a.attrs.eps.unwrap_or(default_eps);
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(invalid(format!("eps is {eps}; it must be finite and >= 0")));
        }
        let rows = x.numel().checked_div(h).unwrap_or(0);
        Ok((rows, h, eps))
    }
}
