#!/usr/bin/env python3
"""Generates LayerZero's PyTorch golden fixtures (tests/fixtures/*.safetensors).

Each file holds the op's input tensors under their request role names (q, k, v, mask,
cu_seqlens_q, k_cache, block_table, positions, cos, x, weight, ids, logits, image, ...), the
expected output `expected` (the kernel output `out`; `expected_k` for RoPE's `out_k`; and
`expected_<name>` for the output `<name>`: residual_out, scale, experts, weights), and
safetensors metadata:
  request      the request JSON (public form, schemas/request.schema.json)
  op_category  attention | rope | norms | gemm (the row of the tolerance table, spec 002 section 5)
  source       the torch expression the expected output comes from

Inputs are stored in the request dtype; the expected output is computed in float64 from the
dtype-rounded inputs and cast to the output dtype. The semantics followed are those of
core/src/exec/args.rs and core/src/exec/semantics.rs. A query row with no visible
key yields zeros (LayerZero's definition; torch gives NaN there). Integer and fp8 outputs
(quantize, moe_route's experts) are computed with the documented float32 arithmetic and
must match exactly.

Deterministic: every case seeds torch from its name. Regenerate with
  tools/.venv/bin/python tools/gen_fixtures.py
"""

import argparse
import json
import math
import sys
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import quant4

DT = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "i32": torch.int32,
    "i64": torch.int64,
    "bool": torch.bool,
}
F64 = torch.float64
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def seed(name):
    torch.manual_seed(zlib.crc32(name.encode()))


def rnd(shape, dtype, scale=1.0):
    """Random normal values rounded to `dtype` (stored) and their float64 upcast."""
    x = (torch.randn(shape, dtype=F64) * scale).to(DT[dtype])
    return x, x.to(F64)


def desc(t, dtype, layout=None, strides=None):
    d = {"dtype": dtype, "shape": list(t.shape)}
    if layout:
        d["layout"] = layout
    if strides:
        d["strides"] = strides
    return d


# ----------------------------------------------------------------------------- attention


def alibi_slopes(n):
    """Press et al. slopes; non-power-of-two n as in semantics::alibi_slopes."""

    def pow2(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if n & (n - 1) == 0:
        return pow2(n)
    m = 1 << (n.bit_length() - 1)
    return pow2(m) + pow2(2 * m)[0::2][: n - m]


def keep_mask(sq, sk, attrs):
    """[Sq, Sk] bool: keys visible from causal masking and the left window
    (semantics::visible_keys)."""
    shift = sk - sq if attrs.get("causal_alignment", "bottom_right") == "bottom_right" else 0
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    diag = i + shift
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if attrs.get("causal"):
        keep &= j <= diag
    w = attrs.get("window_left")
    if w is not None:
        keep &= j >= diag - w
    return keep


def zero_dead_rows(out, keep):
    """Rows with no visible key are zeros (LayerZero); keep broadcasts to [B, H, Sq, Sk]."""
    dead = ~keep.any(-1)  # [.., Sq]
    dead = dead.expand(out.shape[:-1])
    return torch.where(dead[..., None], torch.zeros((), dtype=out.dtype), out)


def ref_attention(q, k, v, attrs, mask=None):
    """Plain-torch float64 attention in LayerZero's order: s = scale q.k; softcap; ALiBi;
    + float mask; remove keys by bool mask / causal / window; softmax; rows without keys = 0.
    q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D/Dv], mask broadcastable to [B, Hq, Sq, Sk]."""
    B, Hq, Sq, D = q.shape
    Sk = k.shape[2]
    g = Hq // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    scale = attrs.get("scale") or 1.0 / math.sqrt(D)
    s = scale * (q @ k.transpose(-1, -2))
    if attrs.get("softcap"):
        c = attrs["softcap"]
        s = c * torch.tanh(s / c)
    if attrs.get("alibi"):
        slopes = torch.tensor(alibi_slopes(Hq), dtype=F64)
        i = torch.arange(Sq, dtype=F64)[:, None]
        j = torch.arange(Sk, dtype=F64)[None, :]
        s = s - slopes[:, None, None] * (i + Sk - Sq - j).abs()
    keep = keep_mask(Sq, Sk, attrs).expand(B, Hq, Sq, Sk)
    if mask is not None:
        if mask.dtype == torch.bool:
            keep = keep & mask
        else:
            s = s + mask
    s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True)
    dead = torch.isneginf(m)
    p = torch.exp(s - torch.where(dead, torch.zeros_like(m), m))
    den = p.sum(-1, keepdim=True)
    p = torch.where(dead, torch.zeros_like(p), p / torch.where(dead, torch.ones_like(den), den))
    return p @ v


def sdpa(q, k, v, attrs, mask=None):
    """F.scaled_dot_product_attention in float64: top_left causal via is_causal=True,
    bottom_right causal / window via an explicit keep-mask, GQA via enable_gqa=True."""
    B, Hq, Sq, D = q.shape
    Sk = k.shape[2]
    is_causal = False
    attn_mask = mask
    structural = keep_mask(Sq, Sk, attrs)
    plain_top_left = (
        attrs.get("causal")
        and attrs.get("causal_alignment") == "top_left"
        and attrs.get("window_left") is None
        and mask is None
    )
    if plain_top_left:
        is_causal = True
    elif attrs.get("causal") or attrs.get("window_left") is not None:
        if attn_mask is None:
            attn_mask = structural
        elif attn_mask.dtype == torch.bool:
            attn_mask = attn_mask & structural
        else:
            attn_mask = attn_mask.masked_fill(~structural, float("-inf"))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=attrs.get("scale"),
        enable_gqa=k.shape[1] != Hq,
    )
    keep = structural.expand(B, Hq, Sq, Sk)
    if mask is not None:
        keep = keep & (mask if mask.dtype == torch.bool else ~torch.isneginf(mask))
    return zero_dead_rows(out, keep)


def uses_sdpa(attrs):
    return not (attrs.get("softcap") or attrs.get("alibi"))


def attention_expected(q, k, v, attrs, mask=None):
    """Expected output, [B, Hq, Sq, Dv] float64; cross-checked against the other path."""
    ref = ref_attention(q, k, v, attrs, mask)
    if uses_sdpa(attrs):
        out = sdpa(q, k, v, attrs, mask)
        assert torch.allclose(out, ref, atol=1e-10, rtol=1e-10), (out - ref).abs().max()
        return out
    return ref


def sdpa_source(attrs, mask_desc=None, gqa=False, per_seq=False):
    if not uses_sdpa(attrs):
        parts = ["s = scale * q @ k^T (k/v heads repeat_interleave'd for GQA)"]
        if attrs.get("softcap"):
            parts.append("s = softcap * tanh(s / softcap)")
        if attrs.get("alibi"):
            parts.append("s -= alibi_slope[h] * |i + Sk - Sq - j| (Press et al. slopes, non-pow2 interleave)")
        if mask_desc:
            parts.append(f"mask: {mask_desc}")
        if attrs.get("causal") or attrs.get("window_left") is not None:
            parts.append("keys outside causal/window (semantics::visible_keys) set to -inf")
        parts.append("softmax(s) @ v")
        expr = "plain torch float64: " + "; ".join(parts)
    else:
        args = ["q", "k", "v"]
        if attrs.get("causal") and attrs.get("causal_alignment") == "top_left" and mask_desc is None \
                and attrs.get("window_left") is None:
            args.append("is_causal=True")
        elif attrs.get("causal") or attrs.get("window_left") is not None or mask_desc:
            what = []
            if mask_desc:
                what.append(mask_desc)
            if attrs.get("causal"):
                what.append(f"{attrs.get('causal_alignment', 'bottom_right')} causal tril")
            if attrs.get("window_left") is not None:
                what.append(f"left window {attrs['window_left']}")
            args.append("attn_mask=<" + " & ".join(what) + ">")
        if attrs.get("scale"):
            args.append(f"scale={attrs['scale']}")
        if gqa:
            args.append("enable_gqa=True")
        expr = "torch.nn.functional.scaled_dot_product_attention(" + ", ".join(args) + ") in float64 on BHSD"
        if per_seq:
            expr = "per packed sequence (cu_seqlens): " + expr
    return expr + "; rows with no visible key set to 0 (LayerZero semantics; torch gives NaN)"


def to_layout(x, layout):
    """BHSD float64 -> the stored layout."""
    return x.permute(0, 2, 1, 3) if layout == "BSHD" else x


def attention(name, dtype, B, Sq, Sk, Hq, Hkv, D, Dv=None, layout="BSHD", attrs=None, mask=None,
              qscale=1.0, v_strides=None):
    """mask: None or (kind, shape, dtype) with kind 'bool' | 'float' | 'dead_row'."""
    seed(name)
    attrs = dict(attrs or {})
    Dv = Dv or D
    shp = (lambda S, H, d: (B, S, H, d)) if layout == "BSHD" else (lambda S, H, d: (B, H, S, d))
    q, q64 = rnd(shp(Sq, Hq, D), dtype, qscale)
    k, k64 = rnd(shp(Sk, Hkv, D), dtype)
    v, v64 = rnd(shp(Sk, Hkv, Dv), dtype)
    tensors = {"q": q, "k": k, "v": v}
    req_t = {"q": desc(q, dtype, layout), "k": desc(k, dtype, layout), "v": desc(v, dtype, layout, v_strides)}
    m64 = None
    mask_desc = None
    if mask is not None:
        kind, mshape, mdtype = mask
        if kind in ("bool", "dead_row"):
            m = torch.rand(mshape) < 0.7
            m[..., :, 0] = True  # every row keeps a key ...
            if kind == "dead_row":
                m[..., 1, :] = False  # ... but query row 1, which sees none
            m64 = m
            mask_desc = f"bool keep-mask {list(mshape)}"
        else:
            mf, mf64 = rnd(mshape, mdtype, 2.0)
            # a few -inf entries (never a whole row)
            ninf = torch.rand(mshape) < 0.1
            ninf[..., :, 0] = False
            mf = mf.masked_fill(ninf, float("-inf"))
            mf64 = mf.to(F64)
            m, m64 = mf, mf64
            mask_desc = f"additive {mdtype} mask {list(mshape)} (some -inf)"
        tensors["mask"] = m
        req_t["mask"] = desc(m, mdtype)
    qh = q64 if layout == "BHSD" else q64.permute(0, 2, 1, 3)
    kh = k64 if layout == "BHSD" else k64.permute(0, 2, 1, 3)
    vh = v64 if layout == "BHSD" else v64.permute(0, 2, 1, 3)
    out = attention_expected(qh, kh, vh, attrs, m64)
    tensors["expected"] = to_layout(out, layout).to(DT[dtype])
    request = {"op": "attention", "tensors": req_t, "attrs": attrs}
    src = sdpa_source(attrs, mask_desc, gqa=Hq != Hkv)
    return name, tensors, request, "attention", src


def attention_varlen(name, dtype, seqs_q, seqs_k, Hq, Hkv, D, attrs=None):
    seed(name)
    attrs = dict(attrs or {})
    Tq, Tk = sum(seqs_q), sum(seqs_k)
    q, q64 = rnd((1, Tq, Hq, D), dtype)
    k, k64 = rnd((1, Tk, Hkv, D), dtype)
    v, v64 = rnd((1, Tk, Hkv, D), dtype)
    cq = torch.tensor([0] + list(torch.tensor(seqs_q).cumsum(0)), dtype=torch.int32)
    ck = torch.tensor([0] + list(torch.tensor(seqs_k).cumsum(0)), dtype=torch.int32)
    outs = []
    for n in range(len(seqs_q)):
        qs = q64[:, cq[n]:cq[n + 1]].permute(0, 2, 1, 3)
        ks = k64[:, ck[n]:ck[n + 1]].permute(0, 2, 1, 3)
        vs = v64[:, ck[n]:ck[n + 1]].permute(0, 2, 1, 3)
        outs.append(attention_expected(qs, ks, vs, attrs).permute(0, 2, 1, 3))
    out = torch.cat(outs, dim=1)
    tensors = {"q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck, "expected": out.to(DT[dtype])}
    req_t = {
        "q": desc(q, dtype, "BSHD"), "k": desc(k, dtype, "BSHD"), "v": desc(v, dtype, "BSHD"),
        "cu_seqlens_q": desc(cq, "i32"), "cu_seqlens_k": desc(ck, "i32"),
    }
    request = {"op": "attention", "tensors": req_t, "attrs": attrs}
    return name, tensors, request, "attention", sdpa_source(attrs, gqa=Hq != Hkv, per_seq=True)


@case
def _():
    return attention("attn_bshd_f32_plain", "f32", 2, 7, 7, 4, 4, 64)


@case
def _():
    return attention("attn_bhsd_f32_causal_top_left_sq5_sk9", "f32", 2, 5, 9, 3, 3, 64, layout="BHSD",
                     attrs={"causal": True, "causal_alignment": "top_left"})


@case
def _():
    return attention("attn_bshd_f16_causal_bottom_right_sq5_sk9_d80", "f16", 2, 5, 9, 2, 2, 80,
                     attrs={"causal": True, "causal_alignment": "bottom_right"})


@case
def _():
    return attention("attn_bshd_bf16_gqa4_causal_d128", "bf16", 1, 13, 13, 8, 2, 128, attrs={"causal": True})


@case
def _():
    return attention("attn_bhsd_f16_mqa_d96", "f16", 2, 11, 11, 4, 1, 96, layout="BHSD")


@case
def _():
    return attention("attn_bshd_f32_bool_mask_sqsk", "f32", 2, 6, 9, 4, 2, 64, mask=("bool", (6, 9), "bool"))


@case
def _():
    return attention("attn_bshd_f16_bool_mask_b1sqsk_causal", "f16", 2, 7, 7, 2, 2, 64,
                     attrs={"causal": True}, mask=("bool", (2, 1, 7, 7), "bool"))


@case
def _():
    return attention("attn_bshd_f32_float_mask_b1sqsk", "f32", 2, 5, 8, 2, 2, 64,
                     mask=("float", (2, 1, 5, 8), "f32"))


@case
def _():
    return attention("attn_bhsd_bf16_float_mask_sqsk_causal", "bf16", 1, 9, 9, 4, 4, 64, layout="BHSD",
                     attrs={"causal": True}, mask=("float", (9, 9), "bf16"))


@case
def _():
    return attention("attn_bshd_f32_window3_causal", "f32", 1, 12, 12, 2, 2, 64,
                     attrs={"causal": True, "window_left": 3})


@case
def _():
    return attention("attn_bshd_f16_window2_noncausal_sq6_sk10", "f16", 1, 6, 10, 2, 2, 64,
                     attrs={"window_left": 2})


@case
def _():
    return attention("attn_bshd_f32_alibi_6heads_causal", "f32", 1, 10, 10, 6, 6, 64,
                     attrs={"causal": True, "alibi": True})


@case
def _():
    return attention("attn_bshd_f16_alibi_6heads_gqa_sq4_sk9", "f16", 1, 4, 9, 6, 3, 64, attrs={"alibi": True})


@case
def _():
    return attention("attn_bshd_f32_softcap", "f32", 1, 8, 8, 2, 2, 64, attrs={"softcap": 5.0}, qscale=4.0)


@case
def _():
    return attention("attn_bshd_bf16_softcap_causal", "bf16", 1, 9, 9, 2, 2, 64,
                     attrs={"causal": True, "softcap": 8.0}, qscale=4.0)


@case
def _():
    return attention("attn_bshd_f32_custom_scale", "f32", 1, 7, 7, 2, 2, 64, attrs={"scale": 0.3})


@case
def _():
    return attention("attn_bshd_f32_cross_dv48", "f32", 2, 6, 17, 2, 2, 64, Dv=48)


@case
def _():
    return attention("attn_bshd_f16_decode_sq1_sk33_gqa2", "f16", 2, 1, 33, 4, 2, 128, attrs={"causal": True})


@case
def _():
    return attention("attn_bshd_f32_dead_row_bool_mask", "f32", 1, 5, 6, 2, 2, 64,
                     mask=("dead_row", (1, 1, 5, 6), "bool"))


@case
def _():
    return attention("attn_bshd_f32_causal_bottom_right_sq7_sk4_dead_rows", "f32", 1, 7, 4, 2, 2, 64,
                     attrs={"causal": True})


@case
def _():
    # v is a strided view (padding after each head row), as a slice of a wider tensor.
    B, Sk, H, D = 1, 9, 2, 64
    return attention("attn_bshd_f32_strided_v", "f32", B, 9, Sk, H, H, D,
                     v_strides=[Sk * H * 2 * D, H * 2 * D, 2 * D, 1])


@case
def _():
    return attention("attn_bhsd_f32_odd_s31_d128_causal", "f32", 1, 31, 31, 1, 1, 128, layout="BHSD",
                     attrs={"causal": True})


@case
def _():
    return attention_varlen("attn_varlen3_f32_causal", "f32", [3, 5, 7], [5, 3, 11], 2, 2, 64,
                            attrs={"causal": True})


@case
def _():
    return attention_varlen("attn_varlen3_bf16_gqa_noncausal", "bf16", [4, 1, 6], [4, 9, 6], 4, 2, 64)


# ----------------------------------------------------------------------- paged attention


def paged(name, dtype, B, Sq, Hq, Hkv, D, page_size, ctx, layout="NHD", bt_dtype="i32", cache_dtype=None,
          attrs=None):
    seed(name)
    attrs = dict(attrs or {})
    cache_dtype = cache_dtype or dtype
    P = page_size
    pages_per = [math.ceil(c / P) for c in ctx]
    max_pages = max(pages_per) + 1  # a spare column: table slots past the context are valid pages
    num_pages = sum(pages_per) + 2  # spare pages hold garbage nobody reads
    perm = torch.randperm(num_pages)
    bt = torch.randint(0, num_pages, (B, max_pages))
    at = 0
    for b in range(B):
        bt[b, : pages_per[b]] = perm[at: at + pages_per[b]]
        at += pages_per[b]
    bt = bt.to(DT[bt_dtype])
    cl = torch.tensor(ctx, dtype=torch.int32)
    q, q64 = rnd((B, Sq, Hq, D), dtype)
    cshape = (num_pages, P, Hkv, D) if layout == "NHD" else (num_pages, Hkv, P, D)
    tensors = {"q": q}
    req_t = {"q": desc(q, dtype, "BSHD")}
    caches = {}
    for nm in ("k", "v"):
        if cache_dtype == "fp8_e4m3":
            scale = torch.rand(Hkv, dtype=torch.float32) * 0.05 + 0.01
            true = torch.randn(cshape, dtype=F64)
            hs = scale.to(F64).view(1, 1, Hkv, 1) if layout == "NHD" else scale.to(F64).view(1, Hkv, 1, 1)
            c = (true / hs).to(torch.float8_e4m3fn)
            c64 = c.to(F64) * hs
            tensors[f"{nm}_scale"] = scale
            req_t[f"{nm}_scale"] = desc(scale, "f32")
        else:
            c, c64 = rnd(cshape, cache_dtype)
        tensors[f"{nm}_cache"] = c
        req_t[f"{nm}_cache"] = desc(c, cache_dtype, layout)
        caches[nm] = c64 if layout == "NHD" else c64.permute(0, 2, 1, 3)  # -> [pages, P, Hkv, D]
    tensors["block_table"] = bt
    tensors["context_lens"] = cl
    req_t["block_table"] = desc(bt, bt_dtype)
    req_t["context_lens"] = desc(cl, "i32")
    out = torch.zeros(B, Sq, Hq, D, dtype=F64)
    for b in range(B):
        t = torch.arange(ctx[b])
        page = bt[b].to(torch.int64)[t // P]
        off = t % P
        kb = caches["k"][page, off].permute(1, 0, 2)[None]  # [1, Hkv, ctx, D]
        vb = caches["v"][page, off].permute(1, 0, 2)[None]
        qb = q64[b: b + 1].permute(0, 2, 1, 3)
        out[b] = attention_expected(qb, kb, vb, attrs)[0].permute(1, 0, 2)
    tensors["expected"] = out.to(DT[dtype])
    request = {"op": "paged_attention", "tensors": req_t, "attrs": attrs}
    gather = (f"k/v gathered per sequence: cache[block_table[b, t // {P}], t % {P}] for t < context_lens[b] "
              f"({layout} cache)")
    if cache_dtype == "fp8_e4m3":
        gather += ", dequantized as float8_e4m3fn.to(float64) * {k,v}_scale[kv_head]"
    src = gather + "; queries are the last Sq positions (bottom-right); then " + sdpa_source(attrs, gqa=Hq != Hkv)
    return name, tensors, request, "attention", src


@case
def _():
    return paged("paged_nhd_f16_p16_i32_decode_gqa", "f16", 3, 1, 4, 2, 64, 16, [17, 33, 5],
                 attrs={"causal": True})


@case
def _():
    return paged("paged_hnd_bf16_p16_i64_decode", "bf16", 2, 1, 4, 4, 128, 16, [40, 16], layout="HND",
                 bt_dtype="i64", attrs={"causal": True})


@case
def _():
    return paged("paged_nhd_f32_p1_i32_decode_mqa", "f32", 3, 1, 4, 1, 64, 1, [7, 3, 12],
                 attrs={"causal": True})


@case
def _():
    return paged("paged_hnd_f32_p64_i64_sq3_causal", "f32", 2, 3, 2, 2, 64, 64, [100, 5], layout="HND",
                 bt_dtype="i64", attrs={"causal": True})


@case
def _():
    return paged("paged_nhd_f16_fp8_e4m3_per_head_scales", "f16", 2, 1, 4, 2, 64, 16, [20, 9],
                 cache_dtype="fp8_e4m3", attrs={"causal": True})


@case
def _():
    return paged("paged_hnd_f32_p16_alibi_softcap_window_sq2", "f32", 2, 2, 6, 3, 64, 16, [19, 30],
                 layout="HND", attrs={"causal": True, "alibi": True, "softcap": 10.0, "window_left": 12})


@case
def _():
    return paged("paged_nhd_bf16_p16_noncausal_sq2", "bf16", 2, 2, 2, 2, 96, 16, [16, 23], bt_dtype="i64")


# ----------------------------------------------------------------------------------- RoPE


def rope_frequencies(attrs, rotary_dim, seq_len):
    """inv_freq and attention factor: transformers ROPE_INIT_FUNCTIONS
    (_compute_default/linear/dynamic_ntk/yarn/llama3_parameters), written out in float64."""
    base = attrs.get("base") or 10000.0
    dim = rotary_dim
    inv = lambda b: 1.0 / (b ** (torch.arange(0, dim, 2, dtype=F64) / dim))  # noqa: E731
    sc = attrs.get("scaling")
    if sc is None:
        return inv(base), 1.0
    t = sc["type"]
    factor = sc["factor"]
    if t == "linear":
        return inv(base) / factor, 1.0
    if t == "dynamic_ntk":
        orig = sc["original_max_position"]
        seq_len = max(seq_len, orig)
        b = base * ((factor * seq_len / orig) - (factor - 1)) ** (dim / (dim - 2))
        return inv(b), 1.0
    if t == "yarn":
        orig = sc["original_max_position"]
        beta_fast = sc.get("beta_fast", 32.0)
        beta_slow = sc.get("beta_slow", 1.0)

        def find_correction_dim(num_rotations):
            return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

        low = max(math.floor(find_correction_dim(beta_fast)), 0)
        high = min(math.ceil(find_correction_dim(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=F64) - low) / (high - low)).clamp(0, 1)
        pos_freqs = base ** (torch.arange(0, dim, 2, dtype=F64) / dim)
        extra = 1.0 / pos_freqs
        inter = 1.0 / (factor * pos_freqs)
        extra_factor = 1 - ramp
        inv_freq = inter * (1 - extra_factor) + extra * extra_factor
        mscale = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
        return inv_freq, mscale
    if t == "llama3":
        inv_freq = inv(base)
        old = sc["original_max_position"]
        lf, hf = sc["low_freq_factor"], sc["high_freq_factor"]
        low_wavelen, high_wavelen = old / lf, old / hf
        wavelen = 2 * math.pi / inv_freq
        llama = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - lf) / (hf - lf)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, llama), 1.0
    raise ValueError(t)


def apply_rope(x, cos, sin, rotary_dim, style):
    """x [B, S, H, D] float64; cos/sin [B, S, rotary_dim/2]."""
    cos = cos[:, :, None, :]
    sin = sin[:, :, None, :]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if style == "rotate_half":
        h = rotary_dim // 2
        x1, x2 = rot[..., :h], rot[..., h:]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        xe, xo = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([xe * cos - xo * sin, xo * cos + xe * sin], dim=-1).flatten(-2)
    return torch.cat([out, rest], dim=-1)


def rope(name, dtype, B, S, H, D, layout="BSHD", attrs=None, Hk=None, with_k=True, positions=None,
         tables=None):
    """positions: None | ('1d'|'2d', dtype, max). tables: None | (max_position, dtype)."""
    seed(name)
    attrs = dict(attrs or {})
    rd = attrs.get("rotary_dim") or D
    Hk = Hk or H
    shp = (lambda h: (B, S, h, D)) if layout == "BSHD" else (lambda h: (B, h, S, D))
    q, q64 = rnd(shp(H), dtype)
    tensors = {"q": q}
    req_t = {"q": desc(q, dtype, layout)}
    if with_k:
        k, k64 = rnd(shp(Hk), dtype)
        tensors["k"] = k
        req_t["k"] = desc(k, dtype, layout)
    if positions is not None:
        kind, pdtype, pmax = positions
        pshape = (S,) if kind == "1d" else (B, S)
        pos = torch.randint(0, pmax, pshape).to(DT[pdtype])
        tensors["positions"] = pos
        req_t["positions"] = desc(pos, pdtype)
        pos_b = pos.to(torch.int64).expand(B, S) if kind == "1d" else pos.to(torch.int64)
    else:
        pos_b = torch.arange(S).expand(B, S)
    if tables is not None:
        maxpos, tdtype = tables
        inv_freq, _ = rope_frequencies(attrs, rd, maxpos)
        ang = torch.arange(maxpos, dtype=F64)[:, None] * inv_freq[None, :]
        cos_t, sin_t = torch.cos(ang).to(DT[tdtype]), torch.sin(ang).to(DT[tdtype])
        tensors["cos"], tensors["sin"] = cos_t, sin_t
        req_t["cos"], req_t["sin"] = desc(cos_t, tdtype), desc(sin_t, tdtype)
        cos, sin = cos_t.to(F64)[pos_b], sin_t.to(F64)[pos_b]
        src = (f"cos/sin tables [{maxpos}, {rd // 2}] stored in {tdtype}; cos = cos_table[positions], "
               f"sin = sin_table[positions]")
    else:
        seq_len = int(pos_b.max()) + 1
        inv_freq, mscale = rope_frequencies(attrs, rd, seq_len)
        ang = pos_b.to(F64)[..., None] * inv_freq
        cos, sin = torch.cos(ang) * mscale, torch.sin(ang) * mscale
        sc = attrs.get("scaling")
        kind = sc["type"] if sc else "default"
        src = (f"inv_freq, attention_factor = transformers _compute_{kind}_rope_parameters formula "
               f"(float64, dim=rotary_dim={rd}, base={attrs.get('base') or 10000.0}"
               + (f", seq_len=max(positions)+1={seq_len}" if kind == "dynamic_ntk" else "")
               + "); cos = cos(positions * inv_freq) * attention_factor, sin likewise")
    style = attrs.get("style", "rotate_half")
    to_bshd = (lambda x: x) if layout == "BSHD" else (lambda x: x.permute(0, 2, 1, 3))
    out_q = to_bshd(apply_rope(to_bshd(q64), cos, sin, rd, style))
    tensors["expected"] = out_q.to(DT[dtype])
    if with_k:
        tensors["expected_k"] = to_bshd(apply_rope(to_bshd(k64), cos, sin, rd, style)).to(DT[dtype])
    if style == "rotate_half":
        src += ("; x[..., :rd]: out = x*cos + rotate_half(x)*sin with rotate_half(x) = cat(-x2, x1) "
                "(transformers apply_rotary_pos_emb, cos/sin repeated over both halves)")
    else:
        src += "; interleaved (GPT-J): out[2i] = x[2i]*cos_i - x[2i+1]*sin_i, out[2i+1] = x[2i+1]*cos_i + x[2i]*sin_i"
    if rd < D:
        src += f"; dims {rd}.. of each head pass through"
    request = {"op": "rope", "tensors": req_t, "attrs": attrs}
    return name, tensors, request, "rope", src + "; float64, cast to the request dtype"


@case
def _():
    return rope("rope_bshd_f32_rotate_half", "f32", 2, 9, 3, 64, attrs={"style": "rotate_half"})


@case
def _():
    return rope("rope_bhsd_f32_interleaved", "f32", 1, 7, 2, 32, layout="BHSD", attrs={"style": "interleaved"})


@case
def _():
    return rope("rope_bshd_f16_partial_rd32_q_only", "f16", 2, 8, 2, 64, attrs={"rotary_dim": 32},
                with_k=False)


@case
def _():
    return rope("rope_bshd_bf16_interleaved_partial_rd16_d48", "bf16", 1, 6, 4, 48,
                attrs={"style": "interleaved", "rotary_dim": 16}, Hk=2)


@case
def _():
    return rope("rope_bshd_f32_positions_i64_bs", "f32", 2, 5, 2, 64, positions=("2d", "i64", 200))


@case
def _():
    return rope("rope_bhsd_f16_positions_i32_s", "f16", 2, 6, 2, 64, layout="BHSD",
                positions=("1d", "i32", 64), attrs={"base": 500000.0})


@case
def _():
    return rope("rope_bshd_f32_linear", "f32", 1, 6, 2, 64, positions=("1d", "i32", 100),
                attrs={"scaling": {"type": "linear", "factor": 4.0}})


@case
def _():
    return rope("rope_bshd_f32_dynamic_ntk", "f32", 1, 20, 2, 64,
                attrs={"scaling": {"type": "dynamic_ntk", "factor": 2.0, "original_max_position": 8}})


@case
def _():
    return rope("rope_bshd_f32_yarn", "f32", 1, 6, 2, 64, positions=("1d", "i64", 120),
                attrs={"scaling": {"type": "yarn", "factor": 4.0, "original_max_position": 32}})


@case
def _():
    return rope("rope_bhsd_bf16_yarn_betas_interleaved", "bf16", 1, 5, 2, 64, layout="BHSD",
                positions=("1d", "i32", 120),
                attrs={"style": "interleaved",
                       "scaling": {"type": "yarn", "factor": 8.0, "original_max_position": 64,
                                   "beta_fast": 16.0, "beta_slow": 2.0}})


@case
def _():
    return rope("rope_bshd_f32_llama3", "f32", 1, 6, 2, 64, positions=("1d", "i32", 300),
                attrs={"base": 500000.0,
                       "scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position": 64}})


# Spec 002 section 6.19: every scaling variant in the interleaved (GPT-J) layout as well.
@case
def _():
    return rope("rope_bshd_f32_linear_interleaved", "f32", 1, 6, 2, 64, positions=("1d", "i64", 100),
                attrs={"style": "interleaved", "scaling": {"type": "linear", "factor": 4.0}})


@case
def _():
    return rope("rope_bhsd_f32_dynamic_ntk_interleaved", "f32", 1, 20, 2, 32, layout="BHSD",
                attrs={"style": "interleaved",
                       "scaling": {"type": "dynamic_ntk", "factor": 2.0, "original_max_position": 8}})


@case
def _():
    return rope("rope_bshd_f32_llama3_interleaved", "f32", 1, 6, 2, 64, positions=("1d", "i32", 300),
                attrs={"base": 500000.0, "style": "interleaved",
                       "scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position": 64}})


@case
def _():
    return rope("rope_bshd_f32_cos_sin_tables", "f32", 2, 7, 2, 32, positions=("1d", "i32", 48),
                tables=(48, "f32"))


@case
def _():
    return rope("rope_bshd_f16_cos_sin_tables_interleaved_partial", "f16", 1, 5, 2, 64,
                positions=("2d", "i64", 32), tables=(32, "f32"),
                attrs={"style": "interleaved", "rotary_dim": 32})


# ------------------------------------------------------------- row-wise, GEMM and quant ops
#
# Expected outputs are computed in float64 from the dtype-rounded inputs and cast to the
# output dtype. Each case also runs a float32 emulation of a straightforward kernel (f32
# accumulation, as the args docs say) and asserts that it passes the fixture's tolerance
# with margin, so a fixture never asks for more than the specification's table allows;
# integer and fp8 outputs are exact and their emulation must match bit for bit.

DT["i8"] = torch.int8
VERBOSE = False
F32 = torch.float32
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def rnd_shift(shape, dtype, scale=1.0, shift=0.0):
    x = (torch.randn(shape, dtype=F64) * scale + shift).to(DT[dtype])
    return x, x.to(F64)


def table_tol(category, dtype):
    """(rtol, atol, ulp) of spec 002 section 5, as layerzero::parity::compare::output_tolerance."""
    if dtype not in FLOATS:
        return 0.0, 0.0, 0.0
    ulp = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}.get(dtype, 0.0)
    rows = {
        "attention": (1e-3, 1e-2, 1e-5), "norms": (1e-3, 1e-2, 1e-6), "gemm": (1e-3, 1e-2, 1e-6),
        "rope": (1e-4, 1e-3, 1e-6),
    }
    f16, bf16, f32 = rows[category]
    t = {torch.float16: f16, torch.bfloat16: bf16, torch.float32: f32}[dtype]
    return t, t, ulp


def check_emulation(name, category, tensors, emu, label, margin=0.5):
    """Asserts that the emulated outputs {expected_name: tensor} pass the comparison of
    tests/tests/fixtures.rs, with the table's rtol/atol scaled by `margin`."""
    for key, got in emu.items():
        ref = tensors[key]
        assert got.dtype == ref.dtype and got.shape == ref.shape, (name, label, key, got.dtype, got.shape)
        rtol, atol, ulp = table_tol(category, ref.dtype)
        r, o = ref.to(F64), got.to(F64)
        d = (o - r).abs()
        ok = (d <= margin * (atol + rtol * r.abs())) | (d <= ulp * torch.maximum(r.abs(), o.abs()))
        if VERBOSE and atol > 0:
            worst = float(torch.where(d <= ulp * torch.maximum(r.abs(), o.abs()), 0.0, d / (atol + rtol * r.abs())).max())
            print(f"  {name}: {label} `{key}` worst |d| / tol = {worst:.3f}", file=sys.stderr)
        if not bool(ok.all()):
            i = int((~ok).flatten().nonzero()[0])
            raise AssertionError(f"{name}: {label} `{key}` fails at [{i}]: {r.flatten()[i]} vs {o.flatten()[i]} "
                                 f"({int((~ok).sum())} of {ok.numel()})")


# ----------------------------------------------------------------------------------- norms


def sum_seq(v):
    """Float32 sum over the last dim, one element at a time (torch's own float32 sums
    accumulate more precisely than a plain loop kernel)."""
    acc = torch.zeros(v.shape[:-1], dtype=F32)
    for i in range(v.shape[-1]):
        acc = acc + v[..., i]
    return acc


def rms_norm_seq32(s, w, eps):
    ms = sum_seq(s * s) / s.shape[-1]
    return s * torch.rsqrt(ms + eps)[..., None] * w


def layer_norm_seq32(x, w, b, eps):
    H = x.shape[-1]
    mean = sum_seq(x) / H
    d = x - mean[..., None]
    var = sum_seq(d * d) / H
    out = d * torch.rsqrt(var + eps)[..., None] * w
    return out if b is None else out + b


def norm(name, op, dtype, shape, residual=False, bias=False, eps=None):
    seed(name)
    H = shape[-1]
    x, x64 = rnd_shift(shape, dtype, 2.0, 0.5 if op == "layer_norm" else 0.0)
    w, w64 = rnd_shift((H,), dtype, 0.25, 0.5)  # |out| mostly < 2: float32 sums stay well inside 1e-6
    tensors = {"x": x, "weight": w}
    attrs = {} if eps is None else {"eps": eps}
    if op == "rms_norm":
        e = 1e-6 if eps is None else eps
        s64 = x64
        if residual:
            r, r64 = rnd(shape, dtype)
            tensors["residual"] = r
            s64 = x64 + r64
            tensors["expected_residual_out"] = s64.to(DT[dtype])
        tensors["expected"] = F.rms_norm(s64, (H,), w64, eps=e).to(DT[dtype])
        s32 = x.float() + tensors["residual"].float() if residual else x.float()
        emu = {"expected": F.rms_norm(s32, (H,), w.float(), eps=e).to(DT[dtype])}
        emu_seq = {"expected": rms_norm_seq32(s32, w.float(), e).to(DT[dtype])}
        if residual:
            emu["expected_residual_out"] = s32.to(DT[dtype])
        src = (f"torch.nn.functional.rms_norm(s, ({H},), weight, eps={e}) in float64 with s = x"
               + (" + residual (float64; expected_residual_out = s cast to x's dtype)" if residual else ""))
    else:
        e = 1e-5 if eps is None else eps
        b64 = None
        if bias:
            b, b64 = rnd((H,), dtype, 0.5)
            tensors["bias"] = b
        tensors["expected"] = F.layer_norm(x64, (H,), w64, b64, eps=e).to(DT[dtype])
        b32 = tensors["bias"].float() if bias else None
        emu = {"expected": F.layer_norm(x.float(), (H,), w.float(), b32, eps=e).to(DT[dtype])}
        emu_seq = {"expected": layer_norm_seq32(x.float(), w.float(), b32, e).to(DT[dtype])}
        src = f"torch.nn.functional.layer_norm(x, ({H},), weight, {'bias' if bias else 'None'}, eps={e}) in float64"
    check_emulation(name, "norms", tensors, emu, "f32 torch")
    check_emulation(name, "norms", tensors, emu_seq, "f32 sequential sums")
    req_t = {k: desc(t, dtype) for k, t in tensors.items() if not k.startswith("expected")}
    request = {"op": op, "tensors": req_t, "attrs": attrs}
    return name, tensors, request, "norms", src + ", cast to x's dtype"


@case
def _():
    return norm("rms_norm_f32_h511", "rms_norm", "f32", (9, 511))


@case
def _():
    return norm("rms_norm_f16_residual_b3s4_h257", "rms_norm", "f16", (3, 4, 257), residual=True)


@case
def _():
    return norm("rms_norm_bf16_residual_eps1e-5_h129", "rms_norm", "bf16", (6, 129), residual=True, eps=1e-5)


@case
def _():
    return norm("rms_norm_bf16_h95", "rms_norm", "bf16", (7, 95))


@case
def _():
    return norm("layer_norm_f32_bias_h511", "layer_norm", "f32", (4, 511), bias=True)


@case
def _():
    return norm("layer_norm_f16_nobias_h95", "layer_norm", "f16", (7, 95))


@case
def _():
    return norm("layer_norm_bf16_bias_eps1e-6_b2s3_h333", "layer_norm", "bf16", (2, 3, 333), bias=True, eps=1e-6)


# ---------------------------------------------------------------------------------- linear


def mm_torch(a, b):
    return a.float() @ b.float()


def mm_seq(a, b):
    """a [..., K] @ b [K, N] in float32, the products added one k at a time (a plain loop)."""
    a, b = a.float(), b.float()
    acc = torch.zeros(a.shape[:-1] + (b.shape[1],), dtype=F32)
    for k in range(a.shape[-1]):
        acc = acc + a[..., k, None] * b[k]
    return acc


def mm_lanes(a, b, lanes=8):
    """Float32 with `lanes` interleaved partial sums (k % lanes), added at the end (SIMD style)."""
    parts = [mm_seq(a[..., i::lanes], b[i::lanes]) for i in range(lanes)]
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


# Float32 GEMM emulations every GEMM fixture must pass (note: torch's float32 cumsum/sum
# accumulate in double, so the loops are written out).
MATMULS = {"f32 torch matmul": mm_torch, "f32 sequential": mm_seq, "f32 8 lanes": mm_lanes}


def linear(name, dtype, M, K, N, layout="NT", bias=True):
    seed(name)
    x, x64 = rnd((M, K), dtype)
    wshape = (N, K) if layout == "NT" else (K, N)
    w, w64 = rnd(wshape, dtype, 0.5 / math.sqrt(K))  # outputs ~0.5: f32 sums stay well inside 1e-6
    W64 = w64.T if layout == "NT" else w64  # [K, N]
    W = w.T if layout == "NT" else w
    tensors = {"x": x, "weight": w}
    out = x64 @ W64
    emus = {label: mm(x, W) for label, mm in MATMULS.items()}
    if bias:
        b, b64 = rnd((N,), dtype, 0.5)
        tensors["bias"] = b
        out = out + b64
        emus = {label: e + b.float() for label, e in emus.items()}
    tensors["expected"] = out.to(DT[dtype])
    for label, e in emus.items():
        check_emulation(name, "gemm", tensors, {"expected": e.to(DT[dtype])}, label)
    req_t = {"x": desc(x, dtype), "weight": desc(w, dtype, layout)}
    if bias:
        req_t["bias"] = desc(tensors["bias"], dtype)
    request = {"op": "linear", "tensors": req_t, "attrs": {}}
    wt = "weight.T" if layout == "NT" else "weight"
    src = f"x @ {wt}" + (" + bias" if bias else "") + f" in float64 (weight layout {layout}), cast to x's dtype"
    return name, tensors, request, "gemm", src


@case
def _():
    return linear("linear_nt_f32_m1_k96_n40_bias", "f32", 1, 96, 40, "NT")


@case
def _():
    return linear("linear_nn_f32_m17_k80_n33_bias", "f32", 17, 80, 33, "NN")


@case
def _():
    return linear("linear_nt_f16_m17_k130_n24", "f16", 17, 130, 24, "NT", bias=False)


@case
def _():
    return linear("linear_nn_bf16_m1_k64_n48_bias", "bf16", 1, 64, 48, "NN")


# ----------------------------------------------------------------------------- activations


def act64(kind, x):
    if kind == "silu":
        return F.silu(x)
    if kind in ("gelu", "none"):
        return F.gelu(x)
    if kind in ("gelu_tanh", "tanh"):
        return F.gelu(x, approximate="tanh")
    raise ValueError(kind)


def act_src(kind):
    return {"silu": "torch.nn.functional.silu", "gelu": "torch.nn.functional.gelu",
            "none": "torch.nn.functional.gelu",
            "gelu_tanh": "torch.nn.functional.gelu(approximate='tanh')",
            "tanh": "torch.nn.functional.gelu(approximate='tanh')"}[kind]


def elementwise(name, op, dtype, shape, approximate=None, margin=0.5):
    seed(name)
    x, x64 = rnd(shape, dtype, 3.0)
    kind = "silu" if op == "silu" else (approximate or "none")
    tensors = {"x": x, "expected": act64(kind, x64).to(DT[dtype])}
    check_emulation(name, "gemm", tensors, {"expected": act64(kind, x.float()).to(DT[dtype])}, "f32 torch", margin)
    attrs = {} if approximate is None else {"approximate": approximate}
    request = {"op": op, "tensors": {"x": desc(x, dtype)}, "attrs": attrs}
    return name, tensors, request, "gemm", f"{act_src(kind)}(x) in float64, cast to x's dtype"


def glu(name, op, dtype, shape, split, approximate=None, scale=2.0):
    """shape: the output shape [..., I]."""
    seed(name)
    kind = "silu" if op == "swiglu" else (approximate or "none")
    I = shape[-1]
    tensors = {}
    if split:
        x, x64 = rnd(tuple(shape[:-1]) + (2 * I,), dtype, scale)
        tensors["x"] = x
        g64, u64 = x64[..., :I], x64[..., I:]
        g32, u32 = x.float()[..., :I], x.float()[..., I:]
    else:
        g, g64 = rnd(shape, dtype, scale)
        u, u64 = rnd(shape, dtype, scale)
        tensors["gate"], tensors["up"] = g, u
        g32, u32 = g.float(), u.float()
    tensors["expected"] = (act64(kind, g64) * u64).to(DT[dtype])
    check_emulation(name, "gemm", tensors, {"expected": (act64(kind, g32) * u32).to(DT[dtype])}, "f32 torch")
    attrs = {"split": split}
    if approximate is not None:
        attrs["approximate"] = approximate
    req_t = {k: desc(t, dtype) for k, t in tensors.items() if k != "expected"}
    request = {"op": op, "tensors": req_t, "attrs": attrs}
    parts = "gate, up = x[..., :I], x[..., I:]; " if split else ""
    return name, tensors, request, "gemm", parts + f"{act_src(kind)}(gate) * up in float64, cast to the input dtype"


@case
def _():
    return glu("swiglu_split_f16_i65", "swiglu", "f16", (9, 65), split=True)


@case
def _():
    return glu("swiglu_separate_bf16_b2s3_i48", "swiglu", "bf16", (2, 3, 48), split=False)


@case
def _():
    return glu("swiglu_separate_f32_i33", "swiglu", "f32", (5, 33), split=False)


@case
def _():
    return glu("geglu_separate_erf_f32_i70", "geglu", "f32", (4, 70), split=False, approximate="none",
               scale=1.0)


@case
def _():
    return glu("geglu_split_tanh_bf16_i57", "geglu", "bf16", (6, 57), split=True, approximate="tanh")


@case
def _():
    return elementwise("gelu_erf_f32", "gelu", "f32", (7, 130), margin=1.0)


@case
def _():
    return elementwise("gelu_tanh_f16", "gelu", "f16", (5, 97), approximate="tanh")


@case
def _():
    return elementwise("silu_bf16", "silu", "bf16", (3, 4, 77))


@case
def _():
    return elementwise("silu_f32", "silu", "f32", (6, 61))


# ------------------------------------------------------------------------------ MLP and MoE


def mlp64(x64, wg, wu, wd, activation):
    return (act64(activation, x64 @ wg.T) * (x64 @ wu.T)) @ wd.T


def mlp32(x, wg, wu, wd, activation, chain_dtype=None, mm=mm_torch):
    """Float32 emulation; with chain_dtype the two projections and the GLU are rounded to
    that dtype between steps (an unfused linear -> swiglu -> linear chain)."""
    rd = (lambda t: t.to(chain_dtype).float()) if chain_dtype else (lambda t: t)
    g, u = rd(mm(x, wg.float().T)), rd(mm(x, wu.float().T))
    h = rd(act64(activation, g) * u)
    return mm(h, wd.float().T)


def mlp(name, dtype, xshape, I, activation):
    seed(name)
    H = xshape[-1]
    x, x64 = rnd(xshape, dtype)
    wg, wg64 = rnd((I, H), dtype, 1.0 / math.sqrt(H))
    wu, wu64 = rnd((I, H), dtype, 1.0 / math.sqrt(H))
    wd, wd64 = rnd((H, I), dtype, 0.5 / math.sqrt(I))
    tensors = {"x": x, "w_gate": wg, "w_up": wu, "w_down": wd}
    tensors["expected"] = mlp64(x64, wg64, wu64, wd64, activation).to(DT[dtype])
    for label, mm in MATMULS.items():
        check_emulation(name, "gemm", tensors, {"expected": mlp32(x, wg, wu, wd, activation, mm=mm).to(DT[dtype])},
                        "fused " + label)
    check_emulation(name, "gemm", tensors,
                    {"expected": mlp32(x, wg, wu, wd, activation, DT[dtype]).to(DT[dtype])}, "chain", margin=1.0)
    req_t = {k: desc(t, dtype) for k, t in tensors.items() if k != "expected"}
    request = {"op": "mlp", "tensors": req_t, "attrs": {"activation": activation}}
    src = f"({act_src(activation)}(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T in float64, cast to x's dtype"
    return name, tensors, request, "gemm", src


@case
def _():
    return mlp("mlp_silu_f32_t17_h48_i80", "f32", (17, 48), 80, "silu")


@case
def _():
    return mlp("mlp_gelu_tanh_bf16_b2s5_h64_i96", "bf16", (2, 5, 64), 96, "gelu_tanh")


def moe_experts(name, dtype, T, H, I, E, k, ids_dtype, activation):
    seed(name)
    x, x64 = rnd((T, H), dtype)
    experts = torch.stack([torch.randperm(E)[:k] for _ in range(T)]).to(DT[ids_dtype])
    weights = (torch.rand(T, k, dtype=F64) * 0.9 + 0.1).to(F32)
    wg, wg64 = rnd((E, I, H), dtype, 1.0 / math.sqrt(H))
    wu, wu64 = rnd((E, I, H), dtype, 1.0 / math.sqrt(H))
    wd, wd64 = rnd((E, H, I), dtype, 0.5 / math.sqrt(I))
    # Dense: every expert on every token, then the routed combination.
    Y = torch.stack([mlp64(x64, wg64[e], wu64[e], wd64[e], activation) for e in range(E)])  # [E, T, H]
    ids = experts.to(torch.int64)
    t = torch.arange(T)[:, None]
    out = (weights.to(F64)[..., None] * Y[ids, t]).sum(1)
    emus = {}
    for label, mm in MATMULS.items():
        Y32 = torch.stack([mlp32(x, wg[e], wu[e], wd[e], activation, mm=mm) for e in range(E)])
        emu = weights[:, 0, None] * Y32[ids[:, 0], t[:, 0]]
        for j in range(1, k):
            emu = emu + weights[:, j, None] * Y32[ids[:, j], t[:, 0]]
        emus[label] = emu
    tensors = {"x": x, "experts": experts, "weights": weights, "w_gate": wg, "w_up": wu, "w_down": wd,
               "expected": out.to(DT[dtype])}
    for label, emu in emus.items():
        check_emulation(name, "gemm", tensors, {"expected": emu.to(DT[dtype])}, label)
    req_t = {k_: desc(t_, {torch.float32: "f32"}.get(t_.dtype, dtype) if k_ != "experts" else ids_dtype)
             for k_, t_ in tensors.items() if k_ != "expected"}
    request = {"op": "moe_experts", "tensors": req_t, "attrs": {"activation": activation}}
    src = (f"dense: y_e = ({act_src(activation)}(x @ w_gate[e].T) * (x @ w_up[e].T)) @ w_down[e].T for every "
           f"expert e, out[t] = sum_j weights[t, j] * y_(experts[t, j])[t], float64, cast to x's dtype")
    return name, tensors, request, "gemm", src


@case
def _():
    return moe_experts("moe_experts_silu_f32_e4_k2_i32", "f32", 9, 32, 48, 4, 2, "i32", "silu")


@case
def _():
    return moe_experts("moe_experts_gelu_bf16_e4_k2_i64", "bf16", 7, 64, 40, 4, 2, "i64", "gelu")


# ------------------------------------------------------------------------------- embedding


def embedding(name, dtype, ids_shape, ids_dtype, V, H):
    seed(name)
    table, table64 = rnd((V, H), dtype)
    ids = torch.randint(0, V, ids_shape)
    ids.view(-1)[0], ids.view(-1)[-1] = 0, V - 1
    ids = ids.to(DT[ids_dtype])
    tensors = {"ids": ids, "table": table, "expected": table64[ids.to(torch.int64)].to(DT[dtype])}
    request = {"op": "embedding", "tensors": {"ids": desc(ids, ids_dtype), "table": desc(table, dtype)}, "attrs": {}}
    return name, tensors, request, "gemm", "table[ids] (torch.nn.functional.embedding), exact"


@case
def _():
    return embedding("embedding_ids_i32_b2s9_f16", "f16", (2, 9), "i32", 50, 24)


@case
def _():
    return embedding("embedding_ids_i64_s13_f32", "f32", (13,), "i64", 37, 40)


# ------------------------------------------------------------------------------- MoE route


def topk_lower_index(p, k):
    """Top-k of each row by (-p, index): a stable descending sort, ties by lower index."""
    rows = []
    for row in p.tolist():
        order = sorted(range(len(row)), key=lambda e: (-row[e], e))
        rows.append(order[:k])
    return torch.tensor(rows, dtype=torch.int64)


def moe_route(name, dtype, T, E, k, renormalize):
    seed(name)
    logits, l64 = rnd((T, E), dtype, 2.0)
    # Ties: an all-equal row, a tie for first place, a tie at the k boundary.
    logits[0] = 0.5
    logits[1, 5] = logits[1, 2] = logits[1].max() + 1
    top = logits[2].max()
    logits[2, 4] = top + 2  # first, then k tied for the k - 1 remaining places: the lower indices win
    for e in [6, 1, 3][:k]:
        logits[2, e] = top + 1
    l64 = logits.to(F64)
    p = torch.softmax(l64, -1)
    experts = topk_lower_index(p, k)
    # The order must not hinge on rounding: a float32 softmax picks the same experts.
    assert torch.equal(experts, topk_lower_index(torch.softmax(logits.float(), -1).to(F64), k)), name
    w = p.gather(1, experts)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    tensors = {"logits": logits, "expected_experts": experts.to(torch.int32), "expected_weights": w.to(F32)}
    p32 = torch.softmax(logits.float(), -1)
    w32 = p32.gather(1, experts)
    if renormalize:
        w32 = w32 / w32.sum(-1, keepdim=True)
    check_emulation(name, "norms", tensors, {"expected_weights": w32}, "f32 softmax")
    request = {"op": "moe_route", "tensors": {"logits": desc(logits, dtype)},
               "attrs": {"top_k": k, "renormalize": renormalize}}
    src = (f"p = torch.softmax(logits, -1) in float64; experts = top {k} by a stable sort on (-p, index) "
           f"(ties to the lower index), i32; weights = p[experts]"
           + (" / sum (renormalized)" if renormalize else "") + ", f32")
    return name, tensors, request, "norms", src


@case
def _():
    return moe_route("moe_route_f32_e8_k2", "f32", 9, 8, 2, False)


@case
def _():
    return moe_route("moe_route_bf16_e8_k3_renormalize", "bf16", 7, 8, 3, True)


# ------------------------------------------------------------------------- (de)quantization


QMAX_I8 = 127.0


def i8_quantize(x32, scale32):
    """round_half_even(x / scale) clamped to [-127, 127]; x / scale is one float32 division."""
    return torch.round(x32 / scale32).clamp(-QMAX_I8, QMAX_I8).to(torch.int8)


def amax_scale(amax32):
    """scale = amax / 127 in float32 (1 where amax is 0)."""
    s = amax32 / torch.tensor(QMAX_I8, dtype=F32)
    return torch.where(amax32 == 0, torch.ones_like(s), s)


def check_i8_numpy(name, x32, scale_full32, q):
    """The same arithmetic in numpy float32 (IEEE division, rint = half to even)."""
    import numpy as np
    xs = x32.numpy().astype(np.float32)
    ss = scale_full32.numpy().astype(np.float32)
    ref = np.clip(np.rint(np.divide(xs, ss, dtype=np.float32)), -127, 127).astype(np.int8)
    assert (ref == q.numpy()).all(), name
    # Near-ties that a kernel computing x * (1 / scale) or in float64 would round the other way.
    recip = np.clip(np.rint(xs * (np.float32(1) / ss)), -127, 127).astype(np.int8)
    f64 = np.clip(np.rint(xs.astype(np.float64) / ss.astype(np.float64)), -127, 127).astype(np.int8)
    return int((recip != ref).sum()), int((f64 != ref).sum())


def quantize(name, dtype, shape, scheme, block=None, scale_layout=None, target="i8"):
    seed(name)
    x, _ = rnd(shape, dtype, 2.0)
    x32 = x.float()
    attrs = {"scheme": scheme, "target": target}
    R = shape[0]
    if scheme == "per_tensor":
        # amax 127/16 makes the scale 1/16: x = (n + 1/2) / 16 are exact ties (half to even).
        x.clamp_(-7.9, 7.9)
        x.view(-1)[0] = 127.0 / 16
        ties = torch.tensor([2.5, -2.5, 3.5, -3.5, 0.5, -0.5, 1.5, -126.5], dtype=F64) / 16
        x.view(-1)[1: 1 + len(ties)] = ties.to(DT[dtype])
        x32 = x.float()
        scale = amax_scale(x32.abs().amax()).reshape(1)
        full = scale.expand(shape)
        src = "scale = x.abs().amax() / 127 ([1])"
    elif scheme == "per_channel":
        x[1] = 0  # amax 0: scale 1
        x[2, :] = x[2, :].clamp(-7.9, 7.9)
        x[2, 0] = 127.0 / 16
        x[2, 1:5] = torch.tensor([2.5, -0.5, 5.5, -1.5], dtype=F64).to(DT[dtype]) / 16
        x32 = x.float()
        scale = amax_scale(x32.abs().amax(1))
        full = scale[:, None].expand(shape)
        src = "scale[r] = x[r].abs().amax() / 127 ([R]; 1 for an all-zero row)"
    elif scheme == "per_block":
        br, bc = block
        nR, nC = math.ceil(shape[0] / br), math.ceil(shape[1] / bc)
        x[(nR - 1) * br:, (nC - 1) * bc:] = 0  # the last (partial) block is all zeros: scale 1
        x32 = x.float()
        pad = torch.zeros(nR * br, nC * bc, dtype=F32)
        pad[: shape[0], : shape[1]] = x32.abs()
        amax = pad.view(nR, br, nC, bc).amax((1, 3))
        scale = amax_scale(amax)
        full = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[: shape[0], : shape[1]]
        attrs["block"] = list(block)
        attrs["scale_layout"] = scale_layout
        src = (f"scale[i, j] = x[{br}i:{br}(i+1), {bc}j:{bc}(j+1)].abs().amax() / 127 (logical [{nR}, {nC}]; "
               f"the kernel returns it {scale_layout}; compared in logical order; 1 for an all-zero block)")
    if scheme == "none":
        # Values past e4m3's 448 saturate; small ones go subnormal.
        x.view(-1)[:8] = torch.tensor([448.0, 464.0, 480.0, 1000.0, -600.0, -449.0, 0.001, -3e-4]).to(DT[dtype])
        x32 = x.float()
        out = x32.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        scale = torch.ones(1, dtype=F32)
        src = ("x.float().clamp(-448, 448).to(torch.float8_e4m3fn) (round to nearest even, saturating); "
               "scale = [1.0]")
        extra = ""
    else:
        out = i8_quantize(x32, full)
        recip, f64 = check_i8_numpy(name, x32, full.contiguous(), out)
        src += ("; out = torch.round(x.float() / scale) (half to even, one float32 division) "
                "clamped to [-127, 127], int8; scale float32 = amax / 127 in float32")
        extra = f" [{recip} element(s) would differ with x * (1/scale), {f64} with a float64 division]"
        if VERBOSE:
            print(f"  {name}: {recip} near-tie(s) vs reciprocal multiply, {f64} vs float64 division", file=sys.stderr)
    tensors = {"x": x, "expected": out, "expected_scale": scale.contiguous()}
    request = {"op": "quantize", "tensors": {"x": desc(x, dtype)}, "attrs": attrs}
    return name, tensors, request, "norms", src + extra


@case
def _():
    return quantize("quantize_per_tensor_i8_f32_ties", "f32", (9, 70), "per_tensor")


@case
def _():
    return quantize("quantize_per_channel_i8_bf16", "bf16", (11, 96), "per_channel")


@case
def _():
    return quantize("quantize_per_block_128x128_column_major_i8_f16", "f16", (130, 260), "per_block",
                    block=(128, 128), scale_layout="column_major")


@case
def _():
    return quantize("quantize_none_fp8_e4m3_saturating_f32", "f32", (6, 40), "none", target="fp8_e4m3")


@case
def _():
    return quantize("quantize_none_fp8_e4m3_saturating_bf16", "bf16", (5, 33), "none", target="fp8_e4m3")


def rand_i8(shape):
    return torch.randint(-127, 128, shape, dtype=torch.int8)


def dequantize(name, shape, scheme, block=None, out_dtype=None):
    seed(name)
    x = rand_i8(shape)
    attrs = {"scheme": scheme}
    if scheme == "per_channel":
        scale = (torch.rand(shape[0], dtype=F64) * 0.02 + 0.001).to(F32)
        full = scale.to(F64)[:, None]
        src = "x.to(float64) * scale[:, None]"
    else:
        br, bc = block
        nR, nC = math.ceil(shape[0] / br), math.ceil(shape[1] / bc)
        scale = (torch.rand(nR, nC, dtype=F64) * 0.02 + 0.001).to(F32)
        full = scale.to(F64).repeat_interleave(br, 0).repeat_interleave(bc, 1)[: shape[0], : shape[1]]
        attrs["block"] = list(block)
        attrs["scale_layout"] = "row_major"
        src = f"x.to(float64) * scale[i // {br}, j // {bc}] (scale [{nR}, {nC}] row-major)"
    if out_dtype:
        attrs["out_dtype"] = out_dtype
    od = out_dtype or "f32"
    out = (x.to(F64) * full).to(DT[od])
    tensors = {"x": x, "scale": scale, "expected": out}
    request = {"op": "dequantize", "tensors": {"x": desc(x, "i8"), "scale": desc(scale, "f32")}, "attrs": attrs}
    return name, tensors, request, "norms", src + f", cast to {od} (exact: one rounding)"


@case
def _():
    return dequantize("dequantize_per_channel_i8_f32", (33, 70), "per_channel")


@case
def _():
    return dequantize("dequantize_per_block_128x128_row_major_i8_f32", (130, 260), "per_block", block=(128, 128),
                      out_dtype="f32")


def dequantize_w4(name, fmt, N, K, group, out_dtype=None):
    """dequantize of a packed 4-bit weight (nf4 / mxfp4 / nvfp4) quantized by tools/quant4.py
    (the formats' public definitions): `expected` is each code's value times its block scale
    (and nvfp4's global scale) in float64, cast once to out_dtype."""
    seed(name)
    w = torch.randn(N, K, dtype=F64) * (1.0 / math.sqrt(K))
    q, stored, scale64 = quant4.quantize(fmt, w, group)
    packed = quant4.pack(q, high_first=(fmt == "nf4"))
    od = out_dtype or "f32"
    tensors = {"x": packed, "scale": stored["scales"]}
    req_t = {"x": desc(packed, "i8"), "scale": desc(stored["scales"], SCALE_DESC[fmt])}
    if "global_scale" in stored:
        tensors["global_scale"] = stored["global_scale"]
        req_t["global_scale"] = desc(stored["global_scale"], "f32")
    tensors["expected"] = quant4.dequantize64(fmt, q, scale64).to(DT[od])
    check_emulation(name, "norms", tensors, {"expected": quant4.dequantize32(fmt, q, stored, group).to(DT[od])},
                    "float32")
    attrs = {"scheme": "per_block", "block": [1, group], "format": fmt}
    if out_dtype:
        attrs["out_dtype"] = out_dtype
    request = {"op": "dequantize", "tensors": req_t, "attrs": attrs}
    order = "high nibble first (bitsandbytes)" if fmt == "nf4" else "low nibble first"
    src = (f"tools/quant4.py quantize('{fmt}', w, {group}) of w ~ N(0, 1/K); codes packed {order}; "
           f"w = code value * block scale" + (" * global_scale" if fmt == "nvfp4" else "")
           + f" in float64, cast to {od}")
    return name, tensors, request, "norms", src


@case
def _():
    return dequantize_w4("dequantize_nf4_b64_f32_n6_k128", "nf4", 6, 128, 64)


@case
def _():
    return dequantize_w4("dequantize_mxfp4_b32_bf16_n5_k96", "mxfp4", 5, 96, 32, out_dtype="bf16")


@case
def _():
    return dequantize_w4("dequantize_nvfp4_b16_f16_n4_k64", "nvfp4", 4, 64, 16, out_dtype="f16")


# ------------------------------------------------------------------------- quantized linear


def linear_w8a8(name, M, K, N, per_row=True, bias=True, out_dtype=None):
    seed(name)
    x, w = rand_i8((M, K)), rand_i8((N, K))
    xs = (torch.rand(M if per_row else 1, dtype=F64) * 0.02 + 0.002).to(F32)
    ws = (torch.rand(N if per_row else 1, dtype=F64) * 0.002 + 0.0002).to(F32)
    acc = x.to(torch.int64) @ w.to(torch.int64).T  # exact
    assert acc.abs().max() < 2 ** 31
    out = acc.to(F64) * xs.to(F64)[:, None] * ws.to(F64)[None, :]
    emu = acc.to(F32) * xs[:, None] * ws[None, :]
    tensors = {"x": x, "x_scale": xs, "weight": w, "w_scale": ws}
    req_t = {"x": desc(x, "i8"), "x_scale": desc(xs, "f32"), "weight": desc(w, "i8"), "w_scale": desc(ws, "f32")}
    if bias:
        b = (torch.randn(N, dtype=F64) * 0.5).to(F32)
        tensors["bias"] = b
        req_t["bias"] = desc(b, "f32")
        out, emu = out + b.to(F64), emu + b
    od = out_dtype or "f32"
    tensors["expected"] = out.to(DT[od])
    check_emulation(name, "gemm", tensors, {"expected": emu.to(DT[od])}, "f32")
    attrs = {} if out_dtype is None else {"out_dtype": out_dtype}
    request = {"op": "linear_w8a8", "tensors": req_t, "attrs": attrs}
    src = ("acc = x.to(int64) @ weight.to(int64).T (exact, fits int32); out = acc * x_scale[:, None] * "
           "w_scale[None, :]" + (" + bias" if bias else "") + f" in float64, cast to {od}")
    return name, tensors, request, "gemm", src


@case
def _():
    return linear_w8a8("linear_w8a8_m17_k256_n33_per_token_channel_bias", 17, 256, 33)


@case
def _():
    return linear_w8a8("linear_w8a8_m3_k64_n16_scalar_scales_bf16", 3, 64, 16, per_row=False, bias=False,
                       out_dtype="bf16")


def linear_int4(name, dtype, M, K, N, group, zeros=False, bias=False, qdtype="f32"):
    seed(name)
    x, x64 = rnd((M, K), dtype)
    q = torch.randint(0, 16, (N, K))
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)  # low nibble = even k
    G = K // group
    scales = (torch.rand(N, G, dtype=F64) * 0.004 + 0.003).to(DT[qdtype])  # outputs ~0.5
    tensors = {"x": x, "weight": packed, "scales": scales}
    req_t = {"x": desc(x, dtype), "weight": desc(packed, "i8"), "scales": desc(scales, qdtype)}
    if zeros:
        z = torch.randint(0, 16, (N, G)).to(DT[qdtype])
        tensors["zeros"] = z
        req_t["zeros"] = desc(z, qdtype)
    else:
        z = torch.full((N, G), 8.0, dtype=F64)
    rep = lambda t: t.to(F64).repeat_interleave(group, 1)  # noqa: E731
    w64 = (q.to(F64) - rep(z)) * rep(scales)
    w32 = ((q.to(F64) - rep(z)) * rep(scales)).to(F32)  # (q - z) exact; one float32 rounding
    out = x64 @ w64.T
    emus = {label: mm(x, w32.T) for label, mm in MATMULS.items()}
    if bias:
        b, b64 = rnd((N,), dtype, 0.5)
        tensors["bias"] = b
        req_t["bias"] = desc(b, dtype)
        out = out + b64
        emus = {label: e + b.float() for label, e in emus.items()}
    tensors["expected"] = out.to(DT[dtype])
    for label, emu in emus.items():
        check_emulation(name, "gemm", tensors, {"expected": emu.to(DT[dtype])}, label)
    request = {"op": "linear_int4", "tensors": req_t, "attrs": {"group_size": group}}
    src = (f"q[n, k] = nibble of weight (byte k // 2, low nibble for even k); w = (q - "
           + ("zeros" if zeros else "8") + f"[n, k // {group}]) * scales[n, k // {group}]; out = x @ w.T"
           + (" + bias" if bias else "") + " in float64, cast to x's dtype")
    return name, tensors, request, "gemm", src


@case
def _():
    return linear_int4("linear_int4_g32_zeros_f32_m5_k256_n24", "f32", 5, 256, 24, 32, zeros=True)


@case
def _():
    return linear_int4("linear_int4_g128_bf16_m1_k256_n40_bias", "bf16", 1, 256, 40, 128, bias=True)


@case
def _():
    return linear_int4("linear_int4_g32_f32_m17_k128_n16", "f32", 17, 128, 16, 32)


@case
def _():
    return linear_int4("linear_int4_g128_zeros_f16_scales_f16_m3_k384_n20", "f16", 3, 384, 20, 128, zeros=True,
                       qdtype="f16")


SCALE_DESC = {"nf4": "f32", "mxfp4": "i8", "nvfp4": "fp8_e4m3"}


def linear_w4(name, fmt, dtype, M, K, N, group, bias=False, identity=False):
    """linear_int4 with nf4 / mxfp4 / nvfp4 weights quantized by tools/quant4.py (the public
    definitions); `identity` makes x the K x K identity, so `expected` is the dequantized
    weight transposed."""
    seed(name)
    if identity:
        x = torch.eye(K, dtype=F64).to(DT[dtype])
        x64 = x.to(F64)
    else:
        x, x64 = rnd((M, K), dtype)
    w = torch.randn(N, K, dtype=F64) * (1.0 / math.sqrt(K))
    q, stored, scale64 = quant4.quantize(fmt, w, group)
    packed = quant4.pack(q, high_first=(fmt == "nf4"))
    w64 = quant4.dequantize64(fmt, q, scale64)
    w32 = quant4.dequantize32(fmt, q, stored, group)
    tensors = {"x": x, "weight": packed, **stored}
    req_t = {"x": desc(x, dtype), "weight": desc(packed, "i8"), "scales": desc(stored["scales"], SCALE_DESC[fmt])}
    if "global_scale" in stored:
        req_t["global_scale"] = desc(stored["global_scale"], "f32")
    out = x64 @ w64.T
    emus = {label: mm(x, w32.T) for label, mm in MATMULS.items()}
    if bias:
        b, b64 = rnd((N,), dtype, 0.5)
        tensors["bias"] = b
        req_t["bias"] = desc(b, dtype)
        out = out + b64
        emus = {label: e + b.float() for label, e in emus.items()}
    tensors["expected"] = out.to(DT[dtype])
    for label, emu in emus.items():
        check_emulation(name, "gemm", tensors, {"expected": emu.to(DT[dtype])}, label)
    request = {"op": "linear_int4", "tensors": req_t, "attrs": {"group_size": group, "format": fmt}}
    order = "high nibble first (bitsandbytes)" if fmt == "nf4" else "low nibble first"
    src = (f"tools/quant4.py quantize('{fmt}', w, {group}) of w ~ N(0, 1/K); codes packed {order}; "
           f"w = code value * block scale" + (" * global_scale" if fmt == "nvfp4" else "")
           + "; out = x @ w.T" + (" + bias" if bias else "") + " in float64, cast to x's dtype")
    return name, tensors, request, "gemm", src


@case
def _():
    return linear_w4("linear_int4_nf4_g64_f32_m3_k128_n16_bias", "nf4", "f32", 3, 128, 16, 64, bias=True)


@case
def _():
    return linear_w4("linear_int4_nf4_g64_bf16_m1_k256_n24", "nf4", "bf16", 1, 256, 24, 64)


@case
def _():
    return linear_w4("linear_int4_nf4_g32_f32_identity_k32_n8", "nf4", "f32", 32, 32, 8, 32, identity=True)


@case
def _():
    return linear_w4("linear_int4_mxfp4_g32_f32_m5_k128_n16", "mxfp4", "f32", 5, 128, 16, 32)


@case
def _():
    return linear_w4("linear_int4_mxfp4_g32_f16_m1_k64_n8_bias", "mxfp4", "f16", 1, 64, 8, 32, bias=True)


@case
def _():
    return linear_w4("linear_int4_mxfp4_g32_f32_identity_k32_n8", "mxfp4", "f32", 32, 32, 8, 32, identity=True)


@case
def _():
    return linear_w4("linear_int4_nvfp4_g16_f32_m4_k64_n16_bias", "nvfp4", "f32", 4, 64, 16, 16, bias=True)


@case
def _():
    return linear_w4("linear_int4_nvfp4_g16_bf16_m2_k128_n8", "nvfp4", "bf16", 2, 128, 8, 16)


@case
def _():
    return linear_w4("linear_int4_nvfp4_g16_f32_identity_k32_n8", "nvfp4", "f32", 32, 32, 8, 16, identity=True)



# ------------------------------------------------------------------------------ patch embedding


def patch_embed(name, dtype, B, C, H, W, P, D, bias=True):
    """Hugging Face ViTPatchEmbeddings: projection(pixel_values).flatten(2).transpose(1, 2)."""
    seed(name)
    x, x64 = rnd((B, C, H, W), dtype)
    w, w64 = rnd((D, C, P, P), dtype, 0.5 / math.sqrt(C * P * P))  # outputs ~0.5, as linear's
    tensors = {"image": x, "weight": w}
    b64 = None
    if bias:
        b, b64 = rnd((D,), dtype, 0.5)
        tensors["bias"] = b
    out = F.conv2d(x64, w64, b64, stride=P).flatten(2).transpose(1, 2)
    # The float32 emulations run the convolution as the GEMM it is: patches [B, N, C*P*P]
    # against the flattened weight.
    cols = F.unfold(x.float(), kernel_size=P, stride=P).transpose(1, 2)
    wk = w.float().reshape(D, C * P * P).T
    emus = {label: mm(cols, wk) for label, mm in MATMULS.items()}
    if bias:
        emus = {label: e + b.float() for label, e in emus.items()}
    tensors["expected"] = out.to(DT[dtype])
    for label, e in emus.items():
        check_emulation(name, "gemm", tensors, {"expected": e.to(DT[dtype])}, label)
    req_t = {"image": desc(x, dtype, "NCHW"), "weight": desc(w, dtype)}
    if bias:
        req_t["bias"] = desc(tensors["bias"], dtype)
    request = {"op": "patch_embed", "tensors": req_t, "attrs": {"patch": P}}
    src = (f"torch.nn.functional.conv2d(image, weight{', bias' if bias else ''}, stride={P}).flatten(2).transpose(1, 2) "
           "in float64 (image NCHW), cast to the image's dtype")
    return name, tensors, request, "gemm", src


@case
def _():
    return patch_embed("patch_embed_nchw_f32_b2_c3_h16_w16_p8_d16_bias", "f32", 2, 3, 16, 16, 8, 16)


# ----------------------------------------------------------------------------------- main

ST_DTYPE = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3",
    torch.int32: "I32", torch.int64: "I64", torch.bool: "BOOL", torch.int8: "I8",
}


def save_deterministic(tensors, path, metadata):
    """safetensors bytes with a sorted header (safetensors' own writer orders the metadata
    map arbitrarily, so its files differ from run to run)."""
    header = {"__metadata__": dict(sorted(metadata.items()))}
    blobs = []
    at = 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        b = (t.to(torch.uint8) if t.dtype == torch.bool else t).view(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": ST_DTYPE[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    data = len(h).to_bytes(8, "little") + h + b"".join(blobs)
    path.write_bytes(data)
    back = load_file(str(path))
    assert sorted(back) == sorted(tensors), path
    for n, t in tensors.items():
        assert back[n].dtype == t.dtype and torch.equal(back[n].view(torch.uint8), t.contiguous().view(torch.uint8)), (path, n)



def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests" / "fixtures"))
    ap.add_argument("--verbose", action="store_true", help="print how close the float32 emulations come to the tolerance")
    a = ap.parse_args()
    global VERBOSE
    VERBOSE = a.verbose
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    names = set()
    total = 0
    for fn in CASES:
        name, tensors, request, category, source = fn()
        assert name not in names, name
        names.add(name)
        for t in tensors.values():
            assert not (t.is_floating_point() and torch.isnan(t.to(F64)).any()), name
        meta = {"request": json.dumps(request, sort_keys=True), "op_category": category, "source": source}
        path = out / f"{name}.safetensors"
        save_deterministic(tensors, path, meta)
        total += path.stat().st_size
        print(f"{path.name:60s} {path.stat().st_size:8d}")
    stale = [p.name for p in out.glob("*.safetensors") if p.stem not in names]
    for p in stale:
        print(f"warning: {p} is not generated by this script", file=sys.stderr)
    print(f"{len(names)} fixtures, {total} bytes")


if __name__ == "__main__":
    main()
