//! Prefill GEMM: `matrixmultiply::sgemm` on strided f32 views, or the cache-blocked
//! [`packed`](super::packed) GEMM on AVX-512; other weight dtypes through f32 panels.

use super::packed::{self, BSrc};
use super::view::F32View;
use super::weights::Weights;
use crate::simd;
use layerzero_core::exec::executor::KernelError;
use layerzero_core::tensor::Storage;

/// Elements of one converted f32 weight panel (16 MiB).
const PANEL_ELEMS: usize = 1 << 22;

/// `C = A . B + beta * C` with A [m, k] and B [k, n] f32 views and C [m, n] at the start of
/// `c` with row stride `ldc` and unit column stride.
pub(crate) fn sgemm(a: F32View, b: F32View, beta: f32, c: &mut [f32], ldc: usize) -> Result<(), KernelError> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k {
        return Err(KernelError::Failed(format!("sgemm: A is {m}x{k} but B is {}x{n}", b.rows)));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let c_need = (m - 1).checked_mul(ldc).and_then(|x| x.checked_add(n));
    if !(ldc >= n && c_need.is_some_and(|need| need <= c.len())) {
        return Err(KernelError::Failed(format!("sgemm: C of {} elements cannot hold {m}x{n} rows of {ldc}", c.len())));
    }
    if k == 0 {
        for r in 0..m {
            let row = &mut c[r * ldc..r * ldc + n];
            if beta == 0.0 {
                row.fill(0.0);
            } else {
                row.iter_mut().for_each(|v| *v *= beta);
            }
        }
        return Ok(());
    }
    if !(a.in_bounds() && b.in_bounds()) {
        return Err(KernelError::Failed("sgemm: an operand view reaches past its data".to_owned()));
    }
    if use_packed(k, n) {
        packed_gemm(a, BSrc::F32(b), beta, c, ldc);
        return Ok(());
    }
    // A dim of one never steps its stride; 0 keeps the arithmetic trivially in range.
    let stride = |len: usize, s: usize| -> Result<isize, KernelError> {
        if len <= 1 { Ok(0) } else { isize::try_from(s).map_err(|_| KernelError::Failed(format!("sgemm: stride {s}"))) }
    };
    let (rsa, csa) = (stride(m, a.rs)?, stride(k, a.cs)?);
    let (rsb, csb) = (stride(k, b.rs)?, stride(n, b.cs)?);
    let rsc = stride(m, ldc)?;
    let (pa, pb) = (a.data[a.off..].as_ptr(), b.data[b.off..].as_ptr());
    #[allow(unsafe_code)]
    // SAFETY: every element A and B reach (off + r*rs + c*cs for r, c inside the dims) lies
    // inside their slices (`in_bounds`, checked without overflow); C's m x n elements at
    // r*ldc + c lie inside `c` (checked) and do not alias each other (unit column stride,
    // ldc >= n); A and B are shared borrows and C an exclusive one, so nothing overlaps.
    unsafe {
        matrixmultiply::sgemm(m, k, n, 1.0, pa, rsa, csa, pb, rsb, csb, beta, c.as_mut_ptr(), rsc, 1);
    }
    Ok(())
}

/// [`packed::gemm`] with `beta` (C checked by the caller).
fn packed_gemm(a: F32View, b: BSrc, beta: f32, c: &mut [f32], ldc: usize) {
    let n = b.cols();
    if beta != 0.0 && beta != 1.0 {
        for r in 0..a.rows {
            c[r * ldc..r * ldc + n].iter_mut().for_each(|v| *v *= beta);
        }
    }
    // beta = 0: the first K block overwrites C (never read: NaN in C does not leak, and
    // the pages of a new output are first touched by the parallel tasks' writes).
    packed::gemm(a, b, c, ldc, beta != 0.0);
}

/// True when the cache-blocked GEMM ([`packed`]) runs instead of `matrixmultiply`: on
/// AVX-512 and AVX2 CPUs for all but tiny K or N (AVX-512, 512 x 4096 x 4096: 1.5-1.7x
/// faster; M = 16 and 32 x 4096 x 4096: about 2x; the MLP's f32 chain and fused kernels
/// 1.2-2x).
fn use_packed(k: usize, n: usize) -> bool {
    simd::level() != simd::Level::Portable && k >= 16 && n >= 16
}

/// `C = x . B + beta * C` for an f32 x [M, K] and any B; C [M, N] with row stride `ldc`.
pub(crate) fn gemm(x: F32View, w: &Weights, beta: f32, c: &mut [f32], ldc: usize) -> Result<(), KernelError> {
    if let Weights::Dense(b) = w
        && let Some(bv) = b.as_f32()
    {
        return sgemm(x, bv, beta, c, ldc);
    }
    let (k, n) = (w.k(), w.n());
    // A bf16 NT weight (contiguous rows) widens as the packed GEMM packs it: one pass.
    if let Weights::Dense(b) = w
        && let Storage::BF16(v) = b.st
        && (b.rs == 1 || k <= 1)
        && use_packed(k, n)
        && x.rows > 0
        && x.in_bounds()
        && c.len() >= (x.rows - 1) * ldc + n
        && ldc >= n
        && v.get(b.off + (n - 1) * b.cs..b.off + (n - 1) * b.cs + k).is_some()
    {
        packed_gemm(x, BSrc::Bf16Rows { data: v, off: b.off, ld: b.cs, n }, beta, c, ldc);
        return Ok(());
    }
    // A 4-bit weight decodes as the packed GEMM packs it, a K block at a time: one pass.
    if let Weights::Int4(q) = w
        && packed::takes_int4(q)
        && use_packed(k, n)
        && x.rows > 0
        && x.in_bounds()
        && c.len() >= (x.rows - 1) * ldc + n
        && ldc >= n
    {
        packed_gemm(x, BSrc::Int4(*q), beta, c, ldc);
        return Ok(());
    }
    let nb = (PANEL_ELEMS / k.max(1)).clamp(16, n.max(16));
    let mut buf = Vec::new();
    let mut n0 = 0;
    while n0 < n {
        let width = nb.min(n - n0);
        let (rs, cs) = w.panel(n0, width, &mut buf);
        let pv = F32View { data: &buf, off: 0, rows: k, cols: width, rs, cs };
        sgemm(x, pv, beta, &mut c[n0..], ldc)?;
        n0 += width;
    }
    Ok(())
}
