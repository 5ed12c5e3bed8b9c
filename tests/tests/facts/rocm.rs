//! ROCm facts: FlashAttention-2's Composable Kernel build and PyTorch SDPA's AOTriton kernels.

use super::flash_attn::{alibi, head_major, local, paged_bf16, ragged, scaled};
use super::*;

pub(super) fn facts() -> Vec<Fact> {
    let mut rows = older();
    rows.extend(composable_kernel());
    rows
}

fn older() -> Vec<Fact> {
    vec![
        Fact {
            kernel: "flash_attn_2.attention.fwd_ck",
            field: "gfx",
            source: src(FLASH_ATTN, "setup.py:217"),
            hardware: ("mi300x", MI100ISH),
            accepted: bf16(2, 128, 128, 32, 8, 128),
            rejected: Some((bf16(2, 128, 128, 32, 8, 128), "GFX_ARCH_UNSUPPORTED")),
        },
        Fact {
            kernel: "flash_attn_2.attention.fwd_ck",
            field: "head_dim",
            source: src(FLASH_ATTN, "csrc/flash_attn_ck/mha_fwd.cpp:208"),
            hardware: ("mi300x", "mi300x"),
            accepted: bf16(2, 128, 128, 16, 16, 256),
            rejected: Some((bf16(2, 128, 128, 16, 16, 288), "HEAD_DIM_TOO_LARGE")),
        },
        Fact {
            // The CK build takes softcap and drops it (`const float /*softcap*/`): declaring it
            // would accept calls it answers wrongly.
            kernel: "flash_attn_2.attention.fwd_ck",
            field: "softcap",
            source: src(FLASH_ATTN, "csrc/flash_attn_ck/mha_fwd.cpp:180"),
            hardware: ("mi300x", "mi300x"),
            accepted: bf16(2, 128, 128, 16, 16, 128),
            rejected: Some((attrs(bf16(2, 128, 128, 16, 16, 128), softcap(0.0)), "SOFTCAP_UNSUPPORTED")),
        },
        Fact {
            kernel: "flash_attn_2.paged_attention.kvcache_ck",
            field: "gfx",
            source: src(FLASH_ATTN, "setup.py:217"),
            hardware: ("mi300x", MI100ISH),
            accepted: pages(128, None, 1),
            rejected: Some((pages(128, None, 1), "GFX_ARCH_UNSUPPORTED")),
        },
        Fact {
            kernel: "flash_attn_2.paged_attention.kvcache_ck",
            field: "page_size",
            source: src(FLASH_ATTN, "csrc/flash_attn_ck/mha_fwd_kvcache.cpp:328"),
            hardware: ("mi300x", "mi300x"),
            accepted: pages(128, None, 1),
            rejected: Some((pages(16, None, 1), "PAGE_SIZE_UNSUPPORTED")),
        },
        Fact {
            kernel: "flash_attn_2.paged_attention.kvcache_ck",
            field: "kv_cache_strides",
            source: src(FLASH_ATTN, "csrc/flash_attn_ck/mha_fwd_kvcache.cpp:304"),
            hardware: ("mi300x", "mi300x"),
            accepted: pages(128, Some(2 * 128 * 8 * 128), 1),
            rejected: Some((pages(128, Some(2 * 128 * 8 * 128), 2), "KV_CACHE_STRIDES_UNSUPPORTED")),
        },
        Fact {
            kernel: "torch_sdpa.attention.flash_rocm",
            field: "gfx",
            source: src(AOTRITON, "v3src/util.cc:48"),
            hardware: ("mi300x", MI100ISH),
            accepted: attrs(bf16(2, 128, 128, 32, 8, 128), AttentionAttrs::default()),
            rejected: Some((bf16(2, 128, 128, 32, 8, 128), "GFX_ARCH_UNSUPPORTED")),
        },
        Fact {
            kernel: "torch_sdpa.attention.flash_rocm",
            field: "gfx",
            // An experimental arch is refused unless an environment variable opts in.
            source: src(AOTRITON, "v3src/util.cc:77"),
            hardware: ("mi300x", "mi300x@gfx1200"),
            accepted: bf16(2, 128, 128, 32, 8, 128),
            rejected: Some((bf16(2, 128, 128, 32, 8, 128), "GFX_ARCH_UNSUPPORTED")),
        },
        Fact {
            kernel: "torch_sdpa.attention.efficient_rocm",
            field: "gfx",
            source: src(AOTRITON, "v3src/util.cc:48"),
            hardware: ("mi300x", MI100ISH),
            accepted: bf16(2, 128, 128, 16, 16, 128),
            rejected: Some((bf16(2, 128, 128, 16, 16, 128), "GFX_ARCH_UNSUPPORTED")),
        },
    ]
}

/// FlashAttention-2's Composable Kernel build (csrc/flash_attn_ck): `mha_fwd`, `mha_varlen_fwd`
/// and `mha_fwd_kvcache`.
fn composable_kernel() -> Vec<Fact> {
    const DENSE: &str = "flash_attn_2.attention.fwd_ck";
    const PAGED: &str = "flash_attn_2.paged_attention.kvcache_ck";
    let fwd = |line: u32| src(FLASH_ATTN, &format!("csrc/flash_attn_ck/mha_fwd.cpp:{line}"));
    let kv = |line: u32| src(FLASH_ATTN, &format!("csrc/flash_attn_ck/mha_fwd_kvcache.cpp:{line}"));
    vec![
        fact(DENSE, "dtypes", fwd(185), "mi300x", bf16(2, 128, 128, 16, 16, 128))
            .rejects(attention(DType::F32, 2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED"),
        fact(DENSE, "gqa", fwd(210), "mi300x", bf16(2, 128, 128, 32, 8, 128)),
        // Causal is the "b:" (bottom-right) mask: a top-left request with fewer queries than
        // keys is another mask.
        fact(DENSE, "causal", fwd(222), "mi300x", attrs(bf16(2, 64, 128, 16, 16, 128), layerzero_tests::causal()))
            .rejects(top_left(bf16(2, 64, 128, 16, 16, 128)), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        fact(DENSE, "dropout", fwd(268), "mi300x", dropped(bf16(2, 128, 128, 16, 16, 128))),
        fact(DENSE, "window", fwd(230), "mi300x", local(bf16(2, 128, 128, 16, 16, 128))),
        fact(DENSE, "alibi", fwd(87), "mi300x", alibi(bf16(2, 128, 128, 16, 16, 128))),
        fact(DENSE, "custom_scale", fwd(176), "mi300x", scaled(bf16(2, 128, 128, 16, 16, 128))),
        fact(DENSE, "varlen", src(FLASH_ATTN, "csrc/flash_attn_ck/mha_varlen_fwd.cpp:329"), "mi300x", ragged()),
        // The head stride is read from the tensor (stride(2)): a head-major tensor is a view.
        fact(DENSE, "layouts", fwd(69), "mi300x", head_major(bf16(2, 128, 128, 16, 16, 128))),
        fact(DENSE, "strides", fwd(195), "mi300x", bf16(2, 128, 128, 16, 16, 128))
            .rejects(strided_v(bf16(2, 128, 128, 16, 16, 128)), "LAST_DIM_NOT_CONTIGUOUS"),
        fact(PAGED, "dtypes", kv(295), "mi300x", pages(128, None, 1)).rejects(
            paged(DType::F32, DType::F32, 4, 1, 32, 8, 128, 128, Layout::Nhd, DType::I32),
            "DTYPE_UNSUPPORTED",
        ),
        fact(PAGED, "head_dim", kv(333), "mi300x", paged_bf16(256, 128, Layout::Nhd, DType::I32))
            .rejects(paged_bf16(288, 128, Layout::Nhd, DType::I32), "HEAD_DIM_TOO_LARGE"),
        // No multiple of 8 asked: the function pads q and the caches itself.
        fact(PAGED, "head_dim", kv(380), "mi300x", paged_bf16(100, 128, Layout::Nhd, DType::I32)),
        fact(PAGED, "gqa", kv(334), "mi300x", pages(128, None, 1)),
        fact(PAGED, "causal", kv(344), "mi300x", attrs(queries_on_pages(4, 128, None, 1), layerzero_tests::causal()))
            .rejects(top_left(queries_on_pages(4, 128, None, 1)), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        fact(PAGED, "window", kv(352), "mi300x", local(queries_on_pages(4, 128, None, 1))),
        fact(PAGED, "alibi", kv(255), "mi300x", alibi(pages(128, None, 1))),
        fact(PAGED, "custom_scale", kv(213), "mi300x", scaled(pages(128, None, 1))),
        fact(PAGED, "block_table_dtypes", kv(314), "mi300x", pages(128, None, 1))
            .rejects(paged_bf16(128, 128, Layout::Nhd, DType::I64), "BLOCK_TABLE_DTYPE_UNSUPPORTED"),
        // The cache's head stride is read from the tensor (stride(2)): an HND cache is a view.
        fact(PAGED, "kv_cache_layouts", kv(223), "mi300x", paged_bf16(128, 128, Layout::Hnd, DType::I32)),
    ]
}
