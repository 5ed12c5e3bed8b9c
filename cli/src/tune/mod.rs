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
pub(crate) mod command;
pub mod measure;
mod report;
pub use layerzero::exec::synth;
mod timing;
mod verify;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use layerzero::capabilities::catalog::Catalog;
use layerzero::error::Result;
use layerzero::exec::executor::Registry;
use layerzero::host::detect;
use layerzero::perfdb::{PerfDb, Row};
use layerzero::plan::workload::{Point, Workload};
use layerzero::policy::Policy;
use layerzero::score::calibration::Calibration;
use layerzero::score::measured::{CV_NONE, MIN_SAMPLES, Measured, Measurements};
use layerzero::select::{Selection, Selector};
use measure::{Measurement, Protocol};
pub use report::{
    BucketRegret, KernelResult, Phase, Pick, RegretSummary, Skipped, Status, TuneReport, Unselectable, VerifiedTime,
    VerifyReport,
};

/// Version of the `lz tune --json` document (`schemas/tune_report.schema.json`).
pub const REPORT_SCHEMA_VERSION: u32 = 1;

/// The `origin` of rows `lz tune` writes.
pub const ORIGIN: &str = "tune";

/// The core's snapshot of `rows`, judged against `selector`'s catalog and hardware.
pub fn measurements(rows: &[Row], selector: &Selector) -> Measurements {
    Measurements::build(rows.iter().map(Measured::from), selector.catalog(), selector.hardware())
}

/// The machine tuned: a selector that scores by the model alone, and the executors.
#[derive(Debug, Clone)]
pub struct Host {
    /// Model-only selector for this machine.
    pub selector: Selector,
    /// Executors.
    pub registry: Registry,
}

impl Host {
    /// This host: detected hardware, probed backends, the default policy with the knobs that
    /// set policy fields (`LAYERZERO_DENY='cpu_reference.*'` leaves the oracle out of a
    /// tuning run), builtin executors.
    pub fn detect(catalog: Arc<Catalog>) -> Result<Host> {
        let hardware = Arc::new(detect::detect_host().profile);
        let registry = layerzero::host::builtin_registry();
        let availability = Arc::new(layerzero::host::probe::probe(&catalog, &hardware));
        let mut policy = Policy::default();
        policy.apply_overrides(&layerzero::host::process().policy_overrides());
        let selector = Selector::new(catalog, hardware, Arc::new(policy), availability)?;
        Ok(Host { selector, registry })
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
            machine_calibration: layerzero::host::process().calibration_path(),
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
    let deadline = opts.budget.map(|b| start + b);
    let spent = || timing::spent(deadline);
    let file = opts.workload_file.as_str();
    let points = opts.workload.points().map_err(|e| e.context(file))?;
    let opened = PerfDb::open(&opts.perfdb)?;
    let db = opened.db;
    let selector = &host.selector;
    let catalog = selector.catalog();
    let hardware = selector.hardware();
    let fingerprint = hardware.fingerprint.clone();

    // Plan: the eligible kernels of every point.
    let mut plans: Vec<Planned<'_>> = Vec::new();
    let mut skipped: Vec<Skipped> = Vec::new();
    let mut unselectable = Vec::new();
    for point in &points {
        let bucket = point.buckets.text(point.request.op);
        match selector.ranked(&point.request) {
            Ok(ranked) => {
                let (runnable, missing): (Vec<Selection>, Vec<Selection>) =
                    ranked.into_iter().partition(|s| host.registry.contains(&s.kernel));
                for s in missing {
                    skipped.push(Skipped {
                        entry: point.entry.clone(),
                        bucket: bucket.clone(),
                        kernel: s.kernel,
                        phase: Phase::Tune,
                        reason: "no_executor",
                    });
                }
                plans.push(Planned { point, key: point.key.validity_hex(), bucket, ranked: runnable });
            }
            Err(e) => unselectable.push(Unselectable { entry: point.entry.clone(), bucket, error: e.to_string() }),
        }
    }

    // What is already stored and usable.
    let stored = db.rows_for(&fingerprint)?;
    let usable = |kernel: &str, key: &str, bucket: &str| -> Option<&Row> {
        let i = catalog.find(kernel)?;
        let (b, k) = catalog.kernel(i);
        let kv = k.version.as_deref().unwrap_or(&b.version);
        stored.iter().find(|r| {
            r.kernel == kernel
                && r.key == key
                && r.bucket == bucket
                && r.kernel_version == kv
                && r.backend_version == b.version
                && r.samples >= MIN_SAMPLES
                && r.cv < CV_NONE
        })
    };
    let todo = |p: &Planned<'_>, s: &Selection| opts.refresh || usable(&s.kernel, &p.key, &p.bucket).is_none();
    let tune_count: usize = plans.iter().map(|p| p.ranked.iter().filter(|s| todo(p, s)).count()).sum();
    let verify_count: usize = if opts.verify { plans.iter().map(|p| p.ranked.len()).sum() } else { 0 };
    on_event(Event::Planned { total: tune_count + verify_count });

    // Tune: per point, the kernels to measure are timed together, interleaved.
    let mut results: Vec<KernelResult> = Vec::new();
    let mut rows_written = 0usize;
    let mut budget_exhausted = false;
    for (pi, plan) in plans.iter().enumerate() {
        let entry = plan.point.entry.as_str();
        let todo_now: Vec<&Selection> = plan.ranked.iter().filter(|s| todo(plan, s)).collect();
        let outcomes: Vec<std::result::Result<Measurement, String>> = if todo_now.is_empty() {
            Vec::new()
        } else if spent() {
            budget_exhausted = true;
            for sel in &todo_now {
                skipped.push(Skipped {
                    entry: entry.to_owned(),
                    bucket: plan.bucket.clone(),
                    kernel: sel.kernel.clone(),
                    phase: Phase::Tune,
                    reason: "budget",
                });
                on_event(Event::Finished);
            }
            continue;
        } else {
            let names: Vec<&str> = todo_now.iter().map(|s| s.kernel.as_str()).collect();
            let kernels = names.join(", ");
            on_event(Event::Started { phase: Phase::Tune, entry, bucket: &plan.bucket, kernel: &kernels });
            let out = timing::time_group(host, &plan.point.request, &todo_now, opts, pi as u64, deadline);
            for _ in &todo_now {
                on_event(Event::Finished);
            }
            out
        };
        let mut rows = Vec::new();
        for sel in &plan.ranked {
            let (backend_spec, kernel_spec) = match catalog.find(&sel.kernel) {
                Some(i) => catalog.kernel(i),
                None => continue,
            };
            let base = KernelResult {
                entry: entry.to_owned(),
                op: plan.point.request.op.as_str().to_owned(),
                bucket: plan.bucket.clone(),
                key: plan.key.clone(),
                kernel: sel.kernel.clone(),
                backend: sel.backend.clone(),
                status: Status::Cached,
                samples: 0,
                rejected: 0,
                median_ns: 0.0,
                p10_ns: 0.0,
                p90_ns: 0.0,
                mad_ns: 0.0,
                cv: 0.0,
                stop: None,
                error: None,
                model_choice: false,
                perfdb_choice: false,
            };
            let Some(oi) = todo_now.iter().position(|t| t.kernel == sel.kernel) else {
                if let Some(r) = usable(&sel.kernel, &plan.key, &plan.bucket) {
                    results.push(KernelResult {
                        samples: r.samples,
                        median_ns: r.median_ns,
                        p10_ns: r.p10_ns,
                        p90_ns: r.p90_ns,
                        mad_ns: r.mad_ns,
                        cv: r.cv,
                        ..base
                    });
                }
                continue;
            };
            match &outcomes[oi] {
                Ok(m) => {
                    let s = m.summary;
                    rows.push(Row {
                        kernel: sel.kernel.clone(),
                        kernel_version: kernel_spec.version.clone().unwrap_or_else(|| backend_spec.version.clone()),
                        backend: backend_spec.backend.clone(),
                        backend_version: backend_spec.version.clone(),
                        fingerprint: fingerprint.clone(),
                        op: plan.point.request.op.as_str().to_owned(),
                        key: plan.key.clone(),
                        bucket: plan.bucket.clone(),
                        samples: s.samples,
                        median_ns: s.median,
                        p10_ns: s.p10,
                        p90_ns: s.p90,
                        mad_ns: s.mad,
                        cv: s.cv,
                        origin: ORIGIN.to_owned(),
                        created_at: layerzero::time::now_unix(),
                    });
                    results.push(KernelResult {
                        status: Status::Measured,
                        samples: s.samples,
                        rejected: s.rejected,
                        median_ns: s.median,
                        p10_ns: s.p10,
                        p90_ns: s.p90,
                        mad_ns: s.mad,
                        cv: s.cv,
                        stop: Some(m.stop.as_str()),
                        ..base
                    });
                }
                Err(message) => {
                    results.push(KernelResult { status: Status::Failed, error: Some(message.clone()), ..base })
                }
            }
        }
        // Stored point by point, so an interrupted run keeps what it measured.
        if !rows.is_empty() {
            db.insert_many(&rows)?;
            rows_written += rows.len();
        }
    }

    // The cost model fitted to every time this run has (measured now or kept from the PerfDB);
    // without --calibrate, the machine's calibration file when there is one, as host handles
    // read it, so that "PerfDB-backed" is what a host handle here would select.
    let calibration = match &opts.calibrate {
        Some(path) => {
            let c = calibrate::fit_results(selector, &plans, &results, &opts.workload.name);
            c.save(path)?;
            Some((c, path.display().to_string()))
        }
        None => {
            let path = &opts.machine_calibration;
            Calibration::load(path)
                .ok()
                .filter(|c| c.fingerprint == selector.hardware().fingerprint)
                .map(|c| (c, path.display().to_string()))
        }
    };
    let calibrated = calibration.as_ref().map(|(c, _)| selector.clone().with_calibration(Arc::new(c.clone())));
    // The PerfDB-backed selector over every row now stored for this machine, modeling what
    // the rows do not cover (or blend with) with the calibration when one was fitted, as a
    // host handle does.
    let rows_now = db.rows_for(&fingerprint)?;
    let with_db = calibrated
        .clone()
        .unwrap_or_else(|| selector.clone())
        .with_measurements(Arc::new(measurements(&rows_now, selector)));
    let mut picks: Vec<(Option<Selection>, Option<Selection>)> = Vec::with_capacity(plans.len());
    for plan in &plans {
        let model = plan.ranked.first().cloned();
        let perf = with_db
            .ranked(&plan.point.request)
            .ok()
            .and_then(|r| r.into_iter().find(|s| host.registry.contains(&s.kernel)));
        picks.push((model, perf));
    }
    for r in &mut results {
        if let Some(pi) = plans.iter().position(|p| p.point.entry == r.entry && p.bucket == r.bucket && p.key == r.key)
        {
            let (m, p) = &picks[pi];
            r.model_choice = m.as_ref().is_some_and(|s| s.kernel == r.kernel);
            r.perfdb_choice = p.as_ref().is_some_and(|s| s.kernel == r.kernel);
        }
    }

    let growth = growth(&results);
    let verify = if opts.verify {
        let (report, exhausted) = verify::run(
            host,
            opts,
            &plans,
            verify::Selectors { with_db: &with_db, calibrated: calibrated.as_ref() },
            deadline,
            &mut skipped,
            on_event,
        );
        budget_exhausted |= exhausted;
        Some(report)
    } else {
        None
    };

    Ok(TuneReport {
        schema_version: REPORT_SCHEMA_VERSION,
        workload: opts.workload.name.clone(),
        workload_file: opts.workload_file.clone(),
        points: points.len(),
        hardware: hardware.name.clone(),
        fingerprint,
        perfdb: db.path().display().to_string(),
        perfdb_recovered: opened.recovered,
        rows_written,
        budget_s: opts.budget.map(|b| b.as_secs_f64()),
        budget_exhausted,
        elapsed_s: start.elapsed().as_secs_f64(),
        protocol: opts.protocol.to_json(),
        results,
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
    use layerzero::model::dtype::DType;
    use layerzero::select::ScoreSource;

    const TINY: &str = r#"{
        "schema_version": 1, "name": "tiny",
        "entries": [
          {"name": "norm", "request": {"op": "rms_norm", "tensors": {
              "x": {"dtype": "f32", "shape": [1, 64]}, "weight": {"dtype": "f32", "shape": [64]}}},
           "ranges": {"tokens": [1, 4]}}
        ]
    }"#;

    fn opts(dir: &tempfile::TempDir) -> TuneOptions {
        let w = Workload::from_json(TINY, "tiny.json").unwrap();
        let mut o = TuneOptions::new(w, "tiny.json", dir.path().join("perf.sqlite"));
        o.protocol = Protocol::quick();
        o
    }

    #[test]
    fn tuning_writes_rows_that_the_selector_then_uses() {
        let dir = tempfile::tempdir().unwrap();
        let host = Host::detect(Catalog::builtin().unwrap()).unwrap();
        let mut o = opts(&dir);
        o.verify = true;
        let mut events = 0;
        let report = tune_with(&host, &o, &mut |_| events += 1).unwrap();
        // tokens 1, 2, 3..4: three points, two CPU kernels each.
        assert_eq!(report.points, 3);
        assert_eq!(report.rows_written, 6, "{:#?}", report.results);
        assert!(report.results.iter().all(|r| r.status == Status::Measured && r.samples > 0));
        assert!(events > 0);
        let v = report.verify.unwrap();
        assert_eq!(v.verified, 3);
        assert!(v.perfdb.worst >= 0.0 && v.model.worst >= 0.0);
        let db = PerfDb::open(&o.perfdb).unwrap().db;
        let rows = db.rows_for(&report.fingerprint).unwrap();
        assert_eq!(rows.len(), 6);
        assert!(rows.iter().all(|r| r.origin == ORIGIN && r.key.len() == 32));
        let with = host.selector.clone().with_measurements(Arc::new(measurements(&rows, &host.selector)));
        let pts = o.workload.points().unwrap();
        let sel = with.select(&pts[0].request).unwrap();
        assert!(
            matches!(sel.score.source, ScoreSource::Perfdb | ScoreSource::Blended),
            "{:?} {:?} {rows:#?}",
            sel.score.source,
            sel.score.notes
        );
        // A second run finds every pair stored and measures nothing.
        o.verify = false;
        let again = tune_with(&host, &o, &mut |_| {}).unwrap();
        assert_eq!(again.rows_written, 0);
        assert!(again.results.iter().all(|r| r.status == Status::Cached));
    }

    #[test]
    fn calibrating_fits_every_measured_kernel_and_the_selector_models_with_it_on_this_machine_only() {
        let dir = tempfile::tempdir().unwrap();
        let host = Host::detect(Catalog::builtin().unwrap()).unwrap();
        let mut o = opts(&dir);
        o.verify = true;
        let path = dir.path().join("cal").join("calibration.json");
        o.calibrate = Some(path.clone());
        let report = tune_with(&host, &o, &mut |_| {}).unwrap();
        let fits = &report.calibration.as_ref().unwrap().fits;
        // Two CPU kernels measured at three buckets each, in f32.
        assert_eq!(fits.len(), 2, "{fits:#?}");
        assert!(fits.iter().all(|f| f.points == 3 && f.dtype == DType::F32 && f.error_after <= f.error_before + 1e-9));
        let v = report.verify.unwrap();
        assert!(v.calibrated.is_some() && v.buckets.iter().all(|b| b.calibrated.is_some()));
        let cal = Calibration::load(&path).unwrap();
        assert_eq!(cal.kernels, *fits);
        let pts = o.workload.points().unwrap();
        let calibrated = host.selector.clone().with_calibration(Arc::new(cal.clone()));
        let sel = calibrated.select(&pts[0].request).unwrap();
        assert!(sel.score.model.calibrated, "{:?}", sel.score.model);
        let mut elsewhere = cal;
        elsewhere.fingerprint = "another machine".into();
        let other = host.selector.clone().with_calibration(Arc::new(elsewhere));
        assert!(other.calibration().is_none());
        assert!(!other.select(&pts[0].request).unwrap().score.model.calibrated);
    }

    #[test]
    fn a_spent_budget_lists_every_pair_as_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let host = Host::detect(Catalog::builtin().unwrap()).unwrap();
        let mut o = opts(&dir);
        o.budget = Some(Duration::ZERO);
        let report = tune_with(&host, &o, &mut |_| {}).unwrap();
        assert_eq!(report.rows_written, 0);
        assert!(report.budget_exhausted);
        assert_eq!(report.skipped.iter().filter(|s| s.reason == "budget").count(), 6);
    }
}
