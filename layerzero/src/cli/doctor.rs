//! `lz doctor`: is this installation sound? Hardware, backends, files, one selection, the
//! PerfDB and every `LAYERZERO_*` knob.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Outcome, print_json, render};
use crate::capabilities::catalog::Catalog;
use crate::error::Result;
use crate::hardware::detect;
use crate::hardware::profile::HardwareProfile;
use crate::knobs::{self, KnobReport};
use crate::model::attrs::{AttentionAttrs, Attrs};
use crate::model::device::DeviceKind;
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::op::Op;
use crate::model::request::Request;
use crate::model::tensor::TensorDesc;
use crate::perfdb::{self, DbStats, PerfDb, Recovery};
use crate::policy::Policy;
use crate::select::{Availability, BackendStatus, Selector};

/// A typical attention request for the primary device: causal GQA prefill.
fn sample_request(kind: DeviceKind) -> Request {
    let (dtype, seq) = match kind {
        DeviceKind::Cpu => (DType::F32, 512),
        DeviceKind::Cuda | DeviceKind::Rocm => (DType::BF16, 2048),
    };
    let t = |h: u64| TensorDesc::new(dtype, [1, seq, h, 128]).with_layout(Layout::Bshd);
    Request::new(Op::Attention)
        .tensor("q", t(32))
        .tensor("k", t(8))
        .tensor("v", t(8))
        .attrs(Attrs::Attention(AttentionAttrs { causal: true, ..AttentionAttrs::default() }))
}

/// What doctor found at the PerfDB path. A missing file is not created: doctor only looks.
#[derive(Debug, Default)]
struct PerfDbCheck {
    path: PathBuf,
    exists: bool,
    stats: Option<DbStats>,
    recovered: Option<Recovery>,
    error: Option<String>,
}

impl PerfDbCheck {
    fn ok(&self) -> bool {
        self.error.is_none() && self.stats.as_ref().is_none_or(|s| s.integrity == "ok")
    }

    fn to_json(&self) -> serde_json::Value {
        let s = self.stats.as_ref();
        serde_json::json!({
            "path": self.path.display().to_string(),
            "exists": self.exists,
            "rows": s.map(|s| s.rows),
            "fingerprints": s.map(|s| s.fingerprints),
            "last_tune": s.and_then(|s| s.last_tune),
            "integrity": s.map(|s| s.integrity.clone()),
            "schema_version": s.map(|s| s.schema_version),
            "recovered": self.recovered.as_ref().map(|r| serde_json::json!({
                "moved_to": r.moved_to.display().to_string(), "why": r.why,
            })),
            "error": self.error,
        })
    }
}

/// Opens the PerfDB at `path` if the file exists (moving it aside if it is damaged) and reads
/// its statistics.
fn check_perfdb(path: PathBuf) -> PerfDbCheck {
    let mut check = PerfDbCheck { exists: path.exists(), ..PerfDbCheck::default() };
    if check.exists {
        match PerfDb::open(&path) {
            Ok(opened) => {
                check.recovered = opened.recovered;
                match opened.db.stats() {
                    Ok(s) => check.stats = Some(s),
                    Err(e) => check.error = Some(e.to_string()),
                }
            }
            Err(e) => check.error = Some(e.to_string()),
        }
    }
    check.path = path;
    check
}

fn render_perfdb(out: &mut String, c: &PerfDbCheck) {
    let _ = writeln!(out, "\nperfdb:");
    let _ = writeln!(out, "  path           {}", c.path.display());
    if let Some(r) = &c.recovered {
        let _ =
            writeln!(out, "  RECOVERED      the file was damaged ({}); moved aside to {}", r.why, r.moved_to.display());
        let _ = writeln!(out, "                 and a fresh database was created");
    }
    if let Some(e) = &c.error {
        let _ = writeln!(out, "  ERROR          {e}");
    }
    match &c.stats {
        None if !c.exists => {
            let _ = writeln!(out, "  exists         no (created by the first measurement)");
        }
        None => {}
        Some(s) => {
            let last = s.last_tune.map(render::utc).unwrap_or_else(|| "never".to_owned());
            let _ = writeln!(out, "  rows           {} ({} hardware fingerprints)", s.rows, s.fingerprints);
            let _ = writeln!(out, "  last tune      {last}");
            let _ = writeln!(out, "  integrity      {}", s.integrity);
            let _ = writeln!(out, "  schema         version {}", s.schema_version);
        }
    }
}

fn render_knobs(out: &mut String, knobs: &[KnobReport]) {
    let _ = writeln!(out, "\nknobs (environment):");
    for k in knobs {
        let value = match (&k.current, &k.error) {
            (Some(v), None) => format!("= {v}"),
            (Some(v), Some(e)) => format!("= {v}  INVALID: {e}"),
            (None, _) => format!("unset (default: {})", k.default),
        };
        let _ = writeln!(out, "  {:<26} {:<24} {value}", k.name, k.r#type);
        let _ = writeln!(out, "      {}", k.doc);
    }
}

/// The plan a runtime here would serve with: `LAYERZERO_DISPATCH_TABLE` under
/// `LAYERZERO_PLAN_MODE` and `LAYERZERO_POLICY`, checked against this host; and the cache size.
fn check_plan(
    catalog: &Arc<Catalog>,
    host: &Arc<HardwareProfile>,
    availability: &Arc<Availability>,
) -> serde_json::Value {
    let mode = knobs::plan_mode().map(|m| serde_json::json!(m)).unwrap_or(serde_json::Value::Null);
    let cache_slots = knobs::cache_capacity().ok();
    let base = |status: &str, table: Option<String>, entries: usize, dropped: usize, reason: Option<String>| {
        serde_json::json!({
            "mode": mode, "table": table, "status": status, "entries": entries, "dropped": dropped,
            "reason": reason, "cache_slots": cache_slots,
        })
    };
    let Some(path) = knobs::dispatch_table() else {
        return base("none", None, 0, 0, None);
    };
    let shown = Some(path.display().to_string());
    let policy = match knobs::policy() {
        Some(p) => match super::load_policy(&p) {
            Ok(p) => p,
            Err(e) => return base("refused", shown, 0, 0, Some(e.to_string())),
        },
        None => Policy::default(),
    };
    let selector = match Selector::new(catalog.clone(), host.clone(), Arc::new(policy), availability.clone()) {
        Ok(s) => s,
        Err(e) => return base("refused", shown, 0, 0, Some(e.to_string())),
    };
    match crate::plan::table::load(&path, &selector) {
        Ok(plan) => base("loaded", shown, plan.len(), plan.dropped().len(), None),
        Err(r) => base("refused", shown, 0, 0, Some(r.error.to_string())),
    }
}

fn render_plan(out: &mut String, plan: &serde_json::Value) {
    let _ = writeln!(
        out,
        "
plan:"
    );
    let mode = plan["mode"].as_str().unwrap_or("invalid");
    let slots = plan["cache_slots"].as_u64().map_or("invalid".to_owned(), |n| n.to_string());
    let _ = writeln!(out, "  mode {mode}, selection cache {slots} slots");
    match plan["status"].as_str() {
        Some("loaded") => {
            let _ = writeln!(
                out,
                "  table {} loaded: {} entries ({} dropped)",
                plan["table"].as_str().unwrap_or_default(),
                plan["entries"],
                plan["dropped"]
            );
        }
        Some("refused") => {
            let _ = writeln!(out, "  table REFUSED: {}", plan["reason"].as_str().unwrap_or_default());
        }
        _ => {
            let _ = writeln!(
                out,
                "  no dispatch table configured (LAYERZERO_DISPATCH_TABLE); selection is live and cached"
            );
        }
    }
}

pub(super) fn run(catalog: Arc<Catalog>, json: bool, perfdb_path: Option<&Path>) -> Result<Outcome> {
    let detection = detect::detect_host();
    let host = Arc::new(detection.profile);
    let availability = Arc::new(Availability::probe_host(&catalog, &host));
    let files = super::validate::shipped_results();
    let files_ok = files.iter().all(|(_, _, e)| e.is_empty());
    let selector = Selector::new(catalog.clone(), host.clone(), Arc::new(Policy::default()), availability.clone())?;
    let request = sample_request(host.primary().kind);
    let sample = selector.select(&request);
    let knob_reports = knobs::report_in(&knobs::process_env);
    let knobs_ok = knob_reports.iter().all(|k| k.error.is_none());
    let db = check_perfdb(perfdb_path.map(Path::to_path_buf).unwrap_or_else(perfdb::default_path));
    let plan = check_plan(&catalog, &host, &availability);
    let plan_ok = plan["status"] != "refused";
    let ok = files_ok && sample.is_ok() && knobs_ok && db.ok() && plan_ok;

    let backends: Vec<serde_json::Value> = catalog
        .backends()
        .iter()
        .map(|b| {
            let (status, reason) = match availability.status(&b.backend) {
                BackendStatus::Available => ("available", None),
                BackendStatus::NotInstalled(r) => ("not_installed", Some(r)),
                BackendStatus::Unhealthy(r) => ("unhealthy", Some(r)),
            };
            serde_json::json!({
                "backend": b.backend, "device": b.device, "execution": b.execution, "version": b.version,
                "kernels": b.kernels.len(), "status": status, "reason": reason,
            })
        })
        .collect();
    let sample_json = match &sample {
        Ok(s) => serde_json::json!({
            "request": request, "selected": s.kernel, "estimated_ns": s.score.total_ns, "error": null,
        }),
        Err(e) => {
            serde_json::json!({"request": request, "selected": null, "estimated_ns": null, "error": e.to_string()})
        }
    };
    if json {
        let mut hw = host.to_file_json();
        hw["fingerprint"] = serde_json::Value::String(host.fingerprint.clone());
        print_json(&serde_json::json!({
            "layerzero_version": env!("CARGO_PKG_VERSION"),
            "ok": ok,
            "hardware": hw,
            "hardware_notes": detection.notes,
            "capabilities_hash": catalog.hash(),
            "backends": backends,
            "files": files.iter().map(|(f, k, e)| serde_json::json!({"file": f, "kind": k, "valid": e.is_empty(), "errors": e})).collect::<Vec<_>>(),
            "sample_selection": sample_json,
            "perfdb": db.to_json(),
            "plan": plan,
            "knobs": knob_reports,
        }));
    } else {
        let mut out = String::new();
        let _ = writeln!(out, "LayerZero {} doctor\n", env!("CARGO_PKG_VERSION"));
        out.push_str(&render::hardware(&host, &detection.notes));
        let _ = writeln!(out, "\nbackends:");
        for b in catalog.backends() {
            let line = match availability.status(&b.backend) {
                BackendStatus::Available => "available".to_owned(),
                BackendStatus::NotInstalled(r) => format!("not installed: {r}"),
                BackendStatus::Unhealthy(r) => format!("unhealthy: {r}"),
            };
            let _ = writeln!(out, "  {:<14} {:<5} v{:<8} {line}", b.backend, b.device.as_str(), b.version);
        }
        let _ = writeln!(out, "\nfiles:");
        for (f, k, errs) in &files {
            match errs.first() {
                None => {
                    let _ = writeln!(out, "  ok       {k:<13} {f}");
                }
                Some(e) => {
                    let _ = writeln!(out, "  INVALID  {k:<13} {e}");
                }
            }
        }
        let _ = writeln!(out, "  capabilities hash {}", catalog.hash());
        let _ = writeln!(out, "\nsample selection (causal GQA attention on {}):", host.primary().kind);
        match &sample {
            Ok(s) => {
                let _ = writeln!(out, "  {} (modeled {})", s.kernel, render::duration(s.score.total_ns));
            }
            Err(e) => {
                let _ = writeln!(out, "  FAILED: {e}");
            }
        }
        render_perfdb(&mut out, &db);
        render_plan(&mut out, &plan);
        render_knobs(&mut out, &knob_reports);
        let _ = writeln!(out, "\n{}", if ok { "doctor: ok" } else { "doctor: problems found (see above)" });
        print!("{out}");
    }
    Ok(if ok { Outcome::Ok } else { Outcome::CheckFailed })
}
