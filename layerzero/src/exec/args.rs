//! Typed arguments, one struct per op family. The selection `Request` is derived from them
//! (`describe`), so what is selected and what is executed cannot disagree.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::model::attrs::{AttentionAttrs, Attrs, RopeAttrs};
use crate::model::layout::Layout;
use crate::model::op::Op;
use crate::model::request::Request;
use crate::model::tensor::TensorDesc;
use crate::tensor::HostTensor;

/// `attention`: q, k, v in BSHD or BHSD (any strides), optional mask and ragged offsets.
///
/// Shapes: q [B, Sq, Hq, D] (BSHD) or [B, Hq, Sq, D] (BHSD); k [B, Sk, Hkv, D]; v
/// [B, Sk, Hkv, Dv]; Hq % Hkv == 0 and query head `h` reads kv head `h / (Hq / Hkv)`.
/// `mask` broadcasts to [B, Hq, Sq, Sk]: bool keeps `true`, a float mask is added to the
/// scores. With `cu_seqlens_q`/`cu_seqlens_k` (i32 [N+1]) q and k/v hold N sequences packed
/// along the sequence dim of batch 1; each attends only within itself and causal alignment
/// applies per sequence. The output has q's layout with head dim Dv and q's dtype.
#[derive(Debug, Clone)]
pub struct AttentionArgs {
    /// Queries.
    pub q: HostTensor,
    /// Keys.
    pub k: HostTensor,
    /// Values.
    pub v: HostTensor,
    /// Optional mask.
    pub mask: Option<HostTensor>,
    /// Ragged query offsets.
    pub cu_seqlens_q: Option<HostTensor>,
    /// Ragged key offsets.
    pub cu_seqlens_k: Option<HostTensor>,
    /// Options.
    pub attrs: AttentionAttrs,
}

/// `paged_attention`: q [B, Sq, Hq, D] (BSHD) against caches addressed by a block table.
///
/// Caches are NHD [pages, page_size, Hkv, D] or HND [pages, Hkv, page_size, D];
/// `block_table` (i32/i64 [B, max_pages]) maps sequence b's logical page p to a physical
/// page; `context_lens` (i32 [B]) is each sequence's key count. The Sq queries of sequence b
/// are its last Sq positions (bottom-right alignment). fp8 caches are dequantized with
/// `k_scale`/`v_scale` (f32, [1] per tensor or [Hkv] per head; 1 when absent). A table
/// entry that a context reaches but that lies outside the cache, or a context longer than
/// the table, is an error; entries past the pages a context reaches are never read (padding).
#[derive(Debug, Clone)]
pub struct PagedAttentionArgs {
    /// Queries.
    pub q: HostTensor,
    /// Key cache.
    pub k_cache: HostTensor,
    /// Value cache.
    pub v_cache: HostTensor,
    /// Page indices per sequence.
    pub block_table: HostTensor,
    /// Keys per sequence.
    pub context_lens: HostTensor,
    /// Key dequantization scale.
    pub k_scale: Option<HostTensor>,
    /// Value dequantization scale.
    pub v_scale: Option<HostTensor>,
    /// Options.
    pub attrs: AttentionAttrs,
}

/// `rope`: rotates q (and k) [B, S, H, D] in BSHD or BHSD.
///
/// The first `rotary_dim` (default D) dims of each head rotate; the rest pass through.
/// Positions are `positions` (i32/i64, [S] or [B, S]) or 0..S. Angles are
/// `position * inv_freq` (see `semantics::rope_frequencies`), or come from `cos`/`sin`
/// ([max_position, rotary_dim / 2], indexed by position) when given.
#[derive(Debug, Clone)]
pub struct RopeArgs {
    /// Queries.
    pub q: HostTensor,
    /// Keys.
    pub k: Option<HostTensor>,
    /// Positions.
    pub positions: Option<HostTensor>,
    /// Precomputed cosines.
    pub cos: Option<HostTensor>,
    /// Precomputed sines.
    pub sin: Option<HostTensor>,
    /// Options.
    pub attrs: RopeAttrs,
}

/// The arguments of any op LayerZero executes.
#[derive(Debug, Clone)]
pub enum OpArgs {
    /// Dense attention.
    Attention(AttentionArgs),
    /// Paged attention.
    PagedAttention(PagedAttentionArgs),
    /// RoPE.
    Rope(RopeArgs),
}

/// Named output tensors (`out`; RoPE also `out_k`).
pub type Outputs = BTreeMap<String, HostTensor>;

fn put(map: &mut BTreeMap<String, TensorDesc>, name: &str, t: Option<&HostTensor>) {
    if let Some(t) = t {
        map.insert(name.to_owned(), t.desc());
    }
}

impl OpArgs {
    /// The op.
    pub fn op(&self) -> Op {
        match self {
            OpArgs::Attention(_) => Op::Attention,
            OpArgs::PagedAttention(_) => Op::PagedAttention,
            OpArgs::Rope(_) => Op::Rope,
        }
    }

    /// The tensors by role name.
    pub fn tensors(&self) -> Vec<(&'static str, &HostTensor)> {
        let all: Vec<(&'static str, Option<&HostTensor>)> = match self {
            OpArgs::Attention(a) => vec![
                ("q", Some(&a.q)),
                ("k", Some(&a.k)),
                ("v", Some(&a.v)),
                ("mask", a.mask.as_ref()),
                ("cu_seqlens_q", a.cu_seqlens_q.as_ref()),
                ("cu_seqlens_k", a.cu_seqlens_k.as_ref()),
            ],
            OpArgs::PagedAttention(a) => vec![
                ("q", Some(&a.q)),
                ("k_cache", Some(&a.k_cache)),
                ("v_cache", Some(&a.v_cache)),
                ("block_table", Some(&a.block_table)),
                ("context_lens", Some(&a.context_lens)),
                ("k_scale", a.k_scale.as_ref()),
                ("v_scale", a.v_scale.as_ref()),
            ],
            OpArgs::Rope(a) => vec![
                ("q", Some(&a.q)),
                ("k", a.k.as_ref()),
                ("positions", a.positions.as_ref()),
                ("cos", a.cos.as_ref()),
                ("sin", a.sin.as_ref()),
            ],
        };
        all.into_iter().filter_map(|(n, t)| t.map(|t| (n, t))).collect()
    }

    /// The selection request these arguments pose.
    pub fn describe(&self) -> Request {
        let mut tensors = BTreeMap::new();
        for (name, t) in self.tensors() {
            put(&mut tensors, name, Some(t));
        }
        let attrs = match self {
            OpArgs::Attention(a) => Attrs::Attention(a.attrs.clone()),
            OpArgs::PagedAttention(a) => Attrs::Attention(a.attrs.clone()),
            OpArgs::Rope(a) => Attrs::Rope(a.attrs.clone()),
        };
        Request { op: self.op(), tensors, attrs }
    }

    /// Arguments for `request` from tensors by name (e.g. read from safetensors). Each
    /// request tensor must be present with the request's dtype and shape; its layout tag and
    /// strides are applied (a strided request gets a strided view of the same values).
    pub fn from_request(request: &Request, mut inputs: BTreeMap<String, HostTensor>) -> Result<OpArgs> {
        let mut take = |name: &str| -> Result<Option<HostTensor>> {
            let Some(desc) = request.tensors.get(name) else { return Ok(None) };
            let t = inputs
                .remove(name)
                .ok_or_else(|| Error::invalid(format!("input tensor `{name}` is missing (the request names it)")))?;
            if t.dtype() != desc.dtype {
                return Err(Error::invalid(format!(
                    "input tensor `{name}` has dtype {}; the request says {}",
                    t.dtype(),
                    desc.dtype
                )));
            }
            let shape: Vec<usize> = desc.shape.iter().map(|&d| d as usize).collect();
            if t.shape() != shape.as_slice() {
                return Err(Error::invalid(format!(
                    "input tensor `{name}` has shape {:?}; the request says {:?}",
                    t.shape(),
                    desc.shape
                )));
            }
            let t = match &desc.strides {
                Some(s) => strided_copy(&t, &s.iter().map(|&x| x as usize).collect::<Vec<_>>())
                    .map_err(|e| Error::invalid(format!("input tensor `{name}`: {e}")))?,
                None => t,
            };
            Ok(Some(match desc.layout {
                Some(l) => t.with_layout(l),
                None => t,
            }))
        };
        let need = |t: Option<HostTensor>, name: &str| {
            t.ok_or_else(|| Error::invalid(format!("the request has no tensor `{name}`, which {} needs", request.op)))
        };
        let args = match (&request.attrs, request.op) {
            (Attrs::Attention(attrs), Op::Attention) => OpArgs::Attention(AttentionArgs {
                q: need(take("q")?, "q")?,
                k: need(take("k")?, "k")?,
                v: need(take("v")?, "v")?,
                mask: take("mask")?,
                cu_seqlens_q: take("cu_seqlens_q")?,
                cu_seqlens_k: take("cu_seqlens_k")?,
                attrs: attrs.clone(),
            }),
            (Attrs::Attention(attrs), Op::PagedAttention) => OpArgs::PagedAttention(PagedAttentionArgs {
                q: need(take("q")?, "q")?,
                k_cache: need(take("k_cache")?, "k_cache")?,
                v_cache: need(take("v_cache")?, "v_cache")?,
                block_table: need(take("block_table")?, "block_table")?,
                context_lens: need(take("context_lens")?, "context_lens")?,
                k_scale: take("k_scale")?,
                v_scale: take("v_scale")?,
                attrs: attrs.clone(),
            }),
            (Attrs::Rope(attrs), Op::Rope) => OpArgs::Rope(RopeArgs {
                q: need(take("q")?, "q")?,
                k: take("k")?,
                positions: take("positions")?,
                cos: take("cos")?,
                sin: take("sin")?,
                attrs: attrs.clone(),
            }),
            (_, op) => {
                return Err(Error::invalid(format!(
                    "op {op} cannot be executed by this build yet (no executor for it)"
                )));
            }
        };
        if let Some(extra) = inputs.keys().next() {
            return Err(Error::invalid(format!("input tensor `{extra}` is not named by the request")));
        }
        Ok(args)
    }
}

/// A view with the given strides holding the same logical values as `t` (the storage is
/// allocated as large as the strides reach; untouched slots are zero).
pub fn strided_copy(t: &HostTensor, strides: &[usize]) -> Result<HostTensor> {
    if strides.len() != t.rank() {
        return Err(Error::invalid(format!("{} strides for rank {}", strides.len(), t.rank())));
    }
    if t.numel() == 0 {
        return Ok(t.clone());
    }
    let span = t
        .shape()
        .iter()
        .zip(strides)
        .try_fold(1usize, |a, (&d, &s)| (d - 1).checked_mul(s).and_then(|x| a.checked_add(x)))
        .ok_or_else(|| Error::invalid(format!("strides {strides:?} overflow")))?;
    // Distinct logical elements must land on distinct slots, or the view would alias.
    let mut order: Vec<usize> = (0..t.rank()).filter(|&d| t.shape()[d] > 1).collect();
    order.sort_by_key(|&d| strides[d]);
    let mut reach = 1usize;
    for &d in &order {
        if strides[d] < reach {
            return Err(Error::invalid(format!("strides {strides:?} make elements of shape {:?} overlap", t.shape())));
        }
        reach = strides[d].saturating_mul(t.shape()[d]);
    }
    let logical = t.to_f32_vec();
    let mut flat = vec![0f32; span];
    let target = HostTensor::from_f32(&[span], vec![0.0; span])?.view(t.shape(), strides, 0)?;
    let mut k = 0;
    target.for_each_index(|i| {
        flat[i] = logical[k];
        k += 1;
    });
    let base = HostTensor::from_f32_as(t.dtype(), &[span], &flat)?;
    let v = base.view(t.shape(), strides, 0)?;
    Ok(match t.layout() {
        Some(l) => v.with_layout(l),
        None => v,
    })
}

/// Layout of a dense attention tensor (BSHD when untagged).
pub fn layout_of(t: &HostTensor) -> Layout {
    t.layout().unwrap_or(Layout::Bshd)
}

impl OpArgs {
    /// The same arguments with every tensor passed through `f(name, tensor)`.
    pub fn map_tensors(&self, mut f: impl FnMut(&str, &HostTensor) -> Result<HostTensor>) -> Result<OpArgs> {
        let mut g = |name: &str, t: &HostTensor| f(name, t);
        let opt = |name: &str, t: &Option<HostTensor>, g: &mut dyn FnMut(&str, &HostTensor) -> Result<HostTensor>| {
            t.as_ref().map(|t| g(name, t)).transpose()
        };
        Ok(match self {
            OpArgs::Attention(a) => OpArgs::Attention(AttentionArgs {
                q: g("q", &a.q)?,
                k: g("k", &a.k)?,
                v: g("v", &a.v)?,
                mask: opt("mask", &a.mask, &mut g)?,
                cu_seqlens_q: opt("cu_seqlens_q", &a.cu_seqlens_q, &mut g)?,
                cu_seqlens_k: opt("cu_seqlens_k", &a.cu_seqlens_k, &mut g)?,
                attrs: a.attrs.clone(),
            }),
            OpArgs::PagedAttention(a) => OpArgs::PagedAttention(PagedAttentionArgs {
                q: g("q", &a.q)?,
                k_cache: g("k_cache", &a.k_cache)?,
                v_cache: g("v_cache", &a.v_cache)?,
                block_table: g("block_table", &a.block_table)?,
                context_lens: g("context_lens", &a.context_lens)?,
                k_scale: opt("k_scale", &a.k_scale, &mut g)?,
                v_scale: opt("v_scale", &a.v_scale, &mut g)?,
                attrs: a.attrs.clone(),
            }),
            OpArgs::Rope(a) => OpArgs::Rope(RopeArgs {
                q: g("q", &a.q)?,
                k: opt("k", &a.k, &mut g)?,
                positions: opt("positions", &a.positions, &mut g)?,
                cos: opt("cos", &a.cos, &mut g)?,
                sin: opt("sin", &a.sin, &mut g)?,
                attrs: a.attrs.clone(),
            }),
        })
    }
}
