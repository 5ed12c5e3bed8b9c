//! The `lz` command line. Every command has `--json`; exit 0 ok, 1 check failed,
//! 2 usage, configuration or input error. Errors print as one line, never a panic.

mod doctor;
mod parity;
mod plan;
mod render;
mod run;
mod tune;
mod validate;

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};

use crate::capabilities::catalog::Catalog;
use crate::error::{Error, ErrorKind, Result};
use crate::hardware::{detect, named};
use crate::model::op::Op;
use crate::model::request::Request;
use crate::policy::Policy;
use crate::schema::{self, SchemaKind};
use crate::select::{Availability, Selector};

/// LayerZero: selects the fastest valid kernel for an ML op on a machine, and says why.
#[derive(Parser, Debug)]
#[command(name = "lz", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Explain the selection for a request: the winner, then every candidate with its verdict.
    Explain(SelectArgs),
    /// Print the kernel id selected for a request (exit 1 when none qualifies).
    Which(SelectArgs),
    /// List the kernels of the catalog.
    ListKernels(ListArgs),
    /// Schema-check capability, hardware, policy and request files (all shipped files by default).
    Validate(ValidateArgs),
    /// Show a hardware profile (this host, detected, unless --hardware is given).
    Hardware(HardwareArgs),
    /// Check this installation: hardware, backends, files, one sample selection.
    Doctor(DoctorArgs),
    /// Print every reason code with its category and meaning.
    ReasonCodes(JsonArg),
    /// Run a request on this machine: load inputs, select (or force) a kernel, write outputs.
    Run(RunCmd),
    /// Check every executable kernel against cpu_reference over the case matrix.
    Parity(ParityArgs),
    /// Measure a workload's kernels on this machine into the PerfDB; --verify reports the regret.
    Tune(tune::TuneArgs),
    /// Bake a dispatch table: a decision for every bucket of a workload (PerfDB-backed when
    /// measurements exist).
    Solve(SolveCmd),
    /// Is this machine ready to serve? Schemas, table vs. host, kernels, coverage, PerfDB.
    /// Exit 0 ready, 1 not ready (every failure names its fix), 2 usage error.
    ReadinessCheck(ReadinessCmd),
}

#[derive(Args, Debug)]
struct SolveCmd {
    /// The workload file (schemas/workload.schema.json).
    #[arg(long, value_name = "FILE")]
    workload: PathBuf,
    /// Solve for a named hardware profile or a profile file instead of this host.
    #[arg(long, value_name = "NAME|PATH")]
    hardware: Option<String>,
    /// Policy file.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// PerfDB file (default $LAYERZERO_PERFDB, else $LAYERZERO_HOME/perfdb.sqlite).
    #[arg(long, value_name = "FILE", conflicts_with = "no_perfdb")]
    perfdb: Option<PathBuf>,
    /// Use the cost model only, ignoring any PerfDB.
    #[arg(long)]
    no_perfdb: bool,
    /// Where to write the table.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    #[command(flatten)]
    catalog: CatalogArg,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ReadinessCmd {
    /// The dispatch table to serve with.
    #[arg(long, value_name = "FILE")]
    table: Option<PathBuf>,
    /// The policy to serve with.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// The workload whose buckets the table must cover.
    #[arg(long, value_name = "FILE")]
    workload: Option<PathBuf>,
    /// PerfDB file (default $LAYERZERO_PERFDB, else $LAYERZERO_HOME/perfdb.sqlite).
    #[arg(long, value_name = "FILE")]
    perfdb: Option<PathBuf>,
    #[command(flatten)]
    catalog: CatalogArg,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct RunCmd {
    /// Request file (JSON), or - for standard input.
    #[arg(long, value_name = "FILE|-")]
    request: String,
    /// Input tensors (safetensors), named as in the request.
    #[arg(long, value_name = "IN.safetensors")]
    inputs: PathBuf,
    /// Where to write the outputs (`out`; RoPE also `out_k`).
    #[arg(long, value_name = "OUT.safetensors")]
    out: PathBuf,
    /// Run this kernel (it must still pass every check).
    #[arg(long, value_name = "ID")]
    kernel: Option<String>,
    /// Policy file.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Run the kernel N more times and report the median time.
    #[arg(long, default_value_t = 0, value_name = "N")]
    repeat: usize,
    /// Serve the selection from this dispatch table (`lz solve`); a miss selects live.
    /// Default: $LAYERZERO_DISPATCH_TABLE.
    #[arg(long, value_name = "FILE")]
    table: Option<PathBuf>,
    /// How to use the table: prefer (live on a miss or mismatch), strict (refuse), off.
    /// Default: $LAYERZERO_PLAN_MODE, else prefer.
    #[arg(long, value_name = "MODE")]
    plan_mode: Option<crate::exec::runtime::PlanMode>,
    #[command(flatten)]
    catalog: CatalogArg,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ParityArgs {
    /// Only this op.
    #[arg(long)]
    op: Option<String>,
    /// Only this kernel.
    #[arg(long, value_name = "ID")]
    kernel: Option<String>,
    #[command(flatten)]
    catalog: CatalogArg,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct JsonArg {
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct CatalogArg {
    /// Read capability files from this folder instead of the shipped ones.
    #[arg(long, value_name = "DIR")]
    capabilities: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct SelectArgs {
    /// Request file (JSON), or - for standard input.
    #[arg(long, value_name = "FILE|-")]
    request: String,
    /// Plan for a named hardware profile or a profile file instead of this host.
    #[arg(long, value_name = "NAME|PATH")]
    hardware: Option<String>,
    /// Policy file.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    #[command(flatten)]
    catalog: CatalogArg,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ListArgs {
    /// Only kernels of this op.
    #[arg(long)]
    op: Option<String>,
    /// Only kernels of this backend.
    #[arg(long)]
    backend: Option<String>,
    #[command(flatten)]
    catalog: CatalogArg,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ValidateArgs {
    /// Files to check; the kind is read from the path or the content.
    files: Vec<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct HardwareArgs {
    /// A named profile or a profile file instead of this host.
    #[arg(long, value_name = "NAME|PATH")]
    hardware: Option<String>,
    /// List the shipped profile names.
    #[arg(long)]
    list: bool,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct DoctorArgs {
    #[command(flatten)]
    catalog: CatalogArg,
    /// Check this PerfDB file instead of $LAYERZERO_PERFDB (default $LAYERZERO_HOME/perfdb.sqlite).
    #[arg(long, value_name = "FILE")]
    perfdb: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

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

fn run(cli: Cli) -> Result<Outcome> {
    match cli.command {
        Command::Explain(a) => explain(a, false),
        Command::Which(a) => explain(a, true),
        Command::ListKernels(a) => list_kernels(a),
        Command::Validate(a) => validate::run(&a.files, a.json),
        Command::Hardware(a) => hardware(a),
        Command::Doctor(a) => doctor::run(load_catalog(&a.catalog)?, a.json, a.perfdb.as_deref()),
        Command::Run(a) => {
            let policy = a.policy.clone().or_else(crate::knobs::policy);
            let policy = policy.as_deref().map(load_policy).transpose()?;
            let catalog = load_catalog(&a.catalog)?;
            let table = a.table.clone().or_else(crate::knobs::dispatch_table);
            let plan_mode = match a.plan_mode {
                Some(m) => m,
                None => crate::knobs::plan_mode()?,
            };
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
        }
        Command::Tune(a) => tune::run(a),
        Command::Parity(a) => {
            let op = a.op.as_deref().map(parse_op).transpose()?;
            parity::run(load_catalog(&a.catalog)?, op, a.kernel.as_deref(), a.json)
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
                table: a.table.clone().or_else(crate::knobs::dispatch_table).as_deref(),
                policy: a.policy.clone().or_else(crate::knobs::policy).as_deref(),
                workload: a.workload.as_deref(),
                perfdb: a.perfdb.as_deref(),
                json: a.json,
            },
            load_catalog(&a.catalog),
        ),
        Command::ReasonCodes(a) => {
            if a.json {
                print_json(&crate::reason::reason_codes_document());
            } else {
                print!("{}", render::reason_codes());
            }
            Ok(Outcome::Ok)
        }
    }
}

fn load_catalog(arg: &CatalogArg) -> Result<Arc<Catalog>> {
    match &arg.capabilities {
        Some(dir) => Catalog::load_dir(dir).map(Arc::new),
        None => Catalog::builtin(),
    }
}

fn read_text(path: &str) -> Result<String> {
    if path == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot read the request from standard input: {e}")))?;
        return Ok(s);
    }
    std::fs::read_to_string(path).map_err(|e| Error::new(ErrorKind::Io, format!("cannot read {path}: {e}")))
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
/// `$LAYERZERO_POLICY`, else the default policy.
fn selector(hardware: Option<&str>, policy: Option<&PathBuf>, catalog: Arc<Catalog>) -> Result<Selector> {
    let from_env = crate::knobs::policy();
    let policy = match policy.or(from_env.as_ref()) {
        Some(p) => load_policy(p)?,
        None => Policy::default(),
    };
    selector_with(hardware, policy, catalog)
}

/// The selector for `--hardware` (planning) or this host (probed), under `policy`.
fn selector_with(hardware: Option<&str>, policy: Policy, catalog: Arc<Catalog>) -> Result<Selector> {
    let policy = Arc::new(policy);
    match hardware {
        Some(h) => Selector::planning(catalog, Arc::new(named::load(h)?), policy),
        None => {
            let host = Arc::new(detect::detect_host().profile);
            let availability = Arc::new(Availability::probe_host(&catalog, &host, &[]));
            Selector::new(catalog, host, policy, availability)
        }
    }
}

fn explain(a: SelectArgs, which: bool) -> Result<Outcome> {
    let request = load_request(&a.request)?;
    let sel = selector(a.hardware.as_deref(), a.policy.as_ref(), load_catalog(&a.catalog)?)?;
    let report = sel.explain(&request);
    if a.json {
        if which {
            print_json(&serde_json::json!({
                "selected": report.selected,
                "hardware": report.hardware,
                "request_errors": report.request_errors,
            }));
        } else {
            print_json(&report.to_json());
        }
    } else if which {
        match &report.selected {
            Some(k) => println!("{k}"),
            None => eprintln!("{}", render::no_selection_line(&report)),
        }
    } else {
        print!("{}", render::explain(&report));
    }
    if !report.request_errors.is_empty() {
        if !a.json {
            return Err(Error::invalid(format!("invalid request: {}", report.request_errors[0])));
        }
        return Ok(Outcome::InputError);
    }
    Ok(if report.selected.is_some() { Outcome::Ok } else { Outcome::CheckFailed })
}

fn list_kernels(a: ListArgs) -> Result<Outcome> {
    let catalog = load_catalog(&a.catalog)?;
    let op = a.op.as_deref().map(parse_op).transpose()?;
    if let Some(b) = &a.backend
        && catalog.backend(b).is_none()
    {
        let names: Vec<&str> = catalog.backends().iter().map(|b| b.backend.as_str()).collect();
        return Err(Error::invalid(format!("--backend {b:?} is not a backend (expected one of {})", names.join(", "))));
    }
    let rows: Vec<_> = catalog
        .kernels()
        .filter(|(_, b, k)| op.is_none_or(|o| k.op == o) && a.backend.as_ref().is_none_or(|n| &b.backend == n))
        .collect();
    if a.json {
        let items: Vec<serde_json::Value> = rows
            .iter()
            .map(|(_, b, k)| {
                serde_json::json!({
                    "kernel": k.id,
                    "backend": b.backend,
                    "op": k.op,
                    "device": k.device_kind(b),
                    "execution": b.execution,
                    "version": k.version.as_deref().unwrap_or(&b.version),
                    "properties": k.properties,
                })
            })
            .collect();
        print_json(&serde_json::json!({ "capabilities_hash": catalog.hash(), "kernels": items }));
    } else {
        print!("{}", render::kernel_table(&rows));
    }
    Ok(Outcome::Ok)
}

fn hardware(a: HardwareArgs) -> Result<Outcome> {
    if a.list {
        let names = named::builtin_names();
        if a.json {
            print_json(&serde_json::json!({ "profiles": names }));
        } else {
            println!("{}", names.join("\n"));
        }
        return Ok(Outcome::Ok);
    }
    let (profile, notes) = match &a.hardware {
        Some(h) => (named::load(h)?, Vec::new()),
        None => {
            let d = detect::detect_host();
            (d.profile, d.notes)
        }
    };
    if a.json {
        let mut v = profile.to_file_json();
        v["fingerprint"] = serde_json::Value::String(profile.fingerprint.clone());
        v["notes"] = serde_json::json!(notes);
        print_json(&v);
    } else {
        print!("{}", render::hardware(&profile, &notes));
    }
    Ok(Outcome::Ok)
}

fn print_json(v: &serde_json::Value) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("lz: error: cannot write JSON: {e}"),
    }
}
