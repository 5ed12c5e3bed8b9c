#!/usr/bin/env python3
"""Generates LayerZero's PyTorch golden fixtures (tests/fixtures/*.safetensors).

Each file holds the op's input tensors under their request role names (q, k, v, mask,
cu_seqlens_q, k_cache, block_table, positions, cos, ...), the expected output `expected`
(and `expected_k` for RoPE with k), and safetensors metadata:
  request      the request JSON (public form, schemas/request.schema.json)
  op_category  attention | rope (the row of the tolerance table, spec 002 section 5)
  source       the torch expression the expected output comes from

Inputs are stored in the request dtype; the expected output is computed in float64 from the
dtype-rounded inputs and cast to the request (q) dtype. The semantics followed are those of
layerzero/src/exec/args.rs and layerzero/src/exec/semantics.rs. A query row with no visible
key yields zeros (LayerZero's definition; torch gives NaN there).

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


@case
def _():
    return rope("rope_bshd_f32_cos_sin_tables", "f32", 2, 7, 2, 32, positions=("1d", "i32", 48),
                tables=(48, "f32"))


@case
def _():
    return rope("rope_bshd_f16_cos_sin_tables_interleaved_partial", "f16", 1, 5, 2, 64,
                positions=("2d", "i64", 32), tables=(32, "f32"),
                attrs={"style": "interleaved", "rotary_dim": 32})


# ----------------------------------------------------------------------------------- main

ST_DTYPE = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3",
    torch.int32: "I32", torch.int64: "I64", torch.bool: "BOOL",
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
    a = ap.parse_args()
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
