//! Decode GEMV over `int4` weights (`w = (q - zero) * scale`, blocks of a multiple of 32
//! input features), a weight row at a time:
//!
//! - [`columns`]: x split once per call into its even and odd elements, then each row dotted
//!   by [`simd::dot_int4`] (codes widened in registers, never a dequantized row).
//! - [`columns_i8`]: x already rounded to int8 in blocks (`attrs.activations = int8`) and
//!   taken back to its codes once per call ([`QuantX`]), then each row dotted in integers by
//!   [`simd::dot_int4_i8`] (llama.cpp's Q4_0 x Q8_0 product).
//!
//! The table formats (nf4, mxfp4, nvfp4) keep the row decoder.

use super::view::Mat;
use super::weights::Int4W;
use crate::alloc::with_scratch;
use crate::pack::read_f32;
use crate::simd;
use layerzero_core::model::w4::W4Format;
use layerzero_core::tensor::Storage;

/// Codes per 16-byte step (two per byte).
const STEP: usize = 32;

/// x rows [`columns_i8`] holds at once (the GEMV's most).
const I8_ROWS: usize = super::GEMV_MAX_M;

/// True when [`columns`] serves this weight: `int4` codes, blocks of whole steps, and each
/// weight row's bytes contiguous.
pub(super) fn serves(w: &Int4W) -> bool {
    w.format == W4Format::Int4 && w.g.is_multiple_of(STEP) && w.k.is_multiple_of(STEP) && w.packed.cs == 1
}

/// True when [`columns_i8`] can serve this weight for x rounded to int8: as [`columns`],
/// with the zero point 8 (no `zeros`), rows of whole 64-byte steps and groups of 32, 64 or a
/// multiple of 128 (those map onto the kernel's lanes).
pub(crate) fn serves_i8(w: &Int4W) -> bool {
    serves(w) && w.zeros.is_none() && w.k.is_multiple_of(128) && (w.g == 32 || w.g == 64 || w.g.is_multiple_of(128))
}

/// The rows of an x rounded to int8 taken back to their codes, as [`simd::dot_int4_i8`]
/// reads them: per row, `k / 2` codes at even positions, `k / 2` at odd ones, and per lane
/// of eight codes its zero-point term (`-8 * sum`) and its block's scale.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuantX<'a> {
    words: &'a [f32],
    k: usize,
}

impl<'a> QuantX<'a> {
    /// f32 words of scratch that [`QuantX::fill`] takes for `m` rows of `k` in groups of `g`.
    pub(crate) fn words(m: usize, k: usize, g: usize) -> usize {
        m * (k / 2) + k / 4 + k / g
    }

    /// The codes of `x` (`[m, k]` row-major, each row already rounded in blocks of `g`), in
    /// `buf` (of [`QuantX::words`]); `None` when an element is not finite (a code cannot
    /// carry it: the f32 path must).
    pub(crate) fn fill(x: &[f32], k: usize, g: usize, buf: &'a mut [f32]) -> Option<QuantX<'a>> {
        let (rows, rest) = buf.split_at_mut(x.len() / 2);
        let (codes, xs) = rest.split_at_mut(k / 4);
        let codes: &mut [i8] = bytemuck::cast_slice_mut(codes);
        for (xr, row) in x.chunks_exact(k).zip(rows.chunks_exact_mut(k / 2)) {
            if !simd::int8_blocks(xr, g, codes, &mut xs[..k / g]) {
                return None;
            }
            let (split, rest) = row.split_at_mut(k / 4);
            let (zc, sx) = rest.split_at_mut(k / 8);
            let split: &mut [i8] = bytemuck::cast_slice_mut(split);
            let (even, odd) = split.split_at_mut(k / 2);
            for (j, pair) in codes.chunks_exact(2).enumerate() {
                even[j] = pair[0];
                odd[j] = pair[1];
            }
            let zc: &mut [i32] = bytemuck::cast_slice_mut(zc);
            for (l, ((z, s), c)) in zc.iter_mut().zip(sx.iter_mut()).zip(codes.chunks_exact(8)).enumerate() {
                *z = -8 * c.iter().map(|&c| i32::from(c)).sum::<i32>();
                *s = xs[8 * l / g];
            }
        }
        Some(QuantX { words: rows, k })
    }

    /// Row `i`: (even codes, odd codes, lanes' zero-point terms, lanes' scales).
    fn row(&self, i: usize) -> (&'a [i8], &'a [i8], &'a [i32], &'a [f32]) {
        let k = self.k;
        let row = &self.words[i * (k / 2)..(i + 1) * (k / 2)];
        let (split, rest) = row.split_at(k / 4);
        let (zc, sx) = rest.split_at(k / 8);
        let split: &[i8] = bytemuck::cast_slice(split);
        let (even, odd) = split.split_at(k / 2);
        (even, odd, bytemuck::cast_slice(zc), sx)
    }
}

/// The scales of rows `n0..n0 + nb` where they can be read in place (contiguous f32 rows).
fn scales_in_place<'a>(w: &Int4W<'a>, n0: usize, nb: usize, groups: usize) -> Option<&'a [f32]> {
    match w.scales.st {
        Storage::F32(v) if w.scales.cs == 1 && w.scales.rs == groups => {
            v.get(w.scales.at(n0, 0)..w.scales.at(n0, 0) + nb * groups)
        }
        _ => None,
    }
}

/// Columns `n0..n0 + part.len() / m` of `x . W^T` into `part` (`[nb, m]`) from x's codes
/// (`xq`, taken once per call): every weight row dotted with x's rows in integer lanes,
/// four rows per pass over it.
pub(super) fn columns_i8(xq: &QuantX, m: usize, w: &Int4W, n0: usize, part: &mut [f32]) {
    let (k, g, groups) = (w.k, w.g, w.k / w.g);
    let nb = part.len() / m;
    let in_place = scales_in_place(w, n0, nb, groups);
    let converted = if in_place.is_some() { 0 } else { nb * groups };
    with_scratch(converted, |conv: &mut [f32]| {
        let scales: &[f32] = match in_place {
            Some(v) => v,
            None => {
                read_rows(&w.scales, n0, groups, conv);
                conv
            }
        };
        // x's rows in chunks of up to I8_ROWS (one chunk unless a caller passes more).
        for i0 in (0..m).step_by(I8_ROWS) {
            let cnt = I8_ROWS.min(m - i0);
            let mut rows = [simd::XRow::default(); I8_ROWS];
            for (i, r) in rows.iter_mut().enumerate().take(cnt) {
                let (xe, xo, zc, sx) = xq.row(i0 + i);
                *r = simd::XRow { xe, xo, zc, sx };
            }
            for j in 0..nb {
                let start = w.packed.at(n0 + j, 0);
                let bytes: &[u8] = bytemuck::cast_slice(&w.bytes[start..start + k / 2]);
                let sw = &scales[j * groups..(j + 1) * groups];
                simd::dot_int4_i8_rows(bytes, sw, g, &rows[..cnt], &mut part[j * m + i0..j * m + i0 + cnt]);
            }
        }
    });
}

/// Columns `n0..n0 + part.len() / m` of `x . W^T` into `part` (`[nb, m]`), for the `m`
/// rows of `x` (each `w.k` long).
pub(super) fn columns(x: &[f32], m: usize, w: &Int4W, n0: usize, part: &mut [f32]) {
    let (k, groups) = (w.k, w.k / w.g);
    let nb = part.len() / m;
    // x's rows split into even and odd elements (the low and the high nibbles' partners),
    // then every scale and zero point of the task's rows read at once (one conversion of
    // f16 scales, not one call per row: a row's dot is only a few dozen blocks).
    // Scales in place where they are contiguous f32 rows (else converted once for the task's
    // rows); without zero points, one row of 8s serves every row.
    let in_place = scales_in_place(w, n0, nb, groups);
    let zrows = if w.zeros.is_some() { nb * groups } else { groups };
    let converted = if in_place.is_some() { 0 } else { nb * groups };
    with_scratch(m * k + m * groups + converted + zrows, |buf: &mut [f32]| {
        let (split, rest) = buf.split_at_mut(m * k);
        let (xsums, rest) = rest.split_at_mut(m * groups);
        for ((row, out), xsum) in x.chunks_exact(k).zip(split.chunks_exact_mut(k)).zip(xsums.chunks_exact_mut(groups)) {
            let (even, odd) = out.split_at_mut(k / 2);
            for (j, pair) in row.chunks_exact(2).enumerate() {
                even[j] = pair[0];
                odd[j] = pair[1];
            }
            for (s, block) in xsum.iter_mut().zip(row.chunks_exact(w.g)) {
                *s = block.iter().sum();
            }
        }
        let (conv, zeros) = rest.split_at_mut(converted);
        let scales: &[f32] = match in_place {
            Some(v) => v,
            None => {
                read_rows(&w.scales, n0, groups, conv);
                conv
            }
        };
        match &w.zeros {
            Some(z) => read_rows(z, n0, groups, zeros),
            None => zeros.fill(8.0),
        }
        for j in 0..nb {
            let start = w.packed.at(n0 + j, 0);
            let bytes: &[u8] = bytemuck::cast_slice(&w.bytes[start..start + k / 2]);
            let s = &scales[j * groups..(j + 1) * groups];
            let z = if w.zeros.is_some() { &zeros[j * groups..(j + 1) * groups] } else { &zeros[..groups] };
            for i in 0..m {
                let (even, odd) = split[i * k..(i + 1) * k].split_at(k / 2);
                let xsum = &xsums[i * groups..(i + 1) * groups];
                part[j * m + i] = simd::dot_int4(bytes, s, z, w.g, even, odd, xsum);
            }
        }
    });
}

/// Rows `n0..n0 + out.len() / cols` of `t` (`[N, cols]`) as f32: one read where they are
/// contiguous, else a row at a time.
fn read_rows(t: &Mat, n0: usize, cols: usize, out: &mut [f32]) {
    if t.cs == 1 && t.rs == cols {
        read_f32(t.st, t.at(n0, 0), 1, out);
        return;
    }
    for (j, row) in out.chunks_exact_mut(cols).enumerate() {
        read_f32(t.st, t.at(n0 + j, 0), t.cs, row);
    }
}
