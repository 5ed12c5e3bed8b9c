//! Prefill of int4 weights against int8 activations (`linear_int4` with `attrs.activations
//! = int8` and more rows than the decode GEMV takes): x rounded to its int8 codes once per
//! call ([`XCodes`]), the weight's codes repacked once per call into panels of 32 columns
//! with four consecutive k per 32-bit lane ([`pack_panels`]), then register tiles of up to
//! four rows by one panel ([`simd::w4a8_tile`], `vpdpbusd`), rayon tasks over blocks of
//! rows. This is llama.cpp's Q4_0 x Q8_0 product as a GEMM: the sums within a block are
//! exact integers and only the block's scales are applied in f32, where the f32 GEMM ran on
//! dequantized weights (each code decoded and widened first).
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

/// The weight's codes and scales in panels of [`W4A8_PANEL`] columns (`codes`: per panel
/// `[k / 4][32][4]`, `scales`: `[k / g][32]`, times the weight's global scale); columns past
/// `n` are zeros.
fn pack_panels(w: &Int4W, codes: &mut [u8], scales: &mut [f32]) {
    let (k, g) = (w.k, w.g);
    let (pc, ps) = panel_sizes(k, g);
    let n = w.packed.rows;
    codes.par_chunks_mut(pc).zip(scales.par_chunks_mut(ps)).enumerate().for_each(|(p, (cp, sp))| {
        let cols = W4A8_PANEL.min(n - p * W4A8_PANEL);
        // Each column's bytes (`k / 2` from its row's start), columns past `n` none.
        let rows: [&[i8]; W4A8_PANEL] = std::array::from_fn(|c| {
            let start = if c < cols { w.packed.at(p * W4A8_PANEL + c, 0) } else { 0 };
            if c < cols { &w.bytes[start..start + k / 2] } else { &[] }
        });
        // A k-step at a time, its 32 lanes written in order: a lane is four k from two bytes
        // (even element in the low nibble), one nibble per byte.
        let lanes: &mut [u32] = bytemuck::cast_slice_mut(cp);
        for (s, step) in lanes.chunks_exact_mut(W4A8_PANEL).enumerate() {
            for (lane, row) in step.iter_mut().zip(&rows) {
                *lane = row.get(2 * s..2 * s + 2).map_or(0, |b| {
                    let v = u32::from(b[0] as u8) | (u32::from(b[1] as u8) << 8);
                    ((v & 0xF) | ((v << 4) & 0xF00) | ((v << 8) & 0xF_0000) | ((v << 12) & 0xF00_0000)).to_le()
                });
            }
        }
        let mut row_scales = vec![0f32; k / g];
        for c in 0..W4A8_PANEL {
            if c >= cols {
                (0..k / g).for_each(|b| sp[b * W4A8_PANEL + c] = 0.0);
                continue;
            }
            let col = p * W4A8_PANEL + c;
            read_f32(w.scales.st, w.scales.at(col, 0), w.scales.cs, &mut row_scales);
            for (b, s) in row_scales.iter().enumerate() {
                sp[b * W4A8_PANEL + c] = s * w.global;
            }
        }
    });
}

/// `c [m, n] = x . W^T (+ bias)` for x's codes; `false` when the weight or the shapes are not
/// what [`serves`] and [`with_codes`] made (a caller's bug, not data: `c` is then not the
/// product, and the caller must not use it).
pub(crate) fn gemm(x: &XCodes<'_>, w: &Int4W, bias: Option<&[f32]>, c: &mut [f32]) -> bool {
    let (m, k, g, n) = (x.rows, x.k, x.g, w.packed.rows);
    if !serves(w) || w.k != k || w.g != g || c.len() < m * n || bias.is_some_and(|b| b.len() < n) || m == 0 {
        return false;
    }
    let panels = n.div_ceil(W4A8_PANEL);
    let (pc, ps) = panel_sizes(k, g);
    let groups = k / g;
    let refused = AtomicBool::new(false);
    with_scratch((panels * pc).div_ceil(4), |cw: &mut [f32]| {
        with_scratch(panels * ps, |scales: &mut [f32]| {
            let codes: &mut [u8] = &mut bytemuck::cast_slice_mut(cw)[..panels * pc];
            pack_panels(w, codes, scales);
            let (codes, scales) = (&*codes, &*scales);
            // Blocks of whole tiles, enough for every thread twice over.
            let tasks = 2 * rayon::current_num_threads().max(1);
            let block = m.div_ceil(tasks).next_multiple_of(W4A8_ROWS).max(W4A8_ROWS);
            c[..m * n].par_chunks_mut(block * n).enumerate().for_each(|(bi, cb)| {
                let r0 = bi * block;
                let mut out = [[0f32; W4A8_PANEL]; W4A8_ROWS];
                for p in 0..panels {
                    let (c0, cols) = (p * W4A8_PANEL, W4A8_PANEL.min(n - p * W4A8_PANEL));
                    for i in (0..cb.len() / n).step_by(W4A8_ROWS) {
                        let (r, rows) = (r0 + i, W4A8_ROWS.min(cb.len() / n - i));
                        let t = W4a8Tile {
                            codes: &codes[p * pc..(p + 1) * pc],
                            scales: &scales[p * ps..(p + 1) * ps],
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
                            let dst = &mut cb[(i + j) * n + c0..(i + j) * n + c0 + cols];
                            dst.copy_from_slice(&o[..cols]);
                            if let Some(b) = bias {
                                dst.iter_mut().zip(&b[c0..c0 + cols]).for_each(|(v, b)| *v += b);
                            }
                        }
                    }
                }
            });
        });
    });
    !refused.into_inner()
}
