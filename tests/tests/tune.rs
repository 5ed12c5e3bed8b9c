//! `lz tune`: rows written to the PerfDB, the budget respected with skipped work listed,
//! bad workloads rejected with exit 2 naming the field, `--json` valid against its schema.

use std::path::{Path, PathBuf};

use layerzero::perfdb::PerfDb;
use layerzero::schema::{SchemaKind, violations};
use layerzero_tests::{TestResult, repo_root};

use crate::cli::{lz, run};

/// rms_norm at tokens 1, 2 and 3..4 and a small attention at seq 5..8 and 9..16: five
/// buckets, two CPU kernels each, microseconds per call.
const TINY: &str = r#"{
  "schema_version": 1, "name": "tiny",
  "entries": [
    {"name": "norm",
     "request": {"op": "rms_norm", "tensors": {"x": {"dtype": "f32", "shape": [1, 64]},
                                               "weight": {"dtype": "f32", "shape": [64]}}},
     "ranges": {"tokens": [1, 4]}},
    {"name": "attn",
     "request": {"op": "attention", "tensors": {
         "q": {"dtype": "f32", "shape": [1, 8, 4, 32], "layout": "BSHD"},
         "k": {"dtype": "f32", "shape": [1, 8, 2, 32], "layout": "BSHD"},
         "v": {"dtype": "f32", "shape": [1, 8, 2, 32], "layout": "BSHD"}},
       "attrs": {"causal": true}},
     "ranges": {"seq_q": [8, 16], "seq_k": "seq_q"}}
  ]
}"#;

fn write(dir: &Path, name: &str, text: &str) -> TestResult<PathBuf> {
    let p = dir.join(name);
    std::fs::write(&p, text)?;
    Ok(p)
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn json(out: &str) -> TestResult<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(out).map_err(|e| format!("{e}: {out}"))?;
    let errs = violations(SchemaKind::TuneReport, &v)?;
    assert!(errs.is_empty(), "{errs:#?}\n{out}");
    Ok(v)
}

#[test]
fn tuning_a_tiny_workload_writes_rows_and_verifies() -> TestResult {
    let dir = tempfile::tempdir()?;
    let w = write(dir.path(), "tiny.json", TINY)?;
    let db = dir.path().join("perf.sqlite");
    let (code, out, err) = run(&[
        "tune",
        "--workload",
        &s(&w),
        "--budget",
        "60",
        "--perfdb",
        &s(&db),
        "--verify",
        "--json",
        "--time-cap",
        "0.1",
    ])?;
    assert_eq!(code, 0, "{err}");
    let v = json(&out)?;
    assert_eq!(v["points"], 5);
    assert_eq!(v["rows_written"], 10, "{out}");
    assert_eq!(v["budget_exhausted"], false);
    let results = v["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(results.len(), 10);
    assert!(results.iter().all(|r| r["status"] == "measured" && r["samples"].as_u64() >= Some(5)), "{out}");
    // One model pick per bucket.
    assert_eq!(results.iter().filter(|r| r["model_choice"] == true).count(), 5);
    // Time against size from bucket to bucket, per backend: 3 norm buckets and 2 attention
    // buckets make 3 neighbouring pairs for each backend's kernel (cpu, cpu_reference).
    let growth = v["growth"].as_array().cloned().unwrap_or_default();
    assert_eq!(growth.len(), 2, "{growth:?}");
    for g in &growth {
        assert_eq!(g["pairs"], 3, "{g}");
        assert!(g["worst_ratio"].as_f64().is_some_and(|r| r > 0.0) && g["kernel"].is_string(), "{g}");
    }
    let verify = &v["verify"];
    assert_eq!(verify["verified"], 5, "{out}");
    assert!(verify["perfdb"]["worst"].as_f64().is_some_and(|x| x >= 0.0));
    // The rows are in the PerfDB, from `tune`, for this machine.
    let opened = PerfDb::open(&db)?;
    let rows = opened.db.rows()?;
    assert_eq!(rows.len(), 10);
    let fp = v["fingerprint"].as_str().unwrap_or_default();
    assert!(rows.iter().all(|r| r.origin == "tune" && r.fingerprint == fp && r.samples >= 5));
    // Again, for people: nothing left to measure; the table and the regret summary print.
    let (code, out, err) = run(&["tune", "--workload", &s(&w), "--perfdb", &s(&db), "--verify", "--time-cap", "0.1"])?;
    assert_eq!(code, 0, "{err}");
    // Rows usable here are kept; one too noisy to trust (a loaded machine) is measured again.
    let counts: Vec<u64> = out
        .split(';')
        .nth(1)
        .map(|part| part.split(',').take(2).filter_map(|w| w.split_whitespace().next()?.parse().ok()).collect())
        .unwrap_or_default();
    assert!(counts.len() == 2 && counts[0] + counts[1] == 10 && counts[1] >= 5, "{counts:?}: {out}");
    assert!(out.contains("PICKED BY") && out.contains("model-only") && out.contains("perfdb-backed"), "{out}");
    assert!(out.contains("growth cpu: 3 neighbouring bucket pairs"), "{out}");
    assert!(err.is_empty(), "no progress bar when stderr is not a terminal: {err}");
    Ok(())
}

#[test]
fn a_spent_budget_lists_the_skipped_work() -> TestResult {
    let dir = tempfile::tempdir()?;
    let w = write(dir.path(), "tiny.json", TINY)?;
    let db = dir.path().join("perf.sqlite");
    let (code, out, err) = run(&["tune", "--workload", &s(&w), "--budget", "0", "--perfdb", &s(&db), "--json"])?;
    assert_eq!(code, 0, "{err}");
    let v = json(&out)?;
    assert_eq!(v["rows_written"], 0);
    assert_eq!(v["budget_exhausted"], true);
    let skipped = v["skipped"].as_array().cloned().unwrap_or_default();
    assert_eq!(skipped.len(), 10, "{out}");
    assert!(skipped.iter().all(|k| k["reason"] == "budget" && k["phase"] == "tune" && k["kernel"].is_string()));
    assert!(skipped.iter().any(|k| k["entry"] == "attn" && k["bucket"] == "batch=1,seq_q=9..16,seq_k=9..16"));
    let (code, out, _) = run(&["tune", "--workload", &s(&w), "--budget", "0", "--perfdb", &s(&db)])?;
    assert_eq!(code, 0);
    assert!(out.contains("skipped (10)") && out.contains("budget spent"), "{out}");
    assert!(out.contains("cpu_reference.rms_norm.naive"), "{out}");
    Ok(())
}

#[test]
fn a_bad_workload_exits_2_naming_the_file_and_the_field() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("perf.sqlite");
    let cases = [
        ("misspelled.json", TINY.replace("\"entries\"", "\"entrees\""), "\"entries\" is a required property"),
        ("range.json", TINY.replace("\"tokens\": [1, 4]", "\"tokens\": [4, 1]"), "ranges.tokens"),
        ("axis.json", TINY.replace("\"tokens\": [1, 4]", "\"seq_q\": [1, 4]"), "ranges.seq_q"),
        (
            "request.json",
            TINY.replace("\"dtype\": \"f32\", \"shape\": [64]", "\"dtype\": \"f33\", \"shape\": [64]"),
            "f33",
        ),
    ];
    for (name, text, field) in cases {
        let w = write(dir.path(), name, &text)?;
        let (code, out, err) = run(&["tune", "--workload", &s(&w), "--perfdb", &s(&db)])?;
        assert_eq!(code, 2, "{name}: {out}{err}");
        assert!(err.starts_with("lz: error: ") && err.lines().count() == 1, "{name}: {err}");
        assert!(err.contains(name) && err.contains(field), "{name}: {err}");
    }
    let (code, _, err) = run(&["tune", "--workload", "no/such/file.json", "--perfdb", &s(&db)])?;
    assert_eq!(code, 2);
    assert!(err.contains("no/such/file.json"), "{err}");
    let w = write(dir.path(), "tiny.json", TINY)?;
    let (code, _, err) = run(&["tune", "--workload", &s(&w), "--budget=-1", "--perfdb", &s(&db)])?;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--budget"), "{err}");
    assert!(!db.exists() || PerfDb::open(&db).is_ok_and(|o| o.db.rows().is_ok_and(|r| r.is_empty())));
    Ok(())
}

#[test]
fn the_shipped_workloads_are_valid_and_cover_their_buckets() -> TestResult {
    for name in ["regret-cpu.json", "llama-3-8b.json"] {
        let path = repo_root().join("workloads").join(name);
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{name}: {e}"))?;
        let w = layerzero::plan::workload::Workload::from_json(&text, name)?;
        let points = w.points().map_err(|e| format!("{name}: {e}"))?;
        assert!(points.len() >= 20, "{name}: {} points", points.len());
    }
    Ok(())
}

/// Issue 5's loop on this machine: tune, solve from the measurements, gate, serve.
#[test]
fn tune_then_solve_then_readiness_then_run_serves_measured_decisions() -> TestResult {
    let dir = tempfile::tempdir()?;
    let w = write(dir.path(), "w.json", TINY)?;
    let db = dir.path().join("db.sqlite");
    let table = dir.path().join("t.json");
    let (code, out, err) = run(&["tune", "--workload", &s(&w), "--perfdb", &s(&db), "--time-cap", "0.1"])?;
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = run(&["solve", "--workload", &s(&w), "--perfdb", &s(&db), "--out", &s(&table), "--json"])?;
    assert_eq!(code, 0, "{out}{err}");
    let solved: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    assert!(solved["header"]["perfdb_digest"].is_string(), "{solved}");
    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&table)?)?;
    let measured = t["entries"].as_array().map_or(0, |es| es.iter().filter(|e| e["source"] != "model").count());
    assert!(measured > 0, "no entry was decided by a measurement: {t}");
    let (code, out, err) = run(&["readiness-check", "--table", &s(&table), "--workload", &s(&w), "--perfdb", &s(&db)])?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("ready"), "{out}");
    let req = write(
        dir.path(),
        "req.json",
        r#"{"op": "rms_norm", "tensors": {"x": {"dtype": "f32", "shape": [3, 64]}, "weight": {"dtype": "f32", "shape": [64]}}}"#,
    )?;
    let inputs = dir.path().join("in.safetensors");
    let t = |shape: &[usize]| layerzero::tensor::HostTensor::from_f32(shape, vec![0.25; shape.iter().product()]);
    let map: std::collections::BTreeMap<String, layerzero::tensor::HostTensor> =
        [("x".to_owned(), t(&[3, 64])?), ("weight".to_owned(), t(&[64])?)].into();
    layerzero::tensor::io::write(&inputs, &map)?;
    let out_file = dir.path().join("out.safetensors");
    let (code, out, err) = run(&[
        "run",
        "--request",
        &s(&req),
        "--inputs",
        &s(&inputs),
        "--out",
        &s(&out_file),
        "--table",
        &s(&table),
        "--json",
    ])?;
    assert_eq!(code, 0, "{out}{err}");
    let ran: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    assert_eq!(ran["source"], "plan", "{ran}");
    Ok(())
}

/// Two `lz tune` processes on one PerfDB at once: both succeed and no row is lost.
#[test]
fn two_processes_tuning_at_once_lose_no_rows() -> TestResult {
    let dir = tempfile::tempdir()?;
    let w = write(dir.path(), "w.json", TINY)?;
    let db = dir.path().join("db.sqlite");
    // A thread's error crosses back as text: `Box<dyn Error>` is not `Send`.
    let spawn = || -> Result<std::process::Output, String> {
        let mut tune = lz().map_err(|e| e.to_string())?;
        tune.args(["tune", "--workload", &s(&w), "--perfdb", &s(&db), "--refresh", "--time-cap", "0.05"]);
        tune.output().map_err(|e| e.to_string())
    };
    let (a, b) = std::thread::scope(|sc| {
        let a = sc.spawn(spawn);
        let b = sc.spawn(spawn);
        (a.join(), b.join())
    });
    for out in [a, b] {
        let out = out.map_err(|_| "thread panicked")??;
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let opened = PerfDb::open(&db)?;
    assert!(opened.recovered.is_none());
    let stats = opened.db.stats()?;
    assert_eq!(stats.integrity, "ok");
    // Five buckets x two kernels: every (bucket, kernel) row present once (upserts, no duplicates).
    assert_eq!(stats.rows, 10);
    Ok(())
}
