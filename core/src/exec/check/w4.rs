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
    /// Whether x holds packed 4-bit codes (`attrs.format`); a `global_scale` or a scale order
    /// without a format is invalid input.
    pub fn is_w4(&self) -> Result<bool, KernelError> {
        if self.attrs.format.is_none() && (self.global_scale.is_some() || !self.attrs.scale_order.is_linear()) {
            return Err(invalid("`global_scale` and attrs.scale_order need attrs.format (a 4-bit dequantize)"));
        }
        Ok(self.attrs.format.is_some())
    }

    /// The scales of a 4-bit `dequantize` of `format` with blocks of `group` along K.
    pub fn w4_scales(&self, format: W4Format, group: u64) -> W4Scales<'_> {
        W4Scales {
            format,
            order: self.attrs.scale_order,
            group,
            scales: &self.scale,
            name: "scale",
            zeros: None,
            global: self.global_scale.as_ref(),
        }
    }

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
        let g = self.w4_scales(format, group).check(n, k)?;
        Ok((format, n, k, g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attrs::QuantAttrs;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn args(format: W4Format, block: [u64; 2], scale: HostTensor) -> Result<DequantizeArgs, crate::error::Error> {
        let attrs = QuantAttrs {
            scheme: QuantScheme::PerBlock,
            block: Some(block),
            scale_layout: None,
            target: None,
            out_dtype: None,
            format: Some(format),
            scale_order: ScaleOrder::Linear,
        };
        let x = HostTensor::from_f32_as(DType::I8, &[4, 32], &[0.0; 128])?;
        Ok(DequantizeArgs { x, scale, global_scale: None, attrs })
    }

    fn refusal(a: &DequantizeArgs) -> String {
        match a.w4_dims() {
            Err(KernelError::InvalidInput(m)) => m,
            other => format!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_4_bit_dequantize_reads_k_from_the_packed_bytes_and_refuses_other_scales() -> TestResult {
        let nf4 = args(W4Format::Nf4, [1, 16], HostTensor::from_f32(&[4, 4], vec![1.0; 16])?)?;
        assert!(matches!(nf4.w4_dims(), Ok((W4Format::Nf4, 4, 64, 16))));
        // Per-channel scales for a per-block format, named as such.
        let per_channel = args(W4Format::Nf4, [1, 16], HostTensor::from_f32(&[4], vec![1.0; 4])?)?;
        let m = refusal(&per_channel);
        assert!(m.starts_with("SCALE_LAYOUT_MISMATCH") && m.contains("per-channel") && m.contains("`scale`"), "{m}");
        // A block that is not one row by a group of K, and a group that does not divide K.
        let tall = args(W4Format::Nf4, [2, 16], HostTensor::from_f32(&[2, 4], vec![1.0; 8])?)?;
        assert!(refusal(&tall).contains("block [1, group]"));
        let odd = args(W4Format::Nf4, [1, 24], HostTensor::from_f32(&[4, 2], vec![1.0; 8])?)?;
        assert!(refusal(&odd).contains("does not divide"));
        // The format's own scale dtype: mxfp4 reads E8M0 bytes, not f32.
        let mx = args(W4Format::Mxfp4, [1, 32], HostTensor::from_f32(&[4, 2], vec![1.0; 8])?)?;
        assert!(refusal(&mx).contains("E8M0"));
        Ok(())
    }
}
