//! RoPE fused into attention: q and k rows are rotated as the engine reads them (a query
//! tile into its scratch, a key row into its packed panel or the decode path's scratch), so
//! no rotated copy of q or k is ever materialised. Angles are those of `cpu.rope.fast`
//! (`semantics::rope_frequencies`, computed in f64 per position); the rotation itself is
//! f32, the precision of every tile product after it.

use layerzero_core::exec::executor::KernelError;
use layerzero_core::exec::semantics::rope_frequencies;
use layerzero_core::model::attrs::{RopeAttrs, RopeStyle};

use crate::pack::invalid;

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
        let (mut cos, mut sin) = (Vec::with_capacity(positions * half), Vec::with_capacity(positions * half));
        for pos in 0..positions {
            for f in &inv_freq {
                let theta = pos as f64 * f;
                cos.push((theta.cos() * factor) as f32);
                sin.push((theta.sin() * factor) as f32);
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
