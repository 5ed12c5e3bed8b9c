//! Tensor-level constraints: dtypes, layouts, strides.

use super::Sink;
use super::list;
use crate::capabilities::spec::{Constraints, StrideRule};
use crate::model::op::Op;
use crate::model::problem::{Problem, data_roles, layout_of};
use crate::model::request::Request;
use crate::reason::ReasonCode;

pub(super) fn check(c: &Constraints, req: &Request, problem: &Problem, out: &mut impl Sink) {
    if let Some(dtypes) = &c.dtypes
        && !dtypes.contains(&problem.dtype)
    {
        out.reject(ReasonCode::DTYPE_UNSUPPORTED, || format!("dtype {} not in [{}]", problem.dtype, list(dtypes)));
    }
    // Every kernel of these ops computes in one dtype: its data tensors must share it.
    let same_dtype: &[&str] = match req.op {
        Op::Attention => &["q", "k", "v"],
        Op::RmsNorm | Op::LayerNorm => &["x", "weight", "bias", "residual"],
        Op::Linear => &["x", "weight", "bias"],
        Op::Swiglu | Op::Geglu => &["gate", "up"],
        Op::Mlp | Op::MoeExperts => &["x", "w_gate", "w_up", "w_down"],
        Op::Rope => &["q", "k"],
        Op::PatchEmbed => &["image", "weight", "bias"],
        _ => &[],
    };
    // A kernel that declares KV dtypes takes k and v in one of them under any query dtype.
    let kv_dtypes = c.kv_dtypes.as_ref().filter(|_| req.op == Op::Attention);
    if let (Some(kv), Some(k), Some(v)) = (kv_dtypes, req.get("k"), req.get("v")) {
        if k.dtype != v.dtype {
            out.reject(ReasonCode::DTYPE_MISMATCH, || format!("k is {} but v is {}", k.dtype, v.dtype));
        } else if k.dtype != problem.dtype && !kv.contains(&k.dtype) {
            out.reject(ReasonCode::DTYPE_MISMATCH, || {
                format!("k and v are {}; the kernel takes the query's {} or [{}]", k.dtype, problem.dtype, list(kv))
            });
        }
    }
    for name in same_dtype {
        if kv_dtypes.is_some() && (*name == "k" || *name == "v") {
            continue;
        }
        if let Some(t) = req.get(name)
            && t.dtype != problem.dtype
        {
            out.reject(ReasonCode::DTYPE_MISMATCH, || {
                format!("tensor `{name}` is {} but the op computes in {}", t.dtype, problem.dtype)
            });
        }
    }
    for name in data_roles(req.op) {
        let Some(t) = req.get(name) else { continue };
        // An untagged tensor is judged by the layout its op gives it (an NCHW image).
        if let (Some(layouts), Some(l)) = (&c.layouts, layout_of(req.op, name, t))
            && !layouts.contains(&l)
            && !is_paged_cache(req.op, name)
        {
            out.reject(ReasonCode::LAYOUT_UNSUPPORTED, || {
                format!("tensor `{name}` layout {l} not in [{}]", list(layouts))
            });
        }
        match c.strides {
            Some(StrideRule::Contiguous) if !t.is_contiguous() => out.reject(ReasonCode::NOT_CONTIGUOUS, || {
                format!(
                    "tensor `{name}` strides {:?} are not contiguous for shape {:?}",
                    t.strides.as_deref().unwrap_or(&[]),
                    t.shape
                )
            }),
            Some(StrideRule::LastDimContiguous) if !t.last_dim_contiguous() => out
                .reject(ReasonCode::LAST_DIM_NOT_CONTIGUOUS, || {
                    format!("tensor `{name}` stride(-1) is {}; the kernel needs 1", t.last_stride())
                }),
            _ => {}
        }
    }
}

/// Paged caches carry NHD/HND tags, checked by `kv_cache_layouts`, not `layouts`.
fn is_paged_cache(op: Op, name: &str) -> bool {
    op == Op::PagedAttention && (name == "k_cache" || name == "v_cache")
}
