//! `C (+)= A . B` for bf16 operands in the AMX operand layout (A row-major bf16, B in
//! 64-column panels of u32 pairs), on AMX where it is usable and on `vdpbf16ps` (AVX512_BF16)
//! otherwise: one packing serves both, so a kernel built on AMX tiles (attention's two tile
//! products) runs on a Zen 4 or a Cooper Lake with the same operands. Products of bf16 pairs
//! are exact in f32 and summed in f32 either way (the summation order differs).

use super::{AMX_PANEL, amx_bf16, avx512_bf16, bf16_pairs_fast, gemm_amx_bf16};

/// True when [`gemm_bf16_panels`] outruns widening to f32 on this CPU: AMX, or bf16 pairs
/// measured fast ([`bf16_pairs_fast`]).
pub(crate) fn bf16_panels() -> bool {
    amx_bf16() || bf16_pairs_fast() || forced()
}

/// Tests: the `vdpbf16ps` path taken where AVX512_BF16 exists even when AMX or widening
/// would be, so that one machine checks both (results stay correct for any test that runs
/// meanwhile: both paths sum exact products in f32).
#[cfg(test)]
pub(crate) fn force_bf16_pairs(on: bool) {
    FORCE.store(on, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(test)]
static FORCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn forced() -> bool {
    #[cfg(test)]
    {
        FORCE.load(std::sync::atomic::Ordering::Relaxed) && avx512_bf16()
    }
    #[cfg(not(test))]
    {
        false
    }
}

/// `C (+)= A . B`: A is row-major bf16 bits, `m` rows of `lda` elements (the first `2 * k2`
/// used); B is in [`AMX_PANEL`]-column panels, panel `q` at `b[q * pstride..]` holding `k2`
/// rows of `AMX_PANEL` u32 pairs (low half: B[2p][n], high: B[2p+1][n]); C is f32 with `ldc`.
/// `m`, `n` and `k2` must be multiples of 16 (as for AMX). Only callable when the CPU has
/// AVX512_BF16 (fast where [`bf16_panels`] is true).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_bf16_panels(
    m: usize,
    n: usize,
    k2: usize,
    a: &[u16],
    lda: usize,
    b: &[u32],
    pstride: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    if amx_bf16() && !forced() {
        gemm_amx_bf16(m, n, k2, a, lda, b, pstride, c, ldc, accumulate);
        return;
    }
    assert!(avx512_bf16(), "gemm_bf16_panels needs AMX or AVX512_BF16");
    if !super::amx::panel_operands("gemm_bf16_panels", m, n, k2, a, lda, b, pstride, c, ldc, accumulate) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(unsafe_code)]
        // SAFETY: AVX512_BF16 (with AVX-512F/BW/VL) was detected; the operand bounds the
        // kernel relies on were asserted above.
        unsafe {
            x86::gemm(m, n, k2, a, lda, b, pstride, c, ldc, accumulate)
        };
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::AMX_PANEL;

    /// Rows of a register tile (each row's pair is broadcast once per step).
    const MR: usize = 8;

    /// [`super::gemm_bf16_panels`] after its checks: register tiles of 8 rows x 32 columns
    /// (16 columns at a panel's edge), 16 or 8 accumulators, walking all of K per tile (the
    /// B panel's k2 rows stay in L1/L2 across the row tiles of one column block).
    ///
    /// # Safety
    /// AVX-512F/BW/VL and AVX512_BF16; m, n, k2 multiples of 16; A holds m rows of
    /// lda >= 2 k2 elements, B every panel up to column n (k2 rows of `AMX_PANEL` at
    /// `pstride`), C m rows of ldc >= n.
    #[allow(clippy::too_many_arguments)]
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
    pub(super) unsafe fn gemm(
        m: usize,
        n: usize,
        k2: usize,
        a: &[u16],
        lda: usize,
        b: &[u32],
        pstride: usize,
        c: &mut [f32],
        ldc: usize,
        acc: bool,
    ) {
        let mut j = 0;
        while j < n {
            let panel = &b[(j / AMX_PANEL) * pstride..];
            let col = j % AMX_PANEL;
            let two = j + 32 <= n && col + 32 <= AMX_PANEL;
            for r in (0..m).step_by(MR) {
                // SAFETY: rows r..r + 8 <= m (m is a multiple of 16), columns j..j + 16 or
                // j + 32 <= n inside one panel, every pair row p < k2 (the caller's bounds).
                unsafe {
                    if two {
                        tile::<2>(k2, &a[r * lda..], lda, &panel[col..], &mut c[r * ldc + j..], ldc, acc);
                    } else {
                        tile::<1>(k2, &a[r * lda..], lda, &panel[col..], &mut c[r * ldc + j..], ldc, acc);
                    }
                }
            }
            j += if two { 32 } else { 16 };
        }
    }

    /// One tile of `MR` rows x `16 NV` columns: `a` from the tile's first row, `b` from its
    /// first column within the panel (row stride `AMX_PANEL`), `c` from its first element.
    ///
    /// # Safety
    /// AVX-512F/BW and AVX512_BF16; `a` holds `MR` rows of `lda >= 2 k2`, `b` `k2` rows of
    /// `AMX_PANEL` with `16 NV` columns from its start, `c` `MR` rows of `ldc >= 16 NV`.
    #[allow(unsafe_code)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
    unsafe fn tile<const NV: usize>(
        k2: usize,
        a: &[u16],
        lda: usize,
        b: &[u32],
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
    ) {
        debug_assert!(a.len() >= (MR - 1) * lda + 2 * k2 && b.len() >= (k2 - 1) * AMX_PANEL + 16 * NV);
        debug_assert!(c.len() >= (MR - 1) * ldc + 16 * NV);
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let mut sum = [[_mm512_setzero_ps(); NV]; MR];
        if accumulate {
            for (i, row) in sum.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    // SAFETY: row i < MR, columns 16 v..16 v + 16 <= 16 NV (caller).
                    *x = unsafe { _mm512_loadu_ps(cp.add(i * ldc + 16 * v)) };
                }
            }
        }
        for p in 0..k2 {
            // SAFETY: pair row p < k2 of B (16 NV columns) and pair p of each A row, inside
            // the operands (caller); the broadcast reads one u32 (two bf16) of row i.
            unsafe {
                let bv: [__m512bh; NV] = std::array::from_fn(|v| {
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(bp.add(p * AMX_PANEL + 16 * v).cast()))
                });
                for (i, row) in sum.iter_mut().enumerate() {
                    let pair = ap.add(i * lda + 2 * p).cast::<i32>().read_unaligned();
                    let av = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair));
                    for (x, &bvv) in row.iter_mut().zip(&bv) {
                        *x = _mm512_dpbf16_ps(*x, av, bvv);
                    }
                }
            }
        }
        for (i, row) in sum.iter().enumerate() {
            for (v, x) in row.iter().enumerate() {
                // SAFETY: as for the loads above.
                unsafe { _mm512_storeu_ps(cp.add(i * ldc + 16 * v), *x) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 bits of small integers and halves: every product and partial sum is exact in f32.
    fn value(i: usize) -> f32 {
        ((i * 37 % 17) as f32 - 8.0) * 0.5
    }

    #[test]
    fn a_panel_product_matches_a_float64_product_on_whichever_bf16_unit_this_cpu_has() {
        if !avx512_bf16() {
            return;
        }
        let (m, n, k2) = (32, 80, 48);
        let (k, lda, ldc) = (2 * k2, 2 * k2 + 6, n + 3);
        let a: Vec<u16> = (0..m * lda).map(|i| half::bf16::from_f32(value(i)).to_bits()).collect();
        let bm: Vec<f32> = (0..k * n).map(|i| value(i * 3 + 1)).collect();
        let panels = n.div_ceil(AMX_PANEL);
        let pstride = k2 * AMX_PANEL + 5;
        let mut b = vec![0u32; panels * pstride];
        for p in 0..k2 {
            for j in 0..n {
                let lo = half::bf16::from_f32(bm[2 * p * n + j]).to_bits();
                let hi = half::bf16::from_f32(bm[(2 * p + 1) * n + j]).to_bits();
                b[(j / AMX_PANEL) * pstride + p * AMX_PANEL + j % AMX_PANEL] = u32::from(lo) | (u32::from(hi) << 16);
            }
        }
        // The dispatcher's own choice (AMX where this CPU has it), then vdpbf16ps forced.
        for (pairs, accumulate) in [(false, false), (false, true), (true, false), (true, true)] {
            force_bf16_pairs(pairs);
            let mut c = vec![1.0f32; m * ldc];
            gemm_bf16_panels(m, n, k2, &a, lda, &b, pstride, &mut c, ldc, accumulate);
            force_bf16_pairs(false);
            for i in 0..m {
                for j in 0..n {
                    let dot: f64 = (0..k).map(|q| f64::from(value(i * lda + q)) * f64::from(bm[q * n + j])).sum();
                    let want = dot + if accumulate { 1.0 } else { 0.0 };
                    assert_eq!(f64::from(c[i * ldc + j]), want, "row {i} column {j} accumulate {accumulate}");
                }
                assert!(c[i * ldc + n..(i + 1) * ldc].iter().all(|&x| x == 1.0), "row {i}: padding written");
            }
        }
    }
}
