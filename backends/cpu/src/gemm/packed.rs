//! A GotoBLAS-style f32 GEMM around the AVX-512 (or AVX2) tile of [`simd::gemm_tile_packed`]
//! (`TILE_MR` x `TILE_NR` sums in registers over `KC` steps). A is packed once per call
//! into `TILE_MR`-row panels (parallel). The output columns are split into rayon tasks of
//! whole panels (about four per thread, so work stealing evens out a busy core; rows too
//! when N is narrow); each task owns its C row segments and, per `KC` block of K, packs its
//! B columns into `TILE_NR`-column panels (at most `NC` columns: a buffer that stays in
//! L2), then runs each B panel (KC x 32 floats, kept in L1) down a block of at most
//! `MC_TILES` row tiles, whose A panels stream from L2. Every B element is packed once per
//! call. Packing buffers are kept per thread between calls (see `KEEP_MAX`).

use std::thread::LocalKey;

use rayon::prelude::*;

use super::super::alloc::{Aligned, Kept};
use super::super::simd::{self, TILE_MR as MR, TILE_NR as NR};
use super::F32View;
use super::weights::Int4W;

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

/// The B [K, N] operand of [`gemm`]: an f32 view, or the rows of an NT weight (B's column j
/// is weight row j) decoded to f32 as they are packed: bf16 (`k` contiguous elements at
/// `off + j * ld`) or packed 4-bit codes, so that a bf16 or 4-bit model's prefill costs one
/// pass over its weight (no f32 copy of it first).
#[derive(Debug, Clone, Copy)]
pub(crate) enum BSrc<'a> {
    /// f32 data.
    F32(F32View<'a>),
    /// An NT bf16 weight [N, K] (in bounds: checked by the caller).
    Bf16Rows { data: &'a [half::bf16], off: usize, ld: usize, n: usize },
    /// A 4-bit weight whose groups tile [`KC`] (see [`takes_int4`]).
    Int4(Int4W<'a>),
}

impl BSrc<'_> {
    /// N, B's columns.
    pub(super) fn cols(&self) -> usize {
        match self {
            BSrc::F32(v) => v.cols,
            BSrc::Bf16Rows { n, .. } => *n,
            BSrc::Int4(w) => w.packed.rows,
        }
    }
}

/// True when [`gemm`] can decode this 4-bit weight a K block at a time: its groups tile
/// the blocks (a block starts and ends on a group boundary).
pub(crate) fn takes_int4(w: &Int4W) -> bool {
    w.g > 0 && KC.is_multiple_of(w.g)
}

/// [`pack_b`] for any source: weight rows are decoded `NR` at a time into `tmp` (`[NR][kc]`,
/// 32 KiB), then packed as an f32 NT view.
fn pack_b_src(b: &BSrc, p0: usize, kc: usize, j0: usize, nc: usize, out: &mut [f32], tmp: &mut Vec<f32>) {
    let decode = |j: usize, dst: &mut [f32]| match *b {
        BSrc::Bf16Rows { data, off, ld, .. } => {
            let at = off + j * ld + p0;
            simd::bf16_to_f32(&data[at..at + kc], dst);
        }
        BSrc::Int4(ref w) => w.row_part(j, p0, dst),
        BSrc::F32(_) => {}
    };
    if let BSrc::F32(ref v) = *b {
        return pack_b(v, p0, kc, j0, nc, out);
    }
    tmp.resize(NR * kc, 0.0);
    for (q, panel) in out[..nc.div_ceil(NR) * kc * NR].chunks_exact_mut(kc * NR).enumerate() {
        let w = NR.min(nc - q * NR);
        for (c, dst) in tmp.chunks_exact_mut(kc).take(w).enumerate() {
            decode(j0 + q * NR + c, dst);
        }
        let view = F32View { data: tmp, off: 0, rows: kc, cols: w, rs: 1, cs: kc };
        pack_b(&view, 0, kc, 0, w, panel);
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

/// `C += A . B` (`accumulate`) or `C = A . B` for an f32 view A [m, k] and B [k, n] (in
/// bounds, m, k, n > 0) and C's m rows of `ldc` at the start of `c` (checked by the
/// caller).
pub(crate) fn gemm(a: F32View, b: BSrc, c: &mut [f32], ldc: usize, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols());
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
        let mut widened = Vec::new();
        let (r0, c0) = ((t / nt) * per_m, (t % nt) * per_n);
        let nc = rows.first().map_or(0, |r| r.len());
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            pack_b_src(&b, pc, kc, c0, nc, bp, &mut widened);
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
    static SCRATCH_A: Kept<f32> = const { Kept::new() };
    static SCRATCH_B: Kept<f32> = const { Kept::new() };
}

/// Buffers up to this many floats (32 MiB) are kept for the next call.
const KEEP_MAX: usize = 1 << 23;

/// This thread's buffer of `key` with at least `len` elements (contents unspecified;
/// a nested call on the same thread finds it taken and gets a fresh one). Buffers start
/// on cache lines: the microkernel's 64-byte loads of B would otherwise straddle two.
fn scratch(key: &'static LocalKey<Kept<f32>>, len: usize) -> Aligned<f32> {
    key.with(|k| k.take(len))
}

/// Returns a buffer of [`scratch`] to `key` (the larger one stays; none past KEEP_MAX).
fn keep(key: &'static LocalKey<Kept<f32>>, v: Aligned<f32>) {
    key.with(|k| k.keep(v, KEEP_MAX));
}
