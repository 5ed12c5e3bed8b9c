//! int4 weights against int8 activations (llama.cpp's Q4_0 x Q8_0 dot product), for the
//! decode GEMV of `linear_int4` with `attrs.activations = int8`:
//!
//! - [`int8_blocks`] rounds x to int8 in blocks, as the attribute defines it.
//! - [`dot_int4_i8`] dots one row of int4 codes with that x in integer lanes: `vpdpbusd`
//!   (AVX-512 VNNI) or `vpmaddubsw` + `vpmaddwd` (AVX2) multiply the unsigned codes by the
//!   signed int8 x four bytes to a lane, exactly; each lane then goes to f32 once, times its
//!   pair of scales. A dequantized f32 dot costs about three times the instructions per
//!   weight (two widenings and a conversion per sixteen codes), and decode was bound by them,
//!   not by memory.

use super::{Level, level};

/// i8 code of `q` (already divided by its scale).
#[inline]
pub(crate) fn i8_encode(q: f32) -> i8 {
    // Clamped, then rounded half to even by adding and taking away 1.5 * 2^23 (exact for
    // |q| <= 127: f32 additions round to nearest even), the same value as rounding first:
    // `round_ties_even` is a libm call per element on baseline x86-64, this vectorizes (a
    // 2048-wide row's quantize took 8-9 us, most of a decode step's 48 quantize calls).
    // The cast saturates and gives 0 for NaN.
    const MAGIC: f32 = 12_582_912.0;
    let c = q.clamp(-127.0, 127.0);
    ((c + MAGIC) - MAGIC) as i8
}

/// The bits of a block's largest |v| (sign cleared): for floats that are not NaN the bit
/// order is the value order, so an integer max (which vectorizes, where a float max chain
/// does not) finds it, and a NaN or infinity shows as bits at or above infinity's.
#[inline(always)]
fn amax_bits(block: &[f32]) -> u32 {
    block.iter().fold(0u32, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF))
}

const INF_BITS: u32 = 0x7F80_0000;

#[inline(always)]
fn int8_blocks_impl(x: &[f32], g: usize, q: &mut [i8], scales: &mut [f32]) -> bool {
    let mut finite = true;
    for ((block, codes), d) in x.chunks(g).zip(q.chunks_mut(g)).zip(scales.iter_mut()) {
        let bits = amax_bits(block);
        finite &= bits < INF_BITS;
        *d = f32::from_bits(bits) / 127.0;
        if *d == 0.0 {
            codes.fill(0);
            continue;
        }
        let dd = *d;
        for (c, &v) in codes.iter_mut().zip(block) {
            *c = i8_encode(v / dd);
        }
    }
    finite
}

multiversion! {
    /// `x` rounded to int8 in blocks of `g`: for each block, `d = max|x| / 127` into `scales`
    /// and `round_ties_even(x / d)` into `q` (zeros where `d` is 0). Returns false when some
    /// element is not finite (its code would read as a number).
    fn int8_blocks(x: &[f32], g: usize, q: &mut [i8], scales: &mut [f32]) -> bool => int8_blocks_impl;
}

#[inline(always)]
fn round_int8_impl(x: &mut [f32], g: usize) {
    for block in x.chunks_mut(g) {
        let bits = amax_bits(block);
        let d = f32::from_bits(bits) / 127.0;
        // A block with a NaN or an infinity stays as it is, for the product to carry.
        if bits >= INF_BITS || d == 0.0 {
            continue;
        }
        for v in block.iter_mut() {
            *v = f32::from(i8_encode(*v / d)) * d;
        }
    }
}

multiversion! {
    /// `x` rounded to int8 in blocks of `g` and scaled back (`q * d`, as [`int8_blocks`]
    /// rounds), in place; a block holding a NaN or an infinity is left as it is.
    fn round_int8(x: &mut [f32], g: usize) => round_int8_impl;
}

/// `sum over lanes l of (lane l's exact integer sum) * sx[l] * sw[group of l]` for one
/// int4 row (zero point 8): `bytes` holds the row's `k / 2` bytes (even element in the low
/// nibble), `xe` and `xo` x's int8 codes at even and odd positions, and lane `l` covers
/// bytes `4l..4l + 4` (codes `8l..8l + 8`): `zc[l]` is minus eight times the sum of its
/// eight x codes (the zero point, folded in as the lane's starting value) and `sx[l]` its
/// x block's scale. `sw` holds the row's `k / g` scales; `g` is 32, 64 or a multiple of 128
/// and `bytes.len()` a multiple of 64.
pub(crate) fn dot_int4_i8(bytes: &[u8], sw: &[f32], g: usize, xe: &[i8], xo: &[i8], zc: &[i32], sx: &[f32]) -> f32 {
    let half = bytes.len();
    assert!(
        half.is_multiple_of(64) && (g == 32 || g == 64 || g.is_multiple_of(128)) && sw.len() * g == half * 2,
        "dot_int4_i8: blocks of {g} and {} scales do not tile {half} bytes in steps of 64",
        sw.len()
    );
    assert!(
        xe.len() >= half && xo.len() >= half && zc.len() >= half / 4 && sx.len() >= half / 4,
        "dot_int4_i8: x is shorter than the row"
    );
    #[cfg(target_arch = "x86_64")]
    match level() {
        #[allow(unsafe_code)]
        // SAFETY: VNNI and BW were detected with AVX-512F; the asserts above are the bounds.
        Level::Avx512 if x86::has_vnni() => return unsafe { x86::vnni(bytes, sw, g, xe, xo, zc, sx) },
        #[allow(unsafe_code)]
        // SAFETY: Avx2 or better means AVX2 and FMA were detected; bounds as above.
        Level::Avx512 | Level::Avx2 => return unsafe { x86::avx2(bytes, sw, g, xe, xo, zc, sx) },
        Level::Portable => {}
    }
    let _ = level;
    portable(bytes, sw, g, xe, xo, zc, sx)
}

/// One row of x as [`dot_int4_i8`] reads it: codes at even and odd positions, and per lane
/// of eight codes its zero-point term and its block's scale.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct XRow<'a> {
    pub xe: &'a [i8],
    pub xo: &'a [i8],
    pub zc: &'a [i32],
    pub sx: &'a [f32],
}

/// Most rows [`dot_int4_i8_rows`] dots in one pass over the weight row.
pub(crate) const DOT_ROWS: usize = 4;

/// `out[r] = dot_int4_i8(bytes, sw, g, rows[r])` for every row, the weight row's codes
/// loaded and split into nibbles once per [`DOT_ROWS`] rows instead of once per row (a
/// batched decode or a speculative verification dots every weight row with each of its rows).
pub(crate) fn dot_int4_i8_rows(bytes: &[u8], sw: &[f32], g: usize, rows: &[XRow<'_>], out: &mut [f32]) {
    assert!(out.len() >= rows.len(), "dot_int4_i8_rows: {} outputs for {} rows", out.len(), rows.len());
    for (rows, out) in rows.chunks(DOT_ROWS).zip(out.chunks_mut(DOT_ROWS)) {
        match rows {
            [x] => out[0] = dot_int4_i8(bytes, sw, g, x.xe, x.xo, x.zc, x.sx),
            [a, b] => many::<2>(bytes, sw, g, [*a, *b], out),
            [a, b, c] => many::<3>(bytes, sw, g, [*a, *b, *c], out),
            [a, b, c, d] => many::<4>(bytes, sw, g, [*a, *b, *c, *d], out),
            _ => {}
        }
    }
}

/// [`dot_int4_i8_rows`] for `R` rows at once.
fn many<const R: usize>(bytes: &[u8], sw: &[f32], g: usize, rows: [XRow<'_>; R], out: &mut [f32]) {
    let half = bytes.len();
    assert!(
        half.is_multiple_of(64) && (g == 32 || g == 64 || g.is_multiple_of(128)) && sw.len() * g == half * 2,
        "dot_int4_i8_rows: blocks of {g} and {} scales do not tile {half} bytes in steps of 64",
        sw.len()
    );
    assert!(
        rows.iter()
            .all(|x| x.xe.len() >= half && x.xo.len() >= half && x.zc.len() >= half / 4 && x.sx.len() >= half / 4),
        "dot_int4_i8_rows: x is shorter than the row"
    );
    let out: &mut [f32; R] = match out.get_mut(..R).and_then(|o| o.try_into().ok()) {
        Some(o) => o,
        None => return,
    };
    #[cfg(target_arch = "x86_64")]
    match level() {
        #[allow(unsafe_code)]
        // SAFETY: VNNI and BW were detected with AVX-512F; the asserts above are the bounds.
        Level::Avx512 if x86::has_vnni() => return unsafe { x86::vnni_rows::<R>(bytes, sw, g, &rows, out) },
        #[allow(unsafe_code)]
        // SAFETY: Avx2 or better means AVX2 and FMA were detected; bounds as above.
        Level::Avx512 | Level::Avx2 => return unsafe { x86::avx2_rows::<R>(bytes, sw, g, &rows, out) },
        Level::Portable => {}
    }
    for (o, x) in out.iter_mut().zip(&rows) {
        *o = portable(bytes, sw, g, x.xe, x.xo, x.zc, x.sx);
    }
}

/// [`dot_int4_i8`] in scalar code (the same lanes and the same sums per lane).
fn portable(bytes: &[u8], sw: &[f32], g: usize, xe: &[i8], xo: &[i8], zc: &[i32], sx: &[f32]) -> f32 {
    let mut total = 0f32;
    for (l, ((b4, (e4, o4)), (&z, &s))) in
        bytes.chunks_exact(4).zip(xe.chunks_exact(4).zip(xo.chunks_exact(4))).zip(zc.iter().zip(sx)).enumerate()
    {
        let mut t = z;
        for ((&b, &e), &o) in b4.iter().zip(e4).zip(o4) {
            t += i32::from(b & 0x0F) * i32::from(e) + i32::from(b >> 4) * i32::from(o);
        }
        total += t as f32 * s * sw[l * 8 / g];
    }
    total
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    use crate::simd::prefetch_ahead;

    use super::XRow;

    /// Lane l of a 64-byte step (four bytes each) to its block's index within the step's
    /// scales: `l / 4` for blocks of 32, `l / 8` for 64 (one block for 128 and more).
    #[target_feature(enable = "avx512f")]
    fn spread(g: usize) -> __m512i {
        match g {
            32 => _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
            _ => _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
        }
    }

    /// The weight scale of each lane of 64-byte step `s`.
    ///
    /// # Safety
    /// AVX-512F; `sw` holds the row's `k / g` scales and step `s` lies within the row (4s + 4
    /// <= k / 32 groups, 2s + 2 <= k / 64, s * 128 / g < k / g).
    #[target_feature(enable = "avx512f")]
    unsafe fn step_scales(sw: &[f32], g: usize, s: usize, spread: __m512i) -> __m512 {
        // SAFETY: the caller's bounds.
        unsafe {
            match g {
                32 => _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_loadu_ps(sw.as_ptr().add(4 * s)))),
                64 => _mm512_permutexvar_ps(
                    spread,
                    _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(sw.as_ptr().add(2 * s).cast()))),
                ),
                _ => _mm512_set1_ps(*sw.get_unchecked(s * 128 / g)),
            }
        }
    }

    /// The weight scale of each lane of 32-byte step `s` (two blocks of 32, or one).
    #[target_feature(enable = "avx2")]
    fn step_scales_avx2(sw: &[f32], g: usize, s: usize) -> __m256 {
        if g == 32 {
            _mm256_set_m128(_mm_set1_ps(sw[2 * s + 1]), _mm_set1_ps(sw[2 * s]))
        } else {
            _mm256_set1_ps(sw[s * 64 / g])
        }
    }

    /// The sum of the eight lanes.
    #[target_feature(enable = "avx2")]
    fn hsum(v: __m256) -> f32 {
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)))
    }

    pub(super) fn has_vnni() -> bool {
        static VNNI: OnceLock<bool> = OnceLock::new();
        *VNNI.get_or_init(|| is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw"))
    }

    /// # Safety
    /// AVX-512F, BW and VNNI must be available; bounds as [`super::dot_int4_i8`] asserts.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
    pub(super) unsafe fn vnni(bytes: &[u8], sw: &[f32], g: usize, xe: &[i8], xo: &[i8], zc: &[i32], sx: &[f32]) -> f32 {
        let nib = _mm512_set1_epi8(0x0F);
        // A 64-byte step is 128 codes: lanes of four bytes each map to group `l / 4` (g = 32)
        // or `l / 8` (g = 64) of the step's first one, or all to one group (g >= 128).
        let spread = spread(g);
        // One 64-byte step's scaled lanes.
        let step = |s: usize| {
            let (b, l) = (s * 64, s * 16);
            // SAFETY: b + 64 <= bytes.len() <= xe.len(), xo.len(); l + 16 <= zc.len(), sx.len();
            // the scale reads stay within sw (4s + 4 <= k / 32 groups, 2s + 2 <= k / 64).
            let (v, e, o, z, xs, ws) = unsafe {
                let ws = step_scales(sw, g, s, spread);
                (
                    _mm512_loadu_si512(bytes.as_ptr().add(b).cast()),
                    _mm512_loadu_si512(xe.as_ptr().add(b).cast()),
                    _mm512_loadu_si512(xo.as_ptr().add(b).cast()),
                    _mm512_loadu_si512(zc.as_ptr().add(l).cast()),
                    _mm512_loadu_ps(sx.as_ptr().add(l)),
                    ws,
                )
            };
            let lo = _mm512_and_si512(v, nib);
            let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            let dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, lo, e), hi, o);
            (_mm512_mul_ps(_mm512_cvtepi32_ps(dot), xs), ws)
        };
        // Two accumulators in registers, steps in pairs (an indexed array of them would live
        // on the stack, one store and reload per step).
        let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let steps = bytes.len() / 64;
        let mut s = 0;
        while s + 2 <= steps {
            prefetch_ahead(bytes, s * 64);
            prefetch_ahead(bytes, s * 64 + 64);
            let (p0, w0) = step(s);
            let (p1, w1) = step(s + 1);
            acc0 = _mm512_fmadd_ps(p0, w0, acc0);
            acc1 = _mm512_fmadd_ps(p1, w1, acc1);
            s += 2;
        }
        if s < steps {
            let (p0, w0) = step(s);
            acc0 = _mm512_fmadd_ps(p0, w0, acc0);
        }
        _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
    }

    /// # Safety
    /// AVX2 and FMA must be available; bounds as [`super::dot_int4_i8`] asserts.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn avx2(bytes: &[u8], sw: &[f32], g: usize, xe: &[i8], xo: &[i8], zc: &[i32], sx: &[f32]) -> f32 {
        let nib = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let step = |s: usize| {
            let (b, l) = (s * 32, s * 8);
            // A 32-byte step is 64 codes: lanes 0..4 and 4..8 are two groups of 32, or one.
            let ws = step_scales_avx2(sw, g, s);
            // SAFETY: b + 32 <= bytes.len() <= xe.len(), xo.len(); l + 8 <= zc.len(), sx.len().
            let (v, e, o, z, xs) = unsafe {
                (
                    _mm256_loadu_si256(bytes.as_ptr().add(b).cast()),
                    _mm256_loadu_si256(xe.as_ptr().add(b).cast()),
                    _mm256_loadu_si256(xo.as_ptr().add(b).cast()),
                    _mm256_loadu_si256(zc.as_ptr().add(l).cast()),
                    _mm256_loadu_ps(sx.as_ptr().add(l)),
                )
            };
            let lo = _mm256_and_si256(v, nib);
            let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
            // Pairs of u8 x i8 products in i16 (at most 2 * 15 * 127 each, then two such
            // summed: no saturation), widened in pairs to the lanes' i32.
            let pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, e), _mm256_maddubs_epi16(hi, o));
            let dot = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), z);
            (_mm256_mul_ps(_mm256_cvtepi32_ps(dot), xs), ws)
        };
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let steps = bytes.len() / 32;
        let mut s = 0;
        while s + 2 <= steps {
            prefetch_ahead(bytes, s * 32);
            let (p0, w0) = step(s);
            let (p1, w1) = step(s + 1);
            acc0 = _mm256_fmadd_ps(p0, w0, acc0);
            acc1 = _mm256_fmadd_ps(p1, w1, acc1);
            s += 2;
        }
        if s < steps {
            let (p0, w0) = step(s);
            acc0 = _mm256_fmadd_ps(p0, w0, acc0);
        }
        hsum(_mm256_add_ps(acc0, acc1))
    }

    /// [`vnni`] for `R` rows: each 64-byte step of the weight row loaded and split into its
    /// nibbles once, then dotted with every row's codes; one accumulator per row.
    ///
    /// # Safety
    /// AVX-512F, BW and VNNI must be available; bounds as [`super::many`] asserts.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
    pub(super) unsafe fn vnni_rows<const R: usize>(
        bytes: &[u8],
        sw: &[f32],
        g: usize,
        rows: &[XRow<'_>; R],
        out: &mut [f32; R],
    ) {
        let nib = _mm512_set1_epi8(0x0F);
        let spread = spread(g);
        let mut acc = [_mm512_setzero_ps(); R];
        for s in 0..bytes.len() / 64 {
            let (b, l) = (s * 64, s * 16);
            prefetch_ahead(bytes, b);
            // SAFETY: b + 64 <= bytes.len(); the scale reads stay within sw (as in `vnni`).
            let (v, ws) = unsafe { (_mm512_loadu_si512(bytes.as_ptr().add(b).cast()), step_scales(sw, g, s, spread)) };
            let lo = _mm512_and_si512(v, nib);
            let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            for (a, x) in acc.iter_mut().zip(rows) {
                // SAFETY: b + 64 <= bytes.len() <= x.xe.len(), x.xo.len(); l + 16 <= x.zc.len(), x.sx.len().
                let (e, o, z, xs) = unsafe {
                    (
                        _mm512_loadu_si512(x.xe.as_ptr().add(b).cast()),
                        _mm512_loadu_si512(x.xo.as_ptr().add(b).cast()),
                        _mm512_loadu_si512(x.zc.as_ptr().add(l).cast()),
                        _mm512_loadu_ps(x.sx.as_ptr().add(l)),
                    )
                };
                let dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, lo, e), hi, o);
                *a = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), xs), ws, *a);
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = _mm512_reduce_add_ps(a);
        }
    }

    /// [`avx2`] for `R` rows, as [`vnni_rows`] shares each step.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; bounds as [`super::many`] asserts.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn avx2_rows<const R: usize>(
        bytes: &[u8],
        sw: &[f32],
        g: usize,
        rows: &[XRow<'_>; R],
        out: &mut [f32; R],
    ) {
        let nib = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        for s in 0..bytes.len() / 32 {
            let (b, l) = (s * 32, s * 8);
            if s.is_multiple_of(2) {
                prefetch_ahead(bytes, b);
            }
            let ws = step_scales_avx2(sw, g, s);
            // SAFETY: b + 32 <= bytes.len().
            let v = unsafe { _mm256_loadu_si256(bytes.as_ptr().add(b).cast()) };
            let lo = _mm256_and_si256(v, nib);
            let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
            for (a, x) in acc.iter_mut().zip(rows) {
                // SAFETY: b + 32 <= bytes.len() <= x.xe.len(), x.xo.len(); l + 8 <= x.zc.len(), x.sx.len().
                let (e, o, z, xs) = unsafe {
                    (
                        _mm256_loadu_si256(x.xe.as_ptr().add(b).cast()),
                        _mm256_loadu_si256(x.xo.as_ptr().add(b).cast()),
                        _mm256_loadu_si256(x.zc.as_ptr().add(l).cast()),
                        _mm256_loadu_ps(x.sx.as_ptr().add(l)),
                    )
                };
                // As in `avx2`: pairs in i16 without saturation, widened to the lanes' i32.
                let pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, e), _mm256_maddubs_epi16(hi, o));
                let dot = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), z);
                *a = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), xs), ws, *a);
            }
        }
        for (o, v) in out.iter_mut().zip(acc) {
            *o = hsum(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dot as its definition reads: codes minus eight, times x's codes, per element,
    /// each element's scales applied in f64.
    fn by_definition(bytes: &[u8], sw: &[f32], g: usize, xq: &[i8], sx: &[f32], gx: usize) -> f64 {
        let mut t = 0f64;
        for (p, &x) in xq.iter().enumerate() {
            let b = bytes[p / 2];
            let q = if p % 2 == 0 { b & 0x0F } else { b >> 4 };
            t += f64::from(i32::from(q) - 8) * f64::from(x) * f64::from(sw[p / g]) * f64::from(sx[p / gx]);
        }
        t
    }

    #[test]
    fn the_integer_dot_equals_its_definition_for_every_group_shape() {
        for (k, g) in [(128, 32), (256, 64), (384, 128), (512, 256), (768, 32)] {
            let bytes: Vec<u8> = (0..k / 2).map(|i| ((i * 37 + 11) % 256) as u8).collect();
            let sw: Vec<f32> = (0..k / g).map(|b| 0.01 + b as f32 * 0.003).collect();
            let x: Vec<f32> = (0..k).map(|i| ((i * 13 % 29) as f32 - 14.0) * 0.37).collect();
            let (mut xq, mut xs) = (vec![0i8; k], vec![0f32; k / g]);
            assert!(int8_blocks(&x, g, &mut xq, &mut xs));
            let xe: Vec<i8> = xq.iter().step_by(2).copied().collect();
            let xo: Vec<i8> = xq.iter().skip(1).step_by(2).copied().collect();
            let zc: Vec<i32> =
                (0..k / 8).map(|l| -8 * xq[8 * l..8 * l + 8].iter().map(|&c| i32::from(c)).sum::<i32>()).collect();
            let sx: Vec<f32> = (0..k / 8).map(|l| xs[8 * l / g]).collect();
            let want = by_definition(&bytes, &sw, g, &xq, &xs, g);
            let scale: f64 = x.iter().map(|v| f64::from(v.abs())).sum::<f64>() * 0.2;
            // Every path this machine has, not only the one the dispatch picks.
            let mut paths = vec![("dispatched", dot_int4_i8(&bytes, &sw, g, &xe, &xo, &zc, &sx))];
            paths.push(("portable", portable(&bytes, &sw, g, &xe, &xo, &zc, &sx)));
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY: AVX2 and FMA were just detected; the sizes are dot_int4_i8's.
                paths.push(("avx2", unsafe { x86::avx2(&bytes, &sw, g, &xe, &xo, &zc, &sx) }));
                if x86::has_vnni() {
                    // SAFETY: AVX-512 VNNI and BW were detected (and AVX-512F with them).
                    paths.push(("vnni", unsafe { x86::vnni(&bytes, &sw, g, &xe, &xo, &zc, &sx) }));
                }
            }
            for (path, got) in paths {
                assert!((f64::from(got) - want).abs() <= 1e-5 * scale, "{path}, k {k} g {g}: {got} vs {want}");
            }
        }
    }

    /// x's operands for the dots: (codes, block scales, even, odd, lane zero terms, lane scales).
    type Operands = (Vec<i8>, Vec<f32>, Vec<i8>, Vec<i8>, Vec<i32>, Vec<f32>);

    fn operands(x: &[f32], g: usize) -> Operands {
        let k = x.len();
        let (mut xq, mut xs) = (vec![0i8; k], vec![0f32; k / g]);
        assert!(int8_blocks(x, g, &mut xq, &mut xs));
        let xe: Vec<i8> = xq.iter().step_by(2).copied().collect();
        let xo: Vec<i8> = xq.iter().skip(1).step_by(2).copied().collect();
        let zc: Vec<i32> =
            (0..k / 8).map(|l| -8 * xq[8 * l..8 * l + 8].iter().map(|&c| i32::from(c)).sum::<i32>()).collect();
        let sx: Vec<f32> = (0..k / 8).map(|l| xs[8 * l / g]).collect();
        (xq, xs, xe, xo, zc, sx)
    }

    #[test]
    fn dotting_several_rows_at_once_equals_each_row_s_definition() {
        for (k, g) in [(128, 32), (256, 64), (384, 128), (768, 32)] {
            let bytes: Vec<u8> = (0..k / 2).map(|i| ((i * 53 + 7) % 256) as u8).collect();
            let sw: Vec<f32> = (0..k / g).map(|b| 0.02 - b as f32 * 0.001).collect();
            let ops: Vec<Operands> = (0..7)
                .map(|r| operands(&(0..k).map(|i| ((i * (r + 3) % 31) as f32 - 15.0) * 0.21).collect::<Vec<_>>(), g))
                .collect();
            let rows: Vec<XRow<'_>> = ops.iter().map(|(_, _, xe, xo, zc, sx)| XRow { xe, xo, zc, sx }).collect();
            let want: Vec<f64> = ops.iter().map(|(xq, xs, ..)| by_definition(&bytes, &sw, g, xq, xs, g)).collect();
            let close = |got: f32, r: usize| (f64::from(got) - want[r]).abs() <= 1e-5 * (1.0 + want[r].abs());
            for n in 1..=rows.len() {
                let mut out = vec![f32::NAN; n];
                dot_int4_i8_rows(&bytes, &sw, g, &rows[..n], &mut out);
                for (r, &got) in out.iter().enumerate() {
                    assert!(close(got, r), "{n} rows, row {r}, k {k} g {g}: {got} vs {}", want[r]);
                }
            }
            // The AVX2 rows as well where the dispatch picks VNNI.
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                let mut out = [0f32; 3];
                // SAFETY: AVX2 and FMA were just detected; the sizes are many's.
                unsafe { x86::avx2_rows::<3>(&bytes, &sw, g, &[rows[0], rows[1], rows[2]], &mut out) };
                for (r, &got) in out.iter().enumerate() {
                    assert!(close(got, r), "avx2, row {r}, k {k} g {g}: {got} vs {}", want[r]);
                }
            }
        }
    }

    #[test]
    fn rounding_to_int8_is_ties_to_even_with_the_block_maximum_at_127() {
        let x = [127.0f32, 0.5, 1.5, -2.5, 0.0, -127.0, 3.0, 2.0];
        let (mut q, mut d) = ([0i8; 8], [0f32; 1]);
        assert!(int8_blocks(&x, 8, &mut q, &mut d));
        assert_eq!((q, d[0]), ([127, 0, 2, -2, 0, -127, 3, 2], 1.0));
        assert!(!int8_blocks(&[1.0, f32::NAN], 2, &mut q[..2], &mut d));
    }
}
