//! FlashAttention-2 and -3 (CUDA) facts.

use super::*;

pub(super) fn facts() -> Vec<Fact> {
    vec![
        Fact {
            kernel: "flash_attn_2.attention.fwd",
            field: "exclusive",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:420"),
            hardware: ("h100", "h100"),
            accepted: attrs(bf16(2, 128, 128, 16, 16, 128), softcap(0.0)),
            rejected: Some((attrs(bf16(2, 128, 128, 16, 16, 128), softcap(0.1)), "FEATURES_EXCLUSIVE")),
        },
        Fact {
            kernel: "flash_attn_2.attention.fwd",
            field: "head_dim",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:416"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 16, 16, 256),
            rejected: Some((bf16(2, 128, 128, 16, 16, 288), "HEAD_DIM_TOO_LARGE")),
        },
        Fact {
            kernel: "flash_attn_2.attention.fwd",
            field: "dtypes",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:396"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 16, 16, 128),
            rejected: Some((attention(DType::F32, 2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED")),
        },
        Fact {
            kernel: "flash_attn_2.attention.fwd",
            field: "compute_capability",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:393"),
            hardware: ("a100", "t4"),
            accepted: attention(DType::F16, 2, 128, 128, 16, 16, 128),
            rejected: Some((attention(DType::F16, 2, 128, 128, 16, 16, 128), "COMPUTE_CAPABILITY_TOO_OLD")),
        },
        Fact {
            kernel: "flash_attn_2.attention.fwd",
            field: "gqa",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:418"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 32, 8, 128),
            rejected: None,
        },
        Fact {
            // Causal is bottom-right aligned: a top-left request with fewer queries than keys
            // is another mask.
            kernel: "flash_attn_2.attention.fwd",
            field: "causal",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:427"),
            hardware: ("h100", "h100"),
            accepted: attrs(bf16(2, 64, 128, 16, 16, 128), layerzero_tests::causal()),
            rejected: Some((
                attrs(
                    bf16(2, 64, 128, 16, 16, 128),
                    AttentionAttrs {
                        causal: true,
                        causal_alignment: CausalAlignment::TopLeft,
                        ..AttentionAttrs::default()
                    },
                ),
                "CAUSAL_ALIGNMENT_UNSUPPORTED",
            )),
        },
        Fact {
            kernel: "flash_attn_2.attention.fwd",
            field: "dropout",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:150"),
            hardware: ("h100", "h100"),
            accepted: attrs(
                bf16(2, 128, 128, 16, 16, 128),
                AttentionAttrs { dropout_p: 0.1, ..AttentionAttrs::default() },
            ),
            rejected: None,
        },
        Fact {
            kernel: "flash_attn_2.attention.fwd",
            field: "window",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:422"),
            hardware: ("h100", "h100"),
            accepted: attrs(
                bf16(2, 128, 128, 16, 16, 128),
                AttentionAttrs { causal: true, window_left: Some(64), ..AttentionAttrs::default() },
            ),
            rejected: None,
        },
        Fact {
            kernel: "flash_attn_2.attention.fwd",
            field: "softcap",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:420"),
            hardware: ("h100", "h100"),
            accepted: attrs(bf16(2, 128, 128, 16, 16, 128), softcap(0.0)),
            rejected: None,
        },
        Fact {
            kernel: "flash_attn_2.attention.fwd",
            field: "alibi",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:358"),
            hardware: ("h100", "h100"),
            accepted: attrs(
                bf16(2, 128, 128, 16, 16, 128),
                AttentionAttrs { alibi: true, ..AttentionAttrs::default() },
            ),
            rejected: None,
        },
        Fact {
            kernel: "flash_attn_2.attention.fwd",
            field: "strides",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:403"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 16, 16, 128),
            rejected: Some((
                bf16(2, 128, 128, 16, 16, 128).tensor(
                    "v",
                    TensorDesc::new(DType::BF16, [2, 128, 16, 128])
                        .with_layout(Layout::Bshd)
                        .with_strides([524288, 4096, 256, 2]),
                ),
                "LAST_DIM_NOT_CONTIGUOUS",
            )),
        },
        Fact {
            kernel: "flash_attn_2.paged_attention.kvcache",
            field: "compute_capability",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:1271"),
            hardware: ("a100", "t4"),
            accepted: paged(DType::F16, DType::F16, 4, 1, 32, 8, 128, 256, Layout::Nhd, DType::I32),
            rejected: Some((
                paged(DType::F16, DType::F16, 4, 1, 32, 8, 128, 256, Layout::Nhd, DType::I32),
                "COMPUTE_CAPABILITY_TOO_OLD",
            )),
        },
        Fact {
            kernel: "flash_attn_2.paged_attention.kvcache",
            field: "gqa",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:1311"),
            hardware: ("h100", "h100"),
            accepted: pages(256, None, 1),
            rejected: None,
        },
        Fact {
            kernel: "flash_attn_2.paged_attention.kvcache",
            field: "page_size",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:1305"),
            hardware: ("h100", "h100"),
            accepted: pages(256, None, 1),
            rejected: Some((pages(16, None, 1), "PAGE_SIZE_UNSUPPORTED")),
        },
        Fact {
            kernel: "flash_attn_2.paged_attention.kvcache",
            field: "kv_cache_strides",
            source: src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:1282"),
            hardware: ("h100", "h100"),
            // Strided pages (K and V interleaved per page) are read in place; a strided last
            // dim is not.
            accepted: pages(256, Some(2 * 256 * 8 * 128), 1),
            rejected: Some((pages(256, Some(2 * 256 * 8 * 128), 2), "KV_CACHE_STRIDES_UNSUPPORTED")),
        },
        Fact {
            kernel: "flash_attn_3.attention.fwd",
            field: "compute_capability",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:712"),
            hardware: ("h100", "t4"),
            accepted: attention(DType::F16, 2, 128, 128, 16, 16, 128),
            rejected: Some((attention(DType::F16, 2, 128, 128, 16, 16, 128), "COMPUTE_CAPABILITY_TOO_OLD")),
        },
        Fact {
            kernel: "flash_attn_3.attention.fwd",
            field: "dtypes",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:715"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 16, 16, 128),
            rejected: Some((attention(DType::F32, 2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED")),
        },
        Fact {
            kernel: "flash_attn_3.attention.fwd",
            field: "dtype_requirements",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:718"),
            hardware: ("h100", "a100"),
            accepted: attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128),
            rejected: Some((attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED_ON_HARDWARE")),
        },
        Fact {
            kernel: "flash_attn_3.attention.fwd",
            field: "head_dim",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:780"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 16, 16, 256),
            rejected: Some((bf16(2, 128, 128, 16, 16, 288), "HEAD_DIM_TOO_LARGE")),
        },
        Fact {
            kernel: "flash_attn_3.attention.fwd",
            field: "head_dim",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:855"),
            hardware: ("h100", "h100"),
            accepted: attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128),
            rejected: Some((attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 120), "HEAD_DIM_ALIGNMENT")),
        },
        Fact {
            kernel: "flash_attn_3.attention.fwd",
            field: "gqa",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:781"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 32, 8, 128),
            rejected: None,
        },
        Fact {
            kernel: "flash_attn_3.attention.fwd",
            field: "causal",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:805"),
            hardware: ("h100", "h100"),
            accepted: attrs(bf16(2, 64, 128, 16, 16, 128), layerzero_tests::causal()),
            rejected: Some((
                attrs(
                    bf16(2, 64, 128, 16, 16, 128),
                    AttentionAttrs {
                        causal: true,
                        causal_alignment: CausalAlignment::TopLeft,
                        ..AttentionAttrs::default()
                    },
                ),
                "CAUSAL_ALIGNMENT_UNSUPPORTED",
            )),
        },
        Fact {
            kernel: "flash_attn_3.attention.fwd",
            field: "window",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:796"),
            hardware: ("h100", "h100"),
            accepted: attrs(
                bf16(2, 128, 128, 16, 16, 128),
                AttentionAttrs { causal: true, window_left: Some(64), ..AttentionAttrs::default() },
            ),
            rejected: None,
        },
        Fact {
            kernel: "flash_attn_3.attention.fwd",
            field: "softcap",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:131"),
            hardware: ("h100", "h100"),
            accepted: attrs(bf16(2, 128, 128, 16, 16, 128), softcap(0.0)),
            rejected: None,
        },
        Fact {
            kernel: "flash_attn_3.attention.fwd",
            field: "strides",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:726"),
            hardware: ("h100", "h100"),
            accepted: bf16(2, 128, 128, 16, 16, 128),
            rejected: Some((
                bf16(2, 128, 128, 16, 16, 128).tensor(
                    "v",
                    TensorDesc::new(DType::BF16, [2, 128, 16, 128])
                        .with_layout(Layout::Bshd)
                        .with_strides([524288, 4096, 256, 2]),
                ),
                "LAST_DIM_NOT_CONTIGUOUS",
            )),
        },
        Fact {
            kernel: "flash_attn_3.paged_attention.fwd",
            field: "compute_capability",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:712"),
            hardware: ("h100", "t4"),
            accepted: paged(DType::F16, DType::F16, 4, 4, 32, 8, 128, 16, Layout::Nhd, DType::I32),
            rejected: Some((
                paged(DType::F16, DType::F16, 4, 4, 32, 8, 128, 16, Layout::Nhd, DType::I32),
                "COMPUTE_CAPABILITY_TOO_OLD",
            )),
        },
        Fact {
            kernel: "flash_attn_3.paged_attention.fwd",
            field: "dtypes",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:715"),
            hardware: ("h100", "h100"),
            accepted: queries_on_pages(4, 16, None, 1),
            rejected: Some((
                paged(DType::F32, DType::F32, 4, 4, 32, 8, 128, 16, Layout::Nhd, DType::I32),
                "DTYPE_UNSUPPORTED",
            )),
        },
        Fact {
            kernel: "flash_attn_3.paged_attention.fwd",
            field: "head_dim",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:780"),
            hardware: ("h100", "h100"),
            accepted: queries_on_pages(4, 16, None, 1),
            rejected: Some((
                paged(DType::BF16, DType::BF16, 4, 4, 32, 8, 288, 16, Layout::Nhd, DType::I32),
                "HEAD_DIM_TOO_LARGE",
            )),
        },
        Fact {
            kernel: "flash_attn_3.paged_attention.fwd",
            field: "gqa",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:781"),
            hardware: ("h100", "h100"),
            accepted: queries_on_pages(4, 16, None, 1),
            rejected: None,
        },
        Fact {
            kernel: "flash_attn_3.paged_attention.fwd",
            field: "block_table_dtypes",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:735"),
            hardware: ("h100", "h100"),
            accepted: queries_on_pages(4, 16, None, 1),
            rejected: Some((
                paged(DType::BF16, DType::BF16, 4, 4, 32, 8, 128, 16, Layout::Nhd, DType::I64),
                "BLOCK_TABLE_DTYPE_UNSUPPORTED",
            )),
        },
        Fact {
            kernel: "flash_attn_3.paged_attention.fwd",
            field: "softcap",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:131"),
            hardware: ("h100", "h100"),
            accepted: with_attrs(queries_on_pages(4, 16, None, 1), softcap(0.0)),
            rejected: None,
        },
        Fact {
            kernel: "flash_attn_3.paged_attention.fwd",
            field: "kv_cache_strides",
            source: src(FLASH_ATTN, "hopper/flash_api.cpp:726"),
            hardware: ("h100", "h100"),
            accepted: queries_on_pages(4, 16, Some(2 * 16 * 8 * 128), 1),
            rejected: Some((queries_on_pages(4, 16, Some(2 * 16 * 8 * 128), 2), "KV_CACHE_STRIDES_UNSUPPORTED")),
        },
    ]
}
