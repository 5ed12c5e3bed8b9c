//! RoPE fused into attention: q and k rows are rotated as the engine reads them (a query
//! tile into its scratch, a key row into its packed panel or the decode path's scratch), so
//! no rotated copy of q or k is ever materialised. Frequencies are those of `cpu.rope.fast`
//! (`semantics::rope_frequencies`), the angles' cos/sin computed in f64 (see [`ANCHOR`]); the
//! rotation itself is f32, the precision of every tile product after it.

use rayon::prelude::*;

use layerzero_core::exec::executor::KernelError;
use layerzero_core::exec::semantics::rope_frequencies;
use layerzero_core::model::attrs::{RopeAttrs, RopeStyle};

use crate::pack::invalid;

/// Positions per block of the table: each block starts from exact cos/sin (f64) and steps
/// by the angle-addition identity in f64 (63 steps drift by ~1e-14, far below f32's 6e-8),
/// a few multiplies per entry instead of two transcendental calls.
const ANCHOR: usize = 64;
/// Tables smaller than this are filled on the calling thread (a decode step's few dozen rows).
const SEQUENTIAL_BELOW: usize = 1 << 14;

/// Fills rows `p0..` of one block (`c`, `s`: `[rows][inv_freq.len()]`).
fn angles(inv_freq: &[f64], factor: f64, p0: usize, c: &mut [f32], s: &mut [f32]) {
    let half = inv_freq.len();
    for (i, f) in inv_freq.iter().enumerate() {
        let (step_c, step_s) = (f.cos(), f.sin());
        let theta = p0 as f64 * f;
        let (mut x, mut y) = (theta.cos(), theta.sin());
        for (cr, sr) in c.chunks_exact_mut(half).zip(s.chunks_exact_mut(half)) {
            cr[i] = (x * factor) as f32;
            sr[i] = (y * factor) as f32;
            (x, y) = (x * step_c - y * step_s, y * step_c + x * step_s);
        }
    }
}

/// cos and sin (attention factor folded in) of positions `0..positions`, `[position][half]`.
#[derive(Debug)]
pub(crate) struct Rotary {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
    style: RopeStyle,
}

impl Rotary {
    /// The table of `attrs` for head dim `d` and positions `0..positions` (the length a
    /// dynamic NTK scaling adapts to, as `cpu.rope.fast` given those positions).
    pub(crate) fn new(attrs: &RopeAttrs, d: usize, positions: usize) -> Result<Rotary, KernelError> {
        let rot = match attrs.rotary_dim {
            None => d,
            Some(r) => usize::try_from(r).unwrap_or(usize::MAX),
        };
        if rot % 2 != 0 || rot > d {
            return Err(invalid(format!("attrs.rope.rotary_dim is {rot}; it must be even and at most head_dim {d}")));
        }
        let half = rot / 2;
        let (inv_freq, factor) = rope_frequencies(attrs, rot, positions);
        let (mut cos, mut sin) = (vec![0f32; positions * half], vec![0f32; positions * half]);
        if half > 0 {
            let block = |(b, (c, s)): (usize, (&mut [f32], &mut [f32]))| angles(&inv_freq, factor, b * ANCHOR, c, s);
            let chunks = ANCHOR * half;
            if positions * half < SEQUENTIAL_BELOW {
                cos.chunks_mut(chunks).zip(sin.chunks_mut(chunks)).enumerate().for_each(block);
            } else {
                cos.par_chunks_mut(chunks).zip(sin.par_chunks_mut(chunks)).enumerate().for_each(block);
            }
        }
        Ok(Rotary { cos, sin, half, style: attrs.style })
    }

    /// Rotates one head row `x` (head_dim values) in place at position `pos`; dims past the
    /// rotary dim pass through.
    #[inline]
    pub(crate) fn apply(&self, pos: usize, x: &mut [f32]) {
        let h = self.half;
        let (Some(c), Some(s)) = (self.cos.get(pos * h..(pos + 1) * h), self.sin.get(pos * h..(pos + 1) * h)) else {
            return;
        };
        match self.style {
            RopeStyle::RotateHalf => {
                let (lo, hi) = x.split_at_mut(h);
                for (((a, b), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(c).zip(s) {
                    let (x0, x1) = (*a, *b);
                    *a = x0 * c - x1 * s;
                    *b = x1 * c + x0 * s;
                }
            }
            RopeStyle::Interleaved => {
                for ((p, &c), &s) in x.chunks_exact_mut(2).zip(c).zip(s) {
                    let (x0, x1) = (p[0], p[1]);
                    p[0] = x0 * c - x1 * s;
                    p[1] = x1 * c + x0 * s;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use layerzero_core::model::attrs::RopeScaling;

    #[test]
    fn section_6_6_the_fused_table_holds_the_f64_angles_at_every_position_of_a_long_context() -> TestResult {
        // 5000 positions x 64 pairs: the parallel fill, 78 anchored blocks.
        let attrs = RopeAttrs {
            scaling: Some(RopeScaling::Yarn {
                factor: 4.0,
                original_max_position: 1024,
                beta_fast: 32.0,
                beta_slow: 1.0,
            }),
            ..RopeAttrs::default()
        };
        let r = Rotary::new(&attrs, 128, 5000)?;
        let (inv, factor) = rope_frequencies(&attrs, 128, 5000);
        let mut worst = 0f64;
        for pos in 0..5000 {
            for (i, f) in inv.iter().enumerate() {
                let theta = pos as f64 * f;
                let e = pos * 64 + i;
                worst = worst.max((f64::from(r.cos[e]) - theta.cos() * factor).abs());
                worst = worst.max((f64::from(r.sin[e]) - theta.sin() * factor).abs());
            }
        }
        // f32 rounding of values up to the YaRN factor (1.14) is 6.8e-8.
        assert!(worst < 1.5e-7, "worst |table - f64| = {worst:e}");
        Ok(())
    }

    #[test]
    fn section_6_6_a_rotary_dim_past_the_head_or_odd_is_refused() {
        for rot in [7, 66] {
            let attrs = RopeAttrs { rotary_dim: Some(rot), ..RopeAttrs::default() };
            assert!(Rotary::new(&attrs, 64, 8).is_err(), "rotary_dim {rot} of head_dim 64 must be refused");
        }
    }
}
