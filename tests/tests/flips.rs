//! Every constraint field is enforced: a permissive kernel accepts a request, and the same
//! kernel with exactly one field flipped rejects it with exactly the expected code.

use std::sync::Arc;

use layerzero::capabilities::catalog::Catalog;
use layerzero::model::attrs::{Activation, Int4Attrs, MlpAttrs, QuantAttrs, QuantScheme, ScaleLayout};
use layerzero::model::attrs::{
    AttentionAttrs, Attrs, GeluApproximate, GeluAttrs, NormAttrs, RopeAttrs, RopeScaling, RopeStyle, SwigluAttrs,
};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::model::op::Op;
use layerzero::model::request::Request;
use layerzero::model::tensor::TensorDesc;
use layerzero::model::w4::{ActQuant, ScaleOrder, W4Format};
use layerzero_tests::catalog::{Backend, Kernel};
use layerzero_tests::{TestResult, attention, causal, codes, paged, planner_with, policy, with_attrs};
use serde_json::{Value, json};

/// Fused RoPE of every style and scaling, partial rotation included.
fn fused_rope_of_every_kind() -> Value {
    json!({"styles": ["rotate_half", "interleaved"], "scalings": ["linear", "dynamic_ntk", "yarn", "llama3"], "partial": true})
}

fn permissive(op: Op) -> Value {
    match op {
        Op::Attention => json!({
            "gqa": {"supported": true}, "causal": {"alignments": ["bottom_right", "top_left"]},
            "masks": ["bool", "float"], "mask_with_causal": true, "mask_broadcast": true, "dropout": true,
            "window": true, "softcap": true, "alibi": true, "custom_scale": true, "varlen": true,
            "different_v_head_dim": true, "kv_dtypes": ["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"],
            "fused_rope": fused_rope_of_every_kind()
        }),
        Op::PagedAttention => json!({
            "gqa": {"supported": true}, "causal": {"alignments": ["bottom_right", "top_left"]},
            "window": true, "softcap": true, "alibi": true, "custom_scale": true,
            "kv_cache_dtypes": ["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"]
        }),
        Op::RmsNorm => json!({"fused_residual": true}),
        Op::Rope => json!({"rope_scaling": true}),
        Op::LinearInt4 => json!({
            "weight_formats": ["int4", "nf4", "mxfp4", "nvfp4"], "scale_orders": ["linear", "swizzled_32_4_4"],
            "int4_activations": ["f32", "int8"]
        }),
        _ => json!({}),
    }
}

/// A probe kernel of `op` taking `constraints`, graph safe (graph-strict mode has a property
/// to flip).
fn kernel(id: &str, op: Op, constraints: Value) -> Kernel {
    Kernel::new(id, op).constraints(constraints).property("graph_safe", true)
}

fn merge(base: &Value, patch: &Value) -> Value {
    let mut out = base.clone();
    if let (Some(o), Some(p)) = (out.as_object_mut(), patch.as_object()) {
        for (k, v) in p {
            if v.is_null() {
                o.remove(k);
            } else {
                o.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

/// A catalog with two kernels of `op` on `device`: `base` (permissive) and `flipped`.
fn two_kernel_catalog(op: Op, device: &str, patch: &Value, prop_patch: &Value) -> TestResult<Arc<Catalog>> {
    let base = permissive(op);
    let mut flipped = kernel(&format!("probe.{op}.flipped"), op, merge(&base, patch));
    for (name, value) in prop_patch.as_object().into_iter().flatten() {
        flipped = flipped.property(name, value.clone());
    }
    let probe = Backend::new("probe", device).kernel(kernel(&format!("probe.{op}.base"), op, base)).kernel(flipped);
    probe.catalog().map_err(|e| format!("flip catalog for patch {patch}: {e}").into())
}

struct Flip {
    name: &'static str,
    device: &'static str,
    hardware: &'static str,
    patch: Value,
    properties: Value,
    policy: &'static str,
    request: Request,
    expect: &'static str,
}

fn flip(name: &'static str, patch: Value, request: Request, expect: &'static str) -> Flip {
    Flip { name, device: "cuda", hardware: "h100", patch, properties: json!({}), policy: NO_ADAPT, request, expect }
}

const NO_ADAPT: &str = r#"{"schema_version": 1, "allow_adaptation": false}"#;

fn gqa() -> Request {
    attention(DType::BF16, 2, 128, 128, 32, 8, 128)
}

fn mha() -> Request {
    attention(DType::BF16, 2, 128, 128, 16, 16, 128)
}

fn attn_with(a: AttentionAttrs) -> Request {
    with_attrs(mha(), a)
}

/// `mha()` with RoPE fused as `rope` (queries at the keys' last positions: seq_q == seq_k).
fn roped(rope: RopeAttrs) -> Request {
    attn_with(AttentionAttrs { rope: Some(rope), ..Default::default() })
}

fn masked(dtype: DType, shape: &[u64], attrs: AttentionAttrs) -> Request {
    with_attrs(mha(), attrs).tensor("mask", TensorDesc::new(dtype, shape.to_vec()))
}

fn rows(op: Op, attrs: Attrs) -> Request {
    let x = TensorDesc::new(DType::BF16, [64, 4096]);
    let req = Request::new(op).attrs(attrs);
    match op {
        Op::RmsNorm | Op::LayerNorm => req.tensor("x", x).tensor("weight", TensorDesc::new(DType::BF16, [4096])),
        Op::Rope => req.tensor("q", TensorDesc::new(DType::BF16, [1, 16, 8, 128]).with_layout(Layout::Bshd)),
        Op::Swiglu => req.tensor("x", TensorDesc::new(DType::BF16, [64, 8192])),
        _ => req.tensor("x", x),
    }
}

/// `req` with its KV caches seen as pages `page_stride` elements apart (a cache carved from
/// a larger pool: K and V interleaved per page) and elements `elem` apart.
fn strided_pages(req: Request, page_stride: u64, elem: u64) -> TestResult<Request> {
    let cache = |name: &str| -> TestResult<TensorDesc> {
        let t = req.get(name).cloned().ok_or_else(|| format!("no {name}"))?;
        let s = &t.shape;
        let strides = [page_stride * elem, s[2] * s[3] * elem, s[3] * elem, elem];
        Ok(t.with_strides(strides))
    };
    let (k, v) = (cache("k_cache")?, cache("v_cache")?);
    Ok(req.tensor("k_cache", k).tensor("v_cache", v))
}

fn flips() -> TestResult<Vec<Flip>> {
    let cu = |name, patch, req, code| flip(name, patch, req, code);
    let mut v = vec![
        cu(
            "compute_capability.min",
            json!({"compute_capability": {"min": "9.5"}}),
            mha(),
            "COMPUTE_CAPABILITY_TOO_OLD",
        ),
        cu(
            "compute_capability.max",
            json!({"compute_capability": {"max": "8.9"}}),
            mha(),
            "COMPUTE_CAPABILITY_TOO_NEW",
        ),
        cu("built_archs (other major)", json!({"built_archs": ["8.0"]}), mha(), "NO_KERNEL_IMAGE_FOR_ARCH"),
        cu("dtypes", json!({"dtypes": ["f16"]}), mha(), "DTYPE_UNSUPPORTED"),
        cu(
            "dtype_requirements.min_compute_capability",
            json!({"dtype_requirements": [{"dtype": "bf16", "min_compute_capability": "10.0"}]}),
            mha(),
            "DTYPE_UNSUPPORTED_ON_HARDWARE",
        ),
        cu("head_dim.min", json!({"head_dim": {"min": 256}}), mha(), "HEAD_DIM_TOO_SMALL"),
        cu("head_dim.max", json!({"head_dim": {"max": 64}}), mha(), "HEAD_DIM_TOO_LARGE"),
        cu("head_dim.multiple", json!({"head_dim": {"multiple": 256}}), mha(), "HEAD_DIM_ALIGNMENT"),
        cu(
            "head_dim.multiple_by_dtype",
            json!({"head_dim": {"multiple": 8, "multiple_by_dtype": {"bf16": 96}}}),
            mha(),
            "HEAD_DIM_ALIGNMENT",
        ),
        cu("head_dim.values", json!({"head_dim": {"values": [64, 256]}}), mha(), "HEAD_DIM_UNSUPPORTED"),
        // h100 (9.0) is below 10.0: the older device's multiple holds.
        cu(
            "head_dim.multiple_by_arch",
            json!({"head_dim": {"multiple_by_arch": [{"below_compute_capability": "10.0", "dtypes": ["bf16"], "multiple": 96}]}}),
            mha(),
            "HEAD_DIM_ALIGNMENT",
        ),
        cu(
            "different_v_head_dim",
            json!({"different_v_head_dim": null}),
            mha().tensor("v", TensorDesc::new(DType::BF16, [2, 128, 16, 64]).with_layout(Layout::Bshd)),
            "HEAD_DIM_V_MISMATCH",
        ),
        cu("gqa (absent)", json!({"gqa": null}), gqa(), "GQA_UNSUPPORTED"),
        cu("gqa.supported", json!({"gqa": {"supported": false}}), gqa(), "GQA_UNSUPPORTED"),
        cu(
            "gqa.group_sizes",
            json!({"gqa": {"supported": true, "group_sizes": [1, 2]}}),
            gqa(),
            "GQA_GROUP_SIZE_UNSUPPORTED",
        ),
        cu("seq_len_q", json!({"seq_len_q": {"max": 1}}), mha(), "SEQ_LEN_Q_UNSUPPORTED"),
        cu("causal (absent)", json!({"causal": null}), attn_with(causal()), "CAUSAL_UNSUPPORTED"),
        cu(
            "causal.alignments",
            json!({"causal": {"alignments": ["top_left"]}}),
            with_attrs(attention(DType::BF16, 1, 16, 128, 8, 8, 64), causal()),
            "CAUSAL_ALIGNMENT_UNSUPPORTED",
        ),
        cu(
            "causal.square_only",
            json!({"causal": {"alignments": ["top_left", "bottom_right"], "square_only": true}}),
            with_attrs(attention(DType::BF16, 1, 16, 128, 8, 8, 64), causal()),
            "CAUSAL_ALIGNMENT_UNSUPPORTED",
        ),
        cu(
            "causal.seq_q_le_seq_k",
            json!({"causal": {"alignments": ["bottom_right"], "seq_q_le_seq_k": true}}),
            with_attrs(attention(DType::BF16, 1, 128, 16, 8, 8, 64), causal()),
            "CAUSAL_SEQ_Q_EXCEEDS_SEQ_K",
        ),
        // Exempting the batch wrappers leaves the single path's check in force.
        cu(
            "single_path_only: seq_q_le_seq_k (a dense request)",
            json!({"causal": {"alignments": ["bottom_right"], "seq_q_le_seq_k": true},
                   "single_path_only": ["seq_q_le_seq_k"]}),
            with_attrs(attention(DType::BF16, 1, 128, 16, 8, 8, 64), causal()),
            "CAUSAL_SEQ_Q_EXCEEDS_SEQ_K",
        ),
        cu("fused_rope (absent)", json!({"fused_rope": null}), roped(RopeAttrs::default()), "FUSED_ROPE_UNSUPPORTED"),
        cu(
            "fused_rope.styles",
            json!({"fused_rope": {"styles": ["rotate_half"], "scalings": ["linear"], "partial": true}}),
            roped(RopeAttrs { style: RopeStyle::Interleaved, ..Default::default() }),
            "FUSED_ROPE_UNSUPPORTED",
        ),
        cu(
            "fused_rope.scalings",
            json!({"fused_rope": {"styles": ["rotate_half"], "scalings": ["linear"], "partial": true}}),
            roped(RopeAttrs {
                scaling: Some(RopeScaling::Yarn {
                    factor: 4.0,
                    original_max_position: 64,
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                }),
                ..Default::default()
            }),
            "FUSED_ROPE_UNSUPPORTED",
        ),
        cu(
            "fused_rope.partial",
            json!({"fused_rope": {"styles": ["rotate_half"], "scalings": ["linear"]}}),
            roped(RopeAttrs { rotary_dim: Some(64), ..Default::default() }),
            "FUSED_ROPE_UNSUPPORTED",
        ),
        cu(
            "masks (bool)",
            json!({"masks": ["float"]}),
            masked(DType::Bool, &[128, 128], AttentionAttrs::default()),
            "MASK_UNSUPPORTED",
        ),
        cu(
            "masks (float)",
            json!({"masks": ["bool"]}),
            masked(DType::BF16, &[128, 128], AttentionAttrs::default()),
            "MASK_UNSUPPORTED",
        ),
        cu(
            "float_mask_matches_q",
            json!({"float_mask_matches_q": true}),
            masked(DType::F32, &[128, 128], AttentionAttrs::default()),
            "MASK_DTYPE_MISMATCH",
        ),
        cu(
            "mask_with_causal",
            json!({"mask_with_causal": null}),
            masked(DType::Bool, &[128, 128], causal()),
            "MASK_CAUSAL_CONFLICT",
        ),
        cu(
            "mask_broadcast",
            json!({"mask_broadcast": null}),
            masked(DType::Bool, &[128, 128], AttentionAttrs::default()),
            "MASK_BROADCAST_UNSUPPORTED",
        ),
        cu(
            "mask_shared_by_heads",
            json!({"mask_shared_by_heads": true}),
            masked(DType::Bool, &[2, 16, 128, 128], AttentionAttrs::default()),
            "MASK_PER_HEAD_UNSUPPORTED",
        ),
        cu(
            "dropout",
            json!({"dropout": null}),
            attn_with(AttentionAttrs { dropout_p: 0.1, ..Default::default() }),
            "DROPOUT_UNSUPPORTED",
        ),
        cu(
            "window",
            json!({"window": null}),
            attn_with(AttentionAttrs { causal: true, window_left: Some(64), ..Default::default() }),
            "WINDOW_UNSUPPORTED",
        ),
        cu(
            "softcap",
            json!({"softcap": null}),
            attn_with(AttentionAttrs { softcap: Some(30.0), ..Default::default() }),
            "SOFTCAP_UNSUPPORTED",
        ),
        cu(
            "alibi",
            json!({"alibi": null}),
            attn_with(AttentionAttrs { alibi: true, ..Default::default() }),
            "ALIBI_UNSUPPORTED",
        ),
        cu(
            "custom_scale",
            json!({"custom_scale": null}),
            attn_with(AttentionAttrs { scale: Some(0.1), ..Default::default() }),
            "SCALE_UNSUPPORTED",
        ),
        cu(
            "varlen",
            json!({"varlen": null}),
            attention(DType::BF16, 1, 300, 300, 8, 8, 64)
                .tensor("cu_seqlens_q", TensorDesc::new(DType::I32, [4]))
                .tensor("cu_seqlens_k", TensorDesc::new(DType::I32, [4])),
            "VARLEN_UNSUPPORTED",
        ),
        cu("layouts", json!({"layouts": ["BHSD"]}), mha(), "LAYOUT_UNSUPPORTED"),
        cu(
            "strides: contiguous",
            json!({"strides": "contiguous"}),
            mha().tensor(
                "k",
                TensorDesc::new(DType::BF16, [2, 128, 16, 128])
                    .with_layout(Layout::Bshd)
                    .with_strides([262144, 128, 16384, 1]),
            ),
            "NOT_CONTIGUOUS",
        ),
        cu(
            "exclusive: softcap with dropout",
            json!({"exclusive": [["softcap", "dropout"]]}),
            attn_with(AttentionAttrs { softcap: Some(30.0), dropout_p: 0.1, ..Default::default() }),
            "FEATURES_EXCLUSIVE",
        ),
        cu(
            "exclusive: window with fp8",
            json!({"exclusive": [["fp8", "window"]], "dtypes": ["fp8_e4m3"]}),
            with_attrs(
                attention(DType::Fp8E4M3, 2, 128, 128, 16, 16, 128),
                AttentionAttrs { window_left: Some(64), causal: true, ..Default::default() },
            ),
            "FEATURES_EXCLUSIVE",
        ),
        cu(
            "strides: last_dim_contiguous",
            json!({"strides": "last_dim_contiguous"}),
            mha().tensor(
                "v",
                TensorDesc::new(DType::BF16, [2, 128, 16, 128])
                    .with_layout(Layout::Bshd)
                    .with_strides([524288, 4096, 256, 2]),
            ),
            "LAST_DIM_NOT_CONTIGUOUS",
        ),
        // Found by the upstream test suites (issue 34): each was a wrong accept.
        cu(
            "head_dim_requirements",
            json!({"head_dim_requirements": [{"above": 64, "min_compute_capability": "10.0"}]}),
            mha(),
            "HEAD_DIM_UNSUPPORTED_ON_HARDWARE",
        ),
        cu(
            "aligned_strides",
            json!({"aligned_strides": true, "head_dim": {"multiple_by_dtype": {"bf16": 8}}}),
            mha().tensor(
                "q",
                TensorDesc::new(DType::BF16, [2, 128, 16, 128]).with_layout(Layout::Bshd).with_strides([
                    128 * 16 * 132,
                    16 * 132,
                    132,
                    1,
                ]),
            ),
            "STRIDE_ALIGNMENT",
        ),
        cu("max_batch_and_heads", json!({"max_batch_and_heads": 8}), mha(), "BATCH_OR_HEADS_TOO_LARGE"),
        cu(
            "mask_strides",
            json!({"mask_strides": "last_dim_contiguous"}),
            mha().tensor(
                "mask",
                TensorDesc::new(DType::BF16, [2, 16, 128, 128]).with_strides([16 * 128 * 256, 128 * 256, 256, 2]),
            ),
            "LAST_DIM_NOT_CONTIGUOUS",
        ),
        cu(
            "kv_dtypes",
            json!({"kv_dtypes": ["f16"]}),
            mha()
                .tensor("k", TensorDesc::new(DType::Fp8E4M3, [2, 128, 16, 128]).with_layout(Layout::Bshd))
                .tensor("v", TensorDesc::new(DType::Fp8E4M3, [2, 128, 16, 128]).with_layout(Layout::Bshd)),
            "DTYPE_MISMATCH",
        ),
    ];
    let pg = |kv: DType, page: u64, layout: Layout, table: DType| {
        paged(DType::F16, kv, 4, 1, 32, 8, 128, page, layout, table)
    };
    let v_padded = |req: Request| -> TestResult<Request> {
        let v: TensorDesc = req.get("v_cache").cloned().ok_or("no v_cache")?;
        Ok(req.tensor("v_cache", v.with_strides([17 * 8 * 128, 8 * 128, 128, 1])))
    };
    for (name, patch, req, code) in [
        (
            "page_size.multiple",
            json!({"page_size": {"multiple": 256}}),
            pg(DType::F16, 16, Layout::Nhd, DType::I32),
            "PAGE_SIZE_UNSUPPORTED",
        ),
        (
            "page_size.values",
            json!({"page_size": {"values": [16]}}),
            pg(DType::F16, 32, Layout::Nhd, DType::I32),
            "PAGE_SIZE_UNSUPPORTED",
        ),
        (
            "block_table_dtypes",
            json!({"block_table_dtypes": ["i32"]}),
            pg(DType::F16, 16, Layout::Nhd, DType::I64),
            "BLOCK_TABLE_DTYPE_UNSUPPORTED",
        ),
        (
            "kv_cache_layouts",
            json!({"kv_cache_layouts": ["HND"]}),
            pg(DType::F16, 16, Layout::Nhd, DType::I32),
            "KV_CACHE_LAYOUT_UNSUPPORTED",
        ),
        (
            "kv_cache_dtypes",
            json!({"kv_cache_dtypes": ["f16", "bf16"]}),
            pg(DType::Fp8E4M3, 16, Layout::Nhd, DType::I32),
            "KV_CACHE_DTYPE_UNSUPPORTED",
        ),
        (
            "kv_cache_dtypes (absent: must equal q)",
            json!({"kv_cache_dtypes": null}),
            pg(DType::Fp8E5M2, 16, Layout::Hnd, DType::I32),
            "KV_CACHE_DTYPE_UNSUPPORTED",
        ),
        (
            "kv_cache_strides: contiguous (strided pages)",
            json!({"kv_cache_strides": "contiguous"}),
            strided_pages(pg(DType::F16, 16, Layout::Nhd, DType::I32), 2 * 16 * 8 * 128, 1)?,
            "KV_CACHE_STRIDES_UNSUPPORTED",
        ),
        (
            "kv_cache_equal_strides",
            json!({"kv_cache_equal_strides": true}),
            v_padded(pg(DType::F16, 16, Layout::Nhd, DType::I32))?,
            "KV_CACHE_STRIDES_UNSUPPORTED",
        ),
        (
            "kv_cache_strides: last_dim_contiguous",
            json!({"kv_cache_strides": "last_dim_contiguous"}),
            strided_pages(pg(DType::F16, 16, Layout::Nhd, DType::I32), 2 * 16 * 8 * 128, 2)?,
            "KV_CACHE_STRIDES_UNSUPPORTED",
        ),
    ] {
        v.push(flip(name, patch, req, code));
    }
    let attrs_flips: Vec<(&'static str, Op, Value, Request, &'static str)> = vec![
        (
            "hidden_size",
            Op::RmsNorm,
            json!({"hidden_size": {"max": 1024}}),
            rows(Op::RmsNorm, Attrs::Norm(NormAttrs::default())),
            "HIDDEN_SIZE_UNSUPPORTED",
        ),
        (
            "fused_residual",
            Op::RmsNorm,
            json!({"fused_residual": null}),
            rows(Op::RmsNorm, Attrs::Norm(NormAttrs::default()))
                .tensor("residual", TensorDesc::new(DType::BF16, [64, 4096])),
            "ATTR_UNSUPPORTED",
        ),
        (
            "rope_styles",
            Op::Rope,
            json!({"rope_styles": ["rotate_half"]}),
            rows(Op::Rope, Attrs::Rope(RopeAttrs { style: RopeStyle::Interleaved, ..Default::default() })),
            "ATTR_UNSUPPORTED",
        ),
        (
            "rope_scaling",
            Op::Rope,
            json!({"rope_scaling": null}),
            rows(
                Op::Rope,
                Attrs::Rope(RopeAttrs { scaling: Some(RopeScaling::Linear { factor: 2.0 }), ..Default::default() }),
            ),
            "ATTR_UNSUPPORTED",
        ),
        (
            "gelu_approximations",
            Op::Gelu,
            json!({"gelu_approximations": ["none"]}),
            rows(Op::Gelu, Attrs::Gelu(GeluAttrs { approximate: GeluApproximate::Tanh })),
            "ATTR_UNSUPPORTED",
        ),
        (
            "glu_forms",
            Op::Swiglu,
            json!({"glu_forms": ["separate"]}),
            rows(Op::Swiglu, Attrs::Swiglu(SwigluAttrs { split: true })),
            "ATTR_UNSUPPORTED",
        ),
        (
            "weight_layouts",
            Op::Linear,
            json!({"weight_layouts": ["NT"]}),
            Request::new(Op::Linear)
                .tensor("x", TensorDesc::new(DType::BF16, [8, 64]))
                .tensor("weight", TensorDesc::new(DType::BF16, [64, 32]).with_layout(Layout::Nn)),
            "LAYOUT_UNSUPPORTED",
        ),
    ];
    for (name, _op, patch, req, code) in attrs_flips {
        v.push(flip(name, patch, req, code));
    }
    v.extend(quant_and_mlp_flips());
    // Hardware fields of other device kinds.
    v.push(Flip {
        device: "rocm",
        hardware: "mi300x",
        ..flip("gfx", json!({"gfx": ["gfx90a"]}), mha(), "GFX_ARCH_UNSUPPORTED")
    });
    v.push(Flip {
        device: "cpu",
        hardware: "zen3",
        ..flip("cpu_isa", json!({"cpu_isa": ["avx512f"]}), mha(), "CPU_ISA_MISSING")
    });
    v.push(Flip {
        device: "cpu",
        hardware: "zen3",
        ..flip(
            "dtype_requirements.cpu_isa_any_of",
            json!({"dtype_requirements": [{"dtype": "bf16", "cpu_isa_any_of": [["avx512_bf16"], ["amx_bf16"]]}]}),
            mha(),
            "DTYPE_UNSUPPORTED_ON_HARDWARE",
        )
    });
    // Properties, enforced through the policy.
    let props = |name, p: Value, pol, code| Flip { properties: p, policy: pol, ..flip(name, json!({}), mha(), code) };
    v.push(props(
        "properties.deterministic",
        json!({"deterministic": false}),
        r#"{"require_deterministic": true}"#,
        "NON_DETERMINISTIC",
    ));
    v.push(props(
        "properties.graph_safe",
        json!({"graph_safe": false}),
        r#"{"graph_strict_mode": true}"#,
        "GRAPH_UNSAFE",
    ));
    v.push(props("properties.needs_jit", json!({"needs_jit": true}), r#"{"allow_jit": false}"#, "JIT_DISALLOWED"));
    v.push(props(
        "properties.workspace_bytes",
        json!({"workspace_bytes": 200000000000u64}),
        "{}",
        "MEMORY_HEADROOM_EXCEEDED",
    ));
    Ok(v)
}

#[test]
fn every_constraint_field_rejects_exactly_what_it_declares() -> TestResult {
    let mut failures = Vec::new();
    let all = flips()?;
    for f in &all {
        let catalog = two_kernel_catalog(f.request.op, f.device, &f.patch, &f.properties)?;
        let sel = planner_with(catalog, f.hardware, policy(f.policy)?)?;
        let report = sel.explain(&f.request);
        let base = format!("probe.{}.base", f.request.op);
        let flipped = format!("probe.{}.flipped", f.request.op);
        if !report.request_errors.is_empty() {
            failures.push(format!("{}: the request is invalid: {:?}", f.name, report.request_errors));
            continue;
        }
        let base_codes = codes(&report, &base)?;
        if !base_codes.is_empty() {
            failures.push(format!("{}: the permissive kernel is rejected: {base_codes:?}", f.name));
        }
        let mut got = codes(&report, &flipped)?;
        got.dedup();
        if got != [f.expect] {
            failures.push(format!("{}: expected exactly [{}], got {got:?}", f.name, f.expect));
        }
    }
    assert!(all.len() >= 50, "only {} flips", all.len());
    assert!(failures.is_empty(), "{} of {} flips failed:\n{}", failures.len(), all.len(), failures.join("\n"));
    Ok(())
}

#[test]
fn arch_specific_targets_run_only_on_their_exact_capability() -> TestResult {
    use layerzero::capabilities::spec::ArchTarget;
    use layerzero::hardware::profile::ComputeCapability as Cc;
    let sm90a: ArchTarget = "9.0a".parse()?;
    let sm80: ArchTarget = "8.0".parse()?;
    assert!(sm90a.runs_on(Cc::new(9, 0)));
    assert!(!sm90a.runs_on(Cc::new(10, 0)));
    assert!(sm80.runs_on(Cc::new(8, 6)) && sm80.runs_on(Cc::new(8, 9)));
    assert!(!sm80.runs_on(Cc::new(9, 0)) && !sm80.runs_on(Cc::new(7, 5)));
    Ok(())
}

#[test]
fn efficiency_coefficients_decide_between_otherwise_equal_kernels() -> TestResult {
    // perf.eff_compute, perf.eff_mem and perf.launch_ns each move the score.
    for (field, better, worse) in [("eff_compute", 0.9, 0.1), ("eff_mem", 0.9, 0.05), ("launch_ns", 10.0, 1e9)] {
        let mk = |id: &str, v: f64| kernel(id, Op::Attention, permissive(Op::Attention)).perf(field, v);
        let probe = Backend::new("probe", "cuda").kernel(mk("probe.attention.a", worse));
        let catalog = probe.kernel(mk("probe.attention.b", better)).catalog()?;
        let sel = planner_with(catalog, "h100", layerzero::policy::Policy::default())?;
        // A memory-bound decode shape for eff_mem; a compute-bound prefill for the others.
        let req = if field == "eff_mem" { attention(DType::BF16, 64, 1, 8192, 32, 32, 128) } else { mha() };
        let report = sel.explain(&req);
        assert_eq!(report.selected.as_deref(), Some("probe.attention.b"), "{field}: {:?}", report.candidates);
    }
    Ok(())
}

#[test]
fn equal_scores_break_ties_by_kernel_id() -> TestResult {
    let k = |id: &str| kernel(id, Op::Attention, permissive(Op::Attention));
    let probe = Backend::new("probe", "cuda").kernel(k("probe.attention.zeta"));
    let catalog = probe.kernel(k("probe.attention.alpha")).kernel(k("probe.attention.mid")).catalog()?;
    let sel = planner_with(catalog, "h100", layerzero::policy::Policy::default())?;
    let report = sel.explain(&mha());
    let totals: Vec<f64> = report.candidates.iter().filter_map(|c| c.score.as_ref().map(|s| s.total_ns)).collect();
    assert!(totals.windows(2).all(|w| w[0] == w[1]), "{totals:?}");
    assert_eq!(report.selected.as_deref(), Some("probe.attention.alpha"));
    assert_eq!(sel.select(&mha()).map(|s| s.kernel).ok().as_deref(), Some("probe.attention.alpha"));
    Ok(())
}

#[test]
fn a_single_bottom_right_causal_row_is_judged_as_unmasked_unless_alibi_needs_the_flag() -> TestResult {
    // A kernel without causal support takes a decode row (it sees every key anyway)...
    let catalog = two_kernel_catalog(Op::Attention, "cuda", &json!({"causal": null}), &json!({}))?;
    let sel = planner_with(catalog, "h100", layerzero::policy::Policy::default())?;
    let decode = with_attrs(attention(DType::BF16, 4, 1, 512, 8, 8, 64), causal());
    assert!(codes(&sel.explain(&decode), "probe.attention.flipped")?.is_empty());
    // ...but not a top-left one (row 0 sees key 0 only), nor one whose ALiBi bias depends on it.
    let top_left = with_attrs(
        decode.clone(),
        AttentionAttrs {
            causal: true,
            causal_alignment: layerzero::model::attrs::CausalAlignment::TopLeft,
            ..Default::default()
        },
    );
    assert_eq!(codes(&sel.explain(&top_left), "probe.attention.flipped")?, ["CAUSAL_UNSUPPORTED"]);
    let alibi = with_attrs(decode, AttentionAttrs { causal: true, alibi: true, ..Default::default() });
    assert_eq!(codes(&sel.explain(&alibi), "probe.attention.flipped")?, ["CAUSAL_UNSUPPORTED"]);
    Ok(())
}

fn quant_request(op: Op, attrs: QuantAttrs, scale: Option<TensorDesc>) -> Request {
    let x = match op {
        Op::Quantize => TensorDesc::new(DType::BF16, [256, 512]),
        _ => TensorDesc::new(DType::I8, [256, 512]),
    };
    let r = Request::new(op).attrs(Attrs::Quant(attrs)).tensor("x", x);
    match scale {
        Some(s) => r.tensor("scale", s),
        None => r,
    }
}

fn qattrs(
    scheme: QuantScheme,
    block: Option<[u64; 2]>,
    layout: Option<ScaleLayout>,
    target: Option<DType>,
) -> QuantAttrs {
    QuantAttrs {
        scheme,
        block,
        scale_layout: layout,
        target,
        out_dtype: None,
        format: None,
        scale_order: Default::default(),
    }
}

fn mlp_request(op: Op, act: Activation) -> Request {
    let t = |s: &[u64]| TensorDesc::new(DType::BF16, s.to_vec());
    let r = Request::new(op).attrs(Attrs::Mlp(MlpAttrs { activation: act })).tensor("x", t(&[16, 64]));
    match op {
        Op::MoeExperts => r
            .tensor("experts", TensorDesc::new(DType::I32, [16, 2]))
            .tensor("weights", TensorDesc::new(DType::F32, [16, 2]))
            .tensor("w_gate", t(&[4, 128, 64]))
            .tensor("w_up", t(&[4, 128, 64]))
            .tensor("w_down", t(&[4, 64, 128])),
        _ => r.tensor("w_gate", t(&[128, 64])).tensor("w_up", t(&[128, 64])).tensor("w_down", t(&[64, 128])),
    }
}

fn int4_request(group: u64) -> Request {
    Request::new(Op::LinearInt4)
        .attrs(Attrs::Int4(Int4Attrs::int4(group)))
        .tensor("x", TensorDesc::new(DType::BF16, [4, 256]))
        .tensor("weight", TensorDesc::new(DType::I8, [32, 128]))
        .tensor("scales", TensorDesc::new(DType::F32, [32, 256 / group]))
}

/// An nf4 linear (groups of 64, f32 absmax), its scales in `order` when given.
fn nf4_request(order: Option<ScaleOrder>) -> Request {
    let mut attrs = Int4Attrs::of(W4Format::Nf4, 64);
    attrs.scale_order = order.unwrap_or_default();
    Request::new(Op::LinearInt4)
        .attrs(Attrs::Int4(attrs))
        .tensor("x", TensorDesc::new(DType::BF16, [4, 256]))
        .tensor("weight", TensorDesc::new(DType::I8, [32, 128]))
        .tensor("scales", TensorDesc::new(DType::F32, [32, 4]))
}

fn quant_and_mlp_flips() -> Vec<Flip> {
    let block = Some([128, 128]);
    vec![
        flip(
            "quant_schemes",
            json!({"quant_schemes": ["per_tensor"]}),
            quant_request(Op::Quantize, qattrs(QuantScheme::PerChannel, None, None, None), None),
            "ATTR_UNSUPPORTED",
        ),
        flip(
            "quant_targets",
            json!({"quant_targets": ["i8"]}),
            quant_request(Op::Quantize, qattrs(QuantScheme::PerTensor, None, None, Some(DType::Fp8E4M3)), None),
            "DTYPE_UNSUPPORTED",
        ),
        flip(
            "quant_blocks",
            json!({"quant_blocks": [[1, 128]]}),
            quant_request(Op::Quantize, qattrs(QuantScheme::PerBlock, block, None, None), None),
            "ATTR_UNSUPPORTED",
        ),
        flip(
            "scale_layouts",
            json!({"scale_layouts": ["row_major"]}),
            quant_request(
                Op::Quantize,
                qattrs(QuantScheme::PerBlock, block, Some(ScaleLayout::ColumnMajor), None),
                None,
            ),
            "SCALE_LAYOUT_MISMATCH",
        ),
        flip(
            "activations",
            json!({"activations": ["silu"]}),
            mlp_request(Op::Mlp, Activation::GeluTanh),
            "ATTR_UNSUPPORTED",
        ),
        flip(
            "activations (moe)",
            json!({"activations": ["gelu"]}),
            mlp_request(Op::MoeExperts, Activation::Silu),
            "ATTR_UNSUPPORTED",
        ),
        flip("group_sizes", json!({"group_sizes": [32, 128]}), int4_request(64), "ATTR_UNSUPPORTED"),
        flip("weight_formats", json!({"weight_formats": ["int4"]}), nf4_request(None), "ATTR_UNSUPPORTED"),
        flip(
            "scale_orders",
            json!({"scale_orders": ["linear"]}),
            nf4_request(Some(ScaleOrder::Swizzled32x4x4)),
            "SCALE_LAYOUT_MISMATCH",
        ),
        flip(
            "int4_activations",
            json!({"int4_activations": ["f32"]}),
            {
                let r = int4_request(64);
                r.attrs(Attrs::Int4(Int4Attrs { activations: ActQuant::Int8, ..Int4Attrs::int4(64) }))
            },
            "ATTR_UNSUPPORTED",
        ),
    ]
}

#[test]
fn a_scale_that_does_not_match_its_scheme_is_rejected_for_every_kernel() -> TestResult {
    // Universal checks: no capability field turns them off.
    let catalog = two_kernel_catalog(Op::Dequantize, "cpu", &json!({}), &json!({}))?;
    let sel = planner_with(catalog, "zen4", layerzero::policy::Policy::default())?;
    let block = Some([128, 128]);
    let row_major = TensorDesc::new(DType::F32, [2, 4]);
    let col_major = TensorDesc::new(DType::F32, [2, 4]).with_strides([1, 2]);
    let cases = [
        // [256, 512] in 128x128 blocks needs a [2, 4] scale.
        (qattrs(QuantScheme::PerBlock, block, None, None), TensorDesc::new(DType::F32, [4, 2]), true),
        (qattrs(QuantScheme::PerBlock, block, None, None), row_major.clone(), false),
        // Column-major memory where row-major was stated (the silent bug of spec 004).
        (qattrs(QuantScheme::PerBlock, block, None, None), col_major.clone(), true),
        (qattrs(QuantScheme::PerBlock, block, Some(ScaleLayout::ColumnMajor), None), col_major, false),
        (qattrs(QuantScheme::PerBlock, block, Some(ScaleLayout::ColumnMajor), None), row_major, true),
        (qattrs(QuantScheme::PerChannel, None, None, None), TensorDesc::new(DType::F32, [512]), true),
        (qattrs(QuantScheme::PerChannel, None, None, None), TensorDesc::new(DType::F32, [256]), false),
        (qattrs(QuantScheme::PerTensor, None, None, None), TensorDesc::new(DType::F32, [2]), true),
    ];
    for (attrs, scale, mismatch) in cases {
        let req = quant_request(Op::Dequantize, attrs.clone(), Some(scale.clone()));
        let report = sel.explain(&req);
        assert!(report.request_errors.is_empty(), "{:?}", report.request_errors);
        let got = codes(&report, "probe.dequantize.base")?;
        let want: &[&str] = if mismatch { &["SCALE_LAYOUT_MISMATCH"] } else { &[] };
        assert_eq!(got, want, "{attrs:?} with scale {scale:?}");
    }
    // Quantized linears: per-row scales and int4 groups.
    let cat = two_kernel_catalog(Op::LinearInt4, "cpu", &json!({}), &json!({}))?;
    let sel = planner_with(cat, "zen4", layerzero::policy::Policy::default())?;
    let bad = int4_request(64).tensor("scales", TensorDesc::new(DType::F32, [32, 8]));
    assert_eq!(codes(&sel.explain(&bad), "probe.linear_int4.base")?, ["SCALE_LAYOUT_MISMATCH"]);
    let cat = two_kernel_catalog(Op::LinearW8a8, "cpu", &json!({}), &json!({}))?;
    let sel = planner_with(cat, "zen4", layerzero::policy::Policy::default())?;
    let w8 = |xs: u64| {
        Request::new(Op::LinearW8a8)
            .tensor("x", TensorDesc::new(DType::I8, [4, 64]))
            .tensor("x_scale", TensorDesc::new(DType::F32, [xs]))
            .tensor("weight", TensorDesc::new(DType::I8, [32, 64]))
            .tensor("w_scale", TensorDesc::new(DType::F32, [32]))
    };
    assert!(codes(&sel.explain(&w8(4)), "probe.linear_w8a8.base")?.is_empty());
    assert!(codes(&sel.explain(&w8(1)), "probe.linear_w8a8.base")?.is_empty());
    assert_eq!(codes(&sel.explain(&w8(32)), "probe.linear_w8a8.base")?, ["SCALE_LAYOUT_MISMATCH"]);
    Ok(())
}

#[test]
fn a_fused_mlp_is_modeled_without_its_intermediate_traffic() -> TestResult {
    // perf.fused drops the intermediates' bytes: on a memory-bound shape it wins.
    let chain = kernel("probe.mlp.chain", Op::Mlp, json!({}));
    let fused = kernel("probe.mlp.fused", Op::Mlp, json!({})).perf("fused", true);
    let catalog = Backend::new("probe", "cpu").kernel(chain).kernel(fused).catalog()?;
    let sel = planner_with(catalog, "zen4", layerzero::policy::Policy::default())?;
    let r = sel.explain(&mlp_request(Op::Mlp, Activation::Silu));
    let bytes = |k: &str| r.candidate(k).and_then(|c| c.score.as_ref()).map(|s| s.model.bytes).unwrap_or_default();
    assert!(bytes("probe.mlp.fused") < bytes("probe.mlp.chain"));
    assert_eq!(r.selected.as_deref(), Some("probe.mlp.fused"));
    // And nothing else may declare it.
    let bad = kernel("probe.linear.x", Op::Linear, json!({})).perf("fused", true);
    let err = Backend::new("probe", "cpu").kernel(bad).catalog().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("perf.fused"), "{err}");
    Ok(())
}

#[test]
fn a_pad_multiple_no_planned_pad_can_name_is_refused_when_the_catalog_loads() -> TestResult {
    let pads = |p: u64| {
        let k = kernel("probe.attention.padded", Op::Attention, json!({"head_dim": {"multiple": 8, "padded_to": p}}));
        Backend::new("probe", "cuda").kernel(k).catalog().err().map(|e| e.to_string()).unwrap_or_default()
    };
    assert_eq!(pads(8), "");
    let err = pads(12);
    // The schema names the field first (`.../head_dim/padded_to: 12 is not one of 8, 16, ...`).
    assert!(err.contains("padded_to") && err.contains("12"), "{err}");
    Ok(())
}

#[test]
fn a_paged_decode_is_charged_the_pages_its_block_table_reaches_not_the_whole_pool() -> TestResult {
    // 4 sequences x 8 pages of 16 positions x 8 kv heads x (128 + 128) x bf16, out of a pool
    // of 64 pages: a pool 8 times as large changes nothing.
    let sel = layerzero_tests::planner("spr")?;
    let bytes = |req: &Request| {
        let r = sel.explain(req);
        r.candidate("cpu.paged_attention.split_kv").and_then(|c| c.score.as_ref()).map(|s| s.model.bytes).unwrap_or(0.0)
    };
    let small = layerzero_tests::paged(DType::BF16, DType::BF16, 4, 1, 32, 8, 128, 16, Layout::Nhd, DType::I32);
    let cache = TensorDesc::new(DType::BF16, [512, 16, 8, 128]).with_layout(Layout::Nhd);
    let large = small.clone().tensor("k_cache", cache.clone()).tensor("v_cache", cache);
    let reached = 4.0 * 8.0 * 16.0 * 8.0 * 256.0 * 2.0;
    let others = (4 * 32 * 128 * 2 + 4 * 8 * 4 + 4 * 4) as f64 + 4.0 * 32.0 * 128.0 * 2.0;
    assert_eq!(bytes(&small), reached + others);
    assert_eq!(bytes(&large), bytes(&small));
    Ok(())
}
