//! Our CPU kernels' row-wise rows: RoPE, the norms, the activations, embedding, sampling and
//! MoE routing.

use layerzero::model::attrs::{GegluAttrs, GeluApproximate, GeluAttrs, MoeRouteAttrs, RopeScaling};

use super::*;

const ROPE: &str = "backends/cpu/src/rope.rs";
const NORM: &str = "backends/cpu/src/norm.rs";
const ROWS: &str = "backends/cpu/src/rows.rs";
const ACTIVATION: &str = "backends/cpu/src/activation.rs";
const EMBEDDING: &str = "backends/cpu/src/embedding.rs";
const SAMPLE: &str = "backends/cpu/src/sample.rs";

/// A RoPE request on `[1, 16, 8, 128]` queries of `dtype`.
fn rope_in(dtype: DType) -> Request {
    Request::new(Op::Rope).tensor("q", TensorDesc::new(dtype, [1, 16, 8, 128]).with_layout(Layout::Bshd))
}

pub(super) fn rope_facts() -> TestResult<Vec<Fact>> {
    let k = "cpu.rope.fast";
    let scaled = RopeAttrs { scaling: Some(RopeScaling::Linear { factor: 2.0 }), ..RopeAttrs::default() };
    let bhsd_q =
        Request::new(Op::Rope).tensor("q", TensorDesc::new(DType::BF16, [1, 8, 16, 128]).with_layout(Layout::Bhsd));
    // q [1, 16, 8, 128] read every other element.
    let strided_q = Request::new(Op::Rope).tensor(
        "q",
        TensorDesc::new(DType::BF16, [1, 16, 8, 128]).with_layout(Layout::Bshd).with_strides([32768, 2048, 256, 2]),
    );
    Ok(vec![
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
    ])
}

/// A norm of `[64, 4096]` rows in `dtype` (weight too), with a residual when asked.
fn norm_in(op: Op, dtype: DType, residual: bool) -> Request {
    let req = Request::new(op)
        .tensor("x", TensorDesc::new(dtype, [64, 4096]))
        .tensor("weight", TensorDesc::new(dtype, [4096]));
    if residual { req.tensor("residual", TensorDesc::new(dtype, [64, 4096])) } else { req }
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

pub(super) fn row_facts() -> TestResult<Vec<Fact>> {
    let (rms, ln) = ("cpu.rms_norm.fast", "cpu.layer_norm.fast");
    let (swiglu, geglu, gelu, silu) = ("cpu.swiglu.fast", "cpu.geglu.fast", "cpu.gelu.fast", "cpu.silu.fast");
    let (embedding, sample, route) = ("cpu.embedding.fast", "cpu.sample.fast", "cpu.moe_route.fast");
    // `by_dtype!` runs f32, f16 and bf16 and refuses any other dtype as Unsupported.
    let by_dtype = || here(ROWS, "computes f32, f16 and bf16; it was given {other}");
    Ok(vec![
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
            here(ROWS, "View::of(t, t.shape(), t.strides(), t.offset())"),
            "spr",
            strided(norm_in(Op::RmsNorm, DType::BF16, false), "x")?,
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
            here(ROWS, "View::of(t, t.shape(), t.strides(), t.offset())"),
            "spr",
            strided(norm_in(Op::LayerNorm, DType::BF16, false), "x")?,
        ),
        fact(
            swiglu,
            "dtypes",
            here(ACTIVATION, "by_dtype!(x.dtype(), kernel, T => run_gated::<T>(act, &g, &u, &shape, bufs))"),
            "spr",
            glu(Op::Swiglu, true, DType::BF16),
        )
        .rejects(glu(Op::Swiglu, true, DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        fact(
            swiglu,
            "dtypes",
            here(ACTIVATION, "by_dtype!(gate.dtype(), kernel, T => run_gated::<T>(act, &g, &u, &shape, bufs))"),
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
            strided(glu(Op::Swiglu, true, DType::BF16), "x")?,
        ),
        fact(
            geglu,
            "dtypes",
            here(ACTIVATION, "by_dtype!(x.dtype(), kernel, T => run_gated::<T>(act, &g, &u, &shape, bufs))"),
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
            strided(glu(Op::Geglu, false, DType::BF16), "up")?,
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
            strided(unary_in(Op::Gelu, DType::BF16), "x")?,
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
            strided(unary_in(Op::Silu, DType::BF16), "x")?,
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
            strided(embed_in(DType::BF16), "table")?,
        ),
        // Any float dtype is read as f32 (`f32_cow`); a non-float one is refused. fp8 logits
        // would be read too, but are not declared (untested): declined.
        fact(sample, "dtypes", here(SAMPLE, "if !logits.dtype().is_float() {"), "spr", sample_in(DType::BF16, 128256))
            .rejects(sample_in(DType::I8, 128256), "DTYPE_UNSUPPORTED"),
        fact(sample, "dtypes", here(SAMPLE, "let data = f32_cow(logits);"), "spr", sample_in(DType::F16, 128256)),
        fact(
            sample,
            "strides",
            here(PACK, "Cow::Owned(t.to_f32_vec())"),
            "spr",
            strided(sample_in(DType::BF16, 128256), "logits")?,
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
            strided(route_in(DType::BF16, 64), "logits")?,
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
    ])
}
