//! Decode GEMV over `int4` weights (`w = (q - zero) * scale`, blocks of a multiple of 32
//! input features): each block's sum `scale * sum((q - zero) * x)` is taken with the codes
//! widened in registers, sixteen lanes of low nibbles against x's even elements and sixteen
//! of high nibbles against its odd ones (x split once per call), so a weight is never
//! written out dequantized. The table formats (nf4, mxfp4, nvfp4) keep the row decoder.

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
                part[j * m + i] = dot(bytes, scales, zeros, w.g, even, odd);
            }
        }
    });
}

#[inline(always)]
fn dot_impl<const FMA: bool>(bytes: &[u8], scales: &[f32], zeros: &[f32], g: usize, even: &[f32], odd: &[f32]) -> f32 {
    const L: usize = 16;
    let fma = |a: f32, b: f32, c: f32| if FMA { a.mul_add(b, c) } else { c + a * b };
    let mut acc = [0f32; L];
    let per_group = g / 2;
    for (gi, ((gb, ge), go)) in
        bytes.chunks_exact(per_group).zip(even.chunks_exact(per_group)).zip(odd.chunks_exact(per_group)).enumerate()
    {
        let (s, z) = (scales[gi], zeros[gi]);
        let mut t = [0f32; L];
        for ((b, e), o) in gb.chunks_exact(L).zip(ge.chunks_exact(L)).zip(go.chunks_exact(L)) {
            for l in 0..L {
                let lo = f32::from(b[l] & 0x0F) - z;
                let hi = f32::from(b[l] >> 4) - z;
                t[l] = fma(hi, o[l], fma(lo, e[l], t[l]));
            }
        }
        for l in 0..L {
            acc[l] = fma(s, t[l], acc[l]);
        }
    }
    for width in [8, 4, 2, 1] {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0]
}

/// One row's dot with x, x given as its even and odd elements.
fn dot(bytes: &[u8], scales: &[f32], zeros: &[f32], g: usize, even: &[f32], odd: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        /// # Safety
        /// The CPU must support AVX-512F, AVX-512VL, AVX2, FMA.
        #[allow(unsafe_code)]
        #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
        unsafe fn with_avx512(b: &[u8], s: &[f32], z: &[f32], g: usize, e: &[f32], o: &[f32]) -> f32 {
            dot_impl::<true>(b, s, z, g, e, o)
        }
        /// # Safety
        /// The CPU must support AVX2, FMA.
        #[allow(unsafe_code)]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn with_avx2(b: &[u8], s: &[f32], z: &[f32], g: usize, e: &[f32], o: &[f32]) -> f32 {
            dot_impl::<true>(b, s, z, g, e, o)
        }
        match simd::level() {
            #[allow(unsafe_code)]
            // SAFETY: `level()` is Avx512 only when the CPU reports AVX-512F/VL, AVX2 and FMA.
            simd::Level::Avx512 => return unsafe { with_avx512(bytes, scales, zeros, g, even, odd) },
            #[allow(unsafe_code)]
            // SAFETY: `level()` is Avx2 only when the CPU reports AVX2 and FMA.
            simd::Level::Avx2 => return unsafe { with_avx2(bytes, scales, zeros, g, even, odd) },
            simd::Level::Portable => {}
        }
    }
    dot_impl::<false>(bytes, scales, zeros, g, even, odd)
}
