//! The reference kernels' row-wise rows: RoPE, the norms, the activations, embedding, sampling
//! and MoE routing.

use layerzero::model::attrs::{GegluAttrs, GeluApproximate, GeluAttrs, RopeScaling};

use super::*;

const ROPE: &str = "backends/reference/src/rope.rs";
const NORM: &str = "backends/reference/src/norm.rs";
const EMBEDDING: &str = "backends/reference/src/embedding.rs";
const SAMPLE: &str = "backends/reference/src/sample.rs";
const CHECK_NORM: &str = "core/src/exec/check/norm.rs";

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

pub(super) fn row_ops() -> TestResult<Vec<Fact>> {
    let fp8 = DType::Fp8E4M3;
    let rms = || rows_of(Op::RmsNorm, Attrs::Norm(NormAttrs::default()), 4096);
    let residual = |req: Request| req.tensor("residual", TensorDesc::new(DType::BF16, [64, 4096]));
    let rope = |style| rope_of(style);
    Ok(vec![
        // rope
        fact("cpu_reference.rope.naive", "dtypes", here(ROPE, "let result = from_f64_as(t.dtype()"), "spr", {
            rope(RopeStyle::RotateHalf)
        })
        .rejects(retyped(rope(RopeStyle::RotateHalf), &["q"], fp8)?, "DTYPE_UNSUPPORTED"),
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
            strided(rope(RopeStyle::RotateHalf), "q")?,
        ),
        // rms_norm
        fact("cpu_reference.rms_norm.naive", "dtypes", here(CHECK_NORM, "expect_float(\"x\", x)?;"), "spr", rms())
            .rejects(retyped(rms(), &["x", "weight"], fp8)?, "DTYPE_UNSUPPORTED"),
        fact(
            "cpu_reference.rms_norm.naive",
            "fused_residual",
            here(NORM, "\"residual_out\", from_f64_as(dtype, a.x.shape(), &s)"),
            "spr",
            residual(rms()),
        ),
        fact("cpu_reference.rms_norm.naive", "strides", here(NORM, "let mut s = a.x.to_f64_vec();"), "spr", {
            strided(rms(), "x")?
        }),
        // layer_norm
        fact(
            "cpu_reference.layer_norm.naive",
            "dtypes",
            here(CHECK_NORM, "expect_float(\"x\", x)?;"),
            "spr",
            layer_norm(),
        )
        .rejects(retyped(layer_norm(), &["x", "weight", "bias"], fp8)?, "DTYPE_UNSUPPORTED"),
        fact(
            "cpu_reference.layer_norm.naive",
            "fused_residual",
            here(NORM, "\"residual_out\", from_f64_as(dtype, a.x.shape(), &x)"),
            "spr",
            residual(layer_norm()),
        ),
        fact("cpu_reference.layer_norm.naive", "strides", here(NORM, "let mut x = a.x.to_f64_vec();"), "spr", {
            strided(layer_norm(), "x")?
        }),
        // swiglu
        fact(
            "cpu_reference.swiglu.naive",
            "dtypes",
            here(ACTIVATION, "from_f64_as(dtype, &shape, &v)"),
            "spr",
            swiglu(true),
        )
        .rejects(retyped(swiglu(true), &["x"], fp8)?, "DTYPE_UNSUPPORTED"),
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
            strided(swiglu(true), "x")?
        }),
        // geglu
        fact("cpu_reference.geglu.naive", "dtypes", here(ACTIVATION, "from_f64_as(dtype, &shape, &v)"), "spr", {
            geglu(true, GeluApproximate::None)
        })
        .rejects(retyped(geglu(true, GeluApproximate::None), &["x"], fp8)?, "DTYPE_UNSUPPORTED"),
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
            strided(geglu(false, GeluApproximate::Tanh), "up")?,
        ),
        // gelu
        fact("cpu_reference.gelu.naive", "dtypes", here(ACTIVATION, "from_f64_as(x.dtype(), x.shape(), &v)"), "spr", {
            gelu(GeluApproximate::None)
        })
        .rejects(retyped(gelu(GeluApproximate::None), &["x"], fp8)?, "DTYPE_UNSUPPORTED"),
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
            strided(gelu(GeluApproximate::Tanh), "x")?
        }),
        // silu
        fact("cpu_reference.silu.naive", "dtypes", here(ACTIVATION, "from_f64_as(x.dtype(), x.shape(), &v)"), "spr", {
            unary(Op::Silu, Attrs::None(Default::default()))
        })
        .rejects(retyped(unary(Op::Silu, Attrs::None(Default::default())), &["x"], fp8)?, "DTYPE_UNSUPPORTED"),
        fact("cpu_reference.silu.naive", "strides", here(ACTIVATION, "x.to_f64_vec().into_iter().map(act)"), "spr", {
            strided(unary(Op::Silu, Attrs::None(Default::default())), "x")?
        }),
        // embedding
        fact(
            "cpu_reference.embedding.naive",
            "dtypes",
            here(EMBEDDING, "expect_float(\"table\", table)?;"),
            "spr",
            embedding(),
        )
        .rejects(retyped(embedding(), &["table"], fp8)?, "DTYPE_UNSUPPORTED"),
        fact("cpu_reference.embedding.naive", "strides", here(EMBEDDING, "table.at(&[row, c])"), "spr", {
            strided(embedding(), "table")?
        }),
        // sample
        fact("cpu_reference.sample.naive", "dtypes", here(SAMPLE, "expect_float(\"logits\", logits)?;"), "spr", {
            logits(Op::Sample, 8, 32000)
        })
        .rejects(retyped(logits(Op::Sample, 8, 32000), &["logits"], fp8)?, "DTYPE_UNSUPPORTED"),
        fact("cpu_reference.sample.naive", "strides", here(SAMPLE, "let values = logits.to_f64_vec();"), "spr", {
            strided(logits(Op::Sample, 8, 32000), "logits")?
        }),
        // moe_route
        fact("cpu_reference.moe_route.naive", "dtypes", here(MOE, "expect_float(\"logits\", logits)?;"), "spr", {
            logits(Op::MoeRoute, 64, 8)
        })
        .rejects(retyped(logits(Op::MoeRoute, 64, 8), &["logits"], fp8)?, "DTYPE_UNSUPPORTED"),
        fact("cpu_reference.moe_route.naive", "strides", here(MOE, "let values = logits.to_f64_vec();"), "spr", {
            strided(logits(Op::MoeRoute, 64, 8), "logits")?
        }),
        // Its expert ids are i32: more experts than i32 holds are refused (a limit the file
        // did not declare: added).
        fact("cpu_reference.moe_route.naive", "hidden_size", here(MOE, "if i32::try_from(e).is_err() {"), "spr", {
            logits(Op::MoeRoute, 1, i32::MAX as u64)
        })
        .rejects(logits(Op::MoeRoute, 1, i32::MAX as u64 + 1), "HIDDEN_SIZE_UNSUPPORTED"),
    ])
}
