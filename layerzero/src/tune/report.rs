//! What a tuning run reports (`lz tune --json`, `schemas/tune_report.schema.json`): the tune
//! phase pair by pair, the work not done, and the verification's regret.

use serde::Serialize;

use crate::perfdb::Recovery;

/// The phase a measurement belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Measuring for the PerfDB.
    Tune,
    /// Re-measuring to compute the regret.
    Verify,
}

impl Phase {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Tune => "tune",
            Phase::Verify => "verify",
        }
    }
}

/// How one (point, kernel) pair fared in the tune phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Timed now; a row was written.
    Measured,
    /// A usable row was already stored; not timed again.
    Cached,
    /// The kernel failed or panicked; nothing was written.
    Failed,
}

/// One (point, kernel) pair of the tune phase.
#[derive(Debug, Clone, Serialize)]
pub struct KernelResult {
    /// Workload entry.
    pub entry: String,
    /// Op.
    pub op: String,
    /// Bucket text.
    pub bucket: String,
    /// Validity key (hex).
    pub key: String,
    /// Kernel id.
    pub kernel: String,
    /// Backend.
    pub backend: String,
    /// What happened.
    pub status: Status,
    /// Samples kept (0 when failed).
    pub samples: u32,
    /// Samples rejected as outliers.
    pub rejected: u32,
    /// Median time per call, ns.
    pub median_ns: f64,
    /// 10th percentile, ns.
    pub p10_ns: f64,
    /// 90th percentile, ns.
    pub p90_ns: f64,
    /// Median absolute deviation, ns.
    pub mad_ns: f64,
    /// Coefficient of variation.
    pub cv: f64,
    /// Why sampling stopped (measured only).
    pub stop: Option<&'static str>,
    /// The failure (failed only).
    pub error: Option<String>,
    /// The model-only selector picks this kernel here (first eligible with an executor).
    pub model_choice: bool,
    /// The PerfDB-backed selector picks it, after this run's rows were stored.
    pub perfdb_choice: bool,
}

/// Work not done.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    /// Workload entry.
    pub entry: String,
    /// Bucket text.
    pub bucket: String,
    /// Kernel id.
    pub kernel: String,
    /// The phase it was skipped in.
    pub phase: Phase,
    /// `budget` (the budget was spent) or `no_executor` (eligible, but nothing runs it here).
    pub reason: &'static str,
}

/// A point no kernel qualifies for.
#[derive(Debug, Clone, Serialize)]
pub struct Unselectable {
    /// Workload entry.
    pub entry: String,
    /// Bucket text.
    pub bucket: String,
    /// The selection error.
    pub error: String,
}

/// A kernel a selector picked at one bucket, with its verified time.
#[derive(Debug, Clone, Serialize)]
pub struct Pick {
    /// Kernel id.
    pub kernel: String,
    /// Its fresh median, ns.
    pub median_ns: f64,
    /// time(picked) / time(fastest) - 1.
    pub regret: f64,
    /// Where the selector's estimate came from (`model`, `perfdb`, `blended`).
    pub source: &'static str,
}

/// One kernel's fresh time at one bucket.
#[derive(Debug, Clone, Serialize)]
pub struct VerifiedTime {
    /// Kernel id.
    pub kernel: String,
    /// Median, ns (absent when it failed); with two windows, the mean of their medians.
    pub median_ns: Option<f64>,
    /// Each window's median, ns (two where kernels competed).
    pub windows_ns: Vec<f64>,
    /// Coefficient of variation.
    pub cv: Option<f64>,
    /// Samples kept.
    pub samples: u32,
    /// The failure, if it failed.
    pub error: Option<String>,
}

/// The regret of both selectors at one bucket.
#[derive(Debug, Clone, Serialize)]
pub struct BucketRegret {
    /// Workload entry.
    pub entry: String,
    /// Bucket text.
    pub bucket: String,
    /// The fastest kernel in the fresh series.
    pub fastest: String,
    /// Its median, ns.
    pub fastest_ns: f64,
    /// The model-only pick.
    pub model: Pick,
    /// The PerfDB-backed pick.
    pub perfdb: Pick,
    /// The model-only pick with this run's calibration (`--calibrate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibrated: Option<Pick>,
    /// Kernels within 2x of the fastest (a real contest when more than one).
    pub competitive: usize,
    /// Every kernel's fresh time.
    pub times: Vec<VerifiedTime>,
}

/// Mean and worst regret over the verified buckets.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct RegretSummary {
    /// Mean regret.
    pub mean: f64,
    /// Worst regret.
    pub worst: f64,
    /// Buckets where the pick was not the fastest.
    pub misses: usize,
}

/// The verification.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// Buckets verified.
    pub verified: usize,
    /// Buckets not verified (budget, or no kernel ran).
    pub unverified: usize,
    /// Model-only selection.
    pub model: RegretSummary,
    /// PerfDB-backed selection.
    pub perfdb: RegretSummary,
    /// Model-only selection with this run's calibration (`--calibrate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibrated: Option<RegretSummary>,
    /// Buckets where more than one kernel was within 2x of the fastest.
    pub contested: usize,
    /// Buckets whose fastest kernel is of each backend.
    pub wins_by_backend: std::collections::BTreeMap<String, usize>,
    /// Per bucket.
    pub buckets: Vec<BucketRegret>,
}

/// The outcome of a tuning run (`lz tune --json`).
#[derive(Debug, Clone, Serialize)]
pub struct TuneReport {
    /// Document version.
    pub schema_version: u32,
    /// Workload name.
    pub workload: String,
    /// Workload file.
    pub workload_file: String,
    /// Points (buckets) the workload covers.
    pub points: usize,
    /// Hardware profile name.
    pub hardware: String,
    /// Its fingerprint (the rows' `fingerprint`).
    pub fingerprint: String,
    /// The PerfDB file.
    pub perfdb: String,
    /// A damaged PerfDB that opening moved aside.
    pub perfdb_recovered: Option<Recovery>,
    /// Rows written.
    pub rows_written: usize,
    /// The lead-in calls' parity records.
    pub parity: ParitySummary,
    /// The budget, seconds.
    pub budget_s: Option<f64>,
    /// True when the budget ran out before every planned measurement started.
    pub budget_exhausted: bool,
    /// Wall time, seconds.
    pub elapsed_s: f64,
    /// The protocol's knobs.
    pub protocol: serde_json::Value,
    /// The tune phase, point by point.
    pub results: Vec<KernelResult>,
    /// Work not done.
    pub skipped: Vec<Skipped>,
    /// Points no kernel qualifies for.
    pub unselectable: Vec<Unselectable>,
    /// The verification, when asked for.
    pub verify: Option<VerifyReport>,
    /// The calibration fitted and written (`--calibrate`), or read from this machine's
    /// calibration file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationReport>,
    /// Whether each kernel's time grows with the size of its buckets, per backend (empty when
    /// no kernel was measured at two comparable buckets of an entry).
    pub growth: Vec<Growth>,
}

/// What the lead-in calls' comparisons with the reference found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ParitySummary {
    /// Parity records written.
    pub records: usize,
    /// Those that failed: `kernel at entry bucket: what diverged`.
    pub failed: Vec<String>,
}

/// Whether time grows with size, over one backend's kernels: for each (entry, kernel)
/// measured at several buckets, every pair of neighbouring buckets (one smaller than the
/// other along its axes, none between them) and the ratio of the smaller one's measured time
/// to the larger one's. A ratio above 1 is a step down (a smaller problem slower than a
/// larger one: a cliff at a threshold); the worst is reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Growth {
    /// The backend.
    pub backend: String,
    /// Neighbouring pairs compared.
    pub pairs: usize,
    /// Pairs whose smaller bucket took more than 10% longer than the larger one.
    pub steps_down: usize,
    /// The largest `time(smaller) / time(larger)`.
    pub worst_ratio: f64,
    /// Where: the entry, the kernel, the smaller and the larger bucket.
    pub entry: String,
    /// The kernel.
    pub kernel: String,
    /// The smaller bucket.
    pub smaller: String,
    /// The larger bucket.
    pub larger: String,
}

impl TuneReport {
    /// The report as JSON (`schemas/tune_report.schema.json`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// The calibration a tuning run fitted (`lz tune --calibrate`) or read.
#[derive(Debug, Clone, Serialize)]
pub struct CalibrationReport {
    /// Where it was written (or read from).
    pub path: String,
    /// The fits.
    pub fits: Vec<crate::score::calibration::KernelFit>,
}
