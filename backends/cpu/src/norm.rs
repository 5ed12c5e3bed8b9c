//! `cpu.rms_norm.fast` and `cpu.layer_norm.fast`, on the row driver (`rows`).
//!
//! The kernels are memory-bound: each row is read once from memory, for its statistics
//! in f64 (RMSNorm: Σ x²; LayerNorm: Σ (x - k) and Σ (x - k)², shifted by the row's first
//! value, which keeps the one-pass variance exact enough for f32 whatever the mean),
//! then read again from L1/L2 by a fused normalize-scale-round loop that writes the output
//! once in its dtype. f32 and bf16 rows are read in place (bf16 never goes through an f32
//! copy); f16 and strided rows are first read into an f32 row. The loops live in `simd`,
//! compiled for AVX-512 or AVX2 when the CPU has them. Rows are spread over rayon tasks of
//! about 32K elements; small inputs run on the calling thread.
//!
//! Every output is a new buffer, so first-touch page faults, not the arithmetic, would set
//! the pace: large outputs ask for huge pages (`alloc`). `layerzero/benches/rows.rs` compares each
//! kernel with a copy of the same bytes into a new buffer.

use std::sync::Arc;

use half::bf16;
use rayon::prelude::*;

use layerzero_core::exec::args::{NormArgs, OpArgs, Outputs};
use layerzero_core::exec::executor::{KernelError, Registry, WritesInto};
use layerzero_core::model::op::Op;
use layerzero_core::tensor::HostTensor;

use super::alloc::{Out, with_scratch};
use super::rows::{Elem, Src, TASK, View, all_f32, by_dtype, fill_into, fill_typed, tensor};
use super::split::worth_splitting;
use super::{simd, wrong_op};

/// RMSNorm kernel id.
pub const RMS_NORM: &str = "cpu.rms_norm.fast";
/// LayerNorm kernel id.
pub const LAYER_NORM: &str = "cpu.layer_norm.fast";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        RMS_NORM,
        Arc::new(WritesInto(|args: &OpArgs, bufs: &mut Outputs| match args {
            OpArgs::RmsNorm(a) => rms_norm_into(a, bufs),
            other => Err(wrong_op(RMS_NORM, other)),
        })),
    );
    registry.register(
        LAYER_NORM,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::LayerNorm(a) => layer_norm(a),
            other => Err(wrong_op(LAYER_NORM, other)),
        }),
    );
}

// ---------------------------------------------------------------------------------------
// The norms.

/// (rows, hidden, eps) after checking the tensors.
fn check(a: &NormArgs, rms: bool) -> Result<(usize, usize, f32), KernelError> {
    // What makes norm arguments valid is defined once, beside the arguments.
    let op = if rms { Op::RmsNorm } else { Op::LayerNorm };
    let (rows, h, eps) = a.check(op)?;
    Ok((rows, h, eps as f32))
}

/// `rms_norm` into new buffers.
#[cfg(test)]
pub(crate) fn rms_norm(a: &NormArgs) -> Result<Outputs, KernelError> {
    rms_norm_into(a, &mut Outputs::new())
}

/// `rms_norm`: `out` and, with a residual, `residual_out`, into the caller's buffers where
/// they fit.
pub(crate) fn rms_norm_into(a: &NormArgs, bufs: &mut Outputs) -> Result<Outputs, KernelError> {
    let (rows, h, eps) = check(a, true)?;
    by_dtype!(a.x.dtype(), RMS_NORM, T => rms_typed::<T>(a, rows, h, eps, bufs))
}

/// Row `start..start + h` of `x`: borrowed when it is a unit-stride f32 or bf16 row, else
/// read into `buf` as f32.
#[inline]
fn row<'b>(x: &View<'b>, start: usize, h: usize, buf: &'b mut Vec<f32>) -> Src<'b> {
    if let Some(v) = x.typed::<bf16>(start, h) {
        return Src::Bf16(v);
    }
    if let Some(v) = x.f32_slice(start, h) {
        return Src::F32(v);
    }
    buf.resize(h, 0.0);
    x.read(start, buf);
    Src::F32(buf)
}

/// `(Σ (x - k), Σ (x - k)²)` of a row, in f64 (vectorized).
#[inline]
fn sums(x: Src<'_>, k: f32) -> (f64, f64) {
    match x {
        Src::F32(v) => simd::shifted_sums_f32(v, k),
        Src::Bf16(v) => simd::shifted_sums_bf16(v, k),
    }
}

/// `(mean, variance, Σ x²)` of a bf16 row from its unshifted sums ([`simd::sums_bf16_dp`]),
/// when they are finite and the row is well conditioned: `var = E[x²] - mean²` loses about
/// `mean² / var` times the sums' relative error (1e-6), so rows whose mean² exceeds 16
/// variances take the shifted f64 form instead.
#[inline]
fn fast_moments(x: Src<'_>, hf: f64) -> Option<(f64, f64, f64)> {
    let Src::Bf16(v) = x else { return None };
    let (s, q) = simd::sums_bf16_dp(v)?;
    let mean = s / hf;
    let var = q / hf - mean * mean;
    (mean * mean <= 16.0 * var).then_some((mean, var, q))
}

/// `1 / sqrt(Σ x² / h + eps)` from the f64 sum of squares (which does not overflow).
#[inline]
fn rms_inv(ss: f64, h: usize, eps: f32) -> f32 {
    (1.0 / (ss / h as f64 + f64::from(eps)).sqrt()) as f32
}

/// True when every element is finite.
fn all_finite(v: &[f32]) -> bool {
    v.iter().all(|x| x.is_finite())
}

fn rms_typed<T: Elem>(
    a: &NormArgs,
    rows: usize,
    h: usize,
    eps: f32,
    bufs: &mut Outputs,
) -> Result<Outputs, KernelError> {
    with_scratch(h, |wbuf| {
        let w = super::pack::as_f32(&a.weight, wbuf);
        let w_finite = all_finite(w);
        let x = View::new(&a.x);
        let shape = a.x.shape();
        let mut out = Out::<T>::take(bufs, "out", rows * h);
        let Some(res) = &a.residual else {
            // One pass reads the row for Σ x², one reads it again (from cache) and writes.
            fill_into::<T>(&mut out.v, h, |start, dst, buf, scratch| {
                let src = row(&x, start, h, buf);
                let ss = match src {
                    Src::Bf16(v) => simd::sums_bf16_dp(v).map_or_else(|| sums(src, 0.0).1, |(_, q)| q),
                    Src::F32(_) => sums(src, 0.0).1,
                };
                let inv = rms_inv(ss, h, eps);
                T::store_norm(src, (0.0, 0.0, inv), w, None, ss.is_finite() && w_finite, dst, scratch);
            });
            return Ok(Outputs::one("out", out.finish(shape)?));
        };
        // Fused residual: s = x + residual (f32), residual_out = s, out = rmsnorm(s).
        let r = View::new(res);
        let mut res_out = Out::<T>::take(bufs, "residual_out", rows * h);
        if rows * h > 0 {
            let per_task = (TASK / h).max(1) * h;
            let work = |(ti, (ob, rb)): (usize, (&mut [T], &mut [T]))| {
                with_scratch(2 * h, |st| {
                    let (s, tmp) = st.split_at_mut(h);
                    let mut scratch = Vec::new();
                    for (ui, (o, ro)) in ob.chunks_mut(h).zip(rb.chunks_mut(h)).enumerate() {
                        let start = ti * per_task + ui * h;
                        x.read(start, s);
                        let rv = r.get(start, tmp);
                        for (s, &r) in s.iter_mut().zip(rv) {
                            *s += r;
                        }
                        T::store(s, ro);
                        let (_, ss) = simd::shifted_sums_f32(s, 0.0);
                        let inv = rms_inv(ss, h, eps);
                        let finite = ss.is_finite() && w_finite;
                        T::store_norm(Src::F32(s), (0.0, 0.0, inv), w, None, finite, o, &mut scratch);
                    }
                });
            };
            // x and the residual read, out and residual_out written.
            if !worth_splitting(4 * rows * h * std::mem::size_of::<T>()) {
                out.v.chunks_mut(per_task).zip(res_out.v.chunks_mut(per_task)).enumerate().for_each(work);
            } else {
                out.v.par_chunks_mut(per_task).zip(res_out.v.par_chunks_mut(per_task)).enumerate().for_each(work);
            }
        }
        Ok(Outputs::from([("out", out.finish(shape)?), ("residual_out", res_out.finish(shape)?)]))
    })
}

/// `layer_norm`.
pub(crate) fn layer_norm(a: &NormArgs) -> Result<Outputs, KernelError> {
    let (rows, h, eps) = check(a, false)?;
    by_dtype!(a.x.dtype(), LAYER_NORM, T => layer_typed::<T>(a, rows, h, eps))
}

fn layer_typed<T: Elem>(a: &NormArgs, rows: usize, h: usize, eps: f32) -> Result<Outputs, KernelError> {
    if let Some(r) = &a.residual {
        // Fused residual: s = x + residual in f32, rounded once to x's dtype; s is both
        // `residual_out` and what is normalized (a post-norm block normalizes the rounded
        // sum it keeps, as a framework adding in that dtype does).
        let s: Vec<f32> = a.x.to_f32_vec().iter().zip(r.to_f32_vec()).map(|(x, r)| x + r).collect();
        let sum = HostTensor::from_f32_as(a.x.dtype(), a.x.shape(), &s)
            .map_err(|e| KernelError::Failed(format!("building residual_out: {e}")))?;
        let normed = NormArgs { x: sum.clone(), residual: None, ..a.clone() };
        let mut outs = layer_typed::<T>(&normed, rows, h, eps)?;
        outs.insert("residual_out", sum);
        return Ok(outs);
    }
    let w = all_f32(&a.weight);
    let b = a.bias.as_ref().map(all_f32);
    let wb_finite = all_finite(&w) && b.as_deref().is_none_or(all_finite);
    let x = View::new(&a.x);
    let (hf, eps) = (h as f64, f64::from(eps));
    let out = fill_typed::<T>(rows * h, h, |start, dst, buf, scratch| {
        // One reading pass for the moments: a well-conditioned bf16 row from exact products
        // summed in f32 blocks (`fast_moments`); any other row as Σ (x - k) and Σ (x - k)²
        // in f64, shifted by its first value k, so that the one-pass variance does not
        // cancel even when the mean dwarfs the spread. Then one pass reads the row again
        // (from cache) and writes the output, with the mean split into two f32 parts so
        // that f32 outputs keep their precision.
        let src = row(&x, start, h, buf);
        let (mean, var, q) = match fast_moments(src, hf) {
            Some(moments) => moments,
            None => {
                let k = match src {
                    Src::F32(v) => v[0],
                    Src::Bf16(v) => v[0].to_f32(),
                };
                let (s, q) = sums(src, k);
                let m = s / hf;
                (f64::from(k) + m, q / hf - m * m, q)
            }
        };
        // (`max` would turn the NaN of a row with an infinity into 0.)
        let var = if var < 0.0 { 0.0 } else { var };
        let inv = (1.0 / (var + eps).sqrt()) as f32;
        let hi = mean as f32;
        let lo = (mean - f64::from(hi)) as f32;
        T::store_norm(src, (hi, lo, inv), &w, b.as_deref(), wb_finite && q.is_finite(), dst, scratch);
    });
    Ok(Outputs::from([("out", tensor(out, a.x.shape())?)]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::testing::{check, invalid_message, registry, strided, t};
    use layerzero_core::compare::Category;
    use layerzero_core::model::attrs::NormAttrs;
    use layerzero_core::model::dtype::DType;

    const REF_RMS: &str = "cpu_reference.rms_norm.naive";
    const REF_LAYER: &str = "cpu_reference.layer_norm.naive";

    fn norm(x: HostTensor, weight: HostTensor, bias: Option<HostTensor>, residual: Option<HostTensor>) -> NormArgs {
        NormArgs { x, weight, bias, residual, attrs: NormAttrs::default() }
    }

    #[test]
    fn rms_norm_by_hand() -> TestResult {
        let x = HostTensor::from_f32(&[1, 2], vec![3.0, 4.0])?;
        let w = HostTensor::from_f32(&[2], vec![1.0, 1.0])?;
        let out = rms_norm(&norm(x, w, None, None))?;
        let d = (12.5f64 + 1e-6).sqrt();
        let got = out["out"].to_f64_vec();
        assert!((got[0] - 3.0 / d).abs() < 1e-7 && (got[1] - 4.0 / d).abs() < 1e-7, "{got:?}");
        Ok(())
    }

    #[test]
    fn norms_match_the_reference_on_odd_shapes_and_every_dtype() -> TestResult {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for rows in [1usize, 7, 33] {
                for h in [1usize, 5, 4096, 4097] {
                    let seed = (rows * 10_000 + h) as u64;
                    let x = t(&[rows, h], seed, dtype, 2.0)?;
                    let w = t(&[h], seed + 1, dtype, 1.5)?;
                    let b = t(&[h], seed + 2, dtype, 1.0)?;
                    let r = t(&[rows, h], seed + 3, dtype, 1.0)?;
                    let what = format!("{rows}x{h} {dtype}");
                    let a = |bias, res| norm(x.clone(), w.clone(), bias, res);
                    check(RMS_NORM, REF_RMS, &OpArgs::RmsNorm(a(None, None)), Category::Norms, &what)?;
                    let res = OpArgs::RmsNorm(a(None, Some(r.clone())));
                    check(RMS_NORM, REF_RMS, &res, Category::Norms, &format!("{what} residual"))?;
                    check(LAYER_NORM, REF_LAYER, &OpArgs::LayerNorm(a(None, None)), Category::Norms, &what)?;
                    let res = OpArgs::LayerNorm(a(Some(b.clone()), Some(r.clone())));
                    check(LAYER_NORM, REF_LAYER, &res, Category::Norms, &format!("{what} bias residual"))?;
                    let lb = OpArgs::LayerNorm(a(Some(b.clone()), None));
                    check(LAYER_NORM, REF_LAYER, &lb, Category::Norms, &format!("{what} bias"))?;
                }
            }
        }
        Ok(())
    }

    #[test]
    fn layer_norm_of_a_large_mean_keeps_its_precision() -> TestResult {
        // mean 1000, spread 1: the one-pass variance of the 16-bit path would cancel.
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let v: Vec<f32> = crate::testing::values(3 * 256, 4).iter().map(|x| 1000.0 + x).collect();
            let x = HostTensor::from_f32_as(dtype, &[3, 256], &v)?;
            let a = norm(x, t(&[256], 5, dtype, 1.0)?, Some(t(&[256], 6, dtype, 1.0)?), None);
            check(LAYER_NORM, REF_LAYER, &OpArgs::LayerNorm(a), Category::Norms, &format!("mean 1000 {dtype}"))?;
        }
        Ok(())
    }

    #[test]
    fn norms_of_rows_with_infinities_and_nans_match_the_reference() -> TestResult {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let mut v = crate::testing::values(4 * 64, 13);
            (v[0], v[64 + 5], v[128 + 9], v[192 + 63]) = (f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e30);
            let x = HostTensor::from_f32_as(dtype, &[4, 64], &v)?;
            let a = norm(x, t(&[64], 14, dtype, 1.0)?, Some(t(&[64], 15, dtype, 1.0)?), None);
            check(LAYER_NORM, REF_LAYER, &OpArgs::LayerNorm(a.clone()), Category::Norms, &format!("inf {dtype}"))?;
            let r = NormArgs { bias: None, ..a };
            check(RMS_NORM, REF_RMS, &OpArgs::RmsNorm(r), Category::Norms, &format!("inf {dtype}"))?;
        }
        Ok(())
    }

    #[test]
    fn norms_on_strided_views_mixed_dtypes_and_eps() -> TestResult {
        for dtype in [DType::F32, DType::BF16] {
            let x = t(&[3, 5, 67], 7, dtype, 3.0)?;
            let w = t(&[67], 8, DType::F32, 1.0)?;
            let b = t(&[67], 9, DType::F16, 1.0)?;
            let r = t(&[3, 5, 67], 10, DType::F16, 1.0)?;
            for (i, xs) in strided(&x)?.into_iter().enumerate() {
                for (j, rs) in strided(&r)?.into_iter().enumerate() {
                    let what = format!("{dtype} x view {i} residual view {j}");
                    let mut a = norm(xs.clone(), w.clone(), None, Some(rs));
                    a.attrs.eps = Some(1e-2);
                    check(RMS_NORM, REF_RMS, &OpArgs::RmsNorm(a), Category::Norms, &what)?;
                }
                let what = format!("{dtype} x view {i}");
                let a = norm(xs.clone(), w.clone(), Some(b.clone()), None);
                check(LAYER_NORM, REF_LAYER, &OpArgs::LayerNorm(a), Category::Norms, &what)?;
                // Leading dims permuted (rows no longer one stride apart).
                let p = xs.permute(&[1, 0, 2])?;
                check(RMS_NORM, REF_RMS, &OpArgs::RmsNorm(norm(p, w.clone(), None, None)), Category::Norms, &what)?;
            }
            // A transposed x normalizes along its own last dim; a strided weight.
            let xt = t(&[48, 9], 11, dtype, 1.0)?.permute(&[1, 0])?;
            let wv = strided(&t(&[48], 12, dtype, 1.0)?)?.remove(1);
            let a = norm(xt, wv, None, None);
            check(RMS_NORM, REF_RMS, &OpArgs::RmsNorm(a.clone()), Category::Norms, "transposed")?;
            check(LAYER_NORM, REF_LAYER, &OpArgs::LayerNorm(a), Category::Norms, "transposed")?;
        }
        Ok(())
    }

    #[test]
    fn norm_errors_and_empty_inputs() -> TestResult {
        let x = t(&[2, 3], 1, DType::F32, 1.0)?;
        let m = invalid_message(RMS_NORM, &OpArgs::RmsNorm(norm(x.clone(), t(&[2], 2, DType::F32, 1.0)?, None, None)))?;
        assert!(m.contains("`weight`") && m.contains("[2]") && m.contains("[3]"), "{m}");
        let bad_res = norm(x.clone(), t(&[3], 2, DType::F32, 1.0)?, None, Some(t(&[3, 2], 3, DType::F32, 1.0)?));
        let m = invalid_message(RMS_NORM, &OpArgs::RmsNorm(bad_res.clone()))?;
        assert!(m.contains("`residual`") && m.contains("[3, 2]"), "{m}");
        assert!(invalid_message(LAYER_NORM, &OpArgs::LayerNorm(bad_res))?.contains("residual"));
        let bad_bias = norm(x.clone(), t(&[3], 2, DType::F32, 1.0)?, Some(t(&[4], 3, DType::F32, 1.0)?), None);
        assert!(invalid_message(LAYER_NORM, &OpArgs::LayerNorm(bad_bias.clone()))?.contains("`bias`"));
        assert!(invalid_message(RMS_NORM, &OpArgs::RmsNorm(bad_bias))?.contains("bias"));
        let mut neg = norm(x.clone(), t(&[3], 2, DType::F32, 1.0)?, None, None);
        neg.attrs.eps = Some(-1.0);
        assert!(invalid_message(RMS_NORM, &OpArgs::RmsNorm(neg))?.contains("eps"));
        let scalar = norm(t(&[], 1, DType::F32, 1.0)?, t(&[1], 2, DType::F32, 1.0)?, None, None);
        assert!(invalid_message(LAYER_NORM, &OpArgs::LayerNorm(scalar))?.contains("`x`"));
        // fp8 x is not one of the declared dtypes: unsupported, not a panic.
        let f8 = HostTensor::from_f32_as(DType::Fp8E4M3, &[1, 3], &[1.0, 2.0, 3.0])?;
        let r = rms_norm(&norm(f8, t(&[3], 2, DType::F32, 1.0)?, None, None));
        assert!(matches!(r, Err(KernelError::Unsupported(_))), "{r:?}");
        // Empty rows and an empty hidden dim.
        let e = norm(
            t(&[0, 4], 1, DType::BF16, 1.0)?,
            t(&[4], 2, DType::BF16, 1.0)?,
            None,
            Some(t(&[0, 4], 3, DType::BF16, 1.0)?),
        );
        let o = rms_norm(&e)?;
        assert_eq!((o["out"].shape(), o["residual_out"].shape()), (&[0usize, 4][..], &[0usize, 4][..]));
        let e = norm(t(&[3, 0], 1, DType::F16, 1.0)?, t(&[0], 2, DType::F16, 1.0)?, None, None);
        assert_eq!(layer_norm(&e)?["out"].shape(), &[3, 0]);
        // The wrong op.
        let r = registry();
        let a = OpArgs::LayerNorm(norm(x, t(&[3], 2, DType::F32, 1.0)?, None, None));
        assert!(matches!(
            r.get(RMS_NORM).ok_or("rms_norm is not registered")?.run(&a),
            Err(KernelError::Unsupported(_))
        ));
        Ok(())
    }
}
