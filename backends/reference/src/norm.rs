//! `rms_norm` and `layer_norm` of the `cpu_reference` backend: every row of the last dim is
//! read through the view's strides as f64, normalized in f64 and rounded once to x's dtype.

use std::sync::Arc;

use layerzero_core::exec::args::{NormArgs, OpArgs, Outputs};
use layerzero_core::exec::executor::{KernelError, Registry};
use layerzero_core::model::op::Op;

use super::{from_f64_as, wrong_op};

/// RMSNorm kernel id.
pub const RMS_NORM: &str = "cpu_reference.rms_norm.naive";
/// LayerNorm kernel id.
pub const LAYER_NORM: &str = "cpu_reference.layer_norm.naive";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        RMS_NORM,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::RmsNorm(a) => rms_norm(a),
            other => Err(wrong_op(RMS_NORM, Op::RmsNorm, other)),
        }),
    );
    registry.register(
        LAYER_NORM,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::LayerNorm(a) => layer_norm(a),
            other => Err(wrong_op(LAYER_NORM, Op::LayerNorm, other)),
        }),
    );
}

/// `rms_norm`: `out` and, with a residual, `residual_out = x + residual`.
pub(crate) fn rms_norm(a: &NormArgs) -> Result<Outputs, KernelError> {
    let (rows, h, eps) = a.check(Op::RmsNorm)?;
    let mut s = a.x.to_f64_vec();
    if let Some(r) = &a.residual {
        for (s, r) in s.iter_mut().zip(r.to_f64_vec()) {
            *s += r;
        }
    }
    let w = a.weight.to_f64_vec();
    let mut out = vec![0f64; s.len()];
    for r in 0..rows {
        let row = &s[r * h..(r + 1) * h];
        let ms = row.iter().map(|v| v * v).sum::<f64>() / h as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, v), w) in out[r * h..(r + 1) * h].iter_mut().zip(row).zip(&w) {
            *o = v * inv * w;
        }
    }
    let dtype = a.x.dtype();
    let mut outs = Outputs::from([("out", from_f64_as(dtype, a.x.shape(), &out)?)]);
    if a.residual.is_some() {
        outs.insert("residual_out", from_f64_as(dtype, a.x.shape(), &s)?);
    }
    Ok(outs)
}

/// `layer_norm`: `out = (s - mean) / sqrt(var + eps) * weight (+ bias)` of `s = x`, or with
/// a residual `s = x + residual` (also returned as `residual_out`: a post-norm block's
/// residual add, as BART's); biased variance.
pub(crate) fn layer_norm(a: &NormArgs) -> Result<Outputs, KernelError> {
    let (rows, h, eps) = a.check(Op::LayerNorm)?;
    let mut x = a.x.to_f64_vec();
    if let Some(r) = &a.residual {
        for (s, r) in x.iter_mut().zip(r.to_f64_vec()) {
            *s += r;
        }
    }
    let w = a.weight.to_f64_vec();
    let b = a.bias.as_ref().map_or_else(|| vec![0.0; h], |b| b.to_f64_vec());
    let mut out = vec![0f64; x.len()];
    for r in 0..rows {
        let row = &x[r * h..(r + 1) * h];
        let mean = row.iter().sum::<f64>() / h as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / h as f64;
        let inv = 1.0 / (var + eps).sqrt();
        for (((o, v), w), b) in out[r * h..(r + 1) * h].iter_mut().zip(row).zip(&w).zip(&b) {
            *o = (v - mean) * inv * w + b;
        }
    }
    let dtype = a.x.dtype();
    let mut outs = Outputs::from([("out", from_f64_as(dtype, a.x.shape(), &out)?)]);
    if a.residual.is_some() {
        outs.insert("residual_out", from_f64_as(dtype, a.x.shape(), &x)?);
    }
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use layerzero_core::model::attrs::NormAttrs;
    use layerzero_core::model::dtype::DType;
    use layerzero_core::tensor::HostTensor;

    fn f32t(shape: &[usize], v: &[f32]) -> TestResult<HostTensor> {
        Ok(HostTensor::from_f32(shape, v.to_vec())?)
    }

    /// Each element within `rel` of the exact value (f32 rounding is 6e-8).
    fn near(got: &[f64], want: &[f64], rel: f64) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= rel * w.abs(), "element {i}: {g} vs {w}");
        }
    }

    fn args(x: HostTensor, w: HostTensor) -> NormArgs {
        NormArgs { x, weight: w, bias: None, residual: None, attrs: NormAttrs::default() }
    }

    #[test]
    fn rms_norm_of_three_four() -> TestResult {
        let a = args(f32t(&[1, 2], &[3.0, 4.0])?, f32t(&[2], &[1.0, 1.0])?);
        let out = rms_norm(&a)?;
        let d = (12.5f64 + 1e-6).sqrt();
        let got = out["out"].to_f64_vec();
        near(&got, &[3.0 / d, 4.0 / d], 1e-7);
        assert!(!out.contains_key("residual_out"));
        // A weight scales; eps given explicitly is used.
        let mut a = args(f32t(&[2], &[3.0, 4.0])?, f32t(&[2], &[2.0, -1.0])?);
        a.attrs.eps = Some(0.5);
        let got = rms_norm(&a)?["out"].to_f64_vec();
        let d = 13f64.sqrt();
        near(&got, &[6.0 / d, -4.0 / d], 1e-7);
        Ok(())
    }

    #[test]
    fn rms_norm_with_residual_outputs_the_sum() -> TestResult {
        let mut a = args(f32t(&[2, 2], &[1.0, 2.0, 0.0, 0.0])?, f32t(&[2], &[1.0, 1.0])?);
        a.residual = Some(f32t(&[2, 2], &[2.0, 2.0, 0.0, 1.0])?);
        let out = rms_norm(&a)?;
        assert_eq!(out["residual_out"].to_f64_vec(), vec![3.0, 4.0, 0.0, 1.0]);
        let d = (12.5f64 + 1e-6).sqrt();
        let e = (0.5f64 + 1e-6).sqrt();
        near(&out["out"].to_f64_vec(), &[3.0 / d, 4.0 / d, 0.0, 1.0 / e], 1e-7);
        Ok(())
    }

    #[test]
    fn layer_norm_by_hand_with_bias_and_rounding_once() -> TestResult {
        let mut a = args(f32t(&[4], &[1.0, 2.0, 3.0, 4.0])?, f32t(&[4], &[1.0, 1.0, 2.0, 1.0])?);
        a.bias = Some(f32t(&[4], &[0.0, 0.5, 0.0, 0.0])?);
        let got = layer_norm(&a)?["out"].to_f64_vec();
        let s = (1.25f64 + 1e-5).sqrt();
        near(&got, &[-1.5 / s, -0.5 / s + 0.5, 2.0 * 0.5 / s, 1.5 / s], 1e-7);
        // bf16: the f64 result is rounded once.
        let x = HostTensor::from_f32_as(DType::BF16, &[4], &[1.0, 2.0, 3.0, 4.0])?;
        let w = HostTensor::from_f32_as(DType::BF16, &[4], &[1.0; 4])?;
        let out = layer_norm(&args(x, w))?;
        assert_eq!(out["out"].dtype(), DType::BF16);
        let want = [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s].map(|v| half::bf16::from_f64(v).to_f64());
        assert_eq!(out["out"].to_f64_vec(), want);
        Ok(())
    }

    #[test]
    fn strided_view_normalizes_its_own_last_dim() -> TestResult {
        // x^T of a [3, 2] tensor: rows of the view are the columns of the storage.
        let base = f32t(&[3, 2], &[3.0, 1.0, 4.0, 1.0, 0.0, 1.0])?;
        let xt = base.permute(&[1, 0])?;
        let a = args(xt.clone(), f32t(&[3], &[1.0, 1.0, 1.0])?);
        let got = rms_norm(&a)?["out"].to_f64_vec();
        let d0 = (25.0f64 / 3.0 + 1e-6).sqrt();
        let d1 = (1.0f64 + 1e-6).sqrt();
        near(&got, &[3.0 / d0, 4.0 / d0, 0.0, 1.0 / d1, 1.0 / d1, 1.0 / d1], 1e-7);
        Ok(())
    }

    #[test]
    fn bad_shapes_are_invalid_input_naming_the_tensor() -> TestResult {
        let x = f32t(&[2, 3], &[0.0; 6])?;
        let err = |a: &NormArgs, f: fn(&NormArgs) -> Result<Outputs, KernelError>| match f(a) {
            Err(KernelError::InvalidInput(m)) => m,
            other => panic!("expected invalid input, got {other:?}"),
        };
        let a = args(x.clone(), f32t(&[2], &[1.0; 2])?);
        assert!(err(&a, rms_norm).contains("`weight`") && err(&a, layer_norm).contains("[2]"));
        let mut a = args(x.clone(), f32t(&[3], &[1.0; 3])?);
        a.residual = Some(f32t(&[3, 2], &[0.0; 6])?);
        assert!(err(&a, rms_norm).contains("`residual`"));
        assert!(err(&a, layer_norm).contains("residual"));
        let mut a = args(x.clone(), f32t(&[3], &[1.0; 3])?);
        a.bias = Some(f32t(&[2], &[0.0; 2])?);
        assert!(err(&a, layer_norm).contains("`bias`"));
        assert!(err(&a, rms_norm).contains("bias"));
        let mut a = args(x.clone(), f32t(&[3], &[1.0; 3])?);
        a.attrs.eps = Some(f64::NAN);
        assert!(err(&a, rms_norm).contains("eps"));
        let a = args(f32t(&[], &[1.0])?, f32t(&[1], &[1.0])?);
        assert!(err(&a, rms_norm).contains("`x`"));
        let ids = HostTensor::new(layerzero_core::tensor::Storage::I32(vec![1, 2, 3].into()), &[3])?;
        let a = args(ids, f32t(&[3], &[1.0; 3])?);
        assert!(err(&a, rms_norm).contains("dtype"));
        Ok(())
    }

    #[test]
    fn empty_rows_and_wrong_op() -> TestResult {
        let a = args(f32t(&[0, 4], &[])?, f32t(&[4], &[1.0; 4])?);
        assert_eq!(rms_norm(&a)?["out"].shape(), &[0, 4]);
        let a = args(f32t(&[2, 0], &[])?, f32t(&[0], &[])?);
        assert_eq!(layer_norm(&a)?["out"].shape(), &[2, 0]);
        let mut r = Registry::new();
        register(&mut r);
        let a = args(f32t(&[1, 2], &[3.0, 4.0])?, f32t(&[2], &[1.0, 1.0])?);
        let rms = r.get(RMS_NORM).ok_or("rms_norm is not registered")?;
        let layer = r.get(LAYER_NORM).ok_or("layer_norm is not registered")?;
        assert!(rms.run(&OpArgs::RmsNorm(a.clone())).is_ok());
        assert!(matches!(rms.run(&OpArgs::LayerNorm(a.clone())), Err(KernelError::Unsupported(_))));
        assert!(matches!(layer.run(&OpArgs::RmsNorm(a)), Err(KernelError::Unsupported(_))));
        Ok(())
    }
}
