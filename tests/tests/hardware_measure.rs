//! `lz hardware --measure` (issue 14, item 4): the host measured, not guessed. The figures
//! are stored under `LAYERZERO_HOME` for the host's fingerprint, which they do not change,
//! and detection reports them from then on, next to what it estimated.

use layerzero::schema::{SchemaKind, violations};
use layerzero_tests::{TestResult, lz};

fn json(home: &std::path::Path, args: &[&str]) -> TestResult<serde_json::Value> {
    let o = lz()?.env("LAYERZERO_HOME", home).args(args).output()?;
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    Ok(serde_json::from_slice(&o.stdout).map_err(|e| format!("{args:?}: {e}"))?)
}

fn cpu(v: &serde_json::Value) -> serde_json::Value {
    v["devices"].as_array().into_iter().flatten().find(|d| d["kind"] == "cpu").cloned().unwrap_or_default()
}

#[test]
fn a_measured_host_keeps_its_fingerprint_and_reports_the_measured_figures_from_then_on() -> TestResult {
    let home = tempfile::tempdir()?;
    let before = json(home.path(), &["hardware", "--json"])?;
    assert!(before["notes"].to_string().contains("not measured"), "{}", before["notes"]);
    let m = json(home.path(), &["hardware", "--measure", "--json"])?;
    let errs = violations(SchemaKind::HardwareReport, &m)?;
    assert!(errs.is_empty(), "{errs:?}");
    let measured = &m["measured"];
    let copy = measured["copy_gbps"].as_f64().unwrap_or_default();
    let f32_peak = measured["peak_tflops"]["f32"].as_f64().unwrap_or_default();
    assert!(copy > 0.0 && f32_peak > 0.0, "{measured}");
    assert_eq!(m["nominal"]["memory_bandwidth_gbps"], cpu(&before)["memory_bandwidth_gbps"]);
    assert!(home.path().join("hardware.json").exists());

    // Detection now reports the measured figures, with the same identity.
    let after = json(home.path(), &["hardware", "--json"])?;
    assert_eq!(after["fingerprint"], before["fingerprint"], "measuring must not orphan PerfDB rows");
    assert_eq!(measured["fingerprint"], before["fingerprint"]);
    assert_eq!(cpu(&after)["memory_bandwidth_gbps"].as_f64(), Some(copy));
    assert_eq!(cpu(&after)["peak_tflops"]["f32"].as_f64(), Some(f32_peak));
    let notes = after["notes"].to_string();
    assert!(notes.contains("CPU measured") && !notes.contains("nominal estimate (one DDR4"), "{notes}");
    Ok(())
}

#[test]
fn a_cap_is_a_different_host_measured_on_its_own() -> TestResult {
    let home = tempfile::tempdir()?;
    let native = json(home.path(), &["hardware", "--measure", "--json"])?;
    let o = lz()?
        .env("LAYERZERO_HOME", home.path())
        .env("LAYERZERO_CPU_ISA", "portable")
        .args(["hardware", "--measure", "--json"])
        .output()?;
    let portable: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(portable["measured"]["cap"], "portable");
    assert_ne!(portable["fingerprint"], native["fingerprint"], "the cap changes the ISA, so the identity");
    let text = std::fs::read_to_string(home.path().join("hardware.json"))?;
    let file: serde_json::Value = serde_json::from_str(&text)?;
    assert_eq!(file["hosts"].as_object().map(|h| h.len()), Some(2), "both kept: {file}");
    // Portable code multiplies far slower than the vector units.
    let rate = |v: &serde_json::Value| v["measured"]["peak_tflops"]["f32"].as_f64().unwrap_or_default();
    assert!(rate(&portable) < rate(&native), "{} vs {}", rate(&portable), rate(&native));
    Ok(())
}

#[test]
fn an_unreadable_measurement_file_is_reported_by_detection_and_moved_aside_by_the_next_measure() -> TestResult {
    let home = tempfile::tempdir()?;
    let path = home.path().join("hardware.json");
    std::fs::write(&path, "{ not json")?;
    let v = json(home.path(), &["hardware", "--json"])?;
    assert!(v["notes"].to_string().contains("measured figures not used"), "{}", v["notes"]);
    json(home.path(), &["hardware", "--measure", "--json"])?;
    let aside: Vec<_> = std::fs::read_dir(home.path())?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("corrupt"))
        .collect();
    assert_eq!(aside.len(), 1, "the unreadable file is kept aside");
    assert_eq!(std::fs::read_to_string(aside[0].path())?, "{ not json");
    Ok(())
}

#[test]
fn measure_cannot_be_combined_with_a_named_profile() -> TestResult {
    let o = lz()?.args(["hardware", "--measure", "--hardware", "h100"]).output()?;
    assert_eq!(o.status.code(), Some(2));
    Ok(())
}
