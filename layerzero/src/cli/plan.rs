//! `lz solve` (bake a dispatch table) and `lz readiness-check` (is this machine ready to
//! serve with it?).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use super::{Outcome, print_json};
use crate::capabilities::catalog::Catalog;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::executor::Registry;
use crate::hardware::profile::HardwareProfile;
use crate::perfdb::{self, PerfDb};
use crate::plan::solve::{self, Provenance};
use crate::plan::table::{DispatchTable, Plan};
use crate::plan::workload::Workload;
use crate::score::measured::{Measured, Measurements};
use crate::select::Selector;

/// Reads and checks a workload file.
pub(super) fn load_workload(path: &Path) -> Result<Workload> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::new(ErrorKind::Io, format!("cannot read workload {}: {e}", path.display())))?;
    Workload::from_json(&text, &path.display().to_string())
}

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
        None => (perfdb::default_path(), false),
    };
    if !explicit && !path.exists() {
        return Ok(FromPerfDb { measurements: None, digest: None, rows: 0, recovered: None });
    }
    let opened = PerfDb::open(&path)?;
    let rows = opened.db.rows_for(&hardware.fingerprint)?;
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
    let workload = load_workload(a.workload)?;
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
        Provenance { perfdb_digest: digest, created_at: super::render::rfc3339(perfdb::now_unix()), command },
    )?;
    write_atomically(a.out, &table.to_json())?;
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

/// Writes through a temporary file and a rename, so a reader never sees half a table.
fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| Error::new(ErrorKind::Io, format!("cannot write {}: {e}", path.display())))
}

/// One readiness check.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Check {
    /// What was checked.
    pub name: String,
    /// Passed.
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// What to do about a failure.
    pub fix: Option<String>,
}

fn pass(name: &str, detail: String) -> Check {
    Check { name: name.to_owned(), ok: true, detail, fix: None }
}

fn fail(name: &str, detail: String, fix: String) -> Check {
    Check { name: name.to_owned(), ok: false, detail, fix: Some(fix) }
}

/// What `lz readiness-check` was asked to check.
pub(super) struct ReadinessArgs<'a> {
    pub table: Option<&'a Path>,
    pub policy: Option<&'a PathBuf>,
    pub workload: Option<&'a Path>,
    pub perfdb: Option<&'a Path>,
    pub json: bool,
}

pub(super) fn readiness(a: ReadinessArgs<'_>, catalog: Result<Arc<Catalog>>) -> Result<Outcome> {
    let mut checks = Vec::new();
    // Capabilities and the shipped files.
    let catalog = match catalog {
        Ok(c) => {
            checks.push(pass("capabilities", format!("{} kernels, hash {}", c.kernels().count(), &c.hash()[..12])));
            Some(c)
        }
        Err(e) => {
            checks.push(fail(
                "capabilities",
                e.to_string(),
                "fix the capability file named above (`lz validate` lists every violation)".into(),
            ));
            None
        }
    };
    let files = super::validate::shipped_results();
    let bad: Vec<String> =
        files.iter().filter(|(_, _, e)| !e.is_empty()).map(|(f, _, e)| format!("{f}: {}", e[0])).collect();
    checks.push(if bad.is_empty() {
        pass("schemas", format!("{} shipped files valid", files.len()))
    } else {
        fail("schemas", bad.join("; "), "fix the files named (`lz validate` lists every violation)".into())
    });
    // Policy.
    let policy = match a.policy {
        None => Some(crate::policy::Policy::default()),
        Some(p) => match super::load_policy(p) {
            Ok(pol) => {
                checks.push(pass("policy", format!("{} valid", p.display())));
                Some(pol)
            }
            Err(e) => {
                checks.push(fail(
                    "policy",
                    e.to_string(),
                    format!("fix {} (see schemas/policy.schema.json)", p.display()),
                ));
                None
            }
        },
    };
    let selector = match (&catalog, policy) {
        (Some(c), Some(p)) => match super::selector_with(None, p, c.clone()) {
            Ok(s) => Some(s),
            Err(e) => {
                checks.push(fail("policy", e.to_string(), "fix the policy rule named above".into()));
                None
            }
        },
        _ => None,
    };
    // The table: readable, valid, made for this machine and these hashes, every kernel usable.
    let mut plan: Option<Plan> = None;
    if let Some(path) = a.table {
        match DispatchTable::read(path) {
            Err(r) => checks.push(fail(
                "table",
                r.error.to_string(),
                format!("regenerate {} with `lz solve` (the `command` in a valid table's header)", path.display()),
            )),
            Ok(table) => {
                checks.push(pass("table", format!("{} valid, {} entries", path.display(), table.entries.len())));
                if let Some(sel) = &selector {
                    match Plan::new(&table, sel) {
                        Err(reason) => checks.push(fail(
                            "table_matches_host",
                            reason.to_string(),
                            format!("re-solve on this machine with this policy: {}", table.header.command),
                        )),
                        Ok(p) => {
                            checks.push(pass(
                                "table_matches_host",
                                format!(
                                    "hardware {}, capabilities and policy hashes match",
                                    table.header.hardware.name
                                ),
                            ));
                            checks.push(kernels_check(&p, &table));
                            checks.push(jit_check(&table, sel.catalog()));
                            plan = Some(p);
                        }
                    }
                }
            }
        }
    }
    // Workload coverage.
    if let Some(wpath) = a.workload {
        match load_workload(wpath).and_then(|w| w.points()) {
            Err(e) => checks.push(fail("workload", e.to_string(), format!("fix {}", wpath.display()))),
            Ok(points) => {
                let covered = plan.as_ref().map_or(0, |p| points.iter().filter(|pt| p.get(&pt.key).is_some()).count());
                let pct = if points.is_empty() { 100.0 } else { 100.0 * covered as f64 / points.len() as f64 };
                let detail = format!("{covered} of {} buckets ({pct:.1}%) served by the table", points.len());
                checks.push(if covered == points.len() {
                    pass("coverage", detail)
                } else {
                    fail(
                        "coverage",
                        detail,
                        format!(
                            "solve the table for this workload: lz solve --workload {} --out TABLE",
                            wpath.display()
                        ),
                    )
                });
            }
        }
    }
    // PerfDB integrity.
    let db_path = a.perfdb.map_or_else(perfdb::default_path, Path::to_path_buf);
    if db_path.exists() {
        match PerfDb::open(&db_path).and_then(|o| Ok((o.db.stats()?, o.recovered))) {
            Ok((stats, None)) if stats.integrity == "ok" => {
                checks.push(pass("perfdb", format!("{} ok, {} rows", db_path.display(), stats.rows)))
            }
            Ok((stats, None)) => checks.push(fail(
                "perfdb",
                format!("{}: integrity check: {}", db_path.display(), stats.integrity),
                "move the file aside and re-run `lz tune`".into(),
            )),
            Ok((_, Some(r))) => checks.push(fail(
                "perfdb",
                format!(
                    "{} was damaged ({}); moved aside to {} and rebuilt empty",
                    db_path.display(),
                    r.why,
                    r.moved_to.display()
                ),
                "re-run `lz tune --workload FILE` to measure again".into(),
            )),
            Err(e) => checks.push(fail("perfdb", e.to_string(), "check the path's permissions".into())),
        }
    } else {
        checks.push(pass("perfdb", format!("{} absent (selection uses the cost model)", db_path.display())));
    }
    let ready = checks.iter().all(|c| c.ok);
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

fn kernels_check(plan: &Plan, table: &DispatchTable) -> Check {
    let registry = Registry::builtin();
    let mut problems: Vec<String> = plan
        .dropped()
        .iter()
        .map(|d| {
            let why: Vec<&str> = d.reasons.iter().skip(1).map(|r| r.code().as_str()).collect();
            format!("{} {} -> {} ({})", d.entry, d.bucket, d.kernel, why.join(", "))
        })
        .collect();
    let mut kernels: Vec<&str> = table.entries.iter().map(|e| e.kernel.as_str()).collect();
    kernels.sort_unstable();
    kernels.dedup();
    for k in &kernels {
        if registry.get(k).is_none() {
            problems.push(format!("{k} has no executor in this process (EXECUTOR_NOT_REGISTERED)"));
        }
    }
    if problems.is_empty() {
        pass("kernels", format!("{} kernels named, all eligible and executable here", kernels.len()))
    } else {
        fail(
            "kernels",
            problems.join("; "),
            "install or register the backends named, or re-solve the table on this machine".into(),
        )
    }
}

fn jit_check(table: &DispatchTable, catalog: &Catalog) -> Check {
    let jit: Vec<&str> = table
        .entries
        .iter()
        .filter(|e| catalog.find(&e.kernel).is_some_and(|i| catalog.kernel(i).1.properties.needs_jit))
        .map(|e| e.kernel.as_str())
        .collect();
    if jit.is_empty() {
        pass("jit", "no kernel in the table compiles at first use".into())
    } else {
        fail(
            "jit",
            format!(
                "{} entries name kernels that compile at first use ({}) and this build has no JIT warm-up",
                jit.len(),
                jit[0]
            ),
            "deny JIT kernels in the policy (`allow_jit: false`) and re-solve".into(),
        )
    }
}
