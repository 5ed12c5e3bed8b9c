//! `lz solve` (bake a dispatch table) and `lz readiness-check` (is this machine ready to
//! serve with it?).

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use super::{Outcome, print_json};
use layerzero::capabilities::catalog::Catalog;
use layerzero::error::Result;
use layerzero::hardware::profile::HardwareProfile;
use layerzero::perfdb::{self, PerfDb};
use layerzero::plan::solve::{self, Provenance};
use layerzero::plan::workload::Workload;
use layerzero::readiness::{self, ReadinessInputs};
use layerzero::score::measured::{Measured, Measurements};
use layerzero::select::Selector;

/// PerfDB rows for `hardware` as measurements, with the digest of the rows used.
pub(super) struct FromPerfDb {
    pub measurements: Option<Arc<Measurements>>,
    pub digest: Option<String>,
    pub rows: usize,
    pub recovered: Option<perfdb::Recovery>,
}

/// Opens the PerfDB (if the file exists, or when `explicit`) and builds measurements for
/// `hardware` from its rows.
pub(super) fn measurements(path: Option<&Path>, catalog: &Catalog, hardware: &HardwareProfile) -> Result<FromPerfDb> {
    let (path, explicit) = match path {
        Some(p) => (p.to_path_buf(), true),
        None => (super::knobs().perfdb_path(), false),
    };
    if !explicit && !path.exists() {
        return Ok(FromPerfDb { measurements: None, digest: None, rows: 0, recovered: None });
    }
    let opened = match PerfDb::open_for_reading(&path)? {
        Ok(opened) => opened,
        Err(newer) => {
            // Another layerzero's PerfDB: left alone; the run goes on with the cost model.
            eprintln!("lz: warning: {newer}; solving with the cost model only");
            return Ok(FromPerfDb { measurements: None, digest: None, rows: 0, recovered: None });
        }
    };
    let rows = opened.db.rows_for(&hardware.fingerprint)?;
    if let (n @ 1.., Some(why)) = opened.db.skipped_rows() {
        eprintln!("lz: warning: skipped {n} unusable PerfDB row(s) (the last: {why})");
    }
    let digest = (!rows.is_empty()).then(|| perfdb::digest_rows(&rows));
    let n = rows.len();
    let m = Measurements::build(rows.iter().map(Measured::from), catalog, hardware);
    Ok(FromPerfDb { measurements: Some(Arc::new(m)), digest, rows: n, recovered: opened.recovered })
}

/// What `lz solve` was asked to do.
pub(super) struct SolveArgs<'a> {
    pub workload: &'a Path,
    pub out: &'a Path,
    pub perfdb: Option<&'a Path>,
    pub no_perfdb: bool,
    pub json: bool,
}

pub(super) fn solve(a: SolveArgs<'_>, selector: Selector, command: String) -> Result<Outcome> {
    let workload = Workload::load(a.workload)?;
    let (selector, digest, rows) = if a.no_perfdb {
        (selector, None, 0)
    } else {
        let m = measurements(a.perfdb, selector.catalog(), selector.hardware())?;
        if let Some(r) = &m.recovered {
            eprintln!("lz: warning: the PerfDB was damaged ({}); moved aside to {}", r.why, r.moved_to.display());
        }
        match m.measurements {
            Some(ms) => (selector.with_measurements(ms), m.digest, m.rows),
            None => (selector, None, 0),
        }
    };
    let table = solve::solve(
        &workload,
        &selector,
        Provenance { perfdb_digest: digest, created_at: super::render::rfc3339(layerzero::time::now_unix()), command },
    )?;
    let mut inputs = vec![a.workload];
    inputs.extend(a.perfdb);
    layerzero::files::write(a.out, table.to_json().as_bytes(), &inputs)?;
    let sources = solve::sources(&table);
    if a.json {
        print_json(&serde_json::json!({
            "out": a.out.display().to_string(),
            "entries": table.entries.len(),
            "unsolved": table.unsolved,
            "sources": sources.iter().map(|(s, n)| (s.as_str().to_owned(), serde_json::json!(n))).collect::<serde_json::Map<_, _>>(),
            "perfdb_rows": rows,
            "header": table.header,
        }));
    } else {
        println!(
            "wrote {} ({} entries for {} on {}; {} unsolved)",
            a.out.display(),
            table.entries.len(),
            workload.name,
            table.header.hardware.name,
            table.unsolved.len()
        );
        let by: Vec<String> = sources.iter().map(|(s, n)| format!("{} {n}", s.as_str())).collect();
        println!("scores: {} (PerfDB rows for this hardware: {rows})", by.join(", "));
        for u in &table.unsolved {
            println!("unsolved: {} {}: {}", u.entry, u.bucket, u.codes.join(", "));
        }
    }
    Ok(Outcome::Ok)
}

/// What `lz readiness-check` was asked to check.
pub(super) struct ReadinessArgs<'a> {
    pub table: Option<&'a Path>,
    pub policy: Option<&'a Path>,
    pub workload: Option<&'a Path>,
    pub perfdb: Option<&'a Path>,
    pub require_warm: bool,
    pub warmup: bool,
    pub json: bool,
}

pub(super) fn readiness(a: ReadinessArgs<'_>, catalog: Result<Arc<Catalog>>) -> Result<Outcome> {
    let catalog_for_ranks = catalog.as_ref().map(Arc::clone).map_err(Clone::clone);
    let checks = readiness::readiness(&ReadinessInputs {
        catalog,
        hardware: None,
        policy: a.policy,
        table: a.table,
        workload: a.workload,
        perfdb: a.perfdb,
        settings: super::knobs(),
        require_warm: a.require_warm,
        warmup: a.warmup,
    });
    let mut checks = checks;
    // Under mpirun every rank also agrees with the others.
    if let Some(size) = super::ranks::launched_size() {
        let inputs = super::ranks::Inputs {
            catalog: catalog_for_ranks,
            policy: a.policy,
            table: a.table,
            workload: a.workload,
            perfdb: a.perfdb,
        };
        checks.push(super::ranks::check(&size, inputs));
    }
    let ready = readiness::all_passed(&checks);
    if a.json {
        print_json(&serde_json::json!({ "ready": ready, "checks": checks }));
    } else {
        let mut out = String::new();
        for c in &checks {
            let _ = writeln!(out, "{} {:<20} {}", if c.ok { "ok  " } else { "FAIL" }, c.name, c.detail);
            if let Some(f) = &c.fix {
                let _ = writeln!(out, "     {:<20} fix: {f}", "");
            }
        }
        let _ = writeln!(out, "{}", if ready { "ready" } else { "NOT READY" });
        print!("{out}");
    }
    Ok(if ready { Outcome::Ok } else { Outcome::CheckFailed })
}
