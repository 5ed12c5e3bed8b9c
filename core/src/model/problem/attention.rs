//! Attention: dense (`attention`, with its optional mask and varlen offsets) and paged.

use super::validator::{FLOATS, INDEX, Validator, bshd};
use super::{AttentionDims, Dims, MaskInfo, MaskKind, PagedDims, Problem};
use crate::model::attrs::Attrs;
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::tensor::TensorDesc;

impl Problem {
    pub(super) fn dense_attention(v: &mut Validator<'_>) -> (DType, Dims) {
        let q = v.ranked("q", 4);
        let k = v.ranked("k", 4);
        let val = v.ranked("v", 4);
        let dtype = q.map(|t| t.dtype).unwrap_or(DType::F32);
        let (Some(q), Some(k), Some(val)) = (q, k, val) else { return (dtype, Dims::None) };
        let dense = [Layout::Bshd, Layout::Bhsd];
        let (Some(lq), Some(lk), Some(lv)) =
            (v.layout_in("q", q, &dense), v.layout_in("k", k, &dense), v.layout_in("v", val, &dense))
        else {
            return (dtype, Dims::None);
        };
        if !(v.dtype_in("q", q, FLOATS) & v.dtype_in("k", k, FLOATS) & v.dtype_in("v", val, FLOATS)) {
            return (dtype, Dims::None);
        }
        let [bq, sq, hq, d] = bshd(q, lq);
        let [bk, sk, hk, dk] = bshd(k, lk);
        let [bv, sv, hv, dv] = bshd(val, lv);
        let varlen = v.tensor("cu_seqlens_q").is_some() || v.tensor("cu_seqlens_k").is_some();
        let mut batch = bq;
        if varlen {
            for name in ["cu_seqlens_q", "cu_seqlens_k"] {
                let Some(t) = v.ranked(name, 1) else {
                    v.err(format!(
                        "ragged attention needs both `cu_seqlens_q` and `cu_seqlens_k`; `{name}` is missing"
                    ));
                    continue;
                };
                v.dtype_in(name, t, &[DType::I32]);
                if t.shape[0] < 2 {
                    v.err(format!("tensor `{name}` has {} entries; it needs batch + 1 >= 2", t.shape[0]));
                }
            }
            if bq != 1 || bk != 1 {
                v.err(format!(
                    "ragged attention packs all tokens into batch 1 of q and k; q batch is {bq}, k batch is {bk}"
                ));
            }
            if let (Some(cq), Some(ck)) = (v.tensor("cu_seqlens_q"), v.tensor("cu_seqlens_k"))
                && cq.shape != ck.shape
            {
                v.err(format!(
                    "tensor `cu_seqlens_k` has shape {:?}; it must equal `cu_seqlens_q`'s {:?} (one entry per sequence, + 1)",
                    ck.shape, cq.shape
                ));
            }
            batch =
                v.tensor("cu_seqlens_q").map(|t| t.shape.first().copied().unwrap_or(1).saturating_sub(1)).unwrap_or(1);
        } else {
            v.eq("k batch must equal q batch", bk, bq);
        }
        v.eq("v batch must equal k batch", bv, bk);
        v.eq("k head_dim must equal q head_dim", dk, d);
        v.eq("v seq_len must equal k seq_len", sv, sk);
        v.eq("v heads must equal k heads", hv, hk);
        for (what, n) in [
            ("q batch", bq),
            ("q seq_len", sq),
            ("k seq_len", sk),
            ("q heads", hq),
            ("k heads", hk),
            ("head_dim", d),
            ("v head_dim", dv),
        ] {
            v.positive(what, n);
        }
        if hk > 0 && hq % hk != 0 {
            v.err(format!("q heads {hq} are not divisible by kv heads {hk}"));
        }
        if k.dtype != val.dtype {
            v.err(format!("k dtype {} != v dtype {}", k.dtype, val.dtype));
        }
        // Fused RoPE puts the queries at the keys' last positions: there must be no more of them.
        if let Attrs::Attention(a) = &v.req.attrs
            && a.rope.is_some()
            && !varlen
            && sq > sk
        {
            v.err(format!(
                "attrs.rope places the {sq} queries at the last positions of the {sk} keys; seq_q must be at most seq_k"
            ));
        }
        let block = v.req.attention_attrs().and_then(|a| a.mask_block);
        let mask = match (v.tensor("mask"), block) {
            (Some(m), None) => Self::mask(v, m, [batch, hq, sq, sk]),
            (Some(m), Some(b)) => Self::block_mask(v, m, b, [batch, hq, sq, sk]),
            (None, Some(b)) => {
                v.err(format!("attrs.mask_block is {b:?} but the request has no `mask` (the bool block layout)"));
                None
            }
            (None, None) => None,
        };
        let dims = AttentionDims {
            batch,
            seq_q: sq,
            seq_k: sk,
            heads_q: hq,
            heads_kv: hk,
            head_dim: d,
            head_dim_v: dv,
            kv_dtype: k.dtype,
            mask,
            varlen,
            paged: None,
        };
        (dtype, Dims::Attention(dims))
    }

    /// A block-sparse mask: a bool layout of `[rows, cols]` blocks broadcasting to
    /// [batch, heads, ceil(seq_q / rows), ceil(seq_k / cols)].
    fn block_mask(v: &mut Validator<'_>, m: &TensorDesc, block: [u64; 2], full: [u64; 4]) -> Option<MaskInfo> {
        let [rows, cols] = block;
        if rows == 0 || cols == 0 {
            v.err(format!("attrs.mask_block is {block:?}; block rows and cols must be at least 1"));
            return None;
        }
        if m.dtype != DType::Bool {
            v.err(format!("tensor `mask` has dtype {}; a block-sparse mask (attrs.mask_block) is bool", m.dtype));
            return None;
        }
        let blocks = [full[0], full[1], full[2].div_ceil(rows), full[3].div_ceil(cols)];
        let info = Self::mask(v, m, blocks)?;
        Some(MaskInfo { kind: MaskKind::BlockSparse, ..info })
    }

    pub(super) fn mask(v: &mut Validator<'_>, m: &TensorDesc, full: [u64; 4]) -> Option<MaskInfo> {
        let kind = match m.dtype {
            DType::Bool => MaskKind::Bool,
            DType::F32 | DType::F16 | DType::BF16 => MaskKind::Float(m.dtype),
            other => {
                v.err(format!("tensor `mask` has dtype {other}; a mask is bool (keep) or f32/f16/bf16 (additive)"));
                return None;
            }
        };
        if !(2..=4).contains(&m.rank()) {
            v.err(format!("tensor `mask` has rank {}; it must be 2, 3 or 4 and broadcast to [batch, heads, seq_q, seq_k] = {full:?}", m.rank()));
            return None;
        }
        let offset = 4 - m.rank();
        for (i, &dim) in m.shape.iter().enumerate() {
            let target = full[offset + i];
            if dim != target && dim != 1 {
                v.err(format!("tensor `mask` shape {:?} does not broadcast to [batch, heads, seq_q, seq_k] = {full:?} (dim {i} is {dim})", m.shape));
                return None;
            }
        }
        let expanded_ok = |i: usize| m.shape[i] == full[i] || m.strides.as_ref().is_some_and(|s| s.get(i) == Some(&0));
        let is_full = m.rank() == 4 && (0..4).all(expanded_ok);
        // The heads dim, where the mask has one (rank 3 or 4, counted from the right).
        let heads = m.rank().checked_sub(3).map(|i| (m.shape[i], m.strides.as_ref().and_then(|s| s.get(i).copied())));
        let per_head = heads.is_some_and(|(h, stride)| h > 1 && stride != Some(0));
        Some(MaskInfo { kind, full: is_full, per_head })
    }

    pub(super) fn paged(v: &mut Validator<'_>) -> (DType, Dims) {
        let q = v.ranked("q", 4);
        let kc = v.ranked("k_cache", 4);
        let vc = v.ranked("v_cache", 4);
        let bt = v.ranked("block_table", 2);
        let cl = v.ranked("context_lens", 1);
        let dtype = q.map(|t| t.dtype).unwrap_or(DType::F32);
        let (Some(q), Some(kc), Some(vc), Some(bt), Some(cl)) = (q, kc, vc, bt, cl) else {
            return (dtype, Dims::None);
        };
        let Some(lq) = v.layout_in("q", q, &[Layout::Bshd]) else { return (dtype, Dims::None) };
        let caches = [Layout::Nhd, Layout::Hnd];
        let (Some(lk), Some(lv)) = (v.layout_in("k_cache", kc, &caches), v.layout_in("v_cache", vc, &caches)) else {
            return (dtype, Dims::None);
        };
        if lk != lv {
            v.err(format!("k_cache layout {lk} != v_cache layout {lv}"));
        }
        let ok = v.dtype_in("q", q, FLOATS)
            & v.dtype_in("k_cache", kc, FLOATS)
            & v.dtype_in("v_cache", vc, FLOATS)
            & v.dtype_in("block_table", bt, INDEX)
            & v.dtype_in("context_lens", cl, &[DType::I32]);
        if !ok {
            return (dtype, Dims::None);
        }
        if kc.shape != vc.shape {
            v.err(format!("k_cache shape {:?} != v_cache shape {:?}", kc.shape, vc.shape));
        }
        if kc.dtype != vc.dtype {
            v.err(format!("k_cache dtype {} != v_cache dtype {}", kc.dtype, vc.dtype));
        }
        let [b, sq, hq, d] = bshd(q, lq);
        let (num_pages, page_size, hk, dk) = match lk {
            Layout::Hnd => (kc.shape[0], kc.shape[2], kc.shape[1], kc.shape[3]),
            _ => (kc.shape[0], kc.shape[1], kc.shape[2], kc.shape[3]),
        };
        let dv = vc.shape[3];
        v.eq("k_cache head_dim must equal q head_dim", dk, d);
        v.eq("block_table rows must equal q batch", bt.shape[0], b);
        v.eq("context_lens length must equal q batch", cl.shape[0], b);
        for (what, n) in [
            ("q batch", b),
            ("q seq_len", sq),
            ("q heads", hq),
            ("head_dim", d),
            ("kv heads", hk),
            ("page_size", page_size),
            ("num_pages", num_pages),
            ("block_table width", bt.shape[1]),
        ] {
            v.positive(what, n);
        }
        if hk > 0 && hq % hk != 0 {
            v.err(format!("q heads {hq} are not divisible by kv heads {hk}"));
        }
        for scale in ["k_scale", "v_scale"] {
            if let Some(s) = v.tensor(scale) {
                v.dtype_in(scale, s, &[DType::F32]);
                let per_tensor = s.numel() == 1;
                let per_head = s.rank() == 1 && s.shape[0] == hk;
                if !(per_tensor || per_head) {
                    v.err(format!(
                        "tensor `{scale}` shape {:?} is neither per-tensor [1] nor per-head [{hk}]",
                        s.shape
                    ));
                }
            }
        }
        let paged =
            PagedDims { page_size, num_pages, max_pages: bt.shape[1], kv_layout: lk, block_table_dtype: bt.dtype };
        let dims = AttentionDims {
            batch: b,
            seq_q: sq,
            seq_k: bt.shape[1].saturating_mul(page_size),
            heads_q: hq,
            heads_kv: hk,
            head_dim: d,
            head_dim_v: dv,
            kv_dtype: kc.dtype,
            mask: None,
            varlen: false,
            paged: Some(paged),
        };
        (dtype, Dims::Attention(dims))
    }
}
