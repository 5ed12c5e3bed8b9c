//! Perf axes: the request dimensions that are bucketed rather than matched exactly.
//!
//! Each op names its perf axes (batch, sequence lengths, tokens) and every tensor
//! dimension that carries one. Everything else a check can read stays exact in the
//! selection key. Ops whose checks read their sizes in ways a bucket could straddle
//! (quantization scale grids are `ceil(rows / block)`, RoPE position tables) have no perf
//! axes: their key is exact.

use super::bucket::Anchor;
use crate::error::{Error, Result};
use crate::model::layout::Layout;
use crate::model::op::Op;
use crate::model::request::Request;
use crate::model::tensor::TensorDesc;

/// Most perf axes any op has.
pub const MAX_AXES: usize = 3;

/// Where a perf axis lives in a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    /// A fixed dimension index.
    At(usize),
    /// The sequence dimension of a BSHD (1) or BHSD (2) tensor.
    Seq,
}

/// One perf axis of an op.
#[derive(Debug, Clone, Copy)]
pub struct Axis {
    /// Its name in workloads, tables and reports.
    pub name: &'static str,
    /// Its bucket anchor.
    pub anchor: Anchor,
    /// Every (tensor, dimension) that holds it; the first present one gives the value.
    pub at: &'static [(&'static str, Dim)],
}

const BATCH: Anchor = Anchor::pow2(1024);
const SEQ: Anchor = Anchor::pow2(1 << 20);
const TOKENS: Anchor = Anchor::pow2(1 << 20);
const PAGES: Anchor = Anchor::pow2(1 << 16);

const ATTENTION: &[Axis] = &[
    Axis {
        name: "batch",
        anchor: BATCH,
        at: &[("q", Dim::At(0)), ("k", Dim::At(0)), ("v", Dim::At(0)), ("mask", Dim::At(0))],
    },
    Axis { name: "seq_q", anchor: SEQ, at: &[("q", Dim::Seq), ("mask", Dim::At(2))] },
    Axis { name: "seq_k", anchor: SEQ, at: &[("k", Dim::Seq), ("v", Dim::Seq), ("mask", Dim::At(3))] },
];
const PAGED: &[Axis] = &[
    Axis {
        name: "batch",
        anchor: BATCH,
        at: &[("q", Dim::At(0)), ("block_table", Dim::At(0)), ("context_lens", Dim::At(0))],
    },
    Axis { name: "pages", anchor: PAGES, at: &[("block_table", Dim::At(1))] },
];
const ROWS_X: &[Axis] = &[Axis { name: "tokens", anchor: TOKENS, at: &[("x", Dim::At(0)), ("residual", Dim::At(0))] }];
const GLU: &[Axis] =
    &[Axis { name: "tokens", anchor: TOKENS, at: &[("x", Dim::At(0)), ("gate", Dim::At(0)), ("up", Dim::At(0))] }];
const LOGITS: &[Axis] = &[Axis { name: "batch", anchor: TOKENS, at: &[("logits", Dim::At(0))] }];
const IDS: &[Axis] = &[Axis { name: "tokens", anchor: TOKENS, at: &[("ids", Dim::At(0))] }];
const GEMM: &[Axis] = &[Axis { name: "m", anchor: TOKENS, at: &[("x", Dim::At(0)), ("x_scale", Dim::At(0))] }];
const IMAGES: &[Axis] = &[Axis { name: "batch", anchor: BATCH, at: &[("image", Dim::At(0))] }];
const MOE: &[Axis] = &[Axis {
    name: "tokens",
    anchor: TOKENS,
    at: &[("x", Dim::At(0)), ("experts", Dim::At(0)), ("weights", Dim::At(0))],
}];

/// The perf axes of `op` (empty: the key is exact).
pub fn axes(op: Op) -> &'static [Axis] {
    match op {
        Op::Attention => ATTENTION,
        Op::PagedAttention => PAGED,
        Op::RmsNorm | Op::LayerNorm | Op::Gelu | Op::Silu => ROWS_X,
        Op::Swiglu | Op::Geglu => GLU,
        Op::Sample | Op::MoeRoute => LOGITS,
        Op::Embedding => IDS,
        Op::Linear | Op::LinearW8a8 | Op::LinearInt4 | Op::Mlp => GEMM,
        Op::MoeExperts => MOE,
        Op::PatchEmbed => IMAGES,
        Op::Rope | Op::Quantize | Op::Dequantize | Op::Tokenize => &[],
    }
}

/// Pairs of axes whose order some check reads (causal attention compares seq_q with
/// seq_k); the key holds their order. Other pairs (batch vs seq) no check compares.
pub fn relations(op: Op) -> &'static [(usize, usize)] {
    match op {
        Op::Attention => &[(1, 2)],
        _ => &[],
    }
}

/// The index `dim` names in `t`, if `t` has it.
pub fn resolve(t: &TensorDesc, dim: Dim) -> Option<usize> {
    let i = match dim {
        Dim::At(i) => i,
        Dim::Seq => match t.layout {
            Some(Layout::Bhsd) => 2,
            _ => 1,
        },
    };
    (i < t.rank()).then_some(i)
}

/// The perf values of a request: one per axis of its op, from the first present position.
/// `None` when a request lacks every position of an axis (it is invalid; it is selected live).
pub fn values(req: &Request) -> Option<([u64; MAX_AXES], usize)> {
    let axes = axes(req.op);
    let mut out = [0u64; MAX_AXES];
    for (slot, axis) in out.iter_mut().zip(axes) {
        *slot = axis.at.iter().find_map(|(name, dim)| {
            let t = req.get(name)?;
            resolve(t, *dim).map(|i| t.shape[i])
        })?;
    }
    Some((out, axes.len()))
}

/// The positions of `tensor` that carry axis values, with the axis index.
pub fn positions_in<'a>(op: Op, tensor: &'a str, t: &'a TensorDesc) -> impl Iterator<Item = (usize, usize)> + 'a {
    axes(op).iter().enumerate().flat_map(move |(a, axis)| {
        axis.at.iter().filter(move |(n, _)| *n == tensor).filter_map(move |(_, d)| resolve(t, *d).map(|i| (i, a)))
    })
}

/// `req` with its perf axes set to `to` (one value per axis): every position holding the
/// old value takes the new one, broadcast positions (size 1 where the axis is larger) stay,
/// and explicit strides keep their ratio to the contiguous strides (a view of a fused QKV
/// stays a view of a fused QKV).
pub fn resize(req: &Request, to: &[u64]) -> Result<Request> {
    let Some((from, n)) = values(req) else {
        return Err(Error::invalid(format!("the {} request lacks a tensor that carries its perf axes", req.op)));
    };
    if to.len() != n {
        return Err(Error::invalid(format!("{} has {n} perf axes; {} values given", req.op, to.len())));
    }
    let mut out = req.clone();
    for (name, t) in out.tensors.iter_mut() {
        let old_shape = t.shape.clone();
        for (i, a) in positions_in(req.op, name, &req.tensors[name]) {
            if old_shape[i] == from[a] {
                t.shape[i] = to[a];
            }
        }
        if let Some(strides) = &t.strides {
            t.strides = Some(rescale_strides(name, &old_shape, strides, &t.shape)?);
        }
    }
    Ok(out)
}

/// New strides for `new_shape` keeping each stride's ratio to the contiguous stride.
fn rescale_strides(name: &str, old_shape: &[u64], strides: &[u64], new_shape: &[u64]) -> Result<Vec<u64>> {
    let old_c = crate::model::layout::contiguous_strides(old_shape);
    let new_c = crate::model::layout::contiguous_strides(new_shape);
    let mut out = Vec::with_capacity(strides.len());
    for (i, &s) in strides.iter().enumerate() {
        let (oc, nc) = (old_c.get(i).copied().unwrap_or(1), new_c.get(i).copied().unwrap_or(1));
        let v = if s == 0 || oc == nc {
            s
        } else if oc > 0 && s % oc == 0 {
            (s / oc).saturating_mul(nc)
        } else {
            return Err(Error::invalid(format!(
                "tensor `{name}` stride {s} of dim {i} is not a multiple of its contiguous stride {oc}; it cannot be resized"
            )));
        };
        out.push(v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::model::dtype::DType;

    fn attention(b: u64, sq: u64, sk: u64) -> Request {
        let t = |s: u64, h: u64| TensorDesc::new(DType::BF16, [b, s, h, 128]).with_layout(Layout::Bshd);
        Request::new(Op::Attention).tensor("q", t(sq, 32)).tensor("k", t(sk, 8)).tensor("v", t(sk, 8))
    }

    #[test]
    fn attention_perf_values_are_batch_and_both_sequence_lengths() {
        assert_eq!(values(&attention(2, 7, 300)), Some(([2, 7, 300], 3)));
    }

    #[test]
    fn bhsd_tensors_carry_the_sequence_in_dim_two() {
        let q = TensorDesc::new(DType::F32, [1, 32, 64, 128]).with_layout(Layout::Bhsd);
        let req = Request::new(Op::Attention).tensor("q", q.clone()).tensor("k", q.clone()).tensor("v", q);
        assert_eq!(values(&req).map(|v| v.0), Some([1, 64, 64]));
    }

    #[test]
    fn resizing_moves_every_position_and_keeps_broadcast_dims() -> TestResult {
        let mask = TensorDesc::new(DType::Bool, [1, 1, 16, 16]).with_strides([0, 0, 16, 1]);
        let req = attention(1, 16, 16).tensor("mask", mask);
        let big = resize(&req, &[1, 64, 64])?;
        assert_eq!(big.get("q").ok_or("no q")?.shape, [1, 64, 32, 128]);
        assert_eq!(big.get("mask").ok_or("no mask")?.shape, [1, 1, 64, 64]);
        assert_eq!(big.get("mask").ok_or("no mask")?.strides.as_deref(), Some(&[0, 0, 64, 1][..]));
        Ok(())
    }

    #[test]
    fn a_strided_view_stays_a_view_of_the_same_parent() -> TestResult {
        // v viewed from a fused [b, s, 3, h, d] buffer: row stride 3*h*d.
        let v = TensorDesc::new(DType::F32, [1, 16, 8, 64]).with_layout(Layout::Bshd).with_strides([
            16 * 1536,
            1536,
            64,
            1,
        ]);
        let req = attention(1, 16, 16).tensor("v", v);
        let big = resize(&req, &[2, 16, 32])?;
        assert_eq!(big.get("v").ok_or("no v")?.strides.as_deref(), Some(&[32 * 1536, 1536, 64, 1][..]));
        Ok(())
    }
}
