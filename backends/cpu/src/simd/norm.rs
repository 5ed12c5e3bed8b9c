//! Norm rows: one reading pass for the statistics, one pass that reads the row again (from
//! L1/L2) and writes the output; bf16 rows are read as bf16 both times (no f32 copy).

use super::avx512_bf16;
use super::convert::{bf16_bits, bf16_bits_finite, bf16_f32};

/// `(Σ (x - k), Σ (x - k)²)` accumulated in f64 (32 lanes each), so that the one-pass
/// variance `q/n - (s/n)²` keeps f32 precision whatever the mean (the shift `k`, a value
/// of the row, keeps the sums small as well).
#[inline(always)]
fn shifted_sums<S: Copy>(x: &[S], k: f32, load: impl Fn(S) -> f32) -> (f64, f64) {
    const L: usize = 32;
    let k = f64::from(k);
    let (mut s, mut q) = ([0f64; L], [0f64; L]);
    let mut ch = x.chunks_exact(L);
    for c in &mut ch {
        for l in 0..L {
            let d = f64::from(load(c[l])) - k;
            s[l] += d;
            q[l] += d * d;
        }
    }
    let (mut ts, mut tq) = (0f64, 0f64);
    for &v in ch.remainder() {
        let d = f64::from(load(v)) - k;
        ts += d;
        tq += d * d;
    }
    (s.iter().sum::<f64>() + ts, q.iter().sum::<f64>() + tq)
}

#[inline(always)]
fn shifted_sums_f32_impl(x: &[f32], k: f32) -> (f64, f64) {
    shifted_sums(x, k, |v| v)
}

#[inline(always)]
fn shifted_sums_bf16_impl(x: &[half::bf16], k: f32) -> (f64, f64) {
    shifted_sums(x, k, bf16_f32)
}

multiversion! {
    /// `(Σ (x - k), Σ (x - k)²)` in f64.
    fn shifted_sums_f32(x: &[f32], k: f32) -> (f64, f64) => shifted_sums_f32_impl;
}

multiversion! {
    /// `(Σ (x - k), Σ (x - k)²)` in f64 over a bf16 row.
    fn shifted_sums_bf16(x: &[half::bf16], k: f32) -> (f64, f64) => shifted_sums_bf16_impl;
}

/// `(Σ x, Σ x²)` of a bf16 row from exact bf16 products (AVX512_BF16 `vdpbf16ps`, which
/// sums pairs in f32), in f32 within blocks of 512 elements and f64 across them: about
/// 16 f32 roundings per lane and block, a relative error near 1e-6 of Σ x². `None` where
/// the instruction is missing or a block's sums are not finite (values past 1e19, or
/// infinities and NaN: the caller's f64 form handles those rows).
pub(crate) fn sums_bf16_dp(x: &[half::bf16]) -> Option<(f64, f64)> {
    #[cfg(target_arch = "x86_64")]
    if avx512_bf16() {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F/BW and AVX512_BF16 were detected; the kernel reads `x` only.
        let (s, q) = unsafe { x86::sums_bf16_dp(x) };
        return (s.is_finite() && q.is_finite()).then_some((s, q));
    }
    let _ = x;
    None
}

/// `out[i] = round(((x[i] - hi) - lo) * inv * w[i] (+ b[i]))`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn affine<S: Copy, D>(
    x: &[S],
    (hi, lo, inv): (f32, f32, f32),
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [D],
    load: impl Fn(S) -> f32,
    round: impl Fn(f32) -> D,
) {
    let n = out.len();
    let (x, w) = (&x[..n], &w[..n]);
    match b {
        Some(b) => {
            let b = &b[..n];
            for i in 0..n {
                out[i] = round(((load(x[i]) - hi) - lo) * inv * w[i] + b[i]);
            }
        }
        None => {
            for i in 0..n {
                out[i] = round(((load(x[i]) - hi) - lo) * inv * w[i]);
            }
        }
    }
}

/// The affine step of a norm: mean split in two f32 parts, and the inverse deviation.
pub(crate) type Norm = (f32, f32, f32);

#[inline(always)]
fn affine_f32_f32_impl(x: &[f32], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [f32]) {
    affine(x, n, w, b, out, |v| v, |v| v);
}

#[inline(always)]
fn affine_bf16_f32_impl(x: &[half::bf16], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [f32]) {
    affine(x, n, w, b, out, bf16_f32, |v| v);
}

#[inline(always)]
fn affine_f32_bf16_impl(x: &[f32], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [half::bf16], finite: bool) {
    // Without NaN inputs a NaN can only be the default quiet NaN, which the plain rounding
    // keeps NaN: no NaN select.
    if finite {
        affine(x, n, w, b, out, |v| v, |v| half::bf16::from_bits(bf16_bits_finite(v)));
    } else {
        affine(x, n, w, b, out, |v| v, |v| half::bf16::from_bits(bf16_bits(v)));
    }
}

#[inline(always)]
fn affine_bf16_bf16_impl(
    x: &[half::bf16],
    n: Norm,
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [half::bf16],
    finite: bool,
) {
    if finite {
        affine(x, n, w, b, out, bf16_f32, |v| half::bf16::from_bits(bf16_bits_finite(v)));
    } else {
        affine(x, n, w, b, out, bf16_f32, |v| half::bf16::from_bits(bf16_bits(v)));
    }
}

multiversion! {
    /// `out[i] = ((x[i] - hi) - lo) * inv * w[i] (+ b[i])` with `(hi, lo, inv) = n`.
    fn affine_f32_f32(x: &[f32], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [f32]) => affine_f32_f32_impl;
}

multiversion! {
    /// `affine_f32_f32` from a bf16 row.
    fn affine_bf16_f32(x: &[half::bf16], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [f32]) => affine_bf16_f32_impl;
}

multiversion! {
    /// `affine_f32_f32` rounded to bf16 (`finite`: no input is NaN).
    fn affine_f32_bf16(x: &[f32], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [half::bf16], finite: bool)
        => affine_f32_bf16_impl;
}

multiversion! {
    /// `affine_f32_f32` from a bf16 row rounded to bf16 (`finite`: no input is NaN).
    fn affine_bf16_bf16(x: &[half::bf16], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [half::bf16], finite: bool)
        => affine_bf16_bf16_impl;
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::sums_bf16_dp`] on this CPU.
    ///
    /// # Safety
    /// The CPU must support AVX-512F/BW and AVX512_BF16.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn sums_bf16_dp(x: &[half::bf16]) -> (f64, f64) {
        const BLOCK: usize = 512;
        let bits: &[u16] = half::slice::HalfFloatSliceExt::reinterpret_cast(x);
        // SAFETY: `__m512i` and `__m512bh` are both 512-bit vectors of plain bits.
        let bh = |v: __m512i| -> __m512bh { unsafe { std::mem::transmute(v) } };
        // bf16 1.0 in every element: x . 1 sums the pairs.
        let ones = bh(_mm512_set1_epi16(0x3f80));
        // f64 sums of the blocks, 8 lanes each (reduced once at the end).
        let (mut s, mut q) = (_mm512_setzero_pd(), _mm512_setzero_pd());
        let widen = |acc: __m512d, v: __m512| {
            let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
            let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))));
            _mm512_add_pd(acc, _mm512_add_pd(lo, hi))
        };
        for blk in bits.chunks(BLOCK) {
            let (mut s0, mut q0, mut s1, mut q1) =
                (_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps());
            let (pairs, tail) = blk.as_chunks::<64>();
            for p in pairs {
                // SAFETY: `p` is 64 elements (128 bytes): two unaligned 64-byte loads.
                let (a, b) =
                    unsafe { (_mm512_loadu_si512(p.as_ptr().cast()), _mm512_loadu_si512(p.as_ptr().add(32).cast())) };
                let (a, b) = (bh(a), bh(b));
                s0 = _mm512_dpbf16_ps(s0, a, ones);
                q0 = _mm512_dpbf16_ps(q0, a, a);
                s1 = _mm512_dpbf16_ps(s1, b, ones);
                q1 = _mm512_dpbf16_ps(q1, b, b);
            }
            for piece in tail.chunks(32) {
                // Masked: elements past the row read as zero.
                let mask: u32 = if piece.len() == 32 { u32::MAX } else { (1u32 << piece.len()) - 1 };
                // SAFETY: the mask keeps the load inside `piece`.
                let a = unsafe { _mm512_maskz_loadu_epi16(mask, piece.as_ptr().cast()) };
                let a = bh(a);
                s0 = _mm512_dpbf16_ps(s0, a, ones);
                q0 = _mm512_dpbf16_ps(q0, a, a);
            }
            s = widen(s, _mm512_add_ps(s0, s1));
            q = widen(q, _mm512_add_ps(q0, q1));
        }
        (_mm512_reduce_add_pd(s), _mm512_reduce_add_pd(q))
    }
}
