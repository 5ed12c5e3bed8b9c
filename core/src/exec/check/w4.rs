//! Packed 4-bit weights (`model::w4`): the checks `linear_int4` and a 4-bit `dequantize`
//! share, so both refuse the same scales with the same words (SCALE_LAYOUT_MISMATCH).

use super::invalid;
use crate::exec::args::DequantizeArgs;
use crate::exec::executor::KernelError;
use crate::model::attrs::QuantScheme;
use crate::model::dtype::DType;
use crate::model::w4::{ScaleOrder, W4Format, group_shape_mismatch};
use crate::tensor::HostTensor;

/// The scales of a packed `[N, K/2]` weight: the format's block scales (int4 may add
/// `zeros`, nvfp4 a `global_scale`), stored in `order`.
#[derive(Debug, Clone, Copy)]
pub struct W4Scales<'a> {
    /// The 4-bit code.
    pub format: W4Format,
    /// The order the scales are stored in.
    pub order: ScaleOrder,
    /// Input features per scale block.
    pub group: u64,
    /// `[N, K / group]` block scales.
    pub scales: &'a HostTensor,
    /// Their tensor's name in the op (`scales` of linear_int4, `scale` of dequantize).
    pub name: &'static str,
    /// int4's `[N, K / group]` zero points.
    pub zeros: Option<&'a HostTensor>,
    /// nvfp4's f32 `[1]` per-tensor scale.
    pub global: Option<&'a HostTensor>,
}

impl W4Scales<'_> {
    /// Checks the scales of an `n` x `k` weight; returns the group size.
    pub fn check(&self, n: usize, k: usize) -> Result<usize, KernelError> {
        let g = usize::try_from(self.group).unwrap_or(0);
        if g == 0 || !k.is_multiple_of(g) {
            return Err(invalid(format!(
                "SCALE_LAYOUT_MISMATCH: group size {} does not divide in_features K = {k}",
                self.group
            )));
        }
        let (zeros, global) = (self.zeros.is_some(), self.global.is_some());
        if let Some(why) = self.format.scale_mismatch(self.group, self.scales.dtype(), zeros, global) {
            return Err(invalid(format!("SCALE_LAYOUT_MISMATCH: {why}")));
        }
        if self.order != ScaleOrder::Linear {
            return Err(invalid(format!(
                "SCALE_LAYOUT_MISMATCH: attrs.scale_order is {}; this kernel reads linear ([N, K / group_size] \
                 row-major) scales",
                self.order.as_str()
            )));
        }
        if let Some(gs) = self.global
            && (gs.dtype() != DType::F32 || gs.shape() != [1])
        {
            return Err(invalid(format!(
                "tensor `global_scale` is {} {:?}; expected f32 [1] (one scale per tensor)",
                gs.dtype(),
                gs.shape()
            )));
        }
        let want = [n, k / g];
        for (name, t) in [(self.name, Some(self.scales)), ("zeros", self.zeros)] {
            let Some(t) = t else { continue };
            if name == "zeros" && !t.dtype().is_float() {
                return Err(invalid(format!("tensor `{name}` has dtype {}; expected a float dtype", t.dtype())));
            }
            if t.shape() != want {
                let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
                let why = group_shape_mismatch(name, &shape, n as u64, k as u64, g as u64).unwrap_or_default();
                return Err(invalid(format!("SCALE_LAYOUT_MISMATCH: {why} (strides {:?})", t.strides())));
            }
        }
        Ok(g)
    }
}

/// The i8 `[N, K/2]` bytes of a packed weight named `name`: (N, K).
pub fn packed_dims(name: &str, what: &str, w: &HostTensor) -> Result<(usize, usize), KernelError> {
    if w.dtype() != DType::I8 {
        return Err(invalid(format!(
            "tensor `{name}` has dtype {}; {what} expects i8 bytes packing two 4-bit values",
            w.dtype()
        )));
    }
    match w.shape() {
        &[n, half] => Ok((n, half * 2)),
        s => Err(invalid(format!("tensor `{name}` has shape {s:?}; expected rank 2 [N, K/2]"))),
    }
}

impl DequantizeArgs {
    /// The checked problem of a 4-bit `dequantize` (`attrs.format` set): (format, N, K,
    /// group size). The scheme must be per_block with a block `[1, group]` along K.
    pub fn w4_dims(&self) -> Result<(W4Format, usize, usize, usize), KernelError> {
        let a = &self.attrs;
        let Some(format) = a.format else {
            return Err(invalid("attrs.format is absent; x holds int8 or fp8 values, not packed 4-bit codes"));
        };
        let (n, k) = packed_dims("x", "a 4-bit dequantize", &self.x)?;
        let group = match (a.scheme, a.block) {
            (QuantScheme::PerBlock, Some([1, g])) => g,
            (scheme, block) => {
                return Err(invalid(format!(
                    "attrs.scheme {} with block {block:?}: a {} weight is dequantized per_block with block \
                     [1, group] (one scale per group of K)",
                    scheme.as_str(),
                    format.as_str()
                )));
            }
        };
        let scales = W4Scales {
            format,
            order: a.scale_order,
            group,
            scales: &self.scale,
            name: "scale",
            zeros: None,
            global: self.global_scale.as_ref(),
        };
        let g = scales.check(n, k)?;
        Ok((format, n, k, g))
    }
}
