//! Calibration of the cost model from measurements: per (kernel, dtype), the efficiencies
//! and launch cost that make `max(compute, memory) + launch` match what the kernel took on
//! this machine. `lz tune --calibrate` fits and writes it; selectors built for the same
//! machine (hardware fingerprint) read it, so model-only selection improves on buckets no
//! PerfDB row covers.
//!
//! The fit: the spec's model gives `x = max(compute_ns, memory_ns)` at its own efficiencies;
//! a scale `s` and a launch cost `L` are chosen to minimize `sum(((s x + L) / t - 1)^2)` over
//! the measured times `t` (relative error, so small and large buckets weigh alike), with
//! `s > 0` and `L >= 0`; the calibrated efficiencies are the spec's divided by `s`.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

use crate::capabilities::spec::PerfModel;
use crate::model::dtype::DType;

/// The calibration file's format version.
pub const CALIBRATION_SCHEMA_VERSION: u32 = 1;

/// One kernel's fitted coefficients for one dtype.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelFit {
    /// Kernel id.
    pub kernel: String,
    /// The request dtype the fit covers.
    pub dtype: DType,
    /// Fitted fraction of peak FLOP/s.
    pub eff_compute: f64,
    /// Fitted fraction of memory bandwidth.
    pub eff_mem: f64,
    /// Fitted per-call cost, ns.
    pub launch_ns: f64,
    /// Measured buckets the fit used.
    pub points: u32,
    /// Mean |model / measured - 1| with the spec's coefficients.
    pub error_before: f64,
    /// The same with the fitted ones.
    pub error_after: f64,
}

/// Fitted coefficients for one machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Format version.
    pub schema_version: u32,
    /// The hardware profile's name.
    pub hardware: String,
    /// Its fingerprint: the calibration is used only on the machine it was fitted on.
    pub fingerprint: String,
    /// layerzero version that fitted it.
    pub layerzero_version: String,
    /// The workload the measurements came from.
    pub workload: String,
    /// RFC 3339 UTC.
    pub created_at: String,
    /// The fits, sorted by kernel then dtype.
    pub kernels: Vec<KernelFit>,
    /// Kernel id -> (dtype, position in `kernels`).
    #[serde(skip)]
    index: HashMap<String, Vec<(DType, usize)>>,
}

impl Calibration {
    /// A calibration of `kernels` (sorted and indexed here).
    pub fn new(
        hardware: &str,
        fingerprint: &str,
        workload: &str,
        created_at: &str,
        mut kernels: Vec<KernelFit>,
    ) -> Self {
        kernels.sort_by(|a, b| (a.kernel.as_str(), a.dtype).cmp(&(b.kernel.as_str(), b.dtype)));
        let mut c = Calibration {
            schema_version: CALIBRATION_SCHEMA_VERSION,
            hardware: hardware.to_owned(),
            fingerprint: fingerprint.to_owned(),
            layerzero_version: env!("CARGO_PKG_VERSION").to_owned(),
            workload: workload.to_owned(),
            created_at: created_at.to_owned(),
            kernels,
            index: HashMap::new(),
        };
        c.reindex();
        c
    }

    /// Rebuilds the lookup index (after deserializing).
    pub fn reindex(&mut self) {
        self.index.clear();
        for (i, k) in self.kernels.iter().enumerate() {
            self.index.entry(k.kernel.clone()).or_default().push((k.dtype, i));
        }
    }

    /// The fit of `kernel` for `dtype`, if one was made.
    pub fn get(&self, kernel: &str, dtype: DType) -> Option<&KernelFit> {
        let &(_, i) = self.index.get(kernel)?.iter().find(|(d, _)| *d == dtype)?;
        self.kernels.get(i)
    }

    /// The spec's model with the fitted coefficients of `kernel` for `dtype` (the spec's
    /// own when there is no fit).
    pub fn perf(&self, kernel: &str, dtype: DType, spec: &PerfModel) -> (PerfModel, bool) {
        match self.get(kernel, dtype) {
            Some(f) => (
                PerfModel { eff_compute: f.eff_compute, eff_mem: f.eff_mem, launch_ns: f.launch_ns, ..spec.clone() },
                true,
            ),
            None => (spec.clone(), false),
        }
    }
}

/// One measured bucket of a kernel: the spec model's roofline term and the measured time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// `max(compute_ns, memory_ns)` at the spec's efficiencies.
    pub roof_ns: f64,
    /// The measured median, ns.
    pub measured_ns: f64,
}

/// Fits `s` and `L` (see the module doc) to `samples` of a kernel whose spec launch cost is
/// `launch_ns`; `None` without a usable sample.
pub fn fit(samples: &[Sample], spec: &PerfModel) -> Option<(PerfModel, f64, f64)> {
    let usable: Vec<Sample> = samples
        .iter()
        .copied()
        .filter(|s| s.measured_ns.is_finite() && s.measured_ns > 0.0 && s.roof_ns.is_finite() && s.roof_ns >= 0.0)
        .collect();
    if usable.is_empty() {
        return None;
    }
    let (mut saa, mut sab, mut sbb, mut sa, mut sb) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for s in &usable {
        let (a, b) = (s.roof_ns / s.measured_ns, 1.0 / s.measured_ns);
        saa += a * a;
        sab += a * b;
        sbb += b * b;
        sa += a;
        sb += b;
    }
    let det = saa * sbb - sab * sab;
    // Both terms where the samples tell them apart; else the scale alone, launch kept.
    let (mut scale, mut launch) = if usable.len() >= 2 && det > 1e-12 * saa * sbb {
        ((sa * sbb - sb * sab) / det, (saa * sb - sab * sa) / det)
    } else if saa > 0.0 {
        ((sa - spec.launch_ns * sab) / saa, spec.launch_ns)
    } else {
        (1.0, sb / sbb)
    };
    if launch < 0.0 {
        launch = 0.0;
        scale = if saa > 0.0 { sa / saa } else { 1.0 };
    }
    if scale <= 0.0 || !scale.is_finite() {
        // The roofline term explains nothing: time is all per-call cost.
        scale = 1e-6;
        launch = (sb / sbb).max(0.0);
    }
    let err = |s: f64, l: f64| usable.iter().map(|x| ((s * x.roof_ns + l) / x.measured_ns - 1.0).abs()).sum::<f64>();
    let n = usable.len() as f64;
    let before = err(1.0, spec.launch_ns) / n;
    let after = err(scale, launch) / n;
    let perf = PerfModel {
        eff_compute: spec.eff_compute / scale,
        eff_mem: spec.eff_mem / scale,
        launch_ns: launch,
        ..spec.clone()
    };
    Some((perf, before, after))
}

impl Calibration {
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
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::invalid(format!("{}: {e}", dir.display())))?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::invalid(e.to_string()))?;
        crate::files::write(path, format!("{text}\n").as_bytes(), &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    fn spec() -> PerfModel {
        PerfModel { eff_compute: 0.5, eff_mem: 0.5, launch_ns: 1000.0, fused: false }
    }

    #[test]
    fn a_kernel_twice_as_slow_with_a_larger_launch_cost_is_fitted_exactly() -> TestResult {
        // Measured: 2 x roof + 5000 ns.
        let samples: Vec<Sample> =
            [1e3, 1e4, 1e5, 1e6].iter().map(|&r| Sample { roof_ns: r, measured_ns: 2.0 * r + 5000.0 }).collect();
        let (perf, before, after) = fit(&samples, &spec()).ok_or("no fit")?;
        assert!((perf.eff_compute - 0.25).abs() < 1e-9 && (perf.eff_mem - 0.25).abs() < 1e-9, "{perf:?}");
        assert!((perf.launch_ns - 5000.0).abs() < 1e-6, "{perf:?}");
        assert!(after < 1e-9 && before > 0.3, "{before} {after}");
        Ok(())
    }

    #[test]
    fn a_negative_launch_cost_is_clamped_to_zero_and_one_sample_keeps_the_spec_launch() -> TestResult {
        let samples = [Sample { roof_ns: 1e3, measured_ns: 100.0 }, Sample { roof_ns: 1e6, measured_ns: 2e6 }];
        let (perf, _, _) = fit(&samples, &spec()).ok_or("no fit")?;
        assert!(perf.launch_ns >= 0.0, "{perf:?}");
        let (one, _, _) = fit(&[Sample { roof_ns: 1e4, measured_ns: 3e4 }], &spec()).ok_or("no fit of one sample")?;
        assert_eq!(one.launch_ns, 1000.0);
        assert!(((1e4 * 0.5 / one.eff_mem) + 1000.0 - 3e4).abs() < 1e-6, "{one:?}");
        assert!(fit(&[], &spec()).is_none());
        Ok(())
    }

    #[test]
    fn lookups_find_a_kernel_by_id_and_dtype() {
        let fit = KernelFit {
            kernel: "k".into(),
            dtype: DType::BF16,
            eff_compute: 0.1,
            eff_mem: 0.2,
            launch_ns: 3.0,
            points: 2,
            error_before: 0.5,
            error_after: 0.1,
        };
        let c = Calibration::new("h", "f", "w", "t", vec![fit]);
        assert_eq!(c.perf("k", DType::BF16, &spec()).0.eff_mem, 0.2);
        assert!(!c.perf("k", DType::F32, &spec()).1);
    }
}
