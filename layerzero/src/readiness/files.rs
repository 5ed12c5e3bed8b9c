//! Schema checks of single files and of the shipped ones, as data: `lz validate`,
//! `lz doctor` and `lz readiness-check` all report from these.

use std::path::Path;

use serde::Serialize;

use crate::capabilities::catalog::Catalog;
use crate::error::{Error, Result};
use crate::hardware::named;
use crate::hardware::profile::HardwareProfile;
use crate::model::problem::Problem;
use crate::model::request::Request;
use crate::plan::table::DispatchTable;
use crate::plan::workload::Workload;
use crate::policy::Policy;
use crate::schema::{self, SchemaKind};

/// The verdict on one file.
#[derive(Debug, Clone, Serialize)]
pub struct FileCheck {
    /// The file, as named to the user.
    pub file: String,
    /// What the file was read as: `capabilities`, `hardware`, `policy`, `request`,
    /// `workload`, `table`, or `json` / `unknown` when that could not be told.
    pub kind: &'static str,
    /// Every violation found; empty when the file is valid.
    pub errors: Vec<String>,
}

impl FileCheck {
    /// No violation.
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }
}

/// The shipped capability files (as the one catalog they form) and every shipped hardware
/// profile.
pub fn shipped() -> Vec<FileCheck> {
    let mut out = Vec::new();
    match Catalog::builtin() {
        Ok(c) => out.push(FileCheck {
            file: format!("capabilities/ ({} backends, {} kernels)", c.backends().len(), c.len()),
            kind: "capabilities",
            errors: Vec::new(),
        }),
        Err(e) => {
            out.push(FileCheck { file: "capabilities/".to_owned(), kind: "capabilities", errors: vec![e.to_string()] })
        }
    }
    for (name, text) in named::builtin_files() {
        let origin = format!("capabilities/hardware/{name}");
        out.push(check_text(&origin, text, Kind::Hardware));
    }
    out
}

/// Checks the file at `path` whose content is `text`; the kind is read from the path (a
/// `hardware/` folder) or the content's top-level fields.
pub fn check_file(path: &Path, text: &str) -> FileCheck {
    let origin = path.display().to_string();
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return FileCheck {
                file: origin.clone(),
                kind: "json",
                errors: vec![format!("{origin}: invalid JSON: {e}")],
            };
        }
    };
    match detect_kind(path, &value) {
        Some(kind) => check_text(&origin, text, kind),
        None => FileCheck {
            file: origin.clone(),
            kind: "unknown",
            errors: vec![format!(
                "{origin}: cannot tell what this file is (a capability file has `kernels`, a hardware profile `devices`, a request `op`, a policy `rules`, a workload `entries`, a dispatch table `header` and `entries`)"
            )],
        },
    }
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

fn check_text(origin: &str, text: &str, kind: Kind) -> FileCheck {
    let (name, result): (&'static str, Result<()>) = match kind {
        Kind::Capabilities => {
            ("capabilities", Catalog::from_texts(&[(origin.to_owned(), text.to_owned())]).map(|_| ()))
        }
        Kind::Hardware => ("hardware", check_hardware(origin, text)),
        Kind::Policy => ("policy", Policy::from_json(text, origin).map(|_| ())),
        Kind::Request => ("request", check_request(origin, text)),
        Kind::Workload => ("workload", Workload::from_json(text, origin).and_then(|w| w.points()).map(|_| ())),
        Kind::DispatchTable => ("table", DispatchTable::parse(text, origin).map(|_| ()).map_err(|r| r.error)),
    };
    FileCheck {
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
