//! The `lz` command line. Every command has `--json`; exit 0 ok, 1 check failed,
//! 2 usage, configuration or input error. Errors print as one line, never a panic.

mod args;
mod bench;
mod classify;
mod diff;
mod doctor;
mod generate;
mod inspect;
pub mod parity;
mod plan;
mod plugins;
mod profile;
mod ranks;
mod render;
mod run;
mod soak;
pub mod tune;
mod validate;
mod warmup;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use args::{CatalogArg, Cli, Command};
use layerzero::capabilities::catalog::Catalog;
use layerzero::error::{Error, Result};
use layerzero::hardware::named;
use layerzero::host::detect;
use layerzero::knobs::Settings;
use layerzero::model::op::Op;
use layerzero::model::request::Request;
use layerzero::policy::Policy;
use layerzero::schema::{self, SchemaKind};
use layerzero::select::Selector;

/// What a unit test, or a helper of one, returns: a failed call is an `Err` the harness
/// prints, not a panic.
#[cfg(test)]
type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// What a command reports back to `main`.
enum Outcome {
    Ok,
    CheckFailed,
    /// The input was wrong; the output (e.g. a JSON report) was already printed.
    InputError,
}

/// Runs `lz` with the process arguments.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // Kernel panics are caught and reported by the runtime; keep the default hook from
    // printing them (and their backtraces) on the way.
    std::panic::set_hook(Box::new(|_| {}));
    // A bad knob is a usage error naming it, before anything runs; `doctor` and `hardware`
    // report bad knobs instead (and run with their defaults).
    if !matches!(cli.command, Command::Doctor(_) | Command::Hardware(_))
        && let Err(e) = Settings::from_env()
    {
        eprintln!("lz: error: {e}");
        return ExitCode::from(2);
    }
    // LAYERZERO_LOG / LAYERZERO_OTEL: the log and span export, flushed when `_telemetry` drops.
    let _telemetry = match layerzero::telemetry::init(knobs()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("lz: error: {e}");
            return ExitCode::from(2);
        }
    };
    let result = std::panic::catch_unwind(|| run(cli));
    match result {
        Ok(Ok(Outcome::Ok)) => ExitCode::SUCCESS,
        Ok(Ok(Outcome::CheckFailed)) => ExitCode::from(1),
        Ok(Ok(Outcome::InputError)) => ExitCode::from(2),
        Ok(Err(e)) => {
            eprintln!("lz: error: {e}");
            ExitCode::from(2)
        }
        Err(payload) => {
            // `lz which ... | head -1`: the reader went away; that is not our failure.
            let msg = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or_default();
            if msg.contains("Broken pipe") {
                return ExitCode::SUCCESS;
            }
            eprintln!("lz: internal error (a bug in LayerZero; please report it with the command you ran)");
            ExitCode::from(2)
        }
    }
}

/// The knobs of this process (checked in `main`).
fn knobs() -> &'static Settings {
    layerzero::host::process()
}

fn run(cli: Cli) -> Result<Outcome> {
    match cli.command {
        Command::Explain(a) => inspect::explain(a, false),
        Command::Which(a) => inspect::explain(a, true),
        Command::ListKernels(a) => inspect::list_kernels(a),
        Command::Validate(a) => validate::run(&a.files, a.json),
        Command::Hardware(a) => inspect::hardware(a),
        Command::Doctor(a) => doctor::run(load_catalog(&a.catalog)?, a.json, a.perfdb.as_deref()),
        Command::Run(a) => {
            let policy = a.policy.clone().or_else(|| knobs().policy.clone());
            let policy = policy.as_deref().map(load_policy).transpose()?;
            let catalog = load_catalog(&a.catalog)?;
            let table = a.table.clone().or_else(|| knobs().dispatch_table.clone());
            let plan_mode = a.plan_mode.unwrap_or(knobs().plan_mode);
            let go = || {
                run::run(
                    run::RunArgs {
                        request: &a.request,
                        inputs: &a.inputs,
                        out: &a.out,
                        kernel: a.kernel.as_deref(),
                        policy,
                        repeat: a.repeat,
                        table: table.as_deref(),
                        plan_mode,
                        json: a.json,
                    },
                    catalog,
                )
            };
            match &a.trace {
                Some(path) => traced(path, go),
                None => go(),
            }
        }
        Command::Tune(a) => tune::run(a),
        Command::Parity(a) => {
            let op = a.op.as_deref().map(parse_op).transpose()?;
            let record = a.record.then(|| a.perfdb.clone().unwrap_or_else(|| knobs().perfdb_path()));
            parity::command::run(load_catalog(&a.catalog)?, op, a.kernel.as_deref(), a.json, record.as_deref())
        }
        Command::Solve(a) => {
            let sel = selector(a.hardware.as_deref(), a.policy.as_ref(), load_catalog(&a.catalog)?)?;
            let command =
                std::iter::once("lz".to_owned()).chain(std::env::args().skip(1)).collect::<Vec<_>>().join(" ");
            plan::solve(
                plan::SolveArgs {
                    workload: &a.workload,
                    out: &a.out,
                    perfdb: a.perfdb.as_deref(),
                    no_perfdb: a.no_perfdb,
                    json: a.json,
                },
                sel,
                command,
            )
        }
        Command::ReadinessCheck(a) => plan::readiness(
            plan::ReadinessArgs {
                table: a.table.clone().or_else(|| knobs().dispatch_table.clone()).as_deref(),
                policy: a.policy.clone().or_else(|| knobs().policy.clone()).as_deref(),
                workload: a.workload.as_deref(),
                perfdb: a.perfdb.as_deref(),
                require_warm: a.require_warm,
                warmup: a.warmup,
                json: a.json,
            },
            load_catalog(&a.catalog),
        ),
        Command::Warmup(a) => warmup::run(warmup::WarmupArgs {
            workload: a.workload.as_deref(),
            table: a.table.as_deref(),
            verify: a.verify,
            json: a.json,
        }),
        Command::Generate(a) => generate::generate(*a),
        Command::Classify(a) => classify::classify(a),
        Command::Diff(a) => diff::diff(a),
        Command::Snapshot(a) => snapshot(a),
        Command::Workload(a) => generate::workload(a),
        Command::Lock(a) => plugins::lock(&a),
        Command::Plugin(a) => plugins::plugin(&a),
        Command::BenchSelect(a) => bench::run(bench::BenchArgs {
            threads: a.threads,
            seconds: a.seconds,
            workload: a.workload,
            random_shapes: a.random_shapes,
            max_rss_growth_mb: a.max_rss_growth_mb,
            json: a.json,
        }),
        Command::ReasonCodes(a) => {
            if a.json {
                print_json(&layerzero::reason::reason_codes_document());
            } else {
                print!("{}", render::reason_codes());
            }
            Ok(Outcome::Ok)
        }
    }
}

/// `lz snapshot DIR`: the host handle (knobs honoured), the workload's requests selected
/// first when one is given, then `LayerZero::snapshot`.
fn snapshot(a: args::SnapshotCmd) -> Result<Outcome> {
    let lz = layerzero::runtime::LayerZero::host()?;
    let select_workload = || -> Result<()> {
        if let Some(path) = &a.workload {
            let w = layerzero::plan::workload::Workload::load(path)?;
            for e in &w.entries {
                let req = Request::from_value(e.request.clone())
                    .map_err(|err| Error::invalid(format!("{}: entry {:?}: {err}", path.display(), e.name)))?;
                // A request nothing can serve is a decision worth keeping too; it is not an error here.
                let _ = lz.select(&req);
            }
        }
        Ok(())
    };
    // With OpenTelemetry in the build, the workload's spans are kept as the snapshot's trace.
    #[cfg(feature = "otel")]
    let trace = {
        let (selected, trace) = layerzero::telemetry::otel::capture(select_workload);
        selected?;
        a.workload.is_some().then_some(trace)
    };
    #[cfg(not(feature = "otel"))]
    let trace: Option<serde_json::Value> = select_workload().map(|()| None)?;
    let manifest = lz.snapshot_with_trace(&a.dir, a.perfdb.as_deref(), trace.as_ref())?;
    if a.json {
        print_json(&serde_json::to_value(&manifest).unwrap_or_default());
    } else {
        println!("snapshot: {}", manifest.dir);
        for f in &manifest.files {
            println!("  {:<24} {:>10} bytes  {}", f.name, f.bytes, f.what);
        }
        for n in &manifest.notes {
            println!("  note: {n}");
        }
    }
    Ok(Outcome::Ok)
}

/// Runs `f` with its spans captured, then writes them to `path` as OTLP/JSON (a failed run's
/// spans too: they say what failed).
#[cfg(feature = "otel")]
fn traced(path: &std::path::Path, f: impl FnOnce() -> Result<Outcome>) -> Result<Outcome> {
    let (outcome, trace) = layerzero::telemetry::otel::capture(f);
    let mut bytes = serde_json::to_vec_pretty(&trace).unwrap_or_default();
    bytes.push(b'\n');
    layerzero::files::write(path, &bytes, &[])?;
    outcome
}

/// Without OpenTelemetry in the build, `--trace` is refused rather than ignored.
#[cfg(not(feature = "otel"))]
fn traced(path: &std::path::Path, _f: impl FnOnce() -> Result<Outcome>) -> Result<Outcome> {
    Err(Error::invalid(format!(
        "--trace {}: this lz has no OpenTelemetry export (build it with the `otel` feature)",
        path.display()
    )))
}

fn load_catalog(arg: &CatalogArg) -> Result<Arc<Catalog>> {
    match &arg.capabilities {
        Some(dir) => Catalog::load_dir(dir).map(Arc::new),
        None => Catalog::builtin(),
    }
}

fn read_text(path: &str) -> Result<String> {
    if path == "-" {
        return layerzero::files::read_stdin("the request");
    }
    layerzero::files::read_to_string(std::path::Path::new(path))
}

/// Reads, schema-checks and parses a request file.
fn load_request(path: &str) -> Result<Request> {
    let text = read_text(path)?;
    let origin = if path == "-" { "request (stdin)" } else { path };
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
    schema::validate(SchemaKind::Request, &value, origin)?;
    Request::from_json(&text).map_err(|e| Error::invalid(format!("{origin}: {e}")))
}

fn load_policy(p: &std::path::Path) -> Result<Policy> {
    let text = read_text(&p.display().to_string())?;
    Policy::from_json(&text, &p.display().to_string())
}

fn parse_op(name: &str) -> Result<Op> {
    Op::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = Op::ALL.iter().map(|o| o.as_str()).collect();
        Error::invalid(format!("--op {name:?} is not an op (expected one of {})", names.join(", ")))
    })
}

/// The selector for `--hardware` (planning) or this host (probed), under `--policy`, else
/// `$LAYERZERO_POLICY`, else the default policy, with the knobs that override policy
/// fields and add rules (as `LayerZero::host` applies them).
fn selector(hardware: Option<&str>, policy: Option<&PathBuf>, catalog: Arc<Catalog>) -> Result<Selector> {
    let mut policy = match policy.or(knobs().policy.as_ref()) {
        Some(p) => load_policy(p)?,
        None => Policy::default(),
    };
    policy.apply_overrides(&knobs().policy_overrides());
    selector_with(hardware, policy, catalog)
}

/// The selector for `--hardware` (planning) or this host (probed), under `policy`.
fn selector_with(hardware: Option<&str>, policy: Policy, catalog: Arc<Catalog>) -> Result<Selector> {
    let policy = Arc::new(policy);
    match hardware {
        Some(h) => Selector::planning(catalog, Arc::new(named::load(h)?), policy),
        None => {
            let host = Arc::new(detect::detect_host().profile);
            let availability = Arc::new(layerzero::host::probe::probe(&catalog, &host));
            let book = host_parity(&catalog, &host)?;
            let selector = Selector::new(catalog, host, policy, availability)?;
            Ok(match book {
                Some(b) => selector.with_parity(Arc::new(b)),
                None => selector,
            })
        }
    }
}

/// This host's parity records in the PerfDB (`$LAYERZERO_PERFDB`, else
/// `$LAYERZERO_HOME/perfdb.sqlite`), as the runtime gates on them; none without a file or
/// with one of a newer layout.
fn host_parity(
    catalog: &Catalog,
    host: &layerzero::hardware::profile::HardwareProfile,
) -> Result<Option<layerzero::select::ParityBook>> {
    let path = knobs().perfdb_path();
    if !path.exists() {
        return Ok(None);
    }
    let Ok(opened) = layerzero::perfdb::PerfDb::open_for_reading(&path)? else { return Ok(None) };
    let records = opened.db.parity_for(&host.fingerprint)?;
    let book =
        layerzero::select::ParityBook::build(records.iter().map(layerzero::perfdb::ParityRecord::fact), catalog, host);
    Ok(Some(book))
}

fn print_json(v: &serde_json::Value) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("lz: error: cannot write JSON: {e}"),
    }
}
