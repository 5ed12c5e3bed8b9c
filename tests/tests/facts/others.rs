//! xFormers, Liger and ZenDNN facts.

use super::*;

const XF: &str = "xformers.attention.cutlass";
const ZEN_SDPA: &str = "zendnn.attention.flash_sdpa";
const ZEN_SDPA_DOC: &str = "docs/operator/low_overhead_operator/lowoha_sdpa_operator.md";
const ZEN_SDPA_CHECKS: &str = "zendnnl/src/lowoha_operators/sdpa/flash_sdpa/lowoha_flash_sdpa_utils.cpp";

/// A `[2, 16, 128, 64]` attention request in `dtype` with a `mask` of `mask` dtype and `shape`.
fn zen_masked(dtype: DType, mask: DType, shape: &[u64]) -> Request {
    attention(dtype, 2, 128, 128, 16, 16, 64).tensor("mask", TensorDesc::new(mask, shape.to_vec()))
}

/// A `[2, 16, 128, d]` BHSD attention request in `dtype`.
fn bhsd_of(dtype: DType, d: u64) -> TestResult<Request> {
    head_major(attention(dtype, 2, 128, 128, 16, 16, d))
}

/// A ragged bf16 batch of 2 sequences packed into 256 tokens (`cu_seqlens_q/k`).
fn ragged() -> Request {
    attention(DType::BF16, 1, 256, 256, 16, 16, 128)
        .tensor("cu_seqlens_q", TensorDesc::new(DType::I32, [3]))
        .tensor("cu_seqlens_k", TensorDesc::new(DType::I32, [3]))
}

/// A RoPE request on `q` of `dtype`, `[1, 16, 8, 128]` BSHD (or its BHSD twin), with `strides`.
fn rope_q(dtype: DType, layout: Layout, strides: Option<[u64; 4]>) -> Request {
    let shape = if layout == Layout::Bhsd { [1, 8, 16, 128] } else { [1, 16, 8, 128] };
    let q = TensorDesc::new(dtype, shape).with_layout(layout);
    let q = match strides {
        Some(s) => q.with_strides(s),
        None => q,
    };
    Request::new(Op::Rope).tensor("q", q)
}

fn rms_of(dtype: DType) -> Request {
    Request::new(Op::RmsNorm)
        .tensor("x", TensorDesc::new(dtype, [64, 4096]))
        .tensor("weight", TensorDesc::new(dtype, [4096]))
}

fn glu_of(dtype: DType) -> Request {
    Request::new(Op::Swiglu)
        .tensor("gate", TensorDesc::new(dtype, [64, 4096]))
        .tensor("up", TensorDesc::new(dtype, [64, 4096]))
}

pub(super) fn facts() -> TestResult<Vec<Fact>> {
    Ok(vec![
        // xFormers cutlassF-pt.
        fact(XF, "head_dim", src(XFORMERS, "xformers/ops/fmha/cutlass.py:173"), "h100", bf16(1, 16, 16, 1, 1, 65536))
            .rejects(bf16(1, 16, 16, 1, 1, 65544), "HEAD_DIM_TOO_LARGE"),
        // 16-bit operands on sm80+: 128 / 16 = 8 elements.
        fact(XF, "head_dim", src(XFORMERS, "xformers/ops/fmha/common.py:581"), "h100", bf16(2, 128, 128, 16, 16, 136))
            .rejects(bf16(2, 128, 128, 16, 16, 100), "HEAD_DIM_ALIGNMENT"),
        // f32 on sm80+: matmul_alignment_mn = 4.
        fact(
            XF,
            "head_dim",
            src(XFORMERS, "xformers/ops/fmha/cutlass.py:59"),
            "h100",
            attention(DType::F32, 2, 128, 128, 16, 16, 100),
        )
        .rejects(attention(DType::F32, 2, 128, 128, 16, 16, 102), "HEAD_DIM_ALIGNMENT"),
        // Below sm80 f32 runs without tensor cores: alignment 1; f16 keeps them on sm7x (8).
        fact(
            XF,
            "head_dim",
            src(XFORMERS, "xformers/ops/fmha/cutlass.py:44"),
            "t4",
            attention(DType::F32, 2, 128, 128, 16, 16, 102),
        )
        .rejects_on("t4", attention(DType::F16, 2, 128, 128, 16, 16, 100), "HEAD_DIM_ALIGNMENT"),
        // GQA as BMGHK: K/V expanded along the heads of each group.
        fact(XF, "gqa", src(XFORMERS, "xformers/ops/fmha/__init__.py:268"), "h100", bf16(2, 128, 128, 32, 8, 128)),
        fact(
            XF,
            "causal",
            src(XFORMERS, "xformers/ops/fmha/cutlass.py:143"),
            "h100",
            top_left(bf16(2, 64, 128, 16, 16, 128)),
        ),
        fact(
            XF,
            "causal",
            src(XFORMERS, "tests/test_mem_eff_attention.py:397"),
            "h100",
            attrs(bf16(2, 64, 128, 16, 16, 128), layerzero_tests::causal()),
        )
        .rejects(attrs(bf16(2, 128, 64, 16, 16, 128), layerzero_tests::causal()), "CAUSAL_SEQ_Q_EXCEEDS_SEQ_K"),
        // The check itself is aten's ("invalid dtype for bias - should match query's dtype", in
        // PyTorch's mem-efficient kernel, outside the xFormers tree); the xFormers tests build
        // the tensor bias in q's dtype.
        fact(
            XF,
            "float_mask_matches_q",
            src(XFORMERS, "xformers/attn_bias_utils.py:71"),
            "h100",
            bf16(2, 128, 128, 16, 16, 128).tensor("mask", TensorDesc::new(DType::BF16, [2, 16, 128, 128])),
        )
        .rejects(
            bf16(2, 128, 128, 16, 16, 128).tensor("mask", TensorDesc::new(DType::F32, [2, 16, 128, 128])),
            "MASK_DTYPE_MISMATCH",
        ),
        fact(
            XF,
            "window",
            src(XFORMERS, "xformers/ops/fmha/cutlass.py:179"),
            "h100",
            windowed(bf16(2, 128, 128, 16, 16, 128)),
        ),
        fact(XF, "varlen", src(XFORMERS, "xformers/ops/fmha/cutlass.py:73"), "h100", ragged()),
        // Any stride(-2) that is a multiple of the alignment: BHSD as well as BSHD. No attention
        // request has a third layout to reject.
        fact(XF, "layouts", src(XFORMERS, "xformers/ops/fmha/common.py:583"), "h100", bhsd_of(DType::BF16, 128)?),
        // ZenDNN flash SDPA.
        fact(
            ZEN_SDPA,
            "masks",
            src(ZENDNN, &format!("{ZEN_SDPA_CHECKS}:148")),
            "zen4",
            zen_masked(DType::BF16, DType::BF16, &[2, 16, 128, 128]),
        )
        .rejects(zen_masked(DType::BF16, DType::Bool, &[2, 16, 128, 128]), "MASK_UNSUPPORTED"),
        // Conservative for bf16/f16: an f32 mask is taken with them too (l.148, l.154); f32
        // q needs an f32 mask (this line).
        fact(
            ZEN_SDPA,
            "float_mask_matches_q",
            src(ZENDNN, &format!("{ZEN_SDPA_CHECKS}:161")),
            "zen4",
            zen_masked(DType::F32, DType::F32, &[2, 16, 128, 128]),
        )
        .rejects(zen_masked(DType::F32, DType::BF16, &[2, 16, 128, 128]), "MASK_DTYPE_MISMATCH"),
        fact(
            ZEN_SDPA,
            "mask_with_causal",
            src(ZENDNN, &format!("{ZEN_SDPA_DOC}:159")),
            "zen4",
            top_left(zen_masked(DType::BF16, DType::BF16, &[2, 16, 128, 128])),
        ),
        // A 2-D [S_q, S_kv] mask broadcast over batch and heads.
        fact(
            ZEN_SDPA,
            "mask_broadcast",
            src(ZENDNN, &format!("{ZEN_SDPA_DOC}:156")),
            "zen4",
            zen_masked(DType::BF16, DType::BF16, &[128, 128]),
        ),
        fact(
            ZEN_SDPA,
            "custom_scale",
            src(ZENDNN, "zendnnl/src/lowoha_operators/sdpa/flash_sdpa/lowoha_flash_sdpa.cpp:102"),
            "zen4",
            attrs(
                attention(DType::BF16, 2, 128, 128, 16, 16, 64),
                AttentionAttrs { scale: Some(0.05), ..AttentionAttrs::default() },
            ),
        ),
        // Per-tensor BHSD strides: a BSHD tensor is the same with other strides.
        fact(ZEN_SDPA, "layouts", src(ZENDNN, &format!("{ZEN_SDPA_DOC}:65")), "zen4", bhsd_of(DType::BF16, 64)?),
        fact(
            "zendnn.linear.matmul",
            "dtypes",
            src(ZENDNN, "docs/operator/low_overhead_operator/lowoha_matmul_operator.md:151"),
            "zen4",
            linear_of(DType::F32),
        )
        .rejects(linear_of(DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        // Liger. No dtype whitelist upstream: the declared f32/f16/bf16 are the float types its
        // helpers name (fp8 not claimed, conservative).
        fact(
            "liger.rms_norm.triton",
            "dtypes",
            src(LIGER, "src/liger_kernel/ops/utils.py:101"),
            "h100",
            rms_of(DType::F32),
        )
        .rejects(rms_of(DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        fact(
            "liger.rope.triton",
            "dtypes",
            src(LIGER, "src/liger_kernel/ops/rope.py:87"),
            "h100",
            rope_q(DType::F32, Layout::Bshd, None),
        )
        .rejects(rope_q(DType::Fp8E4M3, Layout::Bshd, None), "DTYPE_UNSUPPORTED"),
        // q arrives (bsz, n_head, seq, head_dim) and is transposed, then made contiguous.
        fact(
            "liger.rope.triton",
            "layouts",
            src(LIGER, "src/liger_kernel/ops/rope.py:118"),
            "h100",
            rope_q(DType::BF16, Layout::Bhsd, None),
        ),
        fact(
            "liger.rope.triton",
            "strides",
            src(LIGER, "src/liger_kernel/ops/rope.py:131"),
            "h100",
            rope_q(DType::BF16, Layout::Bshd, Some([16 * 8 * 256, 8 * 256, 256, 2])),
        ),
        fact(
            "liger.swiglu.triton",
            "dtypes",
            src(LIGER, "src/liger_kernel/ops/swiglu.py:64"),
            "h100",
            glu_of(DType::F32),
        )
        .rejects(glu_of(DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        fact(
            "xformers.attention.cutlass",
            "masks",
            src(XFORMERS, "xformers/ops/fmha/cutlass.py:174"),
            "h100",
            bf16(2, 128, 128, 16, 16, 128).tensor("mask", TensorDesc::new(DType::BF16, [2, 16, 128, 128])),
        )
        .rejects(
            bf16(2, 128, 128, 16, 16, 128).tensor("mask", TensorDesc::new(DType::Bool, [2, 16, 128, 128])),
            "MASK_UNSUPPORTED",
        ),
        fact(
            "xformers.attention.cutlass",
            "mask_with_causal",
            src(XFORMERS, "xformers/ops/fmha/cutlass.py:180"),
            "h100",
            attrs(
                bf16(2, 128, 128, 16, 16, 128).tensor("mask", TensorDesc::new(DType::BF16, [2, 16, 128, 128])),
                AttentionAttrs { causal: true, ..AttentionAttrs::default() },
            ),
        ),
        // A mask's rows must start on 16-byte boundaries: 127 bf16 keys per row do not.
        fact(
            "xformers.attention.cutlass",
            "aligned_strides",
            src(XFORMERS, "xformers/ops/fmha/cutlass.py:101"),
            "h100",
            bf16(2, 128, 128, 16, 16, 128).tensor("mask", TensorDesc::new(DType::BF16, [2, 16, 128, 128])),
        )
        .rejects(
            bf16(2, 128, 127, 16, 16, 128).tensor("mask", TensorDesc::new(DType::BF16, [2, 16, 128, 127])),
            "STRIDE_ALIGNMENT",
        ),
        fact(
            "xformers.attention.cutlass",
            "compute_capability",
            src(XFORMERS, "xformers/ops/fmha/cutlass.py:170"),
            "h100",
            bf16(2, 128, 128, 16, 16, 128),
        )
        .rejects_on("b200", bf16(2, 128, 128, 16, 16, 128), "COMPUTE_CAPABILITY_TOO_NEW"),
        fact(
            "xformers.attention.cutlass",
            "dtypes",
            src(XFORMERS, "xformers/ops/fmha/cutlass.py:172"),
            "h100",
            attention(DType::F32, 2, 128, 128, 16, 16, 128),
        )
        .rejects(attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED"),
        fact(
            "xformers.attention.cutlass",
            "dtype_requirements",
            src(XFORMERS, "xformers/ops/fmha/common.py:494"),
            "a100",
            bf16(2, 128, 128, 16, 16, 128),
        )
        .rejects_on("t4", bf16(2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED_ON_HARDWARE"),
        fact(
            "xformers.attention.cutlass",
            "dropout",
            src(XFORMERS, "xformers/ops/fmha/cutlass.py:188"),
            "h100",
            dropped(bf16(2, 128, 128, 16, 16, 128)),
        ),
        fact(
            "xformers.attention.cutlass",
            "custom_scale",
            src(XFORMERS, "xformers/ops/fmha/cutlass.py:189"),
            "h100",
            attrs(bf16(2, 128, 128, 16, 16, 128), AttentionAttrs { scale: Some(0.05), ..AttentionAttrs::default() }),
        ),
        fact(
            "xformers.attention.cutlass",
            "different_v_head_dim",
            src(XFORMERS, "xformers/ops/fmha/cutlass.py:190"),
            "h100",
            bf16(2, 128, 128, 16, 16, 128)
                .tensor("v", TensorDesc::new(DType::BF16, [2, 128, 16, 64]).with_layout(Layout::Bshd)),
        ),
        fact(
            "xformers.attention.cutlass",
            "strides",
            src(XFORMERS, "xformers/ops/fmha/common.py:588"),
            "h100",
            bf16(2, 128, 128, 16, 16, 128),
        )
        .rejects(strided_v(bf16(2, 128, 128, 16, 16, 128))?, "LAST_DIM_NOT_CONTIGUOUS"),
        fact(
            "liger.rms_norm.triton",
            "hidden_size",
            src(LIGER, "src/liger_kernel/ops/utils.py:62"),
            "h100",
            rows_of(Op::RmsNorm, Attrs::Norm(NormAttrs::default()), 65536),
        )
        .rejects(rows_of(Op::RmsNorm, Attrs::Norm(NormAttrs::default()), 65537), "HIDDEN_SIZE_UNSUPPORTED"),
        // `ensure_contiguous` copies inside the library: any strides are taken as given.
        fact(
            "liger.rms_norm.triton",
            "strides",
            src(LIGER, "src/liger_kernel/ops/utils.py:44"),
            "h100",
            rows_of(Op::RmsNorm, Attrs::Norm(NormAttrs::default()), 4096)
                .tensor("x", TensorDesc::new(DType::BF16, [64, 4096]).with_strides([8192, 2])),
        ),
        fact(
            "liger.swiglu.triton",
            "hidden_size",
            src(LIGER, "src/liger_kernel/ops/utils.py:62"),
            "h100",
            rows_of(Op::Swiglu, Attrs::Swiglu(SwigluAttrs { split: true }), 2 * 65536),
        )
        .rejects(rows_of(Op::Swiglu, Attrs::Swiglu(SwigluAttrs { split: true }), 2 * 65540), "HIDDEN_SIZE_UNSUPPORTED"),
        fact(
            "liger.swiglu.triton",
            "glu_forms",
            src(LIGER, "src/liger_kernel/ops/swiglu.py:410"),
            "h100",
            rows_of(Op::Swiglu, Attrs::Swiglu(SwigluAttrs { split: true }), 8192),
        ),
        fact(
            "liger.swiglu.triton",
            "strides",
            src(LIGER, "src/liger_kernel/ops/swiglu.py:419"),
            "h100",
            rows_of(Op::Swiglu, Attrs::Swiglu(SwigluAttrs { split: true }), 8192)
                .tensor("x", TensorDesc::new(DType::BF16, [64, 8192]).with_strides([16384, 2])),
        ),
        fact(
            "liger.rope.triton",
            "rope_styles",
            src(LIGER, "src/liger_kernel/ops/rope.py:92"),
            "h100",
            rope_of(RopeStyle::RotateHalf),
        )
        .rejects(rope_of(RopeStyle::Interleaved), "ATTR_UNSUPPORTED"),
        fact(
            "zendnn.attention.flash_sdpa",
            "dtype_requirements",
            src(ZENDNN, "zendnnl/src/lowoha_operators/sdpa/flash_sdpa/lowoha_sdpa_flash_cpu.cpp:837"),
            "spr",
            attention(DType::F16, 1, 256, 256, 16, 16, 64),
        )
        .rejects_on("zen4", attention(DType::F16, 1, 256, 256, 16, 16, 64), "DTYPE_UNSUPPORTED_ON_HARDWARE"),
        fact(
            "zendnn.attention.flash_sdpa",
            "dtypes",
            src(ZENDNN, "zendnnl/src/lowoha_operators/sdpa/flash_sdpa/lowoha_flash_sdpa_utils.cpp:119"),
            "zen4",
            attention(DType::BF16, 1, 256, 256, 16, 16, 64),
        )
        .rejects(attention(DType::Fp8E4M3, 1, 256, 256, 16, 16, 64), "DTYPE_UNSUPPORTED"),
        fact(
            "zendnn.attention.flash_sdpa",
            "causal",
            src(ZENDNN, "zendnnl/src/lowoha_operators/sdpa/flash_sdpa/lowoha_sdpa_flash_cpu.cpp:673"),
            "zen4",
            top_left(attention(DType::BF16, 1, 128, 256, 16, 16, 64)),
        )
        .rejects(
            attrs(attention(DType::BF16, 1, 128, 256, 16, 16, 64), layerzero_tests::causal()),
            "CAUSAL_ALIGNMENT_UNSUPPORTED",
        ),
        fact(
            "zendnn.attention.flash_sdpa",
            "strides",
            src(ZENDNN, "zendnnl/src/lowoha_operators/sdpa/flash_sdpa/lowoha_flash_sdpa_utils.cpp:73"),
            "zen4",
            attention(DType::BF16, 1, 256, 256, 16, 16, 64),
        )
        .rejects(strided_v(attention(DType::BF16, 1, 256, 256, 16, 16, 64))?, "LAST_DIM_NOT_CONTIGUOUS"),
        fact(
            "zendnn.linear.matmul",
            "dtype_requirements",
            src(ZENDNN, "zendnnl/src/lowoha_operators/matmul/lowoha_matmul.cpp:301"),
            "spr",
            linear_of(DType::F16),
        )
        .rejects_on("zen4", linear_of(DType::F16), "DTYPE_UNSUPPORTED_ON_HARDWARE"),
        // zentorch's wrapper, which the executor calls, refuses bf16 without AVX512-BF16.
        fact(
            "zendnn.linear.matmul",
            "dtype_requirements",
            src(ZENTORCH, "src/cpu/cpp/MatmulUtils.hpp:279"),
            "zen4",
            linear_of(DType::BF16),
        )
        .rejects_on("icx", linear_of(DType::BF16), "DTYPE_UNSUPPORTED_ON_HARDWARE"),
        fact(
            "zendnn.linear.matmul",
            "weight_layouts",
            src(ZENDNN, "zendnnl/src/lowoha_operators/matmul/lowoha_matmul.cpp:37"),
            "zen4",
            linear_of(DType::BF16),
        ),
    ])
}
