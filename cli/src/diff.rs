//! `lz diff`: two dumps compared stage by stage, the first divergence named.

use std::path::{Path, PathBuf};

use super::args::DiffCmd;
use super::{Outcome, print_json};
use layerzero::error::{Error, Result};
use layerzero::tensor::io;
use layerzero_llm as llm;

/// A dump file, or a folder holding `dump.safetensors` (or `reference.safetensors`).
fn dump_file(p: &Path) -> PathBuf {
    if p.is_dir() {
        let ours = p.join("dump.safetensors");
        if ours.exists() { ours } else { p.join("reference.safetensors") }
    } else {
        p.to_path_buf()
    }
}

pub(super) fn diff(a: DiffCmd) -> Result<Outcome> {
    if !(a.threshold > 0.0 && a.threshold.is_finite()) {
        return Err(Error::invalid(format!("--threshold {} must be a positive number", a.threshold)));
    }
    let ours = io::read(&dump_file(&a.ours))?;
    let reference = io::read(&dump_file(&a.reference))?;
    let report = llm::diff::diff(&ours, &reference, a.threshold)?;
    if a.json {
        print_json(&serde_json::json!({
            "ok": report.ok(),
            "threshold": report.threshold,
            "first_divergence": report.first_divergence,
            "token_mismatches": report.token_mismatches,
            "stages": report.stages,
        }));
    } else {
        println!("{:<30} {:>10} {:>12} {:>12}", "stage", "cosine", "l2_rel", "max_abs");
        for s in &report.stages {
            let mark = if s.ok { "" } else { "  <-- over the threshold" };
            println!("{:<30} {:>10.6} {:>12.3e} {:>12.3e}{mark}", s.name, s.cosine, s.l2_rel, s.max_abs);
        }
        match &report.first_divergence {
            Some(name) => println!("first divergence: {name} (l2_rel > {:.1e})", report.threshold),
            None => println!("every stage within l2_rel {:.1e}", report.threshold),
        }
        for (i, o, r) in &report.token_mismatches {
            println!("token {i}: ours {o}, reference {r}");
        }
    }
    Ok(if report.ok() { Outcome::Ok } else { Outcome::CheckFailed })
}
