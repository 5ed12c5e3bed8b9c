//! Dot products of quantized rows, for the decode GEMVs of quantized weights:
//!
//! - [`dot_int4`]: a row of `int4` codes (two per byte, the even element in the low nibble)
//!   against x given as its even and odd elements: per block, `scale * sum((q - zero) * x)`,
//!   the codes widened to f32 in registers (sixteen low nibbles against sixteen even
//!   elements, sixteen high ones against the odd), scaled once per block.
//! - [`dot_i8_block_rows`]: i8 weight rows against an i8 row of x (widened to i16 once per
//!   call by the caller) in blocks, each block's exact integer dot (`vpmaddwd` pairs summed
//!   in i32 lanes) converted to f32 in its lanes and scaled by its pair of scales with one
//!   FMA: no horizontal sum per block (llama.cpp's Q8_0 x Q8_0 shape), one at the end.
//!
//! Both keep four vector accumulators across blocks (a block's scaled sum is one FMA into
//! one of them, so that chain of FMAs does not bound the loop) and sum them once at the
//! end. The portable
//! versions compute the same sums in the same blocks (lanes summed in another order).

use super::{Level, level};

/// `sum over blocks b of scales[b] * sum_j (q_j - zeros[b]) * x_j` for one int4 row:
/// `bytes` holds `k / 2` bytes, `even` and `odd` x's `k / 2` even and odd elements, `xsum`
/// x's sum over each block, `g` (a multiple of 32) the block size, `scales` and `zeros`
/// `k / g` values each. Taken as `sum_b scales[b] * (sum_j q_j x_j - zeros[b] * xsum[b])`:
/// the codes go to f32 as they are (0..15), no subtraction per element.
pub(crate) fn dot_int4(
    bytes: &[u8],
    scales: &[f32],
    zeros: &[f32],
    g: usize,
    even: &[f32],
    odd: &[f32],
    xsum: &[f32],
) -> f32 {
    let half = bytes.len();
    assert!(
        g.is_multiple_of(32) && half * 2 == scales.len() * g && zeros.len() == scales.len(),
        "dot_int4: blocks of {g} do not tile {half} bytes with {} scales",
        scales.len()
    );
    assert!(even.len() >= half && odd.len() >= half, "dot_int4: x is shorter than the row");
    assert!(xsum.len() >= scales.len(), "dot_int4: fewer block sums of x than blocks");
    // The zero points' share, eight blocks per step in independent lanes (a row has a few
    // dozen blocks: one chain of adds would cost as much as the row's dot).
    let nb = scales.len();
    let whole = nb / 8 * 8;
    let mut lanes = [0f32; 8];
    for ((s, z), x) in
        scales[..whole].chunks_exact(8).zip(zeros[..whole].chunks_exact(8)).zip(xsum[..whole].chunks_exact(8))
    {
        for l in 0..8 {
            lanes[l] += s[l] * z[l] * x[l];
        }
    }
    let tail: f32 = (whole..nb).map(|b| scales[b] * zeros[b] * xsum[b]).sum();
    let corr = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])) + tail;
    #[cfg(target_arch = "x86_64")]
    match level() {
        #[allow(unsafe_code)]
        // SAFETY: Avx512 means AVX-512F (and AVX2, FMA) were detected; the asserts above are
        // the bounds the kernel reads within.
        Level::Avx512 => return unsafe { x86::int4_avx512(bytes, scales, g, even, odd) } - corr,
        #[allow(unsafe_code)]
        // SAFETY: Avx2 means AVX2 and FMA were detected; bounds as above.
        Level::Avx2 => return unsafe { x86::int4_avx2(bytes, scales, g, even, odd) } - corr,
        Level::Portable => {}
    }
    let per = g / 2;
    let mut total = 0f32;
    for (b, ((gb, ge), go)) in
        bytes.chunks_exact(per).zip(even.chunks_exact(per)).zip(odd.chunks_exact(per)).enumerate()
    {
        let mut t = 0f32;
        for ((&byte, &e), &o) in gb.iter().zip(ge).zip(go) {
            t += f32::from(byte & 0x0F) * e + f32::from(byte >> 4) * o;
        }
        total += scales[b] * t;
    }
    total - corr
}

/// One row of [`dot_i8_block_rows`] in scalar code: each block's exact sum, scaled and
/// summed in f64.
fn blocks_portable(x: &[i16], w: &[i8], g: usize, sx: &[f32], sw: &[f32]) -> f32 {
    let mut total = 0f64;
    for ((cx, cw), (a, b)) in x.chunks_exact(g).zip(w.chunks_exact(g)).zip(sx.iter().zip(sw)) {
        let s: i32 = cx.iter().zip(cw).map(|(&p, &q)| i32::from(p) * i32::from(q)).sum();
        total += f64::from(s) * (f64::from(*a) * f64::from(*b));
    }
    total as f32
}

/// `out[r] = sum over blocks b of (exact sum_j x_j * w_rj over block b) * sx[b] * sw_r[b]`
/// for each of `out.len()` weight rows lying back to back in `w` (their scales back to back
/// in `sw`), blocks of `g` (at most 65536, so a block's i32 lanes cannot overflow), `x` an
/// i8 row widened to i16 ([`widen_i8`]). The vector paths sum the scaled blocks in f32
/// lanes (each block's integer sum is exact; at most one rounding per block and lane), the
/// portable one in f64. The level is decided and the bounds checked once for the rows, not
/// per row (a Q8_0 row of a small model is a few hundred bytes).
pub(crate) fn dot_i8_block_rows(x: &[i16], w: &[i8], g: usize, sx: &[f32], sw: &[f32], out: &mut [f32]) {
    let (k, nb, rows) = (x.len(), sx.len(), out.len());
    assert!(
        g > 0 && g <= 1 << 16 && k == nb * g && w.len() == rows * k && sw.len() == rows * nb,
        "dot_i8_block_rows: {rows} rows of {k} in blocks of {g} do not match {} codes and {} scales",
        w.len(),
        sw.len()
    );
    #[cfg(target_arch = "x86_64")]
    if g.is_multiple_of(32) {
        match level() {
            #[allow(unsafe_code)]
            // SAFETY: AVX-512BW was detected (and AVX-512F with it); bounds asserted above.
            Level::Avx512 if x86::has_avx512bw() => return unsafe { x86::rows_avx512bw(x, w, g, sx, sw, out) },
            #[allow(unsafe_code)]
            // SAFETY: Avx2 or better means AVX2 and FMA were detected; bounds asserted above.
            Level::Avx512 | Level::Avx2 => return unsafe { x86::rows_avx2(x, w, g, sx, sw, out) },
            Level::Portable => {}
        }
    }
    for (r, o) in out.iter_mut().enumerate() {
        *o = blocks_portable(x, &w[r * k..(r + 1) * k], g, sx, &sw[r * nb..(r + 1) * nb]);
    }
}

/// `x` widened to i16 into `out` (as long), the operand [`dot_i8_block_rows`] reads: widened
/// once per row of x rather than once per weight row it meets.
pub(crate) fn widen_i8(x: &[i8], out: &mut [i16]) {
    out.iter_mut().zip(x).for_each(|(o, &v)| *o = i16::from(v));
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    use crate::simd::prefetch_ahead;

    pub(super) fn has_avx512bw() -> bool {
        static BW: OnceLock<bool> = OnceLock::new();
        *BW.get_or_init(|| is_x86_feature_detected!("avx512bw"))
    }

    /// `sum_j q_j x_j` over the 16 bytes at `j` (32 codes) into two accumulators.
    macro_rules! int4_step_512 {
        ($bytes:expr, $even:expr, $odd:expr, $j:expr, $nib:expr, $tl:ident, $th:ident) => {{
            // SAFETY: $j + 16 <= bytes.len() <= even.len(), odd.len() (the caller's bounds).
            let (v, e, o) = unsafe {
                (
                    _mm_loadu_si128($bytes.as_ptr().add($j).cast()),
                    _mm512_loadu_ps($even.as_ptr().add($j)),
                    _mm512_loadu_ps($odd.as_ptr().add($j)),
                )
            };
            let lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, $nib)));
            let hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), $nib)));
            $tl = _mm512_fmadd_ps(lo, e, $tl);
            $th = _mm512_fmadd_ps(hi, o, $th);
        }};
    }

    /// # Safety
    /// AVX-512F must be available; `bytes.len() * 2 == scales.len() * g`, `g % 32 == 0`,
    /// `even` and `odd` at least `bytes.len()` long.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn int4_avx512(bytes: &[u8], scales: &[f32], g: usize, even: &[f32], odd: &[f32]) -> f32 {
        let nib = _mm_set1_epi8(0x0F);
        let per = g / 2;
        // Blocks two at a time into two accumulators held in registers, each block's low-
        // and high-nibble sums apart: no chain of FMAs bounds the loop.
        let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut blk = 0;
        while blk < scales.len() {
            let (mut a, mut b) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let mut j = blk * per;
            while j < (blk + 1) * per {
                int4_step_512!(bytes, even, odd, j, nib, a, b);
                j += 16;
            }
            acc0 = _mm512_fmadd_ps(_mm512_set1_ps(scales[blk]), _mm512_add_ps(a, b), acc0);
            if blk + 1 < scales.len() {
                let (mut c, mut d) = (_mm512_setzero_ps(), _mm512_setzero_ps());
                while j < (blk + 2) * per {
                    int4_step_512!(bytes, even, odd, j, nib, c, d);
                    j += 16;
                }
                acc1 = _mm512_fmadd_ps(_mm512_set1_ps(scales[blk + 1]), _mm512_add_ps(c, d), acc1);
            }
            blk += 2;
        }
        _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
    }

    /// # Safety
    /// AVX2 and FMA must be available; bounds as [`int4_avx512`]'s.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn int4_avx2(bytes: &[u8], scales: &[f32], g: usize, even: &[f32], odd: &[f32]) -> f32 {
        let nib = _mm_set1_epi8(0x0F);
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let per = g / 2;
        for (blk, &s) in scales.iter().enumerate() {
            let mut t = [_mm256_setzero_ps(); 4];
            let mut j = blk * per;
            while j < (blk + 1) * per {
                // SAFETY: j + 16 <= bytes.len() <= even.len(), odd.len() (the caller's bounds).
                let (v, e0, e1, o0, o1) = unsafe {
                    (
                        _mm_loadu_si128(bytes.as_ptr().add(j).cast()),
                        _mm256_loadu_ps(even.as_ptr().add(j)),
                        _mm256_loadu_ps(even.as_ptr().add(j + 8)),
                        _mm256_loadu_ps(odd.as_ptr().add(j)),
                        _mm256_loadu_ps(odd.as_ptr().add(j + 8)),
                    )
                };
                let lo = _mm_and_si128(v, nib);
                let hi = _mm_and_si128(_mm_srli_epi16(v, 4), nib);
                let f = |q: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
                t[0] = _mm256_fmadd_ps(f(lo), e0, t[0]);
                t[1] = _mm256_fmadd_ps(f(_mm_srli_si128(lo, 8)), e1, t[1]);
                t[2] = _mm256_fmadd_ps(f(hi), o0, t[2]);
                t[3] = _mm256_fmadd_ps(f(_mm_srli_si128(hi, 8)), o1, t[3]);
                j += 16;
            }
            let sum = _mm256_add_ps(_mm256_add_ps(t[0], t[1]), _mm256_add_ps(t[2], t[3]));
            if blk % 2 == 0 {
                acc0 = _mm256_fmadd_ps(_mm256_set1_ps(s), sum, acc0);
            } else {
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(s), sum, acc1);
            }
        }
        hsum256(_mm256_add_ps(acc0, acc1))
    }

    /// One block's exact integer dot in sixteen i32 lanes.
    ///
    /// # Safety
    /// AVX-512F and BW must be available; `(b + 1) * g <= x.len(), w.len()`, `g % 32 == 0`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    unsafe fn block_512(x: &[i16], w: &[i8], g: usize, b: usize) -> __m512i {
        let mut lanes = _mm512_setzero_si512();
        let mut j = b * g;
        while j < (b + 1) * g {
            if j.is_multiple_of(64) {
                prefetch_ahead(w, j);
            }
            // SAFETY: j + 32 <= (b + 1) * g <= x.len(), w.len() (the caller's bounds).
            let (wv, xv) =
                unsafe { (_mm256_loadu_si256(w.as_ptr().add(j).cast()), _mm512_loadu_si512(x.as_ptr().add(j).cast())) };
            lanes = _mm512_add_epi32(lanes, _mm512_madd_epi16(_mm512_cvtepi8_epi16(wv), xv));
            j += 32;
        }
        lanes
    }

    /// # Safety
    /// AVX-512F and AVX-512BW must be available; `x.len() == w.len() == sx.len() * g`,
    /// `sw.len() == sx.len()`, `g % 32 == 0`, `g <= 65536`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    unsafe fn i8_avx512bw(x: &[i16], w: &[i8], g: usize, sx: &[f32], sw: &[f32]) -> f32 {
        // Four blocks per step into four accumulators: no chain of FMAs bounds the loop.
        let mut acc = [_mm512_setzero_ps(); 4];
        let nb = sx.len();
        let mut b = 0;
        while b < nb {
            for (u, a) in acc.iter_mut().enumerate().take(nb - b) {
                // SAFETY: block b + u < nb lies within the rows (the caller's bounds).
                let lanes = unsafe { block_512(x, w, g, b + u) };
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes), _mm512_set1_ps(sx[b + u] * sw[b + u]), *a);
            }
            b += 4;
        }
        _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])))
    }

    /// # Safety
    /// AVX-512F and AVX-512BW must be available; bounds as [`super::dot_i8_block_rows`]
    /// asserts them.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    pub(super) unsafe fn rows_avx512bw(x: &[i16], w: &[i8], g: usize, sx: &[f32], sw: &[f32], out: &mut [f32]) {
        let (k, nb) = (x.len(), sx.len());
        for (r, o) in out.iter_mut().enumerate() {
            // SAFETY: row r's codes and scales lie within `w` and `sw` (the caller's bounds).
            *o = unsafe { i8_avx512bw(x, &w[r * k..(r + 1) * k], g, sx, &sw[r * nb..(r + 1) * nb]) };
        }
    }

    /// # Safety
    /// AVX2 and FMA must be available; bounds as [`super::dot_i8_block_rows`] asserts them.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn rows_avx2(x: &[i16], w: &[i8], g: usize, sx: &[f32], sw: &[f32], out: &mut [f32]) {
        let (k, nb) = (x.len(), sx.len());
        for (r, o) in out.iter_mut().enumerate() {
            // SAFETY: row r's codes and scales lie within `w` and `sw` (the caller's bounds).
            *o = unsafe { i8_avx2(x, &w[r * k..(r + 1) * k], g, sx, &sw[r * nb..(r + 1) * nb]) };
        }
    }

    /// One block's exact integer dot in eight i32 lanes.
    ///
    /// # Safety
    /// AVX2 must be available; bounds as [`block_512`]'s.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn block_256(x: &[i16], w: &[i8], g: usize, b: usize) -> __m256i {
        let mut lanes = _mm256_setzero_si256();
        let mut j = b * g;
        while j < (b + 1) * g {
            if j.is_multiple_of(64) {
                prefetch_ahead(w, j);
            }
            // SAFETY: j + 32 <= (b + 1) * g <= x.len(), w.len() (the caller's bounds).
            let (w0, w1, x0, x1) = unsafe {
                (
                    _mm_loadu_si128(w.as_ptr().add(j).cast()),
                    _mm_loadu_si128(w.as_ptr().add(j + 16).cast()),
                    _mm256_loadu_si256(x.as_ptr().add(j).cast()),
                    _mm256_loadu_si256(x.as_ptr().add(j + 16).cast()),
                )
            };
            let p0 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(w0), x0);
            let p1 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(w1), x1);
            lanes = _mm256_add_epi32(lanes, _mm256_add_epi32(p0, p1));
            j += 32;
        }
        lanes
    }

    /// # Safety
    /// AVX2 and FMA must be available; bounds as [`i8_avx512bw`]'s.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn i8_avx2(x: &[i16], w: &[i8], g: usize, sx: &[f32], sw: &[f32]) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 4];
        let nb = sx.len();
        let mut b = 0;
        while b < nb {
            for (u, a) in acc.iter_mut().enumerate().take(nb - b) {
                // SAFETY: block b + u < nb lies within the rows (the caller's bounds).
                let lanes = unsafe { block_256(x, w, g, b + u) };
                *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(sx[b + u] * sw[b + u]), *a);
            }
            b += 4;
        }
        hsum256(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])))
    }

    #[target_feature(enable = "avx2")]
    fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each block's products summed exactly, scaled in f64.
    fn by_definition(x: &[i8], w: &[i8], g: usize, sx: &[f32], sw: &[f32]) -> f64 {
        let mut t = 0f64;
        for (p, (&a, &b)) in x.iter().zip(w).enumerate() {
            t += f64::from(a) * f64::from(b) * f64::from(sx[p / g]) * f64::from(sw[p / g]);
        }
        t
    }

    #[test]
    fn block_rows_equal_their_definition_at_the_extremes_of_the_codes() {
        for (k, g, rows) in [(64usize, 32usize, 3usize), (768, 32, 5), (256, 64, 2), (192, 96, 1), (96, 16, 2)] {
            // Every code pattern, -128 and 127 included: -128 * -128 summed over a whole block
            // is the largest a lane holds.
            let x: Vec<i8> = (0..k).map(|i| if i % 5 == 0 { -128 } else { ((i * 37) % 256) as u8 as i8 }).collect();
            let w: Vec<i8> =
                (0..rows * k).map(|i| if i % 3 == 0 { -128 } else { ((i * 91 + 7) % 256) as u8 as i8 }).collect();
            let sx: Vec<f32> = (0..k / g).map(|b| 0.02 + b as f32 * 1e-3).collect();
            let sw: Vec<f32> = (0..rows * k / g).map(|b| 0.003 + b as f32 * 7e-4).collect();
            let mut x16 = vec![0i16; k];
            widen_i8(&x, &mut x16);
            let mut dispatched = vec![0f32; rows];
            dot_i8_block_rows(&x16, &w, g, &sx, &sw, &mut dispatched);
            let portable: Vec<f32> = (0..rows)
                .map(|r| blocks_portable(&x16, &w[r * k..(r + 1) * k], g, &sx, &sw[r * (k / g)..(r + 1) * (k / g)]))
                .collect();
            let mut paths = vec![dispatched, portable];
            #[cfg(target_arch = "x86_64")]
            if g % 32 == 0 && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                let mut out = vec![0f32; rows];
                // SAFETY: AVX2 and FMA were detected; the rows and scales tile as asserted above.
                #[allow(unsafe_code)]
                unsafe {
                    x86::rows_avx2(&x16, &w, g, &sx, &sw, &mut out)
                };
                paths.push(out);
            }
            for (r, o) in paths.iter().flat_map(|p| p.iter().enumerate()) {
                let (wr, swr) = (&w[r * k..(r + 1) * k], &sw[r * (k / g)..(r + 1) * (k / g)]);
                let want = by_definition(&x, wr, g, &sx, swr);
                // Scale of the sum's terms, for a relative bound on f32 lanes.
                let size: f64 = x
                    .iter()
                    .zip(wr)
                    .enumerate()
                    .map(|(p, (&a, &b))| {
                        (f64::from(a) * f64::from(b) * f64::from(sx[p / g]) * f64::from(swr[p / g])).abs()
                    })
                    .sum();
                assert!((f64::from(*o) - want).abs() <= 1e-6 * size, "k {k} g {g} row {r}: {o} against {want}");
            }
        }
    }
}
