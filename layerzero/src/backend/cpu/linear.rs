//! `linear`, `linear_w8a8` and `linear_int4` of the `cpu` backend.
//!
//! - Prefill (M > `GEMV_MAX_M` rows), AVX-512: a cache-blocked GEMM (`packed`: B packed
//!   per KC x NC block into 32-column panels, A into 12-row panels, a 12 x 32 register tile
//!   from `simd::gemm_tile_packed`, rayon tasks over column blocks).
//! - Prefill elsewhere (and tiny K or N): `matrixmultiply::sgemm` (its "threading" feature,
//!   `MATMUL_NUM_THREADS` threads) with the views' strides passed as they are.
//!   f16/bf16 weights (and int4 weights, dequantized) are converted to f32 panels of up to
//!   `PANEL_ELEMS` elements, one panel at a time, for either GEMM.
//! - Prefill with bf16 x and weight on a CPU with AMX: the `amx` tile GEMM below (the
//!   weight packed slab by slab into tile order, f32 sums, rounded once).
//! - Decode (M <= `GEMV_MAX_M`): a GEMV parallel over N (rayon) that reads every weight row
//!   once and dots it with the M activation rows, four rows per load of the weight (NT; f32
//!   and bf16 rows are read in place, bf16 widened in registers; others through one f32
//!   row), or sweeps the [K, N] weight once with axpy per column chunk (NN);
//!   bandwidth-bound on the weight bytes.
//! - `linear_w8a8`: exact i32 dot products (i64 across 64Ki-element chunks, so no K can
//!   overflow) parallel over weight-row chunks, then `(acc * xs) * ws + bias` in f32.
//!
//! Accumulation is f32 (the reference is f64); the output is rounded once to x's dtype.
//! `unsafe` here is the one `matrixmultiply::sgemm` call (preceded by the bounds checks that
//! make it sound) and calls of `#[target_feature]` kernels on CPUs that report the features.

use std::sync::Arc;

use half::{bf16, f16};
use rayon::prelude::*;

use super::pack::read_f32;
use super::simd;
use super::wrong_op;
use crate::exec::args::{Int4Args, LinearArgs, OpArgs, Outputs, W8a8Args};
use crate::exec::executor::{KernelError, Registry};
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::tensor::{HostTensor, Storage};

/// Linear kernel id.
pub(super) const LINEAR: &str = "cpu.linear.fast";
/// W8A8 kernel id.
pub(super) const W8A8: &str = "cpu.linear_w8a8.fast";
/// Int4 kernel id.
pub(super) const INT4: &str = "cpu.linear_int4.fast";

/// Up to this many rows a linear runs as a weight-streaming GEMV.
pub(super) const GEMV_MAX_M: usize = 8;
/// Elements of one converted f32 weight panel (16 MiB).
const PANEL_ELEMS: usize = 1 << 22;

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        LINEAR,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Linear(a) => linear(a).map(out),
            other => Err(wrong_op(LINEAR, other)),
        }),
    );
    registry.register(
        W8A8,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::LinearW8a8(a) => linear_w8a8(a).map(out),
            other => Err(wrong_op(W8A8, other)),
        }),
    );
    registry.register(
        INT4,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::LinearInt4(a) => linear_int4(a).map(out),
            other => Err(wrong_op(INT4, other)),
        }),
    );
}

fn out(t: HostTensor) -> Outputs {
    Outputs::from([("out".to_owned(), t)])
}

pub(super) fn invalid(msg: impl Into<String>) -> KernelError {
    KernelError::InvalidInput(msg.into())
}

// ---------------------------------------------------------------------------------------
// Views.

/// A 2-D view of a storage: element (r, c) at `off + r * rs + c * cs`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mat<'a> {
    pub st: &'a Storage,
    pub off: usize,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A rank-2 tensor as a matrix.
    pub(super) fn of(t: &'a HostTensor) -> Mat<'a> {
        let (sh, st) = (t.shape(), t.strides());
        Mat { st: t.storage(), off: t.offset(), rows: sh[0], cols: sh[1], rs: st[0], cs: st[1] }
    }

    /// Storage index of (r, c).
    #[inline]
    pub(super) fn at(&self, r: usize, c: usize) -> usize {
        self.off + r * self.rs + c * self.cs
    }

    /// The transposed view.
    pub(super) fn t(&self) -> Mat<'a> {
        Mat { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs, ..*self }
    }

    /// Columns `c0..c0 + n`.
    pub(super) fn cols(&self, c0: usize, n: usize) -> Mat<'a> {
        Mat { off: self.off + c0 * self.cs, cols: n, ..*self }
    }

    /// Rows `r0..r0 + n`.
    pub(super) fn rows(&self, r0: usize, n: usize) -> Mat<'a> {
        Mat { off: self.off + r0 * self.rs, rows: n, ..*self }
    }

    /// Reads row `r` as f32 (`out.len()` == cols).
    #[inline]
    pub(super) fn read_row(&self, r: usize, out: &mut [f32]) {
        read_f32(self.st, self.at(r, 0), self.cs, out);
    }

    /// Reads column `c` as f32 (`out.len()` == rows).
    #[inline]
    pub(super) fn read_col(&self, c: usize, out: &mut [f32]) {
        read_f32(self.st, self.at(0, c), self.rs, out);
    }

    /// Row `r` in place when it is stored as contiguous f32.
    #[inline]
    pub(super) fn f32_row(&self, r: usize) -> Option<&'a [f32]> {
        match self.st {
            Storage::F32(v) if self.cs == 1 || self.cols <= 1 => v.get(self.at(r, 0)..self.at(r, 0) + self.cols),
            _ => None,
        }
    }

    /// The f32 view when the storage is f32.
    pub(super) fn as_f32(&self) -> Option<F32View<'a>> {
        match self.st {
            Storage::F32(v) => {
                Some(F32View { data: v, off: self.off, rows: self.rows, cols: self.cols, rs: self.rs, cs: self.cs })
            }
            _ => None,
        }
    }

    /// A contiguous row-major f32 copy (parallel over rows).
    pub(super) fn to_f32(self) -> Vec<f32> {
        let mut v = vec![0f32; self.rows * self.cols];
        if self.cols > 0 {
            v.par_chunks_mut(self.cols).enumerate().for_each(|(r, row)| self.read_row(r, row));
        }
        v
    }
}

/// A 2-D view of f32 data (element (r, c) at `off + r * rs + c * cs`).
#[derive(Debug, Clone, Copy)]
pub(super) struct F32View<'a> {
    pub data: &'a [f32],
    pub off: usize,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> F32View<'a> {
    /// A contiguous row-major [rows, cols] matrix.
    pub(super) fn dense(data: &'a [f32], rows: usize, cols: usize) -> F32View<'a> {
        F32View { data, off: 0, rows, cols, rs: cols, cs: 1 }
    }

    /// Rows `r0..r0 + n`.
    pub(super) fn rows(&self, r0: usize, n: usize) -> F32View<'a> {
        F32View { off: self.off + r0 * self.rs, rows: n, ..*self }
    }

    /// The last storage index the view reaches (None when it overflows); views with a zero
    /// dim reach nothing.
    fn last(&self) -> Option<usize> {
        if self.rows == 0 || self.cols == 0 {
            return Some(0);
        }
        (self.rows - 1)
            .checked_mul(self.rs)
            .and_then(|a| (self.cols - 1).checked_mul(self.cs).and_then(|b| a.checked_add(b)))
            .and_then(|a| a.checked_add(self.off))
    }

    fn in_bounds(&self) -> bool {
        self.rows == 0 || self.cols == 0 || self.last().is_some_and(|l| l < self.data.len())
    }
}

/// The rows of x [..., K] as a matrix [M, K] (leading dims collapsed). A view whose
/// leading dims do not collapse to one stride is copied to a contiguous tensor first
/// (`holder` keeps the copy alive).
pub(super) fn rows_view<'a>(x: &'a HostTensor, holder: &'a mut Option<HostTensor>) -> Result<Mat<'a>, KernelError> {
    let Some((&k, lead)) = x.shape().split_last() else {
        return Err(invalid(format!("tensor `x` has shape {:?}; expected at least one dim [..., K]", x.shape())));
    };
    let m = lead
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| invalid(format!("tensor `x` shape {:?} overflows", x.shape())))?;
    let st = x.strides();
    // The stride of the collapsed leading dims, when they collapse.
    let mut rs = None;
    let mut expect = None;
    let mut ok = true;
    for d in (0..lead.len()).rev() {
        if lead[d] == 1 {
            continue;
        }
        match expect {
            None => rs = Some(st[d]),
            Some(e) if e == st[d] => {}
            Some(_) => ok = false,
        }
        expect = st[d].checked_mul(lead[d]);
        if expect.is_none() {
            ok = false;
        }
    }
    let cs = st.last().copied().unwrap_or(1);
    if ok {
        return Ok(Mat { st: x.storage(), off: x.offset(), rows: m, cols: k, rs: rs.unwrap_or(k), cs });
    }
    let c = holder.insert(x.contiguous());
    Ok(Mat { st: c.storage(), off: c.offset(), rows: m, cols: k, rs: k, cs: 1 })
}

// ---------------------------------------------------------------------------------------
// sgemm.

/// `C = A . B + beta * C` with A [m, k] and B [k, n] f32 views and C [m, n] at the start of
/// `c` with row stride `ldc` and unit column stride.
pub(super) fn sgemm(a: F32View, b: F32View, beta: f32, c: &mut [f32], ldc: usize) -> Result<(), KernelError> {
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
        if beta != 0.0 && beta != 1.0 {
            for r in 0..m {
                c[r * ldc..r * ldc + n].iter_mut().for_each(|v| *v *= beta);
            }
        }
        // beta = 0: the first K block overwrites C (never read: NaN in C does not leak, and
        // the pages of a new output are first touched by the parallel tasks' writes).
        packed::gemm(a, b, c, ldc, beta != 0.0);
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

/// True when the cache-blocked AVX-512 GEMM ([`packed`]) runs instead of `matrixmultiply`:
/// on AVX-512 CPUs for all but tiny K or N (measured on 512 x 4096 x 4096: 1.5-1.7x
/// faster; M = 16 and 32 x 4096 x 4096: about 2x; the MLP's f32 chain and fused kernels
/// 1.2-2x).
fn use_packed(k: usize, n: usize) -> bool {
    simd::level() == simd::Level::Avx512 && k >= 16 && n >= 16
}

/// A GotoBLAS-style f32 GEMM around the AVX-512 tile of [`simd::gemm_tile_packed`]
/// (`TILE_MR` x `TILE_NR` sums in registers over `KC` steps). A is packed once per call
/// into `TILE_MR`-row panels (parallel). The output columns are split into rayon tasks of
/// whole panels (about four per thread, so work stealing evens out a busy core; rows too
/// when N is narrow); each task owns its C row segments and, per `KC` block of K, packs its
/// B columns into `TILE_NR`-column panels (at most `NC` columns: a buffer that stays in
/// L2), then runs each B panel (KC x 32 floats, kept in L1) down a block of at most
/// `MC_TILES` row tiles, whose A panels stream from L2. Every B element is packed once per
/// call. Packing buffers are kept per thread between calls (see `KEEP_MAX`).
mod packed {
    use std::cell::Cell;
    use std::thread::LocalKey;

    use rayon::prelude::*;

    use super::super::alloc::Aligned;
    use super::super::simd::{self, TILE_MR as MR, TILE_NR as NR};
    use super::F32View;

    /// K steps per block (a B panel, KC x NR floats = 32 KiB, stays in L1).
    const KC: usize = 256;
    /// Columns per task at most: its packed B block (KC x NC floats, 256 KiB) and its C
    /// (512 KiB for 512 rows) stay in L2 with the A panels of a row block.
    const NC: usize = 256;
    /// Row tiles per block at most (their A panels, MC_TILES x MR x KC floats = 192 KiB).
    /// Measured on 512 x 4096 x 4096 with calls alternating between settings: 16 tiles and
    /// 256 columns ran 11% faster on two threads (8% on one) than 48 tiles and 1024.
    const MC_TILES: usize = 16;
    /// Panels per task at least.
    const MIN_PANELS: usize = 4;

    /// B [K, N] columns `j0..j0 + nc`, rows `p0..p0 + kc`, as panels of NR columns: panel q
    /// at `out[q * kc * NR..]`, `[p][j]` row-major; columns past `nc` are zero.
    fn pack_b(b: &F32View, p0: usize, kc: usize, j0: usize, nc: usize, out: &mut [f32]) {
        let panels = nc.div_ceil(NR);
        let out = &mut out[..panels * kc * NR];
        if !nc.is_multiple_of(NR) {
            out[(panels - 1) * kc * NR..].fill(0.0);
        }
        let d = b.data;
        if b.rs == 1 || kc == 1 {
            // NT weight: column j of B is a contiguous weight row; transposed into panels,
            // 16 x 16 blocks in registers, the edges element by element.
            let (kb, nb) = (kc / 16 * 16, nc / 16 * 16);
            for j in (0..nb).step_by(16) {
                let (q, jj) = (j / NR, j % NR);
                let panel = &mut out[q * kc * NR..(q + 1) * kc * NR];
                let at = b.off + p0 * b.rs + (j0 + j) * b.cs;
                for p in (0..kb).step_by(16) {
                    simd::transpose_16x16(&d[at + p..], b.cs, &mut panel[p * NR + jj..], NR);
                }
                for jx in j..j + 16 {
                    let at = b.off + p0 * b.rs + (j0 + jx) * b.cs;
                    for p in kb..kc {
                        panel[p * NR + jx % NR] = d[at + p];
                    }
                }
            }
            for j in nb..nc {
                let at = b.off + p0 * b.rs + (j0 + j) * b.cs;
                let src = &d[at..at + kc];
                let (q, jj) = (j / NR, j % NR);
                let panel = &mut out[q * kc * NR..(q + 1) * kc * NR];
                for (dst, &v) in panel.chunks_exact_mut(NR).zip(src) {
                    dst[jj] = v;
                }
            }
        } else {
            for (q, panel) in out.chunks_exact_mut(kc * NR).enumerate() {
                let w = NR.min(nc - q * NR);
                for (p, dst) in panel.chunks_exact_mut(NR).enumerate() {
                    let at = b.off + (p0 + p) * b.rs + (j0 + q * NR) * b.cs;
                    if b.cs == 1 || w == 1 {
                        dst[..w].copy_from_slice(&d[at..at + w]);
                    } else {
                        for (j, v) in dst[..w].iter_mut().enumerate() {
                            *v = d[at + j * b.cs];
                        }
                    }
                }
            }
        }
    }

    /// A [M, K] rows `i0..i0 + mr` as one panel: `out[p * MR + i]` (K steps); rows past
    /// `mr` are zero.
    fn pack_a(a: &F32View, i0: usize, mr: usize, out: &mut [f32]) {
        let kc = a.cols;
        let out = &mut out[..kc * MR];
        if mr < MR {
            out.fill(0.0);
        }
        for i in 0..mr {
            let at = a.off + (i0 + i) * a.rs;
            if a.cs == 1 || kc == 1 {
                for (dst, &v) in out.chunks_exact_mut(MR).zip(&a.data[at..at + kc]) {
                    dst[i] = v;
                }
            } else {
                for (p, dst) in out.chunks_exact_mut(MR).enumerate() {
                    dst[i] = a.data[at + p * a.cs];
                }
            }
        }
    }

    /// `C += A . B` (`accumulate`) or `C = A . B` for f32 views A [m, k], B [k, n] (in
    /// bounds, m, k, n > 0) and C's m rows of `ldc` at the start of `c` (checked by the
    /// caller).
    pub(super) fn gemm(a: F32View, b: F32View, c: &mut [f32], ldc: usize, accumulate: bool) {
        let (m, k, n) = (a.rows, a.cols, b.cols);
        // Tasks: column blocks of whole panels (at most NC wide, about 4 per thread, so that
        // work stealing evens out busy cores), and row blocks too when N is narrow.
        let want = 4 * rayon::current_num_threads().max(1);
        let panels = n.div_ceil(NR);
        let per_n = panels.div_ceil(want).clamp(MIN_PANELS, (NC / NR).max(1)).min(panels) * NR;
        let nt = n.div_ceil(per_n);
        let row_tiles = m.div_ceil(MR);
        let mt = want.div_ceil(nt).clamp(1, row_tiles);
        let per_m = row_tiles.div_ceil(mt) * MR;
        let mt = m.div_ceil(per_m);
        // A packed once: row tile t at `ap[t * k * MR..]`, its K steps of MR values.
        let mut ap_buf = scratch(&SCRATCH_A, row_tiles * k * MR);
        let ap = &mut ap_buf[..row_tiles * k * MR];
        ap.par_chunks_mut(k * MR).enumerate().for_each(|(t, out)| pack_a(&a, t * MR, MR.min(m - t * MR), out));
        let ap = &*ap;
        let mut tasks: Vec<Vec<&mut [f32]>> = (0..mt * nt).map(|_| Vec::new()).collect();
        for (r, row) in c.chunks_mut(ldc).take(m).enumerate() {
            for (s, seg) in row[..n].chunks_mut(per_n).enumerate() {
                tasks[(r / per_m) * nt + s].push(seg);
            }
        }
        let bp_len = KC.min(k) * per_n;
        tasks.into_par_iter().enumerate().for_each(|(t, mut rows)| {
            let mut bp_buf = scratch(&SCRATCH_B, bp_len);
            let bp = &mut bp_buf[..bp_len];
            let (r0, c0) = ((t / nt) * per_m, (t % nt) * per_n);
            let nc = rows.first().map_or(0, |r| r.len());
            for pc in (0..k).step_by(KC) {
                let kc = KC.min(k - pc);
                pack_b(&b, pc, kc, c0, nc, bp);
                // Row blocks of about MC_TILES tiles (their A panels stay in L2 while
                // each B panel, in L1, meets every tile of the block).
                let tiles = rows.len().div_ceil(MR);
                let per_block = tiles.div_ceil(tiles.div_ceil(MC_TILES)) * MR;
                for i0 in (0..rows.len()).step_by(per_block) {
                    let i1 = (i0 + per_block).min(rows.len());
                    for (q, jr) in (0..nc).step_by(NR).enumerate() {
                        let bq = &bp[q * kc * NR..(q + 1) * kc * NR];
                        for ir in (i0..i1).step_by(MR) {
                            let mr = MR.min(i1 - ir);
                            let at = ((r0 + ir) / MR * k + pc) * MR;
                            let at = &ap[at..at + kc * MR];
                            let tile = &mut rows[ir..ir + mr];
                            let overwrite = pc == 0 && !accumulate;
                            simd::gemm_tile_packed(kc, at, bq, tile, jr, NR.min(nc - jr), overwrite);
                        }
                    }
                }
            }
            keep(&SCRATCH_B, bp_buf);
        });
        keep(&SCRATCH_A, ap_buf);
    }

    thread_local! {
        /// Packing buffers kept between calls (no page faults per call): the packed A of
        /// the calling thread, the B block of each worker.
        static SCRATCH_A: Cell<Aligned<f32>> = Cell::default();
        static SCRATCH_B: Cell<Aligned<f32>> = Cell::default();
    }

    /// Buffers up to this many floats (32 MiB) are kept for the next call.
    const KEEP_MAX: usize = 1 << 23;

    /// This thread's buffer of `key` with at least `len` elements (contents unspecified;
    /// a nested call on the same thread finds it taken and gets a fresh one). Buffers start
    /// on cache lines: the microkernel's 64-byte loads of B would otherwise straddle two.
    fn scratch(key: &'static LocalKey<Cell<Aligned<f32>>>, len: usize) -> Aligned<f32> {
        let mut v = key.take();
        v.set_len(len);
        v
    }

    /// Returns a buffer of [`scratch`] to `key` (the larger one stays; none past KEEP_MAX).
    fn keep(key: &'static LocalKey<Cell<Aligned<f32>>>, v: Aligned<f32>) {
        if v.capacity() <= KEEP_MAX {
            let old = key.take();
            key.set(if old.capacity() > v.capacity() { old } else { v });
        }
    }
}

// ---------------------------------------------------------------------------------------
// Weights: the B operand [K, N] of `out = x . B`.

/// A weight-only int4 matrix: `w[n, k] = (q[n, k] - zero[n, k / g]) * scale[n, k / g]`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Int4W<'a> {
    /// Packed bytes [N, K/2] (i8 storage).
    packed: Mat<'a>,
    bytes: &'a [i8],
    scales: Mat<'a>,
    zeros: Option<Mat<'a>>,
    k: usize,
    g: usize,
}

impl Int4W<'_> {
    /// Dequantizes weight row `n` (length K) into `out`.
    fn row(&self, n: usize, out: &mut [f32]) {
        let groups = self.k / self.g;
        let mut sc = [0f32; 1];
        let mut zc = [8f32; 1];
        for gi in 0..groups {
            read_f32(self.scales.st, self.scales.at(n, gi), 1, &mut sc);
            if let Some(z) = &self.zeros {
                read_f32(z.st, z.at(n, gi), 1, &mut zc);
            }
            let (s, z) = (sc[0], zc[0]);
            // The 16 values of this group: (q - zero) * scale, exactly as element-wise.
            let lut: [f32; 16] = std::array::from_fn(|q| (q as f32 - z) * s);
            let dst = &mut out[gi * self.g..(gi + 1) * self.g];
            let b0 = gi * self.g / 2;
            for (j, pair) in dst.chunks_exact_mut(2).enumerate() {
                let b = self.bytes[self.packed.at(n, b0 + j)] as u8;
                pair[0] = lut[usize::from(b & 0x0F)];
                pair[1] = lut[usize::from(b >> 4)];
            }
        }
    }
}

/// The B operand of a linear: [K, N].
#[derive(Debug, Clone, Copy)]
pub(super) enum Weights<'a> {
    /// A dense view of any float dtype.
    Dense(Mat<'a>),
    /// Packed int4 (always read by output column, i.e. by weight row).
    Int4(Int4W<'a>),
}

impl Weights<'_> {
    fn k(&self) -> usize {
        match self {
            Weights::Dense(b) => b.rows,
            Weights::Int4(w) => w.k,
        }
    }

    fn n(&self) -> usize {
        match self {
            Weights::Dense(b) => b.cols,
            Weights::Int4(w) => w.packed.rows,
        }
    }

    /// True when B is read column by column (one weight row of K elements at a time).
    fn by_column(&self) -> bool {
        match self {
            Weights::Dense(b) => b.rs <= b.cs,
            Weights::Int4(_) => true,
        }
    }

    /// Column `n` of B (weight row n) as f32 into `out` (length K).
    fn read_col(&self, n: usize, out: &mut [f32]) {
        match self {
            Weights::Dense(b) => b.read_col(n, out),
            Weights::Int4(w) => w.row(n, out),
        }
    }

    /// Converts columns `n0..n0 + w` to an f32 panel: [w, K] (by column) or [K, w].
    fn panel(&self, n0: usize, w: usize, buf: &mut Vec<f32>) -> (usize, usize) {
        let k = self.k();
        buf.clear();
        buf.resize(k * w, 0.0);
        if self.by_column() {
            buf.par_chunks_mut(k).enumerate().for_each(|(j, col)| self.read_col(n0 + j, col));
            (1, k)
        } else {
            if let Weights::Dense(b) = self {
                let sub = b.cols(n0, w);
                buf.par_chunks_mut(w).enumerate().for_each(|(p, row)| sub.read_row(p, row));
            }
            (w, 1)
        }
    }
}

/// `C = x . B + beta * C` for an f32 x [M, K] and any B; C [M, N] with row stride `ldc`.
pub(super) fn gemm(x: F32View, w: &Weights, beta: f32, c: &mut [f32], ldc: usize) -> Result<(), KernelError> {
    if let Weights::Dense(b) = w
        && let Some(bv) = b.as_f32()
    {
        return sgemm(x, bv, beta, c, ldc);
    }
    let (k, n) = (w.k(), w.n());
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

/// A weight element the dot kernels widen to f32 as they load it.
pub(super) trait Widen: Copy + Send + Sync {
    /// The exact f32 value.
    fn widen(self) -> f32;
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Widen for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
}

#[inline(always)]
fn fma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { c + a * b }
}

#[inline(always)]
fn hsum16(mut a: [f32; 16]) -> f32 {
    for width in [8, 4, 2, 1] {
        for l in 0..width {
            a[l] += a[l + width];
        }
    }
    a[0]
}

/// `x . w` (equal lengths) with 64 independent f32 lanes.
#[inline(always)]
fn dot1<W: Widen, const FMA: bool>(x: &[f32], w: &[W]) -> f32 {
    const L: usize = 16;
    let (mut a0, mut a1, mut a2, mut a3) = ([0f32; L], [0f32; L], [0f32; L], [0f32; L]);
    let n = w.len().min(x.len()) / (4 * L) * (4 * L);
    for (wv, xv) in w[..n].chunks_exact(4 * L).zip(x[..n].chunks_exact(4 * L)) {
        for l in 0..L {
            a0[l] = fma::<FMA>(xv[l], wv[l].widen(), a0[l]);
            a1[l] = fma::<FMA>(xv[L + l], wv[L + l].widen(), a1[l]);
            a2[l] = fma::<FMA>(xv[2 * L + l], wv[2 * L + l].widen(), a2[l]);
            a3[l] = fma::<FMA>(xv[3 * L + l], wv[3 * L + l].widen(), a3[l]);
        }
    }
    for l in 0..L {
        a0[l] += (a1[l] + a2[l]) + a3[l];
    }
    let tail: f32 = x[n..].iter().zip(&w[n..]).map(|(p, q)| p * q.widen()).sum();
    hsum16(a0) + tail
}

/// Four rows dotted with one `w`: each 16-lane slice of `w` is loaded once for the four.
#[inline(always)]
fn dot4<W: Widen, const FMA: bool>(x: [&[f32]; 4], w: &[W]) -> [f32; 4] {
    const L: usize = 16;
    let (mut a0, mut a1, mut a2, mut a3) = ([0f32; L], [0f32; L], [0f32; L], [0f32; L]);
    let len = x.iter().fold(w.len(), |m, r| m.min(r.len()));
    let n = len / L * L;
    let rows = w[..n]
        .chunks_exact(L)
        .zip(x[0][..n].chunks_exact(L))
        .zip(x[1][..n].chunks_exact(L))
        .zip(x[2][..n].chunks_exact(L))
        .zip(x[3][..n].chunks_exact(L));
    for ((((wv, x0), x1), x2), x3) in rows {
        for l in 0..L {
            let v = wv[l].widen();
            a0[l] = fma::<FMA>(x0[l], v, a0[l]);
            a1[l] = fma::<FMA>(x1[l], v, a1[l]);
            a2[l] = fma::<FMA>(x2[l], v, a2[l]);
            a3[l] = fma::<FMA>(x3[l], v, a3[l]);
        }
    }
    let mut out = [0f32; 4];
    for (r, a) in [a0, a1, a2, a3].into_iter().enumerate() {
        let tail: f32 = x[r][n..len].iter().zip(&w[n..len]).map(|(p, q)| p * q.widen()).sum();
        out[r] = hsum16(a) + tail;
    }
    out
}

#[inline(always)]
fn dots_rows_impl<W: Widen, const FMA: bool>(x: &[f32], k: usize, w: &[W], out: &mut [f32]) {
    let w = &w[..k];
    let row = |r: usize| &x[r * k..(r + 1) * k];
    let mut r = 0;
    while r + 4 <= out.len() {
        out[r..r + 4].copy_from_slice(&dot4::<W, FMA>([row(r), row(r + 1), row(r + 2), row(r + 3)], w));
        r += 4;
    }
    while r < out.len() {
        out[r] = dot1::<W, FMA>(row(r), w);
        r += 1;
    }
}

/// `out[r] = x[r * k..(r + 1) * k] . w` for every r < `out.len()` (x holds that many rows
/// of length k, w at least k elements), loading `w` once per four rows.
pub(super) fn dots_rows<W: Widen>(x: &[f32], k: usize, w: &[W], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
        fn with_avx512<W: Widen>(x: &[f32], k: usize, w: &[W], out: &mut [f32]) {
            dots_rows_impl::<W, true>(x, k, w, out);
        }
        #[target_feature(enable = "avx2,fma")]
        fn with_avx2<W: Widen>(x: &[f32], k: usize, w: &[W], out: &mut [f32]) {
            dots_rows_impl::<W, true>(x, k, w, out);
        }
        match simd::level() {
            simd::Level::Avx512 => {
                #[allow(unsafe_code)]
                // SAFETY: `level()` is Avx512 only when the CPU reports AVX-512F/VL, AVX2 and FMA.
                unsafe {
                    with_avx512(x, k, w, out)
                };
                return;
            }
            simd::Level::Avx2 => {
                #[allow(unsafe_code)]
                // SAFETY: `level()` is Avx2 only when the CPU reports AVX2 and FMA.
                unsafe {
                    with_avx2(x, k, w, out)
                };
                return;
            }
            simd::Level::Portable => {}
        }
    }
    dots_rows_impl::<W, false>(x, k, w, out);
}

/// `out[i] = x_i . w[r, :]` for the rows x_i of `x` (each `w.cols` long): a contiguous f32
/// or bf16 row is read in place (bf16 widened as it is loaded), any other through
/// `scratch` (at least `w.cols` long).
pub(super) fn dots_mat_row(x: &[f32], w: &Mat, r: usize, scratch: &mut [f32], out: &mut [f32]) {
    let (k, at) = (w.cols, w.at(r, 0));
    if w.cs == 1 || k <= 1 {
        match w.st {
            Storage::F32(v) if at + k <= v.len() => return dots_rows(x, k, &v[at..at + k], out),
            Storage::BF16(v) if at + k <= v.len() => return dots_rows(x, k, &v[at..at + k], out),
            _ => {}
        }
    }
    w.read_row(r, &mut scratch[..k]);
    dots_rows(x, k, &scratch[..k], out);
}

/// Column ranges splitting `n` for a parallel sweep (about 8 per thread, at least `min`).
pub(super) fn chunks(n: usize, min: usize) -> Vec<(usize, usize)> {
    let target = rayon::current_num_threads().max(1) * 8;
    let size = n.div_ceil(target).max(min).max(1);
    (0..n).step_by(size).map(|n0| (n0, size.min(n - n0))).collect()
}

/// `C [M, N] = x [M, K] . B` for a few rows: every weight element is read once.
fn gemv(x: &[f32], m: usize, w: &Weights, c: &mut [f32]) {
    let (k, n) = (w.k(), w.n());
    let parts: Vec<Vec<f32>> = chunks(n, 16)
        .into_par_iter()
        .map(|(n0, nb)| {
            let mut part = vec![0f32; m * nb];
            let mut scratch = vec![0f32; k];
            if w.by_column() {
                // part is [nb, m]: one weight row dotted with every x row.
                for j in 0..nb {
                    let out = &mut part[j * m..(j + 1) * m];
                    match w {
                        Weights::Dense(b) => dots_mat_row(x, &b.t(), n0 + j, &mut scratch, out),
                        Weights::Int4(q) => {
                            q.row(n0 + j, &mut scratch);
                            dots_rows(x, k, &scratch, out);
                        }
                    }
                }
            } else if let Weights::Dense(b) = w {
                // part is [m, nb]: the weight rows' segments, each read once, axpy'd in.
                let sub = b.cols(n0, nb);
                let mut seg = vec![0f32; nb];
                for p in 0..k {
                    let row = match sub.f32_row(p) {
                        Some(r) => r,
                        None => {
                            sub.read_row(p, &mut seg);
                            &seg
                        }
                    };
                    for i in 0..m {
                        simd::axpy(&mut part[i * nb..(i + 1) * nb], x[i * k + p], row);
                    }
                }
            }
            part
        })
        .collect();
    let by_col = w.by_column();
    for ((n0, nb), part) in chunks(n, 16).into_iter().zip(parts) {
        for i in 0..m {
            for j in 0..nb {
                c[i * n + n0 + j] = if by_col { part[j * m + i] } else { part[i * nb + j] };
            }
        }
    }
}

/// `x [M, K] . B + bias` in f32, as a contiguous [M, N] vector.
pub(super) fn linear_f32(x: &Mat, w: &Weights, bias: Option<&[f32]>) -> Result<Vec<f32>, KernelError> {
    let (m, k, n) = (x.rows, w.k(), w.n());
    let len = m.checked_mul(n).ok_or_else(|| invalid(format!("the output [{m}, {n}] overflows")))?;
    let mut c = super::alloc::huge(vec![0f32; len]);
    if len == 0 {
        return Ok(c);
    }
    if k == 0 {
        // Nothing to sum; bias below.
    } else if m <= GEMV_MAX_M {
        let xf = x.to_f32();
        gemv(&xf, m, w, &mut c);
    } else {
        let owned;
        let xv = match x.as_f32() {
            Some(v) => v,
            None => {
                owned = x.to_f32();
                F32View::dense(&owned, m, k)
            }
        };
        let beta = match bias {
            Some(b) => {
                c.par_chunks_mut(n).for_each(|row| row.copy_from_slice(b));
                1.0
            }
            None => 0.0,
        };
        gemm(xv, w, beta, &mut c, n)?;
        return Ok(c);
    }
    if let Some(b) = bias {
        c.par_chunks_mut(n).for_each(|row| row.iter_mut().zip(b).for_each(|(v, b)| *v += b));
    }
    Ok(c)
}

/// An f32 result as a contiguous tensor of `dtype` (rounded once).
pub(super) fn to_tensor(dtype: DType, shape: &[usize], v: Vec<f32>) -> Result<HostTensor, KernelError> {
    let storage = match dtype {
        DType::F32 => Storage::F32(v),
        DType::F16 => Storage::F16(v.par_iter().map(|&x| f16::from_f32(x)).collect()),
        DType::BF16 => Storage::BF16(v.par_iter().map(|&x| bf16::from_f32(x)).collect()),
        other => Storage::from_f32(other, &v),
    };
    HostTensor::new(storage, shape).map_err(|e| KernelError::Failed(format!("building the output: {e}")))
}

// ---------------------------------------------------------------------------------------
// Checks (the same rules as the reference backend's).

/// f32, f16 or bf16; other floats are outside what these kernels declare.
pub(super) fn expect_dense_float(name: &str, t: &HostTensor) -> Result<(), KernelError> {
    match t.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        d if d.is_float() => Err(KernelError::Unsupported(format!(
            "tensor `{name}` has dtype {d}; this kernel computes f32, f16 or bf16"
        ))),
        d => Err(invalid(format!("tensor `{name}` has dtype {d}; expected f32, f16 or bf16"))),
    }
}

fn check_bias(bias: Option<&HostTensor>, n: usize) -> Result<Option<Vec<f32>>, KernelError> {
    let Some(b) = bias else { return Ok(None) };
    if !b.dtype().is_float() {
        return Err(invalid(format!("tensor `bias` has dtype {}; expected a float dtype", b.dtype())));
    }
    if b.shape() != [n] {
        return Err(invalid(format!("tensor `bias` has shape {:?}; expected [N] = [{n}]", b.shape())));
    }
    Ok(Some(b.to_f32_vec()))
}

/// The weight of `linear` as B [K, N] (NT [N, K] transposed, NN as is), checked against K.
pub(super) fn weight_b<'a>(name: &str, w: &'a HostTensor, k: usize) -> Result<Mat<'a>, KernelError> {
    let nn = match w.layout() {
        None | Some(Layout::Nt) => false,
        Some(Layout::Nn) => true,
        Some(other) => {
            return Err(invalid(format!("tensor `{name}` has layout {other}; expected NT ([N, K]) or NN ([K, N])")));
        }
    };
    if w.rank() != 2 {
        let want = if nn { "NN expects rank 2 [K, N]" } else { "NT expects rank 2 [N, K]" };
        return Err(invalid(format!("tensor `{name}` has shape {:?} (rank {}); layout {want}", w.shape(), w.rank())));
    }
    let b = if nn { Mat::of(w) } else { Mat::of(w).t() };
    if b.rows != k {
        return Err(invalid(format!(
            "tensor `{name}` has shape {:?}; its in_features {} must equal x's last dim K = {k}",
            w.shape(),
            b.rows
        )));
    }
    Ok(b)
}

fn out_shape(x: &HostTensor, n: usize) -> Vec<usize> {
    let mut s = x.shape()[..x.rank() - 1].to_vec();
    s.push(n);
    s
}

// ---------------------------------------------------------------------------------------
// Kernels.

/// `linear`: `out = x @ W^T + bias` (NT) or `x @ W + bias` (NN).
pub(super) fn linear(a: &LinearArgs) -> Result<HostTensor, KernelError> {
    expect_dense_float("x", &a.x)?;
    expect_dense_float("weight", &a.weight)?;
    let mut holder = None;
    let x = rows_view(&a.x, &mut holder)?;
    let b = weight_b("weight", &a.weight, x.cols)?;
    let bias = check_bias(a.bias.as_ref(), b.cols)?;
    let shape = out_shape(&a.x, b.cols);
    if x.rows > GEMV_MAX_M
        && x.cols > 0
        && b.cols > 0
        && matches!((x.st, b.st), (Storage::BF16(_), Storage::BF16(_)))
        && simd::amx_bf16()
    {
        let out = amx::linear_bf16(&x, &b, bias.as_deref());
        return HostTensor::new(Storage::BF16(out), &shape)
            .map_err(|e| KernelError::Failed(format!("building the output: {e}")));
    }
    let c = linear_f32(&x, &Weights::Dense(b), bias.as_deref())?;
    to_tensor(a.x.dtype(), &shape, c)
}

/// bf16 x bf16 linear on AMX tiles. Products of bf16 values are exact in f32 and the tiles
/// sum in f32, so this is the f32 GEMM of the same values (another summation order).
///
/// It computes the transposed product `C^T [N, M] = W [N, K] . x^T`, so that W, the large
/// operand, is AMX's A operand, whose tiles are plain row segments (packing it is a copy of
/// 64-byte pieces) and x, packed once per call, is B (its pairs transposed in registers).
/// A task owns `NB` output columns of up to `MB` rows; it walks K in chunks of `KS` steps,
/// packing the chunk's weight block (256 KiB) while the next chunk's weight and x pieces
/// are prefetched into L2, and accumulates an f32 block in L2 that is finally written
/// transposed, bias added and rounded once. Every tile operand is 64-byte aligned: tile
/// rows straddling two cache lines made the loads 3x slower. Sizes were chosen by
/// measurement (512 x 4096 x 4096 on a 2-core AMX VM): 256 x 8 steps beat 128..512 rows
/// and 4..32 steps by 5-20%.
mod amx {
    use half::bf16;
    use half::slice::HalfFloatSliceExt;
    use half::vec::HalfBitsVecExt;
    use rayon::prelude::*;
    use std::cell::Cell;

    use super::super::alloc::{self, Aligned};
    use super::super::simd::{self, AMX_A_TILE, AMX_B_TILE, Prefetch, gemm_amx_bf16_tiles};
    use super::Mat;
    use crate::tensor::Storage;

    fn bits<'a>(m: &Mat<'a>) -> &'a [u16] {
        match m.st {
            Storage::BF16(v) => v.reinterpret_cast(),
            _ => unreachable!("the AMX path is taken for bf16 storages only"),
        }
    }

    /// Row `r` of `m` as `(m[r][2p] | m[r][2p + 1] << 16)` pairs, zero beyond its columns.
    fn pair_row(m: &Mat, v: &[u16], r: usize, out: &mut [u32]) {
        out.fill(0);
        if m.cs == 1 {
            let src = &v[m.at(r, 0)..m.at(r, 0) + m.cols];
            let (pairs, tail) = src.as_chunks::<2>();
            for (d, s) in out.iter_mut().zip(pairs) {
                *d = u32::from(s[0]) | (u32::from(s[1]) << 16);
            }
            if let Some(&t) = tail.first() {
                out[pairs.len()] = u32::from(t);
            }
        } else {
            for c in 0..m.cols {
                out[c / 2] |= u32::from(v[m.at(r, c)]) << (16 * (c % 2));
            }
        }
    }

    /// x [M, K] as the B operand, chunk by chunk of `ks` K steps (the last may be shorter):
    /// in chunk c (at `c * ks * 16 * mt` pair rows), column tile j (x rows 16 j..) is the
    /// chunk's pair rows of 16 `u32`, so a chunk's column tiles are contiguous.
    fn pack_x(x: &Mat, kt: usize, ks: usize) -> Aligned<u32> {
        let (m, v) = (x.rows, bits(x));
        let mt = m.div_ceil(16);
        let mut out = Aligned::zeroed(mt * kt * AMX_B_TILE);
        // Each column tile's pieces, one per chunk, so tiles can be filled in parallel.
        let mut pieces: Vec<Vec<&mut [u32]>> = (0..mt).map(|_| Vec::new()).collect();
        let mut rest = &mut out[..];
        for chunk in 0..kt.div_ceil(ks) {
            let steps = ks.min(kt - chunk * ks);
            for tile in pieces.iter_mut() {
                let (piece, tail) = rest.split_at_mut(steps * AMX_B_TILE);
                tile.push(piece);
                rest = tail;
            }
        }
        pieces.into_par_iter().enumerate().for_each(|(j, mut tile)| {
            let rows = 16.min(m - 16 * j);
            if x.cs == 1 {
                for s in 0..kt {
                    let cols = 32.min(x.cols - 32 * s);
                    let src = &v[x.at(16 * j, 32 * s)..];
                    let d = (s % ks) * AMX_B_TILE;
                    simd::pair_tile(src, x.rs, rows, cols, &mut tile[s / ks][d..d + AMX_B_TILE]);
                }
                return;
            }
            let mut row = vec![0u32; kt * 16];
            for c in 0..rows {
                pair_row(x, v, 16 * j + c, &mut row);
                for (s, step) in row.chunks(16).enumerate() {
                    let piece = &mut tile[s / ks];
                    for (q, &w) in step.iter().enumerate() {
                        piece[(s % ks) * AMX_B_TILE + q * 16 + c] = w;
                    }
                }
            }
        });
        out
    }

    /// Weight rows n0..n0 + nb (w is [N, K]), K steps s0..s0 + steps, as the A operand:
    /// row tile i, step s is the 16 x 32 block at rows 16 i.., columns 32 (s0 + s)..;
    /// zero beyond nb rows and K columns.
    fn pack_block(w: &Mat, v: &[u16], n0: usize, nb: usize, s0: usize, steps: usize, out: &mut Aligned<u16>) {
        let k = w.cols;
        let (c0, c1) = (32 * s0, (32 * (s0 + steps)).min(k));
        out.set_len(nb.div_ceil(16) * steps * AMX_A_TILE);
        // Every element is written below unless rows or columns fall short of whole tiles.
        if !nb.is_multiple_of(16) || c1 - c0 < 32 * steps {
            out.fill(0);
        }
        for r in 0..nb {
            let base = (r / 16) * steps * AMX_A_TILE + (r % 16) * 32;
            if w.cs == 1 {
                let src = &v[w.at(n0 + r, c0)..w.at(n0 + r, 0) + c1];
                // Fixed-size pieces: 64-byte moves, not a memcpy call each.
                let (pieces, tail) = src.as_chunks::<32>();
                for (s, piece) in pieces.iter().enumerate() {
                    let d = base + s * AMX_A_TILE;
                    if let Some(dst) = out.get_mut(d..d + 32).and_then(|d| <&mut [u16; 32]>::try_from(d).ok()) {
                        *dst = *piece;
                    }
                }
                if !tail.is_empty() {
                    let d = base + pieces.len() * AMX_A_TILE;
                    out[d..d + tail.len()].copy_from_slice(tail);
                }
            } else {
                for c in c0..c1 {
                    out[base + ((c - c0) / 32) * AMX_A_TILE + c % 32] = v[w.at(n0 + r, c)];
                }
            }
        }
    }

    /// Weight rows per block (a multiple of 32: two row tiles per product).
    const NB: usize = 256;
    /// K steps (of 32) per chunk.
    const KS: usize = 8;
    /// x rows per block (a multiple of 16).
    const MB: usize = 512;

    /// `out [M, N] = x . b + bias` rounded to bf16, for bf16 x [M, K] and b [K, N] (the
    /// weight); M, K, N > 0. Needs `simd::amx_bf16()`.
    pub(super) fn linear_bf16(x: &Mat, b: &Mat, bias: Option<&[f32]>) -> Vec<bf16> {
        let (m, k, n) = (x.rows, x.cols, b.cols);
        let kt = k.div_ceil(32);
        let chunks = kt.div_ceil(KS);
        let mt_all = m.div_ceil(16);
        let xp = pack_x(x, kt, KS);
        let w = b.t(); // [N, K]: the weight's rows
        let wv = bits(&w);
        let mut out: Vec<bf16> = alloc::huge(vec![0u16; m * n]).reinterpret_into();
        let (mblocks, nblocks) = (m.div_ceil(MB), n.div_ceil(NB));
        let mut tasks: Vec<Vec<&mut [bf16]>> = (0..mblocks * nblocks).map(|_| Vec::new()).collect();
        for (r, row) in out.chunks_mut(n).enumerate() {
            for (s, seg) in row.chunks_mut(NB).enumerate() {
                tasks[(r / MB) * nblocks + s].push(seg);
            }
        }
        tasks.into_par_iter().enumerate().for_each(|(t, mut rows)| {
            let (mi, ni) = (t / nblocks, t % nblocks);
            let nt = rows.len().div_ceil(16);
            let (n0, nb) = (ni * NB, NB.min(n - ni * NB));
            // One spare tile column: C rows a multiple of 4 KiB apart would share L1 sets.
            let ldc = 16 * nt + 16;
            let (mut ct, mut slab) = (CT.take(), SLAB.take());
            ct.set_len(nb.div_ceil(16) * 16 * ldc);
            for c in 0..chunks {
                let s0 = c * KS;
                let steps = KS.min(kt - s0);
                pack_block(&w, wv, n0, nb, s0, steps, &mut slab);
                let bp = &xp[(s0 * mt_all + (mi * MB / 16) * steps) * AMX_B_TILE..];
                // The next chunk's pieces of these weight rows and of x come into L2 meanwhile.
                let mut pf = [Prefetch::rows(&wv[..0], 0, 0, 0); 2];
                if c + 1 < chunks {
                    let (c0, next) = (32 * (s0 + steps), KS.min(kt - s0 - steps));
                    if w.cs == 1 {
                        pf[0] = Prefetch::rows(&wv[w.at(n0, c0)..], nb, (32 * next).min(k - c0), w.rs);
                    }
                    let xn = ((s0 + steps) * mt_all + (mi * MB / 16) * next) * AMX_B_TILE;
                    pf[1] = Prefetch::all(&xp[xn..xn + nt * next * AMX_B_TILE]);
                }
                gemm_amx_bf16_tiles(nb.div_ceil(16), nt, steps, &slab, bp, &mut ct, ldc, c > 0, &pf);
            }
            // ct [nb, rows] transposed into the output rows, bias added, rounded once.
            simd::transpose_round_bf16(&ct, ldc, nb, bias.map(|b| &b[n0..n0 + nb]), &mut rows, 0);
            CT.set(ct);
            SLAB.set(slab);
        });
        out
    }

    thread_local! {
        /// Each worker's f32 product block and packed weight block, kept between tasks and
        /// calls (a few hundred KiB each, faulted in once).
        static CT: Cell<Aligned<f32>> = Cell::default();
        static SLAB: Cell<Aligned<u16>> = Cell::default();
    }
}

/// `linear_int4`: the packed weight is dequantized per row (GEMV) or per panel (sgemm).
pub(super) fn linear_int4(a: &Int4Args) -> Result<HostTensor, KernelError> {
    // What makes int4 arguments valid (packing, group size, scale shapes) is defined once,
    // by the oracle.
    let (_, _, k, n, g) = crate::backend::cpu_reference::linear::int4_dims(a)?;
    let mut holder = None;
    let x = rows_view(&a.x, &mut holder)?;
    let Storage::I8(bytes) = a.weight.storage() else {
        return Err(invalid(format!("tensor `weight` has dtype {}; expected i8", a.weight.dtype())));
    };
    let bias = check_bias(a.bias.as_ref(), n)?;
    let w = Int4W {
        packed: Mat::of(&a.weight),
        bytes,
        scales: Mat::of(&a.scales),
        zeros: a.zeros.as_ref().map(Mat::of),
        k,
        g,
    };
    let c = linear_f32(&x, &Weights::Int4(w), bias.as_deref())?;
    to_tensor(a.x.dtype(), &out_shape(&a.x, n), c)
}

#[inline(always)]
fn dot_i8_impl(a: &[i8], b: &[i8]) -> i64 {
    // |a * b| <= 2^14, so 2^16 products fit an i32 (the vectorizer's pmaddwd pattern).
    let mut total = 0i64;
    for (ca, cb) in a.chunks(1 << 16).zip(b.chunks(1 << 16)) {
        let s: i32 = ca.iter().zip(cb).map(|(&x, &y)| i32::from(x) * i32::from(y)).sum();
        total += i64::from(s);
    }
    total
}

/// The exact dot product of two i8 vectors.
fn dot_i8(a: &[i8], b: &[i8]) -> i64 {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx2")]
        fn with_avx512(a: &[i8], b: &[i8]) -> i64 {
            dot_i8_impl(a, b)
        }
        #[target_feature(enable = "avx2")]
        fn with_avx2(a: &[i8], b: &[i8]) -> i64 {
            dot_i8_impl(a, b)
        }
        match simd::level() {
            simd::Level::Avx512 => {
                #[allow(unsafe_code)]
                // SAFETY: `level()` is Avx512 only when the CPU reports AVX-512F/BW and AVX2.
                return unsafe { with_avx512(a, b) };
            }
            simd::Level::Avx2 => {
                #[allow(unsafe_code)]
                // SAFETY: `level()` is Avx2 only when the CPU reports AVX2.
                return unsafe { with_avx2(a, b) };
            }
            simd::Level::Portable => {}
        }
    }
    dot_i8_impl(a, b)
}

/// The elements of an i8 matrix in row-major order (in place when contiguous).
fn i8_rows<'a>(t: &'a HostTensor, holder: &'a mut Vec<i8>) -> &'a [i8] {
    if let Storage::I8(v) = t.storage()
        && t.is_contiguous()
    {
        return &v[t.offset()..t.offset() + t.numel()];
    }
    *holder = t.to_i64_vec().into_iter().map(|v| v as i8).collect();
    holder
}

/// A per-row scale ([1] or [rows]) of `linear_w8a8`, checked.
fn row_scale(name: &str, s: &HostTensor, rows: usize, of: &str) -> Result<Vec<f32>, KernelError> {
    if s.dtype() != DType::F32 {
        return Err(invalid(format!("tensor `{name}` has dtype {}; expected f32", s.dtype())));
    }
    if s.shape() != [1] && s.shape() != [rows] {
        return Err(invalid(format!(
            "SCALE_LAYOUT_MISMATCH: tensor `{name}` has shape {:?} strides {:?}; expected [1] (per tensor) or \
             [{rows}] (one scale per row of {of})",
            s.shape(),
            s.strides()
        )));
    }
    Ok(s.to_f32_vec())
}

/// `linear_w8a8`: `out = (acc * x_scale) * w_scale + bias` with exact integer `acc`.
pub(super) fn linear_w8a8(a: &W8a8Args) -> Result<HostTensor, KernelError> {
    for (name, t) in [("x", &a.x), ("weight", &a.weight)] {
        if t.dtype() != DType::I8 {
            return Err(invalid(format!("tensor `{name}` has dtype {}; linear_w8a8 expects i8", t.dtype())));
        }
        if t.rank() != 2 {
            return Err(invalid(format!("tensor `{name}` has shape {:?}; expected rank 2", t.shape())));
        }
    }
    if let Some(l) = a.weight.layout()
        && l != Layout::Nt
    {
        return Err(invalid(format!("tensor `weight` has layout {l}; linear_w8a8 takes [N, K] (NT) weights")));
    }
    let (m, k, n) = (a.x.shape()[0], a.x.shape()[1], a.weight.shape()[0]);
    if a.weight.shape()[1] != k {
        return Err(invalid(format!(
            "tensor `weight` has shape {:?}; expected [N, K] with K = {k} from x {:?}",
            a.weight.shape(),
            a.x.shape()
        )));
    }
    let xs = row_scale("x_scale", &a.x_scale, m, "x")?;
    let ws = row_scale("w_scale", &a.w_scale, n, "weight")?;
    let bias = check_bias(a.bias.as_ref(), n)?;
    let dtype = match a.attrs.out_dtype.unwrap_or(DType::F32) {
        d @ (DType::F32 | DType::F16 | DType::BF16) => d,
        d => return Err(invalid(format!("attrs.out_dtype is {d}; expected f32, f16 or bf16"))),
    };
    let len = m.checked_mul(n).ok_or_else(|| invalid(format!("the output [{m}, {n}] overflows")))?;
    let (mut hx, mut hw) = (Vec::new(), Vec::new());
    let (x, w) = (i8_rows(&a.x, &mut hx), i8_rows(&a.weight, &mut hw));
    let mut c = vec![0f32; len];
    if len > 0 {
        // Weight-row chunks in parallel (each chunk stays in cache across the M rows).
        let parts: Vec<Vec<f32>> = chunks(n, 16)
            .into_par_iter()
            .map(|(n0, nb)| {
                let mut part = vec![0f32; m * nb];
                for i in 0..m {
                    let xr = &x[i * k..(i + 1) * k];
                    let sx = xs[if xs.len() == 1 { 0 } else { i }];
                    for j in 0..nb {
                        let col = n0 + j;
                        let acc = dot_i8(xr, &w[col * k..(col + 1) * k]);
                        let sw = ws[if ws.len() == 1 { 0 } else { col }];
                        part[i * nb + j] = (acc as f32 * sx) * sw + bias.as_ref().map_or(0.0, |b| b[col]);
                    }
                }
                part
            })
            .collect();
        for ((n0, nb), part) in chunks(n, 16).into_iter().zip(parts) {
            for i in 0..m {
                c[i * n + n0..i * n + n0 + nb].copy_from_slice(&part[i * nb..(i + 1) * nb]);
            }
        }
    }
    to_tensor(dtype, &[m, n], c)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::backend::cpu_reference;
    use crate::backend::cpu_reference::test_util::values;
    use crate::exec::args::strided_copy;
    use crate::model::attrs::{Int4Attrs, NoAttrs, W8a8Attrs};

    fn reference(args: &OpArgs) -> HostTensor {
        let mut r = Registry::new();
        cpu_reference::register(&mut r);
        let id = match args {
            OpArgs::Linear(_) => "cpu_reference.linear.naive",
            OpArgs::LinearW8a8(_) => "cpu_reference.linear_w8a8.naive",
            _ => "cpu_reference.linear_int4.naive",
        };
        r.get(id).unwrap().run(args).unwrap().remove("out").unwrap()
    }

    fn t(shape: &[usize], seed: u64, dtype: DType) -> HostTensor {
        let n = shape.iter().product();
        HostTensor::from_f32_as(dtype, shape, &values(n, seed)).unwrap()
    }

    /// GEMM tolerance: per element `tol * (|ref| + sqrt(K) * rms(|x| |w|) scale)`, plus one
    /// 16-bit ulp for f16/bf16 outputs; `mag` is the magnitude of the summed products.
    pub(crate) fn assert_gemm_close(ours: &HostTensor, want: &HostTensor, k: usize, mag: f64, what: &str) {
        assert_eq!(ours.shape(), want.shape(), "{what}: shape");
        assert_eq!(ours.dtype(), want.dtype(), "{what}: dtype");
        let (tol, ulp) = match want.dtype() {
            DType::F32 => (1e-6, 0.0),
            DType::F16 => (1e-3, 2f64.powi(-10)),
            _ => (1e-2, 2f64.powi(-7)),
        };
        let bound = tol * (k.max(1) as f64).sqrt() * mag;
        for (i, (o, r)) in ours.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
            let d = (o - r).abs();
            assert!(d <= bound + tol * r.abs() || d <= ulp * r.abs().max(o.abs()), "{what}: element {i}: {o} vs {r}");
        }
    }

    fn lin(x: HostTensor, weight: HostTensor, bias: Option<HostTensor>) -> LinearArgs {
        LinearArgs { x, weight, bias, attrs: NoAttrs {} }
    }

    #[test]
    fn fast_matches_reference_on_odd_shapes_dtypes_and_layouts() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for m in [1usize, 3, 17, 130] {
                for k in [5usize, 64, 130] {
                    for n in [7usize, 64] {
                        for nn in [false, true] {
                            let x = t(&[m, k], 1 + m as u64, dtype);
                            let w =
                                if nn { t(&[k, n], 2, dtype).with_layout(Layout::Nn) } else { t(&[n, k], 2, dtype) };
                            let bias = (n == 7).then(|| t(&[n], 3, dtype));
                            let a = lin(x, w, bias);
                            let what = format!("{dtype} m{m} k{k} n{n} nn={nn}");
                            let ours = linear(&a).unwrap();
                            assert_gemm_close(&ours, &reference(&OpArgs::Linear(a)), k, 1.0, &what);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn packed_gemm_matches_reference_on_edges_blocks_and_strides() {
        // Tile edges (M, N off 12 / 32), several K blocks (KC = 256) and N blocks (NC =
        // 1024), NT / NN / strided weights, strided x, a bias.
        let shapes = [
            (7usize, 13usize, 29usize),
            (9, 29, 13),
            (13, 1, 33),
            (65, 130, 257),
            (12, 256, 32),
            (40, 50, 20),
            (601, 19, 70),
            (25, 257, 65),
            (37, 520, 1090),
        ];
        for (m, k, n) in shapes {
            for case in 0..3 {
                let w = match case {
                    0 => t(&[n, k], 2, DType::F32),
                    1 => t(&[k, n], 2, DType::F32).with_layout(Layout::Nn),
                    _ => strided_copy(&t(&[n, k], 2, DType::F32), &[k + 5, 1]).unwrap(),
                };
                let x = t(&[m, k], 1, DType::F32);
                let x = if case == 2 { x.permute(&[1, 0]).unwrap().contiguous().permute(&[1, 0]).unwrap() } else { x };
                let a = lin(x, w, (case != 1).then(|| t(&[n], 3, DType::F32)));
                let what = format!("packed m{m} k{k} n{n} case {case}");
                assert_gemm_close(&linear(&a).unwrap(), &reference(&OpArgs::Linear(a)), k, 1.0, &what);
            }
            // The blocked GEMM itself (any M, also below the GEMV cut), with beta = 1.
            let (xa, wb) = (values(m * k, 4), values(n * k, 5));
            let (xv, wv) = (F32View::dense(&xa, m, k), F32View { data: &wb, off: 0, rows: k, cols: n, rs: 1, cs: k });
            let ldc = n + 3;
            let mut c = values(m * ldc, 6);
            let mut want = c.clone();
            packed::gemm(xv, wv, &mut c, ldc, true);
            for i in 0..m {
                for j in 0..n {
                    let s: f64 = (0..k).map(|p| f64::from(xa[i * k + p]) * f64::from(wb[j * k + p])).sum();
                    want[i * ldc + j] = (f64::from(want[i * ldc + j]) + s) as f32;
                }
            }
            for (i, (o, r)) in c.iter().zip(&want).enumerate() {
                assert!((o - r).abs() <= 1e-5 * (k as f32).sqrt() + 1e-6 * r.abs(), "gemm += {m}x{k}x{n} at {i}");
            }
            // beta = 0 overwrites: what C held (NaN here) never reaches the result.
            let mut c = vec![f32::NAN; m * ldc];
            packed::gemm(xv, wv, &mut c, ldc, false);
            for i in 0..m {
                for j in 0..n {
                    let s: f64 = (0..k).map(|p| f64::from(xa[i * k + p]) * f64::from(wb[j * k + p])).sum();
                    let o = c[i * ldc + j];
                    assert!(
                        (f64::from(o) - s).abs() <= 1e-5 * (k as f64).sqrt(),
                        "gemm = {m}x{k}x{n} at {i}, {j}: {o}"
                    );
                }
            }
        }
    }

    #[test]
    fn bf16_tile_path_on_many_slabs_edges_and_layouts() {
        // Several weight blocks, K chunks and x blocks (the last of each partial), M and K
        // off the tile sizes, a bias, and NN / strided weights (the generic packing).
        for (m, k, n) in [(40usize, 96usize, 200usize), (9, 70, 130), (130, 1100, 300), (530, 600, 40)] {
            for nn in [false, true] {
                let x = t(&[m, k], 11, DType::BF16);
                let w =
                    if nn { t(&[k, n], 12, DType::BF16).with_layout(Layout::Nn) } else { t(&[n, k], 12, DType::BF16) };
                let a = lin(x, w, Some(t(&[n], 13, DType::F32)));
                let what = format!("bf16 m{m} k{k} n{n} nn={nn}");
                assert_gemm_close(&linear(&a).unwrap(), &reference(&OpArgs::Linear(a)), k, 1.0, &what);
            }
        }
    }

    #[test]
    fn strided_and_batched_views() {
        for dtype in [DType::F32, DType::BF16] {
            for m in [2usize, 9] {
                let (k, n) = (33usize, 19usize);
                let x = t(&[m, k], 5, dtype);
                // x read through a transposed buffer; weight through padded row strides.
                let xt = x.permute(&[1, 0]).unwrap().contiguous().permute(&[1, 0]).unwrap();
                let wp = strided_copy(&t(&[n, k], 6, dtype), &[k + 3, 1]).unwrap();
                let a = lin(xt, wp.clone(), None);
                assert_gemm_close(&linear(&a).unwrap(), &reference(&OpArgs::Linear(a)), k, 1.0, "strided");
                // A 3-D x whose leading dims do not collapse (a permuted batch).
                let x3 = t(&[3, m, k], 7, dtype).permute(&[1, 0, 2]).unwrap();
                let a = lin(x3, wp, Some(t(&[n], 8, DType::F32)));
                let ours = linear(&a).unwrap();
                assert_eq!(ours.shape(), &[m, 3, n]);
                assert_gemm_close(&ours, &reference(&OpArgs::Linear(a)), k, 1.0, "batched");
            }
        }
    }

    #[test]
    fn errors_and_empty_dims() {
        let x = t(&[2, 3], 1, DType::F32);
        match linear(&lin(x.clone(), t(&[4, 2], 1, DType::F32), None)) {
            Err(KernelError::InvalidInput(m)) => assert!(m.contains("`weight`") && m.contains("K = 3"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(linear(&lin(x.clone(), t(&[4, 3], 1, DType::F32), Some(t(&[3], 1, DType::F32)))),
            Err(KernelError::InvalidInput(m)) if m.contains("`bias`")));
        let e = linear(&lin(t(&[0, 3], 1, DType::F32), t(&[4, 3], 1, DType::F32), None)).unwrap();
        assert_eq!(e.shape(), &[0, 4]);
        let z =
            linear(&lin(t(&[5, 0], 1, DType::F32), t(&[2, 0], 1, DType::F32), Some(t(&[2], 2, DType::F32)))).unwrap();
        assert_eq!(z.to_f32_vec(), [values(2, 2), values(2, 2), values(2, 2), values(2, 2), values(2, 2)].concat());
        let mut r = Registry::new();
        register(&mut r);
        let q = OpArgs::LinearW8a8(W8a8Args {
            x: HostTensor::zeros(DType::I8, &[1, 2]).unwrap(),
            x_scale: t(&[1], 1, DType::F32),
            weight: HostTensor::zeros(DType::I8, &[1, 2]).unwrap(),
            w_scale: t(&[1], 1, DType::F32),
            bias: None,
            attrs: W8a8Attrs::default(),
        });
        assert!(matches!(r.get(LINEAR).unwrap().run(&q), Err(KernelError::Unsupported(_))));
        assert!(r.get(W8A8).unwrap().run(&q).is_ok());
    }

    fn i8s(shape: &[usize], seed: u64) -> HostTensor {
        let n = shape.iter().product();
        let v: Vec<f32> = values(n, seed).iter().map(|v| (v * 128.0).floor().clamp(-128.0, 127.0)).collect();
        HostTensor::from_f32_as(DType::I8, shape, &v).unwrap()
    }

    #[test]
    fn w8a8_matches_the_dequantized_float_reference() {
        for (m, k, n) in [(1usize, 5usize, 7usize), (17, 130, 64), (3, 64, 33)] {
            let (x, w) = (i8s(&[m, k], 11), i8s(&[n, k], 12));
            let xs = HostTensor::from_f32(&[m], values(m, 13).iter().map(|v| v.abs() * 0.01 + 1e-3).collect()).unwrap();
            let ws = HostTensor::from_f32(&[1], vec![0.02]).unwrap();
            for out_dtype in [None, Some(DType::BF16)] {
                let a = W8a8Args {
                    x: x.clone(),
                    x_scale: xs.clone(),
                    weight: w.clone(),
                    w_scale: ws.clone(),
                    bias: Some(t(&[n], 14, DType::F16)),
                    attrs: W8a8Attrs { out_dtype },
                };
                let ours = linear_w8a8(&a).unwrap();
                assert_gemm_close(&ours, &reference(&OpArgs::LinearW8a8(a.clone())), k, 1.0, "w8a8 vs reference");
                // The same product as a float linear of the dequantized operands.
                let xd = HostTensor::from_f32(
                    &[m, k],
                    x.to_f32_vec().iter().enumerate().map(|(i, v)| v * xs.to_f32_vec()[i / k]).collect(),
                )
                .unwrap();
                let wd = HostTensor::from_f32(&[n, k], w.to_f32_vec().iter().map(|v| v * 0.02).collect()).unwrap();
                let f = reference(&OpArgs::Linear(lin(xd, wd, a.bias.clone())));
                let f = HostTensor::from_f32_as(ours.dtype(), f.shape(), &f.to_f32_vec()).unwrap();
                assert_gemm_close(&ours, &f, k, 1.0, "w8a8 vs dequantized linear");
            }
        }
        // Exactness of the integer accumulation at the extremes (no i32 overflow).
        let k = 140_000usize;
        let x = HostTensor::from_f32_as(DType::I8, &[1, k], &vec![-128.0; k]).unwrap();
        let a = W8a8Args {
            x: x.clone(),
            x_scale: HostTensor::from_f32(&[1], vec![1.0]).unwrap(),
            weight: x,
            w_scale: HostTensor::from_f32(&[1], vec![1.0]).unwrap(),
            bias: None,
            attrs: W8a8Attrs::default(),
        };
        assert_eq!(linear_w8a8(&a).unwrap().to_f64_vec(), vec![(k as f64 * 16384.0) as f32 as f64]);
    }

    fn int4_args(m: usize, k: usize, n: usize, g: usize, zeros: bool, dtype: DType) -> Int4Args {
        let bytes: Vec<i8> = values(n * k / 2, 21).iter().map(|v| (v * 128.0).floor() as i8).collect();
        Int4Args {
            x: t(&[m, k], 22, dtype),
            weight: HostTensor::new(Storage::I8(bytes), &[n, k / 2]).unwrap(),
            scales: HostTensor::from_f32(&[n, k / g], values(n * k / g, 23).iter().map(|v| v.abs() * 0.1).collect())
                .unwrap(),
            zeros: zeros.then(|| {
                let z = values(n * k / g, 24).iter().map(|v| ((v + 1.0) * 8.0).floor()).collect();
                HostTensor::from_f32(&[n, k / g], z).unwrap()
            }),
            bias: Some(t(&[n], 25, DType::F32)),
            attrs: Int4Attrs { group_size: g as u64 },
        }
    }

    #[test]
    fn int4_matches_the_dequantized_reference_for_group_sizes() {
        for g in [32usize, 64, 128] {
            for zeros in [false, true] {
                for (m, dtype) in [(1usize, DType::F32), (3, DType::BF16), (17, DType::F32), (130, DType::F16)] {
                    let (k, n) = (256usize, 7usize);
                    let a = int4_args(m, k, n, g, zeros, dtype);
                    let ours = linear_int4(&a).unwrap();
                    let what = format!("int4 g{g} zeros={zeros} m{m} {dtype}");
                    assert_gemm_close(&ours, &reference(&OpArgs::LinearInt4(a.clone())), k, 1.0, &what);
                    // Against a float linear of the weight dequantized here by hand.
                    let bytes = a.weight.to_i64_vec();
                    let (s, z) = (a.scales.to_f32_vec(), a.zeros.as_ref().map(|z| z.to_f32_vec()));
                    let mut w = vec![0f32; n * k];
                    for r in 0..n {
                        for c in 0..k {
                            let b = bytes[r * k / 2 + c / 2] as u8;
                            let q = if c % 2 == 0 { b & 15 } else { b >> 4 };
                            let gi = r * (k / g) + c / g;
                            w[r * k + c] = (f32::from(q) - z.as_ref().map_or(8.0, |z| z[gi])) * s[gi];
                        }
                    }
                    let f = reference(&OpArgs::Linear(lin(
                        a.x.clone(),
                        HostTensor::from_f32_as(dtype, &[n, k], &w).unwrap(),
                        a.bias.clone(),
                    )));
                    if dtype == DType::F32 {
                        assert_gemm_close(&ours, &f, k, 1.0, &format!("{what} vs dequantized linear"));
                    }
                }
            }
        }
        let mut bad = int4_args(2, 64, 3, 32, true, DType::F32);
        bad.attrs.group_size = 48;
        assert!(matches!(linear_int4(&bad), Err(KernelError::InvalidInput(m)) if m.contains("SCALE_LAYOUT_MISMATCH")));
        let mut bad = int4_args(2, 64, 3, 32, true, DType::F32);
        bad.zeros = Some(t(&[3, 4], 1, DType::F32));
        assert!(
            matches!(linear_int4(&bad), Err(KernelError::InvalidInput(m)) if m.contains("`zeros`") && m.contains("[3, 2]"))
        );
    }
}
