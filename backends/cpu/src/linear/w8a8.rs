//! `linear_w8a8`: exact i8 dot products, then the f32 scales.

use rayon::prelude::*;

use super::{check_bias, invalid};
use crate::gemm::{chunks, to_tensor};
use crate::simd;
use layerzero_core::exec::args::W8a8Args;
use layerzero_core::exec::executor::KernelError;
use layerzero_core::model::dtype::DType;
use layerzero_core::model::layout::Layout;
use layerzero_core::tensor::{HostTensor, Storage};

#[inline(always)]
fn dot_i8_impl(a: &[i8], b: &[i8]) -> i64 {
    // |a * b| <= 2^14, so 2^16 products fit an i32 (the vectorizer's pmaddwd pattern).
    let mut total = 0i64;
    for (ca, cb) in a.chunks(1 << 16).zip(b.chunks(1 << 16)) {
        let s: i32 = ca.iter().zip(cb).map(|(&x, &y)| i32::from(x) * i32::from(y)).sum();
        total += i64::from(s);
    }
    total
}

/// The exact dot product of two i8 vectors.
fn dot_i8(a: &[i8], b: &[i8]) -> i64 {
    #[cfg(target_arch = "x86_64")]
    {
        /// # Safety
        /// The CPU must support AVX-512F, AVX-512BW, AVX2.
        #[allow(unsafe_code)]
        #[target_feature(enable = "avx512f,avx512bw,avx2")]
        unsafe fn with_avx512(a: &[i8], b: &[i8]) -> i64 {
            dot_i8_impl(a, b)
        }
        /// # Safety
        /// The CPU must support AVX2.
        #[allow(unsafe_code)]
        #[target_feature(enable = "avx2")]
        unsafe fn with_avx2(a: &[i8], b: &[i8]) -> i64 {
            dot_i8_impl(a, b)
        }
        match simd::level() {
            simd::Level::Avx512 => {
                #[allow(unsafe_code)]
                // SAFETY: `level()` is Avx512 only when the CPU reports AVX-512F/BW and AVX2.
                return unsafe { with_avx512(a, b) };
            }
            simd::Level::Avx2 => {
                #[allow(unsafe_code)]
                // SAFETY: `level()` is Avx2 only when the CPU reports AVX2.
                return unsafe { with_avx2(a, b) };
            }
            simd::Level::Portable => {}
        }
    }
    dot_i8_impl(a, b)
}

/// The elements of an i8 matrix in row-major order (in place when contiguous).
fn i8_rows<'a>(t: &'a HostTensor, holder: &'a mut Vec<i8>) -> &'a [i8] {
    if let Storage::I8(v) = t.storage()
        && t.is_contiguous()
    {
        return &v[t.offset()..t.offset() + t.numel()];
    }
    *holder = t.to_i64_vec().into_iter().map(|v| v as i8).collect();
    holder
}

/// A per-row scale ([1] or [rows]) of `linear_w8a8`, checked.
fn row_scale(name: &str, s: &HostTensor, rows: usize, of: &str) -> Result<Vec<f32>, KernelError> {
    if s.dtype() != DType::F32 {
        return Err(invalid(format!("tensor `{name}` has dtype {}; expected f32", s.dtype())));
    }
    if s.shape() != [1] && s.shape() != [rows] {
        return Err(invalid(format!(
            "SCALE_LAYOUT_MISMATCH: tensor `{name}` has shape {:?} strides {:?}; expected [1] (per tensor) or \
             [{rows}] (one scale per row of {of})",
            s.shape(),
            s.strides()
        )));
    }
    Ok(s.to_f32_vec())
}

/// `linear_w8a8`: `out = (acc * x_scale) * w_scale + bias` with exact integer `acc`.
pub(crate) fn linear_w8a8(a: &W8a8Args) -> Result<HostTensor, KernelError> {
    for (name, t) in [("x", &a.x), ("weight", &a.weight)] {
        if t.dtype() != DType::I8 {
            return Err(invalid(format!("tensor `{name}` has dtype {}; linear_w8a8 expects i8", t.dtype())));
        }
        if t.rank() != 2 {
            return Err(invalid(format!("tensor `{name}` has shape {:?}; expected rank 2", t.shape())));
        }
    }
    if let Some(l) = a.weight.layout()
        && l != Layout::Nt
    {
        return Err(invalid(format!("tensor `weight` has layout {l}; linear_w8a8 takes [N, K] (NT) weights")));
    }
    let (m, k, n) = (a.x.shape()[0], a.x.shape()[1], a.weight.shape()[0]);
    if a.weight.shape()[1] != k {
        return Err(invalid(format!(
            "tensor `weight` has shape {:?}; expected [N, K] with K = {k} from x {:?}",
            a.weight.shape(),
            a.x.shape()
        )));
    }
    let xs = row_scale("x_scale", &a.x_scale, m, "x")?;
    let ws = row_scale("w_scale", &a.w_scale, n, "weight")?;
    let bias = check_bias(a.bias.as_ref(), n)?;
    let dtype = match a.attrs.out_dtype.unwrap_or(DType::F32) {
        d @ (DType::F32 | DType::F16 | DType::BF16) => d,
        d => return Err(invalid(format!("attrs.out_dtype is {d}; expected f32, f16 or bf16"))),
    };
    let len = m.checked_mul(n).ok_or_else(|| invalid(format!("the output [{m}, {n}] overflows")))?;
    let (mut hx, mut hw) = (Vec::new(), Vec::new());
    let (x, w) = (i8_rows(&a.x, &mut hx), i8_rows(&a.weight, &mut hw));
    let mut c = vec![0f32; len];
    if len > 0 {
        // Weight-row chunks in parallel (each chunk stays in cache across the M rows).
        let parts: Vec<Vec<f32>> = chunks(n, 16)
            .into_par_iter()
            .map(|(n0, nb)| {
                let mut part = vec![0f32; m * nb];
                for i in 0..m {
                    let xr = &x[i * k..(i + 1) * k];
                    let sx = xs[if xs.len() == 1 { 0 } else { i }];
                    for j in 0..nb {
                        let col = n0 + j;
                        let acc = dot_i8(xr, &w[col * k..(col + 1) * k]);
                        let sw = ws[if ws.len() == 1 { 0 } else { col }];
                        part[i * nb + j] = (acc as f32 * sx) * sw + bias.as_ref().map_or(0.0, |b| b[col]);
                    }
                }
                part
            })
            .collect();
        for ((n0, nb), part) in chunks(n, 16).into_iter().zip(parts) {
            for i in 0..m {
                c[i * n + n0..i * n + n0 + nb].copy_from_slice(&part[i * nb..(i + 1) * nb]);
            }
        }
    }
    to_tensor(dtype, &[m, n], c)
}
