//! Attention constraints: head dims, GQA, causal alignment, masks, features, paged KV.

use super::Sink;
use super::list;
use crate::capabilities::spec::{Constraints, Feature, MaskName, SinglePathCheck, StrideRule};
use crate::hardware::profile::ComputeCapability;
use crate::model::attrs::{AttentionAttrs, CausalAlignment, RopeAttrs};
use crate::model::dtype::DType;
use crate::model::problem::{AttentionDims, MaskKind, Problem};
use crate::model::request::Request;
use crate::reason::ReasonCode;

/// `cc`: the device's compute capability, where a head-dim multiple depends on it.
pub(super) fn check(
    c: &Constraints,
    req: &Request,
    problem: &Problem,
    cc: Option<ComputeCapability>,
    out: &mut impl Sink,
) {
    let (Some(d), Some(a)) = (problem.attention(), req.attention_attrs()) else { return };
    let multiple = c.head_dim.as_ref().and_then(|h| h.multiple_for(problem.dtype, cc));
    head_dims(c, problem, d, multiple, out);
    heads(c, d, out);
    if let Some(max) = c.max_batch_and_heads
        && (d.batch > max || d.heads_q > max || d.heads_kv > max)
    {
        out.reject(ReasonCode::BATCH_OR_HEADS_TOO_LARGE, || {
            format!("batch {}, {} q heads, {} kv heads: each must be at most {max}", d.batch, d.heads_q, d.heads_kv)
        });
    }
    if let Some(range) = &c.seq_len_q
        && !range.contains(d.seq_q)
    {
        out.reject(ReasonCode::SEQ_LEN_Q_UNSUPPORTED, || {
            format!("seq_len_q {} outside [{}, {}]", d.seq_q, bound(range.min), bound(range.max))
        });
    }
    causal(c, a, d, out);
    mask(c, a, problem, d, out);
    aligned_strides(c, req, problem, multiple, out);
    mask_strides(c, req, out);
    features(c, a, d, out);
    exclusive(c, a, problem, d, out);
    if let Some(p) = &d.paged {
        paged(c, req, problem, d, p, out);
    }
}

fn bound(b: Option<u64>) -> String {
    b.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn head_dims(c: &Constraints, problem: &Problem, d: &AttentionDims, multiple: Option<u64>, out: &mut impl Sink) {
    // A declared (head_dim, head_dim_v) pair is built as it is: no other head-dim limit applies.
    if d.head_dim_v != d.head_dim
        && c.head_dim_pairs.iter().any(|p| {
            (p.head_dim, p.head_dim_v) == (d.head_dim, d.head_dim_v)
                && p.dtypes.as_ref().is_none_or(|dts| dts.contains(&problem.dtype))
        })
    {
        return;
    }
    if let Some(h) = &c.head_dim {
        for (what, hd) in [("head_dim", d.head_dim), ("v head_dim", d.head_dim_v)] {
            if what == "v head_dim" && hd == d.head_dim {
                continue;
            }
            if let Some(min) = h.min
                && hd < min
            {
                out.reject(ReasonCode::HEAD_DIM_TOO_SMALL, || format!("{what} {hd} < min {min}"));
            }
            if let Some(max) = h.max
                && hd > max
            {
                out.reject(ReasonCode::HEAD_DIM_TOO_LARGE, || format!("{what} {hd} > max {max}"));
            }
            if let Some(m) = multiple
                && m > 1
                && hd % m != 0
            {
                out.reject(ReasonCode::HEAD_DIM_ALIGNMENT, || {
                    format!("{what} {hd} is not a multiple of {m} (for {})", problem.dtype)
                });
            }
            if let Some(values) = &h.values
                && !values.contains(&hd)
            {
                out.reject(ReasonCode::HEAD_DIM_UNSUPPORTED, || format!("{what} {hd} not in [{}]", list(values)));
            }
        }
    }
    if d.head_dim_v != d.head_dim && !c.different_v_head_dim {
        out.reject(ReasonCode::HEAD_DIM_V_MISMATCH, || {
            let pairs: Vec<String> =
                c.head_dim_pairs.iter().map(|p| format!("({}, {})", p.head_dim, p.head_dim_v)).collect();
            let built = if pairs.is_empty() { String::new() } else { format!(" or be one of {}", pairs.join(", ")) };
            format!("v head_dim {} != q/k head_dim {}; the kernel needs them equal{built}", d.head_dim_v, d.head_dim)
        });
    }
}

fn heads(c: &Constraints, d: &AttentionDims, out: &mut impl Sink) {
    if d.heads_q == d.heads_kv {
        return;
    }
    match &c.gqa {
        Some(g) if g.supported => {
            if let Some(sizes) = &g.group_sizes
                && !sizes.contains(&d.group_size())
            {
                out.reject(ReasonCode::GQA_GROUP_SIZE_UNSUPPORTED, || {
                    format!(
                        "group size {} ({} q heads / {} kv heads) not in [{}]",
                        d.group_size(),
                        d.heads_q,
                        d.heads_kv,
                        list(sizes)
                    )
                });
            }
        }
        _ => out.reject(ReasonCode::GQA_UNSUPPORTED, || {
            format!("{} q heads != {} kv heads; the kernel needs them equal", d.heads_q, d.heads_kv)
        }),
    }
}

fn causal(c: &Constraints, a: &AttentionAttrs, d: &AttentionDims, out: &mut impl Sink) {
    if !d.masks_causally(a) {
        return;
    }
    let Some(cz) = &c.causal else {
        out.reject(ReasonCode::CAUSAL_UNSUPPORTED, || "causal masking requested; the kernel has none");
        return;
    };
    let square = d.seq_q == d.seq_k;
    if cz.square_only && !square {
        out.reject(ReasonCode::CAUSAL_ALIGNMENT_UNSUPPORTED, || {
            format!(
                "causal with seq_q {} != seq_k {} is rejected; the kernel does causal only when they are equal",
                d.seq_q, d.seq_k
            )
        });
    } else if !square && !cz.alignments.contains(&a.causal_alignment) {
        let have: Vec<&str> = cz.alignments.iter().map(|x| x.as_str()).collect();
        out.reject(ReasonCode::CAUSAL_ALIGNMENT_UNSUPPORTED, || {
            format!(
                "causal_alignment {} requested with seq_q {} != seq_k {}; the kernel aligns {}",
                a.causal_alignment.as_str(),
                d.seq_q,
                d.seq_k,
                have.join(" or ")
            )
        });
    }
    let batch_path_skips = c.single_path_only.contains(&SinglePathCheck::SeqQLeSeqK) && !single_path(d);
    if cz.seq_q_le_seq_k && !batch_path_skips && a.causal_alignment == CausalAlignment::BottomRight && d.seq_q > d.seq_k
    {
        out.reject(ReasonCode::CAUSAL_SEQ_Q_EXCEEDS_SEQ_K, || {
            format!("bottom-right causal with seq_q {} > seq_k {}", d.seq_q, d.seq_k)
        });
    }
}

fn mask(c: &Constraints, a: &AttentionAttrs, problem: &Problem, d: &AttentionDims, out: &mut impl Sink) {
    let Some(m) = d.mask else { return };
    let name = match m.kind {
        MaskKind::Bool => MaskName::Bool,
        MaskKind::Float(_) => MaskName::Float,
        MaskKind::BlockSparse => MaskName::BlockSparse,
    };
    if name == MaskName::BlockSparse && !c.masks.contains(&name) {
        let [rows, cols] = a.mask_block.unwrap_or_default();
        out.reject(ReasonCode::BLOCK_SPARSE_MASK_UNSUPPORTED, || {
            format!("block-sparse mask of {rows}x{cols} blocks given; the kernel reads no block layout")
        });
        return;
    }
    if !c.masks.contains(&name) {
        out.reject(ReasonCode::MASK_UNSUPPORTED, || format!("{} mask given; the kernel takes none", m.kind.as_str()));
        return;
    }
    if let MaskKind::Float(dt) = m.kind
        && c.float_mask_matches_q
        && dt != problem.dtype
    {
        out.reject(ReasonCode::MASK_DTYPE_MISMATCH, || {
            format!("float mask is {dt}; the kernel needs the query dtype {}", problem.dtype)
        });
    }
    if d.masks_causally(a) && !c.mask_with_causal {
        out.reject(
            ReasonCode::MASK_CAUSAL_CONFLICT,
            || "an explicit mask together with causal is rejected by this kernel; fold causality into the mask",
        );
    }
    if !m.full && !c.mask_broadcast {
        out.reject(ReasonCode::MASK_BROADCAST_UNSUPPORTED, || format!(
                "mask must be a full [batch, heads, seq_q, seq_k] = [{}, {}, {}, {}] tensor (stride-0 expansion is fine)",
                d.batch, d.heads_q, d.seq_q, d.seq_k
            ));
    }
    if m.per_head && c.mask_shared_by_heads {
        out.reject(ReasonCode::MASK_PER_HEAD_UNSUPPORTED, || {
            format!(
                "mask differs per head; the kernel takes one [seq_q, seq_k] = [{}, {}] mask per sequence, shared by all {} heads",
                d.seq_q, d.seq_k, d.heads_q
            )
        });
    }
}

/// `aligned_strides` (xFormers' cutlass reads memory in 128-bit pieces): q's and v's head
/// stride a multiple of the dtype's head-dim multiple, a float mask's strides but the last
/// multiples of 16 bytes and its last stride at most 1. Untagged strides are contiguous.
fn aligned_strides(c: &Constraints, req: &Request, problem: &Problem, multiple: Option<u64>, out: &mut impl Sink) {
    if !c.aligned_strides {
        return;
    }
    // The library checks the query's and the value's (not the key's).
    for name in ["q", "v"] {
        let (Some(t), Some(m)) = (req.get(name), multiple) else { continue };
        let Some(strides) = &t.strides else { continue };
        // The head axis: BMHK's -2 (BSHD), BHSD's 1.
        let axis = if t.layout == Some(crate::model::layout::Layout::Bhsd) { 1 } else { 2 };
        if let Some(&s) = strides.get(axis)
            && m > 1
            && s % m != 0
        {
            out.reject(ReasonCode::STRIDE_ALIGNMENT, || {
                format!(
                    "tensor `{name}` head stride {s} is not a multiple of {m} ({}); strides {strides:?}",
                    problem.dtype
                )
            });
        }
    }
    let Some(mask) = req.get("mask").filter(|m| m.dtype.is_float()) else { return };
    let strides = mask.strides.clone().unwrap_or_else(|| crate::model::layout::contiguous_strides(&mask.shape));
    let align = (16 / mask.dtype.size_bytes().max(1)).max(1);
    let Some((&last, rest)) = strides.split_last() else { return };
    if let Some(s) = rest.iter().find(|&&s| s % align != 0) {
        out.reject(ReasonCode::STRIDE_ALIGNMENT, || {
            format!(
                "mask strides {strides:?}: {s} is not a multiple of {align} {} elements (16 bytes); allocate the mask \
                 padded and slice it",
                mask.dtype
            )
        });
    }
    if last > 1 {
        out.reject(ReasonCode::STRIDE_ALIGNMENT, || {
            format!("mask stride(-1) is {last}; the kernel reads each mask row as contiguous elements")
        });
    }
}

/// `mask_strides`: the strides an explicit mask must have (PyTorch's GPU backends read each
/// mask row as contiguous elements).
fn mask_strides(c: &Constraints, req: &Request, out: &mut impl Sink) {
    let (Some(rule), Some(m)) = (c.mask_strides, req.get("mask")) else { return };
    if !rule.allows(m) {
        out.reject(ReasonCode::LAST_DIM_NOT_CONTIGUOUS, || {
            format!(
                "mask strides {:?} for shape {:?}; the kernel needs {}",
                m.strides.as_deref().unwrap_or(&[]),
                m.shape,
                if rule == StrideRule::Contiguous { "a contiguous mask" } else { "mask stride(-1) == 1" }
            )
        });
    }
}

fn features(c: &Constraints, a: &AttentionAttrs, d: &AttentionDims, out: &mut impl Sink) {
    if a.dropout_p > 0.0 && !c.dropout {
        out.reject(ReasonCode::DROPOUT_UNSUPPORTED, || {
            format!("dropout_p {} > 0; the kernel has no dropout", a.dropout_p)
        });
    }
    if let Some(w) = a.window_left
        && !c.window
    {
        out.reject(ReasonCode::WINDOW_UNSUPPORTED, || {
            format!("window_left {w} requested; the kernel has no sliding window")
        });
    }
    if let Some(s) = a.softcap
        && !c.softcap
    {
        out.reject(ReasonCode::SOFTCAP_UNSUPPORTED, || {
            format!("softcap {s} requested; the kernel has no soft-capping")
        });
    }
    if a.alibi && !c.alibi {
        out.reject(ReasonCode::ALIBI_UNSUPPORTED, || "ALiBi requested; the kernel takes no ALiBi slopes");
    }
    if let Some(s) = a.scale
        && !c.custom_scale
    {
        out.reject(ReasonCode::SCALE_UNSUPPORTED, || format!("scale {s} requested; the kernel uses 1/sqrt(head_dim)"));
    }
    if let Some(r) = &a.rope {
        fused_rope(c, r, d, out);
    }
    if d.varlen && !c.varlen {
        out.reject(
            ReasonCode::VARLEN_UNSUPPORTED,
            || "ragged batch (cu_seqlens) given; the kernel takes padded batches only",
        );
    }
}

/// `attrs.rope` against what the kernel's fused rotation covers.
fn fused_rope(c: &Constraints, r: &RopeAttrs, d: &AttentionDims, out: &mut impl Sink) {
    let Some(f) = &c.fused_rope else {
        out.reject(ReasonCode::FUSED_ROPE_UNSUPPORTED, || {
            "RoPE fused into attention requested; the kernel takes q and k already rotated (run rope, then attention)"
        });
        return;
    };
    if !f.styles.contains(&r.style) {
        out.reject(ReasonCode::FUSED_ROPE_UNSUPPORTED, || {
            let have: Vec<&str> = f.styles.iter().map(|s| s.as_str()).collect();
            format!("fused RoPE style {} requested; the kernel rotates {}", r.style.as_str(), have.join(" or "))
        });
    }
    if let Some(s) = &r.scaling
        && !f.scalings.contains(&s.kind())
    {
        out.reject(ReasonCode::FUSED_ROPE_UNSUPPORTED, || {
            let have: Vec<&str> = f.scalings.iter().map(|s| s.as_str()).collect();
            let have = if have.is_empty() { "none".to_owned() } else { have.join(", ") };
            format!("fused RoPE with {} frequency scaling requested; the kernel applies {have}", s.kind().as_str())
        });
    }
    if let Some(rot) = r.rotary_dim
        && rot != d.head_dim
        && !f.partial
    {
        out.reject(ReasonCode::FUSED_ROPE_UNSUPPORTED, || {
            format!(
                "fused RoPE over rotary_dim {rot} of head_dim {} requested; the kernel rotates the whole head",
                d.head_dim
            )
        });
    }
}

/// Whether a request takes a library's single-request entry point: dense, not ragged (a
/// ragged or paged one goes through its batch wrappers).
fn single_path(d: &AttentionDims) -> bool {
    !d.varlen && d.paged.is_none()
}

/// Features the request uses together that the kernel rejects together.
fn exclusive(c: &Constraints, a: &AttentionAttrs, problem: &Problem, d: &AttentionDims, out: &mut impl Sink) {
    if c.exclusive.is_empty() || (c.single_path_only.contains(&SinglePathCheck::Exclusive) && !single_path(d)) {
        return;
    }
    let uses = |f: Feature| match f {
        Feature::Dropout => a.dropout_p > 0.0,
        Feature::Softcap => a.softcap.is_some(),
        Feature::Window => a.window_left.is_some(),
        Feature::Alibi => a.alibi,
        Feature::Mask => d.mask.is_some(),
        Feature::Causal => a.causal,
        Feature::Varlen => d.varlen,
        Feature::CustomScale => a.scale.is_some(),
        Feature::Fp8 => matches!(problem.dtype, DType::Fp8E4M3 | DType::Fp8E5M2),
        Feature::Rope => a.rope.is_some(),
    };
    for [x, y] in &c.exclusive {
        if uses(*x) && uses(*y) {
            out.reject(ReasonCode::FEATURES_EXCLUSIVE, || {
                format!(
                    "{} together with {}: the kernel takes each alone, not both in one call",
                    x.as_str(),
                    y.as_str()
                )
            });
        }
    }
}

fn paged(
    c: &Constraints,
    req: &Request,
    problem: &Problem,
    d: &AttentionDims,
    p: &crate::model::problem::PagedDims,
    out: &mut impl Sink,
) {
    if let Some(ps) = &c.page_size {
        if let Some(m) = ps.multiple
            && !p.page_size.is_multiple_of(m)
        {
            out.reject(ReasonCode::PAGE_SIZE_UNSUPPORTED, || {
                format!("page_size {} is not a multiple of {m}", p.page_size)
            });
        }
        if let Some(values) = &ps.values
            && !values.contains(&p.page_size)
        {
            out.reject(ReasonCode::PAGE_SIZE_UNSUPPORTED, || {
                format!("page_size {} not in [{}]", p.page_size, list(values))
            });
        }
    }
    if let Some(dts) = &c.block_table_dtypes
        && !dts.contains(&p.block_table_dtype)
    {
        out.reject(ReasonCode::BLOCK_TABLE_DTYPE_UNSUPPORTED, || {
            format!("block_table dtype {} not in [{}]", p.block_table_dtype, list(dts))
        });
    }
    if let Some(layouts) = &c.kv_cache_layouts
        && !layouts.contains(&p.kv_layout)
    {
        out.reject(ReasonCode::KV_CACHE_LAYOUT_UNSUPPORTED, || {
            format!("KV cache layout {} not in [{}]", p.kv_layout, list(layouts))
        });
    }
    if c.kv_cache_equal_strides
        && let (Some(k), Some(v)) = (req.get("k_cache"), req.get("v_cache"))
    {
        let strides = |t: &crate::model::tensor::TensorDesc| {
            t.strides.clone().unwrap_or_else(|| crate::model::layout::contiguous_strides(&t.shape))
        };
        let (ks, vs) = (strides(k), strides(v));
        if ks != vs {
            out.reject(ReasonCode::KV_CACHE_STRIDES_UNSUPPORTED, || {
                format!("k_cache strides {ks:?} and v_cache strides {vs:?} differ; the kernel needs them identical")
            });
        }
    }
    if let Some(rule) = c.kv_cache_strides {
        for name in ["k_cache", "v_cache"] {
            let Some(t) = req.get(name) else { continue };
            if !rule.allows(t) {
                out.reject(ReasonCode::KV_CACHE_STRIDES_UNSUPPORTED, || {
                    let need = match rule {
                        StrideRule::Contiguous => "contiguous pages",
                        _ => "stride(-1) == 1",
                    };
                    format!(
                        "tensor `{name}` strides {:?} for shape {:?}; the kernel reads {need}",
                        t.strides.as_deref().unwrap_or(&[]),
                        t.shape
                    )
                });
            }
        }
    }
    match &c.kv_cache_dtypes {
        Some(dts) if !dts.contains(&d.kv_dtype) => out.reject(ReasonCode::KV_CACHE_DTYPE_UNSUPPORTED, || {
            format!("KV cache dtype {} not in [{}]", d.kv_dtype, list(dts))
        }),
        None if d.kv_dtype != problem.dtype => out.reject(ReasonCode::KV_CACHE_DTYPE_UNSUPPORTED, || {
            format!("KV cache dtype {} != query dtype {}; the kernel needs them equal", d.kv_dtype, problem.dtype)
        }),
        _ => {}
    }
}
