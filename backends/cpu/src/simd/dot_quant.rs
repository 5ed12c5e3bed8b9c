//! Dot products of quantized rows, for the decode GEMVs of quantized weights:
//!
//! - [`dot_int4`]: a row of `int4` codes (two per byte, the even element in the low nibble)
//!   against x given as its even and odd elements: per block, `scale * sum((q - zero) * x)`,
//!   the codes widened to f32 in registers (sixteen low nibbles against sixteen even
//!   elements, sixteen high ones against the odd), scaled once per block.
//! - [`dot_i8_blocks`]: two i8 rows in blocks, each block's exact integer dot (i16 products
//!   summed in pairs into i32 lanes, `vpmaddwd`) times its pair of scales, summed in f64
//!   lanes (blocks' sums may cancel: they round once, at the end, as the reference's).
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

/// `sum over blocks b of (exact sum_j a_j * b_j over block b) * sa[b] * sb[b]`, blocks of `g`
/// (at most 65536, so a block's i32 lanes cannot overflow).
pub(crate) fn dot_i8_blocks(a: &[i8], b: &[i8], g: usize, sa: &[f32], sb: &[f32]) -> f32 {
    assert!(
        g > 0 && g <= 1 << 16 && a.len() == b.len() && a.len() == sa.len() * g && sb.len() == sa.len(),
        "dot_i8_blocks: blocks of {g} do not tile rows of {} and {} with {} scales",
        a.len(),
        b.len(),
        sa.len()
    );
    #[cfg(target_arch = "x86_64")]
    if g.is_multiple_of(32) {
        match level() {
            #[allow(unsafe_code)]
            // SAFETY: AVX-512BW was detected (and AVX-512F with it); bounds asserted above.
            Level::Avx512 if x86::has_avx512bw() => return unsafe { x86::i8_avx512bw(a, b, g, sa, sb) },
            #[allow(unsafe_code)]
            // SAFETY: Avx2 or better means AVX2 and FMA were detected; bounds asserted above.
            Level::Avx512 | Level::Avx2 => return unsafe { x86::i8_avx2(a, b, g, sa, sb) },
            Level::Portable => {}
        }
    }
    let mut total = 0f64;
    for ((ca, cb), (x, y)) in a.chunks_exact(g).zip(b.chunks_exact(g)).zip(sa.iter().zip(sb)) {
        let s: i32 = ca.iter().zip(cb).map(|(&p, &q)| i32::from(p) * i32::from(q)).sum();
        total += f64::from(s) * (f64::from(*x) * f64::from(*y));
    }
    total as f32
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

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

    /// # Safety
    /// AVX-512F and AVX-512BW must be available; `a.len() == b.len() == sa.len() * g`,
    /// `sb.len() == sa.len()`, `g % 32 == 0`, `g <= 65536`.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    pub(super) unsafe fn i8_avx512bw(a: &[i8], b: &[i8], g: usize, sa: &[f32], sb: &[f32]) -> f32 {
        // f64 accumulators: a block's i32 lanes widen exactly, its scale pair multiplies
        // exactly, and the blocks' sums (which may cancel) round once, at the end.
        let mut acc = [_mm512_setzero_pd(); 4];
        for (blk, (&x, &y)) in sa.iter().zip(sb).enumerate() {
            let mut lanes = _mm512_setzero_si512();
            let mut j = blk * g;
            while j < (blk + 1) * g {
                // SAFETY: j + 32 <= a.len() == b.len() (the caller's bounds).
                let (va, vb) = unsafe {
                    (_mm256_loadu_si256(a.as_ptr().add(j).cast()), _mm256_loadu_si256(b.as_ptr().add(j).cast()))
                };
                let p = _mm512_madd_epi16(_mm512_cvtepi8_epi16(va), _mm512_cvtepi8_epi16(vb));
                lanes = _mm512_add_epi32(lanes, p);
                j += 32;
            }
            // Sixteen lanes folded to eight in i32 (exact: a lane holds at most 2^26), then one
            // widening and one FMA per block.
            let l8 = _mm256_add_epi32(_mm512_castsi512_si256(lanes), _mm512_extracti64x4_epi64(lanes, 1));
            let s = _mm512_set1_pd(f64::from(x) * f64::from(y));
            acc[blk % 4] = _mm512_fmadd_pd(_mm512_cvtepi32_pd(l8), s, acc[blk % 4]);
        }
        _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(acc[0], acc[1]), _mm512_add_pd(acc[2], acc[3]))) as f32
    }

    /// # Safety
    /// AVX2 and FMA must be available; bounds as [`i8_avx512bw`]'s.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn i8_avx2(a: &[i8], b: &[i8], g: usize, sa: &[f32], sb: &[f32]) -> f32 {
        let mut acc = [_mm256_setzero_pd(); 4];
        for (blk, (&x, &y)) in sa.iter().zip(sb).enumerate() {
            let mut lanes = _mm256_setzero_si256();
            let mut j = blk * g;
            while j < (blk + 1) * g {
                // SAFETY: j + 32 <= a.len() == b.len() (the caller's bounds).
                let (a0, a1, b0, b1) = unsafe {
                    (
                        _mm_loadu_si128(a.as_ptr().add(j).cast()),
                        _mm_loadu_si128(a.as_ptr().add(j + 16).cast()),
                        _mm_loadu_si128(b.as_ptr().add(j).cast()),
                        _mm_loadu_si128(b.as_ptr().add(j + 16).cast()),
                    )
                };
                let p0 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(a0), _mm256_cvtepi8_epi16(b0));
                let p1 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(a1), _mm256_cvtepi8_epi16(b1));
                lanes = _mm256_add_epi32(lanes, _mm256_add_epi32(p0, p1));
                j += 32;
            }
            let l4 = _mm_add_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
            let s = _mm256_set1_pd(f64::from(x) * f64::from(y));
            acc[blk % 4] = _mm256_fmadd_pd(_mm256_cvtepi32_pd(l4), s, acc[blk % 4]);
        }
        let v = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
        let h = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
        (_mm_cvtsd_f64(h) + _mm_cvtsd_f64(_mm_unpackhi_pd(h, h))) as f32
    }

    #[target_feature(enable = "avx2")]
    fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}
