//! FlashInfer facts.

use super::*;

pub(super) fn facts() -> Vec<Fact> {
    vec![
        Fact {
            kernel: "flashinfer.paged_attention.decode",
            field: "kv_cache_strides",
            source: src(FLASHINFER, "csrc/page.cu:34"),
            hardware: ("h100", "h100"),
            accepted: pages(16, Some(2 * 16 * 8 * 128), 1),
            rejected: Some((pages(16, Some(2 * 16 * 8 * 128), 2), "KV_CACHE_STRIDES_UNSUPPORTED")),
        },
        Fact {
            kernel: "flashinfer.attention.prefill",
            field: "dtypes",
            source: src(FLASHINFER, "flashinfer/jit/utils.py:33"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 16, 16, 128),
            rejected: Some((attention(DType::F32, 2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED")),
        },
        Fact {
            kernel: "flashinfer.attention.prefill",
            field: "dtype_requirements",
            source: src(FLASHINFER, "include/flashinfer/attention/prefill.cuh:2140"),
            hardware: ("a100", "t4"),
            accepted: bf16(2, 128, 128, 16, 16, 128),
            rejected: Some((bf16(2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED_ON_HARDWARE")),
        },
        Fact {
            kernel: "flashinfer.attention.prefill",
            field: "head_dim",
            source: src(FLASHINFER, "include/flashinfer/utils.cuh:197"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 16, 16, 128),
            rejected: Some((bf16(2, 128, 128, 16, 16, 96), "HEAD_DIM_UNSUPPORTED")),
        },
        Fact {
            kernel: "flashinfer.attention.prefill",
            field: "causal",
            source: src(FLASHINFER, "include/flashinfer/attention/prefill.cuh:2535"),
            hardware: ("h100", "h100"),
            accepted: attrs(bf16(2, 64, 128, 16, 16, 128), layerzero_tests::causal()),
            rejected: Some((
                attrs(bf16(2, 128, 64, 16, 16, 128), layerzero_tests::causal()),
                "CAUSAL_SEQ_Q_EXCEEDS_SEQ_K",
            )),
        },
        Fact {
            kernel: "flashinfer.attention.decode",
            field: "dtypes",
            source: src(FLASHINFER, "flashinfer/jit/utils.py:33"),
            hardware: ("h100", "h100"),
            accepted: bf16(4, 1, 512, 32, 8, 128),
            rejected: Some((attention(DType::F32, 4, 1, 512, 32, 8, 128), "DTYPE_UNSUPPORTED")),
        },
        Fact {
            kernel: "flashinfer.paged_attention.prefill",
            field: "dtypes",
            source: src(FLASHINFER, "flashinfer/jit/utils.py:33"),
            hardware: ("h100", "h100"),
            accepted: queries_on_pages(4, 16, None, 1),
            rejected: Some((
                paged(DType::F32, DType::F32, 4, 4, 32, 8, 128, 16, Layout::Nhd, DType::I32),
                "DTYPE_UNSUPPORTED",
            )),
        },
        Fact {
            kernel: "flashinfer.paged_attention.prefill",
            field: "dtype_requirements",
            source: src(FLASHINFER, "include/flashinfer/attention/prefill.cuh:2751"),
            hardware: ("a100", "t4"),
            accepted: queries_on_pages(4, 16, None, 1),
            rejected: Some((queries_on_pages(4, 16, None, 1), "DTYPE_UNSUPPORTED_ON_HARDWARE")),
        },
        Fact {
            kernel: "flashinfer.paged_attention.decode",
            field: "dtypes",
            source: src(FLASHINFER, "flashinfer/jit/utils.py:33"),
            hardware: ("h100", "h100"),
            accepted: pages(16, None, 1),
            rejected: Some((
                paged(DType::F32, DType::F32, 4, 1, 32, 8, 128, 16, Layout::Nhd, DType::I32),
                "DTYPE_UNSUPPORTED",
            )),
        },
        Fact {
            kernel: "flashinfer.paged_attention.decode",
            field: "head_dim",
            source: src(FLASHINFER, "include/flashinfer/utils.cuh:197"),
            hardware: ("h100", "h100"),
            accepted: pages(16, None, 1),
            rejected: Some((
                paged(DType::BF16, DType::BF16, 4, 1, 32, 8, 96, 16, Layout::Nhd, DType::I32),
                "HEAD_DIM_UNSUPPORTED",
            )),
        },
        Fact {
            kernel: "flashinfer.paged_attention.prefill",
            field: "kv_cache_strides",
            source: src(FLASHINFER, "csrc/page.cu:34"),
            hardware: ("h100", "h100"),
            accepted: queries_on_pages(4, 16, Some(2 * 16 * 8 * 128), 1),
            rejected: Some((queries_on_pages(4, 16, Some(2 * 16 * 8 * 128), 2), "KV_CACHE_STRIDES_UNSUPPORTED")),
        },
        Fact {
            kernel: "flashinfer.paged_attention.prefill_fa3",
            field: "kv_cache_strides",
            source: src(FLASHINFER, "csrc/page.cu:34"),
            hardware: ("h100", "h100"),
            accepted: queries_on_pages(4, 16, Some(2 * 16 * 8 * 128), 1),
            rejected: Some((queries_on_pages(4, 16, Some(2 * 16 * 8 * 128), 2), "KV_CACHE_STRIDES_UNSUPPORTED")),
        },
        Fact {
            kernel: "flashinfer.paged_attention.decode",
            field: "gqa",
            source: src(FLASHINFER, "include/flashinfer/utils.cuh:142"),
            hardware: ("h100", "h100"),
            accepted: pages(16, None, 1),
            rejected: Some((
                paged(DType::BF16, DType::BF16, 4, 1, 40, 8, 128, 16, Layout::Nhd, DType::I32),
                "GQA_GROUP_SIZE_UNSUPPORTED",
            )),
        },
        Fact {
            kernel: "flashinfer.attention.prefill_fa3",
            field: "exclusive",
            source: src(FLASHINFER, "flashinfer/prefill.py:1376"),
            hardware: ("h100", "h100"),
            accepted: attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128),
            rejected: Some((windowed(attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128)), "FEATURES_EXCLUSIVE")),
        },
        Fact {
            // The window alone is taken; only with fp8 queries is it refused.
            kernel: "flashinfer.attention.prefill_fa3",
            field: "window",
            source: src(FLASHINFER, "include/flashinfer/attention/hopper/prefill_sm90.cuh:251"),
            hardware: ("h100", "h100"),
            accepted: windowed(bf16(2, 128, 128, 16, 16, 128)),
            rejected: Some((windowed(attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128)), "FEATURES_EXCLUSIVE")),
        },
        Fact {
            kernel: "flashinfer.attention.prefill",
            field: "masks",
            source: src(FLASHINFER, "flashinfer/utils.py:43"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 16, 16, 128).tensor("mask", TensorDesc::new(DType::Bool, [2, 16, 128, 128])),
            rejected: Some((
                bf16(2, 128, 128, 16, 16, 128).tensor("mask", TensorDesc::new(DType::BF16, [2, 16, 128, 128])),
                "MASK_UNSUPPORTED",
            )),
        },
        Fact {
            kernel: "flashinfer.attention.decode",
            field: "head_dim",
            source: src(FLASHINFER, "include/flashinfer/attention/decode.cuh:671"),
            hardware: ("h100", "h100"),
            accepted: bf16(4, 1, 512, 32, 8, 128),
            rejected: Some((bf16(4, 1, 512, 32, 8, 96), "HEAD_DIM_UNSUPPORTED")),
        },
    ]
}
