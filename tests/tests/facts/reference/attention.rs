//! The reference kernels' attention and paged attention rows.

use super::*;

const ATTENTION: &str = "backends/reference/src/attention.rs";
const PAGED: &str = "backends/reference/src/paged.rs";
/// Where the attention kernels' visible keys are decided (causal alignment, window): the
/// reference kernels call it for every query row.
const SEMANTICS: &str = "core/src/exec/semantics.rs";

/// A small bf16 attention problem with head dim `d`.
fn att(d: u64) -> Request {
    bf16(2, 64, 64, 8, 8, d)
}

/// `req` with a mask of `dtype` and `shape`.
fn masked(req: Request, dtype: DType, shape: &[u64]) -> Request {
    req.tensor("mask", TensorDesc::new(dtype, shape.to_vec()))
}

/// `req` with attention attributes `a`.
fn with(req: Request, a: AttentionAttrs) -> Request {
    attrs(req, a)
}

/// Causal with `alignment`.
fn causal_on(alignment: CausalAlignment) -> AttentionAttrs {
    AttentionAttrs { causal: true, causal_alignment: alignment, ..AttentionAttrs::default() }
}

/// A bf16 paged decode (4 sequences, 32 q heads on 8 kv heads of `d`, pages of 16, NHD,
/// an i32 block table) with a cache of `kv`.
fn paged_of(d: u64, kv: DType, layout: Layout, table: DType) -> Request {
    paged(DType::BF16, kv, 4, 1, 32, 8, d, 16, layout, table)
}

/// Four bf16 queries per sequence on the pages (a paged prefill chunk: seq_q 4 != seq_k 128).
fn paged_chunk(a: AttentionAttrs) -> TestResult<Request> {
    Ok(with(queries_on_pages(4, 16, None, 1)?, a))
}

pub(super) fn attention() -> TestResult<Vec<Fact>> {
    const K: &str = "cpu_reference.attention.naive";
    let fp8 = DType::Fp8E4M3;
    Ok(vec![
        fact(K, "dtypes", here(ATTENTION, "expect_float(name, t)?;"), "spr", att(64))
            .rejects(retyped(att(64), &["q", "k", "v"], fp8)?, "DTYPE_UNSUPPORTED"),
        // The 512 is a conservative bound, not the kernel's: its dot product loops over any
        // head dim (kept as declared; reported).
        fact(K, "head_dim", here(ATTENTION, "(0..q.d).map(|d| q.at(seg.qb"), "spr", att(512))
            .rejects(att(520), "HEAD_DIM_TOO_LARGE"),
        fact(K, "head_dim", here(ATTENTION, "(0..q.d).map(|d| q.at(seg.qb"), "spr", att(1)),
        fact(K, "different_v_head_dim", here(ATTENTION, "let dv = v.d;"), "spr", {
            let req = att(128);
            req.tensor("v", TensorDesc::new(DType::BF16, [2, 64, 8, 64]).with_layout(Layout::Bshd))
        }),
        fact(K, "gqa", here(ATTENTION, "let group = q.h / k.h;"), "spr", bf16(2, 64, 64, 32, 8, 128)),
        fact(K, "causal", here(SEMANTICS, "CausalAlignment::TopLeft => 0,"), "spr", {
            with(bf16(1, 32, 64, 8, 8, 64), causal_on(CausalAlignment::TopLeft))
        }),
        fact(K, "causal", here(SEMANTICS, "CausalAlignment::BottomRight => seq_k as i64 - seq_q as i64,"), "spr", {
            with(bf16(1, 32, 64, 8, 8, 64), causal_on(CausalAlignment::BottomRight))
        }),
        fact(K, "masks", here(ATTENTION, "DType::Bool => true,"), "spr", masked(att(64), DType::Bool, &[2, 8, 64, 64])),
        fact(K, "masks", here(ATTENTION, "d if d.is_float() => false,"), "spr", {
            masked(att(64), DType::F32, &[2, 8, 64, 64])
        }),
        fact(K, "mask_with_causal", here(ATTENTION, "match m.bias([seg.mask_b"), "spr", {
            masked(with(att(64), layerzero_tests::causal()), DType::Bool, &[2, 8, 64, 64])
        }),
        fact(K, "mask_broadcast", here(ATTENTION, "let f = 4 - rank + m;"), "spr", {
            masked(att(64), DType::F32, &[64, 64])
        }),
        fact(K, "window", here(SEMANTICS, "Some(w) => (diag - w as i64).clamp(0, seq_k as i64),"), "spr", {
            windowed(att(64))
        }),
        fact(K, "softcap", here(ATTENTION, "s = c * (s / c).tanh();"), "spr", attrs(att(64), softcap(0.0))),
        fact(K, "alibi", here(ATTENTION, "s -= slope * alibi_distance(i, j, seq_q, seq_k);"), "spr", {
            with(att(64), AttentionAttrs { alibi: true, ..AttentionAttrs::default() })
        }),
        fact(K, "custom_scale", here(ATTENTION, "let scale = softmax_scale(a, q.d);"), "spr", {
            with(att(64), AttentionAttrs { scale: Some(0.05), ..AttentionAttrs::default() })
        }),
        fact(K, "varlen", here(ATTENTION, "(Some(cq), Some(ck)) => {"), "spr", {
            bf16(1, 256, 256, 8, 8, 64)
                .tensor("cu_seqlens_q", TensorDesc::new(DType::I32, [5]))
                .tensor("cu_seqlens_k", TensorDesc::new(DType::I32, [5]))
        }),
        fact(K, "layouts", here(MOD, "Layout::Bhsd => true,"), "spr", head_major(att(64))?),
        fact(K, "strides", here(MOD, "self.t.at(&[b, h, s, d])"), "spr", strided_v(att(64))?),
    ])
}

pub(super) fn paged_attention() -> TestResult<Vec<Fact>> {
    const K: &str = "cpu_reference.paged_attention.naive";
    let (bf, nhd, i32) = (DType::BF16, Layout::Nhd, DType::I32);
    Ok(vec![
        fact(K, "dtypes", here(PAGED, "expect_float(\"q\", &args.q)?;"), "spr", paged_of(128, bf, nhd, i32))
            .rejects(paged(DType::Fp8E4M3, DType::Fp8E4M3, 4, 1, 32, 8, 128, 16, nhd, i32), "DTYPE_UNSUPPORTED"),
        // Conservative, as the dense kernel's: the dot product loops over any head dim.
        fact(K, "head_dim", here(PAGED, "(0..q.d).map(|d| q.at(b, i, h, d)"), "spr", paged_of(512, bf, nhd, i32))
            .rejects(paged_of(520, bf, nhd, i32), "HEAD_DIM_TOO_LARGE"),
        fact(K, "gqa", here(PAGED, "let group = q.h / kc.heads;"), "spr", paged_of(128, bf, nhd, i32)),
        fact(K, "causal", here(SEMANTICS, "CausalAlignment::TopLeft => 0,"), "spr", {
            paged_chunk(causal_on(CausalAlignment::TopLeft))?
        }),
        fact(K, "causal", here(PAGED, "let (lo, hi) = visible_keys(i, q.s, ctx, a);"), "spr", {
            paged_chunk(causal_on(CausalAlignment::BottomRight))?
        }),
        fact(K, "window", here(SEMANTICS, "Some(w) => (diag - w as i64).clamp(0, seq_k as i64),"), "spr", {
            paged_chunk(AttentionAttrs { causal: true, window_left: Some(8), ..AttentionAttrs::default() })?
        }),
        fact(K, "softcap", here(PAGED, "(j, score(dot, scale, a, slopes[h], i, j, q.s, ctx))"), "spr", {
            attrs(pages(16, None, 1)?, softcap(0.0))
        }),
        fact(K, "alibi", here(PAGED, "let slopes = if a.alibi { alibi_slopes(q.h) }"), "spr", {
            with(pages(16, None, 1)?, AttentionAttrs { alibi: true, ..AttentionAttrs::default() })
        }),
        fact(K, "custom_scale", here(PAGED, "let scale = softmax_scale(a, q.d);"), "spr", {
            with(pages(16, None, 1)?, AttentionAttrs { scale: Some(0.05), ..AttentionAttrs::default() })
        }),
        fact(K, "layouts", here(PAGED, "paged attention takes BSHD queries"), "spr", pages(16, None, 1)?),
        fact(K, "strides", here(PAGED, "self.t.at(&[page, slot, h, d])"), "spr", pages(16, Some(16 * 8 * 256), 2)?),
        fact(K, "block_table_dtypes", here(MOD, "DType::I32 | DType::I64 => Ok(t.to_i64_vec()),"), "spr", {
            paged_of(128, bf, nhd, DType::I64)
        }),
        fact(K, "kv_cache_layouts", here(PAGED, "Some(Layout::Hnd) => true,"), "spr", {
            paged_of(128, bf, Layout::Hnd, i32)
        }),
        fact(K, "kv_cache_dtypes", here(PAGED, "raw * self.scale[h]"), "spr", paged_of(128, DType::Fp8E5M2, nhd, i32)),
    ])
}
