//! `lz tune --calibrate`: fit the cost model's coefficients per (kernel, dtype) to the times
//! measured for a workload on this machine, and read and write the calibration file
//! (`$LAYERZERO_CALIBRATION`, else `$LAYERZERO_HOME/calibration.json`).

use std::collections::BTreeMap;

use super::Planned;
use super::report::{KernelResult, Status};
use crate::model::dtype::DType;
use crate::model::problem::Problem;
use crate::score::calibration::{Calibration, KernelFit, Sample, fit};
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
