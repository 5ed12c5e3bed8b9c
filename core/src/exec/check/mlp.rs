//! Fused MLPs: `x` against the gate, up and down projections.

use super::{expect_dense_float, invalid, rows_of};
use crate::exec::args::MlpArgs;
use crate::exec::executor::KernelError;
use crate::model::layout::Layout;

impl MlpArgs {
    /// Checks the tensors of an MLP: returns (leading shape of x, M, H, I).
    pub fn dims(&self) -> Result<(crate::tensor::Dims, usize, usize, usize), KernelError> {
        let a = self;
        expect_dense_float("x", &a.x)?;
        let (lead, m, h) = rows_of("x", &a.x)?;
        for (name, t) in [("w_gate", &a.w_gate), ("w_up", &a.w_up), ("w_down", &a.w_down)] {
            expect_dense_float(name, t)?;
            if matches!(t.layout(), Some(l) if l != Layout::Nt) {
                return Err(invalid(format!(
                    "tensor `{name}` has layout {}; mlp weights are [out_features, in_features] (NT)",
                    t.layout().map_or("none", |l| l.as_str())
                )));
            }
        }
        let &[i, gh] = a.w_gate.shape() else {
            return Err(invalid(format!("tensor `w_gate` has shape {:?}; expected rank 2 [I, H]", a.w_gate.shape())));
        };
        if gh != h {
            return Err(invalid(format!(
                "tensor `w_gate` has shape {:?}; expected [I, H] with H = {h} from x {:?}",
                a.w_gate.shape(),
                a.x.shape()
            )));
        }
        if a.w_up.shape() != [i, h] {
            return Err(invalid(format!("tensor `w_up` has shape {:?}; expected [I, H] = [{i}, {h}]", a.w_up.shape())));
        }
        if a.w_down.shape() != [h, i] {
            return Err(invalid(format!(
                "tensor `w_down` has shape {:?}; expected [H, I] = [{h}, {i}]",
                a.w_down.shape()
            )));
        }
        m.checked_mul(i.max(h)).ok_or_else(|| invalid(format!("x {:?} with I = {i} overflows", a.x.shape())))?;
        Ok((lead, m, h, i))
    }
}
