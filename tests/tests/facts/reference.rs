//! The reference kernels' facts (`capabilities/cpu_reference.json`), each held to the line of
//! our code that implements or enforces it.

use layerzero::model::attrs::{
    Activation, GegluAttrs, GeluApproximate, GeluAttrs, Int4Attrs, MlpAttrs, PatchEmbedAttrs, QuantAttrs, QuantScheme,
    RopeScaling, ScaleLayout,
};

use super::*;

const MOD: &str = "layerzero/src/backend/cpu_reference/mod.rs";
const ATTENTION: &str = "layerzero/src/backend/cpu_reference/attention.rs";
const PAGED: &str = "layerzero/src/backend/cpu_reference/paged.rs";
const ROPE: &str = "layerzero/src/backend/cpu_reference/rope.rs";
const NORM: &str = "layerzero/src/backend/cpu_reference/norm.rs";
const LINEAR: &str = "layerzero/src/backend/cpu_reference/linear.rs";
const ACTIVATION: &str = "layerzero/src/backend/cpu_reference/activation.rs";
const EMBEDDING: &str = "layerzero/src/backend/cpu_reference/embedding.rs";
const SAMPLE: &str = "layerzero/src/backend/cpu_reference/sample.rs";
const MOE: &str = "layerzero/src/backend/cpu_reference/moe.rs";
const QUANT: &str = "layerzero/src/backend/cpu_reference/quant.rs";
const MLP: &str = "layerzero/src/backend/cpu_reference/mlp.rs";
const PATCH: &str = "layerzero/src/backend/cpu_reference/patch.rs";
/// Where the attention kernels' visible keys are decided (causal alignment, window): the
/// reference kernels call it for every query row.
const SEMANTICS: &str = "layerzero/src/exec/semantics.rs";

/// A small bf16 attention problem with head dim `d`.
fn att(d: u64) -> Request {
    bf16(2, 64, 64, 8, 8, d)
}

/// `req` with its tensors `names` in `dtype`.
fn retyped(req: Request, names: &[&str], dtype: DType) -> Request {
    let mut out = req.clone();
    for name in names {
        let mut t: TensorDesc = req.get(name).cloned().unwrap_or_else(|| panic!("no {name}"));
        t.dtype = dtype;
        out = out.tensor(name, t);
    }
    out
}

/// `req` with tensor `name` read every other element along its last dim (`stride(-1) == 2`).
fn every_other(req: Request, name: &str) -> Request {
    let t: TensorDesc = req.get(name).cloned().unwrap_or_else(|| panic!("no {name}"));
    let mut strides = vec![2u64; t.shape.len()];
    for d in (0..t.shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * t.shape[d + 1];
    }
    let t = t.with_strides(strides);
    req.tensor(name, t)
}

/// `req` (BSHD q, k, v) held head-major: each tensor [b, h, s, d] tagged BHSD.
fn bhsd(req: Request) -> Request {
    let mut out = req.clone();
    for name in ["q", "k", "v"] {
        let t: TensorDesc = req.get(name).cloned().unwrap_or_else(|| panic!("no {name}"));
        let [b, s, h, d] = [t.shape[0], t.shape[1], t.shape[2], t.shape[3]];
        out = out.tensor(name, TensorDesc::new(t.dtype, [b, h, s, d]).with_layout(Layout::Bhsd));
    }
    out
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
fn paged_chunk(a: AttentionAttrs) -> Request {
    with(queries_on_pages(4, 16, None, 1), a)
}

/// A bf16 layer norm over `[64, 4096]` with weight and bias.
fn layer_norm() -> Request {
    Request::new(Op::LayerNorm)
        .attrs(Attrs::Norm(NormAttrs::default()))
        .tensor("x", TensorDesc::new(DType::BF16, [64, 4096]))
        .tensor("weight", TensorDesc::new(DType::BF16, [4096]))
        .tensor("bias", TensorDesc::new(DType::BF16, [4096]))
}

/// A bf16 gated activation of `op` with `attrs`: `x` [64, 8192] split, or `gate`/`up`
/// [64, 4096].
fn gated(op: Op, attrs: Attrs, split: bool) -> Request {
    let req = Request::new(op).attrs(attrs);
    if split {
        req.tensor("x", TensorDesc::new(DType::BF16, [64, 8192]))
    } else {
        req.tensor("gate", TensorDesc::new(DType::BF16, [64, 4096]))
            .tensor("up", TensorDesc::new(DType::BF16, [64, 4096]))
    }
}

fn swiglu(split: bool) -> Request {
    gated(Op::Swiglu, Attrs::Swiglu(SwigluAttrs { split }), split)
}

fn geglu(split: bool, approximate: GeluApproximate) -> Request {
    gated(Op::Geglu, Attrs::Geglu(GegluAttrs { split, approximate }), split)
}

/// A bf16 `[64, 4096]` element-wise op (`gelu` with `attrs`, or `silu`).
fn unary(op: Op, attrs: Attrs) -> Request {
    Request::new(op).attrs(attrs).tensor("x", TensorDesc::new(DType::BF16, [64, 4096]))
}

fn gelu(approximate: GeluApproximate) -> Request {
    unary(Op::Gelu, Attrs::Gelu(GeluAttrs { approximate }))
}

/// 64 i32 ids into a bf16 `[32000, 4096]` table.
fn embedding() -> Request {
    Request::new(Op::Embedding)
        .tensor("ids", TensorDesc::new(DType::I32, [4, 16]))
        .tensor("table", TensorDesc::new(DType::BF16, [32000, 4096]))
}

/// bf16 logits `[rows, cols]` for `op` (`sample`, `moe_route`).
fn logits(op: Op, rows: u64, cols: u64) -> Request {
    Request::new(op).tensor("logits", TensorDesc::new(DType::BF16, [rows, cols]))
}

fn quant_attrs(scheme: QuantScheme, block: Option<[u64; 2]>, layout: Option<ScaleLayout>) -> QuantAttrs {
    QuantAttrs { scheme, block, scale_layout: layout, target: None, out_dtype: None }
}

/// Quantizes a bf16 `[256, 512]` x to `target` under `a`.
fn quantize(a: QuantAttrs, target: Option<DType>) -> Request {
    Request::new(Op::Quantize)
        .attrs(Attrs::Quant(QuantAttrs { target, ..a }))
        .tensor("x", TensorDesc::new(DType::BF16, [256, 512]))
}

/// Dequantizes a `[256, 512]` x of `dtype` with `scale` under `a`.
fn dequantize(a: QuantAttrs, dtype: DType, scale: TensorDesc) -> Request {
    Request::new(Op::Dequantize)
        .attrs(Attrs::Quant(a))
        .tensor("x", TensorDesc::new(dtype, [256, 512]))
        .tensor("scale", scale)
}

fn f32_of(shape: &[u64]) -> TensorDesc {
    TensorDesc::new(DType::F32, shape.to_vec())
}

/// An i8 `[4, 64] x [32, 64]` linear with per-row scales; `weight` as given.
fn w8a8(weight: TensorDesc) -> Request {
    Request::new(Op::LinearW8a8)
        .tensor("x", TensorDesc::new(DType::I8, [4, 64]))
        .tensor("x_scale", f32_of(&[4]))
        .tensor("weight", weight)
        .tensor("w_scale", f32_of(&[32]))
}

/// A bf16 `[4, 256]` x against int4 weights `[32, 256]` packed in i8 `[32, 128]`, groups of 64.
fn int4() -> Request {
    Request::new(Op::LinearInt4)
        .attrs(Attrs::Int4(Int4Attrs { group_size: 64 }))
        .tensor("x", TensorDesc::new(DType::BF16, [4, 256]))
        .tensor("weight", TensorDesc::new(DType::I8, [32, 128]))
        .tensor("scales", f32_of(&[32, 4]))
}

/// A bf16 gated MLP (`mlp`: [16, 64] x, intermediate 128) or its expert form (`moe_experts`:
/// 4 experts, top 2) with `act`.
fn mlp(op: Op, act: Activation) -> Request {
    let t = |s: &[u64]| TensorDesc::new(DType::BF16, s.to_vec());
    let r = Request::new(op).attrs(Attrs::Mlp(MlpAttrs { activation: act })).tensor("x", t(&[16, 64]));
    match op {
        Op::MoeExperts => r
            .tensor("experts", TensorDesc::new(DType::I32, [16, 2]))
            .tensor("weights", f32_of(&[16, 2]))
            .tensor("w_gate", t(&[4, 128, 64]))
            .tensor("w_up", t(&[4, 128, 64]))
            .tensor("w_down", t(&[4, 64, 128])),
        _ => r.tensor("w_gate", t(&[128, 64])).tensor("w_up", t(&[128, 64])).tensor("w_down", t(&[64, 128])),
    }
}

/// ViT-Base's patch embedding of one bf16 224x224 RGB image: `image` as given.
fn patch_embed(image: TensorDesc) -> Request {
    Request::new(Op::PatchEmbed)
        .attrs(Attrs::PatchEmbed(PatchEmbedAttrs { patch: 16 }))
        .tensor("image", image)
        .tensor("weight", TensorDesc::new(DType::BF16, [768, 3, 16, 16]))
}

fn nchw() -> TensorDesc {
    TensorDesc::new(DType::BF16, [1, 3, 224, 224])
}

pub(super) fn facts() -> Vec<Fact> {
    let mut rows = attention();
    rows.extend(paged_attention());
    rows.extend(row_ops());
    rows.extend(matrix_ops());
    rows
}

fn attention() -> Vec<Fact> {
    const K: &str = "cpu_reference.attention.naive";
    let fp8 = DType::Fp8E4M3;
    vec![
        fact(K, "dtypes", here(ATTENTION, "expect_float(name, t)?;"), "spr", att(64))
            .rejects(retyped(att(64), &["q", "k", "v"], fp8), "DTYPE_UNSUPPORTED"),
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
        fact(K, "layouts", here(MOD, "Layout::Bhsd => true,"), "spr", bhsd(att(64))),
        fact(K, "strides", here(MOD, "self.t.at(&[b, h, s, d])"), "spr", strided_v(att(64))),
    ]
}

fn paged_attention() -> Vec<Fact> {
    const K: &str = "cpu_reference.paged_attention.naive";
    let (bf, nhd, i32) = (DType::BF16, Layout::Nhd, DType::I32);
    vec![
        fact(K, "dtypes", here(PAGED, "expect_float(\"q\", &args.q)?;"), "spr", paged_of(128, bf, nhd, i32))
            .rejects(paged(DType::Fp8E4M3, DType::Fp8E4M3, 4, 1, 32, 8, 128, 16, nhd, i32), "DTYPE_UNSUPPORTED"),
        // Conservative, as the dense kernel's: the dot product loops over any head dim.
        fact(K, "head_dim", here(PAGED, "(0..q.d).map(|d| q.at(b, i, h, d)"), "spr", paged_of(512, bf, nhd, i32))
            .rejects(paged_of(520, bf, nhd, i32), "HEAD_DIM_TOO_LARGE"),
        fact(K, "gqa", here(PAGED, "let group = q.h / kc.heads;"), "spr", paged_of(128, bf, nhd, i32)),
        fact(K, "causal", here(SEMANTICS, "CausalAlignment::TopLeft => 0,"), "spr", {
            paged_chunk(causal_on(CausalAlignment::TopLeft))
        }),
        fact(K, "causal", here(PAGED, "let (lo, hi) = visible_keys(i, q.s, ctx, a);"), "spr", {
            paged_chunk(causal_on(CausalAlignment::BottomRight))
        }),
        fact(K, "window", here(SEMANTICS, "Some(w) => (diag - w as i64).clamp(0, seq_k as i64),"), "spr", {
            paged_chunk(AttentionAttrs { causal: true, window_left: Some(8), ..AttentionAttrs::default() })
        }),
        fact(K, "softcap", here(PAGED, "(j, score(dot, scale, a, slopes[h], i, j, q.s, ctx))"), "spr", {
            attrs(pages(16, None, 1), softcap(0.0))
        }),
        fact(K, "alibi", here(PAGED, "let slopes = if a.alibi { alibi_slopes(q.h) }"), "spr", {
            with(pages(16, None, 1), AttentionAttrs { alibi: true, ..AttentionAttrs::default() })
        }),
        fact(K, "custom_scale", here(PAGED, "let scale = softmax_scale(a, q.d);"), "spr", {
            with(pages(16, None, 1), AttentionAttrs { scale: Some(0.05), ..AttentionAttrs::default() })
        }),
        fact(K, "layouts", here(PAGED, "paged attention takes BSHD queries"), "spr", pages(16, None, 1)),
        fact(K, "strides", here(PAGED, "self.t.at(&[page, slot, h, d])"), "spr", pages(16, Some(16 * 8 * 256), 2)),
        fact(K, "block_table_dtypes", here(MOD, "DType::I32 | DType::I64 => Ok(t.to_i64_vec()),"), "spr", {
            paged_of(128, bf, nhd, DType::I64)
        }),
        fact(K, "kv_cache_layouts", here(PAGED, "Some(Layout::Hnd) => true,"), "spr", {
            paged_of(128, bf, Layout::Hnd, i32)
        }),
        fact(K, "kv_cache_dtypes", here(PAGED, "raw * self.scale[h]"), "spr", paged_of(128, DType::Fp8E5M2, nhd, i32)),
    ]
}

fn row_ops() -> Vec<Fact> {
    let fp8 = DType::Fp8E4M3;
    let rms = || rows_of(Op::RmsNorm, Attrs::Norm(NormAttrs::default()), 4096);
    let residual = |req: Request| req.tensor("residual", TensorDesc::new(DType::BF16, [64, 4096]));
    let rope = |style| rope_of(style);
    vec![
        // rope
        fact("cpu_reference.rope.naive", "dtypes", here(ROPE, "let result = from_f64_as(t.dtype()"), "spr", {
            rope(RopeStyle::RotateHalf)
        })
        .rejects(retyped(rope(RopeStyle::RotateHalf), &["q"], fp8), "DTYPE_UNSUPPORTED"),
        fact(
            "cpu_reference.rope.naive",
            "rope_styles",
            here(ROPE, "RopeStyle::RotateHalf => (i, i + half),"),
            "spr",
            rope(RopeStyle::RotateHalf),
        ),
        fact(
            "cpu_reference.rope.naive",
            "rope_styles",
            here(ROPE, "RopeStyle::Interleaved => (2 * i, 2 * i + 1),"),
            "spr",
            rope(RopeStyle::Interleaved),
        ),
        fact("cpu_reference.rope.naive", "rope_scaling", here(ROPE, "rope_frequencies(a, rot, seq_len);"), "spr", {
            let scaled = RopeAttrs { scaling: Some(RopeScaling::Linear { factor: 4.0 }), ..RopeAttrs::default() };
            rope(RopeStyle::RotateHalf).attrs(Attrs::Rope(scaled))
        }),
        fact("cpu_reference.rope.naive", "layouts", here(MOD, "Layout::Bhsd => true,"), "spr", {
            rope(RopeStyle::RotateHalf)
                .tensor("q", TensorDesc::new(DType::BF16, [1, 8, 16, 128]).with_layout(Layout::Bhsd))
        }),
        fact(
            "cpu_reference.rope.naive",
            "strides",
            here(ROPE, "let (x1, x2) = (x.at(b, s, h, i1), x.at(b, s, h, i2));"),
            "spr",
            every_other(rope(RopeStyle::RotateHalf), "q"),
        ),
        // rms_norm
        fact("cpu_reference.rms_norm.naive", "dtypes", here(NORM, "expect_float(\"x\", x)?;"), "spr", rms())
            .rejects(retyped(rms(), &["x", "weight"], fp8), "DTYPE_UNSUPPORTED"),
        fact(
            "cpu_reference.rms_norm.naive",
            "fused_residual",
            here(NORM, "\"residual_out\", from_f64_as(dtype, a.x.shape(), &s)"),
            "spr",
            residual(rms()),
        ),
        fact("cpu_reference.rms_norm.naive", "strides", here(NORM, "let mut s = a.x.to_f64_vec();"), "spr", {
            every_other(rms(), "x")
        }),
        // layer_norm
        fact("cpu_reference.layer_norm.naive", "dtypes", here(NORM, "expect_float(\"x\", x)?;"), "spr", layer_norm())
            .rejects(retyped(layer_norm(), &["x", "weight", "bias"], fp8), "DTYPE_UNSUPPORTED"),
        fact(
            "cpu_reference.layer_norm.naive",
            "fused_residual",
            here(NORM, "\"residual_out\", from_f64_as(dtype, a.x.shape(), &x)"),
            "spr",
            residual(layer_norm()),
        ),
        fact("cpu_reference.layer_norm.naive", "strides", here(NORM, "let mut x = a.x.to_f64_vec();"), "spr", {
            every_other(layer_norm(), "x")
        }),
        // swiglu
        fact(
            "cpu_reference.swiglu.naive",
            "dtypes",
            here(ACTIVATION, "from_f64_as(dtype, &shape, &v)"),
            "spr",
            swiglu(true),
        )
        .rejects(retyped(swiglu(true), &["x"], fp8), "DTYPE_UNSUPPORTED"),
        fact(
            "cpu_reference.swiglu.naive",
            "glu_forms",
            here(ACTIVATION, "(Some(x), _, _) if split => {"),
            "spr",
            swiglu(true),
        ),
        fact(
            "cpu_reference.swiglu.naive",
            "glu_forms",
            here(ACTIVATION, "(_, Some(gate), Some(up)) => Ok((gate.to_f64_vec()"),
            "spr",
            swiglu(false),
        ),
        fact("cpu_reference.swiglu.naive", "strides", here(ACTIVATION, "let all = x.to_f64_vec();"), "spr", {
            every_other(swiglu(true), "x")
        }),
        // geglu
        fact("cpu_reference.geglu.naive", "dtypes", here(ACTIVATION, "from_f64_as(dtype, &shape, &v)"), "spr", {
            geglu(true, GeluApproximate::None)
        })
        .rejects(retyped(geglu(true, GeluApproximate::None), &["x"], fp8), "DTYPE_UNSUPPORTED"),
        fact("cpu_reference.geglu.naive", "glu_forms", here(ACTIVATION, "(Some(x), _, _) if split => {"), "spr", {
            geglu(true, GeluApproximate::None)
        }),
        fact(
            "cpu_reference.geglu.naive",
            "glu_forms",
            here(ACTIVATION, "(_, Some(gate), Some(up)) => Ok((gate.to_f64_vec()"),
            "spr",
            geglu(false, GeluApproximate::None),
        ),
        fact(
            "cpu_reference.geglu.naive",
            "gelu_approximations",
            here(ACTIVATION, "GeluApproximate::None => gelu_erf,"),
            "spr",
            geglu(false, GeluApproximate::None),
        ),
        fact(
            "cpu_reference.geglu.naive",
            "gelu_approximations",
            here(ACTIVATION, "GeluApproximate::Tanh => gelu_tanh,"),
            "spr",
            geglu(false, GeluApproximate::Tanh),
        ),
        fact(
            "cpu_reference.geglu.naive",
            "strides",
            here(ACTIVATION, "(_, Some(gate), Some(up)) => Ok((gate.to_f64_vec()"),
            "spr",
            every_other(geglu(false, GeluApproximate::Tanh), "up"),
        ),
        // gelu
        fact("cpu_reference.gelu.naive", "dtypes", here(ACTIVATION, "from_f64_as(x.dtype(), x.shape(), &v)"), "spr", {
            gelu(GeluApproximate::None)
        })
        .rejects(retyped(gelu(GeluApproximate::None), &["x"], fp8), "DTYPE_UNSUPPORTED"),
        fact(
            "cpu_reference.gelu.naive",
            "gelu_approximations",
            here(ACTIVATION, "GeluApproximate::None => gelu_erf,"),
            "spr",
            gelu(GeluApproximate::None),
        ),
        fact(
            "cpu_reference.gelu.naive",
            "gelu_approximations",
            here(ACTIVATION, "GeluApproximate::Tanh => gelu_tanh,"),
            "spr",
            gelu(GeluApproximate::Tanh),
        ),
        fact("cpu_reference.gelu.naive", "strides", here(ACTIVATION, "x.to_f64_vec().into_iter().map(act)"), "spr", {
            every_other(gelu(GeluApproximate::Tanh), "x")
        }),
        // silu
        fact("cpu_reference.silu.naive", "dtypes", here(ACTIVATION, "from_f64_as(x.dtype(), x.shape(), &v)"), "spr", {
            unary(Op::Silu, Attrs::None(Default::default()))
        })
        .rejects(retyped(unary(Op::Silu, Attrs::None(Default::default())), &["x"], fp8), "DTYPE_UNSUPPORTED"),
        fact("cpu_reference.silu.naive", "strides", here(ACTIVATION, "x.to_f64_vec().into_iter().map(act)"), "spr", {
            every_other(unary(Op::Silu, Attrs::None(Default::default())), "x")
        }),
        // embedding
        fact(
            "cpu_reference.embedding.naive",
            "dtypes",
            here(EMBEDDING, "expect_float(\"table\", table)?;"),
            "spr",
            embedding(),
        )
        .rejects(retyped(embedding(), &["table"], fp8), "DTYPE_UNSUPPORTED"),
        fact("cpu_reference.embedding.naive", "strides", here(EMBEDDING, "table.at(&[row, c])"), "spr", {
            every_other(embedding(), "table")
        }),
        // sample
        fact("cpu_reference.sample.naive", "dtypes", here(SAMPLE, "expect_float(\"logits\", logits)?;"), "spr", {
            logits(Op::Sample, 8, 32000)
        })
        .rejects(retyped(logits(Op::Sample, 8, 32000), &["logits"], fp8), "DTYPE_UNSUPPORTED"),
        fact("cpu_reference.sample.naive", "strides", here(SAMPLE, "let values = logits.to_f64_vec();"), "spr", {
            every_other(logits(Op::Sample, 8, 32000), "logits")
        }),
        // moe_route
        fact("cpu_reference.moe_route.naive", "dtypes", here(MOE, "expect_float(\"logits\", logits)?;"), "spr", {
            logits(Op::MoeRoute, 64, 8)
        })
        .rejects(retyped(logits(Op::MoeRoute, 64, 8), &["logits"], fp8), "DTYPE_UNSUPPORTED"),
        fact("cpu_reference.moe_route.naive", "strides", here(MOE, "let values = logits.to_f64_vec();"), "spr", {
            every_other(logits(Op::MoeRoute, 64, 8), "logits")
        }),
        // Its expert ids are i32: more experts than i32 holds are refused (a limit the file
        // did not declare: added).
        fact("cpu_reference.moe_route.naive", "hidden_size", here(MOE, "if i32::try_from(e).is_err() {"), "spr", {
            logits(Op::MoeRoute, 1, i32::MAX as u64)
        })
        .rejects(logits(Op::MoeRoute, 1, i32::MAX as u64 + 1), "HIDDEN_SIZE_UNSUPPORTED"),
    ]
}

fn matrix_ops() -> Vec<Fact> {
    let fp8 = DType::Fp8E4M3;
    let block = Some([128, 128]);
    let w8 = || TensorDesc::new(DType::I8, [32, 64]);
    let mlp_weights = ["x", "w_gate", "w_up", "w_down"];
    vec![
        // linear
        fact(
            "cpu_reference.linear.naive",
            "dtypes",
            here(LINEAR, "DType::F32 | DType::F16 | DType::BF16 => Ok(()),"),
            "spr",
            linear_of(DType::BF16),
        )
        .rejects(linear_of(fp8), "DTYPE_UNSUPPORTED"),
        fact("cpu_reference.linear.naive", "weight_layouts", here(LINEAR, "WeightLayout::Nt => matmul_f64("), "spr", {
            linear_of(DType::BF16)
        }),
        fact("cpu_reference.linear.naive", "weight_layouts", here(LINEAR, "WeightLayout::Nn => matmul_f64("), "spr", {
            linear_of(DType::BF16).tensor("weight", TensorDesc::new(DType::BF16, [4096, 4096]).with_layout(Layout::Nn))
        }),
        fact("cpu_reference.linear.naive", "strides", here(LINEAR, "let w = a.weight.to_f64_vec();"), "spr", {
            every_other(linear_of(DType::BF16), "weight")
        }),
        // quantize
        fact(
            "cpu_reference.quantize.naive",
            "dtypes",
            here(QUANT, "if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {"),
            "spr",
            quantize(quant_attrs(QuantScheme::PerTensor, None, None), None),
        ),
        fact(
            "cpu_reference.quantize.naive",
            "quant_schemes",
            here(QUANT, "let none = grid.scheme == QuantScheme::None;"),
            "spr",
            quantize(quant_attrs(QuantScheme::None, None, None), Some(DType::Fp8E4M3)),
        ),
        fact(
            "cpu_reference.quantize.naive",
            "quant_schemes",
            here(QUANT, "let scales: Vec<f32> = amax.iter()"),
            "spr",
            quantize(quant_attrs(QuantScheme::PerChannel, None, None), None),
        ),
        fact(
            "cpu_reference.quantize.naive",
            "quant_schemes",
            here(QUANT, "let scale = if grid.scheme == QuantScheme::PerBlock"),
            "spr",
            quantize(quant_attrs(QuantScheme::PerBlock, block, None), None),
        ),
        fact("cpu_reference.quantize.naive", "quant_targets", here(QUANT, "Target::I8 => Storage::I8("), "spr", {
            quantize(quant_attrs(QuantScheme::PerTensor, None, None), Some(DType::I8))
        }),
        fact(
            "cpu_reference.quantize.naive",
            "quant_targets",
            here(QUANT, "Target::Fp8(Fp8::E5M2) => Storage::Fp8E5M2("),
            "spr",
            quantize(quant_attrs(QuantScheme::PerTensor, None, None), Some(DType::Fp8E5M2)),
        ),
        fact(
            "cpu_reference.quantize.naive",
            "scale_layouts",
            here(QUANT, "let column_major = a.attrs.scale_layout == Some(ScaleLayout::ColumnMajor);"),
            "spr",
            quantize(quant_attrs(QuantScheme::PerBlock, block, Some(ScaleLayout::ColumnMajor)), None),
        ),
        fact("cpu_reference.quantize.naive", "strides", here(QUANT, "let vals = x.to_f32_vec();"), "spr", {
            every_other(quantize(quant_attrs(QuantScheme::PerTensor, None, None), None), "x")
        }),
        // dequantize
        fact(
            "cpu_reference.dequantize.naive",
            "dtypes",
            here(QUANT, "Target::of(x.dtype(), \"tensor `x` dtype\")?;"),
            "spr",
            dequantize(quant_attrs(QuantScheme::PerTensor, None, None), DType::I8, f32_of(&[1])),
        ),
        fact("cpu_reference.dequantize.naive", "quant_schemes", here(QUANT, "v * scales[grid.group(i)]"), "spr", {
            dequantize(quant_attrs(QuantScheme::PerChannel, None, None), DType::I8, f32_of(&[256]))
        }),
        fact(
            "cpu_reference.dequantize.naive",
            "quant_targets",
            here(QUANT, "Target::of(x.dtype(), \"tensor `x` dtype\")?;"),
            "spr",
            dequantize(quant_attrs(QuantScheme::PerTensor, None, None), DType::Fp8E5M2, f32_of(&[1])),
        ),
        fact(
            "cpu_reference.dequantize.naive",
            "scale_layouts",
            here(QUANT, "check_scale(&a.attrs, x, &a.scale, &grid)?;"),
            "spr",
            {
                let column_major = f32_of(&[2, 4]).with_strides([1, 2]);
                dequantize(
                    quant_attrs(QuantScheme::PerBlock, block, Some(ScaleLayout::ColumnMajor)),
                    DType::I8,
                    column_major,
                )
            },
        ),
        fact("cpu_reference.dequantize.naive", "strides", here(QUANT, "let vals = x.to_f64_vec();"), "spr", {
            every_other(dequantize(quant_attrs(QuantScheme::PerTensor, None, None), DType::I8, f32_of(&[1])), "x")
        }),
        // linear_w8a8
        fact(
            "cpu_reference.linear_w8a8.naive",
            "dtypes",
            here(LINEAR, "if t.dtype() != DType::I8 {"),
            "spr",
            w8a8(w8()),
        ),
        fact("cpu_reference.linear_w8a8.naive", "strides", here(LINEAR, "let x = a.x.to_i64_vec();"), "spr", {
            every_other(w8a8(w8()), "x")
        }),
        // The kernel refuses a weight tagged other than NT (a limit the file did not declare:
        // added).
        fact(
            "cpu_reference.linear_w8a8.naive",
            "layouts",
            here(LINEAR, "if matches!(a.weight.layout(), Some(l) if l != Layout::Nt) {"),
            "spr",
            w8a8(w8().with_layout(Layout::Nt)),
        )
        .rejects(w8a8(w8().with_layout(Layout::Nn)), "LAYOUT_UNSUPPORTED"),
        // linear_int4
        fact(
            "cpu_reference.linear_int4.naive",
            "dtypes",
            here(LINEAR, "DType::F32 | DType::F16 | DType::BF16 => Ok(()),"),
            "spr",
            int4(),
        ),
        fact(
            "cpu_reference.linear_int4.naive",
            "strides",
            here(LINEAR, "let packed = a.weight.to_i64_vec();"),
            "spr",
            every_other(int4(), "weight"),
        ),
        // mlp
        fact(
            "cpu_reference.mlp.naive",
            "dtypes",
            here(MLP, "expect_dense_float(\"x\", &a.x)?;"),
            "spr",
            mlp(Op::Mlp, Activation::Silu),
        )
        .rejects(retyped(mlp(Op::Mlp, Activation::Silu), &mlp_weights, fp8), "DTYPE_UNSUPPORTED"),
        fact(
            "cpu_reference.mlp.naive",
            "activations",
            here(ACTIVATION, "Activation::Silu => silu_f64(x),"),
            "spr",
            mlp(Op::Mlp, Activation::Silu),
        ),
        fact(
            "cpu_reference.mlp.naive",
            "activations",
            here(ACTIVATION, "Activation::Gelu => gelu_erf(x),"),
            "spr",
            mlp(Op::Mlp, Activation::Gelu),
        ),
        fact(
            "cpu_reference.mlp.naive",
            "activations",
            here(ACTIVATION, "Activation::GeluTanh => gelu_tanh(x),"),
            "spr",
            mlp(Op::Mlp, Activation::GeluTanh),
        ),
        fact("cpu_reference.mlp.naive", "strides", here(MLP, "let x = a.x.to_f64_vec();"), "spr", {
            every_other(mlp(Op::Mlp, Activation::Silu), "x")
        }),
        // The kernel refuses weights tagged other than NT (a limit the file did not declare:
        // added).
        fact(
            "cpu_reference.mlp.naive",
            "layouts",
            here(MLP, "if matches!(t.layout(), Some(l) if l != Layout::Nt) {"),
            "spr",
            {
                let req = mlp(Op::Mlp, Activation::Silu);
                req.tensor("w_up", TensorDesc::new(DType::BF16, [128, 64]).with_layout(Layout::Nt))
            },
        )
        .rejects(
            mlp(Op::Mlp, Activation::Silu)
                .tensor("w_up", TensorDesc::new(DType::BF16, [128, 64]).with_layout(Layout::Nn)),
            "LAYOUT_UNSUPPORTED",
        ),
        // moe_experts
        fact(
            "cpu_reference.moe_experts.naive",
            "dtypes",
            here(MOE, "expect_float(\"x\", &a.x)?;"),
            "spr",
            mlp(Op::MoeExperts, Activation::Silu),
        )
        .rejects(retyped(mlp(Op::MoeExperts, Activation::Silu), &mlp_weights, fp8), "DTYPE_UNSUPPORTED"),
        fact(
            "cpu_reference.moe_experts.naive",
            "activations",
            here(ACTIVATION, "Activation::Silu => silu_f64(x),"),
            "spr",
            mlp(Op::MoeExperts, Activation::Silu),
        ),
        fact(
            "cpu_reference.moe_experts.naive",
            "activations",
            here(ACTIVATION, "Activation::Gelu => gelu_erf(x),"),
            "spr",
            mlp(Op::MoeExperts, Activation::Gelu),
        ),
        fact(
            "cpu_reference.moe_experts.naive",
            "activations",
            here(ACTIVATION, "Activation::GeluTanh => gelu_tanh(x),"),
            "spr",
            mlp(Op::MoeExperts, Activation::GeluTanh),
        ),
        fact("cpu_reference.moe_experts.naive", "strides", here(MOE, "let x = a.x.to_f64_vec();"), "spr", {
            every_other(mlp(Op::MoeExperts, Activation::Silu), "x")
        }),
        // patch_embed
        fact(
            "cpu_reference.patch_embed.naive",
            "dtypes",
            here(PATCH, "expect_dense_float(\"image\", &a.image)?;"),
            "spr",
            patch_embed(nchw()),
        ),
        fact(
            "cpu_reference.patch_embed.naive",
            "layouts",
            here(PATCH, "None | Some(Layout::Nchw) => false,"),
            "spr",
            patch_embed(nchw().with_layout(Layout::Nchw)),
        ),
        fact("cpu_reference.patch_embed.naive", "layouts", here(PATCH, "Some(Layout::Nhwc) => true,"), "spr", {
            patch_embed(TensorDesc::new(DType::BF16, [1, 224, 224, 3]).with_layout(Layout::Nhwc))
        }),
        fact("cpu_reference.patch_embed.naive", "strides", here(PATCH, "let img = a.image.to_f64_vec();"), "spr", {
            every_other(patch_embed(nchw()), "image")
        }),
    ]
}
