//! xFormers, Liger and ZenDNN facts.

use super::*;

pub(super) fn facts() -> Vec<Fact> {
    vec![
        Fact {
            kernel: "xformers.attention.cutlass",
            field: "masks",
            source: src(XFORMERS, "xformers/ops/fmha/cutlass.py:174"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 16, 16, 128).tensor("mask", TensorDesc::new(DType::BF16, [2, 16, 128, 128])),
            rejected: Some((
                bf16(2, 128, 128, 16, 16, 128).tensor("mask", TensorDesc::new(DType::Bool, [2, 16, 128, 128])),
                "MASK_UNSUPPORTED",
            )),
        },
        Fact {
            kernel: "xformers.attention.cutlass",
            field: "compute_capability",
            source: src(XFORMERS, "xformers/ops/fmha/cutlass.py:170"),
            hardware: ("h100", "b200"),
            accepted: bf16(2, 128, 128, 16, 16, 128),
            rejected: Some((bf16(2, 128, 128, 16, 16, 128), "COMPUTE_CAPABILITY_TOO_NEW")),
        },
        Fact {
            kernel: "xformers.attention.cutlass",
            field: "dtypes",
            source: src(XFORMERS, "xformers/ops/fmha/cutlass.py:172"),
            hardware: ("h100", "h100"),
            accepted: attention(DType::F32, 2, 128, 128, 16, 16, 128),
            rejected: Some((attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED")),
        },
        Fact {
            kernel: "xformers.attention.cutlass",
            field: "dtype_requirements",
            source: src(XFORMERS, "xformers/ops/fmha/common.py:494"),
            hardware: ("a100", "t4"),
            accepted: bf16(2, 128, 128, 16, 16, 128),
            rejected: Some((bf16(2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED_ON_HARDWARE")),
        },
        Fact {
            kernel: "xformers.attention.cutlass",
            field: "dropout",
            source: src(XFORMERS, "xformers/ops/fmha/cutlass.py:188"),
            hardware: ("h100", "h100"),
            accepted: dropped(bf16(2, 128, 128, 16, 16, 128)),
            rejected: None,
        },
        Fact {
            kernel: "xformers.attention.cutlass",
            field: "custom_scale",
            source: src(XFORMERS, "xformers/ops/fmha/cutlass.py:189"),
            hardware: ("h100", "h100"),
            accepted: attrs(
                bf16(2, 128, 128, 16, 16, 128),
                AttentionAttrs { scale: Some(0.05), ..AttentionAttrs::default() },
            ),
            rejected: None,
        },
        Fact {
            kernel: "xformers.attention.cutlass",
            field: "different_v_head_dim",
            source: src(XFORMERS, "xformers/ops/fmha/cutlass.py:190"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 16, 16, 128)
                .tensor("v", TensorDesc::new(DType::BF16, [2, 128, 16, 64]).with_layout(Layout::Bshd)),
            rejected: None,
        },
        Fact {
            kernel: "xformers.attention.cutlass",
            field: "strides",
            source: src(XFORMERS, "xformers/ops/fmha/common.py:588"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 16, 16, 128),
            rejected: Some((strided_v(bf16(2, 128, 128, 16, 16, 128)), "LAST_DIM_NOT_CONTIGUOUS")),
        },
        Fact {
            kernel: "liger.rms_norm.triton",
            field: "hidden_size",
            source: src(LIGER, "src/liger_kernel/ops/utils.py:62"),
            hardware: ("h100", "h100"),
            accepted: rows_of(Op::RmsNorm, Attrs::Norm(NormAttrs::default()), 65536),
            rejected: Some((rows_of(Op::RmsNorm, Attrs::Norm(NormAttrs::default()), 65537), "HIDDEN_SIZE_UNSUPPORTED")),
        },
        Fact {
            // `ensure_contiguous` copies inside the library: any strides are taken as given.
            kernel: "liger.rms_norm.triton",
            field: "strides",
            source: src(LIGER, "src/liger_kernel/ops/utils.py:44"),
            hardware: ("h100", "h100"),
            accepted: rows_of(Op::RmsNorm, Attrs::Norm(NormAttrs::default()), 4096)
                .tensor("x", TensorDesc::new(DType::BF16, [64, 4096]).with_strides([8192, 2])),
            rejected: None,
        },
        Fact {
            kernel: "liger.swiglu.triton",
            field: "hidden_size",
            source: src(LIGER, "src/liger_kernel/ops/utils.py:62"),
            hardware: ("h100", "h100"),
            accepted: rows_of(Op::Swiglu, Attrs::Swiglu(SwigluAttrs { split: true }), 2 * 65536),
            rejected: Some((
                rows_of(Op::Swiglu, Attrs::Swiglu(SwigluAttrs { split: true }), 2 * 65540),
                "HIDDEN_SIZE_UNSUPPORTED",
            )),
        },
        Fact {
            kernel: "liger.swiglu.triton",
            field: "glu_forms",
            source: src(LIGER, "src/liger_kernel/ops/swiglu.py:410"),
            hardware: ("h100", "h100"),
            accepted: rows_of(Op::Swiglu, Attrs::Swiglu(SwigluAttrs { split: true }), 8192),
            rejected: None,
        },
        Fact {
            kernel: "liger.swiglu.triton",
            field: "strides",
            source: src(LIGER, "src/liger_kernel/ops/swiglu.py:419"),
            hardware: ("h100", "h100"),
            accepted: rows_of(Op::Swiglu, Attrs::Swiglu(SwigluAttrs { split: true }), 8192)
                .tensor("x", TensorDesc::new(DType::BF16, [64, 8192]).with_strides([16384, 2])),
            rejected: None,
        },
        Fact {
            kernel: "liger.rope.triton",
            field: "rope_styles",
            source: src(LIGER, "src/liger_kernel/ops/rope.py:92"),
            hardware: ("h100", "h100"),
            accepted: rope_of(RopeStyle::RotateHalf),
            rejected: Some((rope_of(RopeStyle::Interleaved), "ATTR_UNSUPPORTED")),
        },
        Fact {
            kernel: "zendnn.attention.flash_sdpa",
            field: "dtype_requirements",
            source: src(ZENDNN, "zendnnl/src/lowoha_operators/sdpa/flash_sdpa/lowoha_sdpa_flash_cpu.cpp:829"),
            hardware: ("spr", "zen4"),
            accepted: attention(DType::F16, 1, 256, 256, 16, 16, 64),
            rejected: Some((attention(DType::F16, 1, 256, 256, 16, 16, 64), "DTYPE_UNSUPPORTED_ON_HARDWARE")),
        },
        Fact {
            kernel: "zendnn.attention.flash_sdpa",
            field: "dtypes",
            source: src(ZENDNN, "zendnnl/src/lowoha_operators/sdpa/flash_sdpa/lowoha_flash_sdpa_utils.cpp:30"),
            hardware: ("zen4", "zen4"),
            accepted: attention(DType::BF16, 1, 256, 256, 16, 16, 64),
            rejected: Some((attention(DType::Fp8E4M3, 1, 256, 256, 16, 16, 64), "DTYPE_UNSUPPORTED")),
        },
        Fact {
            kernel: "zendnn.attention.flash_sdpa",
            field: "causal",
            source: src(ZENDNN, "zendnnl/src/lowoha_operators/sdpa/flash_sdpa/lowoha_sdpa_flash_cpu.cpp:673"),
            hardware: ("zen4", "zen4"),
            accepted: top_left(attention(DType::BF16, 1, 128, 256, 16, 16, 64)),
            rejected: Some((
                attrs(attention(DType::BF16, 1, 128, 256, 16, 16, 64), layerzero_tests::causal()),
                "CAUSAL_ALIGNMENT_UNSUPPORTED",
            )),
        },
        Fact {
            kernel: "zendnn.attention.flash_sdpa",
            field: "strides",
            source: src(ZENDNN, "zendnnl/src/lowoha_operators/sdpa/flash_sdpa/lowoha_flash_sdpa_utils.cpp:70"),
            hardware: ("zen4", "zen4"),
            accepted: attention(DType::BF16, 1, 256, 256, 16, 16, 64),
            rejected: Some((strided_v(attention(DType::BF16, 1, 256, 256, 16, 16, 64)), "LAST_DIM_NOT_CONTIGUOUS")),
        },
        Fact {
            kernel: "zendnn.linear.matmul",
            field: "dtype_requirements",
            source: src(ZENDNN, "zendnnl/src/lowoha_operators/matmul/lowoha_matmul.cpp:301"),
            hardware: ("spr", "zen4"),
            accepted: linear_of(DType::F16),
            rejected: Some((linear_of(DType::F16), "DTYPE_UNSUPPORTED_ON_HARDWARE")),
        },
        Fact {
            kernel: "zendnn.linear.matmul",
            field: "weight_layouts",
            source: src(ZENDNN, "zendnnl/src/lowoha_operators/matmul/lowoha_matmul.cpp:37"),
            hardware: ("zen4", "zen4"),
            accepted: linear_of(DType::BF16),
            rejected: None,
        },
    ]
}
