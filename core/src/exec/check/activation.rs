//! Gated activations: one fused input or a gate and an up half.

use super::{expect_float, invalid};
use crate::exec::executor::KernelError;
use crate::tensor::HostTensor;

/// Checks the operands of a gated activation (`swiglu`, `geglu`): the split form takes `x`
/// (gate and up halves of its last dim), the separate form `gate` and `up` of equal shape.
/// Returns the output shape (x's with the last dim halved, or gate's).
pub fn check_gated(
    op: &str,
    split: bool,
    x: Option<&HostTensor>,
    gate: Option<&HostTensor>,
    up: Option<&HostTensor>,
) -> Result<crate::tensor::Dims, KernelError> {
    if split {
        let (Some(x), None, None) = (x, gate, up) else {
            return Err(invalid(format!(
                "{op} with split = true takes `x` (gate and up halves of its last dim) and no `gate`/`up`; \
                 given: x {}, gate {}, up {}",
                x.is_some(),
                gate.is_some(),
                up.is_some()
            )));
        };
        expect_float("x", x)?;
        let Some(&n) = x.shape().last() else {
            return Err(invalid(format!("tensor `x` has shape {:?}; split {op} needs a last dim", x.shape())));
        };
        if n % 2 != 0 {
            return Err(invalid(format!(
                "tensor `x` has shape {:?}; the last dim ({n}) must be even to split into gate and up",
                x.shape()
            )));
        }
        let mut shape = crate::tensor::Dims::from_slice(x.shape());
        if let Some(last) = shape.last_mut() {
            *last = n / 2;
        }
        return Ok(shape);
    }
    let (None, Some(gate), Some(up)) = (x, gate, up) else {
        return Err(invalid(format!(
            "{op} with split = false takes `gate` and `up` and no `x`; given: x {}, gate {}, up {}",
            x.is_some(),
            gate.is_some(),
            up.is_some()
        )));
    };
    expect_float("gate", gate)?;
    expect_float("up", up)?;
    if gate.shape() != up.shape() {
        return Err(invalid(format!(
            "tensor `gate` has shape {:?} but `up` has shape {:?}; they must match",
            gate.shape(),
            up.shape()
        )));
    }
    Ok(crate::tensor::Dims::from_slice(gate.shape()))
}
