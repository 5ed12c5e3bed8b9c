//! Tuning: measure every eligible kernel at every bucket of a workload on this machine, store
//! the timings in the PerfDB, and (`verify`) check how much time selection leaves on the
//! table with and without them.
//!
//! This is an I/O edge module (it runs kernels, reads the clock and writes the PerfDB); the
//! pure core only ever sees the [`Measured`] rows it produces.
//!
//! For each workload point (one representative request per bucket), the kernels a host
//! selector *without* measurements ranks eligible and that have an executor are timed by
//! the protocol of [`measure`] on inputs from [`synth`], with the selection's transforms
//! applied before the clock starts. Each series becomes a PerfDB row (origin `tune`, this
//! host's fingerprint, kernel and backend versions from the catalog). A pair that already
//! has a usable row for this hardware and these versions is not measured again unless
//! `refresh` is set, so an interrupted or budget-limited run resumes where it stopped. The
//! budget stops new measurements from starting; everything not measured is listed.
//!
//! Verification re-times every eligible kernel at every point in a fresh series on fresh
//! inputs (not the series the PerfDB rows came from), then compares, per bucket, the kernel
//! each selector picks with the fastest: regret = time(picked) / time(fastest) - 1, for the
//! model alone and for selection backed by the PerfDB rows now stored.

pub mod calibrate;
mod lead_in;
pub mod measure;
mod report;
pub use crate::exec::synth;
mod timing;
mod tuning;
mod verify;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::capabilities::catalog::Catalog;
use crate::error::Result;
use crate::exec::executor::Registry;
use crate::host::detect;
use crate::model::device::DeviceRef;
use crate::perfdb::{PerfDb, Row};
use crate::plan::workload::{Point, Workload};
use crate::policy::Policy;
use crate::score::measured::{Measured, Measurements};
use crate::select::{Selection, Selector};
use measure::Protocol;
pub use report::{
    BucketRegret, CalibrationReport, KernelResult, ParitySummary, Phase, Pick, RegretSummary, Skipped, Status,
    TuneReport, Unselectable, VerifiedTime, VerifyReport,
};
use tuning::{Plan, Tuning};

/// Version of the `lz tune --json` document (`schemas/tune_report.schema.json`).
pub const REPORT_SCHEMA_VERSION: u32 = 1;

/// The `origin` of rows `lz tune` writes.
pub const ORIGIN: &str = "tune";

/// The core's snapshot of `rows`, judged against `selector`'s catalog and hardware.
pub fn measurements(rows: &[Row], selector: &Selector) -> Measurements {
    Measurements::build(rows.iter().map(Measured::from), selector.catalog(), selector.hardware())
}

/// The machine tuned: a selector that scores by the model alone, the executors, and the
/// device memory the inputs of a GPU point are made in.
#[derive(Debug, Clone)]
pub struct Host {
    /// Model-only selector for this machine.
    pub selector: Selector,
    /// Executors.
    pub registry: Registry,
    /// Where a point on a GPU gets its inputs, and how its kernels are waited for; `None`
    /// (the `lz` binary, which allocates no device memory): such points are reported failed
    /// with the reason.
    pub device: Option<Arc<dyn DeviceMemory>>,
    /// Drills (`LAYERZERO_FAULTS`) whose silent modes (`garbage`, `transpose_noop`) corrupt
    /// a kernel's lead-in output, so its parity record fails as a real bug would.
    pub faults: Vec<crate::runtime::faults::FaultRule>,
}

/// Device memory for tuning a GPU's kernels: the synthesized inputs are copied there, and
/// each call is waited for (kernels on a GPU return before they finish), so the time of a
/// call is the kernel's, launch included. The Python package implements it with torch.
pub trait DeviceMemory: Send + Sync + std::fmt::Debug {
    /// A copy of host tensor `t` in `device`'s memory.
    fn upload(
        &self,
        t: &crate::tensor::HostTensor,
        device: DeviceRef,
    ) -> std::result::Result<crate::tensor::HostTensor, String>;
    /// Waits for the work queued on `device`.
    fn synchronize(&self, device: DeviceRef) -> std::result::Result<(), String>;
}

impl Host {
    /// This host: detected hardware, probed backends, the default policy with the knobs that
    /// set policy fields (`LAYERZERO_DENY='cpu_reference.*'` leaves the oracle out of a
    /// tuning run), builtin executors.
    pub fn detect(catalog: Arc<Catalog>) -> Result<Host> {
        let hardware = Arc::new(detect::detect_host().profile);
        let registry = crate::host::builtin_registry();
        let availability = Arc::new(crate::host::probe::probe(&catalog, &hardware));
        let mut policy = Policy::default();
        policy.apply_overrides(&crate::host::process().policy_overrides());
        let selector = Selector::new(catalog, hardware, Arc::new(policy), availability)?;
        let faults = match &crate::host::process().faults {
            Some(spec) => crate::runtime::faults::parse(spec)?,
            None => Vec::new(),
        };
        Ok(Host { selector, registry, device: None, faults })
    }
}

/// What to tune and how.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// The workload.
    pub workload: Workload,
    /// Where it was read from (reports and error messages).
    pub workload_file: String,
    /// The PerfDB file.
    pub perfdb: PathBuf,
    /// Stop starting measurements after this long (`None`: no limit).
    pub budget: Option<Duration>,
    /// Verify: re-time every kernel and report the regret of both selectors.
    pub verify: bool,
    /// Measure pairs that already have a usable row again.
    pub refresh: bool,
    /// The timing protocol.
    pub protocol: Protocol,
    /// Seed of the synthesized inputs.
    pub seed: u64,
    /// Fit the cost model to this run's times and write the calibration here.
    pub calibrate: Option<PathBuf>,
    /// The machine's calibration file, as host handles read it (`LAYERZERO_CALIBRATION`).
    pub machine_calibration: PathBuf,
}

impl TuneOptions {
    /// Options with the default protocol, no budget, no verification.
    pub fn new(workload: Workload, workload_file: &str, perfdb: PathBuf) -> TuneOptions {
        TuneOptions {
            workload,
            workload_file: workload_file.to_owned(),
            perfdb,
            budget: None,
            verify: false,
            refresh: false,
            protocol: Protocol::default(),
            seed: 0x4c5a_5455_4e45,
            calibrate: None,
            machine_calibration: crate::host::process().calibration_path(),
        }
    }
}

/// Progress, for a progress bar.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// How many measurements are planned in all.
    Planned {
        /// Count.
        total: usize,
    },
    /// A measurement starts.
    Started {
        /// Its phase.
        phase: Phase,
        /// Workload entry.
        entry: &'a str,
        /// Bucket text.
        bucket: &'a str,
        /// Kernel id.
        kernel: &'a str,
    },
    /// A planned measurement finished, failed or was skipped.
    Finished,
}

/// One point's plan.
struct Planned<'a> {
    point: &'a Point,
    bucket: String,
    key: String,
    /// Eligible kernels with an executor, best first by the model.
    ranked: Vec<Selection>,
}

/// Tunes on this host (detected), without progress events.
pub fn tune(opts: &TuneOptions) -> Result<TuneReport> {
    let host = Host::detect(Catalog::builtin()?)?;
    tune_with(&host, opts, &mut |_| {})
}

/// Tunes on `host`, reporting progress to `on_event`.
pub fn tune_with(host: &Host, opts: &TuneOptions, on_event: &mut dyn FnMut(Event<'_>)) -> Result<TuneReport> {
    let start = Instant::now();
    let points = opts.workload.points().map_err(|e| e.context(opts.workload_file.as_str()))?;
    let opened = PerfDb::open(&opts.perfdb)?;
    let Plan { planned: plans, mut skipped, unselectable } = tuning::plan(host, &points);
    let run = Tuning::new(host, opts, &opened.db, opts.budget.map(|b| start + b))?;
    on_event(Event::Planned { total: run.planned_count(&plans) });
    let mut tuned = run.measure(&plans, &mut skipped, on_event)?;
    let calibration = run.calibration(&plans, &tuned.results)?;
    let selectors = run.selectors(calibration.as_ref().map(|(c, _)| c))?;
    run.mark_picks(&plans, &selectors.with_db, &mut tuned.results);
    let growth = growth(&tuned.results);
    let verify = if opts.verify {
        let (report, exhausted) =
            verify::run(host, opts, &plans, selectors.borrowed(), run.deadline, &mut skipped, on_event);
        tuned.budget_exhausted |= exhausted;
        Some(report)
    } else {
        None
    };
    Ok(TuneReport {
        schema_version: REPORT_SCHEMA_VERSION,
        workload: opts.workload.name.clone(),
        workload_file: opts.workload_file.clone(),
        points: points.len(),
        hardware: host.selector.hardware().name.clone(),
        fingerprint: run.fingerprint,
        perfdb: opened.db.path().display().to_string(),
        perfdb_recovered: opened.recovered,
        rows_written: tuned.rows_written,
        parity: tuned.parity,
        budget_s: opts.budget.map(|b| b.as_secs_f64()),
        budget_exhausted: tuned.budget_exhausted,
        elapsed_s: start.elapsed().as_secs_f64(),
        protocol: opts.protocol.to_json(),
        results: tuned.results,
        skipped,
        unselectable,
        verify,
        calibration: calibration.map(|(c, path)| report::CalibrationReport { path, fits: c.kernels }),
        growth,
    })
}

/// Time against size across the buckets of each (entry, kernel), per backend: see
/// [`report::Growth`]. A bucket is smaller than another when none of its axes' lower bounds
/// is larger and one is smaller; neighbours are such pairs with no bucket between them.
fn growth(results: &[KernelResult]) -> Vec<report::Growth> {
    use std::collections::BTreeMap;
    /// A bucket's axes and their lower bounds (`batch=2,pages=65..128` -> batch 2, pages 65).
    fn axes(bucket: &str) -> Option<Vec<(&str, u64)>> {
        bucket
            .split(',')
            .map(|part| {
                let (axis, range) = part.split_once('=')?;
                let lo = range.split("..").next()?;
                Some((axis, lo.trim().parse().ok()?))
            })
            .collect()
    }
    let below = |a: &[(&str, u64)], b: &[(&str, u64)]| {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && x.1 <= y.1)
            && a.iter().zip(b).any(|(x, y)| x.1 < y.1)
    };
    // (backend, entry, kernel) -> [(axes, measured ns, bucket)]
    type Points<'a> = Vec<(Vec<(&'a str, u64)>, f64, &'a str)>;
    let mut series: BTreeMap<(&str, &str, &str), Points<'_>> = BTreeMap::new();
    for r in results.iter().filter(|r| r.status != Status::Failed && r.median_ns > 0.0) {
        if let Some(ax) = axes(&r.bucket) {
            series.entry((&r.backend, &r.entry, &r.kernel)).or_default().push((ax, r.median_ns, &r.bucket));
        }
    }
    let mut by_backend: BTreeMap<&str, report::Growth> = BTreeMap::new();
    for ((backend, entry, kernel), pts) in &series {
        for a in pts {
            for b in pts {
                let neighbours = below(&a.0, &b.0) && !pts.iter().any(|c| below(&a.0, &c.0) && below(&c.0, &b.0));
                if !neighbours {
                    continue;
                }
                let ratio = a.1 / b.1;
                let g = by_backend.entry(backend).or_insert_with(|| report::Growth {
                    backend: (*backend).to_owned(),
                    pairs: 0,
                    steps_down: 0,
                    worst_ratio: 0.0,
                    entry: String::new(),
                    kernel: String::new(),
                    smaller: String::new(),
                    larger: String::new(),
                });
                g.pairs += 1;
                if ratio > 1.1 {
                    g.steps_down += 1;
                }
                if ratio > g.worst_ratio {
                    g.worst_ratio = ratio;
                    g.entry = (*entry).to_owned();
                    g.kernel = (*kernel).to_owned();
                    g.smaller = a.2.to_owned();
                    g.larger = b.2.to_owned();
                }
            }
        }
    }
    by_backend.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::model::dtype::DType;
    use crate::score::calibration::Calibration;
    use crate::select::ScoreSource;

    const TINY: &str = r#"{
        "schema_version": 1, "name": "tiny",
        "entries": [
          {"name": "norm", "request": {"op": "rms_norm", "tensors": {
              "x": {"dtype": "f32", "shape": [1, 64]}, "weight": {"dtype": "f32", "shape": [64]}}},
           "ranges": {"tokens": [1, 4]}}
        ]
    }"#;

    fn opts(dir: &tempfile::TempDir) -> TestResult<TuneOptions> {
        let w = Workload::from_json(TINY, "tiny.json")?;
        let mut o = TuneOptions::new(w, "tiny.json", dir.path().join("perf.sqlite"));
        o.protocol = Protocol::quick();
        Ok(o)
    }

    #[test]
    fn tuning_writes_rows_that_the_selector_then_uses() -> TestResult {
        let dir = tempfile::tempdir()?;
        let host = Host::detect(Catalog::builtin()?)?;
        let mut o = opts(&dir)?;
        o.verify = true;
        let mut events = 0;
        let report = tune_with(&host, &o, &mut |_| events += 1)?;
        // tokens 1, 2, 3..4: three points, two CPU kernels each.
        assert_eq!(report.points, 3);
        assert_eq!(report.rows_written, 6, "{:#?}", report.results);
        assert!(report.results.iter().all(|r| r.status == Status::Measured && r.samples > 0));
        assert!(events > 0);
        let v = report.verify.ok_or("a verified run reports its verification")?;
        assert_eq!(v.verified, 3);
        assert!(v.perfdb.worst >= 0.0 && v.model.worst >= 0.0);
        let db = PerfDb::open(&o.perfdb)?.db;
        let rows = db.rows_for(&report.fingerprint)?;
        assert_eq!(rows.len(), 6);
        assert!(rows.iter().all(|r| r.origin == ORIGIN && r.key.len() == 32));
        let with = host.selector.clone().with_measurements(Arc::new(measurements(&rows, &host.selector)));
        let pts = o.workload.points()?;
        let sel = with.select(&pts[0].request)?;
        assert!(
            matches!(sel.score.source, ScoreSource::Perfdb | ScoreSource::Blended),
            "{:?} {:?} {rows:#?}",
            sel.score.source,
            sel.score.notes
        );
        // A second run finds every pair stored and measures nothing.
        o.verify = false;
        let again = tune_with(&host, &o, &mut |_| {})?;
        assert_eq!(again.rows_written, 0);
        assert!(again.results.iter().all(|r| r.status == Status::Cached));
        Ok(())
    }

    #[test]
    fn the_lead_in_calls_record_parity_and_a_drilled_kernel_fails_its_records() -> TestResult {
        let dir = tempfile::tempdir()?;
        let mut host = Host::detect(Catalog::builtin()?)?;
        let o = opts(&dir)?;
        let report = tune_with(&host, &o, &mut |_| {})?;
        // Three points, one kernel each besides the reference (never compared with itself).
        assert_eq!(report.parity.records, 3, "{:?}", report.parity);
        assert!(report.parity.failed.is_empty(), "{:?}", report.parity);
        let records = PerfDb::open(&o.perfdb)?.db.parity_for(&report.fingerprint)?;
        assert_eq!(records.len(), 3);
        for r in &records {
            assert_eq!((r.origin.as_str(), r.kernel.as_str()), (lead_in::ORIGIN, "cpu.rms_norm.fast"));
            assert_eq!(r.status, crate::perfdb::ParityStatus::Pass);
            assert!(r.cosine.is_some_and(|c| c > 0.999_999) && r.key.len() == 32, "{r:?}");
        }
        // The drill: the kernel's lead-in output is finite and wrong; every record fails.
        host.faults = crate::runtime::faults::parse("cpu.rms_norm.fast=garbage")?;
        let dir = tempfile::tempdir()?;
        let report = tune_with(&host, &opts(&dir)?, &mut |_| {})?;
        assert_eq!(report.parity.failed.len(), 3, "{:?}", report.parity);
        assert!(
            report.parity.failed.iter().all(|f| f.starts_with("cpu.rms_norm.fast at norm") && f.contains("cosine"))
        );
        Ok(())
    }

    #[test]
    fn calibrating_fits_every_measured_kernel_and_the_selector_models_with_it_on_this_machine_only() -> TestResult {
        let dir = tempfile::tempdir()?;
        let host = Host::detect(Catalog::builtin()?)?;
        let mut o = opts(&dir)?;
        o.verify = true;
        let path = dir.path().join("cal").join("calibration.json");
        o.calibrate = Some(path.clone());
        let report = tune_with(&host, &o, &mut |_| {})?;
        let fits = &report.calibration.as_ref().ok_or("a calibrating run reports its fits")?.fits;
        // Two CPU kernels measured at three buckets each, in f32.
        assert_eq!(fits.len(), 2, "{fits:#?}");
        assert!(fits.iter().all(|f| f.points == 3 && f.dtype == DType::F32 && f.error_after <= f.error_before + 1e-9));
        let v = report.verify.ok_or("a verified run reports its verification")?;
        assert!(v.calibrated.is_some() && v.buckets.iter().all(|b| b.calibrated.is_some()));
        let cal = Calibration::load(&path)?;
        assert_eq!(cal.kernels, *fits);
        let pts = o.workload.points()?;
        let calibrated = host.selector.clone().with_calibration(Arc::new(cal.clone()));
        let sel = calibrated.select(&pts[0].request)?;
        assert!(sel.score.model.calibrated, "{:?}", sel.score.model);
        let mut elsewhere = cal;
        elsewhere.fingerprint = "another machine".into();
        let other = host.selector.clone().with_calibration(Arc::new(elsewhere));
        assert!(other.calibration().is_none());
        assert!(!other.select(&pts[0].request)?.score.model.calibrated);
        Ok(())
    }

    #[test]
    fn a_spent_budget_lists_every_pair_as_skipped() -> TestResult {
        let dir = tempfile::tempdir()?;
        let host = Host::detect(Catalog::builtin()?)?;
        let mut o = opts(&dir)?;
        o.budget = Some(Duration::ZERO);
        let report = tune_with(&host, &o, &mut |_| {})?;
        assert_eq!(report.rows_written, 0);
        assert!(report.budget_exhausted);
        assert_eq!(report.skipped.iter().filter(|s| s.reason == "budget").count(), 6);
        Ok(())
    }
}
