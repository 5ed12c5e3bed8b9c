//! Weights: the B operand [K, N] of `out = x . B`.

use rayon::prelude::*;

use super::view::Mat;
use crate::pack::read_f32;

/// A weight-only int4 matrix: `w[n, k] = (q[n, k] - zero[n, k / g]) * scale[n, k / g]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Int4W<'a> {
    /// Packed bytes [N, K/2] (i8 storage).
    pub(crate) packed: Mat<'a>,
    pub(crate) bytes: &'a [i8],
    pub(crate) scales: Mat<'a>,
    pub(crate) zeros: Option<Mat<'a>>,
    pub(crate) k: usize,
    pub(crate) g: usize,
}

impl Int4W<'_> {
    /// Dequantizes weight row `n` (length K) into `out`.
    pub(super) fn row(&self, n: usize, out: &mut [f32]) {
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

    /// Bytes of B as stored (what a GEMV streams).
    pub(super) fn bytes(&self) -> usize {
        match self {
            Weights::Dense(b) => b.rows * b.cols * b.st.dtype().size_bytes() as usize,
            Weights::Int4(w) => w.k * w.packed.rows / 2,
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
