//! Packed f32 GEMM tile: the microkernel of the cache-blocked GEMM in `gemm::packed`.

use super::{Level, level};

/// Rows of a [`gemm_tile_packed`] tile (the broadcast operand).
pub(crate) const TILE_MR: usize = 12;
/// Columns of a [`gemm_tile_packed`] tile (two 16-lane vectors).
pub(crate) const TILE_NR: usize = 32;

/// `C (+)= A . B` for one tile of up to `TILE_MR` x `TILE_NR`: `a` is a packed A panel
/// (`kc` steps of `TILE_MR` row values, `a[p * TILE_MR + i]` = A[i][p]), `b` a packed B
/// panel (`kc` steps of `TILE_NR` column values, `b[p * TILE_NR + j]` = B[p][j]); `c`
/// holds the tile's rows (at most `TILE_MR`), updated at columns `j0..j0 + nr`. Rows of
/// the panels past `c.len()` and columns past `nr` are computed and dropped (pad them with
/// anything finite or not: lanes are independent). The sums run over p in order, per
/// element, in registers; C is read and written once, or (`overwrite`) written only.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_tile_packed(
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [&mut [f32]],
    j0: usize,
    nr: usize,
    overwrite: bool,
) {
    assert!(a.len() >= kc * TILE_MR && b.len() >= kc * TILE_NR, "gemm_tile_packed: panels too short");
    assert!(c.len() <= TILE_MR && nr <= TILE_NR, "gemm_tile_packed: tile too large");
    assert!(c.iter().all(|r| r.len() >= j0 + nr), "gemm_tile_packed: C rows too short");
    if nr == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected on this CPU; the asserts above are the kernel's
        // bounds.
        unsafe {
            x86::tile_packed_avx512::<TILE_MR, { TILE_NR / 16 }>(kc, a, b, c, j0, nr, overwrite)
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx2 {
        #[allow(unsafe_code)]
        // SAFETY: AVX2 and FMA were detected on this CPU; the asserts above are the kernel's
        // bounds.
        unsafe {
            x86::tile_packed_avx2(kc, a, b, c, j0, nr, overwrite)
        };
        return;
    }
    for (i, row) in c.iter_mut().enumerate() {
        for (j, out) in row[j0..j0 + nr].iter_mut().enumerate() {
            let mut s = 0f32;
            for p in 0..kc {
                s = a[p * TILE_MR + i].mul_add(b[p * TILE_NR + j], s);
            }
            *out = if overwrite { s } else { *out + s };
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    /// K steps ahead that [`tile_packed_avx512`] prefetches B.
    const B_AHEAD: usize = 8;

    /// [`super::gemm_tile_packed`] after its checks, for R rows of NV vectors.
    ///
    /// # Safety
    /// The CPU must support AVX-512F (the bounds are asserted here).
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile_packed_avx512<const R: usize, const NV: usize>(
        kc: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [&mut [f32]],
        j0: usize,
        nr: usize,
        overwrite: bool,
    ) {
        // The bounds every access below relies on.
        assert!(a.len() >= kc * R && b.len() >= kc * NV * 16 && c.len() <= R && nr <= NV * 16);
        assert!(c.iter().all(|r| r.len() >= j0 + nr));
        // C comes from L3 or memory: its lines are requested now and used after the sums.
        for row in c.iter() {
            if nr > 0 && !overwrite {
                _mm_prefetch::<_MM_HINT_T0>(row[j0..].as_ptr().cast());
                _mm_prefetch::<_MM_HINT_T0>(row[j0 + nr - 1..].as_ptr().cast());
            }
        }
        let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        for _ in 0..kc {
            // B lines a few steps ahead into L1 (a prefetch never faults; past the panel it
            // fetches whatever follows).
            for v in 0..NV {
                _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(16 * NV * B_AHEAD + 16 * v).cast());
            }
            // SAFETY: step p (0..kc) reads a[p R..p R + R] and b[p 16 NV..(p + 1) 16 NV],
            // inside the panels (asserted); the pointers advance by one step each pass.
            unsafe {
                let bv: [__m512; NV] = std::array::from_fn(|v| _mm512_loadu_ps(bp.add(16 * v)));
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ap.add(i));
                    for (x, &bvv) in row.iter_mut().zip(&bv) {
                        *x = _mm512_fmadd_ps(av, bvv, *x);
                    }
                }
                ap = ap.add(R);
                bp = bp.add(16 * NV);
            }
        }
        // SAFETY: AVX-512F (this function's contract); the row bounds were asserted above.
        unsafe { store_tile(&acc, c, j0, nr, overwrite) };
    }

    /// [`super::gemm_tile_packed`] on AVX2 (16 registers): the 12 x 32 tile as four
    /// sub-tiles of 6 rows x 16 columns (12 accumulators, two B vectors, one broadcast),
    /// each a pass over the panels (they stay in L1); sub-tiles wholly past the tile's rows
    /// or columns are skipped.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA (the bounds are asserted here).
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_packed_avx2(
        kc: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [&mut [f32]],
        j0: usize,
        nr: usize,
        overwrite: bool,
    ) {
        const R: usize = 6;
        const MR: usize = super::TILE_MR;
        const NR: usize = super::TILE_NR;
        // The bounds every access below relies on.
        assert!(a.len() >= kc * MR && b.len() >= kc * NR && c.len() <= MR && nr <= NR);
        assert!(c.iter().all(|r| r.len() >= j0 + nr));
        for r0 in (0..c.len()).step_by(R) {
            for c0 in (0..nr).step_by(16) {
                let mut acc = [[_mm256_setzero_ps(); 2]; R];
                let (mut ap, mut bp) = (a.as_ptr().wrapping_add(r0), b.as_ptr().wrapping_add(c0));
                for _ in 0..kc {
                    // SAFETY: step p (0..kc) reads a[p MR + r0..+R] (r0 + R <= MR) and
                    // b[p NR + c0..+16] (c0 + 16 <= NR), inside the panels (asserted); the
                    // pointers advance by one step each pass.
                    unsafe {
                        let (b0, b1) = (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)));
                        for (i, row) in acc.iter_mut().enumerate() {
                            let av = _mm256_broadcast_ss(&*ap.add(i));
                            row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                            row[1] = _mm256_fmadd_ps(av, b1, row[1]);
                        }
                    }
                    ap = ap.wrapping_add(MR);
                    bp = bp.wrapping_add(NR);
                }
                let lanes = (nr - c0).min(16);
                for (i, sums) in acc.iter().enumerate() {
                    let Some(row) = c.get_mut(r0 + i) else { break };
                    if lanes == 16 {
                        let dst = &mut row[j0 + c0..j0 + c0 + 16];
                        let p = dst.as_mut_ptr();
                        // SAFETY: `dst` holds 16 floats (sliced above).
                        unsafe {
                            let (mut s0, mut s1) = (sums[0], sums[1]);
                            if !overwrite {
                                s0 = _mm256_add_ps(s0, _mm256_loadu_ps(p));
                                s1 = _mm256_add_ps(s1, _mm256_loadu_ps(p.add(8)));
                            }
                            _mm256_storeu_ps(p, s0);
                            _mm256_storeu_ps(p.add(8), s1);
                        }
                        continue;
                    }
                    let mut tmp = [0f32; 16];
                    // SAFETY: `tmp` holds 16 floats.
                    unsafe {
                        _mm256_storeu_ps(tmp.as_mut_ptr(), sums[0]);
                        _mm256_storeu_ps(tmp.as_mut_ptr().add(8), sums[1]);
                    }
                    let dst = &mut row[j0 + c0..j0 + c0 + lanes];
                    if overwrite {
                        dst.copy_from_slice(&tmp[..lanes]);
                    } else {
                        dst.iter_mut().zip(&tmp).for_each(|(d, &s)| *d += s);
                    }
                }
            }
        }
    }

    /// Writes (`overwrite`) or adds the sums of a tile into columns `j0..j0 + nr` of its
    /// rows (at most R), lanes past `nr` masked off.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; every row of `c` must hold `j0 + nr` elements.
    #[allow(unsafe_code)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::simd) unsafe fn store_tile<const R: usize, const NV: usize>(
        acc: &[[__m512; NV]; R],
        c: &mut [&mut [f32]],
        j0: usize,
        nr: usize,
        overwrite: bool,
    ) {
        // Constant indices only (a dynamic index would keep `acc` in memory).
        for (i, sums) in acc.iter().enumerate() {
            let Some(row) = c.get_mut(i) else { break };
            let cp = row.as_mut_ptr();
            for (v, &x) in sums.iter().enumerate() {
                let lanes = nr.saturating_sub(16 * v).min(16);
                let mk: u16 = if lanes == 16 { 0xFFFF } else { (1u16 << lanes) - 1 };
                // SAFETY: the lanes j0 + 16 v.. + lanes <= j0 + nr lie inside the row
                // (caller); masked-off lanes are not accessed.
                unsafe {
                    let p = cp.add(j0 + 16 * v);
                    let sum = if overwrite { x } else { _mm512_add_ps(_mm512_maskz_loadu_ps(mk, p), x) };
                    _mm512_mask_storeu_ps(p, mk, sum);
                }
            }
        }
    }
}
