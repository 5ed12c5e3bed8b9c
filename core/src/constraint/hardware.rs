//! Hardware constraints: compute capability, compiled archs, gfx, CPU ISA, per-dtype needs.

use super::Sink;
use super::list;
use crate::capabilities::spec::Constraints;
use crate::hardware::profile::{CpuFeatures, DeviceProfile};
use crate::model::dtype::DType;
use crate::model::problem::AttentionDims;
use crate::reason::ReasonCode;

pub(super) fn check(c: &Constraints, dtype: DType, dev: &DeviceProfile, out: &mut impl Sink) {
    if let (Some(range), Some(cc)) = (&c.compute_capability, dev.compute_capability) {
        if let Some(min) = range.min
            && cc < min
        {
            out.reject(ReasonCode::COMPUTE_CAPABILITY_TOO_OLD, || {
                format!("compute capability {cc} < min {min} ({})", dev.name)
            });
        }
        if let Some(max) = range.max
            && cc > max
        {
            out.reject(ReasonCode::COMPUTE_CAPABILITY_TOO_NEW, || {
                format!("compute capability {cc} > max {max} ({})", dev.name)
            });
        }
    }
    if let (Some(archs), Some(cc)) = (&c.built_archs, dev.compute_capability)
        && !archs.iter().any(|a| a.runs_on(cc))
    {
        out.reject(ReasonCode::NO_KERNEL_IMAGE_FOR_ARCH, || {
            format!("no kernel image runs on sm {cc}; built for {}", list(archs))
        });
    }
    if let Some(gfx) = &c.gfx {
        let ok = dev.gfx.as_ref().is_some_and(|g| gfx.iter().any(|x| x == g));
        if !ok {
            out.reject(ReasonCode::GFX_ARCH_UNSUPPORTED, || {
                format!("gfx arch {} not in {}", dev.gfx.as_deref().unwrap_or("(none)"), list(gfx))
            });
        }
    }
    if let Some(isa) = c.cpu_isa {
        let missing = dev.isa.missing(isa);
        if !missing.is_empty() {
            out.reject(ReasonCode::CPU_ISA_MISSING, || format!("CPU {} lacks {}", dev.name, missing.names()));
        }
    }
    for req in c.dtype_requirements.iter().filter(|r| r.dtype == dtype) {
        if let (Some(min), Some(cc)) = (req.min_compute_capability, dev.compute_capability)
            && cc < min
        {
            out.reject(ReasonCode::DTYPE_UNSUPPORTED_ON_HARDWARE, || {
                format!("{dtype} needs compute capability >= {min}; device has {cc}")
            });
        }
        if let Some(any_of) = &req.cpu_isa_any_of
            && !any_of.iter().any(|set| dev.isa.contains_all(*set))
        {
            let options: Vec<String> = any_of.iter().map(|s: &CpuFeatures| format!("[{}]", s.names())).collect();
            out.reject(ReasonCode::DTYPE_UNSUPPORTED_ON_HARDWARE, || {
                format!(
                    "{dtype} needs one of the CPU feature sets {}; {} has [{}]",
                    options.join(" "),
                    dev.name,
                    dev.isa.names()
                )
            });
        }
    }
}

/// `head_dim_requirements`: a head dim above a bound (with the listed KV dtypes) needs a newer
/// compute capability than the device's.
pub(super) fn head_dims(c: &Constraints, d: &AttentionDims, dev: &DeviceProfile, out: &mut impl Sink) {
    let Some(cc) = dev.compute_capability else { return };
    if d.head_dim != d.head_dim_v
        && let Some(min) = c
            .head_dim_pairs
            .iter()
            .find(|p| (p.head_dim, p.head_dim_v) == (d.head_dim, d.head_dim_v))
            .and_then(|p| p.min_compute_capability)
        && cc < min
    {
        out.reject(ReasonCode::HEAD_DIM_UNSUPPORTED_ON_HARDWARE, || {
            format!(
                "head dims ({}, {}) are built for compute capability >= {min}; {} has {cc}",
                d.head_dim, d.head_dim_v, dev.name
            )
        });
    }
    let hd = d.head_dim.max(d.head_dim_v);
    for r in &c.head_dim_requirements {
        let kv_matches = r.kv_dtypes.as_ref().is_none_or(|k| k.contains(&d.kv_dtype));
        if hd > r.above && kv_matches && cc < r.min_compute_capability {
            out.reject(ReasonCode::HEAD_DIM_UNSUPPORTED_ON_HARDWARE, || {
                let with =
                    if r.kv_dtypes.is_some() { format!(" with a {} KV cache", d.kv_dtype) } else { String::new() };
                format!(
                    "head_dim {hd}{with} is built for compute capability >= {} (above {}); {} has {cc}",
                    r.min_compute_capability, r.above, dev.name
                )
            });
        }
    }
}
