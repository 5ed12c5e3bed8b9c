//! Dot products of bf16 rows on `vdpbf16ps` (AVX512_BF16): 32 products of bf16 pairs per
//! instruction, each product exact in f32, summed in f32 (round to nearest even, subnormal
//! inputs and results flushed to zero, as the instruction defines). For the decode GEMV of
//! a bf16 model, whose activations are bf16 already: the weight streams in as it is stored,
//! with no widening, a quarter of the instructions of the widen-and-FMA loop per byte.

use super::avx512_bf16;

/// Rows of a [`gemm_tile_bf16_pairs`] tile (the broadcast operand).
pub(crate) const PAIR_MR: usize = 12;
/// Columns of a [`gemm_tile_bf16_pairs`] tile (two 16-lane vectors).
pub(crate) const PAIR_NR: usize = 32;

/// `C = A . B` for one tile of up to `PAIR_MR` x `PAIR_NR` on bf16 pairs: `a` is a packed A
/// panel (`k2` steps of `PAIR_MR` pairs, `a[p * PAIR_MR + i]` = A[i][2p] | A[i][2p+1] << 16),
/// `b` a packed B panel (`k2` steps of `PAIR_NR` pairs, `b[p * PAIR_NR + j]` = B[2p][j] |
/// B[2p+1][j] << 16); `c` holds the tile's rows (at most `PAIR_MR`), written at columns
/// `j0..j0 + nr`. Pad pairs past K with zeros. The caller checks [`super::avx512_bf16`].
pub(crate) fn gemm_tile_bf16_pairs(k2: usize, a: &[u32], b: &[u32], c: &mut [&mut [f32]], j0: usize, nr: usize) {
    assert!(a.len() >= k2 * PAIR_MR && b.len() >= k2 * PAIR_NR, "gemm_tile_bf16_pairs: panels too short");
    assert!(c.len() <= PAIR_MR && nr <= PAIR_NR, "gemm_tile_bf16_pairs: tile too large");
    assert!(c.iter().all(|r| r.len() >= j0 + nr), "gemm_tile_bf16_pairs: C rows too short");
    if nr == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if avx512_bf16() {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F/BW/VL and AVX512_BF16 were detected; the asserts above are the
        // kernel's bounds.
        unsafe {
            x86::tile_pairs_avx512(k2, a, b, c, j0, nr)
        };
        return;
    }
    let half = |v: u32, hi: bool| f32::from_bits(if hi { v & 0xFFFF_0000 } else { v << 16 });
    let dot = |x: u32, w: u32| half(x, false) * half(w, false) + half(x, true) * half(w, true);
    for (i, row) in c.iter_mut().enumerate() {
        for (j, out) in row[j0..j0 + nr].iter_mut().enumerate() {
            let mut s = 0f32;
            for p in 0..k2 {
                let w = b[p * PAIR_NR + j];
                s += dot(a[p * PAIR_MR + i], w);
            }
            *out = s;
        }
    }
}

/// `[x . w[0], .., x . w[R-1]]` over the first `x.len()` elements of each row (every row
/// at least that long), as bf16 bits; with `lo`, x is `x + lo` (an f32 row split into its
/// bf16 rounding and the bf16 rounding of the rest, about 16 significant bits: each weight
/// load feeds two products). On a CPU without AVX512_BF16 the rows are widened and summed
/// in f32 (exact products, a different summation order).
pub(crate) fn dots_bf16<const R: usize>(x: &[u16], lo: Option<&[u16]>, w: [&[u16]; R]) -> [f32; R] {
    let k = x.len();
    assert!(w.iter().all(|r| r.len() >= k), "dots_bf16: a weight row is shorter than x");
    assert!(lo.is_none_or(|l| l.len() >= k), "dots_bf16: the low part is shorter than x");
    #[cfg(target_arch = "x86_64")]
    if avx512_bf16() {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F/BW/VL and AVX512_BF16 were detected; every row holds k elements.
        return unsafe {
            match lo {
                None => x86::dots_bf16_avx512::<R, false>(x, x, w),
                Some(lo) => x86::dots_bf16_avx512::<R, true>(x, lo, w),
            }
        };
    }
    let widen = |b: u16| f32::from_bits(u32::from(b) << 16);
    let xv = |i: usize| widen(x[i]) + lo.map_or(0.0, |l| widen(l[i]));
    w.map(|row| row[..k].iter().enumerate().map(|(i, &b)| xv(i) * widen(b)).sum())
}

/// An f32 row split for [`dots_bf16`]: `hi` its bf16 rounding, `lo` the bf16 rounding of
/// what remains.
pub(crate) fn split_bf16(x: &[f32], hi: &mut [u16], lo: &mut [u16]) {
    for ((&v, h), l) in x.iter().zip(hi.iter_mut()).zip(lo.iter_mut()) {
        let hv = half::bf16::from_f32(v);
        *h = hv.to_bits();
        *l = half::bf16::from_f32(v - hv.to_f32()).to_bits();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// 32 bf16 at `p` (`n` < 32 of them: the rest read as zeros, never touched).
    ///
    /// # Safety
    /// `p..p + n.min(32)` must be readable; AVX-512BW.
    #[allow(unsafe_code)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn load(p: *const u16, n: usize) -> __m512bh {
        let v = if n >= 32 {
            // SAFETY: 32 elements are readable (caller).
            unsafe { _mm512_loadu_si512(p.cast()) }
        } else {
            let mask: u32 = (1u32 << n) - 1;
            // SAFETY: the lanes the mask keeps are readable (caller); the others are not read.
            unsafe { _mm512_maskz_loadu_epi16(mask, p.cast()) }
        };
        // SAFETY: both are 512-bit vectors of plain bits.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// [`super::gemm_tile_bf16_pairs`] after its checks.
    ///
    /// # Safety
    /// The CPU must support AVX-512F/BW/VL and AVX512_BF16 (the bounds are asserted here).
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
    pub(super) unsafe fn tile_pairs_avx512(
        k2: usize,
        a: &[u32],
        b: &[u32],
        c: &mut [&mut [f32]],
        j0: usize,
        nr: usize,
    ) {
        const R: usize = super::PAIR_MR;
        const NV: usize = super::PAIR_NR / 16;
        assert!(a.len() >= k2 * R && b.len() >= k2 * NV * 16 && c.len() <= R && nr <= NV * 16);
        assert!(c.iter().all(|r| r.len() >= j0 + nr));
        let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        for _ in 0..k2 {
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(16 * NV * 8).cast());
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(16 * NV * 8 + 16).cast());
            // SAFETY: step p (0..k2) reads a[p R..p R + R] and b[p 16 NV..(p + 1) 16 NV],
            // inside the panels (asserted); the pointers advance by one step each pass.
            unsafe {
                let bv: [__m512bh; NV] = std::array::from_fn(|v| {
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(bp.add(16 * v).cast()))
                });
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*ap.add(i) as i32));
                    for (x, &bvv) in row.iter_mut().zip(&bv) {
                        *x = _mm512_dpbf16_ps(*x, av, bvv);
                    }
                }
                ap = ap.add(R);
                bp = bp.add(16 * NV);
            }
        }
        // SAFETY: AVX-512F (this function's contract); the row bounds were asserted above.
        unsafe { super::super::tile::x86::store_tile(&acc, c, j0, nr, true) };
    }

    /// [`super::dots_bf16`] on AVX512_BF16: two accumulators per row (the instruction's
    /// latency is longer than its issue interval), the tail by masked loads; with `SPLIT`,
    /// `lo` is x's low part, multiplied by the same weight registers.
    ///
    /// # Safety
    /// The CPU must support AVX-512F/BW/VL and AVX512_BF16; `lo` and every row of `w` must
    /// hold at least `x.len()` elements.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
    pub(super) unsafe fn dots_bf16_avx512<const R: usize, const SPLIT: bool>(
        x: &[u16],
        lo: &[u16],
        w: [&[u16]; R],
    ) -> [f32; R] {
        let k = x.len();
        let mut a = [_mm512_setzero_ps(); R];
        let mut b = [_mm512_setzero_ps(); R];
        let mut i = 0;
        while i + 64 <= k {
            // SAFETY: elements i..i + 64 lie within x, lo and every row (caller).
            unsafe {
                let (x0, x1) = (load(x.as_ptr().add(i), 32), load(x.as_ptr().add(i + 32), 32));
                let (l0, l1) =
                    if SPLIT { (load(lo.as_ptr().add(i), 32), load(lo.as_ptr().add(i + 32), 32)) } else { (x0, x1) };
                for r in 0..R {
                    let (w0, w1) = (load(w[r].as_ptr().add(i), 32), load(w[r].as_ptr().add(i + 32), 32));
                    a[r] = _mm512_dpbf16_ps(a[r], x0, w0);
                    b[r] = _mm512_dpbf16_ps(b[r], x1, w1);
                    if SPLIT {
                        a[r] = _mm512_dpbf16_ps(a[r], l0, w0);
                        b[r] = _mm512_dpbf16_ps(b[r], l1, w1);
                    }
                }
            }
            i += 64;
        }
        while i < k {
            let n = (k - i).min(32);
            // SAFETY: elements i..i + n lie within x, lo and every row (caller).
            unsafe {
                let x0 = load(x.as_ptr().add(i), n);
                for r in 0..R {
                    let w0 = load(w[r].as_ptr().add(i), n);
                    a[r] = _mm512_dpbf16_ps(a[r], x0, w0);
                    if SPLIT {
                        b[r] = _mm512_dpbf16_ps(b[r], load(lo.as_ptr().add(i), n), w0);
                    }
                }
            }
            i += n;
        }
        std::array::from_fn(|r| _mm512_reduce_add_ps(_mm512_add_ps(a[r], b[r])))
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;

    fn bits(v: &[f32]) -> Vec<u16> {
        v.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()
    }

    #[test]
    fn bf16_dots_match_a_float64_sum_for_every_length_around_the_vector_width() {
        for k in [0, 1, 31, 32, 33, 63, 64, 65, 100, 768] {
            let xs: Vec<f32> = (0..k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.25).collect();
            let rows: Vec<Vec<f32>> =
                (0..4).map(|r| (0..k).map(|i| ((i * 5 + r * 3) % 11) as f32 * 0.125 - 0.5).collect()).collect();
            let (xb, wb): (Vec<u16>, Vec<Vec<u16>>) = (bits(&xs), rows.iter().map(|r| bits(r)).collect());
            let got = dots_bf16(&xb, None, [&wb[0], &wb[1], &wb[2], &wb[3]]);
            for (r, row) in rows.iter().enumerate() {
                // Every value is exact in bf16 and every partial sum exact in f32.
                let want: f64 = xs.iter().zip(row).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                assert_eq!(f64::from(got[r]), want, "k {k} row {r}");
            }
        }
    }

    #[test]
    fn an_f32_row_split_into_two_bf16_parts_dots_to_within_f32_rounding() {
        for k in [1, 33, 100, 768] {
            let xs: Vec<f32> = (0..k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let row: Vec<f32> = (0..k).map(|i| ((i * 5) % 11) as f32 * 0.125 - 0.5).collect();
            let (mut hi, mut lo) = (vec![0u16; k], vec![0u16; k]);
            split_bf16(&xs, &mut hi, &mut lo);
            let wb = bits(&row);
            let [got] = dots_bf16(&hi, Some(&lo), [&wb]);
            let [rounded] = dots_bf16(&hi, None, [&wb]);
            let want: f64 = xs.iter().zip(&row).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
            let scale: f64 = xs.iter().zip(&row).map(|(&a, &b)| f64::from(a * b).abs()).sum();
            assert!((f64::from(got) - want).abs() <= 1e-5 * scale, "k {k}: {got} vs {want}");
            // The bf16 rounding of x alone is far coarser: the split is what keeps f32 precision.
            assert!((f64::from(got) - want).abs() <= (f64::from(rounded) - want).abs(), "k {k}");
        }
    }
}
