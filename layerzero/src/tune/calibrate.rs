//! `lz tune --calibrate`: fit the cost model's coefficients per (kernel, dtype) to the times
//! measured for a workload on this machine, and read and write the calibration file
//! (`$LAYERZERO_CALIBRATION`, else `$LAYERZERO_HOME/calibration.json`).

use std::collections::BTreeMap;
use std::path::Path;

use super::Planned;
use super::report::{KernelResult, Status};
use crate::error::{Error, Result};
use crate::model::dtype::DType;
use crate::model::problem::Problem;
use crate::score::calibration::{CALIBRATION_SCHEMA_VERSION, Calibration, KernelFit, Sample, fit};
use crate::select::Selector;

/// Fits every (kernel, dtype) that `results` measured at the points of `plans`, from the
/// spec model's roofline term there (`selector` must model with the capability files'
/// coefficients: no calibration of its own).
pub(super) fn fit_results(
    selector: &Selector,
    plans: &[Planned<'_>],
    results: &[KernelResult],
    workload: &str,
) -> Calibration {
    let mut samples: BTreeMap<(String, DType), Vec<Sample>> = BTreeMap::new();
    for plan in plans {
        let dtype = Problem::describe(&plan.point.request).dtype;
        for sel in &plan.ranked {
            let measured = results.iter().find(|r| {
                r.entry == plan.point.entry
                    && r.bucket == plan.bucket
                    && r.key == plan.key
                    && r.kernel == sel.kernel
                    && r.status != Status::Failed
            });
            let (Some(r), false) = (measured, sel.score.model.calibrated) else { continue };
            let roof_ns = sel.score.model.compute_ns.max(sel.score.model.memory_ns);
            samples.entry((sel.kernel.clone(), dtype)).or_default().push(Sample { roof_ns, measured_ns: r.median_ns });
        }
    }
    let catalog = selector.catalog();
    let fits: Vec<KernelFit> = samples
        .into_iter()
        .filter_map(|((kernel, dtype), s)| {
            let spec = &catalog.kernel(catalog.find(&kernel)?).1.perf;
            let (perf, before, after) = fit(&s, spec)?;
            Some(KernelFit {
                kernel,
                dtype,
                eff_compute: perf.eff_compute,
                eff_mem: perf.eff_mem,
                launch_ns: perf.launch_ns,
                points: u32::try_from(s.len()).unwrap_or(u32::MAX),
                error_before: before,
                error_after: after,
            })
        })
        .collect();
    let hw = selector.hardware();
    let now = crate::time::format_utc(crate::time::now_unix());
    Calibration::new(&hw.name, &hw.fingerprint, workload, &now, fits)
}

/// Reads a calibration file.
pub fn load(path: &Path) -> Result<Calibration> {
    let text = crate::files::read_to_string(path)?;
    let mut c: Calibration = serde_json::from_str(&text)
        .map_err(|e| Error::invalid(format!("{}: not a calibration file: {e}", path.display())))?;
    if c.schema_version != CALIBRATION_SCHEMA_VERSION {
        return Err(Error::invalid(format!(
            "{}: schema_version {} is not {CALIBRATION_SCHEMA_VERSION}, the format this build reads",
            path.display(),
            c.schema_version
        )));
    }
    for k in &c.kernels {
        let ok = |x: f64| x.is_finite() && x > 0.0;
        if !(ok(k.eff_compute) && ok(k.eff_mem) && k.launch_ns.is_finite() && k.launch_ns >= 0.0) {
            return Err(Error::invalid(format!(
                "{}: kernel {} ({}): eff_compute {}, eff_mem {} must be > 0 and launch_ns {} >= 0",
                path.display(),
                k.kernel,
                k.dtype,
                k.eff_compute,
                k.eff_mem,
                k.launch_ns
            )));
        }
    }
    c.reindex();
    Ok(c)
}

/// Writes a calibration file (a new file renamed over the old one).
pub fn save(path: &Path, c: &Calibration) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::invalid(format!("{}: {e}", dir.display())))?;
    }
    let text = serde_json::to_string_pretty(c).map_err(|e| Error::invalid(e.to_string()))?;
    crate::files::write(path, format!("{text}\n").as_bytes(), &[])
}
