//! `lz parity`: every executable kernel against `cpu_reference` over the case matrix.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::{Outcome, print_json};
use layerzero::capabilities::catalog::Catalog;
use layerzero::error::Result;

use crate::parity;
use layerzero::host::detect;
use layerzero::model::op::Op;
use layerzero::policy::Policy;
use layerzero::select::Selector;

pub(crate) fn run(catalog: Arc<Catalog>, op: Option<Op>, kernel: Option<&str>, json: bool) -> Result<Outcome> {
    let host = Arc::new(detect::detect_host().profile);
    // Planning availability: parity asks whether a kernel accepts a case, not whether its
    // backend is installed (only registered executors run at all).
    let selector = Selector::planning(catalog, host, Arc::new(Policy::default()))?;
    let registry = layerzero::host::builtin_registry();
    let report = parity::run(&registry, &selector, op, kernel);
    if json {
        print_json(&serde_json::to_value(&report).unwrap_or_default());
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
        print!("{out}");
    }
    if report.rows.is_empty() {
        return Err(layerzero::error::Error::invalid(
            "no executable kernel matches the filters (see `lz list-kernels`)",
        ));
    }
    Ok(if report.failed == 0 { Outcome::Ok } else { Outcome::CheckFailed })
}
