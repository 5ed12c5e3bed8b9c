//! `lz validate`: schema-check files, naming the file, the field and the rule.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{Outcome, print_json};
use crate::capabilities::catalog::Catalog;
use crate::error::{Error, ErrorKind, Result};
use crate::hardware::named;
use crate::hardware::profile::HardwareProfile;
use crate::model::problem::Problem;
use crate::model::request::Request;
use crate::policy::Policy;
use crate::schema::{self, SchemaKind};

struct Checked {
    file: String,
    kind: &'static str,
    errors: Vec<String>,
}

/// Checks `files`, or every shipped capability and hardware file when `files` is empty.
pub(super) fn run(files: &[PathBuf], json: bool) -> Result<Outcome> {
    let mut results = Vec::new();
    if files.is_empty() {
        results.extend(shipped());
    }
    for path in files {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot read {}: {e}", path.display())))?;
        results.push(check_file(path, &text));
    }
    let ok = results.iter().all(|r| r.errors.is_empty());
    if json {
        let items: Vec<serde_json::Value> = results
            .iter()
            .map(|r| serde_json::json!({"file": r.file, "kind": r.kind, "valid": r.errors.is_empty(), "errors": r.errors}))
            .collect();
        print_json(&serde_json::json!({"valid": ok, "files": items}));
    } else {
        let mut out = String::new();
        for r in &results {
            if r.errors.is_empty() {
                let _ = writeln!(out, "ok       {:<13} {}", r.kind, r.file);
            } else {
                for e in &r.errors {
                    let _ = writeln!(out, "INVALID  {:<13} {e}", r.kind);
                }
            }
        }
        let bad = results.iter().filter(|r| !r.errors.is_empty()).count();
        let _ = writeln!(out, "{} files checked, {bad} invalid", results.len());
        print!("{out}");
    }
    Ok(if ok { Outcome::Ok } else { Outcome::CheckFailed })
}

/// Every shipped capability file, the catalog they form, and every shipped hardware profile.
pub(super) fn shipped_results() -> Vec<(String, &'static str, Vec<String>)> {
    shipped().into_iter().map(|c| (c.file, c.kind, c.errors)).collect()
}

fn shipped() -> Vec<Checked> {
    let mut out = Vec::new();
    match Catalog::builtin() {
        Ok(c) => out.push(Checked {
            file: format!("capabilities/ ({} backends, {} kernels)", c.backends().len(), c.len()),
            kind: "capabilities",
            errors: Vec::new(),
        }),
        Err(e) => {
            out.push(Checked { file: "capabilities/".to_owned(), kind: "capabilities", errors: vec![e.to_string()] })
        }
    }
    for (name, text) in named::builtin_files() {
        let origin = format!("capabilities/hardware/{name}");
        out.push(check_text(&origin, text, Kind::Hardware));
    }
    out
}

#[derive(Clone, Copy)]
enum Kind {
    Capabilities,
    Hardware,
    Policy,
    Request,
    Workload,
    DispatchTable,
}

fn detect_kind(path: &Path, value: &serde_json::Value) -> Option<Kind> {
    let in_hardware_dir = path.parent().and_then(|p| p.file_name()).is_some_and(|n| n == "hardware");
    if in_hardware_dir || value.get("devices").is_some() {
        Some(Kind::Hardware)
    } else if value.get("kernels").is_some() {
        Some(Kind::Capabilities)
    } else if value.get("header").is_some() && value.get("entries").is_some() {
        Some(Kind::DispatchTable)
    } else if value.get("entries").is_some() {
        Some(Kind::Workload)
    } else if value.get("op").is_some() {
        Some(Kind::Request)
    } else if value.is_object() && value.get("rules").is_some() || value.get("strict_mode").is_some() {
        Some(Kind::Policy)
    } else {
        None
    }
}

fn check_file(path: &Path, text: &str) -> Checked {
    let origin = path.display().to_string();
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return Checked {
                file: origin.clone(),
                kind: "json",
                errors: vec![format!("{origin}: invalid JSON: {e}")],
            };
        }
    };
    match detect_kind(path, &value) {
        Some(kind) => check_text(&origin, text, kind),
        None => Checked {
            file: origin.clone(),
            kind: "unknown",
            errors: vec![format!(
                "{origin}: cannot tell what this file is (a capability file has `kernels`, a hardware profile `devices`, a request `op`, a policy `rules`, a workload `entries`, a dispatch table `header` and `entries`)"
            )],
        },
    }
}

fn check_text(origin: &str, text: &str, kind: Kind) -> Checked {
    let (name, result): (&'static str, Result<()>) = match kind {
        Kind::Capabilities => {
            ("capabilities", Catalog::from_texts(&[(origin.to_owned(), text.to_owned())]).map(|_| ()))
        }
        Kind::Hardware => ("hardware", check_hardware(origin, text)),
        Kind::Policy => ("policy", Policy::from_json(text, origin).map(|_| ())),
        Kind::Request => ("request", check_request(origin, text)),
        Kind::Workload => {
            ("workload", crate::plan::workload::Workload::from_json(text, origin).and_then(|w| w.points()).map(|_| ()))
        }
        Kind::DispatchTable => {
            ("table", crate::plan::table::DispatchTable::parse(text, origin).map(|_| ()).map_err(|r| r.error))
        }
    };
    Checked {
        file: origin.to_owned(),
        kind: name,
        errors: result.err().map(|e| vec![e.to_string()]).unwrap_or_default(),
    }
}

fn check_hardware(origin: &str, text: &str) -> Result<()> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
    schema::validate(SchemaKind::Hardware, &value, origin)?;
    HardwareProfile::from_json(text, origin).map(|_| ())
}

fn check_request(origin: &str, text: &str) -> Result<()> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
    schema::validate(SchemaKind::Request, &value, origin)?;
    let req = Request::from_json(text).map_err(|e| Error::invalid(format!("{origin}: {e}")))?;
    let problem = Problem::describe(&req);
    match problem.errors.first() {
        None => Ok(()),
        Some(e) => Err(Error::invalid(format!("{origin}: {e}"))),
    }
}
