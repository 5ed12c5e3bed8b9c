//! ROCm facts: FlashAttention-2's Composable Kernel and Triton builds (PyTorch SDPA's ROCm
//! kernels are with the rest of SDPA, in `torch_sdpa.rs`).

use super::flash_attn::{alibi, local, paged_bf16, ragged, scaled};
use super::*;

pub(super) fn facts() -> TestResult<Vec<Fact>> {
    let mut rows = gfx_and_limits()?;
    rows.extend(composable_kernel()?);
    rows.extend(triton_amd()?);
    Ok(rows)
}

/// The CK build's gfx targets, head dim, dropped softcap, page size and cache strides.
fn gfx_and_limits() -> TestResult<Vec<Fact>> {
    Ok(vec![
        fact(
            "flash_attn_2.attention.fwd_ck",
            "gfx",
            src(FLASH_ATTN, "setup.py:217"),
            "mi300x",
            bf16(2, 128, 128, 32, 8, 128),
        )
        .rejects_on(MI100ISH, bf16(2, 128, 128, 32, 8, 128), "GFX_ARCH_UNSUPPORTED"),
        fact(
            "flash_attn_2.attention.fwd_ck",
            "head_dim",
            src(FLASH_ATTN, "csrc/flash_attn_ck/mha_fwd.cpp:208"),
            "mi300x",
            bf16(2, 128, 128, 16, 16, 256),
        )
        .rejects(bf16(2, 128, 128, 16, 16, 288), "HEAD_DIM_TOO_LARGE"),
        // The CK build takes softcap and drops it (`const float /*softcap*/`): declaring it
        // would accept calls it answers wrongly.
        fact(
            "flash_attn_2.attention.fwd_ck",
            "softcap",
            src(FLASH_ATTN, "csrc/flash_attn_ck/mha_fwd.cpp:180"),
            "mi300x",
            bf16(2, 128, 128, 16, 16, 128),
        )
        .rejects(attrs(bf16(2, 128, 128, 16, 16, 128), softcap(0.0)), "SOFTCAP_UNSUPPORTED"),
        fact(
            "flash_attn_2.paged_attention.kvcache_ck",
            "gfx",
            src(FLASH_ATTN, "setup.py:217"),
            "mi300x",
            pages(128, None, 1)?,
        )
        .rejects_on(MI100ISH, pages(128, None, 1)?, "GFX_ARCH_UNSUPPORTED"),
        fact(
            "flash_attn_2.paged_attention.kvcache_ck",
            "page_size",
            src(FLASH_ATTN, "csrc/flash_attn_ck/mha_fwd_kvcache.cpp:328"),
            "mi300x",
            pages(128, None, 1)?,
        )
        .rejects(pages(16, None, 1)?, "PAGE_SIZE_UNSUPPORTED"),
        fact(
            "flash_attn_2.paged_attention.kvcache_ck",
            "kv_cache_strides",
            src(FLASH_ATTN, "csrc/flash_attn_ck/mha_fwd_kvcache.cpp:304"),
            "mi300x",
            pages(128, Some(2 * 128 * 8 * 128), 1)?,
        )
        .rejects(pages(128, Some(2 * 128 * 8 * 128), 2)?, "KV_CACHE_STRIDES_UNSUPPORTED"),
    ])
}

/// FlashAttention-2's Composable Kernel build (csrc/flash_attn_ck): `mha_fwd`, `mha_varlen_fwd`
/// and `mha_fwd_kvcache`.
fn composable_kernel() -> TestResult<Vec<Fact>> {
    const DENSE: &str = "flash_attn_2.attention.fwd_ck";
    const PAGED: &str = "flash_attn_2.paged_attention.kvcache_ck";
    let fwd = |line: u32| src(FLASH_ATTN, &format!("csrc/flash_attn_ck/mha_fwd.cpp:{line}"));
    let kv = |line: u32| src(FLASH_ATTN, &format!("csrc/flash_attn_ck/mha_fwd_kvcache.cpp:{line}"));
    Ok(vec![
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
        fact(DENSE, "layouts", fwd(69), "mi300x", head_major(bf16(2, 128, 128, 16, 16, 128))?),
        fact(DENSE, "strides", fwd(195), "mi300x", bf16(2, 128, 128, 16, 16, 128))
            .rejects(strided_v(bf16(2, 128, 128, 16, 16, 128))?, "LAST_DIM_NOT_CONTIGUOUS"),
        fact(PAGED, "dtypes", kv(295), "mi300x", pages(128, None, 1)?).rejects(
            paged(DType::F32, DType::F32, 4, 1, 32, 8, 128, 128, Layout::Nhd, DType::I32),
            "DTYPE_UNSUPPORTED",
        ),
        fact(PAGED, "head_dim", kv(333), "mi300x", paged_bf16(256, 128, Layout::Nhd, DType::I32))
            .rejects(paged_bf16(288, 128, Layout::Nhd, DType::I32), "HEAD_DIM_TOO_LARGE"),
        // No multiple of 8 asked: the function pads q and the caches itself.
        fact(PAGED, "head_dim", kv(380), "mi300x", paged_bf16(100, 128, Layout::Nhd, DType::I32)),
        fact(PAGED, "gqa", kv(334), "mi300x", pages(128, None, 1)?),
        fact(PAGED, "causal", kv(344), "mi300x", attrs(queries_on_pages(4, 128, None, 1)?, layerzero_tests::causal()))
            .rejects(top_left(queries_on_pages(4, 128, None, 1)?), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        fact(PAGED, "window", kv(352), "mi300x", local(queries_on_pages(4, 128, None, 1)?)),
        fact(PAGED, "alibi", kv(255), "mi300x", alibi(pages(128, None, 1)?)),
        fact(PAGED, "custom_scale", kv(213), "mi300x", scaled(pages(128, None, 1)?)),
        fact(PAGED, "block_table_dtypes", kv(314), "mi300x", pages(128, None, 1)?)
            .rejects(paged_bf16(128, 128, Layout::Nhd, DType::I64), "BLOCK_TABLE_DTYPE_UNSUPPORTED"),
        // The cache's head stride is read from the tensor (stride(2)): an HND cache is a view.
        fact(PAGED, "kv_cache_layouts", kv(223), "mi300x", paged_bf16(128, 128, Layout::Hnd, DType::I32)),
    ])
}

/// The `third_party/aiter` submodule FlashAttention pins at [`FLASH_ATTN`]: its Triton AMD backend.
const AITER: &str = "ROCm/aiter@9bab8388c35936814a659b4ebd245c491e1b940a";

/// FlashAttention-2's Triton build for AMD (`FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE`, or no CK
/// extension): `fwd_kvcache`, the paged decode MI300X serves its 16-position pages with.
fn triton_amd() -> TestResult<Vec<Fact>> {
    const PAGED: &str = "flash_attn_2.paged_attention.kvcache_triton_amd";
    let dir = "aiter/ops/triton/_triton_kernels/flash_attn_triton_amd";
    let decode = |line: u32| src(AITER, &format!("{dir}/fwd_decode.py:{line}"));
    let interface = |line: u32| src(AITER, &format!("{dir}/interface_v2.py:{line}"));
    let f32_pages = paged(DType::F32, DType::F32, 4, 1, 32, 8, 128, 16, Layout::Nhd, DType::I32);
    let fp8_pages = paged(DType::Fp8E4M3, DType::Fp8E4M3, 4, 1, 32, 8, 128, 16, Layout::Nhd, DType::I32);
    Ok(vec![
        // Each page is walked in masked tiles (`block_offs < BLOCK_SIZE_K`): any page size.
        fact(PAGED, "page_size", decode(578), "mi300x", pages(16, None, 1)?),
        fact(PAGED, "dtypes", src(FLASH_ATTN, "README.md:166"), "mi300x", f32_pages)
            .rejects(fp8_pages, "DTYPE_UNSUPPORTED"),
        // No upstream maximum (heads pad to a power of two); 256 is the tested edge.
        fact(
            PAGED,
            "head_dim",
            src(FLASH_ATTN, "tests/test_flash_attn.py:1885"),
            "mi300x",
            paged_bf16(256, 16, Layout::Nhd, DType::I32),
        )
        .rejects(paged_bf16(288, 16, Layout::Nhd, DType::I32), "HEAD_DIM_TOO_LARGE"),
        fact(PAGED, "gqa", decode(1134), "mi300x", pages(16, None, 1)?),
        fact(
            PAGED,
            "causal",
            decode(240),
            "mi300x",
            attrs(queries_on_pages(4, 16, None, 1)?, layerzero_tests::causal()),
        )
        .rejects(top_left(queries_on_pages(4, 16, None, 1)?), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        fact(PAGED, "window", decode(206), "mi300x", local(queries_on_pages(4, 16, None, 1)?)),
        fact(PAGED, "alibi", decode(1053), "mi300x", alibi(pages(16, None, 1)?)),
        fact(PAGED, "custom_scale", interface(712), "mi300x", scaled(pages(16, None, 1)?)),
        fact(PAGED, "softcap", interface(721), "mi300x", pages(16, None, 1)?)
            .rejects(attrs(pages(16, None, 1)?, softcap(0.0)), "SOFTCAP_UNSUPPORTED"),
        fact(
            PAGED,
            "block_table_dtypes",
            src(FLASH_ATTN, "flash_attn/flash_attn_interface.py:1568"),
            "mi300x",
            pages(16, None, 1)?,
        )
        .rejects(paged_bf16(128, 16, Layout::Nhd, DType::I64), "BLOCK_TABLE_DTYPE_UNSUPPORTED"),
        fact(PAGED, "kv_cache_layouts", decode(1066), "mi300x", pages(16, None, 1)?)
            .rejects(paged_bf16(128, 16, Layout::Hnd, DType::I32), "KV_CACHE_LAYOUT_UNSUPPORTED"),
        // A page starts at `physical_block * BLOCK_SIZE_K * stride(1)`, not at stride(0): pages
        // with K and V interleaved would be read from the wrong place.
        fact(PAGED, "kv_cache_strides", decode(559), "mi300x", pages(16, None, 1)?)
            .rejects(pages(16, Some(2 * 16 * 8 * 128), 1)?, "KV_CACHE_STRIDES_UNSUPPORTED"),
        fact(PAGED, "gfx", src(AITER, &format!("{dir}/utils.py:56")), "mi300x", pages(16, None, 1)?).rejects_on(
            "mi300x@gfx1010",
            pages(16, None, 1)?,
            "GFX_ARCH_UNSUPPORTED",
        ),
    ])
}
