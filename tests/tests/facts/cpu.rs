//! Our CPU kernels' facts (`capabilities/cpu.json`), each held to the line of our code that
//! implements or enforces it.
//!
//! Where a declared limit is narrower than what the code computes (a conservative
//! declaration: the code would run the request, but it is not tested there), the row cites
//! the line that does the work and says so.

use layerzero::model::attrs::{
    Activation, GegluAttrs, GeluApproximate, GeluAttrs, Int4Attrs, MlpAttrs, MoeRouteAttrs, QuantAttrs, QuantScheme,
    RopeScaling, ScaleLayout,
};

use super::*;

const ATTENTION: &str = "layerzero/src/backend/cpu/attention.rs";
const ENGINE: &str = "layerzero/src/backend/cpu/engine.rs";
const PACK: &str = "layerzero/src/backend/cpu/pack.rs";
const PAGED: &str = "layerzero/src/backend/cpu/paged.rs";
const ROPE: &str = "layerzero/src/backend/cpu/rope.rs";
const NORM: &str = "layerzero/src/backend/cpu/norm.rs";
const LINEAR: &str = "layerzero/src/backend/cpu/linear/mod.rs";
const VIEW: &str = "layerzero/src/backend/cpu/linear/view.rs";
const ACTIVATION: &str = "layerzero/src/backend/cpu/activation.rs";
const EMBEDDING: &str = "layerzero/src/backend/cpu/embedding.rs";
const SAMPLE: &str = "layerzero/src/backend/cpu/sample.rs";
const MOE: &str = "layerzero/src/backend/cpu/moe.rs";
const QUANT: &str = "layerzero/src/backend/cpu/quant.rs";
const W8A8: &str = "layerzero/src/backend/cpu/linear/w8a8.rs";
const WEIGHTS: &str = "layerzero/src/backend/cpu/linear/weights.rs";
const MLP: &str = "layerzero/src/backend/cpu/mlp.rs";
const PATCH: &str = "layerzero/src/backend/cpu/patch.rs";

/// `[1, 128, 8, d]` dense self-attention in `dtype` (BSHD).
fn dense(dtype: DType, d: u64) -> Request {
    attention(dtype, 1, 128, 128, 8, 8, d)
}

/// `req` with `v` of head dim `dv` (q and k keep theirs).
fn v_dim(req: Request, dv: u64) -> Request {
    let v: TensorDesc = req.get("v").cloned().unwrap_or_else(|| panic!("no v"));
    let mut shape = v.shape.clone();
    shape[3] = dv;
    let v = TensorDesc { shape, ..v };
    req.tensor("v", v)
}

/// bf16 self-attention with q, k and v in BHSD (`[1, 8, 128, 128]`).
fn bhsd() -> Request {
    let t = TensorDesc::new(DType::BF16, [1, 8, 128, 128]).with_layout(Layout::Bhsd);
    Request::new(Op::Attention).tensor("q", t.clone()).tensor("k", t.clone()).tensor("v", t)
}

/// bf16 self-attention of `[1, 128, 8, 128]` with a `dtype` mask of `shape`.
fn masked(a: AttentionAttrs, dtype: DType, shape: &[u64]) -> Request {
    attrs(dense(DType::BF16, 128), a).tensor("mask", TensorDesc::new(dtype, shape.to_vec()))
}

/// Two sequences packed into batch 1 (`cu_seqlens` of 3 offsets over 256 tokens).
fn ragged() -> Request {
    attention(DType::BF16, 1, 256, 256, 8, 8, 128)
        .tensor("cu_seqlens_q", TensorDesc::new(DType::I32, [3]))
        .tensor("cu_seqlens_k", TensorDesc::new(DType::I32, [3]))
}

/// A paged decode of 4 sequences (32 q heads, 8 kv heads, head dim `d`, pages of 16) with
/// `q` in `dtype`, caches in `kv` and `layout`, block table in `table`.
fn paged_of(dtype: DType, kv: DType, d: u64, layout: Layout, table: DType) -> Request {
    paged(dtype, kv, 4, 1, 32, 8, d, 16, layout, table)
}

/// `req` causal, aligned `alignment` (the other attributes default).
fn causal_as(req: Request, alignment: CausalAlignment) -> Request {
    attrs(req, AttentionAttrs { causal: true, causal_alignment: alignment, ..AttentionAttrs::default() })
}

/// A RoPE request on `[1, 16, 8, 128]` queries of `dtype`.
fn rope_in(dtype: DType) -> Request {
    Request::new(Op::Rope).tensor("q", TensorDesc::new(dtype, [1, 16, 8, 128]).with_layout(Layout::Bshd))
}

pub(super) fn facts() -> Vec<Fact> {
    let mut rows = attention_facts();
    rows.extend(paged_facts());
    rows.extend(rope_facts());
    rows.extend(row_facts());
    rows.extend(linear_facts());
    rows.extend(quant_facts());
    rows.extend(gemm_facts());
    rows
}

fn attention_facts() -> Vec<Fact> {
    let k = "cpu.attention.flash";
    vec![
        // The output is written per dtype: f32, bf16 and f16 each have an arm of
        // `output_into`. An fp8 q would take its `other =>` arm (computed in f32, then encoded),
        // which no test holds: fp8 is not declared, so it is declined.
        fact(k, "dtypes", here(ATTENTION, "DType::BF16 => {"), "spr", dense(DType::BF16, 128))
            .rejects(dense(DType::Fp8E4M3, 128), "DTYPE_UNSUPPORTED"),
        fact(k, "dtypes", here(ATTENTION, "DType::F16 => {"), "spr", dense(DType::F16, 128)),
        fact(k, "dtypes", here(ATTENTION, "DType::F32 => {"), "spr", dense(DType::F32, 128)),
        // No line bounds the head dim: q's is read here and every buffer is sized by it. 512 is
        // a conservative declaration (the tests run head dims up to 256), not a limit of the code.
        fact(k, "head_dim", here(ATTENTION, "let [b, sq, hq, d] = q.n;"), "spr", dense(DType::BF16, 512))
            .rejects(dense(DType::BF16, 513), "HEAD_DIM_TOO_LARGE"),
        fact(
            k,
            "different_v_head_dim",
            here(ATTENTION, "let [bv, skv, hkv_v, dv] = v.n;"),
            "spr",
            v_dim(dense(DType::BF16, 192), 128),
        ),
        fact(
            k,
            "gqa",
            here(ATTENTION, "if hq > 0 && (hkv == 0 || hq % hkv != 0) {"),
            "spr",
            attention(DType::BF16, 1, 128, 128, 32, 8, 128),
        ),
        // `visible_keys` (exec::semantics) aligns the causal mask either way.
        fact(
            k,
            "causal",
            here(ENGINE, "visible_keys(i, seq.sq, seq.sk, self.attrs)"),
            "spr",
            causal_as(attention(DType::BF16, 1, 64, 128, 8, 8, 128), CausalAlignment::TopLeft),
        ),
        fact(
            k,
            "causal",
            here(ENGINE, "visible_keys(i, seq.sq, seq.sk, self.attrs)"),
            "spr",
            causal_as(attention(DType::BF16, 1, 64, 128, 8, 8, 128), CausalAlignment::BottomRight),
        ),
        fact(
            k,
            "masks",
            here(ENGINE, "if !(t.dtype() == DType::Bool || t.dtype().is_float()) {"),
            "spr",
            masked(AttentionAttrs::default(), DType::Bool, &[1, 8, 128, 128]),
        ),
        fact(
            k,
            "masks",
            here(ENGINE, "Storage::F32(v) => s.iter_mut().enumerate().for_each(|(t, x)| *x += v[base + t * sj]),"),
            "spr",
            masked(AttentionAttrs::default(), DType::F32, &[1, 8, 128, 128]),
        ),
        // The mask is applied inside each query's visible (causal) key range.
        fact(
            k,
            "mask_with_causal",
            here(ENGINE, "p.mods.apply(seq, kvh * g + r / n, i0 + r % n, tj0 + a, seg);"),
            "spr",
            masked(layerzero_tests::causal(), DType::Bool, &[1, 8, 128, 128]),
        ),
        // Broadcast dims keep a zero stride.
        fact(
            k,
            "mask_broadcast",
            here(ENGINE, "let mut s = [0usize; 4];"),
            "spr",
            masked(AttentionAttrs::default(), DType::Bool, &[128, 128]),
        ),
        fact(
            k,
            "window",
            here(ENGINE, "visible_keys(i, seq.sq, seq.sk, self.attrs)"),
            "spr",
            windowed(dense(DType::BF16, 128)),
        ),
        fact(
            k,
            "softcap",
            here(ENGINE, "*x = c * (*x / c).tanh();"),
            "spr",
            attrs(dense(DType::BF16, 128), softcap(0.0)),
        ),
        fact(
            k,
            "alibi",
            here(ENGINE, "*x -= (slope * alibi_distance(i, j0 + t, seq.sq, seq.sk)) as f32;"),
            "spr",
            attrs(dense(DType::BF16, 128), AttentionAttrs { alibi: true, ..AttentionAttrs::default() }),
        ),
        fact(
            k,
            "custom_scale",
            here(ATTENTION, "scale: softmax_scale(&a.attrs, d) as f32,"),
            "spr",
            attrs(dense(DType::BF16, 128), AttentionAttrs { scale: Some(0.1), ..AttentionAttrs::default() }),
        ),
        fact(k, "varlen", here(ATTENTION, "(Some(cq), Some(ck)) => {"), "spr", ragged()),
        fact(k, "layouts", here(PACK, "Layout::Bshd => [0, 1, 2, 3],"), "spr", dense(DType::BF16, 128)),
        fact(k, "layouts", here(PACK, "Layout::Bhsd => [0, 2, 1, 3],"), "spr", bhsd()),
        // Every read goes through the tensor's own strides.
        fact(
            k,
            "strides",
            here(PACK, "Ok(Bshd { st: t.storage(), off: t.offset(), n: perm.map(|d| sh[d]), s: perm.map(|d| st[d]) })"),
            "spr",
            strided_v(dense(DType::BF16, 128)),
        ),
    ]
}

fn paged_facts() -> Vec<Fact> {
    let k = "cpu.paged_attention.split_kv";
    let bf = |d: u64| paged_of(DType::BF16, DType::BF16, d, Layout::Nhd, DType::I32);
    vec![
        // The output is q's dtype, written by the dense kernel's `output_into` (its f32, bf16
        // and f16 arms); an fp8 q would take the untested `other =>` arm: declined.
        fact(
            k,
            "dtypes",
            here(PAGED, "output_into(&p, [b, sq, hq, dv], Layout::Bshd, a.q.dtype(), bufs)"),
            "spr",
            bf(128),
        )
        .rejects(paged_of(DType::Fp8E4M3, DType::BF16, 128, Layout::Nhd, DType::I32), "DTYPE_UNSUPPORTED"),
        fact(
            k,
            "dtypes",
            here(PAGED, "output_into(&p, [b, sq, hq, dv], Layout::Bshd, a.q.dtype(), bufs)"),
            "spr",
            paged_of(DType::F32, DType::F32, 128, Layout::Nhd, DType::I32),
        ),
        fact(
            k,
            "dtypes",
            here(PAGED, "output_into(&p, [b, sq, hq, dv], Layout::Bshd, a.q.dtype(), bufs)"),
            "spr",
            paged_of(DType::F16, DType::F16, 128, Layout::Nhd, DType::I32),
        ),
        // As for dense attention: no line bounds the head dim; 512 is a conservative declaration.
        fact(k, "head_dim", here(PAGED, "let [b, sq, hq, d] = q.n;"), "spr", bf(512))
            .rejects(bf(513), "HEAD_DIM_TOO_LARGE"),
        fact(k, "gqa", here(PAGED, "if hkv == 0 || hq % hkv != 0 {"), "spr", bf(128)),
        fact(
            k,
            "causal",
            here(ENGINE, "visible_keys(i, seq.sq, seq.sk, self.attrs)"),
            "spr",
            causal_as(queries_on_pages(4, 16, None, 1), CausalAlignment::TopLeft),
        ),
        fact(
            k,
            "causal",
            here(ENGINE, "visible_keys(i, seq.sq, seq.sk, self.attrs)"),
            "spr",
            causal_as(queries_on_pages(4, 16, None, 1), CausalAlignment::BottomRight),
        ),
        fact(
            k,
            "window",
            here(ENGINE, "visible_keys(i, seq.sq, seq.sk, self.attrs)"),
            "spr",
            windowed(queries_on_pages(4, 16, None, 1)),
        ),
        fact(
            k,
            "softcap",
            here(PAGED, "softcap: a.attrs.softcap.map(|c| c as f32),"),
            "spr",
            attrs(bf(128), softcap(0.0)),
        ),
        fact(
            k,
            "alibi",
            here(PAGED, "alibi: a.attrs.alibi.then(|| alibi_slopes(hq)),"),
            "spr",
            attrs(bf(128), AttentionAttrs { alibi: true, ..AttentionAttrs::default() }),
        ),
        fact(
            k,
            "custom_scale",
            here(PAGED, "scale: softmax_scale(&a.attrs, d) as f32,"),
            "spr",
            attrs(bf(128), AttentionAttrs { scale: Some(0.1), ..AttentionAttrs::default() }),
        ),
        fact(k, "layouts", here(PAGED, "paged attention takes BSHD queries"), "spr", bf(128)),
        // Pages 2 x 16 x 8 x 128 elements apart (K and V interleaved per page), elements 1 apart.
        fact(
            k,
            "strides",
            here(PAGED, "let s = perm.map(|d| t.strides()[d]);"),
            "spr",
            pages(16, Some(2 * 16 * 8 * 128), 1),
        ),
        fact(
            k,
            "block_table_dtypes",
            here(PACK, "Storage::I32(v) => v.get(off..off + n).map(IntSlice::I32),"),
            "spr",
            bf(128),
        ),
        fact(
            k,
            "block_table_dtypes",
            here(PACK, "Storage::I64(v) => v.get(off..off + n).map(IntSlice::I64),"),
            "spr",
            paged_of(DType::BF16, DType::BF16, 128, Layout::Nhd, DType::I64),
        ),
        fact(k, "kv_cache_layouts", here(PAGED, "Some(Layout::Nhd) => [0, 1, 2, 3],"), "spr", bf(128)),
        fact(
            k,
            "kv_cache_layouts",
            here(PAGED, "Some(Layout::Hnd) => [0, 2, 1, 3],"),
            "spr",
            paged_of(DType::BF16, DType::BF16, 128, Layout::Hnd, DType::I32),
        ),
        // Cache rows are decoded to f32 by dtype (fp8 through a 256-entry table).
        fact(k, "kv_cache_dtypes", here(PACK, "Storage::BF16(v) => simd::bf16_to_f32(&v[r], out),"), "spr", bf(128)),
        fact(
            k,
            "kv_cache_dtypes",
            here(PACK, "Storage::Fp8E4M3(v) => lut(&v[r], fp8_table(Fp8::E4M3), out),"),
            "spr",
            paged_of(DType::BF16, DType::Fp8E4M3, 128, Layout::Nhd, DType::I32),
        ),
        fact(
            k,
            "kv_cache_dtypes",
            here(PACK, "Storage::Fp8E5M2(v) => lut(&v[r], fp8_table(Fp8::E5M2), out),"),
            "spr",
            paged_of(DType::F32, DType::Fp8E5M2, 128, Layout::Nhd, DType::I32),
        ),
        fact(
            k,
            "kv_cache_dtypes",
            here(PACK, "Storage::F16(v) => simd::f16_to_f32(&v[r], out),"),
            "spr",
            paged_of(DType::BF16, DType::F16, 128, Layout::Nhd, DType::I32),
        ),
        fact(
            k,
            "kv_cache_dtypes",
            here(PACK, "Storage::F32(v) => out.copy_from_slice(&v[r]),"),
            "spr",
            paged_of(DType::BF16, DType::F32, 128, Layout::Nhd, DType::I32),
        ),
    ]
}

fn rope_facts() -> Vec<Fact> {
    let k = "cpu.rope.fast";
    let scaled = RopeAttrs { scaling: Some(RopeScaling::Linear { factor: 2.0 }), ..RopeAttrs::default() };
    let bhsd_q =
        Request::new(Op::Rope).tensor("q", TensorDesc::new(DType::BF16, [1, 8, 16, 128]).with_layout(Layout::Bhsd));
    // q [1, 16, 8, 128] read every other element.
    let strided_q = Request::new(Op::Rope).tensor(
        "q",
        TensorDesc::new(DType::BF16, [1, 16, 8, 128]).with_layout(Layout::Bshd).with_strides([32768, 2048, 256, 2]),
    );
    vec![
        // A non-float q is refused (`Bshd::new`); an fp8 q would take the untested `other =>`
        // arm of `rotate`: not declared.
        fact(k, "dtypes", here(ROPE, "DType::BF16 => {"), "spr", rope_in(DType::BF16))
            .rejects(rope_in(DType::I8), "DTYPE_UNSUPPORTED"),
        fact(k, "dtypes", here(ROPE, "DType::F16 => {"), "spr", rope_in(DType::F16)),
        fact(k, "dtypes", here(ROPE, "DType::F32 => {"), "spr", rope_in(DType::F32)),
        fact(k, "rope_styles", here(ROPE, "RopeStyle::RotateHalf => {"), "spr", rope_of(RopeStyle::RotateHalf)),
        fact(k, "rope_styles", here(ROPE, "RopeStyle::Interleaved => {"), "spr", rope_of(RopeStyle::Interleaved)),
        // The frequencies, scaled as `attrs.scaling` says, come from exec::semantics.
        fact(
            k,
            "rope_scaling",
            here(ROPE, "let (inv, factor) = rope_frequencies(attrs, rot, seq_len);"),
            "spr",
            rope_in(DType::BF16).attrs(Attrs::Rope(scaled)),
        ),
        fact(k, "layouts", here(ROPE, "let bhsd = t.layout() == Some(Layout::Bhsd);"), "spr", bhsd_q),
        fact(k, "layouts", here(PACK, "Layout::Bshd => [0, 1, 2, 3],"), "spr", rope_in(DType::BF16)),
        fact(k, "strides", here(ROPE, "x.read(b, s, h, src);"), "spr", strided_q),
    ]
}

/// `t` as a view that reads every other element of a twice-as-wide buffer (last stride 2).
fn every_other(t: TensorDesc) -> TensorDesc {
    let mut strides = vec![2u64; t.shape.len()];
    for d in (0..t.shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * t.shape[d + 1];
    }
    t.with_strides(strides)
}

/// A norm of `[64, 4096]` rows in `dtype` (weight too), with a residual when asked.
fn norm_in(op: Op, dtype: DType, residual: bool) -> Request {
    let req = Request::new(op)
        .tensor("x", TensorDesc::new(dtype, [64, 4096]))
        .tensor("weight", TensorDesc::new(dtype, [4096]));
    if residual { req.tensor("residual", TensorDesc::new(dtype, [64, 4096])) } else { req }
}

/// `req` with its tensor `name` read through [`every_other`].
fn strided(req: Request, name: &str) -> Request {
    let t: TensorDesc = req.get(name).cloned().unwrap_or_else(|| panic!("no {name}"));
    req.tensor(name, every_other(t))
}

/// A gated activation (`op` SwiGLU or GeGLU) of `[64, 4096]` outputs in `dtype`: the split
/// form reads `x` `[64, 8192]`, the separate form `gate` and `up`.
fn glu(op: Op, split: bool, dtype: DType) -> Request {
    let attrs = match op {
        Op::Geglu => Attrs::Geglu(GegluAttrs { split, ..GegluAttrs::default() }),
        _ => Attrs::Swiglu(SwigluAttrs { split }),
    };
    let req = Request::new(op).attrs(attrs);
    if split {
        req.tensor("x", TensorDesc::new(dtype, [64, 8192]))
    } else {
        req.tensor("gate", TensorDesc::new(dtype, [64, 4096])).tensor("up", TensorDesc::new(dtype, [64, 4096]))
    }
}

/// GeGLU (split) with the GELU approximation `a`.
fn geglu_as(a: GeluApproximate) -> Request {
    glu(Op::Geglu, true, DType::BF16).attrs(Attrs::Geglu(GegluAttrs { split: true, approximate: a }))
}

/// `op` (GELU or SiLU) over `[64, 4096]` in `dtype`.
fn unary_in(op: Op, dtype: DType) -> Request {
    Request::new(op).tensor("x", TensorDesc::new(dtype, [64, 4096]))
}

/// GELU with the approximation `a`.
fn gelu_as(a: GeluApproximate) -> Request {
    unary_in(Op::Gelu, DType::BF16).attrs(Attrs::Gelu(GeluAttrs { approximate: a }))
}

/// 16 token ids gathered from a `[128256, 4096]` table of `dtype`.
fn embed_in(dtype: DType) -> Request {
    Request::new(Op::Embedding)
        .tensor("ids", TensorDesc::new(DType::I32, [1, 16]))
        .tensor("table", TensorDesc::new(dtype, [128256, 4096]))
}

/// Sampling from `[4, vocab]` logits of `dtype`.
fn sample_in(dtype: DType, vocab: u64) -> Request {
    Request::new(Op::Sample).tensor("logits", TensorDesc::new(dtype, [4, vocab]))
}

/// Top-2 routing of 16 tokens over `experts` router logits of `dtype`.
fn route_in(dtype: DType, experts: u64) -> Request {
    Request::new(Op::MoeRoute)
        .attrs(Attrs::MoeRoute(MoeRouteAttrs { top_k: 2, renormalize: true }))
        .tensor("logits", TensorDesc::new(dtype, [16, experts]))
}

fn row_facts() -> Vec<Fact> {
    let (rms, ln) = ("cpu.rms_norm.fast", "cpu.layer_norm.fast");
    let (swiglu, geglu, gelu, silu) = ("cpu.swiglu.fast", "cpu.geglu.fast", "cpu.gelu.fast", "cpu.silu.fast");
    let (embedding, sample, route) = ("cpu.embedding.fast", "cpu.sample.fast", "cpu.moe_route.fast");
    // `by_dtype!` runs f32, f16 and bf16 and refuses any other dtype as Unsupported.
    let by_dtype = || here(NORM, "computes f32, f16 and bf16; it was given {other}");
    vec![
        fact(
            rms,
            "dtypes",
            here(NORM, "by_dtype!(a.x.dtype(), RMS_NORM, T => rms_typed::<T>(a, rows, h, eps, bufs))"),
            "spr",
            norm_in(Op::RmsNorm, DType::BF16, false),
        )
        .rejects(norm_in(Op::RmsNorm, DType::Fp8E4M3, false), "DTYPE_UNSUPPORTED"),
        fact(rms, "dtypes", by_dtype(), "spr", norm_in(Op::RmsNorm, DType::F16, false)),
        fact(rms, "dtypes", by_dtype(), "spr", norm_in(Op::RmsNorm, DType::F32, false)),
        fact(
            rms,
            "fused_residual",
            here(NORM, "let r = View::new(res);"),
            "spr",
            norm_in(Op::RmsNorm, DType::BF16, true),
        ),
        // A norm reads x through its shape and strides.
        fact(
            rms,
            "strides",
            here(NORM, "View::of(t, t.shape(), t.strides(), t.offset())"),
            "spr",
            strided(norm_in(Op::RmsNorm, DType::BF16, false), "x"),
        ),
        fact(
            ln,
            "dtypes",
            here(NORM, "by_dtype!(a.x.dtype(), LAYER_NORM, T => layer_typed::<T>(a, rows, h, eps))"),
            "spr",
            norm_in(Op::LayerNorm, DType::BF16, false),
        )
        .rejects(norm_in(Op::LayerNorm, DType::Fp8E5M2, false), "DTYPE_UNSUPPORTED"),
        fact(ln, "dtypes", by_dtype(), "spr", norm_in(Op::LayerNorm, DType::F32, false)),
        fact(
            ln,
            "fused_residual",
            here(NORM, "let s: Vec<f32> = a.x.to_f32_vec().iter().zip(r.to_f32_vec()).map(|(x, r)| x + r).collect();"),
            "spr",
            norm_in(Op::LayerNorm, DType::BF16, true),
        ),
        fact(
            ln,
            "strides",
            here(NORM, "View::of(t, t.shape(), t.strides(), t.offset())"),
            "spr",
            strided(norm_in(Op::LayerNorm, DType::BF16, false), "x"),
        ),
        fact(
            swiglu,
            "dtypes",
            here(ACTIVATION, "by_dtype!(x.dtype(), kernel, T => run_gated::<T>(act, &g, &u, &shape))"),
            "spr",
            glu(Op::Swiglu, true, DType::BF16),
        )
        .rejects(glu(Op::Swiglu, true, DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        fact(
            swiglu,
            "dtypes",
            here(ACTIVATION, "by_dtype!(gate.dtype(), kernel, T => run_gated::<T>(act, &g, &u, &shape))"),
            "spr",
            glu(Op::Swiglu, false, DType::F32),
        ),
        fact(
            swiglu,
            "glu_forms",
            here(ACTIVATION, "(Some(x), _, _) if split => {"),
            "spr",
            glu(Op::Swiglu, true, DType::BF16),
        ),
        fact(
            swiglu,
            "glu_forms",
            here(ACTIVATION, "(_, Some(gate), Some(up)) => {"),
            "spr",
            glu(Op::Swiglu, false, DType::BF16),
        ),
        // The split halves are views with x's own strides.
        fact(
            swiglu,
            "strides",
            here(ACTIVATION, "let u = View::of(x, &shape, x.strides(), x.offset() + i * last_stride);"),
            "spr",
            strided(glu(Op::Swiglu, true, DType::BF16), "x"),
        ),
        fact(
            geglu,
            "dtypes",
            here(ACTIVATION, "by_dtype!(x.dtype(), kernel, T => run_gated::<T>(act, &g, &u, &shape))"),
            "spr",
            glu(Op::Geglu, true, DType::BF16),
        )
        .rejects(glu(Op::Geglu, true, DType::Fp8E5M2), "DTYPE_UNSUPPORTED"),
        fact(
            geglu,
            "glu_forms",
            here(ACTIVATION, "(Some(x), _, _) if split => {"),
            "spr",
            glu(Op::Geglu, true, DType::BF16),
        ),
        fact(
            geglu,
            "glu_forms",
            here(ACTIVATION, "(_, Some(gate), Some(up)) => {"),
            "spr",
            glu(Op::Geglu, false, DType::F16),
        ),
        fact(
            geglu,
            "gelu_approximations",
            here(ACTIVATION, "GeluApproximate::None => Act::GeluErf,"),
            "spr",
            geglu_as(GeluApproximate::None),
        ),
        fact(
            geglu,
            "gelu_approximations",
            here(ACTIVATION, "GeluApproximate::Tanh => Act::GeluTanh,"),
            "spr",
            geglu_as(GeluApproximate::Tanh),
        ),
        fact(
            geglu,
            "strides",
            here(ACTIVATION, "let (g, u) = (View::new(gate), View::new(up));"),
            "spr",
            strided(glu(Op::Geglu, false, DType::BF16), "up"),
        ),
        fact(
            gelu,
            "dtypes",
            here(ACTIVATION, "by_dtype!(x.dtype(), kernel, T => {"),
            "spr",
            unary_in(Op::Gelu, DType::BF16),
        )
        .rejects(unary_in(Op::Gelu, DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        fact(gelu, "dtypes", by_dtype(), "spr", unary_in(Op::Gelu, DType::F16)),
        fact(
            gelu,
            "gelu_approximations",
            here(ACTIVATION, "GeluApproximate::None => Act::GeluErf,"),
            "spr",
            gelu_as(GeluApproximate::None),
        ),
        fact(
            gelu,
            "gelu_approximations",
            here(ACTIVATION, "GeluApproximate::Tanh => Act::GeluTanh,"),
            "spr",
            gelu_as(GeluApproximate::Tanh),
        ),
        fact(
            gelu,
            "strides",
            here(ACTIVATION, "let v = View::new(x);"),
            "spr",
            strided(unary_in(Op::Gelu, DType::BF16), "x"),
        ),
        fact(
            silu,
            "dtypes",
            here(ACTIVATION, "by_dtype!(x.dtype(), kernel, T => {"),
            "spr",
            unary_in(Op::Silu, DType::BF16),
        )
        .rejects(unary_in(Op::Silu, DType::Fp8E5M2), "DTYPE_UNSUPPORTED"),
        fact(silu, "dtypes", by_dtype(), "spr", unary_in(Op::Silu, DType::F32)),
        fact(
            silu,
            "strides",
            here(ACTIVATION, "let v = View::new(x);"),
            "spr",
            strided(unary_in(Op::Silu, DType::BF16), "x"),
        ),
        fact(
            embedding,
            "dtypes",
            here(EMBEDDING, "by_dtype!(table.dtype(), EMBEDDING, T => {"),
            "spr",
            embed_in(DType::BF16),
        )
        .rejects(embed_in(DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        fact(embedding, "dtypes", by_dtype(), "spr", embed_in(DType::F32)),
        // Rows of the table are gathered through both of its strides.
        fact(
            embedding,
            "strides",
            here(EMBEDDING, "*d = src[base + c * s1];"),
            "spr",
            strided(embed_in(DType::BF16), "table"),
        ),
        // Any float dtype is read as f32 (`f32_cow`); a non-float one is refused. fp8 logits
        // would be read too, but are not declared (untested): declined.
        fact(sample, "dtypes", here(SAMPLE, "if !logits.dtype().is_float() {"), "spr", sample_in(DType::BF16, 128256))
            .rejects(sample_in(DType::I8, 128256), "DTYPE_UNSUPPORTED"),
        fact(sample, "dtypes", here(SAMPLE, "let data = f32_cow(logits);"), "spr", sample_in(DType::F16, 128256)),
        fact(
            sample,
            "strides",
            here(SAMPLE, "Cow::Owned(t.to_f32_vec())"),
            "spr",
            strided(sample_in(DType::BF16, 128256), "logits"),
        ),
        // Kept tokens are indexed as u32: a larger vocabulary is refused.
        fact(
            sample,
            "hidden_size",
            here(SAMPLE, "if v > u32::MAX as usize {"),
            "spr",
            sample_in(DType::BF16, u64::from(u32::MAX)),
        )
        .rejects(sample_in(DType::BF16, u64::from(u32::MAX) + 1), "HIDDEN_SIZE_UNSUPPORTED"),
        fact(route, "dtypes", here(MOE, "expect_float(\"logits\", logits)?;"), "spr", route_in(DType::BF16, 64))
            .rejects(route_in(DType::I8, 64), "DTYPE_UNSUPPORTED"),
        fact(route, "dtypes", here(MOE, "let data = f32_cow(logits);"), "spr", route_in(DType::F32, 64)),
        fact(
            route,
            "strides",
            here(MOE, "let data = f32_cow(logits);"),
            "spr",
            strided(route_in(DType::BF16, 64), "logits"),
        ),
        // The `experts` output is i32: more experts than i32::MAX are refused.
        fact(
            route,
            "hidden_size",
            here(MOE, "if i32::try_from(e).is_err() {"),
            "spr",
            route_in(DType::BF16, i32::MAX as u64),
        )
        .rejects(route_in(DType::BF16, i32::MAX as u64 + 1), "HIDDEN_SIZE_UNSUPPORTED"),
    ]
}

fn linear_facts() -> Vec<Fact> {
    let k = "cpu.linear.fast";
    let nn = Request::new(Op::Linear)
        .tensor("x", TensorDesc::new(DType::BF16, [64, 4096]))
        .tensor("weight", TensorDesc::new(DType::BF16, [4096, 11008]).with_layout(Layout::Nn));
    vec![
        // f32, f16 and bf16 pass; another float dtype is Unsupported.
        fact(k, "dtypes", here(LINEAR, "expect_dense_float(\"x\", &a.x)?;"), "spr", linear_of(DType::BF16))
            .rejects(linear_of(DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        fact(
            k,
            "dtypes",
            here(LINEAR, "DType::F32 | DType::F16 | DType::BF16 => Ok(()),"),
            "spr",
            linear_of(DType::F16),
        ),
        fact(
            k,
            "dtypes",
            here(LINEAR, "DType::F32 | DType::F16 | DType::BF16 => Ok(()),"),
            "spr",
            linear_of(DType::F32),
        ),
        fact(k, "weight_layouts", here(LINEAR, "None | Some(Layout::Nt) => false,"), "spr", linear_of(DType::BF16)),
        fact(k, "weight_layouts", here(LINEAR, "Some(Layout::Nn) => true,"), "spr", nn),
        // x keeps its column stride; the weight is a strided matrix view.
        fact(
            k,
            "strides",
            here(VIEW, "let cs = st.last().copied().unwrap_or(1);"),
            "spr",
            strided(linear_of(DType::BF16), "x"),
        ),
    ]
}

/// `op` (quantize or dequantize) of a `[256, 512]` x of `dtype` under `scheme`, with `block`
/// and `layout` for per-block scales and `target` for quantize; dequantize gets the scale the
/// scheme implies (`[2, 4]` for 128 x 128 blocks, in `layout`'s memory order).
fn quant_in(
    op: Op,
    dtype: DType,
    scheme: QuantScheme,
    block: Option<[u64; 2]>,
    layout: Option<ScaleLayout>,
    target: Option<DType>,
) -> Request {
    let attrs = QuantAttrs { scheme, block, scale_layout: layout, target, out_dtype: None };
    let req = Request::new(op).attrs(Attrs::Quant(attrs)).tensor("x", TensorDesc::new(dtype, [256, 512]));
    if op == Op::Quantize {
        return req;
    }
    let scale = match (scheme, block) {
        (QuantScheme::PerChannel, _) => TensorDesc::new(DType::F32, [256]),
        (QuantScheme::PerBlock, Some([r, c])) => {
            let (gr, gc) = (256u64.div_ceil(r), 512u64.div_ceil(c));
            let t = TensorDesc::new(DType::F32, [gr, gc]);
            if layout == Some(ScaleLayout::ColumnMajor) { t.with_strides([1, gr]) } else { t }
        }
        _ => TensorDesc::new(DType::F32, [1]),
    };
    req.tensor("scale", scale)
}

/// Quantize bf16 under `scheme` (per-tensor scales, i8 unless `target`).
fn quantize(scheme: QuantScheme, target: Option<DType>) -> Request {
    quant_in(Op::Quantize, DType::BF16, scheme, None, None, target)
}

/// Quantize bf16 per block of `block`, scales in `layout`.
fn quantize_blocks(block: [u64; 2], layout: Option<ScaleLayout>) -> Request {
    quant_in(Op::Quantize, DType::BF16, QuantScheme::PerBlock, Some(block), layout, None)
}

/// Dequantize an x of `dtype` under `scheme` (per-block: 128 x 128).
fn dequantize(dtype: DType, scheme: QuantScheme) -> Request {
    let block = (scheme == QuantScheme::PerBlock).then_some([128, 128]);
    quant_in(Op::Dequantize, dtype, scheme, block, None, None)
}

/// Dequantize i8 per block of `block`, scales in `layout`.
fn dequantize_blocks(block: [u64; 2], layout: Option<ScaleLayout>) -> Request {
    quant_in(Op::Dequantize, DType::I8, QuantScheme::PerBlock, Some(block), layout, None)
}

/// An i8 `[4, 64] x [32, 64]` W8A8 linear with per-row scales, the weight tagged `layout`.
fn w8a8_in(layout: Option<Layout>) -> Request {
    let w = TensorDesc::new(DType::I8, [32, 64]);
    Request::new(Op::LinearW8a8)
        .tensor("x", TensorDesc::new(DType::I8, [4, 64]))
        .tensor("x_scale", TensorDesc::new(DType::F32, [4]))
        .tensor("weight", layout.map_or(w.clone(), |l| w.with_layout(l)))
        .tensor("w_scale", TensorDesc::new(DType::F32, [32]))
}

/// An int4 linear of `[4, 256]` x of `dtype` against 32 packed rows in groups of `group`.
fn int4_in(dtype: DType, group: u64) -> Request {
    Request::new(Op::LinearInt4)
        .attrs(Attrs::Int4(Int4Attrs { group_size: group }))
        .tensor("x", TensorDesc::new(dtype, [4, 256]))
        .tensor("weight", TensorDesc::new(DType::I8, [32, 128]))
        .tensor("scales", TensorDesc::new(DType::F32, [32, 256 / group]))
}

/// A gated MLP (`op` mlp or moe_experts: 4 experts, top-2) of 16 tokens, hidden 64,
/// intermediate 128, in `dtype`, activation `act`, weights tagged `layout` when given.
fn mlp_in(op: Op, dtype: DType, act: Activation, layout: Option<Layout>) -> Request {
    let t = |s: &[u64]| {
        let t = TensorDesc::new(dtype, s.to_vec());
        layout.map_or(t.clone(), |l| t.with_layout(l))
    };
    let req =
        Request::new(op).attrs(Attrs::Mlp(MlpAttrs { activation: act })).tensor("x", TensorDesc::new(dtype, [16, 64]));
    match op {
        Op::MoeExperts => req
            .tensor("experts", TensorDesc::new(DType::I32, [16, 2]))
            .tensor("weights", TensorDesc::new(DType::F32, [16, 2]))
            .tensor("w_gate", t(&[4, 128, 64]))
            .tensor("w_up", t(&[4, 128, 64]))
            .tensor("w_down", t(&[4, 64, 128])),
        _ => req.tensor("w_gate", t(&[128, 64])).tensor("w_up", t(&[128, 64])).tensor("w_down", t(&[64, 128])),
    }
}

/// ViT-Base's patch embedding of one 224 x 224 RGB image of `dtype` (16 x 16 patches to 768),
/// the image in `layout` (`None`: untagged, which is NCHW).
fn patch_in(dtype: DType, layout: Option<Layout>) -> Request {
    let image = match layout {
        Some(Layout::Nhwc) => TensorDesc::new(dtype, [1, 224, 224, 3]).with_layout(Layout::Nhwc),
        _ => TensorDesc::new(dtype, [1, 3, 224, 224]),
    };
    Request::new(Op::PatchEmbed).tensor("image", image).tensor("weight", TensorDesc::new(dtype, [768, 3, 16, 16]))
}

fn quant_facts() -> Vec<Fact> {
    let (q, dq) = ("cpu.quantize.fast", "cpu.dequantize.fast");
    let per_tensor = |dtype: DType| quant_in(Op::Quantize, dtype, QuantScheme::PerTensor, None, None, None);
    let blocks = "for (j, blk) in row.chunks(bc).enumerate() {";
    let scaled_rows = "let srow = &scales[(r / grid.br) * grid.gc..(r / grid.br + 1) * grid.gc];";
    let target_of_x = "Target::of(x.dtype(), \"tensor `x` dtype\")?;";
    vec![
        fact(
            q,
            "dtypes",
            here(QUANT, "if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {"),
            "spr",
            per_tensor(DType::BF16),
        ),
        fact(
            q,
            "dtypes",
            here(QUANT, "if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {"),
            "spr",
            per_tensor(DType::F16),
        ),
        fact(
            q,
            "dtypes",
            here(QUANT, "if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {"),
            "spr",
            per_tensor(DType::F32),
        ),
        fact(
            q,
            "quant_schemes",
            here(QUANT, "let scale = if grid.scheme == QuantScheme::None {"),
            "spr",
            quantize(QuantScheme::None, Some(DType::Fp8E4M3)),
        ),
        fact(q, "quant_schemes", here(QUANT, "if !grid.banded() {"), "spr", quantize(QuantScheme::PerTensor, None)),
        fact(
            q,
            "quant_schemes",
            here(QUANT, "let (br, bc, gc) = (grid.br, grid.bc, grid.gc);"),
            "spr",
            quantize(QuantScheme::PerChannel, None),
        ),
        fact(
            q,
            "quant_schemes",
            here(QUANT, "let (br, bc, gc) = (grid.br, grid.bc, grid.gc);"),
            "spr",
            quantize_blocks([128, 128], None),
        ),
        fact(
            q,
            "quant_targets",
            here(QUANT, "Target::I8 => {"),
            "spr",
            quantize(QuantScheme::PerTensor, Some(DType::I8)),
        ),
        fact(
            q,
            "quant_targets",
            here(QUANT, "Target::Fp8(f) => {"),
            "spr",
            quantize(QuantScheme::PerTensor, Some(DType::Fp8E4M3)),
        ),
        fact(
            q,
            "quant_targets",
            here(QUANT, "Target::Fp8(f) => {"),
            "spr",
            quantize(QuantScheme::PerChannel, Some(DType::Fp8E5M2)),
        ),
        fact(
            q,
            "scale_layouts",
            here(QUANT, "HostTensor::from_f32(&grid.shape(), scales)"),
            "spr",
            quantize_blocks([128, 128], Some(ScaleLayout::RowMajor)),
        ),
        fact(
            q,
            "scale_layouts",
            here(QUANT, "let scale = if grid.scheme == QuantScheme::PerBlock && column_major {"),
            "spr",
            quantize_blocks([128, 128], Some(ScaleLayout::ColumnMajor)),
        ),
        fact(
            q,
            "strides",
            here(QUANT, "super::linear::rows_view(x, holder)"),
            "spr",
            strided(per_tensor(DType::BF16), "x"),
        ),
        // Any positive block is computed (bands of `br` rows, column blocks of `bc`); the
        // file declares DeepSeek-V3's two (activations 1 x 128, weights 128 x 128), the ones
        // the tests compare against the reference: a conservative list, not a limit of the code.
        fact(q, "quant_blocks", here(QUANT, blocks), "spr", quantize_blocks([128, 128], None))
            .rejects(quantize_blocks([64, 64], None), "ATTR_UNSUPPORTED"),
        fact(q, "quant_blocks", here(QUANT, blocks), "spr", quantize_blocks([1, 128], None)),
        fact(dq, "dtypes", here(QUANT, target_of_x), "spr", dequantize(DType::I8, QuantScheme::PerTensor)),
        fact(dq, "dtypes", here(QUANT, target_of_x), "spr", dequantize(DType::Fp8E4M3, QuantScheme::PerTensor)),
        fact(dq, "dtypes", here(QUANT, target_of_x), "spr", dequantize(DType::Fp8E5M2, QuantScheme::PerTensor)),
        fact(
            dq,
            "quant_targets",
            here(QUANT, "if let Storage::I8(v) = x.st"),
            "spr",
            dequantize(DType::I8, QuantScheme::PerChannel),
        ),
        fact(
            dq,
            "quant_targets",
            here(QUANT, "read_f32(x.st, x.at(r, 0), x.cs, out);"),
            "spr",
            dequantize(DType::Fp8E4M3, QuantScheme::PerChannel),
        ),
        fact(
            dq,
            "quant_targets",
            here(QUANT, "read_f32(x.st, x.at(r, 0), x.cs, out);"),
            "spr",
            dequantize(DType::Fp8E5M2, QuantScheme::PerBlock),
        ),
        fact(
            dq,
            "quant_schemes",
            here(QUANT, "QuantScheme::None | QuantScheme::PerTensor => row.iter_mut().for_each(|v| *v *= scales[0]),"),
            "spr",
            dequantize(DType::Fp8E4M3, QuantScheme::None),
        ),
        fact(
            dq,
            "quant_schemes",
            here(QUANT, "QuantScheme::None | QuantScheme::PerTensor => row.iter_mut().for_each(|v| *v *= scales[0]),"),
            "spr",
            dequantize(DType::I8, QuantScheme::PerTensor),
        ),
        fact(
            dq,
            "quant_schemes",
            here(QUANT, "QuantScheme::PerChannel => row.iter_mut().for_each(|v| *v *= scales[r]),"),
            "spr",
            dequantize(DType::I8, QuantScheme::PerChannel),
        ),
        fact(dq, "quant_schemes", here(QUANT, scaled_rows), "spr", dequantize(DType::I8, QuantScheme::PerBlock)),
        // The scale is read in logical order (after `check_scale` matched its memory order
        // against attrs.scale_layout), so either order is taken.
        fact(
            dq,
            "scale_layouts",
            here(QUANT, "let scales = a.scale.to_f32_vec();"),
            "spr",
            dequantize_blocks([128, 128], Some(ScaleLayout::RowMajor)),
        ),
        fact(
            dq,
            "scale_layouts",
            here(QUANT, "let scales = a.scale.to_f32_vec();"),
            "spr",
            dequantize_blocks([128, 128], Some(ScaleLayout::ColumnMajor)),
        ),
        fact(
            dq,
            "strides",
            here(QUANT, "read_f32(x.st, x.at(r, 0), x.cs, out);"),
            "spr",
            strided(dequantize(DType::I8, QuantScheme::PerTensor), "x"),
        ),
        // As for quantize: any positive block; the two declared are a conservative list.
        fact(dq, "quant_blocks", here(QUANT, scaled_rows), "spr", dequantize_blocks([128, 128], None))
            .rejects(dequantize_blocks([64, 64], None), "ATTR_UNSUPPORTED"),
        fact(dq, "quant_blocks", here(QUANT, scaled_rows), "spr", dequantize_blocks([1, 128], None)),
    ]
}

fn gemm_facts() -> Vec<Fact> {
    let (w8, int4) = ("cpu.linear_w8a8.fast", "cpu.linear_int4.fast");
    let (fused, chain, moe) = ("cpu.mlp.fused", "cpu.mlp.chain", "cpu.moe_experts.grouped");
    let patch = "cpu.patch_embed.im2col";
    let mlp_dims = || here(MLP, "crate::backend::cpu_reference::mlp::mlp_dims(a)?;");
    let silu = || here(MLP, "*g = *g / (1.0 + simd::exp_approx(-*g)) * u;");
    let gelu = || here(MLP, "let e = super::activation::erfc_f32(x.abs() * std::f32::consts::FRAC_1_SQRT_2);");
    let gelu_tanh = || here(MLP, "let t = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);");
    let mlp = |op: Op, act: Activation| mlp_in(op, DType::BF16, act, None);
    // An NHWC view of NCHW memory ([1, 3, 224, 224] permuted): channels 50176 apart.
    let permuted = Request::new(Op::PatchEmbed)
        .tensor(
            "image",
            TensorDesc::new(DType::F32, [1, 224, 224, 3])
                .with_layout(Layout::Nhwc)
                .with_strides([150528, 224, 1, 50176]),
        )
        .tensor("weight", TensorDesc::new(DType::F32, [768, 3, 16, 16]));
    vec![
        fact(w8, "dtypes", here(W8A8, "linear_w8a8 expects i8"), "spr", w8a8_in(None)),
        // A strided i8 operand is copied into rows first.
        fact(
            w8,
            "strides",
            here(W8A8, "*holder = t.to_i64_vec().into_iter().map(|v| v as i8).collect();"),
            "spr",
            strided(w8a8_in(None), "x"),
        ),
        fact(w8, "layouts", here(W8A8, "linear_w8a8 takes [N, K] (NT) weights"), "spr", w8a8_in(Some(Layout::Nt)))
            .rejects(w8a8_in(Some(Layout::Nn)), "LAYOUT_UNSUPPORTED"),
        fact(
            int4,
            "dtypes",
            here(LINEAR, "to_tensor(a.x.dtype(), &out_shape(&a.x, n), c)"),
            "spr",
            int4_in(DType::BF16, 128),
        ),
        fact(
            int4,
            "dtypes",
            here(LINEAR, "to_tensor(a.x.dtype(), &out_shape(&a.x, n), c)"),
            "spr",
            int4_in(DType::F16, 64),
        ),
        fact(
            int4,
            "dtypes",
            here(LINEAR, "to_tensor(a.x.dtype(), &out_shape(&a.x, n), c)"),
            "spr",
            int4_in(DType::F32, 32),
        ),
        fact(
            int4,
            "strides",
            here(VIEW, "let cs = st.last().copied().unwrap_or(1);"),
            "spr",
            strided(int4_in(DType::BF16, 128), "x"),
        ),
        // A group is dequantized from whole bytes (`b0 = gi * g / 2`): any even group size that
        // divides K computes; the list declares the three the tests and GPTQ/AWQ checkpoints
        // use (conservative; an odd group would start mid-byte and is never declared).
        fact(int4, "group_sizes", here(WEIGHTS, "let b0 = gi * self.g / 2;"), "spr", int4_in(DType::BF16, 128))
            .rejects(int4_in(DType::BF16, 16), "ATTR_UNSUPPORTED"),
        fact(int4, "group_sizes", here(WEIGHTS, "let b0 = gi * self.g / 2;"), "spr", int4_in(DType::BF16, 64)),
        fact(int4, "group_sizes", here(WEIGHTS, "let b0 = gi * self.g / 2;"), "spr", int4_in(DType::BF16, 32)),
        // f32, f16 and bf16 pass the shared MLP check; fp8 is Unsupported there.
        fact(fused, "dtypes", mlp_dims(), "spr", mlp(Op::Mlp, Activation::Silu))
            .rejects(mlp_in(Op::Mlp, DType::Fp8E4M3, Activation::Silu, None), "DTYPE_UNSUPPORTED"),
        fact(
            fused,
            "dtypes",
            here(MLP, "by_dtype!(a.x.dtype(), FUSED, T => {"),
            "spr",
            mlp_in(Op::Mlp, DType::F32, Activation::Silu, None),
        ),
        fact(fused, "activations", silu(), "spr", mlp(Op::Mlp, Activation::Silu)),
        fact(fused, "activations", gelu(), "spr", mlp(Op::Mlp, Activation::Gelu)),
        fact(fused, "activations", gelu_tanh(), "spr", mlp(Op::Mlp, Activation::GeluTanh)),
        fact(
            fused,
            "strides",
            here(MLP, "let x = rows_view(&a.x, holder)?;"),
            "spr",
            strided(mlp(Op::Mlp, Activation::Silu), "x"),
        ),
        fact(fused, "layouts", mlp_dims(), "spr", mlp_in(Op::Mlp, DType::BF16, Activation::Silu, Some(Layout::Nt)))
            .rejects(mlp_in(Op::Mlp, DType::BF16, Activation::Silu, Some(Layout::Nn)), "LAYOUT_UNSUPPORTED"),
        fact(chain, "dtypes", mlp_dims(), "spr", mlp(Op::Mlp, Activation::Gelu))
            .rejects(mlp_in(Op::Mlp, DType::Fp8E5M2, Activation::Gelu, None), "DTYPE_UNSUPPORTED"),
        fact(chain, "dtypes", mlp_dims(), "spr", mlp_in(Op::Mlp, DType::F16, Activation::Gelu, None)),
        fact(chain, "activations", silu(), "spr", mlp(Op::Mlp, Activation::Silu)),
        fact(chain, "activations", gelu(), "spr", mlp(Op::Mlp, Activation::Gelu)),
        fact(chain, "activations", gelu_tanh(), "spr", mlp(Op::Mlp, Activation::GeluTanh)),
        fact(
            chain,
            "strides",
            here(MLP, "wu: Mat::of(&a.w_up),"),
            "spr",
            strided(mlp(Op::Mlp, Activation::Silu), "w_up"),
        ),
        fact(chain, "layouts", mlp_dims(), "spr", mlp_in(Op::Mlp, DType::BF16, Activation::Gelu, Some(Layout::Nt)))
            .rejects(mlp_in(Op::Mlp, DType::BF16, Activation::Gelu, Some(Layout::Nn)), "LAYOUT_UNSUPPORTED"),
        // The shared MoE check takes float x and weights; a non-float x is refused. An fp8 x
        // would be read too, but is not declared (untested): declined.
        fact(
            moe,
            "dtypes",
            here(MOE, "let d = crate::backend::cpu_reference::moe::dims(a)?;"),
            "spr",
            mlp(Op::MoeExperts, Activation::Silu),
        )
        .rejects(mlp_in(Op::MoeExperts, DType::I8, Activation::Silu, None), "DTYPE_UNSUPPORTED"),
        fact(
            moe,
            "dtypes",
            here(MOE, "HostTensor::from_f32_as(a.x.dtype(), &out_shape, &out).map_err(failed)"),
            "spr",
            mlp_in(Op::MoeExperts, DType::F32, Activation::Silu, None),
        ),
        fact(
            moe,
            "activations",
            here(MOE, "Activation::Silu => x / (1.0 + (-x).exp()),"),
            "spr",
            mlp(Op::MoeExperts, Activation::Silu),
        ),
        fact(
            moe,
            "activations",
            here(MOE, "Activation::Gelu => 0.5 * x"),
            "spr",
            mlp(Op::MoeExperts, Activation::Gelu),
        ),
        fact(
            moe,
            "activations",
            here(MOE, "0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())"),
            "spr",
            mlp(Op::MoeExperts, Activation::GeluTanh),
        ),
        fact(
            moe,
            "strides",
            here(MOE, "let x = f32_cow(&a.x);"),
            "spr",
            strided(mlp(Op::MoeExperts, Activation::Silu), "x"),
        ),
        fact(
            patch,
            "dtypes",
            here(PATCH, "by_dtype!(a.image.dtype(), PATCH_EMBED, T => {"),
            "spr",
            patch_in(DType::F32, Some(Layout::Nhwc)),
        ),
        fact(
            patch,
            "dtypes",
            here(PATCH, "by_dtype!(a.image.dtype(), PATCH_EMBED, T => {"),
            "spr",
            patch_in(DType::BF16, Some(Layout::Nhwc)),
        ),
        // An NCHW image is refused (selection plans its copy to NHWC where adaptation is allowed).
        fact(patch, "layouts", here(PATCH, "if !g.nhwc {"), "spr", patch_in(DType::F32, Some(Layout::Nhwc)))
            .rejects(patch_in(DType::F32, None), "LAYOUT_UNSUPPORTED"),
        // A patch row that is not packed is gathered pixel by pixel through the strides.
        fact(patch, "strides", here(PATCH, "read_f32(st, base + v * sw, sc, px);"), "spr", permuted),
    ]
}
