//! The steps of one tuning run ([`super::tune_with`]): plan the points, time what the PerfDB
//! lacks and store its rows, calibrate, and build the selectors verification compares.

use std::sync::Arc;
use std::time::Instant;

use super::measure::Measurement;
use super::report::{KernelResult, Phase, Skipped, Status, Unselectable};
use super::{Event, Host, ORIGIN, Planned, TuneOptions, calibrate, measurements, timing, verify};
use crate::capabilities::spec::{BackendSpec, KernelSpec};
use crate::error::Result;
use crate::perfdb::{PerfDb, Row};
use crate::plan::workload::Point;
use crate::score::calibration::Calibration;
use crate::score::measured::{CV_NONE, MIN_SAMPLES};
use crate::select::{Selection, Selector};

/// A kernel's timing at a point, or why it has none.
type Outcome = std::result::Result<Measurement, String>;

/// The eligible kernels of every point, and what cannot be tuned.
pub(super) struct Plan<'a> {
    /// The points with a ranking, in workload order.
    pub planned: Vec<Planned<'a>>,
    /// Ranked kernels with no executor here.
    pub skipped: Vec<Skipped>,
    /// Points no kernel serves.
    pub unselectable: Vec<Unselectable>,
}

/// Ranks every point's eligible kernels by the model; those without an executor are skipped.
pub(super) fn plan<'a>(host: &Host, points: &'a [Point]) -> Plan<'a> {
    let mut plan = Plan { planned: Vec::new(), skipped: Vec::new(), unselectable: Vec::new() };
    for point in points {
        let bucket = point.buckets.text(point.request.op);
        match host.selector.ranked(&point.request) {
            Ok(ranked) => {
                let (runnable, missing): (Vec<Selection>, Vec<Selection>) =
                    ranked.into_iter().partition(|s| host.registry.contains(&s.kernel));
                for s in missing {
                    plan.skipped.push(Skipped {
                        entry: point.entry.clone(),
                        bucket: bucket.clone(),
                        kernel: s.kernel,
                        phase: Phase::Tune,
                        reason: "no_executor",
                    });
                }
                plan.planned.push(Planned { point, key: point.key.validity_hex(), bucket, ranked: runnable });
            }
            Err(e) => plan.unselectable.push(Unselectable { entry: point.entry.clone(), bucket, error: e.to_string() }),
        }
    }
    plan
}

/// What the measuring step did.
#[derive(Default)]
pub(super) struct Tuned {
    /// Per point in plan order, per kernel in ranking order: measured, failed, or kept from
    /// the PerfDB.
    pub results: Vec<KernelResult>,
    /// PerfDB rows written.
    pub rows_written: usize,
    /// The lead-in calls' parity records.
    pub parity: super::report::ParitySummary,
    /// Whether the budget left measurements out.
    pub budget_exhausted: bool,
}

/// The selectors verification compares with the model-only ranking.
pub(super) struct Selectors {
    /// PerfDB-backed, over every row now stored for this machine.
    pub with_db: Selector,
    /// Model-only with the run's calibration, if it has one.
    pub calibrated: Option<Selector>,
}

impl Selectors {
    /// Borrowed, as verification takes them.
    pub fn borrowed(&self) -> verify::Selectors<'_> {
        verify::Selectors { with_db: &self.with_db, calibrated: self.calibrated.as_ref() }
    }
}

/// What the steps of one run share.
pub(super) struct Tuning<'a> {
    host: &'a Host,
    opts: &'a TuneOptions,
    db: &'a PerfDb,
    /// When the budget is spent (`None`: never).
    pub deadline: Option<Instant>,
    /// This machine's fingerprint.
    pub fingerprint: String,
    /// This machine's rows as the run found them.
    stored: Vec<Row>,
}

impl<'a> Tuning<'a> {
    /// A run on `db`, with the rows it already holds for this machine.
    pub fn new(host: &'a Host, opts: &'a TuneOptions, db: &'a PerfDb, deadline: Option<Instant>) -> Result<Self> {
        let fingerprint = host.selector.hardware().fingerprint.clone();
        let stored = db.rows_for(&fingerprint)?;
        Ok(Tuning { host, opts, db, deadline, fingerprint, stored })
    }

    /// The stored row that spares measuring `kernel` at (`key`, `bucket`) again: this
    /// kernel's and backend's versions, enough samples, and a steady series.
    fn usable(&self, kernel: &str, key: &str, bucket: &str) -> Option<&Row> {
        let catalog = self.host.selector.catalog();
        let i = catalog.find(kernel)?;
        let (b, k) = catalog.kernel(i);
        let kv = k.version.as_deref().unwrap_or(&b.version);
        self.stored.iter().find(|r| {
            r.kernel == kernel
                && r.key == key
                && r.bucket == bucket
                && r.kernel_version == kv
                && r.backend_version == b.version
                && r.samples >= MIN_SAMPLES
                && r.cv < CV_NONE
        })
    }

    /// Whether `sel` is to be measured at `plan`'s point.
    fn todo(&self, plan: &Planned<'_>, sel: &Selection) -> bool {
        self.opts.refresh || self.usable(&sel.kernel, &plan.key, &plan.bucket).is_none()
    }

    /// How many measurements the run plans: the tuning ones (a contest's twice, see
    /// [`Tuning::measure`]), then the verifying ones.
    pub fn planned_count(&self, plans: &[Planned<'_>]) -> usize {
        let windows = |n: usize| if n >= 2 { 2 * n } else { n };
        let tune_count: usize =
            plans.iter().map(|p| windows(p.ranked.iter().filter(|s| self.todo(p, s)).count())).sum();
        let verify_count: usize =
            if self.opts.verify { plans.iter().map(|p| windows(p.ranked.len())).sum() } else { 0 };
        tune_count + verify_count
    }

    /// Tune: per point, the kernels to measure are timed together, interleaved, and their
    /// rows stored. Where several kernels compete, the point is timed again in a second
    /// window, after every other point's first (another stretch of time, fresh inputs in
    /// fresh buffers), and each kernel's row records the slower of its two windows: the pick
    /// is then the kernel whose worse window is fastest. On the 2-vCPU VM one window's
    /// order did not hold in the next: oneDNN's gelu over two rows took 10.9 us in one and
    /// 46 us in the next while `cpu`'s took 15 in both; `layer_norm` over 32 rows, 30.1 against
    /// 30.7 us, then 34.5 against 26.5. Points the budget leaves no time for are listed in
    /// `skipped`; a contest the budget leaves no time to time again keeps its first window.
    pub fn measure(
        &self,
        plans: &[Planned<'_>],
        skipped: &mut Vec<Skipped>,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<Tuned> {
        let mut tuned = Tuned::default();
        // Per point: the kernels measured and their outcomes.
        let mut measured: Vec<(Vec<&Selection>, Vec<Outcome>)> = Vec::with_capacity(plans.len());
        for (pi, plan) in plans.iter().enumerate() {
            let todo: Vec<&Selection> = plan.ranked.iter().filter(|s| self.todo(plan, s)).collect();
            if !todo.is_empty() && timing::spent(self.deadline) {
                tuned.budget_exhausted = true;
                skip_for_budget(plan, &todo, skipped, on_event);
                measured.push((Vec::new(), Vec::new()));
                continue;
            }
            let outcomes = self.time_point(pi, plan, &todo, on_event);
            // Stored point by point, so an interrupted run keeps what it measured.
            tuned.rows_written += self.store(plan, &todo, &outcomes)?;
            self.record_parity(pi, plan, &todo, &mut tuned.parity)?;
            measured.push((todo, outcomes));
        }
        for (pi, (plan, (todo, first))) in plans.iter().zip(&mut measured).enumerate() {
            if todo.len() < 2 {
                continue;
            }
            if timing::spent(self.deadline) {
                tuned.budget_exhausted = true;
                todo.iter().for_each(|_| on_event(Event::Finished));
                continue;
            }
            let second = self.time_point(pi + plans.len(), plan, todo, on_event);
            *first = first.drain(..).zip(second).map(|(a, b)| slower(a, b)).collect();
            // Each row replaces its first window's: no new rows.
            self.store(plan, todo, first)?;
        }
        for (plan, (todo, outcomes)) in plans.iter().zip(&measured) {
            self.point_results(plan, todo, outcomes, &mut tuned.results);
        }
        Ok(tuned)
    }

    /// Compares each kernel's lead-in call at `plan`'s point with the reference and stores
    /// the parity records next to the timings.
    fn record_parity(
        &self,
        salt: usize,
        plan: &Planned<'_>,
        todo: &[&Selection],
        summary: &mut super::report::ParitySummary,
    ) -> Result<()> {
        let seed = self.opts.seed ^ (salt as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let records = super::lead_in::records(self.host, plan, todo, seed, &self.fingerprint);
        if records.is_empty() {
            return Ok(());
        }
        self.db.insert_parity(&records)?;
        summary.records += records.len();
        for r in records.iter().filter(|r| r.status == crate::perfdb::ParityStatus::Fail) {
            let why = r.detail.as_deref().unwrap_or("failed");
            summary.failed.push(format!("{} at {} {}: {why}", r.kernel, plan.point.entry, plan.bucket));
        }
        Ok(())
    }

    /// Stores the rows of what was measured at `plan`'s point (each replacing the row of an
    /// earlier window); returns how many.
    fn store(&self, plan: &Planned<'_>, todo: &[&Selection], outcomes: &[Outcome]) -> Result<usize> {
        let rows = self.point_rows(plan, todo, outcomes);
        if !rows.is_empty() {
            self.db.insert_many(&rows)?;
        }
        Ok(rows.len())
    }

    /// Times `todo` at `plan`'s point together on inputs drawn from `salt` (the point's
    /// index in a first window, another in the second); nothing when there is nothing to do.
    fn time_point(
        &self,
        salt: usize,
        plan: &Planned<'_>,
        todo: &[&Selection],
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Vec<Outcome> {
        if todo.is_empty() {
            return Vec::new();
        }
        let names: Vec<&str> = todo.iter().map(|s| s.kernel.as_str()).collect();
        let kernels = names.join(", ");
        on_event(Event::Started {
            phase: Phase::Tune,
            entry: &plan.point.entry,
            bucket: &plan.bucket,
            kernel: &kernels,
        });
        let out = timing::time_group(self.host, &plan.point.request, todo, self.opts, salt as u64, self.deadline);
        for _ in todo {
            on_event(Event::Finished);
        }
        out
    }

    /// Adds the result of every kernel ranked at `plan`'s point to `results`: measured now
    /// (`outcomes`, one per `todo`), failed, or kept from its usable stored row.
    fn point_results(
        &self,
        plan: &Planned<'_>,
        todo: &[&Selection],
        outcomes: &[Outcome],
        results: &mut Vec<KernelResult>,
    ) {
        for sel in &plan.ranked {
            let blank = blank_result(plan, sel);
            let Some(oi) = todo.iter().position(|t| t.kernel == sel.kernel) else {
                results.extend(self.usable(&sel.kernel, &plan.key, &plan.bucket).map(|r| stored_result(blank, r)));
                continue;
            };
            match &outcomes[oi] {
                Ok(m) => results.push(measured_result(blank, m)),
                Err(message) => {
                    results.push(KernelResult { status: Status::Failed, error: Some(message.clone()), ..blank })
                }
            }
        }
    }

    /// The rows of the kernels measured at `plan`'s point (`outcomes`, one per `todo`).
    fn point_rows(&self, plan: &Planned<'_>, todo: &[&Selection], outcomes: &[Outcome]) -> Vec<Row> {
        let catalog = self.host.selector.catalog();
        todo.iter()
            .zip(outcomes)
            .filter_map(|(sel, o)| {
                let i = catalog.find(&sel.kernel)?;
                o.as_ref().ok().map(|m| self.row(plan, sel, catalog.kernel(i), m))
            })
            .collect()
    }

    /// The PerfDB row of `sel` measured at `plan`'s point.
    fn row(&self, plan: &Planned<'_>, sel: &Selection, specs: (&BackendSpec, &KernelSpec), m: &Measurement) -> Row {
        let (backend_spec, kernel_spec) = specs;
        let s = m.summary;
        Row {
            kernel: sel.kernel.clone(),
            kernel_version: kernel_spec.version.clone().unwrap_or_else(|| backend_spec.version.clone()),
            backend: backend_spec.backend.clone(),
            backend_version: backend_spec.version.clone(),
            fingerprint: self.fingerprint.clone(),
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
            created_at: crate::time::now_unix(),
        }
    }

    /// The calibration the run models with, and where it lives: fitted to every time this run
    /// has (measured now or kept from the PerfDB) and written with `--calibrate`; without it,
    /// the machine's calibration file when there is one, as host handles read it, so that
    /// "PerfDB-backed" is what a host handle here would select.
    pub fn calibration(
        &self,
        plans: &[Planned<'_>],
        results: &[KernelResult],
    ) -> Result<Option<(Calibration, String)>> {
        let selector = &self.host.selector;
        Ok(match &self.opts.calibrate {
            Some(path) => {
                let c = calibrate::fit_results(selector, plans, results, &self.opts.workload.name);
                c.save(path)?;
                Some((c, path.display().to_string()))
            }
            None => {
                let path = &self.opts.machine_calibration;
                Calibration::load(path)
                    .ok()
                    .filter(|c| c.fingerprint == selector.hardware().fingerprint)
                    .map(|c| (c, path.display().to_string()))
            }
        })
    }

    /// The model-only selector with `calibration`, and the PerfDB-backed one over every row
    /// now stored for this machine, modeling what the rows do not cover (or blend with) with
    /// the calibration when there is one, as a host handle does.
    pub fn selectors(&self, calibration: Option<&Calibration>) -> Result<Selectors> {
        let selector = &self.host.selector;
        let calibrated = calibration.map(|c| selector.clone().with_calibration(Arc::new(c.clone())));
        let rows_now = self.db.rows_for(&self.fingerprint)?;
        let with_db = calibrated
            .clone()
            .unwrap_or_else(|| selector.clone())
            .with_measurements(Arc::new(measurements(&rows_now, selector)));
        Ok(Selectors { with_db, calibrated })
    }

    /// Marks each result that the model-only ranking or `with_db` picks at its point.
    pub fn mark_picks(&self, plans: &[Planned<'_>], with_db: &Selector, results: &mut [KernelResult]) {
        let picks: Vec<(Option<Selection>, Option<Selection>)> = plans
            .iter()
            .map(|plan| {
                let model = plan.ranked.first().cloned();
                let perf = with_db
                    .ranked(&plan.point.request)
                    .ok()
                    .and_then(|r| r.into_iter().find(|s| self.host.registry.contains(&s.kernel)));
                (model, perf)
            })
            .collect();
        for r in results {
            if let Some(pi) =
                plans.iter().position(|p| p.point.entry == r.entry && p.bucket == r.bucket && p.key == r.key)
            {
                let (m, p) = &picks[pi];
                r.model_choice = m.as_ref().is_some_and(|s| s.kernel == r.kernel);
                r.perfdb_choice = p.as_ref().is_some_and(|s| s.kernel == r.kernel);
            }
        }
    }
}

/// The slower of a kernel's two windows (by median); a window that failed is the outcome.
fn slower(first: Outcome, second: Outcome) -> Outcome {
    match (first, second) {
        (Ok(a), Ok(b)) => Ok(if b.summary.median > a.summary.median { b } else { a }),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// Lists `todo` at `plan`'s point as skipped: the budget is spent.
fn skip_for_budget(
    plan: &Planned<'_>,
    todo: &[&Selection],
    skipped: &mut Vec<Skipped>,
    on_event: &mut dyn FnMut(Event<'_>),
) {
    for sel in todo {
        skipped.push(Skipped {
            entry: plan.point.entry.clone(),
            bucket: plan.bucket.clone(),
            kernel: sel.kernel.clone(),
            phase: Phase::Tune,
            reason: "budget",
        });
        on_event(Event::Finished);
    }
}

/// `sel`'s result at `plan`'s point with no timing yet.
fn blank_result(plan: &Planned<'_>, sel: &Selection) -> KernelResult {
    KernelResult {
        entry: plan.point.entry.clone(),
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
    }
}

/// `blank` with the times of its stored row.
fn stored_result(blank: KernelResult, r: &Row) -> KernelResult {
    KernelResult {
        samples: r.samples,
        median_ns: r.median_ns,
        p10_ns: r.p10_ns,
        p90_ns: r.p90_ns,
        mad_ns: r.mad_ns,
        cv: r.cv,
        ..blank
    }
}

/// `blank` with the times measured now.
fn measured_result(blank: KernelResult, m: &Measurement) -> KernelResult {
    let s = m.summary;
    KernelResult {
        status: Status::Measured,
        samples: s.samples,
        rejected: s.rejected,
        median_ns: s.median,
        p10_ns: s.p10,
        p90_ns: s.p90,
        mad_ns: s.mad,
        cv: s.cv,
        stop: Some(m.stop.as_str()),
        ..blank
    }
}
