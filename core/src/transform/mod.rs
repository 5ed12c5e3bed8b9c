//! Transforms: adapting a request's inputs so a kernel can take them (layout change,
//! make-contiguous, lossless dtype widening), each with its modeled cost.
//!
//! Only failures in [`ADAPTABLE`] are candidates for adaptation; a transform is planned
//! only when the adapted request passes every check, and the report lists each one.

mod block;
mod tensors;

use serde::Serialize;

use crate::capabilities::spec::{KernelSpec, MaskName, PAD_MULTIPLES};
use crate::hardware::profile::DeviceProfile;
use crate::model::device::DeviceKind;
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::problem::{MaskKind, Problem, data_roles, layout_of};
use crate::model::request::Request;
use crate::reason::ReasonCode;

pub use tensors::{apply_transforms, cast_outputs_back};

/// Constraint failures a transform can remove.
pub const ADAPTABLE: &[ReasonCode] = &[
    ReasonCode::LAYOUT_UNSUPPORTED,
    ReasonCode::LAST_DIM_NOT_CONTIGUOUS,
    ReasonCode::NOT_CONTIGUOUS,
    ReasonCode::STRIDE_ALIGNMENT,
    ReasonCode::HEAD_DIM_ALIGNMENT,
    ReasonCode::DTYPE_UNSUPPORTED,
    ReasonCode::BLOCK_SPARSE_MASK_UNSUPPORTED,
];

/// What a transform does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransformKind {
    /// Copy into the other layout of the same dimensions: BSHD <-> BHSD, NCHW <-> NHWC.
    Transpose,
    /// Copy a strided view into contiguous memory.
    MakeContiguous,
    /// Cast to a wider dtype (lossless); the output is cast back.
    Cast,
    /// Expand a block-sparse mask's bool block layout into the dense bool mask it means.
    ExpandBlockMask,
    /// Pad the head dim of q, k and v with zeros up to the kernel's multiple, and slice the
    /// output back: done by the library's own entry point (FlashAttention-2's wrappers), so
    /// LayerZero only plans and charges it.
    PadHeadDim,
}

impl TransformKind {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            TransformKind::Transpose => "transpose",
            TransformKind::MakeContiguous => "make_contiguous",
            TransformKind::Cast => "cast",
            TransformKind::ExpandBlockMask => "expand_block_mask",
            TransformKind::PadHeadDim => "pad_head_dim",
        }
    }

    /// True when the kernel's library performs it on the inputs as given (LayerZero hands the
    /// tensors over unchanged and only charges it).
    pub fn in_library(self) -> bool {
        self == TransformKind::PadHeadDim
    }
}

/// One planned adaptation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Transform {
    /// What it does.
    pub kind: TransformKind,
    /// The tensor it applies to (`out` for the cast back of the result).
    pub tensor: &'static str,
    /// Before (layout, `strided`, or dtype).
    pub from: &'static str,
    /// After.
    pub to: &'static str,
    /// Bytes read plus written.
    pub bytes: u64,
    /// Modeled time, ns.
    pub ns: f64,
}

/// The layout a tensor in `from` can be copied into (the same dimensions in another
/// order), and the permutation that does it: dimension i of the copy is dimension
/// `perm[i]` of the original.
pub fn relayout(from: Layout) -> Option<(Layout, [usize; 4])> {
    match from {
        Layout::Bshd => Some((Layout::Bhsd, [0, 2, 1, 3])),
        Layout::Bhsd => Some((Layout::Bshd, [0, 2, 1, 3])),
        Layout::Nchw => Some((Layout::Nhwc, [0, 2, 3, 1])),
        Layout::Nhwc => Some((Layout::Nchw, [0, 3, 1, 2])),
        Layout::Nhd | Layout::Hnd | Layout::Nt | Layout::Nn => None,
    }
}

/// Fraction of memory bandwidth a copy/cast kernel reaches.
const COPY_EFFICIENCY: f64 = 0.7;

fn launch_ns(kind: DeviceKind) -> f64 {
    match kind {
        DeviceKind::Cpu => 500.0,
        DeviceKind::Cuda | DeviceKind::Rocm => 3000.0,
    }
}

/// Plans the transforms that would make `req` acceptable to `kernel` (`None` when no
/// lossless adaptation exists). The caller re-checks the adapted request ([`apply`]):
/// a plan is only used when the kernel then passes every check.
pub fn plan(kernel: &KernelSpec, req: &Request, problem: &Problem, dev: &DeviceProfile) -> Option<Vec<Transform>> {
    let c = &kernel.constraints;
    let mut transforms = Vec::new();
    let bw = dev.bandwidth_bytes_per_s() * COPY_EFFICIENCY;
    let cost = |bytes: u64| bytes as f64 / bw * 1e9 + launch_ns(dev.kind);
    let mut push = |kind, tensor, from, to, bytes: u64| {
        transforms.push(Transform { kind, tensor, from, to, bytes, ns: cost(bytes) });
    };

    // A lossless widening to the narrowest dtype the kernel takes.
    let target_dtype = match &c.dtypes {
        Some(dts) if !dts.contains(&problem.dtype) => {
            let mut options: Vec<DType> =
                dts.iter().copied().filter(|d| problem.dtype.widens_losslessly_to(*d)).collect();
            options.sort_by_key(|d| (d.size_bytes(), *d));
            Some(*options.first()?)
        }
        _ => None,
    };
    // A block layout becomes the dense bool mask for a kernel that takes one: the layout is
    // read once and one byte per query x key written.
    if let (Some(m), Some(dims)) = (req.tensors.get("mask"), problem.attention())
        && dims.mask.is_some_and(|mi| mi.kind == MaskKind::BlockSparse)
        && !c.masks.contains(&MaskName::BlockSparse)
    {
        if !c.masks.contains(&MaskName::Bool) {
            return None;
        }
        let dense: u64 = block::dense_shape(&m.shape, dims.seq_q, dims.seq_k).iter().product();
        push(TransformKind::ExpandBlockMask, "mask", "block_sparse", "bool", m.numel().saturating_add(dense));
    }
    // A head dim the library pads itself: q, k and v copied with zeros up to the multiple
    // (read once, written padded), the output sliced back.
    if let (Some(p), Some(dims)) = (c.head_dim.as_ref().and_then(|h| h.padded_to), problem.attention())
        && p > 1
        && (dims.head_dim % p != 0 || dims.head_dim_v % p != 0)
    {
        let max = c.head_dim.as_ref().and_then(|h| h.max).unwrap_or(u64::MAX);
        if dims.head_dim.next_multiple_of(p) > max || dims.head_dim_v.next_multiple_of(p) > max {
            return None;
        }
        let to = pad_name(p)?;
        for name in ["q", "k", "v"] {
            let Some(t) = req.tensors.get(name) else { continue };
            let d = t.shape.last().copied().unwrap_or(1).max(1);
            let padded = t.bytes() / d * d.next_multiple_of(p);
            push(TransformKind::PadHeadDim, name, "unaligned", to, t.bytes().saturating_add(padded));
        }
    }
    for &name in data_roles(req.op) {
        let Some(t) = req.tensors.get(name) else { continue };
        // An untagged tensor is copied from the layout its op gives it (an NCHW image).
        if let (Some(layouts), Some(l)) = (&c.layouts, layout_of(req.op, name, t))
            && !layouts.contains(&l)
            && let Some((other, _)) = relayout(l)
        {
            if !layouts.contains(&other) {
                return None;
            }
            // The copy reads the tensor once and writes it once.
            push(TransformKind::Transpose, name, l.as_str(), other.as_str(), t.bytes().saturating_mul(2));
        } else if t.strides.is_some() && !t.is_contiguous() && c.strides.is_some() {
            push(TransformKind::MakeContiguous, name, "strided", "contiguous", t.bytes().saturating_mul(2));
        }
        if let Some(to) = target_dtype
            && t.dtype == problem.dtype
        {
            let bytes = t.numel().saturating_mul(t.dtype.size_bytes() + to.size_bytes());
            push(TransformKind::Cast, name, t.dtype.as_str(), to.as_str(), bytes);
        }
    }
    if let Some(to) = target_dtype {
        if let Some(m) = req.tensors.get("mask")
            && m.dtype == problem.dtype
        {
            let bytes = m.numel().saturating_mul(m.dtype.size_bytes() + to.size_bytes());
            push(TransformKind::Cast, "mask", m.dtype.as_str(), to.as_str(), bytes);
        }
        let bytes = problem.output_elements().saturating_mul(problem.dtype.size_bytes() + to.size_bytes());
        push(TransformKind::Cast, "out", to.as_str(), problem.dtype.as_str(), bytes);
    }
    if transforms.is_empty() { None } else { Some(transforms) }
}

fn pad_name(p: u64) -> Option<&'static str> {
    PAD_MULTIPLES.iter().find(|(m, _)| *m == p).map(|(_, n)| *n)
}

/// The request as the kernel sees it after `transforms`.
pub fn apply(req: &Request, transforms: &[Transform]) -> Request {
    let mut adapted = req.clone();
    for tr in transforms {
        let Some(t) = adapted.tensors.get_mut(tr.tensor) else { continue };
        match tr.kind {
            TransformKind::Transpose => {
                if let Some((to, perm)) = Layout::from_name(tr.from).and_then(relayout)
                    && t.shape.len() == 4
                {
                    t.shape = perm.iter().map(|&d| t.shape[d]).collect();
                    t.layout = Some(to);
                    t.strides = None;
                }
            }
            TransformKind::MakeContiguous => t.strides = None,
            TransformKind::Cast => {
                if let Ok(d) = tr.to.parse::<DType>() {
                    t.dtype = d;
                }
            }
            TransformKind::ExpandBlockMask => block::expand_desc(&mut adapted),
            TransformKind::PadHeadDim => {
                let p = PAD_MULTIPLES.iter().find(|(_, n)| *n == tr.to).map_or(1, |(p, _)| *p);
                if let Some(last) = t.shape.last_mut() {
                    *last = last.next_multiple_of(p);
                }
                t.strides = None;
            }
        }
    }
    adapted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::model::op::Op;
    use crate::model::tensor::TensorDesc;

    #[test]
    fn a_layout_copy_permutes_the_dimensions_of_the_layout_it_names() -> TestResult {
        for (from, shape, want) in [
            (Layout::Nchw, [2, 3, 8, 12], [2, 8, 12, 3]),
            (Layout::Nhwc, [2, 8, 12, 3], [2, 3, 8, 12]),
            (Layout::Bshd, [1, 16, 4, 64], [1, 4, 16, 64]),
        ] {
            let (to, _) = relayout(from).ok_or_else(|| format!("{from} has no layout copy"))?;
            let desc = TensorDesc::new(DType::F32, shape).with_layout(from).with_strides([1, 1, 1, 1]);
            let req = Request::new(Op::PatchEmbed).tensor("image", desc);
            let tr = Transform {
                kind: TransformKind::Transpose,
                tensor: "image",
                from: from.as_str(),
                to: to.as_str(),
                bytes: 0,
                ns: 0.0,
            };
            let t = &apply(&req, &[tr]).tensors["image"];
            assert_eq!((t.shape.as_slice(), t.layout, &t.strides), (&want[..], Some(to), &None), "{from}");
        }
        Ok(())
    }

    #[test]
    fn every_layout_copy_is_undone_by_the_copy_back() -> TestResult {
        for l in Layout::ALL {
            let Some((to, there)) = relayout(l) else { continue };
            let (back, again) = relayout(to).ok_or_else(|| format!("{to} cannot be copied back to {l}"))?;
            assert_eq!(back, l);
            assert_eq!(again.map(|d| there[d]), [0, 1, 2, 3], "{l} -> {to} -> {back}");
        }
        Ok(())
    }
}
