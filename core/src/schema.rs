//! JSON Schemas (draft 2020-12) of every file format and `--json` output, compiled in from
//! `schemas/` and enforced with the `jsonschema` crate.

use std::sync::OnceLock;

use crate::error::{Error, ErrorKind, Result};

/// The documents LayerZero reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaKind {
    /// `capabilities/*.json`.
    Capabilities,
    /// `capabilities/hardware/*.json`.
    Hardware,
    /// Policy files.
    Policy,
    /// Request files.
    Request,
    /// `lz explain --json`.
    SelectionReport,
    /// `lz doctor --json`.
    Doctor,
    /// `lz list-kernels --json`.
    ListKernels,
    /// `lz which --json`.
    Which,
    /// `lz validate --json`.
    Validate,
    /// `lz hardware --json`.
    HardwareReport,
    /// `schemas/reason_codes.json`, `lz reason-codes --json`.
    ReasonCodes,
    /// `lz run --json`.
    RunReport,
    /// `lz snapshot --json`.
    SnapshotReport,
    /// `lz parity --json`.
    ParityReport,
    /// Workload files (`lz tune`, `lz solve`).
    Workload,
    /// Dispatch tables (`dispatch_tables/*.json`).
    DispatchTable,
    /// `lz tune --json`.
    TuneReport,
    /// `lz solve --json`.
    SolveReport,
    /// `lz readiness-check --json`.
    ReadinessReport,
    /// `lz generate --json`.
    GenerateReport,
    /// `lz diff --json`.
    DiffReport,
    /// `lz bench-select --json`.
    BenchSelectReport,
}

impl SchemaKind {
    /// Every kind.
    pub const ALL: [SchemaKind; 22] = [
        SchemaKind::Capabilities,
        SchemaKind::Hardware,
        SchemaKind::Policy,
        SchemaKind::Request,
        SchemaKind::SelectionReport,
        SchemaKind::Doctor,
        SchemaKind::ListKernels,
        SchemaKind::Which,
        SchemaKind::Validate,
        SchemaKind::HardwareReport,
        SchemaKind::ReasonCodes,
        SchemaKind::RunReport,
        SchemaKind::SnapshotReport,
        SchemaKind::ParityReport,
        SchemaKind::Workload,
        SchemaKind::DispatchTable,
        SchemaKind::TuneReport,
        SchemaKind::SolveReport,
        SchemaKind::ReadinessReport,
        SchemaKind::GenerateReport,
        SchemaKind::DiffReport,
        SchemaKind::BenchSelectReport,
    ];

    /// The schema file name in `schemas/`.
    pub fn file_name(self) -> &'static str {
        match self {
            SchemaKind::Capabilities => "capabilities.schema.json",
            SchemaKind::Hardware => "hardware.schema.json",
            SchemaKind::Policy => "policy.schema.json",
            SchemaKind::Request => "request.schema.json",
            SchemaKind::SelectionReport => "selection_report.schema.json",
            SchemaKind::Doctor => "doctor.schema.json",
            SchemaKind::ListKernels => "list_kernels.schema.json",
            SchemaKind::Which => "which.schema.json",
            SchemaKind::Validate => "validate.schema.json",
            SchemaKind::HardwareReport => "hardware_report.schema.json",
            SchemaKind::ReasonCodes => "reason_codes.schema.json",
            SchemaKind::RunReport => "run_report.schema.json",
            SchemaKind::SnapshotReport => "snapshot_report.schema.json",
            SchemaKind::ParityReport => "parity_report.schema.json",
            SchemaKind::Workload => "workload.schema.json",
            SchemaKind::DispatchTable => "dispatch_table.schema.json",
            SchemaKind::TuneReport => "tune_report.schema.json",
            SchemaKind::SolveReport => "solve_report.schema.json",
            SchemaKind::ReadinessReport => "readiness_report.schema.json",
            SchemaKind::GenerateReport => "generate_report.schema.json",
            SchemaKind::DiffReport => "diff_report.schema.json",
            SchemaKind::BenchSelectReport => "bench_select_report.schema.json",
        }
    }

    /// The schema text.
    pub fn text(self) -> &'static str {
        match self {
            SchemaKind::Capabilities => include_str!("../../schemas/capabilities.schema.json"),
            SchemaKind::Hardware => include_str!("../../schemas/hardware.schema.json"),
            SchemaKind::Policy => include_str!("../../schemas/policy.schema.json"),
            SchemaKind::Request => include_str!("../../schemas/request.schema.json"),
            SchemaKind::SelectionReport => include_str!("../../schemas/selection_report.schema.json"),
            SchemaKind::Doctor => include_str!("../../schemas/doctor.schema.json"),
            SchemaKind::ListKernels => include_str!("../../schemas/list_kernels.schema.json"),
            SchemaKind::Which => include_str!("../../schemas/which.schema.json"),
            SchemaKind::Validate => include_str!("../../schemas/validate.schema.json"),
            SchemaKind::HardwareReport => include_str!("../../schemas/hardware_report.schema.json"),
            SchemaKind::ReasonCodes => include_str!("../../schemas/reason_codes.schema.json"),
            SchemaKind::RunReport => include_str!("../../schemas/run_report.schema.json"),
            SchemaKind::SnapshotReport => include_str!("../../schemas/snapshot_report.schema.json"),
            SchemaKind::ParityReport => include_str!("../../schemas/parity_report.schema.json"),
            SchemaKind::Workload => include_str!("../../schemas/workload.schema.json"),
            SchemaKind::DispatchTable => include_str!("../../schemas/dispatch_table.schema.json"),
            SchemaKind::TuneReport => include_str!("../../schemas/tune_report.schema.json"),
            SchemaKind::SolveReport => include_str!("../../schemas/solve_report.schema.json"),
            SchemaKind::ReadinessReport => include_str!("../../schemas/readiness_report.schema.json"),
            SchemaKind::GenerateReport => include_str!("../../schemas/generate_report.schema.json"),
            SchemaKind::DiffReport => include_str!("../../schemas/diff_report.schema.json"),
            SchemaKind::BenchSelectReport => include_str!("../../schemas/bench_select_report.schema.json"),
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

type Compiled = std::result::Result<jsonschema::Validator, String>;

fn validator(kind: SchemaKind) -> std::result::Result<&'static jsonschema::Validator, String> {
    static VALIDATORS: [OnceLock<Compiled>; SchemaKind::ALL.len()] = [const { OnceLock::new() }; SchemaKind::ALL.len()];
    VALIDATORS[kind.slot()]
        .get_or_init(|| {
            let schema: serde_json::Value = serde_json::from_str(kind.text())
                .map_err(|e| format!("schemas/{} is not JSON: {e}", kind.file_name()))?;
            jsonschema::draft202012::new(&schema)
                .map_err(|e| format!("schemas/{} is not a valid schema: {e}", kind.file_name()))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Every violation of `kind`'s schema in `value`, as `path: message` lines.
pub fn violations(kind: SchemaKind, value: &serde_json::Value) -> Result<Vec<String>> {
    let v = validator(kind).map_err(|e| Error::new(ErrorKind::Schema, e))?;
    Ok(v.iter_errors(value).map(|e| describe(&e)).collect())
}

/// `path: message` for one violation. A value that matches none of an `anyOf` / `oneOf`'s
/// alternatives is described by the deepest failure among them (`/attrs/causal: "yes" is
/// not of type "boolean"`), so the message names the field rather than only its parent.
fn describe(e: &jsonschema::ValidationError<'_>) -> String {
    let at = |path: String| if path.is_empty() { "/".to_owned() } else { path };
    let parent = e.instance_path().to_string();
    let deepest = match e.kind() {
        jsonschema::error::ValidationErrorKind::AnyOf { context }
        | jsonschema::error::ValidationErrorKind::OneOfNotValid { context } => {
            context.iter().flatten().max_by_key(|sub| sub.instance_path().to_string().len())
        }
        _ => None,
    };
    match deepest {
        Some(sub) if sub.instance_path().to_string().len() > parent.len() => {
            format!(
                "{}: {} (no alternative for {} matches)",
                at(sub.instance_path().to_string()),
                describe_leaf(sub),
                at(parent)
            )
        }
        _ => format!("{}: {e}", at(parent)),
    }
}

fn describe_leaf(e: &jsonschema::ValidationError<'_>) -> String {
    e.to_string()
}

/// Checks `value` against `kind`'s schema; the error names the file, the field and the rule.
pub fn validate(kind: SchemaKind, value: &serde_json::Value, origin: &str) -> Result<()> {
    let errs = violations(kind, value)?;
    match errs.first() {
        None => Ok(()),
        Some(first) => {
            let more = if errs.len() > 1 { format!(" (and {} more)", errs.len() - 1) } else { String::new() };
            Err(Error::new(ErrorKind::Schema, format!("{origin}: schema violation at {first}{more}")))
        }
    }
}
