//! FlashAttention-2 and -3 (CUDA) facts.

use super::*;

/// A bf16 ragged batch: 4 sequences packed into 512 tokens, with their int32 offsets.
pub(super) fn ragged() -> Request {
    bf16(1, 512, 512, 16, 16, 128)
        .tensor("cu_seqlens_q", TensorDesc::new(DType::I32, [5]))
        .tensor("cu_seqlens_k", TensorDesc::new(DType::I32, [5]))
}

/// `req` with a softmax scale of its own.
pub(super) fn scaled(req: Request) -> Request {
    attrs(req, AttentionAttrs { scale: Some(0.05), ..AttentionAttrs::default() })
}

/// `req` with a left window of 64 keys and no causal mask (a local window, right unbounded).
pub(super) fn local(req: Request) -> Request {
    attrs(req, AttentionAttrs { window_left: Some(64), ..AttentionAttrs::default() })
}

/// `req` with ALiBi slopes.
pub(super) fn alibi(req: Request) -> Request {
    attrs(req, AttentionAttrs { alibi: true, ..AttentionAttrs::default() })
}

/// A bf16 paged decode over `d`-wide heads on pages of `page` positions, the caches in `layout`
/// and the block table in `table`.
pub(super) fn paged_bf16(d: u64, page: u64, layout: Layout, table: DType) -> Request {
    paged(DType::BF16, DType::BF16, 4, 1, 32, 8, d, page, layout, table)
}

pub(super) fn facts() -> TestResult<Vec<Fact>> {
    let mut rows = limits()?;
    rows.extend(fa2()?);
    rows.extend(fa3()?);
    Ok(rows)
}

/// FA2 and FA3: the limits, features and exclusions each API entry checks.
fn limits() -> TestResult<Vec<Fact>> {
    Ok(vec![
        fact(
            "flash_attn_2.attention.fwd",
            "exclusive",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:420"),
            "h100",
            attrs(bf16(2, 128, 128, 16, 16, 128), softcap(0.0)),
        )
        .rejects(attrs(bf16(2, 128, 128, 16, 16, 128), softcap(0.1)), "FEATURES_EXCLUSIVE"),
        fact(
            "flash_attn_2.attention.fwd",
            "head_dim",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:416"),
            "h100",
            bf16(2, 128, 128, 16, 16, 256),
        )
        .rejects(bf16(2, 128, 128, 16, 16, 288), "HEAD_DIM_TOO_LARGE"),
        fact(
            "flash_attn_2.attention.fwd",
            "dtypes",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:396"),
            "h100",
            bf16(2, 128, 128, 16, 16, 128),
        )
        .rejects(attention(DType::F32, 2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED"),
        fact(
            "flash_attn_2.attention.fwd",
            "compute_capability",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:393"),
            "a100",
            attention(DType::F16, 2, 128, 128, 16, 16, 128),
        )
        .rejects_on("t4", attention(DType::F16, 2, 128, 128, 16, 16, 128), "COMPUTE_CAPABILITY_TOO_OLD"),
        fact(
            "flash_attn_2.attention.fwd",
            "gqa",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:418"),
            "h100",
            bf16(2, 128, 128, 32, 8, 128),
        ),
        // Causal is bottom-right aligned: a top-left request with fewer queries than keys
        // is another mask.
        fact(
            "flash_attn_2.attention.fwd",
            "causal",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:427"),
            "h100",
            attrs(bf16(2, 64, 128, 16, 16, 128), layerzero_tests::causal()),
        )
        .rejects(top_left(bf16(2, 64, 128, 16, 16, 128)), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        fact(
            "flash_attn_2.attention.fwd",
            "dropout",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:150"),
            "h100",
            dropped(bf16(2, 128, 128, 16, 16, 128)),
        ),
        fact(
            "flash_attn_2.attention.fwd",
            "window",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:422"),
            "h100",
            windowed(bf16(2, 128, 128, 16, 16, 128)),
        ),
        fact(
            "flash_attn_2.attention.fwd",
            "softcap",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:420"),
            "h100",
            attrs(bf16(2, 128, 128, 16, 16, 128), softcap(0.0)),
        ),
        fact(
            "flash_attn_2.attention.fwd",
            "alibi",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:358"),
            "h100",
            attrs(bf16(2, 128, 128, 16, 16, 128), AttentionAttrs { alibi: true, ..AttentionAttrs::default() }),
        ),
        fact(
            "flash_attn_2.attention.fwd",
            "strides",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:403"),
            "h100",
            bf16(2, 128, 128, 16, 16, 128),
        )
        .rejects(strided_v(bf16(2, 128, 128, 16, 16, 128))?, "LAST_DIM_NOT_CONTIGUOUS"),
        fact(
            "flash_attn_2.paged_attention.kvcache",
            "compute_capability",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:1271"),
            "a100",
            paged(DType::F16, DType::F16, 4, 1, 32, 8, 128, 256, Layout::Nhd, DType::I32),
        )
        .rejects_on(
            "t4",
            paged(DType::F16, DType::F16, 4, 1, 32, 8, 128, 256, Layout::Nhd, DType::I32),
            "COMPUTE_CAPABILITY_TOO_OLD",
        ),
        fact(
            "flash_attn_2.paged_attention.kvcache",
            "gqa",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:1311"),
            "h100",
            pages(256, None, 1)?,
        ),
        fact(
            "flash_attn_2.paged_attention.kvcache",
            "page_size",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:1305"),
            "h100",
            pages(256, None, 1)?,
        )
        .rejects(pages(16, None, 1)?, "PAGE_SIZE_UNSUPPORTED"),
        // Strided pages (K and V interleaved per page) are read in place; a strided last
        // dim is not.
        fact(
            "flash_attn_2.paged_attention.kvcache",
            "kv_cache_strides",
            src(FLASH_ATTN, "csrc/flash_attn/flash_api.cpp:1282"),
            "h100",
            pages(256, Some(2 * 256 * 8 * 128), 1)?,
        )
        .rejects(pages(256, Some(2 * 256 * 8 * 128), 2)?, "KV_CACHE_STRIDES_UNSUPPORTED"),
        // Only Hopper builds a V head dim other than Q/K's, in these pairs.
        fact(
            "flash_attn_3.attention.fwd",
            "head_dim_pairs",
            src(FLASH_ATTN, "hopper/flash_api.cpp:783"),
            "h100",
            v_dim(bf16(2, 128, 128, 16, 16, 64), 512),
        )
        .rejects_on("a100", v_dim(bf16(2, 128, 128, 16, 16, 64), 512), "HEAD_DIM_UNSUPPORTED_ON_HARDWARE"),
        fact(
            "flash_attn_3.attention.fwd",
            "compute_capability",
            src(FLASH_ATTN, "hopper/flash_api.cpp:712"),
            "h100",
            attention(DType::F16, 2, 128, 128, 16, 16, 128),
        )
        .rejects_on("t4", attention(DType::F16, 2, 128, 128, 16, 16, 128), "COMPUTE_CAPABILITY_TOO_OLD"),
        fact(
            "flash_attn_3.attention.fwd",
            "dtypes",
            src(FLASH_ATTN, "hopper/flash_api.cpp:715"),
            "h100",
            bf16(2, 128, 128, 16, 16, 128),
        )
        .rejects(attention(DType::F32, 2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED"),
        fact(
            "flash_attn_3.attention.fwd",
            "dtype_requirements",
            src(FLASH_ATTN, "hopper/flash_api.cpp:718"),
            "h100",
            attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128),
        )
        .rejects_on(
            "a100",
            attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128),
            "DTYPE_UNSUPPORTED_ON_HARDWARE",
        ),
        fact(
            "flash_attn_3.attention.fwd",
            "head_dim",
            src(FLASH_ATTN, "hopper/flash_api.cpp:780"),
            "h100",
            bf16(2, 128, 128, 16, 16, 256),
        )
        .rejects(bf16(2, 128, 128, 16, 16, 288), "HEAD_DIM_TOO_LARGE"),
        fact(
            "flash_attn_3.attention.fwd",
            "head_dim",
            src(FLASH_ATTN, "hopper/flash_api.cpp:855"),
            "h100",
            attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128),
        )
        .rejects(attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 120), "HEAD_DIM_ALIGNMENT"),
        fact(
            "flash_attn_3.attention.fwd",
            "gqa",
            src(FLASH_ATTN, "hopper/flash_api.cpp:781"),
            "h100",
            bf16(2, 128, 128, 32, 8, 128),
        ),
        fact(
            "flash_attn_3.attention.fwd",
            "causal",
            src(FLASH_ATTN, "hopper/flash_api.cpp:805"),
            "h100",
            attrs(bf16(2, 64, 128, 16, 16, 128), layerzero_tests::causal()),
        )
        .rejects(top_left(bf16(2, 64, 128, 16, 16, 128)), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        fact(
            "flash_attn_3.attention.fwd",
            "window",
            src(FLASH_ATTN, "hopper/flash_api.cpp:796"),
            "h100",
            windowed(bf16(2, 128, 128, 16, 16, 128)),
        ),
        fact(
            "flash_attn_3.attention.fwd",
            "softcap",
            src(FLASH_ATTN, "hopper/flash_api.cpp:131"),
            "h100",
            attrs(bf16(2, 128, 128, 16, 16, 128), softcap(0.0)),
        ),
        fact(
            "flash_attn_3.attention.fwd",
            "strides",
            src(FLASH_ATTN, "hopper/flash_api.cpp:726"),
            "h100",
            bf16(2, 128, 128, 16, 16, 128),
        )
        .rejects(strided_v(bf16(2, 128, 128, 16, 16, 128))?, "LAST_DIM_NOT_CONTIGUOUS"),
        fact(
            "flash_attn_3.paged_attention.fwd",
            "compute_capability",
            src(FLASH_ATTN, "hopper/flash_api.cpp:712"),
            "h100",
            paged(DType::F16, DType::F16, 4, 4, 32, 8, 128, 16, Layout::Nhd, DType::I32),
        )
        .rejects_on(
            "t4",
            paged(DType::F16, DType::F16, 4, 4, 32, 8, 128, 16, Layout::Nhd, DType::I32),
            "COMPUTE_CAPABILITY_TOO_OLD",
        ),
        fact(
            "flash_attn_3.paged_attention.fwd",
            "dtypes",
            src(FLASH_ATTN, "hopper/flash_api.cpp:715"),
            "h100",
            queries_on_pages(4, 16, None, 1)?,
        )
        .rejects(paged(DType::F32, DType::F32, 4, 4, 32, 8, 128, 16, Layout::Nhd, DType::I32), "DTYPE_UNSUPPORTED"),
        fact(
            "flash_attn_3.paged_attention.fwd",
            "head_dim",
            src(FLASH_ATTN, "hopper/flash_api.cpp:780"),
            "h100",
            queries_on_pages(4, 16, None, 1)?,
        )
        .rejects(paged(DType::BF16, DType::BF16, 4, 4, 32, 8, 288, 16, Layout::Nhd, DType::I32), "HEAD_DIM_TOO_LARGE"),
        fact(
            "flash_attn_3.paged_attention.fwd",
            "gqa",
            src(FLASH_ATTN, "hopper/flash_api.cpp:781"),
            "h100",
            queries_on_pages(4, 16, None, 1)?,
        ),
        fact(
            "flash_attn_3.paged_attention.fwd",
            "block_table_dtypes",
            src(FLASH_ATTN, "hopper/flash_api.cpp:735"),
            "h100",
            queries_on_pages(4, 16, None, 1)?,
        )
        .rejects(
            paged(DType::BF16, DType::BF16, 4, 4, 32, 8, 128, 16, Layout::Nhd, DType::I64),
            "BLOCK_TABLE_DTYPE_UNSUPPORTED",
        ),
        fact(
            "flash_attn_3.paged_attention.fwd",
            "softcap",
            src(FLASH_ATTN, "hopper/flash_api.cpp:131"),
            "h100",
            with_attrs(queries_on_pages(4, 16, None, 1)?, softcap(0.0)),
        ),
        fact(
            "flash_attn_3.paged_attention.fwd",
            "kv_cache_strides",
            src(FLASH_ATTN, "hopper/flash_api.cpp:726"),
            "h100",
            queries_on_pages(4, 16, Some(2 * 16 * 8 * 128), 1)?,
        )
        .rejects(queries_on_pages(4, 16, Some(2 * 16 * 8 * 128), 2)?, "KV_CACHE_STRIDES_UNSUPPORTED"),
    ])
}

/// FlashAttention-2 (csrc/flash_attn): `mha_fwd`, `mha_varlen_fwd` and `mha_fwd_kvcache`.
fn fa2() -> TestResult<Vec<Fact>> {
    const DENSE: &str = "flash_attn_2.attention.fwd";
    const PAGED: &str = "flash_attn_2.paged_attention.kvcache";
    let api = |line: u32| src(FLASH_ATTN, &format!("csrc/flash_attn/flash_api.cpp:{line}"));
    Ok(vec![
        // FLASH_ATTN_CUDA_ARCHS defaults to "80;90;100;110;120": a B200 runs the sm_100 image,
        // a T4 (sm_75) none of them.
        fact(DENSE, "built_archs", src(FLASH_ATTN, "setup.py:74"), "b200", bf16(2, 128, 128, 16, 16, 128)).rejects_on(
            "t4",
            attention(DType::F16, 2, 128, 128, 16, 16, 128),
            "NO_KERNEL_IMAGE_FOR_ARCH",
        ),
        // sm_80 SASS runs on the whole sm_8x family (an A10 is sm_86).
        fact(
            DENSE,
            "built_archs",
            src(FLASH_ATTN, "setup.py:112"),
            "a10",
            attention(DType::F16, 2, 128, 128, 16, 16, 128),
        ),
        fact(DENSE, "custom_scale", api(375), "h100", scaled(bf16(2, 128, 128, 16, 16, 128))),
        fact(DENSE, "varlen", api(579), "h100", ragged()),
        // Only stride(-1) is checked; the head and row strides are read from the tensors, so a
        // head-major tensor is passed as a permuted view.
        fact(DENSE, "layouts", api(86), "h100", head_major(bf16(2, 128, 128, 16, 16, 128))?),
        fact(PAGED, "built_archs", src(FLASH_ATTN, "setup.py:74"), "b200", pages(256, None, 1)?).rejects_on(
            "t4",
            paged(DType::F16, DType::F16, 4, 1, 32, 8, 128, 256, Layout::Nhd, DType::I32),
            "NO_KERNEL_IMAGE_FOR_ARCH",
        ),
        fact(PAGED, "dtypes", api(1274), "h100", pages(256, None, 1)?).rejects(
            paged(DType::F32, DType::F32, 4, 1, 32, 8, 128, 256, Layout::Nhd, DType::I32),
            "DTYPE_UNSUPPORTED",
        ),
        fact(PAGED, "head_dim", api(1310), "h100", paged_bf16(256, 256, Layout::Nhd, DType::I32))
            .rejects(paged_bf16(288, 256, Layout::Nhd, DType::I32), "HEAD_DIM_TOO_LARGE"),
        // No multiple of 8 asked: mha_fwd_kvcache pads q and the caches itself.
        fact(PAGED, "head_dim", api(1341), "h100", paged_bf16(100, 256, Layout::Nhd, DType::I32)),
        fact(PAGED, "causal", api(1315), "h100", attrs(queries_on_pages(4, 256, None, 1)?, layerzero_tests::causal()))
            .rejects(top_left(queries_on_pages(4, 256, None, 1)?), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        fact(PAGED, "window", api(1259), "h100", windowed(queries_on_pages(4, 256, None, 1)?)),
        fact(PAGED, "softcap", api(1261), "h100", attrs(pages(256, None, 1)?, softcap(0.0))),
        fact(PAGED, "alibi", api(1509), "h100", alibi(pages(256, None, 1)?)),
        fact(PAGED, "custom_scale", api(1257), "h100", scaled(pages(256, None, 1)?)),
        fact(PAGED, "block_table_dtypes", api(1291), "h100", pages(256, None, 1)?)
            .rejects(paged_bf16(128, 256, Layout::Nhd, DType::I64), "BLOCK_TABLE_DTYPE_UNSUPPORTED"),
        // The cache's head stride is read from the tensor: an HND cache is a permuted view.
        fact(PAGED, "kv_cache_layouts", api(87), "h100", paged_bf16(128, 256, Layout::Hnd, DType::I32)),
    ])
}

/// FlashAttention-3 (hopper/): `mha_fwd`, dense, ragged or over a page table.
fn fa3() -> TestResult<Vec<Fact>> {
    const DENSE: &str = "flash_attn_3.attention.fwd";
    const PAGED: &str = "flash_attn_3.paged_attention.fwd";
    let api = |line: u32| src(FLASH_ATTN, &format!("hopper/flash_api.cpp:{line}"));
    let fp8_pages = || paged(DType::Fp8E4M3, DType::Fp8E4M3, 4, 4, 32, 8, 128, 16, Layout::Nhd, DType::I32);
    Ok(vec![
        // The sm90 kernels are built for sm_90a alone (arch-specific, no PTX), the sm80 ones for
        // sm_80; no sm100 source is in the build, so a B200 has no image.
        fact(DENSE, "built_archs", src(FLASH_ATTN, "hopper/setup.py:558"), "h100", bf16(2, 128, 128, 16, 16, 128))
            .rejects_on("b200", bf16(2, 128, 128, 16, 16, 128), "NO_KERNEL_IMAGE_FOR_ARCH"),
        fact(
            DENSE,
            "built_archs",
            src(FLASH_ATTN, "hopper/setup.py:206"),
            "a10",
            attention(DType::F16, 2, 128, 128, 16, 16, 128),
        ),
        fact(DENSE, "custom_scale", api(774), "h100", scaled(bf16(2, 128, 128, 16, 16, 128))),
        fact(DENSE, "varlen", api(740), "h100", ragged()),
        fact(DENSE, "layouts", api(93), "h100", head_major(bf16(2, 128, 128, 16, 16, 128))?),
        // fp8 with a V head dim above 256 is refused upstream; this vocabulary has no per-dtype
        // head_dim limit, but a V head dim above 256 is refused for every dtype here (the max
        // holds for V too, and different_v_head_dim is not declared).
        fact(DENSE, "head_dim", api(789), "h100", attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 64)).rejects(
            {
                let r = attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 64);
                r.tensor("v", TensorDesc::new(DType::Fp8E4M3, [2, 128, 16, 512]).with_layout(Layout::Bshd))
            },
            "HEAD_DIM_TOO_LARGE",
        ),
        fact(PAGED, "built_archs", src(FLASH_ATTN, "hopper/setup.py:558"), "h100", queries_on_pages(4, 16, None, 1)?)
            .rejects_on("b200", queries_on_pages(4, 16, None, 1)?, "NO_KERNEL_IMAGE_FOR_ARCH"),
        fact(PAGED, "dtype_requirements", api(718), "h100", fp8_pages()).rejects_on(
            "a100",
            fp8_pages(),
            "DTYPE_UNSUPPORTED_ON_HARDWARE",
        ),
        fact(PAGED, "causal", api(805), "h100", attrs(queries_on_pages(4, 16, None, 1)?, layerzero_tests::causal()))
            .rejects(top_left(queries_on_pages(4, 16, None, 1)?), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        fact(PAGED, "window", api(796), "h100", windowed(queries_on_pages(4, 16, None, 1)?)),
        fact(PAGED, "custom_scale", api(774), "h100", scaled(queries_on_pages(4, 16, None, 1)?)),
        fact(PAGED, "kv_cache_layouts", api(94), "h100", paged_bf16(128, 16, Layout::Hnd, DType::I32)),
    ])
}

/// `req` with v's head dim `dv` (q/k keep theirs).
fn v_dim(mut req: Request, dv: u64) -> Request {
    if let Some(last) = req.tensors.get_mut("v").and_then(|v| v.shape.last_mut()) {
        *last = dv;
    }
    req
}
