//! Decode GEMV over `int4` weights (`w = (q - zero) * scale`, blocks of a multiple of 32
//! input features): x split once per call into its even and odd elements, then each weight
//! row dotted by [`simd::dot_int4`] (codes widened in registers, never a dequantized row).
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

/// True when [`columns`] serves this weight: `int4` codes, blocks of whole steps, and each
/// weight row's bytes contiguous.
pub(super) fn serves(w: &Int4W) -> bool {
    w.format == W4Format::Int4 && w.g.is_multiple_of(STEP) && w.k.is_multiple_of(STEP) && w.packed.cs == 1
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
    let in_place = match w.scales.st {
        Storage::F32(v) if w.scales.cs == 1 && w.scales.rs == groups => {
            v.get(w.scales.at(n0, 0)..w.scales.at(n0, 0) + nb * groups)
        }
        _ => None,
    };
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
