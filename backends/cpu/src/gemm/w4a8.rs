//! int4 weights against int8 activations beyond the decode GEMV's rows (`linear_int4` with
//! `attrs.activations = int8`: a prefill, a batched decode from 3 rows, a speculative
//! verification): x rounded to its int8 codes once per call ([`XCodes`]); rayon tasks over
//! panels of 32 weight columns, each packing its panel's codes four consecutive k to a
//! 32-bit lane into its own scratch ([`pack_panel`], `simd::w4a8_pack`) and running register
//! tiles of up to four rows by the panel on it while it is in cache ([`simd::w4a8_tile`],
//! `vpdpbusd`). This is llama.cpp's Q4_0 x Q8_0 product as a GEMM: the sums within a block
//! are exact integers and only the block's scales are applied in f32, where the f32 GEMM ran
//! on dequantized weights (each code decoded and widened first).
//!
//! Served where AVX-512 VNNI is (blocks of a multiple of 4) or AVX2 (blocks of a multiple of
//! 32; others keep the f32 GEMM on the rounded x): int4 codes with the zero point 8 (no
//! `zeros`), contiguous weight rows.

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use super::view::Mat;
use super::weights::Int4W;
use crate::alloc::with_scratch;
use crate::pack::read_f32;
use crate::simd::{self, W4A8_PANEL, W4A8_ROWS, W4a8Tile};
use layerzero_core::model::w4::W4Format;
use layerzero_core::tensor::Storage;

/// Rows from which `linear_int4` with int8 activations takes [`gemm`] where it serves the
/// weight: a 2048 x 2048 weight in blocks of 32 took 0.11 / 0.16-0.18 / 0.23 / 0.28 ms at 1 /
/// 2 / 3 / 4 rows on the integer GEMV and 0.22 / 0.28 / 0.22 / 0.23 ms here (`lz run`, best
/// of three interleaved medians, 2-vCPU Xeon with AVX-512 VNNI).
pub(crate) const W4A8_FROM_M: usize = 3;

/// True when [`gemm`] serves this weight on this CPU.
pub(crate) fn serves(w: &Int4W) -> bool {
    simd::w4a8_tiles(w.g)
        && w.format == W4Format::Int4
        && w.zeros.is_none()
        && w.packed.cs == 1
        && w.k.is_multiple_of(w.g)
}

/// x's rows as int8 codes in blocks of `g` (`attrs.activations = int8`: `d = max|x| / 127`,
/// `q = round_ties_even(x / d)`), with each block's scale and zero-point term.
pub(crate) struct XCodes<'a> {
    codes: &'a [i8],
    sx: &'a [f32],
    zt: &'a [i32],
    rows: usize,
    k: usize,
    g: usize,
}

/// One row's index, codes, block scales and zero-point terms, as [`with_codes`] fills them.
type RowParts<'a> = (usize, ((&'a mut [i8], &'a mut [f32]), &'a mut [i32]));

/// f32 words of scratch [`with_codes`] takes for `m` rows of `k` in blocks of `g`.
fn words(m: usize, k: usize, g: usize) -> usize {
    m * k.div_ceil(4) + 2 * m * (k / g)
}

/// Runs `f` on x's codes (`x` has `k` columns, a multiple of `g`); `None` when an element
/// is not finite (a code cannot carry it: the f32 path must).
pub(crate) fn with_codes<R>(x: &Mat, g: usize, f: impl FnOnce(&XCodes<'_>) -> R) -> Option<R> {
    let (m, k) = (x.rows, x.cols);
    let groups = k / g;
    with_scratch(words(m, k, g), |buf: &mut [f32]| {
        let (codes, rest) = buf.split_at_mut(m * k.div_ceil(4));
        let (sx, zt) = rest.split_at_mut(m * groups);
        let codes: &mut [i8] = &mut bytemuck::cast_slice_mut(codes)[..m * k];
        let zt: &mut [i32] = bytemuck::cast_slice_mut(zt);
        let row = |(r, ((q, s), z)): RowParts<'_>| {
            // The row in f32 first, in this thread's own scratch (k floats do not fit in the
            // row's k code bytes).
            with_scratch(k, |xr: &mut [f32]| {
                read_f32(x.st, x.at(r, 0), x.cs, xr);
                let finite = simd::int8_blocks(xr, g, q, s);
                for (zz, block) in z.iter_mut().zip(q.chunks_exact(g)) {
                    *zz = -8 * block.iter().map(|&c| i32::from(c)).sum::<i32>();
                }
                finite
            })
        };
        let parts = codes.chunks_exact_mut(k).zip(sx.chunks_exact_mut(groups)).zip(zt.chunks_exact_mut(groups));
        let finite = if m >= 16 { parts.enumerate().par_bridge().all(row) } else { parts.enumerate().all(row) };
        finite.then(|| f(&XCodes { codes, sx, zt, rows: m, k, g }))
    })
}

/// The panel size in bytes of codes and in scales, for `k` in blocks of `g`.
fn panel_sizes(k: usize, g: usize) -> (usize, usize) {
    (k * W4A8_PANEL, (k / g) * W4A8_PANEL)
}

/// Panel `p` of the weight's codes and scales (`codes`: `[k / 4][32][4]`, `scales`:
/// `[k / g][32]`, times the weight's global scale); columns past `n` are zeros.
fn pack_panel(w: &Int4W, p: usize, cp: &mut [u8], sp: &mut [f32]) {
    let (k, g) = (w.k, w.g);
    let n = w.packed.rows;
    let cols = W4A8_PANEL.min(n - p * W4A8_PANEL);
    // Each column's bytes (`k / 2` from its row's start), columns past `n` none.
    let rows: [&[u8]; W4A8_PANEL] = std::array::from_fn(|c| {
        let start = if c < cols { w.packed.at(p * W4A8_PANEL + c, 0) } else { 0 };
        if c < cols { bytemuck::cast_slice(&w.bytes[start..start + k / 2]) } else { &[] }
    });
    simd::w4a8_pack(&rows, k, bytemuck::cast_slice_mut(cp));
    sp.fill(0.0);
    let groups = k / g;
    // Scales held as contiguous f32 rows (Q4_0's, as `--weights int4` keeps them) are read in
    // place a block at a time, each block's 32 written together; others are read a column
    // at a time.
    if let Storage::F32(v) = w.scales.st
        && w.scales.cs == 1
        && let Some(rows) = v.get(w.scales.at(p * W4A8_PANEL, 0)..)
        && rows.len() >= (cols - 1) * w.scales.rs + groups
    {
        for (b, out) in sp.chunks_exact_mut(W4A8_PANEL).enumerate() {
            for (c, o) in out.iter_mut().enumerate().take(cols) {
                *o = rows[c * w.scales.rs + b] * w.global;
            }
        }
        return;
    }
    with_scratch(groups, |row_scales: &mut [f32]| {
        for c in 0..cols {
            read_f32(w.scales.st, w.scales.at(p * W4A8_PANEL + c, 0), w.scales.cs, row_scales);
            for (b, s) in row_scales.iter().enumerate() {
                sp[b * W4A8_PANEL + c] = s * w.global;
            }
        }
    });
}

/// Rows of x per pass over the weight: their codes (`ROW_BLOCK * k` bytes) stay in a core's
/// L2 while every panel's tiles read them; a longer prompt packs each panel once per block.
const ROW_BLOCK: usize = 256;

/// `c [m, n] = x . W^T (+ bias)` for x's codes; `false` when the weight or the shapes are not
/// what [`serves`] and [`with_codes`] made (a caller's bug, not data: `c` is then not the
/// product, and the caller must not use it).
pub(crate) fn gemm(x: &XCodes<'_>, w: &Int4W, bias: Option<&[f32]>, c: &mut [f32]) -> bool {
    let (m, k, g, n) = (x.rows, x.k, x.g, w.packed.rows);
    if !serves(w) || w.k != k || w.g != g || c.len() < m * n || bias.is_some_and(|b| b.len() < n) || m == 0 {
        return false;
    }
    let groups = k / g;
    (0..m).step_by(ROW_BLOCK).zip(c[..m * n].chunks_mut(ROW_BLOCK * n)).all(|(r0, cb)| {
        let rows = ROW_BLOCK.min(m - r0);
        let block = XCodes {
            codes: &x.codes[r0 * k..(r0 + rows) * k],
            sx: &x.sx[r0 * groups..(r0 + rows) * groups],
            zt: &x.zt[r0 * groups..(r0 + rows) * groups],
            rows,
            k,
            g,
        };
        by_panel(&block, w, bias, cb)
    })
}

/// [`gemm`] for one block of rows: tasks over panels, each packing its panel into its own
/// scratch and running every row's tiles on it while it is in cache (the whole weight packed
/// first went through memory, twice the weight's bytes written and read back per call: at 1
/// to 16 rows most of a call), then each panel's outputs copied to their columns of `c`.
fn by_panel(x: &XCodes<'_>, w: &Int4W, bias: Option<&[f32]>, c: &mut [f32]) -> bool {
    let (m, k, g, n) = (x.rows, x.k, x.g, w.packed.rows);
    let panels = n.div_ceil(W4A8_PANEL);
    let (pc, ps) = panel_sizes(k, g);
    let groups = k / g;
    let refused = AtomicBool::new(false);
    with_scratch(panels * m * W4A8_PANEL, |outs: &mut [f32]| {
        outs.par_chunks_mut(m * W4A8_PANEL).enumerate().for_each(|(p, po)| {
            with_scratch(pc.div_ceil(4) + ps, |buf: &mut [f32]| {
                let (cw, sp) = buf.split_at_mut(pc.div_ceil(4));
                let cp: &mut [u8] = &mut bytemuck::cast_slice_mut(cw)[..pc];
                pack_panel(w, p, cp, sp);
                let mut out = [[0f32; W4A8_PANEL]; W4A8_ROWS];
                for r in (0..m).step_by(W4A8_ROWS) {
                    let rows = W4A8_ROWS.min(m - r);
                    let t = W4a8Tile {
                        codes: cp,
                        scales: sp,
                        x: &x.codes[r * k..(r + rows) * k],
                        sx: &x.sx[r * groups..(r + rows) * groups],
                        zt: &x.zt[r * groups..(r + rows) * groups],
                        rows,
                        k,
                        g,
                    };
                    if !simd::w4a8_tile(&t, &mut out) {
                        refused.store(true, Ordering::Relaxed);
                        return;
                    }
                    for (j, o) in out.iter().enumerate().take(rows) {
                        po[(r + j) * W4A8_PANEL..(r + j + 1) * W4A8_PANEL].copy_from_slice(o);
                    }
                }
            });
        });
        for (p, po) in outs.chunks(m * W4A8_PANEL).enumerate() {
            let (c0, cols) = (p * W4A8_PANEL, W4A8_PANEL.min(n - p * W4A8_PANEL));
            for (r, o) in po.chunks(W4A8_PANEL).enumerate() {
                let dst = &mut c[r * n + c0..r * n + c0 + cols];
                dst.copy_from_slice(&o[..cols]);
                if let Some(b) = bias {
                    dst.iter_mut().zip(&b[c0..c0 + cols]).for_each(|(v, b)| *v += b);
                }
            }
        }
    });
    !refused.into_inner()
}
