//! `lz doctor`: renders `readiness::doctor`'s report as text or JSON.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use super::{Outcome, print_json, render};
use layerzero::capabilities::catalog::Catalog;
use layerzero::error::Result;
use layerzero::knobs::KnobReport;
use layerzero::readiness::doctor::{self, DoctorInputs, DoctorReport, PerfDbCheck, PlanCheck, PlanStatus};
use layerzero::select::BackendStatus;

pub(super) fn run(catalog: Arc<Catalog>, json: bool, perfdb_path: Option<&Path>) -> Result<Outcome> {
    let report = doctor::doctor(&DoctorInputs { catalog, perfdb: perfdb_path, env: &layerzero::knobs::process_env })?;
    if json {
        print_json(&report.to_json());
    } else {
        print!("{}", text(&report));
    }
    Ok(if report.ok { Outcome::Ok } else { Outcome::CheckFailed })
}

/// The loud line for `LAYERZERO_FAULTS`, when it is set.
fn faults_warning(r: &DoctorReport) -> Option<String> {
    let spec = r.knobs.iter().find(|k| k.name == layerzero::knobs::FAULTS.name())?.current.clone()?;
    Some(match layerzero::runtime::faults::parse(&spec) {
        Ok(_) => format!(
            "!!! FAULT INJECTION IS ON: LAYERZERO_FAULTS={spec} makes these kernels fail on purpose; \
             unset it before serving !!!"
        ),
        Err(e) => format!("!!! LAYERZERO_FAULTS={spec} is set and invalid: {e} !!!"),
    })
}

fn text(r: &DoctorReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "LayerZero {} doctor\n", env!("CARGO_PKG_VERSION"));
    let loud = faults_warning(r);
    if let Some(w) = &loud {
        let _ = writeln!(out, "{w}\n");
    }
    out.push_str(&render::hardware(&r.hardware, &r.hardware_notes));
    for m in &r.device_memory {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let _ = match (m.free_bytes, m.total_bytes, &m.error) {
            (Some(f), Some(t), _) => {
                writeln!(out, "{}: {:.2} GiB free of {:.2} GiB (read through the driver now)", m.device, gib(f), gib(t))
            }
            (_, _, e) => writeln!(out, "{}: free memory not read: {}", m.device, e.as_deref().unwrap_or("unknown")),
        };
    }
    let _ = writeln!(out, "\nbackends:");
    for b in &r.backends {
        let line = match &b.status {
            BackendStatus::Available => match &b.library {
                Some(l) => {
                    format!(
                        "available: {} {} loaded from {}{}",
                        b.backend,
                        l.version,
                        l.path,
                        l.isa.as_ref().map(|i| format!(", JIT for {i}")).unwrap_or_default()
                    ) + &layerzero::readiness::doctor::threads_note(&b.backend)
                        .map(|n| format!("\n      note: {n}"))
                        .unwrap_or_default()
                }
                None => "available".to_owned(),
            },
            BackendStatus::NotInstalled(why) => format!("not installed: {why}"),
            BackendStatus::Unhealthy(why) => format!("unhealthy: {why}"),
        };
        let _ = writeln!(out, "  {:<14} {:<5} v{:<8} {line}", b.backend, b.device.as_str(), b.version);
    }
    let _ = writeln!(out, "\nfiles:");
    for f in &r.files {
        match f.errors.first() {
            None => {
                let _ = writeln!(out, "  ok       {:<13} {}", f.kind, f.file);
            }
            Some(e) => {
                let _ = writeln!(out, "  INVALID  {:<13} {e}", f.kind);
            }
        }
    }
    let _ = writeln!(out, "  capabilities hash {}", r.capabilities_hash);
    let _ = writeln!(out, "\nsample selection (causal GQA attention on {}):", r.sample.device);
    match &r.sample.result {
        Ok((kernel, ns)) => {
            let _ = writeln!(out, "  {kernel} (modeled {})", render::duration(*ns));
        }
        Err(e) => {
            let _ = writeln!(out, "  FAILED: {e}");
        }
    }
    render_perfdb(&mut out, &r.perfdb);
    let _ = writeln!(out, "\ncalibration: {} ({})", r.calibration.2, r.calibration.0);
    match &r.plugins.1 {
        Err(e) => {
            let _ = writeln!(out, "\nplugins: FAILED: {e}");
        }
        Ok(states) if states.is_empty() => {
            let _ = writeln!(out, "\nplugins: none locked ({})", r.plugins.0);
        }
        Ok(states) => {
            let _ = writeln!(out, "\nplugins ({}):", r.plugins.0);
            for s in states {
                match &s.error {
                    None => {
                        let _ = writeln!(out, "  ok   {} {}", s.namespace, s.path.display());
                    }
                    Some(e) => {
                        let _ = writeln!(out, "  FAIL {}: {e}", s.namespace);
                    }
                }
            }
        }
    }
    render_plan(&mut out, &r.plan);
    render_knobs(&mut out, &r.knobs);
    render_policy(&mut out, &r.policy);
    if let Some(w) = &loud {
        let _ = writeln!(out, "\n{w}");
    }
    let _ = writeln!(out, "\n{}", if r.ok { "doctor: ok" } else { "doctor: problems found (see above)" });
    out
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
            let _ = writeln!(
                out,
                "  parity         {} records, {} failed (all machines; `lz parity --record` adds this one's)",
                s.parity_records, s.parity_failed
            );
        }
    }
    for f in &c.parity_failing {
        let _ = writeln!(out, "  PARITY FAILED  {f}");
    }
}

fn render_policy(out: &mut String, p: &std::result::Result<doctor::PolicyCheck, String>) {
    let _ = writeln!(out, "\npolicy:");
    let p = match p {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(out, "  ERROR          {e}");
            return;
        }
    };
    let file = p.file.as_deref().unwrap_or("none (the default policy)");
    let _ = writeln!(out, "  file           {file}");
    let _ = writeln!(out, "  hash           {}  ({} rules)", &p.hash[..16.min(p.hash.len())], p.rules);
    for o in &p.overrides {
        let _ = writeln!(out, "  override       {} = {}  [{}]", o.field, o.value, o.knob);
    }
    let c = &p.health;
    let source = |field: &str| {
        p.overrides.iter().find(|o| o.field == field).map_or_else(
            || p.file.as_ref().map_or("default".to_owned(), |f| format!("policy {f}")),
            |o| o.knob.to_owned(),
        )
    };
    let deadline = c.kernel_timeout.map_or("none".to_owned(), |d| format!("{} ms", d.as_millis()));
    let _ = writeln!(out, "  health:");
    for (label, field, value) in [
        (
            "threshold",
            "health.failure_threshold",
            format!("{} consecutive failures quarantine a kernel", c.failure_threshold),
        ),
        ("cooldown", "health.cooldown_ms", format!("{} ms", c.cooldown.as_millis())),
        ("trials", "health.half_open_trials", format!("{} trial call(s) after a cooldown", c.half_open_trials)),
        ("deadline", "kernel_timeout_ms", deadline),
        ("abandoned", "health.max_abandoned", format!("at most {} running per backend", c.max_abandoned)),
        (
            "outputs",
            "validate_outputs",
            if c.validate_outputs { "checked for NaN/Inf" } else { "not checked" }.to_owned(),
        ),
    ] {
        let _ = writeln!(out, "    {label:<12} {value}  [{}]", source(field));
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

fn render_plan(out: &mut String, plan: &PlanCheck) {
    let _ = writeln!(out, "\nplan:");
    // The mode's stable name is its JSON spelling.
    let mode = plan.mode.and_then(|m| serde_json::to_value(m).ok());
    let mode = mode.as_ref().and_then(serde_json::Value::as_str).unwrap_or("invalid");
    let slots = plan.cache_slots.map_or("invalid".to_owned(), |n| n.to_string());
    let _ = writeln!(out, "  mode {mode}, selection cache {slots} slots");
    match plan.status {
        PlanStatus::Loaded => {
            let _ = writeln!(
                out,
                "  table {} loaded: {} entries ({} dropped)",
                plan.table.as_deref().unwrap_or_default(),
                plan.entries,
                plan.dropped
            );
        }
        PlanStatus::Refused => {
            let _ = writeln!(out, "  table REFUSED: {}", plan.reason.as_deref().unwrap_or_default());
        }
        PlanStatus::None => {
            let _ = writeln!(
                out,
                "  no dispatch table configured (LAYERZERO_DISPATCH_TABLE); selection is live and cached"
            );
        }
    }
}
