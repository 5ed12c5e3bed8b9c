//! Transforms applied to real tensors at run time: the planned layout changes, copies and
//! casts before a kernel runs, and the cast of its outputs back to the caller's dtype.

use crate::error::{Error, Result};
use crate::exec::args::{OpArgs, Outputs};
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::tensor::HostTensor;

use super::{Transform, TransformKind, relayout};

/// Applies the input transforms a selection planned (the caller's tensors are not touched:
/// adapted tensors are new).
pub fn apply_transforms(args: &OpArgs, transforms: &[Transform]) -> Result<OpArgs> {
    // What the kernel's library does itself is handed over as it is.
    let owned: Vec<Transform>;
    let transforms = if transforms.iter().any(|t| t.kind.in_library()) {
        owned = transforms.iter().filter(|t| !t.kind.in_library()).cloned().collect();
        &owned[..]
    } else {
        transforms
    };
    if transforms.is_empty() {
        return Ok(args.clone());
    }
    // Every transform copies through host memory, which a device tensor has none of.
    if let Some((name, device)) = args.on_device() {
        return Err(Error::invalid(format!(
            "tensor `{name}` is on {device}: {} needs adapting in host memory",
            transforms.iter().map(|t| format!("{} of `{}`", t.kind.as_str(), t.tensor)).collect::<Vec<_>>().join(", ")
        )));
    }
    // The block layout is expanded first: it needs q's and k's lengths, not the mask alone.
    let expanded;
    let args = if transforms.iter().any(|t| t.kind == TransformKind::ExpandBlockMask) {
        expanded = super::block::expand(args)?;
        &expanded
    } else {
        args
    };
    args.map_tensors(|name, t| {
        let mut t = t.clone();
        for tr in transforms.iter().filter(|tr| tr.tensor == name) {
            t = match tr.kind {
                TransformKind::Transpose => {
                    let Some((to, perm)) = Layout::from_name(tr.from).and_then(relayout) else {
                        return Err(Error::invalid(format!("no layout copy from {} to {}", tr.from, tr.to)));
                    };
                    t.permute(&perm)?.contiguous().with_layout(to)
                }
                TransformKind::MakeContiguous => {
                    let l = t.layout();
                    let c = t.contiguous();
                    match l {
                        Some(l) => c.with_layout(l),
                        None => c,
                    }
                }
                TransformKind::Cast => cast(&t, tr.to)?,
                TransformKind::ExpandBlockMask | TransformKind::PadHeadDim => t,
            };
        }
        Ok(t)
    })
}

fn cast(t: &HostTensor, to: &str) -> Result<HostTensor> {
    let d: DType = to.parse().map_err(Error::invalid)?;
    let c = HostTensor::from_f32_as(d, t.shape(), &t.to_f32_vec())?;
    Ok(match t.layout() {
        Some(l) => c.with_layout(l),
        None => c,
    })
}

/// Casts float outputs back to the dtype the caller's `out` had, when a cast was planned.
pub fn cast_outputs_back(mut outputs: Outputs, transforms: &[Transform]) -> Result<Outputs> {
    if let Some(tr) = transforms.iter().find(|t| t.kind == TransformKind::Cast && t.tensor == "out") {
        for t in outputs.values_mut() {
            if t.dtype().is_float() {
                *t = cast(t, tr.to)?;
            }
        }
    }
    Ok(outputs)
}
