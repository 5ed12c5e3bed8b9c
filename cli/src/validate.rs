//! `lz validate`: schema-check files, naming the file, the field and the rule. The checks
//! themselves are `readiness::files`; this renders them.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::{Outcome, print_json};
use layerzero::error::Result;
use layerzero::readiness::files;

/// Checks `files`, or every shipped capability and hardware file when `files` is empty.
pub(super) fn run(paths: &[PathBuf], json: bool) -> Result<Outcome> {
    let mut results = Vec::new();
    if paths.is_empty() {
        results.extend(files::shipped());
    }
    for path in paths {
        let text = layerzero::files::read_to_string(path)?;
        results.push(files::check_file(path, &text));
    }
    let ok = results.iter().all(files::FileCheck::is_valid);
    if json {
        let items: Vec<serde_json::Value> = results
            .iter()
            .map(|r| serde_json::json!({"file": r.file, "kind": r.kind, "valid": r.is_valid(), "errors": r.errors}))
            .collect();
        print_json(&serde_json::json!({"valid": ok, "files": items}));
    } else {
        let mut out = String::new();
        for r in &results {
            if r.is_valid() {
                let _ = writeln!(out, "ok       {:<13} {}", r.kind, r.file);
            } else {
                for e in &r.errors {
                    let _ = writeln!(out, "INVALID  {:<13} {e}", r.kind);
                }
            }
        }
        let bad = results.iter().filter(|r| !r.is_valid()).count();
        let _ = writeln!(out, "{} files checked, {bad} invalid", results.len());
        print!("{out}");
    }
    Ok(if ok { Outcome::Ok } else { Outcome::CheckFailed })
}
