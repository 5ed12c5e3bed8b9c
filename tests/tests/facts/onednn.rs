//! oneDNN facts (`capabilities/onednn.json`), each held to its upstream line: the primitive
//! kernels at the 3.2.0 release the capability file names, the Graph API SDPA pattern at the
//! 3.14.0 sources its kernel names. oneDNN is CPU only: the rows run on the CPU profiles (spr:
//! AVX-512 with BF16, FP16 and AMX; zen4: AVX-512 with BF16, no FP16; icx: AVX-512 with VNNI, no
//! BF16; zen3: AVX2 only).

use layerzero::model::attrs::{GegluAttrs, GeluApproximate, GeluAttrs};

use super::*;

/// oneDNN 3.2.0 (the release branch commit `capabilities/onednn.json` names).
const ONEDNN_3_2: &str = "uxlfoundation/oneDNN@40112196287e8866a7259df35f817229454d0c96";
/// oneDNN 3.14.0 sources, where the Graph API SDPA facts were read.
const ONEDNN_3_14: &str = "uxlfoundation/oneDNN@3f27bec21fdce6b550f233bf6e0afd086ee8d543";

const SDPA: &str = "onednn.attention.sdpa_graph";
const SDPA_DOC: &str = "doc/graph_api/fusion_patterns/sdpa.md";

/// The measured parity cases of the oneDNN executors (this repository's test).
const PARITY: &str = "tests/tests/onednn.rs";
/// The oneDNN executors of the row-wise ops (this repository).
const ROWS: &str = "backends/onednn/src/rows.rs";

fn sdpa(dtype: DType) -> Request {
    attention(dtype, 2, 128, 128, 16, 16, 64)
}

/// A `[2, 16, 128, 64]` BHSD attention request (heads before the sequence).
fn bhsd(dtype: DType) -> TestResult<Request> {
    head_major(attention(dtype, 2, 128, 128, 16, 16, 64))
}

fn masked(req: Request, dtype: DType, shape: [u64; 4]) -> Request {
    req.tensor("mask", TensorDesc::new(dtype, shape))
}

/// A row-wise request of `op` in `dtype` over `[64, 4096]` rows: `x` (and a weight for
/// layer_norm), or the separate `gate` and `up` of the gated ops.
fn act(op: Op, dtype: DType) -> Request {
    let t = TensorDesc::new(dtype, [64, 4096]);
    let req = Request::new(op);
    match op {
        Op::LayerNorm => req.tensor("x", t).tensor("weight", TensorDesc::new(dtype, [4096])),
        Op::Swiglu | Op::Geglu => req.tensor("gate", t.clone()).tensor("up", t),
        _ => req.tensor("x", t),
    }
}

/// A bf16 GeGLU request, separate gate and up, with GELU `approximate`.
fn geglu(approximate: GeluApproximate) -> Request {
    act(Op::Geglu, DType::BF16).attrs(Attrs::Geglu(GegluAttrs { split: false, approximate }))
}

/// The split form of a gated op: `x` holds gate and up, `[64, 8192]`.
fn split(op: Op) -> Request {
    let attrs = match op {
        Op::Geglu => Attrs::Geglu(GegluAttrs { split: true, approximate: GeluApproximate::None }),
        _ => Attrs::Swiglu(SwigluAttrs { split: true }),
    };
    Request::new(op).attrs(attrs).tensor("x", TensorDesc::new(DType::BF16, [64, 8192]))
}

fn gelu(approximate: GeluApproximate) -> Request {
    act(Op::Gelu, DType::F32).attrs(Attrs::Gelu(GeluAttrs { approximate }))
}

/// An int8 `[64, 4096] x [4096, 4096]` linear with one activation scale per row and one weight
/// scale per output column.
fn w8a8() -> Request {
    Request::new(Op::LinearW8a8)
        .tensor("x", TensorDesc::new(DType::I8, [64, 4096]))
        .tensor("x_scale", TensorDesc::new(DType::F32, [64]))
        .tensor("weight", TensorDesc::new(DType::I8, [4096, 4096]))
        .tensor("w_scale", TensorDesc::new(DType::F32, [4096]))
}

fn linear_nn(dtype: DType) -> Request {
    Request::new(Op::Linear)
        .tensor("x", TensorDesc::new(dtype, [64, 4096]))
        .tensor("weight", TensorDesc::new(dtype, [4096, 4096]).with_layout(Layout::Nn))
}

/// The bf16 and f16 rows every 3.2 primitive kernel shares: its gate is
/// `platform::has_data_type_support` (bf16: AVX-512 core, f16: AVX-512 FP16; the AVX2 +
/// NE_CONVERT path is off by default in 3.2). `bf16_req` and `f16_req` are the kernel's
/// request in each dtype.
fn low_precision(kernel: &'static str, bf16_req: impl Fn() -> Request, f16_req: impl Fn() -> Request) -> [Fact; 2] {
    [
        fact(kernel, "dtype_requirements", src(ONEDNN_3_2, "src/cpu/platform.cpp:114"), "icx", bf16_req()).rejects_on(
            "zen3",
            bf16_req(),
            "DTYPE_UNSUPPORTED_ON_HARDWARE",
        ),
        fact(kernel, "dtype_requirements", src(ONEDNN_3_2, "src/cpu/platform.cpp:125"), "spr", f16_req()).rejects_on(
            "zen4",
            f16_req(),
            "DTYPE_UNSUPPORTED_ON_HARDWARE",
        ),
    ]
}

pub(super) fn facts() -> TestResult<Vec<Fact>> {
    let mut rows = vec![
        // Graph API SDPA (3.14.0).
        fact(SDPA, "dtypes", src(ONEDNN_3_14, &format!("{SDPA_DOC}:155")), "spr", sdpa(DType::F32))
            .rejects(sdpa(DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        fact(SDPA, "dtype_requirements", src(ONEDNN_3_14, "src/cpu/platform.cpp:120"), "icx", sdpa(DType::BF16))
            .rejects_on("zen3", sdpa(DType::BF16), "DTYPE_UNSUPPORTED_ON_HARDWARE"),
        fact(SDPA, "dtype_requirements", src(ONEDNN_3_14, "src/cpu/platform.cpp:135"), "spr", sdpa(DType::F16))
            .rejects_on("zen4", sdpa(DType::F16), "DTYPE_UNSUPPORTED_ON_HARDWARE"),
        fact(
            SDPA,
            "different_v_head_dim",
            src(ONEDNN_3_14, &format!("{SDPA_DOC}:188")),
            "spr",
            sdpa(DType::BF16).tensor("v", TensorDesc::new(DType::BF16, [2, 128, 16, 32]).with_layout(Layout::Bshd)),
        ),
        // The implicit causal mask comes top-left or bottom-right aligned.
        fact(
            SDPA,
            "causal",
            src(ONEDNN_3_14, &format!("{SDPA_DOC}:72")),
            "spr",
            top_left(attention(DType::BF16, 2, 64, 128, 16, 16, 64)),
        ),
        fact(
            SDPA,
            "causal",
            src(ONEDNN_3_14, &format!("{SDPA_DOC}:72")),
            "spr",
            attrs(attention(DType::BF16, 2, 64, 128, 16, 16, 64), layerzero_tests::causal()),
        ),
        // A boolean keep-mask through Select, an additive one through Add.
        fact(
            SDPA,
            "masks",
            src(ONEDNN_3_14, &format!("{SDPA_DOC}:63")),
            "spr",
            masked(sdpa(DType::BF16), DType::Bool, [2, 16, 128, 128]),
        ),
        fact(
            SDPA,
            "masks",
            src(ONEDNN_3_14, &format!("{SDPA_DOC}:58")),
            "spr",
            masked(sdpa(DType::BF16), DType::BF16, [2, 16, 128, 128]),
        ),
        // Conservative: the mask is added to the f32 scores, and Add also takes an f32 operand
        // with a bf16/f16 one (Add.md l.52-53); the file declares the mask in q's dtype only.
        fact(
            SDPA,
            "float_mask_matches_q",
            src(ONEDNN_3_14, "doc/graph_api/operations/Add.md:50"),
            "spr",
            masked(sdpa(DType::BF16), DType::BF16, [2, 16, 128, 128]),
        )
        .rejects(masked(sdpa(DType::BF16), DType::F32, [2, 16, 128, 128]), "MASK_DTYPE_MISMATCH"),
        fact(
            SDPA,
            "mask_broadcast",
            src(ONEDNN_3_14, &format!("{SDPA_DOC}:183")),
            "spr",
            masked(sdpa(DType::BF16), DType::BF16, [1, 1, 128, 128]),
        ),
        fact(
            SDPA,
            "custom_scale",
            src(ONEDNN_3_14, &format!("{SDPA_DOC}:47")),
            "spr",
            attrs(sdpa(DType::BF16), AttentionAttrs { scale: Some(0.05), ..AttentionAttrs::default() }),
        ),
        // (N, H, S, D) is BHSD; a BSHD tensor is the same logical tensor with other strides. No
        // attention request has a third layout to reject.
        fact(SDPA, "layouts", src(ONEDNN_3_14, &format!("{SDPA_DOC}:186")), "spr", bhsd(DType::BF16)?),
        fact(SDPA, "layouts", src(ONEDNN_3_14, &format!("{SDPA_DOC}:186")), "spr", sdpa(DType::BF16)),
        // Conservative: the optimized CPU path is described for plain 4-D (N, H, S, D) tensors;
        // a strided last dim is not claimed.
        fact(SDPA, "strides", src(ONEDNN_3_14, &format!("{SDPA_DOC}:186")), "spr", sdpa(DType::BF16))
            .rejects(strided_v(sdpa(DType::BF16))?, "LAST_DIM_NOT_CONTIGUOUS"),
        // GeGLU (eltwise gelu, then a binary multiply).
        // Measured: f32 is left out for a 1.9e-6 error of v3.2's JIT gelu_erf times up; the
        // parity test holds the bf16 and f16 cases only.
        fact(
            "onednn.geglu.eltwise_mul",
            "dtypes",
            here(PARITY, r#"("onednn.geglu.eltwise_mul", &["separate/f16", "separate/bf16"])"#),
            "spr",
            act(Op::Geglu, DType::BF16),
        )
        .rejects(act(Op::Geglu, DType::F32), "DTYPE_UNSUPPORTED"),
        // Measured: v3.2 returned dnnl_unimplemented for the split form; the executor binds
        // dense gate and up only.
        fact(
            "onednn.geglu.eltwise_mul",
            "glu_forms",
            here(ROWS, "Dense operands only: the split form"),
            "spr",
            act(Op::Geglu, DType::BF16),
        )
        .rejects(split(Op::Geglu), "ATTR_UNSUPPORTED"),
        fact(
            "onednn.geglu.eltwise_mul",
            "gelu_approximations",
            src(ONEDNN_3_2, "include/oneapi/dnnl/dnnl_types.h:1937"),
            "spr",
            geglu(GeluApproximate::None),
        ),
        fact(
            "onednn.geglu.eltwise_mul",
            "gelu_approximations",
            src(ONEDNN_3_2, "include/oneapi/dnnl/dnnl_types.h:1925"),
            "spr",
            geglu(GeluApproximate::Tanh),
        ),
        // GELU.
        fact(
            "onednn.gelu.eltwise",
            "dtypes",
            src(ONEDNN_3_2, "doc/primitives/eltwise.md:123"),
            "zen3",
            gelu(GeluApproximate::None),
        )
        .rejects(act(Op::Gelu, DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        fact(
            "onednn.gelu.eltwise",
            "gelu_approximations",
            src(ONEDNN_3_2, "include/oneapi/dnnl/dnnl_types.h:1937"),
            "zen3",
            gelu(GeluApproximate::None),
        ),
        fact(
            "onednn.gelu.eltwise",
            "gelu_approximations",
            src(ONEDNN_3_2, "include/oneapi/dnnl/dnnl_types.h:1925"),
            "zen3",
            gelu(GeluApproximate::Tanh),
        ),
        // Layer normalization.
        fact(
            "onednn.layer_norm.lnorm",
            "dtypes",
            src(ONEDNN_3_2, "doc/primitives/layer_normalization.md:144"),
            "zen3",
            act(Op::LayerNorm, DType::F32),
        )
        .rejects(act(Op::LayerNorm, DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        // Linear (matmul).
        fact(
            "onednn.linear.matmul",
            "dtypes",
            src(ONEDNN_3_2, "doc/primitives/matmul.md:94"),
            "zen3",
            linear_of(DType::F32),
        )
        .rejects(linear_of(DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        // Measured: below AVX2 v3.2's f32 matmul runs the gemm driver's SSE4.1 kernel, which
        // missed the f32 tolerance here. Every CPU profile has AVX2: nothing to reject.
        fact(
            "onednn.linear.matmul",
            "dtype_requirements",
            src(ONEDNN_3_2, "src/cpu/gemm/gemm.cpp:137"),
            "zen3",
            linear_of(DType::F32),
        ),
        // The weights need `n` or `k` contiguous: [out, in] (NT) or [in, out] (NN).
        fact(
            "onednn.linear.matmul",
            "weight_layouts",
            src(ONEDNN_3_2, "doc/primitives/matmul.md:118"),
            "zen3",
            linear_of(DType::F32),
        ),
        fact(
            "onednn.linear.matmul",
            "weight_layouts",
            src(ONEDNN_3_2, "doc/primitives/matmul.md:118"),
            "zen3",
            linear_nn(DType::F32),
        ),
        // Int8 linear: s8 x s8 (the op has no other dtype to reject). The wrapper passes one
        // scale per row (no group_sizes declared), so block scales (Q8_0's) are refused.
        fact("onednn.linear_w8a8.matmul", "dtypes", src(ONEDNN_3_2, "doc/primitives/matmul.md:97"), "icx", w8a8())
            .rejects(super::reference::linear::w8a8_blocks(32), "ATTR_UNSUPPORTED"),
        // Measured: without VNNI the s8 x s8 pair sums saturate in int16 (vpmaddubsw).
        fact(
            "onednn.linear_w8a8.matmul",
            "dtype_requirements",
            src(ONEDNN_3_2, "doc/advanced/int8_computations.md:85"),
            "icx",
            w8a8(),
        )
        .rejects_on("zen3", w8a8(), "DTYPE_UNSUPPORTED_ON_HARDWARE"),
        // SiLU (eltwise swish, alpha 1).
        fact(
            "onednn.silu.eltwise",
            "dtypes",
            src(ONEDNN_3_2, "doc/primitives/eltwise.md:123"),
            "zen3",
            act(Op::Silu, DType::F32),
        )
        .rejects(act(Op::Silu, DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        // SwiGLU (eltwise swish, then a binary multiply).
        fact(
            "onednn.swiglu.eltwise_mul",
            "dtypes",
            src(ONEDNN_3_2, "doc/primitives/binary.md:87"),
            "zen3",
            act(Op::Swiglu, DType::F32),
        )
        .rejects(act(Op::Swiglu, DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        // Measured, as GeGLU's.
        fact(
            "onednn.swiglu.eltwise_mul",
            "glu_forms",
            here(ROWS, "Dense operands only: the split form"),
            "spr",
            act(Op::Swiglu, DType::BF16),
        )
        .rejects(split(Op::Swiglu), "ATTR_UNSUPPORTED"),
    ];
    rows.extend(low_precision(
        "onednn.geglu.eltwise_mul",
        || act(Op::Geglu, DType::BF16),
        || act(Op::Geglu, DType::F16),
    ));
    rows.extend(low_precision("onednn.gelu.eltwise", || act(Op::Gelu, DType::BF16), || act(Op::Gelu, DType::F16)));
    rows.extend(low_precision(
        "onednn.layer_norm.lnorm",
        || act(Op::LayerNorm, DType::BF16),
        || act(Op::LayerNorm, DType::F16),
    ));
    rows.extend(low_precision("onednn.linear.matmul", || linear_of(DType::BF16), || linear_of(DType::F16)));
    rows.extend(low_precision("onednn.silu.eltwise", || act(Op::Silu, DType::BF16), || act(Op::Silu, DType::F16)));
    rows.extend(low_precision(
        "onednn.swiglu.eltwise_mul",
        || act(Op::Swiglu, DType::BF16),
        || act(Op::Swiglu, DType::F16),
    ));
    Ok(rows)
}
