//! `linear`, `linear_w8a8` and `linear_int4` of the `cpu_reference` backend: every input is
//! read through its view's shape and strides as f64, every dot product is an f64 sum in
//! order k = 0..K, and the output is rounded once to its dtype.
//!
//! - `linear`: x [..., K] (f32/f16/bf16), weight [N, K] (untagged or NT) or [K, N] (NN),
//!   bias [N]; out [..., N] in x's dtype.
//! - `linear_w8a8`: i8 x [M, K], i8 weight [N, K], f32 x_scale [M] or [1], f32 w_scale [N]
//!   or [1], float bias [N]; `out = acc * xs * ws + bias` (exact integer acc), out_dtype.
//!   With `attrs.group_size` g: x_scale [M, K/g] and w_scale [N, K/g], and the sum runs over
//!   blocks, each block's exact integer acc times its scale pair (llama.cpp's Q8_0 dot).
//! - `linear_int4`: x [..., K], weight i8 [N, K/2] (two 4-bit codes per byte, low nibble =
//!   even k; high nibble for nf4), scales [N, K/g]; int4: zeros [N, K/g] (8 when absent),
//!   `w = (q - zero) * scale`; nf4 / mxfp4 / nvfp4: `w = code(q) * scale` with the format's
//!   table and scale decoding (`model::w4`); out [..., N] in x's dtype. With
//!   `attrs.activations = int8`, x is first rounded to int8 in blocks of g (f32 arithmetic,
//!   `d = max|x| / 127`, `q = round_ties_even(x / d)`) and scaled back.

use std::sync::Arc;

use layerzero_core::exec::args::{Int4Args, LinearArgs, OpArgs, Outputs, W8a8Args};
use layerzero_core::exec::check::W4Scales;
use layerzero_core::exec::executor::{KernelError, Registry};
use layerzero_core::model::op::Op;
use layerzero_core::model::w4::{ActQuant, W4Format, e8m0};
use layerzero_core::tensor::HostTensor;

use super::{from_f64_as, wrong_op};
use layerzero_core::exec::check::{
    WeightLayout, check_bias, expect_dense_float, invalid, out_dtype, out_shape, rows_of, weight_dims,
};

/// Linear kernel id.
pub const LINEAR: &str = "cpu_reference.linear.naive";
/// W8A8 linear kernel id.
pub const W8A8: &str = "cpu_reference.linear_w8a8.naive";
/// Weight-only int4 linear kernel id.
pub const INT4: &str = "cpu_reference.linear_int4.naive";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        LINEAR,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Linear(a) => linear(a).map(out),
            other => Err(wrong_op(LINEAR, Op::Linear, other)),
        }),
    );
    registry.register(
        W8A8,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::LinearW8a8(a) => linear_w8a8(a).map(out),
            other => Err(wrong_op(W8A8, Op::LinearW8a8, other)),
        }),
    );
    registry.register(
        INT4,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::LinearInt4(a) => linear_int4(a).map(out),
            other => Err(wrong_op(INT4, Op::LinearInt4, other)),
        }),
    );
}

fn out(t: HostTensor) -> Outputs {
    Outputs::from([("out", t)])
}

/// `out[m, n] = sum_k x[m, k] * w(n, k) + bias[n]` in f64 (x logical rows of length K).
fn matmul_f64(
    x: &[f64],
    m: usize,
    k: usize,
    n: usize,
    w: impl Fn(usize, usize) -> f64,
    bias: Option<&[f64]>,
) -> Vec<f64> {
    let mut out = vec![0.0f64; m * n];
    for i in 0..m {
        let row = &x[i * k..(i + 1) * k];
        for j in 0..n {
            let mut acc = 0.0f64;
            for (p, &xv) in row.iter().enumerate() {
                acc += xv * w(j, p);
            }
            out[i * n + j] = acc + bias.map_or(0.0, |b| b[j]);
        }
    }
    out
}

/// `linear`: `out = x @ W^T + bias` in f64, rounded once to x's dtype.
pub fn linear(a: &LinearArgs) -> Result<HostTensor, KernelError> {
    expect_dense_float("x", &a.x)?;
    expect_dense_float("weight", &a.weight)?;
    let (lead, m, k) = rows_of("x", &a.x)?;
    let (layout, n) = weight_dims("weight", &a.weight, k)?;
    check_bias(a.bias.as_ref(), n)?;
    let shape = out_shape(&lead, n);
    m.checked_mul(n).ok_or_else(|| invalid(format!("the output shape {shape:?} overflows")))?;
    let x = a.x.to_f64_vec();
    let w = a.weight.to_f64_vec();
    let bias = a.bias.as_ref().map(HostTensor::to_f64_vec);
    let out = match layout {
        WeightLayout::Nt => matmul_f64(&x, m, k, n, |j, p| w[j * k + p], bias.as_deref()),
        WeightLayout::Nn => matmul_f64(&x, m, k, n, |j, p| w[p * n + j], bias.as_deref()),
    };
    from_f64_as(a.x.dtype(), &shape, &out)
}

/// `linear_w8a8`: exact integer dot products, then `acc * x_scale * w_scale + bias` in f64.
pub fn linear_w8a8(a: &W8a8Args) -> Result<HostTensor, KernelError> {
    let (m, k, n) = a.dims()?;
    let x = a.x.to_i64_vec();
    let w = a.weight.to_i64_vec();
    let xs = a.x_scale.to_f64_vec();
    let ws = a.w_scale.to_f64_vec();
    let bias = a.bias.as_ref().map(HostTensor::to_f64_vec);
    let mut out = vec![0.0f64; m * n];
    // Blocks of g features, each with its scale pair; per row: one block of all K.
    let g = a.attrs.group_size.map_or(k, |g| g as usize).max(1);
    let blocks = k / g;
    for i in 0..m {
        for j in 0..n {
            let mut sum = 0.0f64;
            for b in 0..blocks {
                let acc: i64 = (b * g..(b + 1) * g).map(|p| x[i * k + p] * w[j * k + p]).sum();
                let s = match a.attrs.group_size {
                    Some(_) => xs[i * blocks + b] * ws[j * blocks + b],
                    None => xs[if xs.len() == 1 { 0 } else { i }] * ws[if ws.len() == 1 { 0 } else { j }],
                };
                sum += acc as f64 * s;
            }
            out[i * n + j] = sum + bias.as_ref().map_or(0.0, |b| b[j]);
        }
    }
    from_f64_as(out_dtype("out_dtype", a.attrs.out_dtype)?, &[m, n], &out)
}

/// The 4-bit code of column `k` in a packed byte row: the even k in the low nibble, or in
/// the high one when `high_first` (nf4, as bitsandbytes packs).
#[inline]
pub(crate) fn nibble(byte: i8, k: usize, high_first: bool) -> u8 {
    let b = byte as u8;
    if k.is_multiple_of(2) != high_first { b & 0x0F } else { b >> 4 }
}

/// The f64 value of every block scale of a 4-bit weight: mxfp4's E8M0 bytes decoded,
/// nvfp4's times its global scale, the others as stored.
fn block_scales(format: W4Format, scales: &HostTensor, global: Option<&HostTensor>) -> Vec<f64> {
    match format {
        W4Format::Mxfp4 => scales.to_i64_vec().into_iter().map(|e| e8m0(e as i8 as u8)).collect(),
        W4Format::Nvfp4 => {
            let global = global.map_or(1.0, |g| g.to_f64_vec()[0]);
            scales.to_f64_vec().into_iter().map(|s| s * global).collect()
        }
        W4Format::Int4 | W4Format::Nf4 => scales.to_f64_vec(),
    }
}

/// A packed `[N, K/2]` 4-bit weight decoded in f64 by its format (`model::w4`), row-major
/// `[N, K]`: code value times its block scale (int4: `(q - zero) * scale`, zero 8 without
/// `zeros`). Its arguments were checked (`W4Scales::check`).
pub(crate) fn decode_w4(w: &W4Scales, packed: &HostTensor, n: usize, k: usize, g: usize) -> Vec<f64> {
    let (format, groups) = (w.format, k / g);
    let packed = packed.to_i64_vec();
    let scales = block_scales(format, w.scales, w.global);
    let zeros = w.zeros.map(HostTensor::to_f64_vec);
    let mut out = vec![0.0f64; n * k];
    for j in 0..n {
        for p in 0..k {
            let q = nibble(packed[j * (k / 2) + p / 2] as i8, p, format.high_nibble_first());
            let gi = j * groups + p / g;
            let code = match format {
                W4Format::Int4 => f64::from(q) - zeros.as_ref().map_or(8.0, |z| z[gi]),
                other => f64::from(other.code(q)),
            };
            out[j * k + p] = code * scales[gi];
        }
    }
    out
}

/// `linear_int4`: the weight dequantized in f64 by its format (`model::w4`), then
/// `x @ w^T + bias`, rounded once.
pub fn linear_int4(a: &Int4Args) -> Result<HostTensor, KernelError> {
    let (lead, m, k, n, g) = a.dims()?;
    let w = decode_w4(&a.w4_scales(), &a.weight, n, k, g);
    let x = match a.attrs.activations {
        ActQuant::F32 => a.x.to_f64_vec(),
        ActQuant::Int8 => round_to_int8(&a.x.to_f32_vec(), g).into_iter().map(f64::from).collect(),
    };
    let bias = a.bias.as_ref().map(HostTensor::to_f64_vec);
    let out = matmul_f64(&x, m, k, n, |j, p| w[j * k + p], bias.as_deref());
    from_f64_as(a.x.dtype(), &out_shape(&lead, n), &out)
}

/// x rounded to int8 in blocks of `g` along its rows and scaled back, in f32 arithmetic as
/// `attrs.activations = int8` defines it: `d = max|x| / 127`, `q = round_ties_even(x / d)`.
fn round_to_int8(x: &[f32], g: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for block in x.chunks(g) {
        let d = block.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        out.extend(
            block.iter().map(|&v| if d == 0.0 { 0.0 } else { (v / d).round_ties_even().clamp(-127.0, 127.0) * d }),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::test_util::values;
    use layerzero_core::model::attrs::{Int4Attrs, NoAttrs, W8a8Attrs};
    use layerzero_core::model::dtype::DType;
    use layerzero_core::model::layout::Layout;

    fn f32s(shape: &[usize], v: &[f32]) -> TestResult<HostTensor> {
        Ok(HostTensor::from_f32(shape, v.to_vec())?)
    }

    fn lin(x: HostTensor, weight: HostTensor, bias: Option<HostTensor>) -> Result<HostTensor, KernelError> {
        linear(&LinearArgs { x, weight, bias, attrs: NoAttrs {} })
    }

    #[test]
    fn hand_computed_2x3_at_3x2_nt_nn_and_bias() -> TestResult {
        let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])?;
        // W^T = [[1, 2], [3, 4], [5, 6]] -> x @ W^T = [[22, 28], [49, 64]].
        let nt = f32s(&[2, 3], &[1.0, 3.0, 5.0, 2.0, 4.0, 6.0])?;
        let nn = f32s(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])?.with_layout(Layout::Nn);
        let a = lin(x.clone(), nt.clone(), None)?;
        assert_eq!(a.shape(), &[2, 2]);
        assert_eq!(a.to_f32_vec(), vec![22.0, 28.0, 49.0, 64.0]);
        assert_eq!(lin(x.clone(), nn, None)?.to_f32_vec(), a.to_f32_vec());
        assert_eq!(lin(x.clone(), nt.clone().with_layout(Layout::Nt), None)?.to_f32_vec(), a.to_f32_vec());
        let b = f32s(&[2], &[0.5, -1.0])?;
        assert_eq!(lin(x.clone(), nt.clone(), Some(b))?.to_f32_vec(), vec![22.5, 27.0, 49.5, 63.0]);
        // A 3-D x keeps its leading dims; bf16 in, bf16 out.
        let x3 = HostTensor::from_f32_as(DType::BF16, &[1, 2, 3], &x.to_f32_vec())?;
        let o = lin(x3, nt, None)?;
        assert_eq!((o.shape(), o.dtype()), (&[1usize, 2, 2][..], DType::BF16));
        assert_eq!(o.to_f32_vec(), vec![22.0, 28.0, 49.0, 64.0]);
        Ok(())
    }

    #[test]
    fn strided_views_read_through_strides() -> TestResult {
        let x = f32s(&[3, 5], &values(15, 1))?;
        let w = f32s(&[4, 5], &values(20, 2))?;
        let want = lin(x.clone(), w.clone(), None)?.to_f32_vec();
        // x^T stored as [5, 3] and permuted back; W as a permuted [K, N] buffer.
        let xt = x.permute(&[1, 0])?.contiguous().permute(&[1, 0])?;
        let wt = w.permute(&[1, 0])?.contiguous().permute(&[1, 0])?;
        assert!(!xt.is_contiguous() && !wt.is_contiguous());
        assert_eq!(lin(xt, wt, None)?.to_f32_vec(), want);
        Ok(())
    }

    #[test]
    fn bad_inputs_are_named() -> TestResult {
        let x = f32s(&[2, 3], &[0.0; 6])?;
        let err = |r: Result<HostTensor, KernelError>| match r {
            Err(KernelError::InvalidInput(m)) => m,
            other => panic!("expected InvalidInput, got {other:?}"),
        };
        let m = err(lin(x.clone(), f32s(&[2, 4], &[0.0; 8])?, None));
        assert!(m.contains("`weight`") && m.contains("[2, 4]") && m.contains("K = 3"), "{m}");
        let m = err(lin(x.clone(), f32s(&[2, 3], &[0.0; 6])?, Some(f32s(&[3], &[0.0; 3])?)));
        assert!(m.contains("`bias`") && m.contains("[2]"), "{m}");
        let m = err(lin(x.clone(), f32s(&[2, 3], &[0.0; 6])?.with_layout(Layout::Bshd), None));
        assert!(m.contains("layout BSHD"), "{m}");
        let m = err(lin(HostTensor::zeros(DType::I32, &[2, 3])?, f32s(&[2, 3], &[0.0; 6])?, None));
        assert!(m.contains("`x`") && m.contains("i32"), "{m}");
        assert!(matches!(
            lin(HostTensor::zeros(DType::Fp8E4M3, &[2, 3])?, f32s(&[2, 3], &[0.0; 6])?, None),
            Err(KernelError::Unsupported(_))
        ));
        // Empty dims give empty (or bias-only) outputs, never a panic.
        let e = lin(f32s(&[0, 3], &[])?, f32s(&[2, 3], &[0.0; 6])?, None)?;
        assert_eq!(e.shape(), &[0, 2]);
        let z = lin(f32s(&[2, 0], &[])?, f32s(&[2, 0], &[])?, Some(f32s(&[2], &[1.0, 2.0])?))?;
        assert_eq!(z.to_f32_vec(), vec![1.0, 2.0, 1.0, 2.0]);
        Ok(())
    }

    #[test]
    fn w8a8_hand_computed_and_scale_checks() -> TestResult {
        let x = HostTensor::from_f32_as(DType::I8, &[2, 2], &[1.0, -2.0, 3.0, 4.0])?;
        let w = HostTensor::from_f32_as(DType::I8, &[3, 2], &[1.0, 1.0, -1.0, 2.0, 127.0, -128.0])?;
        let args = |xs: HostTensor, ws: HostTensor, bias: Option<HostTensor>| W8a8Args {
            x: x.clone(),
            x_scale: xs,
            weight: w.clone(),
            w_scale: ws,
            bias,
            attrs: W8a8Attrs::default(),
        };
        // acc = [[-1, -5, 383], [7, 5, -131]].
        let a = args(f32s(&[2], &[0.5, 2.0])?, f32s(&[1], &[0.25])?, Some(f32s(&[3], &[1.0, 0.0, 0.0])?));
        let o = linear_w8a8(&a)?;
        assert_eq!(o.to_f32_vec(), vec![0.875, -0.625, 47.875, 4.5, 2.5, -65.5]);
        let bad = args(f32s(&[3], &[1.0; 3])?, f32s(&[1], &[1.0])?, None);
        match linear_w8a8(&bad) {
            Err(KernelError::InvalidInput(m)) => {
                assert!(m.contains("SCALE_LAYOUT_MISMATCH") && m.contains("x_scale"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        Ok(())
    }

    #[test]
    fn int4_nibble_order_and_default_zero() -> TestResult {
        // Byte 0x21: k=0 -> 1, k=1 -> 2. Byte 0xF0 (-16 as i8): k=2 -> 0, k=3 -> 15.
        let w = HostTensor::new(layerzero_core::tensor::Storage::I8(vec![0x21, 0xF0u8 as i8].into()), &[1, 2])?;
        let x = f32s(&[1, 4], &[1.0, 10.0, 100.0, 1000.0])?;
        let scales = f32s(&[1, 2], &[1.0, 0.5])?;
        let args = |zeros: Option<HostTensor>| Int4Args {
            x: x.clone(),
            weight: w.clone(),
            scales: scales.clone(),
            zeros,
            bias: None,
            global_scale: None,
            attrs: Int4Attrs::int4(2),
        };
        // Zero 8: w = [-7, -6, -4, 3.5].
        assert_eq!(linear_int4(&args(None))?.to_f32_vec(), vec![-7.0 - 60.0 - 400.0 + 3500.0]);
        // Zeros [0, 15]: w = [1, 2, -7.5, 0].
        assert_eq!(linear_int4(&args(Some(f32s(&[1, 2], &[0.0, 15.0])?)))?.to_f32_vec(), vec![1.0 + 20.0 - 750.0]);
        let mut bad = args(None);
        bad.attrs.group_size = 3;
        assert!(matches!(linear_int4(&bad), Err(KernelError::InvalidInput(m)) if m.contains("SCALE_LAYOUT_MISMATCH")));
        let mut bad = args(None);
        bad.scales = f32s(&[2, 1], &[1.0, 1.0])?;
        assert!(matches!(linear_int4(&bad), Err(KernelError::InvalidInput(m)) if m.contains("`scales`")));
        Ok(())
    }

    #[test]
    fn four_bit_formats_decode_their_codes_in_their_nibble_order() -> TestResult {
        use layerzero_core::model::dtype::DType;
        use layerzero_core::model::w4::{NF4, W4Format};
        use layerzero_core::tensor::Storage;
        // A row of K codes whose first byte 0x21 holds codes 1 (low nibble) and 2 (high
        // nibble), the rest code 0; x = [1, 10, 0, ...] reads w0 + 10 * w1.
        let run = |format, k: usize, scales: HostTensor, global: Option<HostTensor>| -> TestResult<f64> {
            let mut bytes = vec![0i8; k / 2];
            bytes[0] = 0x21;
            let mut xs = vec![0.0; k];
            xs[..2].copy_from_slice(&[1.0, 10.0]);
            let a = Int4Args {
                x: f32s(&[1, k], &xs)?,
                weight: HostTensor::new(Storage::I8(bytes.into()), &[1, k / 2])?,
                scales,
                zeros: None,
                bias: None,
                global_scale: global,
                attrs: Int4Attrs::of(format, k as u64),
            };
            Ok(linear_int4(&a)?.to_f64_vec()[0])
        };
        // nf4 (bitsandbytes): the even element is the HIGH nibble: w = [NF4[2], NF4[1]] * absmax 2.
        let want = (f64::from(NF4[2]) + 10.0 * f64::from(NF4[1])) * 2.0;
        assert_eq!(run(W4Format::Nf4, 4, f32s(&[1, 1], &[2.0])?, None)?, f64::from(want as f32));
        // mxfp4, low nibble first: w = [E2M1 0.5, E2M1 1] * 2^(128 - 127) = [1, 2].
        let e8m0 = HostTensor::new(Storage::I8(vec![128u8 as i8].into()), &[1, 1])?;
        assert_eq!(run(W4Format::Mxfp4, 32, e8m0, None)?, 1.0 + 10.0 * 2.0);
        // nvfp4: w = E2M1 * e4m3 scale * global = [0.5, 1] * 1.5 * 4 = [3, 6].
        let e4m3 = HostTensor::from_f32_as(DType::Fp8E4M3, &[1, 1], &[1.5])?;
        assert_eq!(run(W4Format::Nvfp4, 16, e4m3, Some(f32s(&[1], &[4.0])?))?, 3.0 + 10.0 * 6.0);
        // A block size that is not the format's is refused, naming it.
        let e4m3 = HostTensor::from_f32_as(DType::Fp8E4M3, &[1, 1], &[1.5])?;
        let err = run(W4Format::Nvfp4, 32, e4m3, None).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("SCALE_LAYOUT_MISMATCH") && err.contains("blocks of 16"), "{err}");
        Ok(())
    }
}
