//! Weights: the B operand [K, N] of `out = x . B`.

use rayon::prelude::*;

use super::gemv_int4::QuantX;
use super::view::Mat;
use crate::pack::read_f32;
use layerzero_core::model::w4::{W4Format, e8m0_f32};

/// A weight-only 4-bit matrix: `w[n, k] = code(q[n, k]) * scale[n, k / g]` by its format
/// (`layerzero_core::model::w4`); int4's code is `q - zero[n, k / g]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Int4W<'a> {
    /// Packed bytes [N, K/2] (i8 storage).
    pub(crate) packed: Mat<'a>,
    pub(crate) bytes: &'a [i8],
    pub(crate) scales: Mat<'a>,
    pub(crate) zeros: Option<Mat<'a>>,
    pub(crate) k: usize,
    pub(crate) g: usize,
    pub(crate) format: W4Format,
    /// nvfp4's per-tensor scale (1 otherwise).
    pub(crate) global: f32,
    /// x's int8 codes, when x arrives rounded to int8 in blocks of `g` (`attrs.activations =
    /// int8`) and the integer GEMV serves the call: taken once per call, read by every task.
    pub(crate) xq: Option<QuantX<'a>>,
}

impl Int4W<'_> {
    /// Decodes stored scales in place (mxfp4's E8M0 bytes, nvfp4's global scale).
    fn decode_scales(&self, sc: &mut [f32]) {
        match self.format {
            // The i8 storage holds the exponent byte: reinterpret, never convert.
            W4Format::Mxfp4 => sc.iter_mut().for_each(|s| *s = e8m0_f32(*s as i8 as u8)),
            W4Format::Nvfp4 => sc.iter_mut().for_each(|s| *s *= self.global),
            W4Format::Int4 | W4Format::Nf4 => {}
        }
    }

    /// The 16 values of group `gi` of row `n` with scale `s`, by code (`codes`: the format's
    /// unscaled values).
    fn lut(&self, codes: &[f32; 16], n: usize, gi: usize, s: f32) -> [f32; 16] {
        if self.format != W4Format::Int4 {
            return std::array::from_fn(|q| codes[q] * s);
        }
        let mut zc = [8f32; 1];
        if let Some(z) = &self.zeros {
            read_f32(z.st, z.at(n, gi), 1, &mut zc);
        }
        // (q - zero) * scale, exactly as element-wise.
        std::array::from_fn(|q| (q as f32 - zc[0]) * s)
    }

    /// Dequantizes weight row `n` (length K) into `out`.
    pub(crate) fn row(&self, n: usize, out: &mut [f32]) {
        self.row_part(n, 0, &mut out[..self.k]);
    }

    /// Dequantizes columns `p0..p0 + out.len()` of weight row `n` into `out`: whole groups
    /// (`p0` and `out.len()` multiples of the group size).
    pub(crate) fn row_part(&self, n: usize, p0: usize, out: &mut [f32]) {
        const CHUNK: usize = 64;
        let (ga, gb) = (p0 / self.g, (p0 + out.len()) / self.g);
        let codes: [f32; 16] = std::array::from_fn(|q| self.format.code(q as u8));
        // The row's scales are read CHUNK groups at a time (one call, not one per group).
        let mut sc = [0f32; CHUNK];
        for g0 in (ga..gb).step_by(CHUNK) {
            let cnt = CHUNK.min(gb - g0);
            read_f32(self.scales.st, self.scales.at(n, g0), self.scales.cs, &mut sc[..cnt]);
            self.decode_scales(&mut sc[..cnt]);
            for (i, &s) in sc[..cnt].iter().enumerate() {
                let gi = g0 + i;
                let lut = self.lut(&codes, n, gi, s);
                self.group(n, gi, lut, &mut out[(gi - ga) * self.g..(gi - ga + 1) * self.g]);
            }
        }
    }

    /// Decodes group `gi` of row `n` through its table into `dst` (length g).
    #[inline]
    fn group(&self, n: usize, gi: usize, lut: [f32; 16], dst: &mut [f32]) {
        // The nibble of the even element: low, or high for nf4 (bitsandbytes' order).
        let (even, odd) = if self.format.high_nibble_first() { (4, 0) } else { (0, 4) };
        let put = |pair: &mut [f32], b: u8| {
            pair[0] = lut[usize::from((b >> even) & 0x0F)];
            pair[1] = lut[usize::from((b >> odd) & 0x0F)];
        };
        let b0 = gi * self.g / 2;
        if self.packed.cs == 1 {
            // A contiguous row of bytes: one slice, no index arithmetic per byte.
            let start = self.packed.at(n, b0);
            for (pair, &b) in dst.chunks_exact_mut(2).zip(&self.bytes[start..start + self.g / 2]) {
                put(pair, b as u8);
            }
        } else {
            for (j, pair) in dst.chunks_exact_mut(2).enumerate() {
                put(pair, self.bytes[self.packed.at(n, b0 + j)] as u8);
            }
        }
    }
}

/// The B operand of a linear: [K, N].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Weights<'a> {
    /// A dense view of any float dtype.
    Dense(Mat<'a>),
    /// Packed int4 (always read by output column, i.e. by weight row).
    Int4(Int4W<'a>),
}

impl Weights<'_> {
    pub(super) fn k(&self) -> usize {
        match self {
            Weights::Dense(b) => b.rows,
            Weights::Int4(w) => w.k,
        }
    }

    pub(super) fn n(&self) -> usize {
        match self {
            Weights::Dense(b) => b.cols,
            Weights::Int4(w) => w.packed.rows,
        }
    }

    /// Bytes of B as a GEMV weighs them for splitting (stored bytes; int4: see below).
    pub(super) fn bytes(&self) -> usize {
        match self {
            Weights::Dense(b) => b.rows * b.cols * b.st.dtype().size_bytes() as usize,
            // What the split threshold weighs is time: an int4 row costs its decoding, about
            // what streaming the row in bf16 costs, not its quarter-size bytes.
            Weights::Int4(w) => w.k * w.packed.rows * 2,
        }
    }

    /// True when B is read column by column (one weight row of K elements at a time).
    pub(super) fn by_column(&self) -> bool {
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
    pub(super) fn panel(&self, n0: usize, w: usize, buf: &mut Vec<f32>) -> (usize, usize) {
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
