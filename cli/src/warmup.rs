//! `lz warmup`: compile (JIT) every kernel a workload's or a table's buckets select, for
//! every size of each bucket, and with `--verify` prove it: a request of another size in
//! each bucket, dispatched afterwards, compiles nothing.

use std::path::Path;

use super::{Outcome, print_json};
use layerzero::error::{Error, Result};
use layerzero::model::request::Request;
use layerzero::plan::table::DispatchTable;
use layerzero::plan::workload::Workload;
use layerzero::runtime::{LayerZero, PlanMode, WarmPoint};

/// What `lz warmup` was given.
pub(super) struct WarmupArgs<'a> {
    pub workload: Option<&'a Path>,
    pub table: Option<&'a Path>,
    pub verify: bool,
    pub json: bool,
}

/// The points of a workload (each bucket's largest size), else of a table (its entries'
/// representative requests).
fn points(workload: Option<&Path>, table: Option<&DispatchTable>) -> Result<Vec<WarmPoint>> {
    if let (None, Some(t)) = (workload, table) {
        return t
            .entries
            .iter()
            .map(|e| {
                Request::from_value(e.request.clone())
                    .map(|request| WarmPoint { entry: e.entry.clone(), request })
                    .map_err(|err| Error::invalid(format!("table entry `{}` {}: {err}", e.entry, e.bucket)))
            })
            .collect();
    }
    let Some(path) = workload else { return Err(Error::invalid("lz warmup needs --workload FILE or --table FILE")) };
    Ok(Workload::load(path)?.points()?.into_iter().map(|p| WarmPoint { entry: p.entry, request: p.request }).collect())
}

pub(super) fn run(a: WarmupArgs<'_>) -> Result<Outcome> {
    let table = a.table.map(|p| DispatchTable::read(p).map_err(|r| r.error)).transpose()?;
    let mut lz = LayerZero::host()?;
    if let Some(t) = &table {
        lz = lz.with_plan(t, PlanMode::Prefer)?;
    }
    let points = points(a.workload, table.as_ref())?;
    let report = lz.warmup(&points);
    let verify = if a.verify { Some(lz.verify_warm(&points)?) } else { None };
    let cold = lz.cold(&points);
    let ok =
        report.failed == 0 && cold.is_empty() && verify.as_ref().is_none_or(|v| v.compiled == 0 && v.errors.is_empty());
    if a.json {
        print_json(&serde_json::json!({
            "warmup": report,
            "verify": verify,
            "cold": cold,
            "jit": layerzero::backend::onednn::jit_stats(),
            "ok": ok,
        }));
    } else {
        println!("{:<22} {:<24} {:<28} {:>8} {:>10}  NOTE", "ENTRY", "BUCKET", "KERNEL", "COMPILED", "MS");
        for i in &report.items {
            let note = match &i.error {
                Some(e) => format!("{}: {}", e.code.unwrap_or("ERROR"), e.message),
                None if !i.needs_jit => "no JIT".to_owned(),
                None => String::new(),
            };
            println!("{:<22} {:<24} {:<28} {:>8} {:>10.2}  {note}", i.entry, i.bucket, i.kernel, i.compiled, i.ms);
        }
        println!(
            "{} buckets, {} compilations in {:.1} ms, {} failed",
            report.items.len(),
            report.compiled,
            report.ms,
            report.failed
        );
        if let Some(v) = &verify {
            println!(
                "verify: {} requests at another size of their bucket compiled {} more{}",
                v.requests,
                v.compiled,
                if v.errors.is_empty() { String::new() } else { format!("; errors: {}", v.errors.join("; ")) }
            );
        }
        for c in &cold {
            println!("not warm: {c}");
        }
    }
    Ok(if ok { Outcome::Ok } else { Outcome::CheckFailed })
}
