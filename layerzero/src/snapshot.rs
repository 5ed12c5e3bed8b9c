//! `LayerZero::snapshot`: the artifacts E2E spec §14 asks a run to leave behind, written into
//! one new folder: capabilities and their hash, the loaded dispatch table and its
//! validation, a PerfDB snapshot, the recent selection log, the policy, health and counters,
//! and a manifest listing them.

use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::runtime::LayerZero;

/// One file of a snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotFile {
    /// Its name in the folder.
    pub name: String,
    /// What it holds.
    pub what: &'static str,
    /// Its size.
    pub bytes: u64,
}

/// What a snapshot wrote.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotManifest {
    /// The folder.
    pub dir: String,
    /// The LayerZero version that wrote it.
    pub layerzero_version: &'static str,
    /// Seconds since the Unix epoch.
    pub created_unix: i64,
    /// The hardware profile's name.
    pub hardware: String,
    /// Its fingerprint.
    pub fingerprint: String,
    /// The catalog's hash.
    pub capabilities_hash: String,
    /// The hash of the policy in force.
    pub policy_hash: String,
    /// Every file written besides `manifest.json`.
    pub files: Vec<SnapshotFile>,
    /// What was left out and why (no table loaded, no PerfDB file).
    pub notes: Vec<String>,
}

impl LayerZero {
    /// Writes a snapshot of this handle into `dir`, a folder that does not exist yet or is
    /// empty: `capabilities.json` (every backend's capabilities, with the hash),
    /// `dispatch_table.json` (when one is loaded) and `readiness.json` (the table's
    /// validation and the other readiness checks), `perfdb.sqlite` (a consistent copy of the
    /// PerfDB at `perfdb`, else the default path, when the file exists), `selections.jsonl`
    /// (the recent decisions with every passed-over candidate's reason codes, redacted as
    /// `LAYERZERO_REDACT` says), `policy.json`,
    /// `health.json` (breakers, counters) and `manifest.json`.
    pub fn snapshot(&self, dir: &Path, perfdb: Option<&Path>) -> Result<SnapshotManifest> {
        self.snapshot_with_trace(dir, perfdb, None)
    }

    /// [`LayerZero::snapshot`], with `trace` (the OTLP/JSON spans of the calls the snapshot
    /// follows: `telemetry::otel::capture`) written as `trace.json`.
    pub fn snapshot_with_trace(
        &self,
        dir: &Path,
        perfdb: Option<&Path>,
        trace: Option<&serde_json::Value>,
    ) -> Result<SnapshotManifest> {
        prepare(dir)?;
        let mut files = Vec::new();
        let mut notes = Vec::new();
        let put = |files: &mut Vec<SnapshotFile>, name: &str, what: &'static str, bytes: Vec<u8>| -> Result<()> {
            crate::files::write(&dir.join(name), &bytes, &[])?;
            files.push(SnapshotFile { name: name.to_owned(), what, bytes: bytes.len() as u64 });
            Ok(())
        };
        let catalog = self.catalog();
        let caps = serde_json::json!({"hash": catalog.hash(), "backends": catalog.backends()});
        put(&mut files, "capabilities.json", "every backend's capabilities and the catalog hash", pretty(&caps))?;
        match &self.table() {
            Some(table) => {
                put(&mut files, "dispatch_table.json", "the loaded dispatch table", table.to_json().into_bytes())?
            }
            None => notes.push("no dispatch table is loaded: dispatch_table.json is left out".to_owned()),
        }
        let perfdb_path = perfdb.map_or_else(|| self.settings().perfdb_path(), Path::to_path_buf);
        let checks = self.readiness(None, Some(&perfdb_path));
        let readiness = serde_json::json!({
            "ready": crate::readiness::all_passed(&checks),
            "plan_rejection": self.plan_rejection(),
            "checks": checks,
        });
        put(
            &mut files,
            "readiness.json",
            "the dispatch table's validation and the other readiness checks",
            pretty(&readiness),
        )?;
        match copy_perfdb(&perfdb_path, dir)? {
            Ok(bytes) => files.push(SnapshotFile {
                name: "perfdb.sqlite".to_owned(),
                what: "a copy of the PerfDB (timings and parity records)",
                bytes,
            }),
            Err(note) => notes.push(note),
        }
        let mut log = Vec::new();
        for record in self.recent_decisions() {
            log.extend(serde_json::to_vec(&record).unwrap_or_default());
            log.push(b'\n');
        }
        put(&mut files, "selections.jsonl", "the recent decisions, one JSON object per line", log)?;
        match trace {
            Some(t) => {
                put(&mut files, "trace.json", "the spans of the calls before the snapshot, as OTLP/JSON", pretty(t))?
            }
            None => notes.push("no trace was captured: trace.json is left out".to_owned()),
        }
        let policy = serde_json::to_value(&*self.declared_policy()).unwrap_or_default();
        put(&mut files, "policy.json", "the policy as set (time-boxed rules included)", pretty(&policy))?;
        let health = serde_json::json!({"health": self.health_report(), "counters": self.counters(),
                                        "shadow_checks": self.shadow_stats(),
                                        "policy_swaps": self.policy_swaps(), "policy_error": self.policy_error()});
        let what = "breakers, abandoned calls, counters, shadow checks, policy swaps";
        put(&mut files, "health.json", what, pretty(&health))?;
        let manifest = SnapshotManifest {
            dir: dir.display().to_string(),
            layerzero_version: env!("CARGO_PKG_VERSION"),
            created_unix: crate::time::now_unix(),
            hardware: self.hardware().name.clone(),
            fingerprint: self.hardware().fingerprint.clone(),
            capabilities_hash: catalog.hash().to_owned(),
            policy_hash: self.selector().policy_hash().to_owned(),
            files,
            notes,
        };
        crate::files::write(
            &dir.join("manifest.json"),
            &pretty(&serde_json::to_value(&manifest).unwrap_or_default()),
            &[],
        )?;
        Ok(manifest)
    }
}

fn pretty(v: &serde_json::Value) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(v).unwrap_or_default();
    out.push(b'\n');
    out
}

/// Creates `dir`, or accepts it when it is an empty folder: a snapshot never mixes with
/// another one or overwrites files.
fn prepare(dir: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Err(_) => std::fs::create_dir_all(dir)
            .map_err(|e| Error::invalid(format!("snapshot folder {}: cannot create it: {e}", dir.display()))),
        Ok(m) if !m.is_dir() => {
            Err(Error::invalid(format!("snapshot folder {}: exists and is not a folder", dir.display())))
        }
        Ok(_) => {
            let mut entries = std::fs::read_dir(dir)
                .map_err(|e| Error::invalid(format!("snapshot folder {}: cannot read it: {e}", dir.display())))?;
            if entries.next().is_some() {
                return Err(Error::invalid(format!(
                    "snapshot folder {}: is not empty; give a new folder so snapshots never mix",
                    dir.display()
                )));
            }
            Ok(())
        }
    }
}

/// Copies the PerfDB at `path` into `dir` as `perfdb.sqlite` (a consistent snapshot): its
/// size, or the note saying why it was left out.
#[cfg(feature = "perfdb")]
fn copy_perfdb(path: &Path, dir: &Path) -> Result<std::result::Result<u64, String>> {
    if !path.is_file() {
        return Ok(Err(format!("no PerfDB file at {}: perfdb.sqlite is left out", path.display())));
    }
    match crate::perfdb::PerfDb::open_for_reading(path)? {
        Ok(o) => {
            let to = dir.join("perfdb.sqlite");
            o.db.snapshot_to(&to)?;
            Ok(Ok(std::fs::metadata(&to).map(|m| m.len()).unwrap_or(0)))
        }
        Err(why) => Ok(Err(format!("the PerfDB {} was not copied: {why}", path.display()))),
    }
}

/// A build without the PerfDB copies none.
#[cfg(not(feature = "perfdb"))]
fn copy_perfdb(path: &Path, _dir: &Path) -> Result<std::result::Result<u64, String>> {
    Ok(Err(format!("this build has no PerfDB (cargo feature `perfdb`): {} is not copied", path.display())))
}
