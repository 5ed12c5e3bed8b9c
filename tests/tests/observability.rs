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

const LINEAR: &str = r#"{"op": "linear", "tensors": {"x": {"dtype": "f32", "shape": [4, 32]}, "weight": {"dtype": "f32", "shape": [16, 32]}}}"#;

/// The request of [`linear_files`].
fn linear_request() -> TestResult<layerzero::Request> {
    Ok(layerzero::Request::from_json(LINEAR)?)
}

/// A linear request and its inputs, written into `dir`.
fn linear_files(dir: &std::path::Path) -> TestResult<(String, String)> {
    let req = dir.join("req.json");
    std::fs::write(&req, LINEAR)?;
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

/// The spans of an OTLP/JSON trace document.
fn otlp_spans(trace: &serde_json::Value) -> TestResult<Vec<serde_json::Value>> {
    let spans = trace["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().ok_or_else(|| format!("{trace}"))?;
    for s in spans {
        let hex = |v: &serde_json::Value, n: usize| {
            v.as_str().is_some_and(|h| h.len() == n && h.chars().all(|c| c.is_ascii_hexdigit()))
        };
        assert!(hex(&s["traceId"], 32) && hex(&s["spanId"], 16), "{s}");
        let nanos = |k: &str| s[k].as_str().and_then(|t| t.parse::<u128>().ok());
        assert!(nanos("startTimeUnixNano").zip(nanos("endTimeUnixNano")).is_some_and(|(a, b)| 0 < a && a <= b), "{s}");
    }
    Ok(spans.clone())
}

/// An attribute's OTLP value (`{"stringValue": ..}`, `{"intValue": ..}`).
fn otlp_attribute<'s>(span: &'s serde_json::Value, key: &str) -> &'s serde_json::Value {
    let found = span["attributes"].as_array().and_then(|a| a.iter().find(|kv| kv["key"] == key));
    found.map_or(&serde_json::Value::Null, |kv| &kv["value"])
}

#[test]
fn section_14_the_snapshots_selection_log_and_trace_hold_what_was_decided() -> TestResult {
    let dir = tempfile::tempdir()?;
    let request = r#"{"op": "linear", "tensors": {"x": {"dtype": "f32", "shape": [8, 64]}, "weight": {"dtype": "f32", "shape": [48, 64]}}}"#;
    let workload = dir.path().join("w.json");
    let entry = format!(r#"{{"name": "proj", "request": {request}, "ranges": {{"m": [1, 16]}}}}"#);
    std::fs::write(&workload, format!(r#"{{"schema_version": 1, "name": "snap", "entries": [{entry}]}}"#))?;
    let snap = dir.path().join("snap");
    let o = lz()?
        .args(["snapshot", snap.to_str().unwrap_or_default(), "--workload", workload.to_str().unwrap_or_default()])
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    // What this host decides for the same request, candidate by candidate.
    let report = LayerZero::detected()?.explain(&layerzero::Request::from_json(request)?);
    let chosen = report.selected.clone().ok_or("this host serves a linear")?;
    let log = std::fs::read_to_string(snap.join("selections.jsonl"))?;
    let records: Vec<serde_json::Value> = log.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    assert_eq!(records.len(), 1, "{log}");
    let r = &records[0];
    assert_eq!((r["event"].as_str(), r["op"].as_str()), (Some("select"), Some("linear")), "{r}");
    assert_eq!(r["kernel"], chosen.as_str());
    assert_eq!(r["shapes"], "weight=f32[48,64] x=f32[8,64]");
    assert_eq!(r["transform_cost_total"].as_f64(), Some(report.transform_cost_total));
    assert_eq!(r["candidates"].as_u64(), Some(report.candidates.len() as u64));
    // Every candidate passed over is in the log with the codes `explain` gives it.
    let rejected: Vec<(String, Vec<String>)> = report
        .candidates
        .iter()
        .filter(|c| !c.reasons.is_empty())
        .map(|c| (c.kernel.clone(), c.reasons.iter().map(|r| r.code().as_str().to_owned()).collect()))
        .collect();
    let codes = |x: &serde_json::Value| {
        x.as_array().into_iter().flatten().filter_map(|c| c.as_str()).map(str::to_owned).collect()
    };
    let logged: Vec<(String, Vec<String>)> = r["rejections"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| (x["kernel"].as_str().unwrap_or_default().to_owned(), codes(&x["reasons"])))
        .collect();
    assert!(!rejected.is_empty(), "some candidate of this host is passed over: {report:?}");
    assert_eq!(logged, rejected);
    assert_eq!(r["rejected"].as_u64(), Some(rejected.len() as u64));
    // The trace: the workload's one selection as an OTLP/JSON `lz.select` span.
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(snap.join("trace.json"))?)?;
    let spans = otlp_spans(&trace)?;
    let select = spans.iter().find(|s| s["name"] == "lz.select").ok_or_else(|| format!("{trace}"))?;
    assert_eq!(otlp_attribute(select, "op")["stringValue"], "linear");
    assert_eq!(otlp_attribute(select, "kernel")["stringValue"], chosen.as_str());
    assert_eq!(otlp_attribute(select, "source")["stringValue"], "live");
    assert_eq!(otlp_attribute(select, "candidates")["intValue"], report.candidates.len().to_string());
    assert_eq!(otlp_attribute(select, "rejected")["intValue"], rejected.len().to_string());
    assert_eq!(
        otlp_attribute(select, "transform_cost_total")["doubleValue"].as_f64(),
        Some(report.transform_cost_total)
    );
    Ok(())
}

#[test]
fn section_12_lz_run_traces_its_dispatch_and_the_selection_inside_it_as_otlp_json() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (req, inputs) = linear_files(dir.path())?;
    let (out, trace) = (dir.path().join("out.safetensors"), dir.path().join("trace.json"));
    let o = lz()?
        .args(["run", "--request", &req, "--inputs", &inputs, "--out", out.to_str().unwrap_or_default()])
        .args(["--trace", trace.to_str().unwrap_or_default(), "--json"])
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    // The log's selection event names each passed-over candidate with its codes.
    let logged = lz()?
        .env("LAYERZERO_LOG", "json")
        .args(["run", "--request", &req, "--inputs", &inputs, "--out", out.to_str().unwrap_or_default()])
        .output()?;
    assert_eq!(logged.status.code(), Some(0), "{}", String::from_utf8_lossy(&logged.stderr));
    let report = LayerZero::detected()?.explain(&linear_request()?);
    let lines = log_lines(&logged.stderr);
    let event = lines.iter().find(|l| l["target"] == "layerzero::selection").ok_or_else(|| format!("{lines:?}"))?;
    let text = event["fields"]["rejections"].as_str().ok_or_else(|| format!("{event}"))?;
    for c in report.candidates.iter().filter(|c| !c.reasons.is_empty()) {
        let codes: Vec<&str> = c.reasons.iter().map(|r| r.code().as_str()).collect();
        assert!(text.contains(&format!("{}:{}", c.kernel, codes.join("|"))), "{} missing from {text}", c.kernel);
    }
    let ran: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let kernel = ran["kernel"].as_str().ok_or_else(|| format!("{ran}"))?;
    let spans = otlp_spans(&serde_json::from_slice(&std::fs::read(&trace)?)?)?;
    let named = |n: &str| spans.iter().find(|s| s["name"] == n).ok_or_else(|| format!("no {n} span in {spans:?}"));
    let (dispatch, select) = (named("lz.dispatch")?, named("lz.select")?);
    assert_eq!(otlp_attribute(dispatch, "kernel")["stringValue"], kernel);
    assert_eq!(otlp_attribute(dispatch, "fallback_attempts")["intValue"], "0");
    assert_eq!(otlp_attribute(select, "kernel")["stringValue"], kernel);
    assert_eq!(otlp_attribute(select, "op")["stringValue"], "linear");
    // The selection is a child of the dispatch, in its trace.
    assert_eq!(select["parentSpanId"], dispatch["spanId"]);
    assert_eq!(select["traceId"], dispatch["traceId"]);
    assert_eq!(dispatch["parentSpanId"], "");
    Ok(())
}
