//! Our CPU kernels' facts (`capabilities/cpu.json`), each held to the line of our code that
//! implements or enforces it.
//!
//! Where a declared limit is narrower than what the code computes (a conservative
//! declaration: the code would run the request, but it is not tested there), the row cites
//! the line that does the work and says so.

use layerzero::model::attrs::{GegluAttrs, GeluApproximate, GeluAttrs, MoeRouteAttrs, RopeScaling};

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

/// `req` with its attention attributes set to `a`.
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
