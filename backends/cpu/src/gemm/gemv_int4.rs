//! Decode GEMV over `int4` weights (`w = (q - zero) * scale`, blocks of a multiple of 32
//! input features): x split once per call into its even and odd elements, then each weight
//! row dotted by [`simd::dot_int4`] (codes widened in registers, never a dequantized row).
//! The table formats (nf4, mxfp4, nvfp4) keep the row decoder.

use super::weights::Int4W;
use crate::alloc::with_scratch;
use crate::pack::read_f32;
use crate::simd;
use layerzero_core::model::w4::W4Format;

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
    // then the row's scales and zero points, per weight row.
    with_scratch(m * k + 2 * groups, |buf: &mut [f32]| {
        let (split, rest) = buf.split_at_mut(m * k);
        for (row, out) in x.chunks_exact(k).zip(split.chunks_exact_mut(k)).take(m) {
            let (even, odd) = out.split_at_mut(k / 2);
            for (j, pair) in row.chunks_exact(2).enumerate() {
                even[j] = pair[0];
                odd[j] = pair[1];
            }
        }
        let (scales, zeros) = rest.split_at_mut(groups);
        for j in 0..nb {
            let n = n0 + j;
            read_f32(w.scales.st, w.scales.at(n, 0), w.scales.cs, scales);
            match &w.zeros {
                Some(z) => read_f32(z.st, z.at(n, 0), z.cs, zeros),
                None => zeros.fill(8.0),
            }
            let start = w.packed.at(n, 0);
            let bytes: &[u8] = bytemuck::cast_slice(&w.bytes[start..start + k / 2]);
            for i in 0..m {
                let (even, odd) = split[i * k..(i + 1) * k].split_at(k / 2);
                part[j * m + i] = simd::dot_int4(bytes, scales, zeros, w.g, even, odd);
            }
        }
    });
}
