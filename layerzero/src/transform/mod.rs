//! Transforms: adapting a request's inputs so a kernel can take them (layout change,
//! make-contiguous, lossless dtype widening), each with its modeled cost.
//!
//! Only failures in [`ADAPTABLE`] are candidates for adaptation; a transform is planned
//! only when the adapted request passes every check, and the report lists each one.

use serde::Serialize;

use crate::capabilities::spec::KernelSpec;
use crate::hardware::profile::DeviceProfile;
use crate::model::device::DeviceKind;
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::problem::{Problem, data_roles};
use crate::model::request::Request;
use crate::reason::{Reason, ReasonCode};

/// Constraint failures a transform can remove.
pub const ADAPTABLE: &[ReasonCode] = &[
    ReasonCode::LAYOUT_UNSUPPORTED,
    ReasonCode::LAST_DIM_NOT_CONTIGUOUS,
    ReasonCode::NOT_CONTIGUOUS,
    ReasonCode::DTYPE_UNSUPPORTED,
];

/// What a transform does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransformKind {
    /// Copy BSHD <-> BHSD.
    Transpose,
    /// Copy a strided view into contiguous memory.
    MakeContiguous,
    /// Cast to a wider dtype (lossless); the output is cast back.
    Cast,
}

impl TransformKind {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            TransformKind::Transpose => "transpose",
            TransformKind::MakeContiguous => "make_contiguous",
            TransformKind::Cast => "cast",
        }
    }
}

/// One planned adaptation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Transform {
    /// What it does.
    pub kind: TransformKind,
    /// The tensor it applies to (`out` for the cast back of the result).
    pub tensor: String,
    /// Before (layout, `strided`, or dtype).
    pub from: String,
    /// After.
    pub to: String,
    /// Bytes read plus written.
    pub bytes: u64,
    /// Modeled time, ns.
    pub ns: f64,
}

/// Fraction of memory bandwidth a copy/cast kernel reaches.
const COPY_EFFICIENCY: f64 = 0.7;

fn launch_ns(kind: DeviceKind) -> f64 {
    match kind {
        DeviceKind::Cpu => 500.0,
        DeviceKind::Cuda | DeviceKind::Rocm => 3000.0,
    }
}

/// True when every reason can be removed by adapting inputs.
pub fn all_adaptable(reasons: &[Reason]) -> bool {
    !reasons.is_empty() && reasons.iter().all(|r| ADAPTABLE.contains(&r.code()))
}

/// Plans the transforms that make `req` acceptable to `kernel`, returning them with the
/// adapted request, or `None` when no lossless adaptation exists.
pub fn plan(
    kernel: &KernelSpec,
    req: &Request,
    problem: &Problem,
    dev: &DeviceProfile,
) -> Option<(Vec<Transform>, Request)> {
    let c = &kernel.constraints;
    let mut adapted = req.clone();
    let mut transforms = Vec::new();
    let bw = dev.bandwidth_bytes_per_s() * COPY_EFFICIENCY;
    let cost = |bytes: u64| bytes as f64 / bw * 1e9 + launch_ns(dev.kind);

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
    for name in data_roles(req.op) {
        let Some(t) = adapted.tensors.get_mut(*name) else { continue };
        let elems = t.numel();
        if let (Some(layouts), Some(l)) = (&c.layouts, t.layout)
            && !layouts.contains(&l)
            && matches!(l, Layout::Bshd | Layout::Bhsd)
        {
            let other = if l == Layout::Bshd { Layout::Bhsd } else { Layout::Bshd };
            if !layouts.contains(&other) {
                return None;
            }
            let s = t.shape.clone();
            t.shape = vec![s[0], s[2], s[1], s[3]];
            t.layout = Some(other);
            t.strides = None;
            let bytes = 2 * t.bytes();
            transforms.push(Transform {
                kind: TransformKind::Transpose,
                tensor: (*name).to_owned(),
                from: l.to_string(),
                to: other.to_string(),
                bytes,
                ns: cost(bytes),
            });
        } else if t.strides.is_some() && !t.is_contiguous() && c.strides.is_some() {
            t.strides = None;
            let bytes = 2 * t.bytes();
            transforms.push(Transform {
                kind: TransformKind::MakeContiguous,
                tensor: (*name).to_owned(),
                from: "strided".to_owned(),
                to: "contiguous".to_owned(),
                bytes,
                ns: cost(bytes),
            });
        }
        if let Some(to) = target_dtype
            && t.dtype == problem.dtype
        {
            let bytes = elems * (t.dtype.size_bytes() + to.size_bytes());
            transforms.push(Transform {
                kind: TransformKind::Cast,
                tensor: (*name).to_owned(),
                from: t.dtype.to_string(),
                to: to.to_string(),
                bytes,
                ns: cost(bytes),
            });
            t.dtype = to;
        }
    }
    if let Some(to) = target_dtype {
        if let Some(m) = adapted.tensors.get_mut("mask")
            && m.dtype == problem.dtype
        {
            let bytes = m.numel() * (m.dtype.size_bytes() + to.size_bytes());
            transforms.push(Transform {
                kind: TransformKind::Cast,
                tensor: "mask".to_owned(),
                from: m.dtype.to_string(),
                to: to.to_string(),
                bytes,
                ns: cost(bytes),
            });
            m.dtype = to;
        }
        let out_elems = crate::score::output_elements(problem);
        let bytes = out_elems * (problem.dtype.size_bytes() + to.size_bytes());
        transforms.push(Transform {
            kind: TransformKind::Cast,
            tensor: "out".to_owned(),
            from: to.to_string(),
            to: problem.dtype.to_string(),
            bytes,
            ns: cost(bytes),
        });
    }
    if transforms.is_empty() {
        return None;
    }
    Some((transforms, adapted))
}
