//! `lz parity`: every executable kernel against `cpu_reference` over the case matrix.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::{Outcome, print_json};
use layerzero::capabilities::catalog::Catalog;
use layerzero::error::Result;
use layerzero::perfdb::{ParityRecord, ParityStatus, PerfDb, Recovery};
use std::collections::BTreeMap;
use std::path::Path;

use crate::parity;
use layerzero::host::detect;
use layerzero::model::op::Op;
use layerzero::policy::Policy;
use layerzero::select::Selector;

/// `lz parity`: the report printed, and with `record` (a PerfDB file) each compared
/// (kernel, case) stored there as this machine's parity record.
pub(crate) fn run(
    catalog: Arc<Catalog>,
    op: Option<Op>,
    kernel: Option<&str>,
    json: bool,
    record: Option<&Path>,
) -> Result<Outcome> {
    let host = Arc::new(detect::detect_host().profile);
    let fingerprint = host.fingerprint.clone();
    // Planning availability: parity asks whether a kernel accepts a case, not whether its
    // backend is installed (only registered executors run at all).
    let selector = Selector::planning(catalog, host, Arc::new(Policy::default()))?;
    let registry = layerzero::host::builtin_registry();
    let faults = match &crate::knobs().faults {
        Some(spec) => layerzero::runtime::faults::parse(spec)?,
        None => Vec::new(),
    };
    let report = parity::run(&registry, &selector, op, kernel, &faults);
    let recorded = match record {
        Some(path) => Some(store(path, &records(&report, &selector, &fingerprint))?),
        None => None,
    };
    if json {
        let mut v = serde_json::to_value(&report).unwrap_or_default();
        if let (Some((n, recovered)), Some(path), Some(obj)) = (&recorded, record, v.as_object_mut()) {
            obj.insert(
                "recorded".to_owned(),
                serde_json::json!({"records": n, "perfdb": path, "fingerprint": fingerprint, "recovered": recovered}),
            );
        }
        print_json(&v);
    } else {
        let mut out = String::new();
        let w = report.rows.iter().map(|r| r.case.len()).max().unwrap_or(4);
        let kw = report.rows.iter().map(|r| r.kernel.len()).max().unwrap_or(6);
        let _ = writeln!(
            out,
            "{:<w$}  {:<kw$}  {:>10}  {:>10}  {:>15}  RESULT",
            "CASE", "KERNEL", "NMSE", "MAX_ABS", "TOL (rtol/atol)"
        );
        for r in &report.rows {
            let (nmse, max_abs) = r.diff.map_or(("-".to_owned(), "-".to_owned()), |d| {
                (format!("{:.3e}", d.nmse), format!("{:.3e}", d.max_abs))
            });
            let tol = format!("{:.0e}/{:.0e}", r.tolerance.rtol, r.tolerance.atol);
            let result = match (r.status, &r.detail) {
                ("pass", _) => "PASS".to_owned(),
                ("fail", _) => format!(
                    "FAIL ({} of {} elements outside)",
                    r.diff.map_or(0, |d| d.violations),
                    r.diff.map_or(0, |d| d.elements)
                ),
                ("skip", Some(d)) => format!("skip ({d})"),
                (_, Some(d)) => format!("ERROR {d}"),
                (s, None) => s.to_uppercase(),
            };
            let _ = writeln!(out, "{:<w$}  {:<kw$}  {nmse:>10}  {max_abs:>10}  {tol:>15}  {result}", r.case, r.kernel);
        }
        let _ = writeln!(out, "{} passed, {} failed, {} skipped", report.passed, report.failed, report.skipped);
        if let (Some((n, recovered)), Some(path)) = (&recorded, record) {
            if let Some(r) = recovered {
                let _ = writeln!(
                    out,
                    "perfdb {} was damaged ({}); moved aside to {}",
                    path.display(),
                    r.why,
                    r.moved_to.display()
                );
            }
            let _ = writeln!(out, "recorded {n} parity results for machine {fingerprint} in {}", path.display());
        }
        print!("{out}");
    }
    if report.rows.is_empty() {
        return Err(layerzero::error::Error::invalid(
            "no executable kernel matches the filters (see `lz list-kernels`)",
        ));
    }
    Ok(if report.failed == 0 { Outcome::Ok } else { Outcome::CheckFailed })
}

/// The parity records of `report`'s compared rows (passed or failed; a skipped case says
/// nothing of the kernel, and one that errored is the health system's business). Cases that
/// share a record (kernel, dtype, key, bucket) keep the worst: a failure, the lowest cosine.
fn records(report: &parity::Report, selector: &Selector, fingerprint: &str) -> Vec<ParityRecord> {
    let mut kept: BTreeMap<(String, String, String, String), ParityRecord> = BTreeMap::new();
    for r in compared(report, selector, fingerprint) {
        let id = (r.kernel.clone(), r.dtype.clone(), r.key.clone(), r.bucket.clone());
        let worse = |old: &ParityRecord| {
            (r.status == ParityStatus::Fail && old.status == ParityStatus::Pass)
                || (r.status == old.status && r.cosine.unwrap_or(1.0) < old.cosine.unwrap_or(1.0))
        };
        if kept.get(&id).is_none_or(worse) {
            kept.insert(id, r);
        }
    }
    kept.into_values().collect()
}

/// One record per compared row of `report`.
fn compared(report: &parity::Report, selector: &Selector, fingerprint: &str) -> Vec<ParityRecord> {
    let catalog = selector.catalog();
    let now = layerzero::time::now_unix();
    report
        .rows
        .iter()
        .filter_map(|r| {
            let status = match r.status {
                "pass" => ParityStatus::Pass,
                "fail" => ParityStatus::Fail,
                _ => return None,
            };
            let (b, k) = catalog.kernel(catalog.find(&r.kernel)?);
            let detail = r
                .diff
                .filter(|d| d.violations > 0)
                .map(|d| format!("{} of {} elements outside the tolerance", d.violations, d.elements));
            Some(ParityRecord {
                kernel: r.kernel.clone(),
                kernel_version: k.version.clone().unwrap_or_else(|| b.version.clone()),
                backend: b.backend.clone(),
                backend_version: b.version.clone(),
                fingerprint: fingerprint.to_owned(),
                op: r.op.as_str().to_owned(),
                dtype: r.dtype.clone(),
                key: r.key.clone(),
                bucket: r.bucket.clone(),
                case: r.case.clone(),
                status,
                nmse: r.diff.map(|d| d.nmse),
                max_abs: r.diff.map(|d| d.max_abs),
                cosine: r.cosine,
                rtol: r.tolerance.rtol,
                atol: r.tolerance.atol,
                detail,
                origin: "lz parity".to_owned(),
                created_at: now,
            })
        })
        .collect()
}

/// Stores `records` in the PerfDB at `path`: how many, and the damaged file moved aside on
/// the way, if any.
fn store(path: &Path, records: &[ParityRecord]) -> Result<(usize, Option<Recovery>)> {
    let opened = PerfDb::open(path)?;
    opened.db.insert_parity(records)?;
    Ok((records.len(), opened.recovered))
}
