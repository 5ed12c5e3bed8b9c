//! GEMM: C[m x n] (+)= A[m x k] . B[k x n], all row-major with leading dimensions, on
//! AVX-512 or AVX2 microkernels (portable loops elsewhere).

use super::{Level, level};

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gemm_portable(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    for i in 0..m {
        let crow = &mut c[i * ldc..i * ldc + n];
        if !accumulate {
            crow.fill(0.0);
        }
        if k == 0 {
            continue;
        }
        let arow = &a[i * lda..i * lda + k];
        for (p, &av) in arow.iter().enumerate() {
            let brow = &b[p * ldb..p * ldb + n];
            for (cv, &bv) in crow.iter_mut().zip(brow) {
                *cv += av * bv;
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn check_gemm(m: usize, n: usize, k: usize, a: &[f32], lda: usize, b: &[f32], ldb: usize, c: &[f32], ldc: usize) {
    assert!(m == 0 || n == 0 || c.len() >= (m - 1) * ldc + n, "gemm: C too short");
    assert!(m == 0 || k == 0 || a.len() >= (m - 1) * lda + k, "gemm: A too short");
    assert!(n == 0 || k == 0 || b.len() >= (k - 1) * ldb + n, "gemm: B too short");
    assert!(ldc >= n && (m <= 1 || lda >= k) && (k <= 1 || ldb >= n), "gemm: leading dimensions");
}

/// `C = A . B` (or `C += A . B` when `accumulate`); C is m x n, A m x k, B k x n, row-major
/// with leading dimensions `lda`, `ldb`, `ldc`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    check_gemm(m, n, k, a, lda, b, ldb, c, ldc);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * ldc..i * ldc + n].fill(0.0);
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    match level() {
        Level::Avx512 => {
            #[allow(unsafe_code)]
            // SAFETY: AVX-512F was detected on this CPU.
            unsafe {
                x86::gemm_avx512(m, n, k, a, lda, b, ldb, c, ldc, accumulate)
            };
            return;
        }
        Level::Avx2 => {
            #[allow(unsafe_code)]
            // SAFETY: AVX2 and FMA were detected on this CPU.
            unsafe {
                x86::gemm_avx2(m, n, k, a, lda, b, ldb, c, ldc, accumulate)
            };
            return;
        }
        Level::Portable => {}
    }
    gemm_portable(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

/// Columns per packed B panel of [`gemm_panels`].
pub(crate) const PANEL: usize = 64;

/// [`gemm`] with B packed as panels: columns `64q..64q+64` of B are the `k x 64` row-major
/// block at `b[q * pstride..]` (so each microkernel streams contiguous memory).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_panels(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    pstride: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let mut q = 0;
    while q * PANEL < n {
        let nw = (n - q * PANEL).min(PANEL);
        let bq = if k == 0 { &b[..0] } else { &b[q * pstride..] };
        gemm(m, nw, k, a, lda, bq, PANEL, &mut c[q * PANEL..], ldc, accumulate);
        q += 1;
    }
}

/// The portable GEMM (tests compare the microkernels with it).
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_reference(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    check_gemm(m, n, k, a, lda, b, ldb, c, ldc);
    gemm_portable(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Rows per microkernel.
    const MR: usize = 6;

    /// Dispatches (rows, vectors) to the monomorphized microkernel.
    macro_rules! by_shape {
        ($kern:ident, $mr:expr, $nv:expr, ($($args:expr),*)) => {
            match ($mr, $nv) {
                (6, 4) => $kern::<6, 4>($($args),*),
                (6, 3) => $kern::<6, 3>($($args),*),
                (6, 2) => $kern::<6, 2>($($args),*),
                (6, 1) => $kern::<6, 1>($($args),*),
                (5, 4) => $kern::<5, 4>($($args),*),
                (5, 3) => $kern::<5, 3>($($args),*),
                (5, 2) => $kern::<5, 2>($($args),*),
                (5, 1) => $kern::<5, 1>($($args),*),
                (4, 4) => $kern::<4, 4>($($args),*),
                (4, 3) => $kern::<4, 3>($($args),*),
                (4, 2) => $kern::<4, 2>($($args),*),
                (4, 1) => $kern::<4, 1>($($args),*),
                (3, 4) => $kern::<3, 4>($($args),*),
                (3, 3) => $kern::<3, 3>($($args),*),
                (3, 2) => $kern::<3, 2>($($args),*),
                (3, 1) => $kern::<3, 1>($($args),*),
                (2, 4) => $kern::<2, 4>($($args),*),
                (2, 3) => $kern::<2, 3>($($args),*),
                (2, 2) => $kern::<2, 2>($($args),*),
                (2, 1) => $kern::<2, 1>($($args),*),
                (1, 4) => $kern::<1, 4>($($args),*),
                (1, 3) => $kern::<1, 3>($($args),*),
                (1, 2) => $kern::<1, 2>($($args),*),
                _ => $kern::<1, 1>($($args),*),
            }
        };
    }

    /// Blocked driver over the AVX-512 microkernel (6 rows x up to 64 columns).
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[allow(unsafe_code)]
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gemm_avx512(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        acc: bool,
    ) {
        let mut nb = 0;
        while nb < n {
            let nw = (n - nb).min(64);
            let nv = nw.div_ceil(16);
            let rem = nw - (nv - 1) * 16;
            let mask: u16 = if rem == 16 { 0xFFFF } else { (1u16 << rem) - 1 };
            let mut rb = 0;
            while rb < m {
                let mr = (m - rb).min(MR);
                let (a_s, b_s, c_s) = (&a[rb * lda..], &b[nb..], &mut c[rb * ldc + nb..]);
                // SAFETY: AVX-512F is enabled here (this function's contract); the kernel
                // asserts its bounds.
                unsafe { by_shape!(micro_avx512, mr, nv, (k, a_s, lda, b_s, ldb, c_s, ldc, mask, acc)) };
                rb += mr;
            }
            nb += nw;
        }
    }

    /// C[MR x cols] (+)= A[MR x k] . B[k x cols], cols = (NV - 1) * 16 + popcount(mask).
    ///
    /// # Safety
    /// The CPU must support AVX-512F (the bounds are asserted here).
    #[allow(clippy::too_many_arguments)]
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    unsafe fn micro_avx512<const R: usize, const NV: usize>(
        k: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        mask: u16,
        acc: bool,
    ) {
        let tail = mask.count_ones() as usize;
        let cols = (NV - 1) * 16 + tail;
        // The mask must be a run of low bits so that only columns < cols are touched.
        assert!(tail > 0 && (u32::from(mask) + 1).is_power_of_two());
        assert!(k > 0 && a.len() >= (R - 1) * lda + k && b.len() >= (k - 1) * ldb + cols);
        assert!(c.len() >= (R - 1) * ldc + cols);
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let mut accs = [[_mm512_setzero_ps(); NV]; R];
        // SAFETY: the asserts above bound every access: A reads rows i < R at columns p < k;
        // B reads rows p < k at columns < cols (the last vector is masked to `tail` lanes and
        // masked-off lanes are not accessed); C reads and writes rows i < R, columns < cols.
        unsafe {
            if acc {
                for (i, row) in accs.iter_mut().enumerate() {
                    for (v, x) in row.iter_mut().enumerate() {
                        let mk = if v + 1 == NV { mask } else { 0xFFFF };
                        *x = _mm512_maskz_loadu_ps(mk, cp.add(i * ldc + v * 16));
                    }
                }
            }
            for p in 0..k {
                let mut bv = [_mm512_setzero_ps(); NV];
                for (v, x) in bv.iter_mut().enumerate() {
                    let mk = if v + 1 == NV { mask } else { 0xFFFF };
                    *x = _mm512_maskz_loadu_ps(mk, bp.add(p * ldb + v * 16));
                }
                for (i, row) in accs.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ap.add(i * lda + p));
                    for (x, &bvv) in row.iter_mut().zip(&bv) {
                        *x = _mm512_fmadd_ps(av, bvv, *x);
                    }
                }
            }
            for (i, row) in accs.iter().enumerate() {
                for (v, &x) in row.iter().enumerate() {
                    let mk = if v + 1 == NV { mask } else { 0xFFFF };
                    _mm512_mask_storeu_ps(cp.add(i * ldc + v * 16), mk, x);
                }
            }
        }
    }

    /// Blocked driver over the AVX2 microkernel (6 rows x up to 16 columns).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[allow(unsafe_code)]
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gemm_avx2(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        acc: bool,
    ) {
        let mut nb = 0;
        while nb < n {
            let nw = (n - nb).min(16);
            let nv = nw.div_ceil(8);
            let tail = nw - (nv - 1) * 8;
            let mut rb = 0;
            while rb < m {
                let mr = (m - rb).min(MR);
                let (a_s, b_s, c_s) = (&a[rb * lda..], &b[nb..], &mut c[rb * ldc + nb..]);
                // SAFETY: AVX2 and FMA are enabled here (this function's contract); the kernel
                // asserts its bounds.
                unsafe { by_shape!(micro_avx2, mr, nv, (k, a_s, lda, b_s, ldb, c_s, ldc, tail, acc)) };
                rb += mr;
            }
            nb += nw;
        }
    }

    /// C[MR x cols] (+)= A[MR x k] . B[k x cols], cols = (NV - 1) * 8 + tail.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA (the bounds are asserted here).
    #[allow(clippy::too_many_arguments)]
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn micro_avx2<const R: usize, const NV: usize>(
        k: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        tail: usize,
        acc: bool,
    ) {
        let cols = (NV - 1) * 8 + tail;
        assert!((1..=8).contains(&tail) && NV <= 2);
        assert!(k > 0 && a.len() >= (R - 1) * lda + k && b.len() >= (k - 1) * ldb + cols);
        assert!(c.len() >= (R - 1) * ldc + cols);
        let lanes: [i32; 8] = std::array::from_fn(|l| if l < tail { -1 } else { 0 });
        let full = tail == 8;
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let mut accs = [[_mm256_setzero_ps(); 2]; R];
        // SAFETY: the asserts above bound every access: A reads rows i < R at columns p < k;
        // B reads rows p < k at columns < cols (the last vector is a masked load touching only
        // `tail` lanes unless it is full); C reads and writes rows i < R, columns < cols.
        unsafe {
            let mk = _mm256_loadu_si256(lanes.as_ptr().cast());
            if acc {
                for (i, row) in accs.iter_mut().enumerate() {
                    for (v, x) in row.iter_mut().enumerate().take(NV) {
                        let src = cp.add(i * ldc + v * 8);
                        *x = if v + 1 == NV && !full { _mm256_maskload_ps(src, mk) } else { _mm256_loadu_ps(src) };
                    }
                }
            }
            for p in 0..k {
                let mut bv = [_mm256_setzero_ps(); 2];
                for (v, x) in bv.iter_mut().enumerate().take(NV) {
                    let src = bp.add(p * ldb + v * 8);
                    *x = if v + 1 == NV && !full { _mm256_maskload_ps(src, mk) } else { _mm256_loadu_ps(src) };
                }
                for (i, row) in accs.iter_mut().enumerate() {
                    let av = _mm256_set1_ps(*ap.add(i * lda + p));
                    for v in 0..NV {
                        row[v] = _mm256_fmadd_ps(av, bv[v], row[v]);
                    }
                }
            }
            for (i, row) in accs.iter().enumerate() {
                for (v, &x) in row.iter().enumerate().take(NV) {
                    let dst = cp.add(i * ldc + v * 8);
                    if v + 1 == NV && !full {
                        _mm256_maskstore_ps(dst, mk, x);
                    } else {
                        _mm256_storeu_ps(dst, x);
                    }
                }
            }
        }
    }
}
