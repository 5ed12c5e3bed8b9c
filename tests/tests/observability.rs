//! E2E spec §12 and §14, observability and artifacts: the structured selection log (with
//! kernel, reasons and transform cost, redacted as configured), the report's
//! `transform_cost_total` and `fused_ops`, the handle's recent decisions, and `lz snapshot`.

use layerzero::LayerZero;
use layerzero::exec::args::{LinearArgs, OpArgs};
use layerzero::model::attrs::NoAttrs;
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::schema::{SchemaKind, violations};
use layerzero::tensor::HostTensor;
use layerzero::tensor::io;
use layerzero_tests::{TestResult, causal, lz, with_attrs};

fn linear(rows: usize) -> TestResult<OpArgs> {
    let t = |shape: &[usize]| {
        HostTensor::from_f32(shape, (0..shape.iter().product()).map(|i| (i % 5) as f32 * 0.1).collect())
    };
    Ok(OpArgs::Linear(LinearArgs { x: t(&[rows, 32])?, weight: t(&[16, 32])?, bias: None, attrs: NoAttrs {} }))
}

/// A linear request and its inputs, written into `dir`.
fn linear_files(dir: &std::path::Path) -> TestResult<(String, String)> {
    let req = dir.join("req.json");
    let request = r#"{"op": "linear", "tensors": {"x": {"dtype": "f32", "shape": [4, 32]}, "weight": {"dtype": "f32", "shape": [16, 32]}}}"#;
    std::fs::write(&req, request)?;
    let inputs = dir.join("in.safetensors");
    let OpArgs::Linear(a) = linear(4)? else { return Err("linear() makes linear arguments".into()) };
    let tensors = [("x".to_owned(), a.x), ("weight".to_owned(), a.weight)].into_iter().collect();
    io::write_output(&inputs, &tensors, &[])?;
    Ok((req.display().to_string(), inputs.display().to_string()))
}

fn log_lines(stderr: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stderr).lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

#[test]
fn the_selection_log_has_kernel_reasons_and_transform_cost_and_redacts_what_is_configured() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (req, inputs) = linear_files(dir.path())?;
    let out = dir.path().join("out.safetensors");
    let kernel = LayerZero::detected()?.dispatch(&linear(4)?)?.selection().kernel.clone();
    let run = |redact: &str| -> TestResult<std::process::Output> {
        Ok(lz()?
            .env("LAYERZERO_LOG", "json")
            .env("LAYERZERO_REDACT", redact)
            .env("LAYERZERO_FAULTS", format!("{kernel}=error"))
            .args(["run", "--request", &req, "--inputs", &inputs, "--out", out.to_str().unwrap_or_default()])
            .output()?)
    };
    let o = run("")?;
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let lines = log_lines(&o.stderr);
    let selected = lines
        .iter()
        .find(|l| l["target"] == "layerzero::selection")
        .ok_or_else(|| format!("no selection event in {lines:?}"))?;
    assert_eq!(selected["fields"]["kernel"], kernel.as_str());
    assert!(selected["fields"]["transform_cost_total"].is_number() && selected["fields"]["candidates"].is_number());
    assert!(selected["fields"]["shapes"].as_str().is_some_and(|s| s.contains("x=f32[4,32]")), "{selected}");
    let fell_back = lines
        .iter()
        .find(|l| l["target"] == "layerzero::dispatch")
        .ok_or_else(|| format!("no fallback event in {lines:?}"))?;
    assert_eq!(fell_back["fields"]["code"], "KERNEL_FAILED");
    assert_eq!(fell_back["level"], "WARN");
    // Redacted: neither the kernel ids nor the shapes appear anywhere in the log.
    let o = run("kernels,shapes")?;
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!text.contains(&kernel) && !text.contains("[4,32]"), "{text}");
    assert!(text.contains("[redacted]"), "{text}");
    Ok(())
}

#[test]
fn the_selection_report_carries_transform_cost_total_and_fused_ops() -> TestResult {
    let lz = LayerZero::planning("h100")?;
    let v = layerzero::TensorDesc::new(DType::BF16, [2, 2048, 8, 128])
        .with_layout(Layout::Bshd)
        .with_strides([8388608, 4096, 512, 4]);
    let req = with_attrs(layerzero_tests::attention(DType::BF16, 2, 2048, 2048, 32, 8, 128), causal()).tensor("v", v);
    let report = lz.explain(&req);
    let chosen = report.selected_candidate().ok_or("nothing selected")?;
    let transform_ns = chosen.score.as_ref().map_or(0.0, |s| s.transform_ns);
    assert_eq!(report.transform_cost_total, transform_ns);
    let host = LayerZero::detected()?;
    let mlp = layerzero::Request::from_json(
        r#"{"op": "mlp", "tensors": {"x": {"dtype": "f32", "shape": [16, 64]},
            "w_gate": {"dtype": "f32", "shape": [128, 64]}, "w_up": {"dtype": "f32", "shape": [128, 64]},
            "w_down": {"dtype": "f32", "shape": [64, 128]}}, "attrs": {"activation": "silu"}}"#,
    )?;
    let report = host.explain(&mlp);
    assert_eq!(report.selected.as_deref(), Some("cpu.mlp.fused"), "{:?}", report.selected);
    assert_eq!(report.fused_ops, vec!["gate_up_proj", "activation", "down_proj"]);
    let json = report.to_json();
    assert!(violations(SchemaKind::SelectionReport, &json).unwrap_or_default().is_empty());
    Ok(())
}

#[test]
fn recent_decisions_keep_live_selections_and_fallbacks_within_their_bound() -> TestResult {
    let lz = LayerZero::detected()?;
    for rows in 1..=300 {
        lz.dispatch(&linear(rows * 64)?)?;
    }
    let recent = lz.recent_decisions();
    assert!(!recent.is_empty() && recent.len() <= layerzero::runtime::RECENT_DECISIONS, "{}", recent.len());
    assert!(recent.iter().all(|r| r.event == "select" && !r.kernel.is_empty()));
    let kernel = recent[0].kernel.clone();
    let drilled = LayerZero::detected().and_then(|l| l.with_faults(&format!("{kernel}=error")))?;
    drilled.dispatch(&linear(8)?)?;
    let last = drilled.recent_decisions().pop().ok_or("no record")?;
    assert_eq!(last.event, "dispatch");
    assert_eq!(last.failed, vec![(kernel, "KERNEL_FAILED".to_owned())]);
    Ok(())
}

#[test]
fn lz_snapshot_writes_every_artifact_and_refuses_a_folder_in_use() -> TestResult {
    let dir = tempfile::tempdir()?;
    let workload = dir.path().join("w.json");
    std::fs::write(
        &workload,
        r#"{"schema_version": 1, "name": "snap", "entries": [{"name": "proj", "request": {"op": "linear",
            "tensors": {"x": {"dtype": "f32", "shape": [8, 64]}, "weight": {"dtype": "f32", "shape": [48, 64]}}},
            "ranges": {"m": [1, 16]}}]}"#,
    )?;
    let table = dir.path().join("table.json");
    let solved = lz()?
        .args([
            "solve",
            "--workload",
            workload.to_str().unwrap_or_default(),
            "--out",
            table.to_str().unwrap_or_default(),
        ])
        .args(["--no-perfdb"])
        .output()?;
    assert_eq!(solved.status.code(), Some(0), "{}", String::from_utf8_lossy(&solved.stderr));
    let perfdb = dir.path().join("perfdb.sqlite");
    layerzero::perfdb::PerfDb::open(&perfdb)?;
    let snap = dir.path().join("snap");
    let run = || -> TestResult<std::process::Output> {
        Ok(lz()?
            .env("LAYERZERO_DISPATCH_TABLE", &table)
            .env("LAYERZERO_PERFDB", &perfdb)
            .args(["snapshot", snap.to_str().unwrap_or_default(), "--workload", workload.to_str().unwrap_or_default()])
            .arg("--json")
            .output()?)
    };
    let o = run()?;
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let manifest: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    assert!(violations(SchemaKind::SnapshotReport, &manifest).unwrap_or_default().is_empty(), "{manifest}");
    let names: Vec<&str> =
        manifest["files"].as_array().into_iter().flatten().filter_map(|f| f["name"].as_str()).collect();
    for want in [
        "capabilities.json",
        "dispatch_table.json",
        "readiness.json",
        "perfdb.sqlite",
        "selections.jsonl",
        "policy.json",
        "health.json",
    ] {
        assert!(names.contains(&want), "{want} missing: {names:?}");
        assert!(snap.join(want).is_file(), "{want} not written");
    }
    let caps: serde_json::Value =
        serde_json::from_slice(&std::fs::read(snap.join("capabilities.json")).unwrap_or_default()).unwrap_or_default();
    assert_eq!(caps["hash"], manifest["capabilities_hash"]);
    let readiness: serde_json::Value =
        serde_json::from_slice(&std::fs::read(snap.join("readiness.json")).unwrap_or_default()).unwrap_or_default();
    assert!(readiness["checks"].as_array().is_some_and(|c| c.iter().any(|c| c["name"] == "table_matches_host")));
    let db = std::fs::read(snap.join("perfdb.sqlite")).unwrap_or_default();
    assert!(db.starts_with(b"SQLite format 3\0"), "the PerfDB copy is an SQLite file");
    assert!(snap.join("manifest.json").is_file());
    // A second snapshot into the same folder is refused rather than mixed.
    let again = run()?;
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"));
    Ok(())
}
