//! `linear_w8a8`: exact i8 dot products, then the f32 scales. With block scales
//! (`attrs.group_size`) each block's exact integer dot is scaled in f32 lanes
//! ([`simd::dot_i8_block_rows`]), the rows of x widened to i16 once per call.

use rayon::prelude::*;

use super::{check_bias, invalid};
use crate::alloc::{Out, with_scratch};
use crate::gemm::{Mat, Weights, chunk_size, chunks, linear_f32, to_tensor, weight_b};
use crate::rows::{Elem, by_dtype};
use crate::simd;
use layerzero_core::exec::args::{Outputs, W8a8Args};
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

/// Rows of x from which a call runs as a prefill (f32 GEMM of the scaled operands).
const PREFILL_ROWS: usize = 16;

/// `v` ([rows, k] codes) times its scales: per block of `group`, or per row ([1] or [rows]).
fn scaled(v: &[i8], s: &[f32], rows: usize, k: usize, group: Option<usize>) -> Vec<f32> {
    let mut out = vec![0f32; rows * k];
    for (r, (o, q)) in out.chunks_exact_mut(k).zip(v.chunks_exact(k)).enumerate() {
        match group {
            Some(g) => {
                let sr = &s[r * (k / g)..(r + 1) * (k / g)];
                for ((ob, qb), &sc) in o.chunks_exact_mut(g).zip(q.chunks_exact(g)).zip(sr) {
                    ob.iter_mut().zip(qb).for_each(|(o, &q)| *o = f32::from(q) * sc);
                }
            }
            None => {
                let sc = s[if s.len() == 1 { 0 } else { r }];
                o.iter_mut().zip(q).for_each(|(o, &q)| *o = f32::from(q) * sc);
            }
        }
    }
    out
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

/// A checked f32 tensor's elements in row-major order: in place when contiguous, else
/// copied into `holder`.
fn f32_elems<'a>(t: &'a HostTensor, holder: &'a mut Vec<f32>) -> &'a [f32] {
    if let Storage::F32(v) = t.storage()
        && t.is_contiguous()
    {
        return &v[t.offset()..t.offset() + t.numel()];
    }
    *holder = t.to_f32_vec();
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
#[cfg(test)]
pub(crate) fn linear_w8a8(a: &W8a8Args) -> Result<HostTensor, KernelError> {
    let mut o = linear_w8a8_into(a, &mut Outputs::new())?;
    o.remove("out").ok_or_else(|| KernelError::Failed("linear_w8a8 wrote no `out`".to_owned()))
}

/// [`linear_w8a8`] into the buffer of the previous call where it fits (a decode step's
/// projections allocate nothing once warm).
pub(crate) fn linear_w8a8_into(a: &W8a8Args, bufs: &mut Outputs) -> Result<Outputs, KernelError> {
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
    // Block scales (`attrs.group_size`) are checked as the reference checks them.
    let (mut hxs, mut hws) = (Vec::new(), Vec::new());
    let (xs, ws, group) = match a.attrs.group_size {
        None => {
            hxs = row_scale("x_scale", &a.x_scale, m, "x")?;
            hws = row_scale("w_scale", &a.w_scale, n, "weight")?;
            (&hxs[..], &hws[..], None)
        }
        Some(g) => {
            a.dims()?;
            (f32_elems(&a.x_scale, &mut hxs), f32_elems(&a.w_scale, &mut hws), Some(g as usize))
        }
    };
    let bias = check_bias(a.bias.as_ref(), n)?;
    let dtype = match a.attrs.out_dtype.unwrap_or(DType::F32) {
        d @ (DType::F32 | DType::F16 | DType::BF16) => d,
        d => return Err(invalid(format!("attrs.out_dtype is {d}; expected f32, f16 or bf16"))),
    };
    let len = m.checked_mul(n).ok_or_else(|| invalid(format!("the output [{m}, {n}] overflows")))?;
    let (mut hx, mut hw) = (Vec::new(), Vec::new());
    let (x, w) = (i8_rows(&a.x, &mut hx), i8_rows(&a.weight, &mut hw));
    if m > PREFILL_ROWS && k > 0 && n > 0 {
        // A prefill runs the f32 GEMM, where the per-pair dots below would read each weight
        // row once per row of x. Per-row scales: on the codes themselves (integers, so every
        // product is exact and so is every sum below 2^24, K <= 1024), the scales applied
        // after as the dots apply them. Block scales: on the operands scaled per block (each
        // product exact in f32 before the sums, which round as any f32 GEMM's do).
        let (xd, wd) = match group {
            None => (scaled(x, &[1.0], m, k, None), scaled(w, &[1.0], n, k, None)),
            Some(_) => (scaled(x, xs, m, k, group), scaled(w, ws, n, k, group)),
        };
        let built = |what: &str, e: layerzero_core::error::Error| KernelError::Failed(format!("{what}: {e}"));
        let xd = HostTensor::from_f32(&[m, k], xd).map_err(|e| built("scaling x", e))?;
        let wd = HostTensor::from_f32(&[n, k], wd).map_err(|e| built("scaling the weight", e))?;
        let b = weight_b("weight", &wd, k)?;
        let mut c = match group {
            None => linear_f32(&Mat::of(&xd), &Weights::Dense(b), None)?,
            Some(_) => linear_f32(&Mat::of(&xd), &Weights::Dense(b), bias.as_deref())?,
        };
        if group.is_none() {
            for (i, row) in c.chunks_exact_mut(n).enumerate() {
                let sx = xs[if xs.len() == 1 { 0 } else { i }];
                for (j, v) in row.iter_mut().enumerate() {
                    let sw = ws[if ws.len() == 1 { 0 } else { j }];
                    *v = (*v * sx) * sw + bias.as_ref().map_or(0.0, |b| b[j]);
                }
            }
        }
        return Ok(Outputs::one("out", to_tensor(dtype, &[m, n], c)?));
    }
    // Block scales: x widened to i16 once, the operand of every weight row's block dots.
    let wide = if group.is_some() { m * k } else { 0 };
    with_scratch::<i16, _>(wide, |x16| {
        simd::widen_i8(x, x16);
        // Per-row scales: the exact integer dot, then its two scales.
        let dot = |i: usize, col: usize| -> f32 {
            let acc = dot_i8(&x[i * k..(i + 1) * k], &w[col * k..(col + 1) * k]);
            let sx = xs[if xs.len() == 1 { 0 } else { i }];
            let sw = ws[if ws.len() == 1 { 0 } else { col }];
            (acc as f32 * sx) * sw + bias.as_ref().map_or(0.0, |b| b[col])
        };
        // Columns n0.. of row i, weight rows back to back: the block dots in one call.
        let block_rows = |i: usize, n0: usize, part: &mut [f32]| match group {
            Some(g) => {
                let (blocks, nb) = (k / g, part.len());
                simd::dot_i8_block_rows(
                    &x16[i * k..(i + 1) * k],
                    &w[n0 * k..(n0 + nb) * k],
                    g,
                    &xs[i * blocks..(i + 1) * blocks],
                    &ws[n0 * blocks..(n0 + nb) * blocks],
                    part,
                );
                if let Some(b) = bias.as_ref() {
                    part.iter_mut().zip(&b[n0..n0 + nb]).for_each(|(o, b)| *o += b);
                }
            }
            None => part.iter_mut().enumerate().for_each(|(j, o)| *o = dot(i, n0 + j)),
        };
        let fill = |c: &mut [f32]| {
            if m == 1 && len > 0 {
                // A decode step: each task writes its columns of the one output row; a weight
                // small enough that a team call would cost more than it saves runs on this
                // thread. The threshold weighs time: a code costs its widening and its block's
                // scaling, about what streaming an f32 weight costs (4 bytes). Counted as one
                // byte, the 125M model's 2304 x 768 qkv stayed on one thread (129 us; split, 64
                // us on the 2-vCPU Xeon).
                let size = if crate::split::worth_teaming(4 * n * k) { chunk_size(n, 16) } else { n };
                crate::team::chunks_mut(c, size, |ci, part| block_rows(0, ci * size, part));
            } else if len > 0 {
                // Weight-row chunks in parallel (each chunk stays in cache across the M rows).
                let parts: Vec<Vec<f32>> = chunks(n, 16)
                    .into_par_iter()
                    .map(|(n0, nb)| {
                        let mut part = vec![0f32; m * nb];
                        for (i, row) in part.chunks_exact_mut(nb).enumerate() {
                            block_rows(i, n0, row);
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
            Ok::<(), KernelError>(())
        };
        by_dtype!(dtype, super::W8A8, T => {
            let mut out = Out::<T>::take(bufs, "out", len);
            T::produce_par(&mut out.v, fill)?;
            Ok(Outputs::one("out", out.finish(&[m, n])?))
        })
    })
}
