//! The rows a shadow check compares: a few rows of a call's inputs, cut so that the
//! reference computes exactly those rows of the kernel's output.
//!
//! Row-wise ops (linears, norms, activations, MLPs, embeddings, MoE routing and experts)
//! take evenly spread rows of their token dimension, the last row always among them (a
//! blocked loop's tail is where kernels go wrong). Attention takes a block of query
//! positions that keeps every row's keys: the last ones under bottom-right causal alignment
//! (or without causality), the first ones under top-left. Ops whose rows are not independent
//! (a per-tensor scale, positions, masks, paged caches) are compared whole.

use crate::exec::args::OpArgs;
use crate::model::attrs::CausalAlignment;
use crate::model::layout::Layout;
use crate::tensor::{HostTensor, row_major_strides};

/// Rows `start, start + step, ...` (`count` of them) out of `total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Picks {
    pub(crate) start: usize,
    pub(crate) step: usize,
    pub(crate) count: usize,
    pub(crate) total: usize,
}

impl Picks {
    /// `want` rows of `total`, evenly spread, the last one included.
    pub(crate) fn spread(total: usize, want: usize) -> Picks {
        let want = want.max(1);
        if want >= total {
            return Picks { start: 0, step: 1, count: total, total };
        }
        let step = total / want;
        Picks { start: total - 1 - (want - 1) * step, step, count: want, total }
    }

    fn all(self) -> bool {
        self.count == self.total
    }
}

/// How the kernel's outputs map onto the reference's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// The whole call.
    Whole,
    /// These rows of every output's flattened token dimension.
    Rows(Picks),
    /// Query positions `start..start + len` of dim `dim` of every output.
    Queries { dim: usize, start: usize, len: usize },
}

/// The arguments the reference runs on, and how to cut the kernel's outputs to match;
/// `None` when the call cannot be cut and is too large to compare whole.
pub(crate) fn cut(args: &OpArgs, rows: usize, whole_limit: usize) -> Option<(OpArgs, Cut)> {
    let whole = || {
        let elements: usize = args.tensors().iter().map(|(_, t)| t.numel()).sum();
        (elements <= whole_limit).then(|| (args.clone(), Cut::Whole))
    };
    let (names, total): (&[&str], usize) = match args {
        OpArgs::Linear(a) => (&["x"], lead_rows(&a.x)),
        OpArgs::LinearInt4(a) => (&["x"], lead_rows(&a.x)),
        OpArgs::LinearW8a8(a) => (&["x", "x_scale"], lead_rows(&a.x)),
        OpArgs::Mlp(a) => (&["x"], lead_rows(&a.x)),
        OpArgs::Gelu(a) => (&["x"], lead_rows(&a.x)),
        OpArgs::Silu(a) => (&["x"], lead_rows(&a.x)),
        OpArgs::Swiglu(a) => (&["x", "gate", "up"], a.x.as_ref().or(a.gate.as_ref()).map_or(0, lead_rows)),
        OpArgs::Geglu(a) => (&["x", "gate", "up"], a.x.as_ref().or(a.gate.as_ref()).map_or(0, lead_rows)),
        OpArgs::RmsNorm(a) | OpArgs::LayerNorm(a) => (&["x", "residual"], lead_rows(&a.x)),
        OpArgs::Embedding(a) => (&["ids"], a.ids.numel()),
        OpArgs::MoeRoute(a) => (&["logits"], lead_rows(&a.logits)),
        OpArgs::MoeExperts(a) => (&["x", "experts", "weights"], lead_rows(&a.x)),
        OpArgs::Attention(a) => return queries(a, rows).or_else(whole),
        _ => return whole(),
    };
    let picks = Picks::spread(total, rows);
    if total == 0 || picks.all() {
        return Some((args.clone(), Cut::Whole));
    }
    let mut uncut = false;
    let sliced = args
        .map_tensors(|name, t| {
            // A per-tensor scale (one value) holds for every row.
            if !names.contains(&name) || (name == "x_scale" && t.numel() == 1) {
                return Ok(t.clone());
            }
            match take_rows(t, picks) {
                Some(r) => Ok(r),
                None => {
                    uncut = true;
                    Ok(t.clone())
                }
            }
        })
        .ok()?;
    if uncut {
        return whole();
    }
    Some((sliced, Cut::Rows(picks)))
}

/// The rows of `t`'s leading dims (all but the last).
fn lead_rows(t: &HostTensor) -> usize {
    t.shape().split_last().map_or(0, |(_, lead)| lead.iter().product())
}

/// `t` as `picks.total` rows (its first dims flattened, as few as make that many rows),
/// the picked rows copied out, shaped `[count, ..rest]`; `None` when no leading dims hold
/// exactly that many rows.
pub(crate) fn take_rows(t: &HostTensor, picks: Picks) -> Option<HostTensor> {
    let shape = t.shape();
    let lead = (1..=shape.len()).find(|&l| shape[..l].iter().product::<usize>() == picks.total)?;
    let rest = &shape[lead..];
    let row: usize = rest.iter().product();
    let t = t.contiguous();
    let mut vshape = vec![picks.count];
    vshape.extend_from_slice(rest);
    let mut strides = vec![picks.step * row];
    strides.extend(row_major_strides(rest));
    let offset = t.offset() + picks.start * row;
    Some(t.view(&vshape, &strides, offset).ok()?.contiguous())
}

/// Positions `start..start + len` of `dim`, copied out, the layout tag kept.
pub(crate) fn narrow(t: &HostTensor, dim: usize, start: usize, len: usize) -> Option<HostTensor> {
    let mut shape = t.shape().to_vec();
    if dim >= shape.len() || start + len > shape[dim] {
        return None;
    }
    shape[dim] = len;
    let offset = t.offset() + start * t.strides()[dim];
    let v = t.view(&shape, t.strides(), offset).ok()?.contiguous();
    Some(match t.layout() {
        Some(l) => v.with_layout(l),
        None => v,
    })
}

/// A block of query positions of a dense attention call that keeps each row's keys: none
/// when a mask, ragged offsets, block mask, fused RoPE or top-left ALiBi make rows depend on
/// where they sit among the queries.
fn queries(a: &crate::exec::args::AttentionArgs, rows: usize) -> Option<(OpArgs, Cut)> {
    let at = &a.attrs;
    if a.mask.is_some() || a.cu_seqlens_q.is_some() || at.mask_block.is_some() || at.rope.is_some() {
        return None;
    }
    let top_left = at.causal && at.causal_alignment == CausalAlignment::TopLeft;
    if top_left && at.alibi {
        return None;
    }
    let dim = match a.q.layout().unwrap_or(Layout::Bshd) {
        Layout::Bshd => 1,
        Layout::Bhsd => 2,
        _ => return None,
    };
    let seq = *a.q.shape().get(dim)?;
    let len = rows.max(1).min(seq);
    let start = if top_left { 0 } else { seq - len };
    let mut cut = a.clone();
    cut.q = narrow(&a.q, dim, start, len)?;
    Some((OpArgs::Attention(cut), Cut::Queries { dim, start, len }))
}

/// The kernel's output `t` cut as the reference's inputs were; `None` when its shape does
/// not allow it (itself a divergence: the reference's output has that shape).
pub(crate) fn cut_output(t: &HostTensor, cut: Cut) -> Option<HostTensor> {
    match cut {
        Cut::Whole => Some(t.clone()),
        Cut::Rows(p) => take_rows(t, p),
        Cut::Queries { dim, start, len } => narrow(t, dim, start, len),
    }
}
