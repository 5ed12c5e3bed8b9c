//! PyTorch SDPA facts (`capabilities/torch_sdpa.json`) on CUDA, CPU and ROCm, each held to its
//! upstream line.
//!
//! The gates live in `sdp_utils.cpp` (CUDA and, under `USE_ROCM`, ROCm), `sdp_utils_cpp.cpp`
//! (CPU) and the shared header `sdp_utils_cpp.h`, each at the commit the capability file names.
//! The math backends have no gate at all: `select_sdp_backend` returns `math` whenever it is
//! enabled, and the composite `_scaled_dot_product_attention_math` (attention.cpp) takes what
//! the fused kernels refuse. attention.cpp is stored in the index without a commit (index id
//! 40065839), so a math row cites the unconditional `case SDPBackend::math` line and says what
//! the composite does in a comment.
//!
//! SDPA takes (B, H, S, D) tensors; a BSHD tensor is its transposed view. The only layout
//! filter is therefore the stride(-1) == 1 check, which each fused kernel's `layouts` row cites.
//!
//! The gfx rows of the ROCm kernels are in `rocm.rs`.

use super::*;

/// `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp` (CUDA and ROCm gates).
const PYTORCH_SDP_UTILS: &str = "pytorch/pytorch@001f694aef6f922b4fdf6d27d59162d27bf3df58";
/// `aten/src/ATen/native/transformers/sdp_utils_cpp.h` (checks shared by every backend).
const PYTORCH_SDP_HEADER: &str = "pytorch/pytorch@0119c2052192720d6fe53677e485675727edb8c4";
/// `aten/src/ATen/native/transformers/sdp_utils_cpp.cpp` (the CPU gate).
const PYTORCH_SDP_CPU: &str = "pytorch/pytorch@02315a42ce3ea4b67cbecac2696552f95f24fec8";

const CUDA_GATES: &str = "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp";
const HEADER: &str = "aten/src/ATen/native/transformers/sdp_utils_cpp.h";
const CPU_GATES: &str = "aten/src/ATen/native/transformers/sdp_utils_cpp.cpp";

/// `sdp_utils.cpp:line`.
fn gate(line: u32) -> Source {
    src(PYTORCH_SDP_UTILS, &format!("{CUDA_GATES}:{line}"))
}

/// `sdp_utils_cpp.h:line`.
fn shared(line: u32) -> Source {
    src(PYTORCH_SDP_HEADER, &format!("{HEADER}:{line}"))
}

/// `sdp_utils_cpp.cpp:line`.
fn cpu_gate(line: u32) -> Source {
    src(PYTORCH_SDP_CPU, &format!("{CPU_GATES}:{line}"))
}

/// `case SDPBackend::math` in `select_sdp_backend`: no filter before the math backend (CUDA,
/// and the same file on ROCm).
const MATH_CASE: u32 = 1212;
/// The same case in `select_sdp_backend_cpp`.
const MATH_CASE_CPU: u32 = 84;

/// `[2, 128, 16, d]` self-attention in `dtype` (BSHD).
fn dense(dtype: DType, d: u64) -> Request {
    attention(dtype, 2, 128, 128, 16, 16, d)
}

/// bf16 self-attention of head dim 128.
fn base() -> Request {
    dense(DType::BF16, 128)
}

/// `req` with `v` of head dim `dv` (q and k keep theirs).
fn v_dim(req: Request, dv: u64) -> TestResult<Request> {
    let v: TensorDesc = req.get("v").cloned().ok_or("no v")?;
    let mut shape = v.shape.clone();
    shape[3] = dv;
    Ok(req.tensor("v", TensorDesc { shape, ..v }))
}

/// bf16 self-attention with q, k and v in BHSD (`[2, 16, 128, 128]`).
fn bhsd() -> TestResult<Request> {
    head_major(bf16(2, 128, 128, 16, 16, 128))
}

/// [`base`] with a `dtype` mask of `shape`.
fn masked(dtype: DType, shape: &[u64]) -> Request {
    base().tensor("mask", TensorDesc::new(dtype, shape.to_vec()))
}

/// A full bool mask for [`base`].
fn bool_mask() -> Request {
    masked(DType::Bool, &[2, 16, 128, 128])
}

/// A full additive mask of `dtype` for [`base`] (bf16 queries).
fn float_mask(dtype: DType) -> Request {
    masked(dtype, &[2, 16, 128, 128])
}

/// The test suite's file at the cited commit (tools/upstream_cases reads it).
const PYTORCH_TESTS: &str = "pytorch/pytorch@001f694aef6f922b4fdf6d27d59162d27bf3df58";

/// [`float_mask`] of q's dtype whose last dimension has stride 2.
fn strided_mask() -> Request {
    let m = TensorDesc::new(DType::BF16, [2, 16, 128, 128]).with_strides([16 * 128 * 256, 128 * 256, 256, 2]);
    base().tensor("mask", m)
}

/// A `[seq_q, seq_k]` bool mask, broadcast over batch and heads.
fn broadcast_mask() -> Request {
    masked(DType::Bool, &[128, 128])
}

/// [`base`] with a caller's softmax scale.
fn scaled() -> Request {
    attrs(base(), AttentionAttrs { scale: Some(0.05), ..AttentionAttrs::default() })
}

/// 32 query heads over 8 KV heads.
fn grouped() -> Request {
    bf16(2, 128, 128, 32, 8, 128)
}

/// 64 queries over 128 keys.
fn short_q() -> Request {
    bf16(2, 64, 128, 16, 16, 128)
}

/// `req` causal, aligned bottom-right (not what `is_causal` means).
fn bottom_right(req: Request) -> Request {
    attrs(req, layerzero_tests::causal())
}

pub(super) fn facts() -> TestResult<Vec<Fact>> {
    let mut rows = cudnn()?;
    rows.extend(efficient()?);
    rows.extend(flash()?);
    rows.extend(math()?);
    rows.extend(cpu()?);
    rows.extend(rocm()?);
    Ok(rows)
}

/// `torch_sdpa.attention.cudnn`: `can_use_cudnn_attention`.
fn cudnn() -> TestResult<Vec<Fact>> {
    const K: &str = "torch_sdpa.attention.cudnn";
    Ok(vec![
        // check_cudnn_hardware_support: [sm80, sm121].
        fact(K, "compute_capability", gate(879), "a100", base()).rejects_on("t4", base(), "COMPUTE_CAPABILITY_TOO_OLD"),
        // check_dtypes_low_precision on sm80+: {Half, BFloat16}.
        fact(K, "dtypes", gate(916), "h100", base()).rejects(dense(DType::F32, 128), "DTYPE_UNSUPPORTED"),
        // check_cudnn_tensor_shapes: head_dim_limit 128 (256 and 192 only on sm90/sm10x with a
        // recent cuDNN: declared at the portable 128, held on an A100 where 128 is the limit).
        fact(K, "head_dim", gate(662), "a100", base()).rejects(dense(DType::BF16, 136), "HEAD_DIM_TOO_LARGE"),
        fact(K, "head_dim", gate(685), "a100", dense(DType::BF16, 120))
            .rejects(dense(DType::BF16, 100), "HEAD_DIM_ALIGNMENT"),
        fact(K, "gqa", gate(1006), "h100", grouped()),
        // is_causal is the top-left mask (the memory-efficient kernels' CausalFromTopLeft);
        // cuDNN has no square-only gate, unlike flash.
        fact(K, "causal", shared(32), "h100", top_left(short_q()))
            .rejects(bottom_right(short_q()), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        // check_attn_mask_shape is in cuDNN's gate list (no check_for_attn_mask as in flash).
        fact(K, "masks", gate(993), "h100", bool_mask()),
        // No gate compares the mask's dtype with q's, and the test suite runs an f32 mask
        // under 16-bit queries: either dtype is taken.
        fact(K, "masks", src(PYTORCH_TESTS, "test/test_transformers.py:4039"), "h100", float_mask(DType::F32)),
        fact(
            K,
            "different_v_head_dim",
            src(PYTORCH_TESTS, "test/test_transformers.py:3183"),
            "h100",
            v_dim(base(), 64)?,
        ),
        // check_attn_mask_shape: 2-D, or 4-D with batch and heads each 1 or full.
        fact(K, "mask_broadcast", shared(289), "h100", broadcast_mask()),
        // The `scale` argument replaces 1/sqrt(head_dim) for every backend.
        fact(K, "custom_scale", shared(52), "h100", scaled()),
        // The only layout filter is stride(-1) == 1 (check_cudnn_layout is not in the list): a
        // BSHD tensor is a transposed (B, H, S, D) view and passes, as does BHSD.
        fact(K, "layouts", gate(1005), "h100", bhsd()?),
        fact(K, "strides", gate(1005), "h100", base()).rejects(strided_v(base())?, "LAST_DIM_NOT_CONTIGUOUS"),
        fact(K, "mask_strides", src(PYTORCH_TESTS, "test/test_transformers.py:1884"), "h100", float_mask(DType::BF16))
            .rejects(strided_mask(), "LAST_DIM_NOT_CONTIGUOUS"),
        fact(K, "max_batch_and_heads", src(PYTORCH_TESTS, "test/test_transformers.py:3703"), "h100", base())
            .rejects(attention(DType::F16, 65536, 4, 4, 1, 1, 8), "BATCH_OR_HEADS_TOO_LARGE"),
    ])
}

/// `torch_sdpa.attention.efficient`: `can_use_mem_efficient_attention` without `USE_ROCM`.
fn efficient() -> TestResult<Vec<Fact>> {
    const K: &str = "torch_sdpa.attention.efficient";
    Ok(vec![
        // check_mem_efficient_hardware_support: [sm50, sm121]. No shipped profile lies outside
        // that range, so the row shows the low side only (a T4, sm75, is taken).
        fact(K, "compute_capability", gate(528), "t4", dense(DType::F16, 128)),
        fact(K, "dtypes", gate(1107), "a100", dense(DType::F32, 128))
            .rejects(dense(DType::Fp8E4M3, 128), "DTYPE_UNSUPPORTED"),
        // Below sm80 the list is {Half, Float}.
        fact(K, "dtype_requirements", gate(1099), "a100", base()).rejects_on(
            "t4",
            base(),
            "DTYPE_UNSUPPORTED_ON_HARDWARE",
        ),
        // minimum_gemm_alignment: 128 / bits per element on tensor cores (8 for 16-bit, 4 for
        // f32 on sm80+); q and v are each checked.
        fact(K, "head_dim", gate(157), "a100", dense(DType::BF16, 72))
            .rejects(dense(DType::BF16, 68), "HEAD_DIM_ALIGNMENT"),
        fact(K, "head_dim", gate(157), "a100", dense(DType::F32, 36))
            .rejects(dense(DType::F32, 34), "HEAD_DIM_ALIGNMENT"),
        // q == k is required; v is aligned on its own.
        fact(K, "different_v_head_dim", gate(307), "h100", v_dim(base(), 64)?),
        fact(K, "causal", shared(32), "h100", top_left(short_q()))
            .rejects(bottom_right(short_q()), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        // No mask filter in the mem-efficient gate (no check_for_attn_mask): bool and float
        // masks reach the kernel (a bool mask as an additive one in q's dtype).
        fact(K, "masks", gate(1111), "h100", bool_mask()),
        // No gate line: the kernel itself (attention.cu, not read at a commit) refuses a bias of
        // another dtype than q's; the row cites the gate that lets the mask through.
        fact(K, "float_mask_matches_q", gate(1111), "h100", float_mask(DType::BF16))
            .rejects(float_mask(DType::F32), "MASK_DTYPE_MISMATCH"),
        // No mask-shape filter in the gate: attention.cpp's preprocess_mask expands a
        // broadcastable mask to (B, H, L, S).
        fact(K, "mask_broadcast", gate(1111), "h100", broadcast_mask()),
        fact(K, "gqa", src(PYTORCH_TESTS, "test/test_transformers.py:3284"), "h100", grouped()),
        // No dropout filter in the gate (the CPU gate has check_for_dropout).
        fact(K, "dropout", gate(1111), "h100", dropped(base())),
        fact(K, "custom_scale", shared(52), "h100", scaled()),
        fact(K, "layouts", gate(1148), "h100", bhsd()?),
        fact(K, "strides", gate(1148), "h100", base()).rejects(strided_v(base())?, "LAST_DIM_NOT_CONTIGUOUS"),
        fact(K, "mask_strides", src(PYTORCH_TESTS, "test/test_transformers.py:1884"), "h100", float_mask(DType::BF16))
            .rejects(strided_mask(), "LAST_DIM_NOT_CONTIGUOUS"),
    ])
}

/// `torch_sdpa.attention.flash`: `can_use_flash_attention` without `USE_ROCM`.
fn flash() -> TestResult<Vec<Fact>> {
    const K: &str = "torch_sdpa.attention.flash";
    Ok(vec![
        // check_flash_attention_hardware_support: [sm80, sm121].
        fact(K, "compute_capability", gate(468), "a100", base()).rejects_on("t4", base(), "COMPUTE_CAPABILITY_TOO_OLD"),
        // check_dtypes_flash_attention -> check_dtypes_low_precision (fp8 only with the FA3
        // opt-in, not declared).
        fact(K, "dtypes", gate(931), "h100", base()).rejects(dense(DType::F32, 128), "DTYPE_UNSUPPORTED"),
        // check_head_dim_size_flash: q, k, v equal and <= 256.
        fact(K, "head_dim", gate(203), "h100", dense(DType::BF16, 256))
            .rejects(dense(DType::BF16, 264), "HEAD_DIM_TOO_LARGE"),
        fact(K, "gqa", gate(1076), "h100", grouped()),
        // check_flash_causal_non_square_seqlens: is_causal only with seqlen_q == seqlen_k.
        fact(K, "causal", gate(587), "h100", top_left(base()))
            .rejects(top_left(short_q()), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        // No dropout filter in the flash gate: dropout_p is passed to the kernel.
        fact(K, "dropout", gate(1049), "h100", dropped(base())),
        fact(K, "custom_scale", shared(52), "h100", scaled()),
        fact(K, "layouts", gate(1081), "h100", bhsd()?),
        fact(K, "strides", gate(1081), "h100", base()).rejects(strided_v(base())?, "LAST_DIM_NOT_CONTIGUOUS"),
    ])
}

/// `torch_sdpa.attention.math` (CUDA): no gate. The composite (attention.cpp) computes in the
/// inputs' floating dtype, repeat-interleaves K/V for GQA, builds `is_causal` as
/// `ones(L, S).tril()` (top-left), adds the mask, applies dropout and takes `scale`.
fn math() -> TestResult<Vec<Fact>> {
    const K: &str = "torch_sdpa.attention.math";
    math_rows(K, "h100", || gate(MATH_CASE))
}

/// Rows shared by the three math kernels (CUDA, ROCm, CPU), on `hw`, from their dispatch line.
fn math_rows(k: &'static str, hw: &'static str, line: impl Fn() -> Source) -> TestResult<Vec<Fact>> {
    Ok(vec![
        // No fp8 path: the composite's bmm dispatches floating types and Half/BFloat16 only.
        fact(k, "dtypes", line(), hw, dense(DType::F32, 128)).rejects(dense(DType::Fp8E4M3, 128), "DTYPE_UNSUPPORTED"),
        fact(k, "different_v_head_dim", line(), hw, v_dim(base(), 64)?),
        fact(k, "gqa", line(), hw, grouped()),
        fact(k, "causal", line(), hw, top_left(short_q()))
            .rejects(bottom_right(short_q()), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        fact(k, "masks", line(), hw, bool_mask()),
        // Conservative: validate_sdpa_input also takes an f32 mask with f16/bf16 queries.
        fact(k, "float_mask_matches_q", line(), hw, float_mask(DType::BF16))
            .rejects(float_mask(DType::F32), "MASK_DTYPE_MISMATCH"),
        fact(k, "mask_broadcast", line(), hw, broadcast_mask()),
        fact(k, "dropout", line(), hw, dropped(base())),
        fact(k, "custom_scale", shared(52), hw, scaled()),
        fact(k, "layouts", line(), hw, bhsd()?),
        fact(k, "strides", line(), hw, strided_v(base())?),
    ])
}

/// `torch_sdpa.attention.flash_cpu` (`use_flash_attention_cpp`) and `math_cpu`.
fn cpu() -> TestResult<Vec<Fact>> {
    const K: &str = "torch_sdpa.attention.flash_cpu";
    let mut rows = vec![
        // cpp_supported_flash_dtypes {Float, Double, BFloat16, Half}, with no ISA gate: bf16
        // runs on an AVX2-only Zen 3 as on a Zen 4.
        fact(K, "dtypes", cpu_gate(40), "zen4", base()).rejects(dense(DType::Fp8E4M3, 128), "DTYPE_UNSUPPORTED"),
        fact(K, "dtypes", cpu_gate(40), "zen3", base()),
        fact(K, "gqa", cpu_gate(48), "spr", grouped()),
        // No causal filter in the CPU gate; is_causal is top-left.
        fact(K, "causal", shared(32), "spr", top_left(short_q()))
            .rejects(bottom_right(short_q()), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
        fact(K, "masks", cpu_gate(49), "spr", bool_mask()),
        // Conservative: the CPU kernel also takes an f32 mask with bf16/f16 queries.
        fact(K, "float_mask_matches_q", cpu_gate(49), "spr", float_mask(DType::BF16))
            .rejects(float_mask(DType::F32), "MASK_DTYPE_MISMATCH"),
        fact(K, "mask_broadcast", shared(289), "spr", broadcast_mask()),
        fact(K, "custom_scale", shared(52), "spr", scaled()),
        fact(K, "layouts", cpu_gate(52), "spr", bhsd()?),
        fact(K, "strides", cpu_gate(52), "spr", base()).rejects(strided_v(base())?, "LAST_DIM_NOT_CONTIGUOUS"),
    ];
    rows.extend(math_rows("torch_sdpa.attention.math_cpu", "spr", || cpu_gate(MATH_CASE_CPU))?);
    Ok(rows)
}

/// `torch_sdpa.attention.flash_rocm`, `efficient_rocm` (the `USE_ROCM` / AOTriton branches of
/// sdp_utils.cpp) and `math_rocm`.
fn rocm() -> TestResult<Vec<Fact>> {
    const FLASH: &str = "torch_sdpa.attention.flash_rocm";
    const EFFICIENT: &str = "torch_sdpa.attention.efficient_rocm";
    let mut rows =
        vec![
            // AOTriton's stable targets; another (an MI100's gfx908) is refused.
            fact(
                FLASH,
                "gfx",
                src(AOTRITON, "v3src/util.cc:48"),
                "mi300x",
                attrs(bf16(2, 128, 128, 32, 8, 128), AttentionAttrs::default()),
            )
            .rejects_on(MI100ISH, bf16(2, 128, 128, 32, 8, 128), "GFX_ARCH_UNSUPPORTED"),
            // An experimental arch is refused unless an environment variable opts in.
            fact(FLASH, "gfx", src(AOTRITON, "v3src/util.cc:77"), "mi300x", bf16(2, 128, 128, 32, 8, 128)).rejects_on(
                "mi300x@gfx1200",
                bf16(2, 128, 128, 32, 8, 128),
                "GFX_ARCH_UNSUPPORTED",
            ),
            fact(EFFICIENT, "gfx", src(AOTRITON, "v3src/util.cc:48"), "mi300x", bf16(2, 128, 128, 16, 16, 128))
                .rejects_on(MI100ISH, bf16(2, 128, 128, 16, 16, 128), "GFX_ARCH_UNSUPPORTED"),
            // check_dtypes_flash_attention -> check_dtypes_low_precision, ROCm and CUDA alike.
            fact(FLASH, "dtypes", gate(931), "mi300x", base()).rejects(dense(DType::F32, 128), "DTYPE_UNSUPPORTED"),
            // aotriton_max_hdim(): 512 with AOTriton >= 0.9 (PyTorch pins 0.13b).
            fact(FLASH, "head_dim", gate(174), "mi300x", dense(DType::BF16, 512))
                .rejects(dense(DType::BF16, 520), "HEAD_DIM_TOO_LARGE"),
            fact(FLASH, "gqa", gate(1076), "mi300x", grouped()),
            fact(FLASH, "causal", gate(587), "mi300x", top_left(base()))
                .rejects(top_left(short_q()), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
            fact(FLASH, "dropout", gate(1049), "mi300x", dropped(base())),
            fact(FLASH, "custom_scale", shared(52), "mi300x", scaled()),
            fact(FLASH, "layouts", gate(1081), "mi300x", bhsd()?),
            fact(FLASH, "strides", gate(1081), "mi300x", base()).rejects(strided_v(base())?, "LAST_DIM_NOT_CONTIGUOUS"),
            // aotriton_mem_efficient_dtypes {Half, Float, BFloat16}.
            fact(EFFICIENT, "dtypes", gate(1102), "mi300x", dense(DType::F32, 128))
                .rejects(dense(DType::Fp8E4M3, 128), "DTYPE_UNSUPPORTED"),
            // AOTriton >= 0.12: q and v <= aotriton_max_hdim() (512) ...
            fact(EFFICIENT, "head_dim", gate(328), "mi300x", dense(DType::BF16, 512))
                .rejects(dense(DType::BF16, 520), "HEAD_DIM_TOO_LARGE"),
            // ... and divisible by 8 for half types, 4 for f32.
            fact(EFFICIENT, "head_dim", gate(299), "mi300x", dense(DType::BF16, 72))
                .rejects(dense(DType::BF16, 68), "HEAD_DIM_ALIGNMENT"),
            fact(EFFICIENT, "head_dim", gate(299), "mi300x", dense(DType::F32, 36))
                .rejects(dense(DType::F32, 34), "HEAD_DIM_ALIGNMENT"),
            fact(EFFICIENT, "different_v_head_dim", gate(307), "mi300x", v_dim(base(), 64)?),
            fact(EFFICIENT, "causal", shared(32), "mi300x", top_left(short_q()))
                .rejects(bottom_right(short_q()), "CAUSAL_ALIGNMENT_UNSUPPORTED"),
            // "Efficient attention on ROCM requires attn_mask be boolean, or has the same datatype
            // as of q,k,v".
            fact(EFFICIENT, "masks", gate(1161), "mi300x", bool_mask()),
            fact(EFFICIENT, "float_mask_matches_q", gate(1161), "mi300x", float_mask(DType::BF16))
                .rejects(float_mask(DType::F32), "MASK_DTYPE_MISMATCH"),
            fact(EFFICIENT, "mask_broadcast", gate(1111), "mi300x", broadcast_mask()),
            fact(
                EFFICIENT,
                "mask_strides",
                src(PYTORCH_TESTS, "test/test_transformers.py:1884"),
                "mi300x",
                float_mask(DType::BF16),
            )
            .rejects(strided_mask(), "LAST_DIM_NOT_CONTIGUOUS"),
            fact(EFFICIENT, "dropout", gate(1111), "mi300x", dropped(base())),
            fact(EFFICIENT, "custom_scale", shared(52), "mi300x", scaled()),
            fact(EFFICIENT, "layouts", gate(1148), "mi300x", bhsd()?),
            fact(EFFICIENT, "strides", gate(1148), "mi300x", base())
                .rejects(strided_v(base())?, "LAST_DIM_NOT_CONTIGUOUS"),
        ];
    rows.extend(math_rows("torch_sdpa.attention.math_rocm", "mi300x", || gate(MATH_CASE))?);
    Ok(rows)
}
