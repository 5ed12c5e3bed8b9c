//! Measured times: an in-memory snapshot of PerfDB rows, judged once against the catalog
//! and the hardware, so that selection (pure) can look them up by kernel, key and bucket.
//!
//! A row is used only when it was measured on this hardware fingerprint with this kernel
//! and backend version, has enough samples and a cv below [`CV_NONE`]. The confidence in it is
//! that of its median, whose relative standard error is about `1.2533 cv / sqrt(samples)`: full
//! at [`SE_FULL`] or less, falling to none at [`SE_NONE`]; below full, the estimate blends the
//! median and the model in log space with the confidence as weight. A noisy series of many
//! samples still pins its median down: on a busy 2-core machine, oneDNN's linear measured
//! 1.93 ms with cv 0.3 lost to a 4.67 ms kernel when cv alone set the weight (half), the blend
//! pulling its estimate halfway (in log space) to the model's.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::capabilities::catalog::Catalog;
use crate::hardware::profile::HardwareProfile;
use crate::reason::{Reason, ReasonCode};

/// Fewest samples a row needs to be used.
pub const MIN_SAMPLES: u32 = 5;
/// Coefficient of variation at and above which a row is ignored.
pub const CV_NONE: f64 = 0.50;
/// Relative standard error of a row's median at and below which the row is fully trusted (a
/// 95% interval of about +-20%).
pub const SE_FULL: f64 = 0.10;
/// Relative standard error of a row's median at which the row would get no weight.
pub const SE_NONE: f64 = 0.30;

/// The relative standard error of a median of `samples` samples of coefficient of
/// variation `cv` (normal data: `sqrt(pi / 2) sigma / sqrt(n)`).
pub fn median_rel_se(cv: f64, samples: u32) -> f64 {
    1.2533 * cv / f64::from(samples.max(1)).sqrt()
}

/// One measurement series, as PerfDB stores it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    /// Kernel id.
    pub kernel: String,
    /// Kernel version measured.
    pub kernel_version: String,
    /// Backend version measured.
    pub backend_version: String,
    /// Hardware fingerprint measured on.
    pub fingerprint: String,
    /// Validity key (32 hex digits).
    pub key: String,
    /// Bucket text (`batch=1,seq_q=513..1024,...`).
    pub bucket: String,
    /// Kept samples.
    pub samples: u32,
    /// Median, ns.
    pub median_ns: f64,
    /// 10th percentile, ns.
    pub p10_ns: f64,
    /// 90th percentile, ns.
    pub p90_ns: f64,
    /// Coefficient of variation of the kept samples.
    pub cv: f64,
}

/// What a report shows of the measurement behind a score.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MeasurementRef {
    /// Kept samples.
    pub samples: u32,
    /// Median, ns.
    pub median_ns: f64,
    /// 10th percentile, ns.
    pub p10_ns: f64,
    /// 90th percentile, ns.
    pub p90_ns: f64,
    /// Coefficient of variation.
    pub cv: f64,
    /// Confidence in [0, 1]: 1 uses the median alone, less blends it with the model.
    pub weight: f64,
}

/// A row's fate for one kernel.
#[derive(Debug, Clone, PartialEq)]
pub enum RowVerdict {
    /// Used with this weight.
    Use(MeasurementRef),
    /// Not used, for this reason.
    Ignored(Reason),
}

/// Rows by (validity key, bucket text), then by kernel.
#[derive(Debug, Clone, Default)]
pub struct Measurements {
    by_point: HashMap<(u128, String), BTreeMap<String, RowVerdict>>,
    used: usize,
    ignored: usize,
}

impl Measurements {
    /// Judges `rows` against the catalog's kernel and backend versions and `hardware`'s
    /// fingerprint. A usable row for the same (kernel, key, bucket) beats an ignored one.
    pub fn build(
        rows: impl IntoIterator<Item = Measured>,
        catalog: &Catalog,
        hardware: &HardwareProfile,
    ) -> Measurements {
        let mut m = Measurements::default();
        for r in rows {
            let Ok(key) = u128::from_str_radix(&r.key, 16) else { continue };
            let judged = judge(&r, catalog, hardware);
            let slot = m.by_point.entry((key, r.bucket.clone())).or_default();
            match (slot.get(&r.kernel), &judged) {
                (Some(RowVerdict::Use(_)), RowVerdict::Ignored(_)) => continue,
                _ => {
                    slot.insert(r.kernel.clone(), judged);
                }
            }
        }
        for slot in m.by_point.values() {
            for j in slot.values() {
                match j {
                    RowVerdict::Use(_) => m.used += 1,
                    RowVerdict::Ignored(_) => m.ignored += 1,
                }
            }
        }
        m
    }

    /// The judged rows of one point, by kernel.
    pub fn point(&self, key: u128, bucket: &str) -> Option<&BTreeMap<String, RowVerdict>> {
        self.by_point.get(&(key, bucket.to_owned()))
    }

    /// Rows usable here.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Rows ignored (other hardware, other versions, low confidence).
    pub fn ignored(&self) -> usize {
        self.ignored
    }

    /// True when no row was given.
    pub fn is_empty(&self) -> bool {
        self.by_point.is_empty()
    }

    /// A digest of what selection reads here (every point's usable rows; an ignored row
    /// changes no choice): equal on two handles that score every point alike.
    pub fn digest(&self) -> String {
        let mut used: Vec<String> = Vec::new();
        for ((key, bucket), slot) in &self.by_point {
            for (kernel, verdict) in slot {
                if let RowVerdict::Use(m) = verdict {
                    used.push(format!("{key:032x} {bucket} {kernel} {:e} {:e}", m.median_ns, m.weight));
                }
            }
        }
        used.sort_unstable();
        blake3::hash(used.join("\n").as_bytes()).to_hex().as_str()[..16].to_owned()
    }
}

fn judge(r: &Measured, catalog: &Catalog, hardware: &HardwareProfile) -> RowVerdict {
    if r.fingerprint != hardware.fingerprint {
        return RowVerdict::Ignored(Reason::new(
            ReasonCode::PERFDB_HARDWARE_MISMATCH,
            format!("measured on hardware {} ; this is {}", short(&r.fingerprint), short(&hardware.fingerprint)),
        ));
    }
    let Some((backend, kernel)) = catalog.find(&r.kernel).map(|i| catalog.kernel(i)) else {
        return RowVerdict::Ignored(Reason::new(
            ReasonCode::PERFDB_VERSION_MISMATCH,
            format!("kernel {} is not in the current catalog", r.kernel),
        ));
    };
    let kernel_version = kernel.version.as_deref().unwrap_or(&backend.version);
    if r.kernel_version != kernel_version || r.backend_version != backend.version {
        return RowVerdict::Ignored(Reason::new(
            ReasonCode::PERFDB_VERSION_MISMATCH,
            format!(
                "measured with kernel {} / backend {}; the catalog has {} / {}",
                r.kernel_version, r.backend_version, kernel_version, backend.version
            ),
        ));
    }
    let finite = r.median_ns.is_finite() && r.median_ns > 0.0 && r.cv.is_finite() && r.cv >= 0.0;
    if !finite || r.samples < MIN_SAMPLES || r.cv >= CV_NONE {
        return RowVerdict::Ignored(Reason::new(
            ReasonCode::PERFDB_LOW_CONFIDENCE,
            format!(
                "{} samples (need {MIN_SAMPLES}), cv {:.3} (ignored at {CV_NONE}), median {} ns",
                r.samples, r.cv, r.median_ns
            ),
        ));
    }
    let se = median_rel_se(r.cv, r.samples);
    let weight = if se <= SE_FULL { 1.0 } else { ((SE_NONE - se) / (SE_NONE - SE_FULL)).clamp(0.0, 1.0) };
    RowVerdict::Use(MeasurementRef {
        samples: r.samples,
        median_ns: r.median_ns,
        p10_ns: r.p10_ns,
        p90_ns: r.p90_ns,
        cv: r.cv,
        weight,
    })
}

/// The estimate from a measurement and the model: the median at full weight, a log-space
/// blend below it (scale-free: a model 10x off moves the estimate by a factor, not a sum).
pub fn blend(measured: &MeasurementRef, model_ns: f64) -> f64 {
    if measured.weight >= 1.0 || model_ns <= 0.0 {
        return measured.median_ns;
    }
    let w = measured.weight.clamp(0.0, 1.0);
    (w * measured.median_ns.ln() + (1.0 - w) * model_ns.ln()).exp()
}

fn short(fp: &str) -> &str {
    fp.get(..12).unwrap_or(fp)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::TestResult;
    use crate::hardware::named;

    fn row(fp: &str, cv: f64, samples: u32) -> Measured {
        Measured {
            kernel: "cpu.rms_norm.fast".into(),
            kernel_version: String::new(),
            backend_version: String::new(),
            fingerprint: fp.into(),
            key: format!("{:032x}", 7u128),
            bucket: "tokens=1".into(),
            samples,
            median_ns: 1000.0,
            p10_ns: 900.0,
            p90_ns: 1100.0,
            cv,
        }
    }

    fn versions(mut r: Measured, catalog: &Catalog) -> TestResult<Measured> {
        let (b, k) = catalog.kernel(catalog.find(&r.kernel).ok_or("the row's kernel is not in the catalog")?);
        r.kernel_version = k.version.clone().unwrap_or(b.version.clone());
        r.backend_version = b.version.clone();
        Ok(r)
    }

    fn judged(r: Measured) -> TestResult<RowVerdict> {
        let catalog: Arc<Catalog> = Catalog::builtin()?;
        let hw = named::load("spr")?;
        let r = if r.kernel_version.is_empty() { versions(r, &catalog)? } else { r };
        let m = Measurements::build([r], &catalog, &hw);
        Ok(m.point(7, "tokens=1").ok_or("no verdicts at the row's point")?["cpu.rms_norm.fast"].clone())
    }

    fn spr() -> TestResult<String> {
        Ok(named::load("spr")?.fingerprint)
    }

    #[test]
    fn a_steady_row_from_this_machine_is_used_at_full_weight() -> TestResult {
        let RowVerdict::Use(m) = judged(row(&spr()?, 0.02, 20))? else { return Err("the row was ignored".into()) };
        assert_eq!(m.weight, 1.0);
        Ok(())
    }

    #[test]
    fn a_noisy_row_is_down_weighted_by_its_medians_error_and_a_very_noisy_one_ignored() -> TestResult {
        // cv 0.3 over 5 samples: the median's relative standard error is 0.168, weight 0.66.
        let RowVerdict::Use(m) = judged(row(&spr()?, 0.30, 5))? else { return Err("the row was ignored".into()) };
        let se = 1.2533 * 0.30 / 5f64.sqrt();
        assert!((m.weight - (SE_NONE - se) / (SE_NONE - SE_FULL)).abs() < 1e-9, "{}", m.weight);
        // The same spread over 20 samples pins the median (error 0.084): full weight.
        let RowVerdict::Use(m) = judged(row(&spr()?, 0.30, 20))? else { return Err("the row was ignored".into()) };
        assert_eq!(m.weight, 1.0);
        let RowVerdict::Ignored(r) = judged(row(&spr()?, 0.6, 20))? else { return Err("the row was used".into()) };
        assert_eq!(r.code(), ReasonCode::PERFDB_LOW_CONFIDENCE);
        let RowVerdict::Ignored(r) = judged(row(&spr()?, 0.01, 2))? else { return Err("the row was used".into()) };
        assert_eq!(r.code(), ReasonCode::PERFDB_LOW_CONFIDENCE);
        Ok(())
    }

    #[test]
    fn rows_from_other_hardware_or_versions_are_ignored_with_a_reason() -> TestResult {
        let RowVerdict::Ignored(r) = judged(row("another-machine", 0.01, 20))? else {
            return Err("the row was used".into());
        };
        assert_eq!(r.code(), ReasonCode::PERFDB_HARDWARE_MISMATCH);
        let mut old = row(&spr()?, 0.01, 20);
        old.kernel_version = "0.0.1-old".into();
        old.backend_version = "0.0.1-old".into();
        let RowVerdict::Ignored(r) = judged(old)? else { return Err("the row was used".into()) };
        assert_eq!(r.code(), ReasonCode::PERFDB_VERSION_MISMATCH);
        Ok(())
    }

    #[test]
    fn blending_moves_from_the_model_to_the_median_with_the_weight() {
        let m = |weight| MeasurementRef { samples: 9, median_ns: 100.0, p10_ns: 90.0, p90_ns: 110.0, cv: 0.2, weight };
        assert_eq!(blend(&m(1.0), 10_000.0), 100.0);
        assert!((blend(&m(0.5), 10_000.0) - 1000.0).abs() < 1e-6);
        assert!((blend(&m(0.0), 10_000.0) - 10_000.0).abs() < 1e-6);
    }
}
