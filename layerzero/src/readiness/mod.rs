//! Is this machine ready to serve, and is this installation sound? The checks behind
//! `lz readiness-check` and `lz doctor`, computed as data so that a host program can run
//! them at start-up and decide for itself; the CLI only renders them.
//!
//! ```no_run
//! use std::path::Path;
//! use layerzero::capabilities::catalog::Catalog;
//! use layerzero::readiness::{self, ReadinessInputs};
//!
//! let inputs = ReadinessInputs {
//!     table: Some(Path::new("plans/llama.json")),
//!     ..ReadinessInputs::new(Catalog::builtin())
//! };
//! let checks = readiness::readiness(&inputs);
//! for c in checks.iter().filter(|c| !c.ok) {
//!     eprintln!("{}: {} (fix: {})", c.name, c.detail, c.fix.as_deref().unwrap_or(""));
//! }
//! assert!(readiness::all_passed(&checks));
//! ```

#[cfg(feature = "perfdb")]
pub mod doctor;
pub mod files;
mod locks;

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use crate::capabilities::catalog::Catalog;
use crate::error::Result;

use crate::hardware::profile::HardwareProfile;
use crate::host::detect;
use crate::knobs::Settings;
use crate::plan::table::{DispatchTable, Plan};
use crate::plan::workload::Workload;
use crate::policy::{FieldOverride, Policy};
use crate::runtime::LayerZero;
use crate::select::Selector;

/// One readiness check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What was checked (`capabilities`, `schemas`, `policy`, `policy_kernels`, `table`,
    /// `table_matches_host`, `kernels`, `jit`, `workload`, `coverage`, `perfdb`).
    pub name: String,
    /// Passed.
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// What to do about a failure; `None` when the check passed.
    pub fix: Option<String>,
}

impl Check {
    /// A passed check.
    pub fn pass(name: &str, detail: String) -> Check {
        Check { name: name.to_owned(), ok: true, detail, fix: None }
    }

    /// A failed check and its fix.
    pub fn fail(name: &str, detail: String, fix: String) -> Check {
        Check { name: name.to_owned(), ok: false, detail, fix: Some(fix) }
    }
}

/// Whether every check passed: the machine is ready to serve.
pub fn all_passed(checks: &[Check]) -> bool {
    checks.iter().all(|c| c.ok)
}

/// What to check readiness for.
pub struct ReadinessInputs<'a> {
    /// The catalog, or why it could not be loaded (reported as the `capabilities` check).
    pub catalog: Result<Arc<Catalog>>,
    /// The machine that will serve; `None` detects this host. Its backends are probed.
    pub hardware: Option<Arc<HardwareProfile>>,
    /// The policy file to serve with; `None` is the default policy.
    pub policy: Option<&'a Path>,
    /// The dispatch table to serve with; `None` skips the table checks.
    pub table: Option<&'a Path>,
    /// The workload whose buckets the table must cover; `None` skips the coverage check.
    pub workload: Option<&'a Path>,
    /// The PerfDB file; `None` is the default path (`$LAYERZERO_PERFDB`, ...).
    pub perfdb: Option<&'a Path>,
    /// The knobs served with: their policy overrides, the default PerfDB path.
    pub settings: &'a Settings,
    /// Fail unless every JIT kernel of the table is warm (also when the policy's
    /// `require_warm` says so).
    pub require_warm: bool,
    /// Warm the table's JIT kernels up first, as a serving process does at start.
    pub warmup: bool,
}

impl ReadinessInputs<'_> {
    /// Only the catalog: this host, the default policy and PerfDB path, no table or workload,
    /// the process's knobs.
    pub fn new(catalog: Result<Arc<Catalog>>) -> Self {
        ReadinessInputs {
            catalog,
            hardware: None,
            policy: None,
            table: None,
            workload: None,
            perfdb: None,
            settings: crate::host::process(),
            require_warm: false,
            warmup: false,
        }
    }
}

/// Runs every readiness check that `inputs` allows, in a fixed order. A check that cannot run
/// because an earlier one failed (no catalog, no valid policy) is left out, not failed twice.
pub fn readiness(inputs: &ReadinessInputs<'_>) -> Vec<Check> {
    let mut checks = Vec::new();
    let catalog = capabilities_check(&inputs.catalog, &mut checks);
    checks.push(schemas_check());
    let policy = policy_check(inputs.policy, &inputs.settings.policy_overrides(), &mut checks);
    let loading = policy.as_ref().map(|p| crate::plugins::Loading::new(p, inputs.settings));
    let selector = match (catalog, policy) {
        (Some(c), Some(p)) => match selector(c, inputs.hardware.clone(), p) {
            Ok(s) => Some(s),
            Err(e) => {
                checks.push(Check::fail("policy", e.to_string(), "fix the policy rule named above".into()));
                None
            }
        },
        _ => None,
    };
    if let Some(c) = selector.as_ref().and_then(|s| {
        let registry = crate::host::builtin_registry();
        locks::policy_kernels_check(s, |k| registry.contains(k))
    }) {
        checks.push(c);
    }
    let warm = Warm { require: inputs.require_warm, warmup: inputs.warmup };
    let plan = inputs.table.and_then(|path| table_checks(path, selector.as_ref(), warm, &mut checks));
    if let Some(path) = inputs.workload {
        checks.push(coverage_check(path, plan.as_ref()));
    }
    checks.push(perfdb_check(&inputs.perfdb.map_or_else(|| inputs.settings.perfdb_path(), Path::to_path_buf)));
    if let Some(c) = loading.and_then(|l| plugins_check(&inputs.settings.lock_path(), &l)) {
        checks.push(c);
    }
    checks
}

/// Every plugin the lockfile at `lock` pins loads (`None` when there is no lockfile).
pub fn plugins_check(lock: &Path, loading: &crate::plugins::Loading) -> Option<Check> {
    if !lock.exists() {
        return None;
    }
    Some(match crate::plugins::states(lock, loading) {
        Err(e) => Check::fail("plugins", e.to_string(), format!("fix or remove the lockfile {}", lock.display())),
        Ok(states) => {
            let bad: Vec<String> =
                states.iter().filter_map(|s| s.error.as_ref().map(|e| format!("{}: {e}", s.namespace))).collect();
            if bad.is_empty() {
                Check::pass(
                    "plugins",
                    format!("{} locked plugin(s) match their files ({})", states.len(), lock.display()),
                )
            } else {
                Check::fail(
                    "plugins",
                    bad.join("; "),
                    "restore the locked files, or re-lock the plugins you changed (`lz lock --plugin PATH`)".into(),
                )
            }
        }
    })
}

/// The readiness of a built handle: the plan it serves from, the executors it holds, the
/// workload's coverage by that plan, and the PerfDB (`None`: the default path).
pub fn of_handle(lz: &LayerZero, workload: Option<&Workload>, perfdb: Option<&Path>) -> Vec<Check> {
    let catalog = lz.catalog();
    let mut checks = vec![Check::pass(
        "capabilities",
        format!("{} kernels, hash {}", catalog.kernels().count(), &catalog.hash()[..12]),
    )];
    checks.push(schemas_check());
    let plan = lz.plan().filter(|_| lz.plan_rejection().is_none());
    match (plan, lz.plan_rejection()) {
        (_, Some(reason)) => checks.push(Check::fail(
            "table_matches_host",
            reason.to_string(),
            "re-solve the table on this machine with this policy (the `command` in its header)".into(),
        )),
        (Some(p), None) => {
            checks.push(Check::pass(
                "table_matches_host",
                format!("hardware {}, capabilities and policy hashes match", p.header().hardware.name),
            ));
            let kernels = p.kernels();
            checks.push(kernels_check(p, &kernels, |k| lz.registry().contains(k)));
            let require = lz.declared_policy().require_warm;
            let cold = (require && !jit_kernels(&kernels, catalog).is_empty()).then(|| lz.cold(&table_points(lz)));
            checks.push(jit_check(&kernels, catalog, require, cold));
        }
        (None, None) => checks.push(Check::pass("table", "no dispatch table: every selection is live".into())),
    }
    if let Some(w) = workload {
        checks.push(match w.points() {
            Ok(points) => coverage(&points, plan, &w.name),
            Err(e) => Check::fail("workload", e.to_string(), format!("fix workload {}", w.name)),
        });
    }
    checks.push(perfdb_check(&perfdb.map_or_else(|| lz.settings().perfdb_path(), Path::to_path_buf)));
    let loading = crate::plugins::Loading::new(&lz.declared_policy(), lz.settings());
    if let Some(c) = plugins_check(&lz.settings().lock_path(), &loading) {
        checks.push(c);
    }
    checks
}

/// Would every rank of `group` serve what this handle serves (`distributed::agree`, with
/// `workload` on every bucket)? Every rank runs it, collectively.
pub fn distributed_check(
    lz: &LayerZero,
    group: &dyn crate::distributed::Collective,
    workload: Option<&Workload>,
) -> Check {
    distributed_check_of(lz.agreement_facts(workload), group, workload.map(|w| w.name.as_str()))
}

/// The `distributed` check of facts this rank may have failed to list (it still takes part,
/// so no rank waits on it); `workload` names the workload the facts cover.
pub fn distributed_check_of(
    facts: Result<crate::distributed::Facts>,
    group: &dyn crate::distributed::Collective,
    workload: Option<&str>,
) -> Check {
    match crate::distributed::agree_listed(facts, group) {
        Ok(()) => Check::pass(
            "distributed",
            format!(
                "the {} ranks serve the same kernels{}",
                group.size(),
                workload.map_or_else(String::new, |w| format!(" for every bucket of {w}"))
            ),
        ),
        Err(e) => Check::fail(
            "distributed",
            e.to_string(),
            "give every rank the same policy, table and libraries; solve the table once and share it \
             (`distributed::solve_on_root`); ranks on different machines agree by capability group"
                .into(),
        ),
    }
}

impl LayerZero {
    /// Is this handle ready to serve? The plan it serves from (matches this machine, every
    /// kernel eligible and with an executor here, none needing JIT), the coverage of
    /// `workload`'s buckets by that plan, the shipped files and the PerfDB (`None`: the
    /// default path). Each failed check names its fix.
    pub fn readiness(&self, workload: Option<&crate::plan::workload::Workload>, perfdb: Option<&Path>) -> Vec<Check> {
        of_handle(self, workload, perfdb)
    }
}

/// Every shipped capability, hardware, policy and request file satisfies its schema.
fn schemas_check() -> Check {
    let files = files::shipped();
    let bad: Vec<String> =
        files.iter().filter(|f| !f.is_valid()).map(|f| format!("{}: {}", f.file, f.errors[0])).collect();
    if bad.is_empty() {
        Check::pass("schemas", format!("{} shipped files valid", files.len()))
    } else {
        Check::fail("schemas", bad.join("; "), "fix the files named (`lz validate` lists every violation)".into())
    }
}

fn capabilities_check(catalog: &Result<Arc<Catalog>>, checks: &mut Vec<Check>) -> Option<Arc<Catalog>> {
    match catalog {
        Ok(c) => {
            checks.push(Check::pass(
                "capabilities",
                format!("{} kernels, hash {}", c.kernels().count(), &c.hash()[..12]),
            ));
            Some(c.clone())
        }
        Err(e) => {
            checks.push(Check::fail(
                "capabilities",
                e.to_string(),
                "fix the capability file named above (`lz validate` lists every violation)".into(),
            ));
            None
        }
    }
}

/// The policy to serve with, with the knobs that override its fields or add rules; a
/// default policy without overrides is not worth a line of its own.
fn policy_check(path: Option<&Path>, overrides: &[FieldOverride], checks: &mut Vec<Check>) -> Option<Policy> {
    let mut policy = match path {
        None => Policy::default(),
        Some(p) => match Policy::load(p) {
            Ok(pol) => {
                checks.push(Check::pass("policy", format!("{} valid", p.display())));
                pol
            }
            Err(e) => {
                checks.push(Check::fail(
                    "policy",
                    e.to_string(),
                    format!("fix {} (see schemas/policy.schema.json)", p.display()),
                ));
                return None;
            }
        },
    };
    let applied = policy.apply_overrides(overrides);
    if !applied.is_empty() {
        let list: Vec<String> = applied.iter().map(|o| format!("{} from {}", o.field, o.knob)).collect();
        checks.push(Check::pass("policy_overrides", list.join(", ")));
    }
    Some(policy)
}

/// The selector a runtime on `hardware` (else this host) would build, its backends probed.
fn selector(catalog: Arc<Catalog>, hardware: Option<Arc<HardwareProfile>>, policy: Policy) -> Result<Selector> {
    let host = hardware.unwrap_or_else(|| Arc::new(detect::detect_host().profile));
    let availability = Arc::new(crate::host::probe::probe(&catalog, &host));
    Selector::new(catalog, host, Arc::new(policy), availability)
}

/// The table: readable, valid, made for this machine and these hashes, every kernel usable.
/// Returns the plan when the table matches the host.
/// What readiness asks of JIT kernels.
#[derive(Debug, Clone, Copy)]
struct Warm {
    require: bool,
    warmup: bool,
}

/// The representative request of every entry of the handle's table.
fn table_points(lz: &LayerZero) -> Vec<crate::runtime::WarmPoint> {
    lz.table()
        .map(|t| {
            t.entries
                .iter()
                .filter_map(|e| {
                    let request = crate::model::request::Request::from_value(e.request.clone()).ok()?;
                    Some(crate::runtime::WarmPoint { entry: e.entry.clone(), request })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A handle serving `table` on `sel`'s machine with this process's executors, warmed up
/// first when asked: the buckets whose JIT kernel is still cold.
fn cold_buckets(table: &DispatchTable, sel: &Selector, warmup: bool) -> std::result::Result<Vec<String>, String> {
    let lz = LayerZero::new(sel.clone(), crate::host::builtin_registry())
        .and_then(|lz| lz.with_plan(table, crate::runtime::PlanMode::Prefer))
        .map_err(|e| e.to_string())?;
    let points = table_points(&lz);
    if warmup {
        lz.warmup(&points);
    }
    Ok(lz.cold(&points))
}

fn table_checks(path: &Path, selector: Option<&Selector>, warm: Warm, checks: &mut Vec<Check>) -> Option<Plan> {
    let table = match DispatchTable::read(path) {
        Err(r) => {
            checks.push(Check::fail(
                "table",
                r.error.to_string(),
                format!("regenerate {} with `lz solve` (the `command` in a valid table's header)", path.display()),
            ));
            return None;
        }
        Ok(t) => t,
    };
    checks.push(Check::pass("table", format!("{} valid, {} entries", path.display(), table.entries.len())));
    let sel = selector?;
    match Plan::new(&table, sel) {
        Err(reason) => {
            checks.push(Check::fail(
                "table_matches_host",
                reason.to_string(),
                format!("re-solve on this machine with this policy: {}", table.header.command),
            ));
            None
        }
        Ok(p) => {
            checks.push(Check::pass(
                "table_matches_host",
                format!("hardware {}, capabilities and policy hashes match", table.header.hardware.name),
            ));
            let kernels = p.kernels();
            let registry = crate::host::builtin_registry();
            checks.push(kernels_check(&p, &kernels, |k| registry.contains(k)));
            let require = warm.require || sel.policy().require_warm;
            let jit = !jit_kernels(&kernels, sel.catalog()).is_empty();
            let cold = match (require || warm.warmup) && jit {
                false => None,
                true => match cold_buckets(&table, sel, warm.warmup) {
                    Ok(c) => Some(c),
                    Err(e) => Some(vec![format!("(no handle: {e})")]),
                },
            };
            checks.push(jit_check(&kernels, sel.catalog(), require, cold));
            Some(p)
        }
    }
}

/// Every kernel the plan serves is still eligible here and has an executor in this process.
fn kernels_check(plan: &Plan, kernels: &[&str], has_executor: impl Fn(&str) -> bool) -> Check {
    let mut problems: Vec<String> = plan
        .dropped()
        .iter()
        .map(|d| {
            // The first reason is the drop itself; the rest say why.
            let why: Vec<&str> = d.reasons.iter().skip(1).map(|r| r.code().as_str()).collect();
            format!("{} {} -> {} ({})", d.entry, d.bucket, d.kernel, why.join(", "))
        })
        .collect();
    for k in kernels {
        if !has_executor(k) {
            problems.push(format!("{k} has no executor in this process (EXECUTOR_NOT_REGISTERED)"));
        }
    }
    if problems.is_empty() {
        Check::pass("kernels", format!("{} kernels named, all eligible and executable here", kernels.len()))
    } else {
        Check::fail(
            "kernels",
            problems.join("; "),
            "install or register the backends named, or re-solve the table on this machine".into(),
        )
    }
}

fn jit_kernels<'k>(kernels: &[&'k str], catalog: &Catalog) -> Vec<&'k str> {
    kernels
        .iter()
        .filter(|k| catalog.find(k).is_some_and(|i| catalog.kernel(i).1.properties.needs_jit))
        .copied()
        .collect()
}

/// A kernel that compiles at first use stalls the first request unless it is warmed up;
/// with `require`, every bucket of such a kernel must be warm in this process (`cold`
/// lists those that are not).
fn jit_check(kernels: &[&str], catalog: &Catalog, require: bool, cold: Option<Vec<String>>) -> Check {
    let jit = jit_kernels(kernels, catalog);
    if jit.is_empty() {
        return Check::pass("jit", "no kernel in the table compiles at first use".into());
    }
    let cold = cold.unwrap_or_default();
    match (require, cold.is_empty()) {
        (true, false) => Check::fail(
            "jit",
            format!(
                "{} buckets of the table select a kernel that is not warm: {}{}",
                cold.len(),
                cold.iter().take(5).cloned().collect::<Vec<_>>().join("; "),
                if cold.len() > 5 { "; ..." } else { "" }
            ),
            "warm up at start (LayerZero::warmup with the table's entries, or `lz readiness-check --warmup`), or \
             deny JIT kernels in the policy (`allow_jit: false`) and re-solve"
                .into(),
        ),
        (true, true) => Check::pass(
            "jit",
            format!(
                "{} kernels of the table compile at first use ({}); every bucket of them is warm",
                jit.len(),
                jit[0]
            ),
        ),
        (false, _) => Check::pass(
            "jit",
            format!(
                "{} kernels of the table compile at first use ({}): warm them up before serving \
                 (`lz warmup --table`, LayerZero::warmup); `--require-warm` or the policy's `require_warm` checks it",
                jit.len(),
                jit[0]
            ),
        ),
    }
}

/// How many of the workload's buckets the plan serves; without a plan, none.
fn coverage_check(path: &Path, plan: Option<&Plan>) -> Check {
    match Workload::load(path).and_then(|w| w.points()) {
        Err(e) => Check::fail("workload", e.to_string(), format!("fix {}", path.display())),
        Ok(points) => coverage(&points, plan, &path.display().to_string()),
    }
}

fn coverage(points: &[crate::plan::workload::Point], plan: Option<&Plan>, workload: &str) -> Check {
    let covered = plan.map_or(0, |p| points.iter().filter(|pt| p.get(&pt.key).is_some()).count());
    let pct = if points.is_empty() { 100.0 } else { 100.0 * covered as f64 / points.len() as f64 };
    let detail = format!("{covered} of {} buckets ({pct:.1}%) served by the table", points.len());
    if covered == points.len() {
        Check::pass("coverage", detail)
    } else {
        Check::fail(
            "coverage",
            detail,
            format!("solve the table for this workload: lz solve --workload {workload} --out TABLE"),
        )
    }
}

/// PerfDB integrity. A missing file passes: selection then uses the cost model.
#[cfg(not(feature = "perfdb"))]
fn perfdb_check(db_path: &Path) -> Check {
    let why = "this build has no PerfDB (cargo feature `perfdb`): selection uses the cost model";
    Check::pass("perfdb", format!("{} not read: {why}", db_path.display()))
}

#[cfg(feature = "perfdb")]
fn perfdb_check(db_path: &Path) -> Check {
    use crate::perfdb::PerfDb;
    if !db_path.exists() {
        return Check::pass("perfdb", format!("{} absent (selection uses the cost model)", db_path.display()));
    }
    match PerfDb::open(db_path).and_then(|o| Ok((o.db.stats()?, o.recovered))) {
        Ok((stats, None)) if stats.integrity == "ok" => Check::pass(
            "perfdb",
            format!(
                "{} ok, {} rows, {} parity records ({} failed: refused by selection unless allow_parity_failed lists them)",
                db_path.display(),
                stats.rows,
                stats.parity_records,
                stats.parity_failed
            ),
        ),
        Ok((stats, None)) => Check::fail(
            "perfdb",
            format!("{}: integrity check: {}", db_path.display(), stats.integrity),
            "move the file aside and re-run `lz tune`".into(),
        ),
        Ok((_, Some(r))) => Check::fail(
            "perfdb",
            format!(
                "{} was damaged ({}); moved aside to {} and rebuilt empty",
                db_path.display(),
                r.why,
                r.moved_to.display()
            ),
            "re-run `lz tune --workload FILE` to measure again".into(),
        ),
        Err(e) => Check::fail("perfdb", e.to_string(), "check the path's permissions".into()),
    }
}
