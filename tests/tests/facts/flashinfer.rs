//! FlashInfer facts.

use super::*;

/// `req` with an explicit softmax scale (`sm_scale`).
fn sm_scaled(req: Request) -> Request {
    attrs(req, AttentionAttrs { scale: Some(0.05), ..AttentionAttrs::default() })
}

/// `req` with ALiBi (`pos_encoding_mode="ALIBI"`).
fn alibi_on(req: Request) -> Request {
    attrs(req, AttentionAttrs { alibi: true, ..AttentionAttrs::default() })
}

/// `req` with a logits soft-cap (`logits_soft_cap > 0`).
fn capped(req: Request) -> Request {
    attrs(req, softcap(0.0))
}

/// `req` causal, bottom-right aligned (FlashInfer's `causal=True`).
fn causal_br(req: Request) -> Request {
    attrs(req, layerzero_tests::causal())
}

/// A bf16 ragged prefill: 300 packed tokens of 3 requests (`qo_indptr` / `kv_indptr`).
fn packed() -> Request {
    bf16(1, 300, 300, 16, 16, 128)
        .tensor("cu_seqlens_q", TensorDesc::new(DType::I32, [4]))
        .tensor("cu_seqlens_k", TensorDesc::new(DType::I32, [4]))
}

/// Dense attention in BHSD (`[batch, heads, seq, head_dim]`), contiguous.
fn head_first(dtype: DType, b: u64, sq: u64, sk: u64, hq: u64, hkv: u64, d: u64) -> Request {
    let t = |s: u64, h: u64| TensorDesc::new(dtype, [b, h, s, d]).with_layout(Layout::Bhsd);
    Request::new(Op::Attention).tensor("q", t(sq, hq)).tensor("k", t(sk, hkv)).tensor("v", t(sk, hkv))
}

/// `req` with `k` a BSHD view of head-major storage: last dim contiguous, the tensor not.
fn k_heads_apart(req: Request) -> TestResult<Request> {
    let k: TensorDesc = req.get("k").cloned().ok_or("no k")?;
    let (s, h, d) = (k.shape[1], k.shape[2], k.shape[3]);
    let k = k.with_strides([h * s * d, d, s * d, 1]);
    Ok(req.tensor("k", k))
}

/// `req` with k and v in `dtype` (a quantized KV under the query's dtype).
fn kv_in(mut req: Request, dtype: DType) -> Request {
    for name in ["k", "v"] {
        if let Some(t) = req.tensors.get_mut(name) {
            t.dtype = dtype;
        }
    }
    req
}

/// `req` with v's head dim `dv` (q/k keep theirs).
fn v_dim(mut req: Request, dv: u64) -> Request {
    if let Some(last) = req.tensors.get_mut("v").and_then(|v| v.shape.last_mut()) {
        *last = dv;
    }
    req
}

/// `req` with RoPE fused (`pos_encoding_mode="ROPE_LLAMA"`, `rope` as given).
fn roped(req: Request, rope: RopeAttrs) -> Request {
    attrs(req, AttentionAttrs { rope: Some(rope), ..AttentionAttrs::default() })
}

/// The fused-RoPE rows of a FlashInfer kernel whose pos_encoding_mode takes ROPE_LLAMA: the
/// llama (rotate-half) rotation of the whole head, linearly scaled by rope_scale, and never
/// with ALiBi (one pos_encoding_mode per call).
fn fused_rope(kernel: &'static str, line: &'static str, req: Request) -> Vec<Fact> {
    let llama = RopeAttrs::default();
    let with = |rope: RopeAttrs| roped(req.clone(), rope);
    let row = || fact(kernel, "fused_rope", src(FLASHINFER, line), "h100", with(llama.clone()));
    vec![
        row().rejects(with(RopeAttrs { style: RopeStyle::Interleaved, ..llama.clone() }), "FUSED_ROPE_UNSUPPORTED"),
        row().rejects(with(RopeAttrs { rotary_dim: Some(64), ..llama.clone() }), "FUSED_ROPE_UNSUPPORTED"),
        row().rejects(
            with(RopeAttrs {
                scaling: Some(RopeScaling::DynamicNtk { factor: 2.0, original_max_position: 64 }),
                ..llama.clone()
            }),
            "FUSED_ROPE_UNSUPPORTED",
        ),
        // rope_scale divides the positions: linear scaling.
        fact(
            kernel,
            "fused_rope",
            src(FLASHINFER, "include/flashinfer/attention/prefill.cuh:893"),
            "h100",
            with(RopeAttrs { scaling: Some(RopeScaling::Linear { factor: 4.0 }), ..llama.clone() }),
        ),
        fact(kernel, "exclusive", src(FLASHINFER, "flashinfer/utils.py:37"), "h100", with(llama.clone())).rejects(
            attrs(req.clone(), AttentionAttrs { rope: Some(llama), alibi: true, ..AttentionAttrs::default() }),
            "FEATURES_EXCLUSIVE",
        ),
    ]
}

/// A paged request on 16-position pages (4 sequences, 8 KV heads, an 8-page table: 128 keys).
fn paged16(q: DType, kv: DType, seq_q: u64, hq: u64, d: u64, layout: Layout, table: DType) -> Request {
    paged(q, kv, 4, seq_q, hq, 8, d, 16, layout, table)
}

pub(super) fn facts() -> TestResult<Vec<Fact>> {
    let mut rows = limits()?;
    rows.extend(decode()?);
    rows.extend(dense_prefill()?);
    rows.extend(dense_prefill_fa3()?);
    rows.extend(paged_decode()?);
    rows.extend(paged_prefill()?);
    rows.extend(paged_prefill_fa3()?);
    Ok(rows)
}

/// The dtypes, head dims, strides, group sizes, masks and exclusions the entry points check.
fn limits() -> TestResult<Vec<Fact>> {
    Ok(vec![
        fact(
            "flashinfer.paged_attention.decode",
            "kv_cache_strides",
            src(FLASHINFER, "csrc/page.cu:34"),
            "h100",
            pages(16, Some(2 * 16 * 8 * 128), 1)?,
        )
        .rejects(pages(16, Some(2 * 16 * 8 * 128), 2)?, "KV_CACHE_STRIDES_UNSUPPORTED"),
        fact(
            "flashinfer.attention.prefill",
            "dtypes",
            src(FLASHINFER, "flashinfer/jit/utils.py:33"),
            "h100",
            bf16(2, 128, 128, 16, 16, 128),
        )
        .rejects(attention(DType::F32, 2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED"),
        fact(
            "flashinfer.attention.prefill",
            "dtype_requirements",
            src(FLASHINFER, "include/flashinfer/attention/prefill.cuh:2140"),
            "a100",
            bf16(2, 128, 128, 16, 16, 128),
        )
        .rejects_on("t4", bf16(2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED_ON_HARDWARE"),
        fact(
            "flashinfer.attention.prefill",
            "head_dim",
            src(FLASHINFER, "include/flashinfer/utils.cuh:197"),
            "h100",
            bf16(2, 128, 128, 16, 16, 128),
        )
        .rejects(bf16(2, 128, 128, 16, 16, 96), "HEAD_DIM_UNSUPPORTED"),
        fact(
            "flashinfer.attention.prefill",
            "causal",
            src(FLASHINFER, "include/flashinfer/attention/prefill.cuh:2535"),
            "h100",
            attrs(bf16(2, 64, 128, 16, 16, 128), layerzero_tests::causal()),
        )
        .rejects(attrs(bf16(2, 128, 64, 16, 16, 128), layerzero_tests::causal()), "CAUSAL_SEQ_Q_EXCEEDS_SEQ_K"),
        fact(
            "flashinfer.attention.decode",
            "dtypes",
            src(FLASHINFER, "flashinfer/jit/utils.py:33"),
            "h100",
            bf16(4, 1, 512, 32, 8, 128),
        )
        .rejects(attention(DType::F32, 4, 1, 512, 32, 8, 128), "DTYPE_UNSUPPORTED"),
        fact(
            "flashinfer.paged_attention.prefill",
            "dtypes",
            src(FLASHINFER, "flashinfer/jit/utils.py:33"),
            "h100",
            queries_on_pages(4, 16, None, 1)?,
        )
        .rejects(paged(DType::F32, DType::F32, 4, 4, 32, 8, 128, 16, Layout::Nhd, DType::I32), "DTYPE_UNSUPPORTED"),
        fact(
            "flashinfer.paged_attention.prefill",
            "dtype_requirements",
            src(FLASHINFER, "include/flashinfer/attention/prefill.cuh:2751"),
            "a100",
            queries_on_pages(4, 16, None, 1)?,
        )
        .rejects_on("t4", queries_on_pages(4, 16, None, 1)?, "DTYPE_UNSUPPORTED_ON_HARDWARE"),
        fact(
            "flashinfer.paged_attention.decode",
            "dtypes",
            src(FLASHINFER, "flashinfer/jit/utils.py:33"),
            "h100",
            pages(16, None, 1)?,
        )
        .rejects(paged(DType::F32, DType::F32, 4, 1, 32, 8, 128, 16, Layout::Nhd, DType::I32), "DTYPE_UNSUPPORTED"),
        fact(
            "flashinfer.paged_attention.decode",
            "head_dim",
            src(FLASHINFER, "include/flashinfer/utils.cuh:197"),
            "h100",
            pages(16, None, 1)?,
        )
        .rejects(paged(DType::BF16, DType::BF16, 4, 1, 32, 8, 96, 16, Layout::Nhd, DType::I32), "HEAD_DIM_UNSUPPORTED"),
        fact(
            "flashinfer.paged_attention.prefill",
            "kv_cache_strides",
            src(FLASHINFER, "csrc/page.cu:34"),
            "h100",
            queries_on_pages(4, 16, Some(2 * 16 * 8 * 128), 1)?,
        )
        .rejects(queries_on_pages(4, 16, Some(2 * 16 * 8 * 128), 2)?, "KV_CACHE_STRIDES_UNSUPPORTED"),
        fact(
            "flashinfer.paged_attention.prefill_fa3",
            "kv_cache_strides",
            src(FLASHINFER, "csrc/page.cu:34"),
            "h100",
            queries_on_pages(4, 16, Some(2 * 16 * 8 * 128), 1)?,
        )
        .rejects(queries_on_pages(4, 16, Some(2 * 16 * 8 * 128), 2)?, "KV_CACHE_STRIDES_UNSUPPORTED"),
        fact(
            "flashinfer.paged_attention.decode",
            "gqa",
            src(FLASHINFER, "include/flashinfer/utils.cuh:142"),
            "h100",
            pages(16, None, 1)?,
        )
        .rejects(
            paged(DType::BF16, DType::BF16, 4, 1, 40, 8, 128, 16, Layout::Nhd, DType::I32),
            "GQA_GROUP_SIZE_UNSUPPORTED",
        ),
        fact(
            "flashinfer.attention.prefill_fa3",
            "exclusive",
            src(FLASHINFER, "flashinfer/prefill.py:1376"),
            "h100",
            attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128),
        )
        .rejects(windowed(attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128)), "FEATURES_EXCLUSIVE"),
        // The window alone is taken; only with fp8 queries is it refused.
        fact(
            "flashinfer.attention.prefill_fa3",
            "window",
            src(FLASHINFER, "include/flashinfer/attention/hopper/prefill_sm90.cuh:251"),
            "h100",
            windowed(bf16(2, 128, 128, 16, 16, 128)),
        )
        .rejects(windowed(attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128)), "FEATURES_EXCLUSIVE"),
        fact(
            "flashinfer.attention.prefill",
            "masks",
            src(FLASHINFER, "flashinfer/utils.py:43"),
            "h100",
            bf16(2, 128, 128, 16, 16, 128).tensor("mask", TensorDesc::new(DType::Bool, [2, 1, 128, 128])),
        )
        .rejects(
            bf16(2, 128, 128, 16, 16, 128).tensor("mask", TensorDesc::new(DType::BF16, [2, 1, 128, 128])),
            "MASK_UNSUPPORTED",
        ),
        fact(
            "flashinfer.attention.decode",
            "head_dim",
            src(FLASHINFER, "include/flashinfer/attention/decode.cuh:671"),
            "h100",
            bf16(4, 1, 512, 32, 8, 128),
        )
        .rejects(bf16(4, 1, 512, 32, 8, 96), "HEAD_DIM_UNSUPPORTED"),
    ])
}

fn decode() -> TestResult<Vec<Fact>> {
    const K: &str = "flashinfer.attention.decode";
    let one = || bf16(4, 1, 512, 32, 8, 128);
    let mut rows = fused_rope(K, "include/flashinfer/attention/decode.cuh:267", one());
    rows.extend(vec![
        fact(
            "flashinfer.attention.decode",
            "kv_dtypes",
            src(FLASHINFER, "tests/attention/test_batch_decode_kernels.py:110"),
            "h100",
            kv_in(attention(DType::F16, 1, 1, 128, 32, 32, 128), DType::Fp8E4M3),
        ),
        fact(
            "flashinfer.attention.decode",
            "head_dim_requirements",
            src(FLASHINFER, "tests/attention/test_batch_decode_kernels.py:38"),
            "a100",
            attention(DType::F16, 1, 1, 128, 32, 32, 512),
        )
        .rejects_on("t4", attention(DType::F16, 1, 1, 128, 32, 32, 512), "HEAD_DIM_UNSUPPORTED_ON_HARDWARE"),
        // T4 (sm 7.5) is the oldest GPU among the named profiles: nothing older to reject on.
        fact(
            K,
            "compute_capability",
            src(FLASHINFER, "README.md:67"),
            "t4",
            attention(DType::F16, 4, 1, 512, 32, 8, 128),
        ),
        fact(
            K,
            "gqa",
            src(FLASHINFER, "include/flashinfer/attention/decode.cuh:675"),
            "h100",
            bf16(4, 1, 512, 32, 4, 128),
        )
        .rejects(bf16(4, 1, 512, 40, 8, 128), "GQA_GROUP_SIZE_UNSUPPORTED"),
        fact(K, "seq_len_q", src(FLASHINFER, "flashinfer/decode.py:577"), "h100", one())
            .rejects(bf16(4, 2, 512, 32, 8, 128), "SEQ_LEN_Q_UNSUPPORTED"),
        // No upstream line names a causal decode: q is one token per head, for which a
        // bottom-right mask masks nothing (the call is non-causal); top-left would hide all
        // keys but the first.
        fact(K, "causal", src(FLASHINFER, "flashinfer/decode.py:577"), "h100", causal_br(one()))
            .rejects(top_left(one()), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        fact(K, "window", src(FLASHINFER, "flashinfer/decode.py:719"), "h100", windowed(one())),
        fact(K, "softcap", src(FLASHINFER, "flashinfer/decode.py:720"), "h100", capped(one())),
        fact(K, "alibi", src(FLASHINFER, "flashinfer/decode.py:728"), "h100", alibi_on(one())),
        fact(K, "custom_scale", src(FLASHINFER, "flashinfer/decode.py:610"), "h100", sm_scaled(one())),
        // BSHD and BHSD are the only dense layouts: k[b] is an NHD or an HND block.
        fact(
            K,
            "layouts",
            src(FLASHINFER, "flashinfer/decode.py:579"),
            "h100",
            head_first(DType::BF16, 4, 1, 512, 32, 8, 128),
        ),
        fact(K, "strides", src(FLASHINFER, "csrc/single_decode.cu:37"), "h100", one())
            .rejects(k_heads_apart(one())?, "NOT_CONTIGUOUS"),
    ]);
    Ok(rows)
}

fn dense_prefill() -> TestResult<Vec<Fact>> {
    const K: &str = "flashinfer.attention.prefill";
    let mha = || bf16(2, 128, 128, 16, 16, 128);
    let mask = |heads: u64| mha().tensor("mask", TensorDesc::new(DType::Bool, [2, heads, 128, 128]));
    let mut rows = fused_rope(K, "include/flashinfer/attention/prefill.cuh:1014", mha());
    let ragged = |sq: u64, sk: u64| {
        bf16(1, sq, sk, 16, 16, 128)
            .tensor("cu_seqlens_q", TensorDesc::new(DType::I32, [4]))
            .tensor("cu_seqlens_k", TensorDesc::new(DType::I32, [4]))
    };
    rows.extend(vec![
        // Causal with more queries than keys: the ragged wrapper runs it (the custom-mask
        // test's causal call), single prefill refuses it (prefill.cuh:2533).
        fact(
            K,
            "single_path_only",
            src(FLASHINFER, "tests/attention/test_batch_prefill_kernels.py:1045"),
            "a100",
            causal_br(ragged(600, 300)),
        )
        .rejects(causal_br(bf16(2, 256, 128, 16, 16, 128)), "CAUSAL_SEQ_Q_EXCEEDS_SEQ_K"),
        // DeepSeek's (192, 128) on the FA2 backend, on every GPU.
        fact(
            K,
            "head_dim_pairs",
            src(FLASHINFER, "tests/attention/test_deepseek_mla.py:176"),
            "a100",
            v_dim(attention(DType::F16, 2, 128, 128, 16, 16, 192), 128),
        )
        .rejects(v_dim(attention(DType::F16, 2, 128, 128, 16, 16, 192), 64), "HEAD_DIM_V_MISMATCH"),
        fact(
            K,
            "head_dim_requirements",
            src(FLASHINFER, "tests/attention/test_batch_prefill_kernels.py:881"),
            "a100",
            attention(DType::F16, 2, 128, 128, 16, 16, 512),
        )
        .rejects_on("t4", attention(DType::F16, 2, 128, 128, 16, 16, 512), "HEAD_DIM_UNSUPPORTED_ON_HARDWARE"),
        fact(
            K,
            "kv_dtypes",
            src(FLASHINFER, "tests/attention/test_fp8_prefill.py:133"),
            "h100",
            kv_in(attention(DType::F16, 2, 128, 128, 16, 16, 128), DType::Fp8E4M3),
        )
        .rejects(kv_in(attention(DType::F16, 2, 128, 128, 16, 16, 128), DType::F32), "DTYPE_MISMATCH"),
        // One [qo_len, kv_len] mask per request, for every head.
        fact(K, "mask_shared_by_heads", src(FLASHINFER, "flashinfer/prefill.py:1239"), "h100", mask(1))
            .rejects(mask(16), "MASK_PER_HEAD_UNSUPPORTED"),
        // T4 (sm 7.5) is the oldest GPU among the named profiles: nothing older to reject on.
        fact(
            K,
            "compute_capability",
            src(FLASHINFER, "README.md:67"),
            "t4",
            attention(DType::F16, 2, 128, 128, 16, 16, 128),
        ),
        // Any group size: the kernel divides heads by `group_size` at run time.
        fact(K, "gqa", src(FLASHINFER, "csrc/single_prefill.cu:88"), "h100", bf16(2, 128, 128, 40, 8, 128)),
        // One [qo_len, kv_len] keep-mask per request, shared by every head.
        fact(
            K,
            "mask_broadcast",
            src(FLASHINFER, "flashinfer/prefill.py:1239"),
            "h100",
            mha().tensor("mask", TensorDesc::new(DType::Bool, [2, 1, 128, 128])),
        ),
        fact(K, "window", src(FLASHINFER, "flashinfer/prefill.py:1430"), "h100", windowed(mha())),
        fact(K, "softcap", src(FLASHINFER, "flashinfer/prefill.py:1431"), "h100", capped(mha())),
        fact(K, "alibi", src(FLASHINFER, "flashinfer/prefill.py:1446"), "h100", alibi_on(mha())),
        fact(K, "custom_scale", src(FLASHINFER, "flashinfer/prefill.py:1271"), "h100", sm_scaled(mha())),
        fact(K, "varlen", src(FLASHINFER, "flashinfer/prefill.py:3482"), "h100", packed()),
        // BSHD and BHSD are the only dense layouts: q/k/v are read through (stride_n, stride_h).
        fact(
            K,
            "layouts",
            src(FLASHINFER, "csrc/single_prefill.cu:46"),
            "h100",
            head_first(DType::BF16, 2, 128, 128, 16, 16, 128),
        ),
        fact(K, "strides", src(FLASHINFER, "csrc/single_prefill.cu:46"), "h100", k_heads_apart(mha())?)
            .rejects(strided_v(mha())?, "LAST_DIM_NOT_CONTIGUOUS"),
    ]);
    Ok(rows)
}

fn dense_prefill_fa3() -> TestResult<Vec<Fact>> {
    const K: &str = "flashinfer.attention.prefill_fa3";
    let mha = || bf16(2, 128, 128, 16, 16, 128);
    Ok(vec![
        fact(K, "softcap", src(FLASHINFER, "tests/attention/test_hopper.py:53"), "h100", capped(mha()))
            .rejects(capped(attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128)), "FEATURES_EXCLUSIVE"),
        // fp8 with a window: refused by single prefill only; the ragged wrapper runs it.
        fact(
            K,
            "single_path_only",
            src(FLASHINFER, "tests/attention/test_hopper_fp8_sliding_window.py:57"),
            "h100",
            windowed(
                attention(DType::Fp8E4M3, 1, 300, 300, 16, 16, 128)
                    .tensor("cu_seqlens_q", TensorDesc::new(DType::I32, [4]))
                    .tensor("cu_seqlens_k", TensorDesc::new(DType::I32, [4])),
            ),
        ),
        fact(
            K,
            "head_dim_pairs",
            src(FLASHINFER, "tests/attention/test_hopper.py:129"),
            "h100",
            v_dim(bf16(2, 128, 128, 16, 16, 192), 128),
        )
        .rejects(v_dim(bf16(2, 128, 128, 16, 16, 192), 64), "HEAD_DIM_V_MISMATCH"),
        fact(K, "built_archs", src(FLASHINFER, "flashinfer/utils.py:636"), "h100", mha()).rejects_on(
            "a100",
            mha(),
            "NO_KERNEL_IMAGE_FOR_ARCH",
        ),
        // sm_90a code does not run on sm 10.0 either.
        fact(K, "built_archs", src(FLASHINFER, "flashinfer/utils.py:636"), "h200", mha()).rejects_on(
            "b200",
            mha(),
            "NO_KERNEL_IMAGE_FOR_ARCH",
        ),
        fact(K, "dtypes", src(FLASHINFER, "flashinfer/jit/utils.py:33"), "h100", mha())
            .rejects(attention(DType::F32, 2, 128, 128, 16, 16, 128), "DTYPE_UNSUPPORTED"),
        // Both fp8 formats are run as q/k/v by upstream's FA3 test (fp8_e5m2 added here).
        fact(
            K,
            "dtypes",
            src(FLASHINFER, "tests/attention/test_hopper_fp8_attention.py:180"),
            "h100",
            attention(DType::Fp8E5M2, 2, 128, 128, 16, 16, 128),
        ),
        fact(K, "head_dim", src(FLASHINFER, "flashinfer/utils.py:478"), "h100", bf16(2, 128, 128, 16, 16, 256))
            .rejects(bf16(2, 128, 128, 16, 16, 192), "HEAD_DIM_UNSUPPORTED"),
        fact(K, "gqa", src(FLASHINFER, "csrc/single_prefill_sm90.cu:79"), "h100", bf16(2, 128, 128, 40, 8, 128)),
        fact(
            K,
            "causal",
            src(FLASHINFER, "include/flashinfer/attention/hopper/mainloop_mma.cuh:94"),
            "h100",
            causal_br(bf16(2, 64, 128, 16, 16, 128)),
        )
        .rejects(top_left(bf16(2, 64, 128, 16, 16, 128)), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        // The causal KV tile count is computed from kv_len - qo_len.
        fact(
            K,
            "causal",
            src(FLASHINFER, "include/flashinfer/attention/hopper/mainloop.cuh:148"),
            "h100",
            causal_br(bf16(2, 128, 128, 16, 16, 128)),
        )
        .rejects(causal_br(bf16(2, 128, 64, 16, 16, 128)), "CAUSAL_SEQ_Q_EXCEEDS_SEQ_K"),
        fact(K, "custom_scale", src(FLASHINFER, "flashinfer/prefill.py:1271"), "h100", sm_scaled(mha())),
        fact(K, "varlen", src(FLASHINFER, "flashinfer/prefill.py:3482"), "h100", packed()),
        // BHSD reaches the kernel as an NHD view with (stride_n, stride_h) = (D, S*D): the
        // sm90 entry reads kv_len and heads from k.size(0) and k.size(1) whatever kv_layout says
        // (csrc/single_prefill_sm90.cu:75, 77), so kv_layout="HND" is not the way in.
        fact(
            K,
            "layouts",
            src(FLASHINFER, "csrc/single_prefill_sm90.cu:64"),
            "h100",
            head_first(DType::BF16, 2, 128, 128, 16, 16, 128),
        ),
        fact(
            K,
            "strides",
            src(FLASHINFER, "include/flashinfer/attention/hopper/utils.cuh:58"),
            "h100",
            k_heads_apart(mha())?,
        )
        .rejects(strided_v(mha())?, "LAST_DIM_NOT_CONTIGUOUS"),
    ])
}

fn paged_decode() -> TestResult<Vec<Fact>> {
    const K: &str = "flashinfer.paged_attention.decode";
    let one = || pages(16, None, 1);
    let mut rows = fused_rope(K, "include/flashinfer/attention/decode.cuh:466", one()?);
    rows.extend(vec![
        // T4 (sm 7.5) is the oldest GPU among the named profiles: nothing older to reject on.
        fact(
            K,
            "compute_capability",
            src(FLASHINFER, "README.md:67"),
            "t4",
            paged16(DType::F16, DType::F16, 1, 32, 128, Layout::Nhd, DType::I32),
        ),
        fact(K, "seq_len_q", src(FLASHINFER, "flashinfer/decode.py:1474"), "h100", one()?)
            .rejects(queries_on_pages(2, 16, None, 1)?, "SEQ_LEN_Q_UNSUPPORTED"),
        // One query per request is planned non-causal: a bottom-right mask over one query
        // masks nothing; top-left would hide all keys but the first.
        fact(K, "causal", src(FLASHINFER, "flashinfer/decode.py:1469"), "h100", causal_br(one()?))
            .rejects(top_left(one()?), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        fact(K, "window", src(FLASHINFER, "flashinfer/decode.py:1749"), "h100", windowed(one()?)),
        fact(K, "softcap", src(FLASHINFER, "flashinfer/decode.py:1750"), "h100", capped(one()?)),
        fact(K, "alibi", src(FLASHINFER, "flashinfer/decode.py:2278"), "h100", alibi_on(one()?)),
        fact(K, "custom_scale", src(FLASHINFER, "flashinfer/decode.py:1339"), "h100", sm_scaled(one()?)),
        // The executor turns the block table into int32 paged_kv_indptr / paged_kv_indices.
        fact(K, "block_table_dtypes", src(FLASHINFER, "flashinfer/decode.py:1299"), "h100", one()?).rejects(
            paged16(DType::BF16, DType::BF16, 1, 32, 128, Layout::Nhd, DType::I64),
            "BLOCK_TABLE_DTYPE_UNSUPPORTED",
        ),
        // NHD and HND are the only paged layouts.
        fact(
            K,
            "kv_cache_layouts",
            src(FLASHINFER, "flashinfer/decode.py:841"),
            "h100",
            paged16(DType::BF16, DType::BF16, 1, 32, 128, Layout::Hnd, DType::I32),
        ),
        fact(
            K,
            "kv_cache_dtypes",
            src(FLASHINFER, "flashinfer/jit/utils.py:46"),
            "h100",
            paged16(DType::BF16, DType::Fp8E5M2, 1, 32, 128, Layout::Nhd, DType::I32),
        )
        .rejects(paged16(DType::BF16, DType::F32, 1, 32, 128, Layout::Nhd, DType::I32), "KV_CACHE_DTYPE_UNSUPPORTED"),
        // Head dims above 256: SM80 and newer; with an fp8 cache, SM100 and newer.
        fact(
            K,
            "head_dim_requirements",
            src(FLASHINFER, "tests/attention/test_batch_decode_kernels.py:38"),
            "a100",
            paged16(DType::F16, DType::F16, 1, 32, 512, Layout::Nhd, DType::I32),
        )
        .rejects_on(
            "t4",
            paged16(DType::F16, DType::F16, 1, 32, 512, Layout::Nhd, DType::I32),
            "HEAD_DIM_UNSUPPORTED_ON_HARDWARE",
        ),
        fact(
            K,
            "head_dim_requirements",
            src(FLASHINFER, "tests/attention/test_batch_decode_kernels.py:48"),
            "b200",
            paged16(DType::F16, DType::Fp8E4M3, 1, 32, 512, Layout::Nhd, DType::I32),
        )
        .rejects_on(
            "h100",
            paged16(DType::F16, DType::Fp8E4M3, 1, 32, 512, Layout::Nhd, DType::I32),
            "HEAD_DIM_UNSUPPORTED_ON_HARDWARE",
        ),
        fact(
            K,
            "kv_cache_equal_strides",
            src(FLASHINFER, "tests/attention/test_batch_decode_kernels.py:978"),
            "h100",
            one()?,
        )
        .rejects(v_padded(one()?)?, "KV_CACHE_STRIDES_UNSUPPORTED"),
    ]);
    Ok(rows)
}

/// `req` with its V cache's pages padded (a page stride one row longer than K's).
fn v_padded(req: Request) -> TestResult<Request> {
    let v: TensorDesc = req.get("v_cache").cloned().ok_or("no v_cache")?;
    let (page, heads, d) = (v.shape[1], v.shape[2], v.shape[3]);
    let v = v.with_strides([(page + 1) * heads * d, heads * d, d, 1]);
    Ok(req.tensor("v_cache", v))
}

fn paged_prefill() -> TestResult<Vec<Fact>> {
    const K: &str = "flashinfer.paged_attention.prefill";
    let four = || queries_on_pages(4, 16, None, 1);
    let mut rows = fused_rope(K, "include/flashinfer/attention/prefill.cuh:3715", four()?);
    rows.extend(vec![
        // T4 (sm 7.5) is the oldest GPU among the named profiles: nothing older to reject on.
        fact(
            K,
            "compute_capability",
            src(FLASHINFER, "README.md:67"),
            "t4",
            paged16(DType::F16, DType::F16, 4, 32, 128, Layout::Nhd, DType::I32),
        ),
        // Fewer than 4 MMA tiles of 16 along the value head dim is an invalid configuration.
        fact(
            K,
            "head_dim",
            src(FLASHINFER, "include/flashinfer/attention/prefill.cuh:309"),
            "h100",
            paged16(DType::BF16, DType::BF16, 4, 32, 256, Layout::Nhd, DType::I32),
        )
        .rejects(paged16(DType::BF16, DType::BF16, 4, 32, 32, Layout::Nhd, DType::I32), "HEAD_DIM_UNSUPPORTED"),
        fact(
            K,
            "gqa",
            src(FLASHINFER, "include/flashinfer/attention/scheduler.cuh:776"),
            "h100",
            paged16(DType::BF16, DType::BF16, 4, 40, 128, Layout::Nhd, DType::I32),
        ),
        // The paged kernel bounds causal KV by kv_len - qo_len: bottom-right, and a query
        // longer than its keys has rows with nothing to attend.
        fact(K, "causal", src(FLASHINFER, "include/flashinfer/attention/prefill.cuh:3823"), "h100", causal_br(four()?))
            .rejects(top_left(four()?), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        // More queries than keys: the rows before the first key give zeros.
        fact(
            K,
            "causal",
            src(FLASHINFER, "tests/attention/test_batch_prefill_kernels.py:2363"),
            "h100",
            causal_br(queries_on_pages(256, 16, None, 1)?),
        ),
        fact(
            K,
            "head_dim_requirements",
            src(FLASHINFER, "tests/attention/test_batch_prefill_kernels.py:341"),
            "a100",
            paged16(DType::F16, DType::F16, 4, 32, 512, Layout::Nhd, DType::I32),
        )
        .rejects_on(
            "t4",
            paged16(DType::F16, DType::F16, 4, 32, 512, Layout::Nhd, DType::I32),
            "HEAD_DIM_UNSUPPORTED_ON_HARDWARE",
        ),
        fact(K, "window", src(FLASHINFER, "flashinfer/prefill.py:2525"), "h100", windowed(four()?)),
        fact(K, "softcap", src(FLASHINFER, "flashinfer/prefill.py:2526"), "h100", capped(four()?)),
        fact(K, "alibi", src(FLASHINFER, "flashinfer/prefill.py:3098"), "h100", alibi_on(four()?)),
        fact(K, "custom_scale", src(FLASHINFER, "flashinfer/prefill.py:2216"), "h100", sm_scaled(four()?)),
        // The executor turns the block table into int32 paged_kv_indptr / paged_kv_indices.
        fact(K, "block_table_dtypes", src(FLASHINFER, "flashinfer/prefill.py:1566"), "h100", four()?).rejects(
            paged16(DType::BF16, DType::BF16, 4, 32, 128, Layout::Nhd, DType::I64),
            "BLOCK_TABLE_DTYPE_UNSUPPORTED",
        ),
        // NHD and HND are the only paged layouts.
        fact(
            K,
            "kv_cache_layouts",
            src(FLASHINFER, "flashinfer/prefill.py:1667"),
            "h100",
            paged16(DType::BF16, DType::BF16, 4, 32, 128, Layout::Hnd, DType::I32),
        ),
        fact(
            K,
            "kv_cache_dtypes",
            src(FLASHINFER, "flashinfer/jit/utils.py:46"),
            "h100",
            paged16(DType::BF16, DType::Fp8E4M3, 4, 32, 128, Layout::Nhd, DType::I32),
        )
        .rejects(paged16(DType::BF16, DType::F32, 4, 32, 128, Layout::Nhd, DType::I32), "KV_CACHE_DTYPE_UNSUPPORTED"),
    ]);
    Ok(rows)
}

fn paged_prefill_fa3() -> TestResult<Vec<Fact>> {
    const K: &str = "flashinfer.paged_attention.prefill_fa3";
    let four = || queries_on_pages(4, 16, None, 1);
    Ok(vec![
        fact(K, "softcap", src(FLASHINFER, "tests/attention/test_hopper.py:215"), "h100", capped(four()?)),
        fact(
            K,
            "window",
            src(FLASHINFER, "tests/attention/test_hopper_fp8_sliding_window.py:101"),
            "h100",
            windowed(four()?),
        ),
        fact(K, "exclusive", src(FLASHINFER, "tests/attention/test_hopper.py:215"), "h100", capped(four()?)).rejects(
            capped(paged16(DType::Fp8E4M3, DType::Fp8E4M3, 4, 32, 128, Layout::Nhd, DType::I32)),
            "FEATURES_EXCLUSIVE",
        ),
        fact(K, "built_archs", src(FLASHINFER, "flashinfer/utils.py:636"), "h100", four()?).rejects_on(
            "a100",
            four()?,
            "NO_KERNEL_IMAGE_FOR_ARCH",
        ),
        fact(K, "dtypes", src(FLASHINFER, "flashinfer/jit/utils.py:33"), "h100", four()?)
            .rejects(paged16(DType::F32, DType::F32, 4, 32, 128, Layout::Nhd, DType::I32), "DTYPE_UNSUPPORTED"),
        // Both fp8 formats are run as q and pages by upstream's FA3 paged test (fp8_e5m2 added here).
        fact(
            K,
            "dtypes",
            src(FLASHINFER, "tests/attention/test_hopper_fp8_attention.py:447"),
            "h100",
            paged16(DType::Fp8E5M2, DType::Fp8E5M2, 4, 32, 128, Layout::Nhd, DType::I32),
        ),
        fact(
            K,
            "head_dim",
            src(FLASHINFER, "flashinfer/utils.py:478"),
            "h100",
            paged16(DType::BF16, DType::BF16, 4, 32, 256, Layout::Nhd, DType::I32),
        )
        .rejects(paged16(DType::BF16, DType::BF16, 4, 32, 192, Layout::Nhd, DType::I32), "HEAD_DIM_UNSUPPORTED"),
        fact(
            K,
            "gqa",
            src(FLASHINFER, "include/flashinfer/attention/scheduler.cuh:1017"),
            "h100",
            paged16(DType::BF16, DType::BF16, 4, 40, 128, Layout::Nhd, DType::I32),
        ),
        fact(
            K,
            "causal",
            src(FLASHINFER, "include/flashinfer/attention/hopper/mainloop_mma.cuh:94"),
            "h100",
            causal_br(four()?),
        )
        .rejects(top_left(four()?), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        fact(
            K,
            "causal",
            src(FLASHINFER, "include/flashinfer/attention/hopper/mainloop.cuh:148"),
            "h100",
            causal_br(four()?),
        )
        .rejects(causal_br(queries_on_pages(256, 16, None, 1)?), "CAUSAL_SEQ_Q_EXCEEDS_SEQ_K"),
        fact(K, "custom_scale", src(FLASHINFER, "flashinfer/prefill.py:2216"), "h100", sm_scaled(four()?)),
        // The executor turns the block table into int32 paged_kv_indptr / paged_kv_indices.
        fact(K, "block_table_dtypes", src(FLASHINFER, "flashinfer/prefill.py:1566"), "h100", four()?).rejects(
            paged16(DType::BF16, DType::BF16, 4, 32, 128, Layout::Nhd, DType::I64),
            "BLOCK_TABLE_DTYPE_UNSUPPORTED",
        ),
        // Conservative: the sm90 paged entry does read HND pages (csrc/batch_prefill_sm90.cu:185),
        // but upstream's FA3 paged tests run NHD pages only.
        fact(
            K,
            "kv_cache_layouts",
            src(FLASHINFER, "tests/attention/test_hopper_fp8_attention.py:522"),
            "h100",
            four()?,
        )
        .rejects(paged16(DType::BF16, DType::BF16, 4, 32, 128, Layout::Hnd, DType::I32), "KV_CACHE_LAYOUT_UNSUPPORTED"),
    ])
}
