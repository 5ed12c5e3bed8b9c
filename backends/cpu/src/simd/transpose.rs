//! In-register 16 x 16 transposes: f32 blocks, AMX pair tiles from bf16 rows, and f32
//! blocks written transposed and rounded to bf16.

use super::convert::bf16_bits;
use super::{Level, level};

/// One AMX B tile from bf16 rows: `dst[16 q + c] = src[c ld + 2 q] | src[c ld + 2 q + 1] << 16`
/// for the `rows <= 16` rows and `cols <= 32` columns of `src` (row c at `c * ld`), zero
/// elsewhere; `dst` holds 256 pairs. AVX-512 transposes full 16 x 32 blocks in registers.
pub(crate) fn pair_tile(src: &[u16], ld: usize, rows: usize, cols: usize, dst: &mut [u32]) {
    assert!(rows <= 16 && cols <= 32 && dst.len() >= 256, "pair_tile: block too large");
    assert!(rows == 0 || src.len() >= (rows - 1) * ld + cols, "pair_tile: source too short");
    #[cfg(target_arch = "x86_64")]
    if rows == 16 && cols == 32 && level() == Level::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected; the asserts above cover the 16 rows of 32
        // elements read and the 256 pairs written.
        unsafe {
            x86::pair_tile_16x32(src, ld, dst)
        };
        return;
    }
    dst[..256].fill(0);
    for c in 0..rows {
        for (e, &v) in src[c * ld..c * ld + cols].iter().enumerate() {
            dst[16 * (e / 2) + c] |= u32::from(v) << (16 * (e % 2));
        }
    }
}

/// `dst[i][off + j] = bf16(c[j * ldc + i] (+ bias[j]))` for `i < dst.len()`, `j < nb`: an
/// f32 block `c` [nb, ldc] written transposed into output rows, rounded once (as
/// `bf16::from_f32`). AVX-512 transposes 16 x 16 blocks in registers.
pub(crate) fn transpose_round_bf16(
    c: &[f32],
    ldc: usize,
    nb: usize,
    bias: Option<&[f32]>,
    dst: &mut [&mut [half::bf16]],
    off: usize,
) {
    let rows = dst.len();
    if rows == 0 || nb == 0 {
        return;
    }
    assert!(ldc >= rows && c.len() >= (nb - 1) * ldc + rows, "transpose_round_bf16: C too short");
    assert!(bias.is_none_or(|b| b.len() >= nb), "transpose_round_bf16: bias too short");
    assert!(dst.iter().all(|d| d.len() >= off + nb), "transpose_round_bf16: rows too short");
    let (mut i0, mut j_done) = (0, 0);
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        let jb = nb / 16 * 16;
        while i0 + 16 <= rows {
            for j0 in (0..jb).step_by(16) {
                #[allow(unsafe_code)]
                // SAFETY: AVX-512F was detected; the asserts above keep every access of
                // the block (rows i0..i0 + 16 of dst, columns j0..j0 + 16) in bounds.
                unsafe {
                    x86::transpose_round_bf16_16x16(c, ldc, i0, j0, bias, &mut dst[i0..i0 + 16], off)
                };
            }
            i0 += 16;
        }
        j_done = jb;
    }
    // What the blocks left: rows i0.. (all columns), and columns j_done.. of rows ..i0.
    for (i, d) in dst.iter_mut().enumerate() {
        let j_start = if i < i0 { j_done } else { 0 };
        for j in j_start..nb {
            let v = c[j * ldc + i] + bias.map_or(0.0, |b| b[j]);
            d[off + j] = half::bf16::from_bits(bf16_bits(v));
        }
    }
}

/// `dst[i * ldd + j] = src[j * lds + i]` for i, j < 16: one 16 x 16 f32 block transposed
/// (AVX-512 shuffles in registers; scalar elsewhere).
pub(crate) fn transpose_16x16(src: &[f32], lds: usize, dst: &mut [f32], ldd: usize) {
    assert!(src.len() >= 15 * lds + 16 && dst.len() >= 15 * ldd + 16, "transpose_16x16: operands too short");
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected on this CPU; the assert above is the kernel's bound.
        unsafe {
            x86::transpose_16x16_avx512(src, lds, dst, ldd)
        };
        return;
    }
    for i in 0..16 {
        for j in 0..16 {
            dst[i * ldd + j] = src[j * lds + i];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The 16 x 16 transpose of 32-bit lanes: `out[i]` lane `j` is `r[j]` lane `i`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    unsafe fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
        // Pairs of rows interleaved, then pairs of pairs: u[4g + q], lane L, holds output
        // row 4L + q at columns 4g..4g + 4.
        let t: [__m512; 16] = std::array::from_fn(|k| {
            let (a, b) = (r[k & !1], r[k | 1]);
            if k % 2 == 0 { _mm512_unpacklo_ps(a, b) } else { _mm512_unpackhi_ps(a, b) }
        });
        let u: [__m512; 16] = std::array::from_fn(|k| {
            let (g, q) = (k / 4, k % 4);
            let (a, b) = (_mm512_castps_pd(t[4 * g + q / 2]), _mm512_castps_pd(t[4 * g + 2 + q / 2]));
            _mm512_castpd_ps(if q % 2 == 0 { _mm512_unpacklo_pd(a, b) } else { _mm512_unpackhi_pd(a, b) })
        });
        let mut out = [_mm512_setzero_ps(); 16];
        for q in 0..4 {
            // The 4 x 4 transpose of 128-bit lanes.
            let v0 = _mm512_shuffle_f32x4::<0x44>(u[q], u[4 + q]);
            let v1 = _mm512_shuffle_f32x4::<0xEE>(u[q], u[4 + q]);
            let v2 = _mm512_shuffle_f32x4::<0x44>(u[8 + q], u[12 + q]);
            let v3 = _mm512_shuffle_f32x4::<0xEE>(u[8 + q], u[12 + q]);
            out[q] = _mm512_shuffle_f32x4::<0x88>(v0, v2);
            out[4 + q] = _mm512_shuffle_f32x4::<0xDD>(v0, v2);
            out[8 + q] = _mm512_shuffle_f32x4::<0x88>(v1, v3);
            out[12 + q] = _mm512_shuffle_f32x4::<0xDD>(v1, v3);
        }
        out
    }

    /// The 16 x 16 block of `transpose_round_bf16` at rows `i0..` of C's columns and
    /// columns `j0..` of C's rows; `dst` holds the 16 output rows.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `c` must hold the 16 floats at `(j0 + j) * ldc + i0` for
    /// each j < 16, `bias` (when given) at least `j0 + 16` elements, and `dst` 16 rows of at
    /// least `off + j0 + 16` elements.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn transpose_round_bf16_16x16(
        c: &[f32],
        ldc: usize,
        i0: usize,
        j0: usize,
        bias: Option<&[f32]>,
        dst: &mut [&mut [half::bf16]],
        off: usize,
    ) {
        let r: [__m512; 16] = std::array::from_fn(|j| {
            // SAFETY: c holds rows j0..j0 + 16 up to column i0 + 16 (the contract above).
            unsafe { _mm512_loadu_ps(c.as_ptr().add((j0 + j) * ldc + i0)) }
        });
        // SAFETY: AVX-512F is enabled here (this function's contract).
        let cols = unsafe { transpose16(r) };
        let bias = bias.map(|b| {
            // SAFETY: bias.len() >= j0 + 16 (the contract above).
            unsafe { _mm512_loadu_ps(b.as_ptr().add(j0)) }
        });
        let (half, lsb, quiet, abs, inf) = (
            _mm512_set1_epi32(0x7fff),
            _mm512_set1_epi32(1),
            _mm512_set1_epi32(0x40),
            _mm512_set1_epi32(0x7fff_ffff),
            _mm512_set1_epi32(0x7f80_0000),
        );
        for (i, &o) in cols.iter().enumerate() {
            let o = match bias {
                Some(b) => _mm512_add_ps(o, b),
                None => o,
            };
            // Round to nearest even on the bits; NaN made quiet (as `bf16_bits`).
            let b = _mm512_castps_si512(o);
            let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), lsb);
            let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(b, _mm512_add_epi32(half, odd)));
            let nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, abs), inf);
            let bits = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(_mm512_srli_epi32::<16>(b), quiet));
            let row = &mut dst[i];
            // SAFETY: row.len() >= off + j0 + 16 (the contract above; 32 bytes stored).
            unsafe { _mm256_storeu_si256(row.as_mut_ptr().add(off + j0).cast(), _mm512_cvtepi32_epi16(bits)) };
        }
    }

    /// [`super::pair_tile`] for a full 16 x 32 block, after its checks.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `src` must hold 16 rows of 32 elements, `ld` apart
    /// (`src.len() >= 15 * ld + 32`), and `dst` at least 256 elements.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pair_tile_16x32(src: &[u16], ld: usize, dst: &mut [u32]) {
        let r: [__m512; 16] = std::array::from_fn(|c| {
            // SAFETY: src holds 16 rows of 32 elements, ld apart (the contract above).
            unsafe { _mm512_loadu_ps(src.as_ptr().add(c * ld).cast()) }
        });
        // SAFETY: AVX-512F is enabled here (this function's contract).
        let cols = unsafe { transpose16(r) };
        for (q, row) in cols.iter().enumerate() {
            // SAFETY: dst.len() >= 256 (the contract above).
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(16 * q).cast(), *row) };
        }
    }

    /// [`super::transpose_16x16`] after its check.
    ///
    /// # Safety
    /// The CPU must support AVX-512F (the bounds are asserted here).
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn transpose_16x16_avx512(src: &[f32], lds: usize, dst: &mut [f32], ldd: usize) {
        assert!(src.len() >= 15 * lds + 16 && dst.len() >= 15 * ldd + 16);
        let r: [__m512; 16] = std::array::from_fn(|j| {
            // SAFETY: row j < 16 of the block, 16 floats at j lds (asserted).
            unsafe { _mm512_loadu_ps(src.as_ptr().add(j * lds)) }
        });
        // SAFETY: AVX-512F is enabled here (this function's contract).
        let cols = unsafe { transpose16(r) };
        for (i, &row) in cols.iter().enumerate() {
            // SAFETY: output row i < 16, 16 floats at i ldd (asserted).
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(i * ldd), row) };
        }
    }
}
