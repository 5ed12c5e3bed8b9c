//! ROCm facts: FlashAttention-2's Composable Kernel build and PyTorch SDPA's AOTriton kernels.

use super::*;

pub(super) fn facts() -> Vec<Fact> {
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
