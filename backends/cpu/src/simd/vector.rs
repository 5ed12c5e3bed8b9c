//! f32 vector primitives: exponential sums, row maxima, scaling, axpy and dot products.

use super::{Level, level};

/// exp(x) for f32 (Cephes polynomial, about 1 ulp); exactly 0 below -87 (so -inf gives 0).
#[inline(always)]
pub(crate) fn exp_approx(x: f32) -> f32 {
    let xc = x.clamp(-87.5, 88.0);
    let t = xc * std::f32::consts::LOG2_E;
    // Round to nearest with the 1.5 * 2^23 trick (valid for |t| < 2^22): the low mantissa
    // bits of `z` then hold n as an integer, so 2^n is built with integer ops only.
    const MAGIC: f32 = 12_582_912.0;
    let z = t + MAGIC;
    let n = z - MAGIC;
    let r = xc - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    let pow2n = f32::from_bits(z.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(127) << 23);
    if x < -87.0 { 0.0 } else { y * pow2n }
}

#[inline(always)]
fn hsum16(mut acc: [f32; 16]) -> f32 {
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
    }
    acc[0]
}

#[inline(always)]
fn exp_sub_sum_impl(x: &mut [f32], m: f32) -> f32 {
    exp_scale_sub_sum_impl(x, 1.0, m)
}

#[inline(always)]
pub(super) fn exp_scale_sub_sum_impl(x: &mut [f32], c: f32, m: f32) -> f32 {
    let mut acc = [0f32; 16];
    let mut chunks = x.chunks_exact_mut(16);
    for ch in &mut chunks {
        for l in 0..16 {
            let e = exp_approx(ch[l] * c - m);
            ch[l] = e;
            acc[l] += e;
        }
    }
    let mut s = 0f32;
    for v in chunks.into_remainder() {
        let e = exp_approx(*v * c - m);
        *v = e;
        s += e;
    }
    hsum16(acc) + s
}

multiversion! {
    fn exp_sub_sum_generic(x: &mut [f32], m: f32) -> f32 => exp_sub_sum_impl;
}

/// `x[i] = exp(x[i] - m)` (0 for -inf); returns the sum.
pub(crate) fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected on this CPU.
        let r = unsafe { x86::exp_sub_sum_avx512(x, 1.0, m) };
        return r;
    }
    exp_sub_sum_generic(x, m)
}

#[inline(always)]
pub(super) fn row_max_impl(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact(16);
    for ch in &mut chunks {
        for l in 0..16 {
            acc[l] = if ch[l] > acc[l] { ch[l] } else { acc[l] };
        }
    }
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            acc[l] = if acc[l + w] > acc[l] { acc[l + w] } else { acc[l] };
        }
    }
    chunks.remainder().iter().fold(acc[0], |a, &v| if v > a { v } else { a })
}

multiversion! {
    fn row_max_generic(x: &[f32]) -> f32 => row_max_impl;
}

/// The largest element (-inf when empty; NaN elements are skipped).
pub(crate) fn row_max(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected on this CPU.
        let r = unsafe { x86::row_max_avx512(x) };
        return r;
    }
    row_max_generic(x)
}

#[inline(always)]
pub(super) fn scale_impl(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

multiversion! {
    /// `x *= s`.
    fn scale(x: &mut [f32], s: f32) => scale_impl;
}

#[inline(always)]
fn axpy_impl(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

multiversion! {
    /// `y += a * x` (over the shorter length).
    fn axpy(y: &mut [f32], a: f32, x: &[f32]) => axpy_impl;
}

#[inline(always)]
fn dot_impl(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc0 = [0f32; 16];
    let mut acc1 = [0f32; 16];
    let mut ca = a.chunks_exact(32);
    let mut cb = b.chunks_exact(32);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..16 {
            acc0[l] += x[l] * y[l];
            acc1[l] += x[l + 16] * y[l + 16];
        }
    }
    for l in 0..16 {
        acc0[l] += acc1[l];
    }
    let mut s = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s += x * y;
    }
    hsum16(acc0) + s
}

#[inline(always)]
fn dots_impl(q: &[f32], d: usize, k: &[f32], out: &mut [f32]) {
    if d == 0 {
        out.fill(0.0);
        return;
    }
    for (o, row) in out.iter_mut().zip(q.chunks_exact(d)) {
        *o = dot_impl(row, k);
    }
}

multiversion! {
    fn dots_generic(q: &[f32], d: usize, k: &[f32], out: &mut [f32]) => dots_impl;
}

/// `out[r] = q[r*d..(r+1)*d] . k[..d]` for each row of `q` (`out.len()` rows).
pub(crate) fn dots(q: &[f32], d: usize, k: &[f32], out: &mut [f32]) {
    assert!(q.len() >= out.len() * d && k.len() >= d, "dots: operands too short");
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected on this CPU.
        unsafe {
            x86::dots_avx512(q, d, k, out)
        };
        return;
    }
    dots_generic(q, d, k, out);
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    /// `x = exp(x scale - m)` (exactly 0 for -inf, NaN stays NaN), returning the sum.
    /// Cephes range reduction (n = round(x log2 e), r = x - n ln 2 in two parts), a
    /// degree-6 polynomial for e^r, and `vscalefps` for the 2^n (overflow gives inf, deep
    /// underflow 0).
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(in crate::simd) unsafe fn exp_sub_sum_avx512(x: &mut [f32], scale: f32, m: f32) -> f32 {
        let n = x.len();
        let p = x.as_mut_ptr();
        let (vc, vm, log2e, floor) = (
            _mm512_set1_ps(scale),
            _mm512_set1_ps(-m),
            _mm512_set1_ps(std::f32::consts::LOG2_E),
            _mm512_set1_ps(-104.0),
        );
        let (ln2_hi, ln2_lo) = (_mm512_set1_ps(0.693_359_4), _mm512_set1_ps(-2.121_944_4e-4));
        let c = [
            _mm512_set1_ps(1.987_569_1e-4),
            _mm512_set1_ps(1.398_199_9e-3),
            _mm512_set1_ps(8.333_452e-3),
            _mm512_set1_ps(4.166_579_6e-2),
            _mm512_set1_ps(1.666_666_5e-1),
            _mm512_set1_ps(0.5),
        ];
        let one = _mm512_set1_ps(1.0);
        let mut sum = _mm512_setzero_ps();
        let mut i = 0;
        while i < n {
            let len = (n - i).min(16);
            let mask: u16 = if len == 16 { 0xFFFF } else { (1u16 << len) - 1 };
            // SAFETY: lanes i..i+len lie within `x`; masked-off lanes are not accessed.
            let v = unsafe { _mm512_maskz_loadu_ps(mask, p.add(i)) };
            // max(floor, y) returns y when y is NaN, so NaN propagates; -inf becomes -104,
            // whose e^x underflows to 0 below.
            let xc = _mm512_max_ps(floor, _mm512_fmadd_ps(v, vc, vm));
            let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(xc, log2e));
            let r = _mm512_fnmadd_ps(k, ln2_lo, _mm512_fnmadd_ps(k, ln2_hi, xc));
            let mut y = c[0];
            for &ci in &c[1..] {
                y = _mm512_fmadd_ps(y, r, ci);
            }
            let y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), one);
            let e = _mm512_maskz_mov_ps(mask, _mm512_scalef_ps(y, k));
            // SAFETY: as for the load.
            unsafe { _mm512_mask_storeu_ps(p.add(i), mask, e) };
            sum = _mm512_add_ps(sum, e);
            i += len;
        }
        _mm512_reduce_add_ps(sum)
    }

    /// The largest element of `x` (-inf when empty; NaN lanes are skipped).
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(in crate::simd) unsafe fn row_max_avx512(x: &[f32]) -> f32 {
        let (n, p) = (x.len(), x.as_ptr());
        let mut acc = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i < n {
            let len = (n - i).min(16);
            let mask: u16 = if len == 16 { 0xFFFF } else { (1u16 << len) - 1 };
            // SAFETY: lanes i..i+len lie within `x`; masked-off lanes are not accessed.
            let v = unsafe { _mm512_mask_loadu_ps(acc, mask, p.add(i)) };
            // max(v, acc) returns acc where v is NaN.
            acc = _mm512_max_ps(v, acc);
            i += len;
        }
        _mm512_reduce_max_ps(acc)
    }

    /// Dot products of each row of `q` (`d` wide) with `k`, four rows at a time.
    ///
    /// # Safety
    /// The CPU must support AVX-512F (the bounds are asserted here).
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dots_avx512(q: &[f32], d: usize, k: &[f32], out: &mut [f32]) {
        let rows = out.len();
        assert!(q.len() >= rows * d && k.len() >= d);
        let (qp, kp) = (q.as_ptr(), k.as_ptr());
        let mut r = 0;
        while r < rows {
            let nr = (rows - r).min(4);
            let mut acc = [[_mm512_setzero_ps(); 2]; 4];
            let mut i = 0;
            let mut flip = 0;
            while i < d {
                let len = (d - i).min(16);
                let mask: u16 = if len == 16 { 0xFFFF } else { (1u16 << len) - 1 };
                // SAFETY: columns i..i+len < d of k and of rows r..r+nr of q (asserted above);
                // masked-off lanes are not accessed.
                let kv = unsafe { _mm512_maskz_loadu_ps(mask, kp.add(i)) };
                for (x, a) in acc.iter_mut().enumerate().take(nr) {
                    // SAFETY: as above.
                    let qv = unsafe { _mm512_maskz_loadu_ps(mask, qp.add((r + x) * d + i)) };
                    a[flip] = _mm512_fmadd_ps(qv, kv, a[flip]);
                }
                flip ^= 1;
                i += len;
            }
            for (x, a) in acc.iter().enumerate().take(nr) {
                out[r + x] = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
            }
            r += nr;
        }
    }
}
