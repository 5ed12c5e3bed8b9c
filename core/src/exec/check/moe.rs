//! Mixture-of-experts blocks: tokens, routes and the stacked expert weights.

use super::{expect_float, expect_rank, invalid};
use crate::exec::args::MoeExpertsArgs;
use crate::exec::executor::KernelError;
use crate::tensor::HostTensor;

/// The checked sizes of a `moe_experts` call.
#[derive(Debug, Clone, Copy)]
pub struct MoeDims {
    /// Tokens T.
    pub tokens: usize,
    /// Hidden size H.
    pub hidden: usize,
    /// Expert slots per token (top-k).
    pub slots: usize,
    /// Experts E.
    pub experts: usize,
    /// Expert intermediate size I.
    pub inter: usize,
}

fn expect_shape(name: &str, t: &HostTensor, want: &[usize], what: &str) -> Result<(), KernelError> {
    if t.shape() != want {
        return Err(invalid(format!("tensor `{name}` has shape {:?}; expected {what} = {want:?}", t.shape())));
    }
    Ok(())
}

impl MoeExpertsArgs {
    /// Checks the tensors of an expert computation.
    pub fn dims(&self) -> Result<MoeDims, KernelError> {
        let a = self;
        expect_rank("x", &a.x, 2, "[tokens, hidden]")?;
        expect_float("x", &a.x)?;
        expect_rank("experts", &a.experts, 2, "[tokens, top_k]")?;
        expect_rank("weights", &a.weights, 2, "[tokens, top_k]")?;
        expect_float("weights", &a.weights)?;
        expect_rank("w_gate", &a.w_gate, 3, "[experts, intermediate, hidden]")?;
        for (name, w) in [("w_gate", &a.w_gate), ("w_up", &a.w_up), ("w_down", &a.w_down)] {
            expect_float(name, w)?;
        }
        let (tokens, hidden) = (a.x.shape()[0], a.x.shape()[1]);
        let slots = a.experts.shape()[1];
        expect_shape("experts", &a.experts, &[tokens, slots], "[tokens, top_k]")?;
        expect_shape("weights", &a.weights, &[tokens, slots], "[tokens, top_k] (as `experts`)")?;
        let (experts, inter) = (a.w_gate.shape()[0], a.w_gate.shape()[1]);
        expect_shape("w_gate", &a.w_gate, &[experts, inter, hidden], "[experts, intermediate, hidden]")?;
        expect_shape("w_up", &a.w_up, &[experts, inter, hidden], "[experts, intermediate, hidden] (as `w_gate`)")?;
        expect_shape("w_down", &a.w_down, &[experts, hidden, inter], "[experts, hidden, intermediate]")?;
        Ok(MoeDims { tokens, hidden, slots, experts, inter })
    }
}
