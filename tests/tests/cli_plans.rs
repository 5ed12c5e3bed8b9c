//! `lz solve`, `lz readiness-check` and `lz run --table` end to end: solve a table on this
//! host, gate on it, serve from it; and every way a table can be wrong fails readiness
//! closed, naming the path and the field, with a fix.

use std::collections::BTreeMap;
use std::path::Path;

use layerzero::schema::{SchemaKind, violations};
use layerzero::tensor::HostTensor;

use crate::cli::run;
use layerzero_tests::TestResult;

const WORKLOAD: &str = r#"{"schema_version": 1, "name": "cli-plans", "entries": [
    {"name": "norm", "request": {"op": "rms_norm", "tensors": {
        "x": {"dtype": "f32", "shape": [4, 256]}, "weight": {"dtype": "f32", "shape": [256]}},
        "attrs": {"eps": 1e-6}}, "ranges": {"tokens": [1, 64]}}
]}"#;

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> TestResult<Setup> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("w.json"), WORKLOAD)?;
        Ok(Setup { dir })
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn solve(&self) -> TestResult<String> {
        let (code, out, err) = run(&[
            "solve",
            "--workload",
            &self.path("w.json"),
            "--perfdb",
            &self.path("db.sqlite"),
            "--out",
            &self.path("t.json"),
            "--json",
        ])?;
        assert_eq!(code, 0, "{out}{err}");
        let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
        assert!(violations(SchemaKind::SolveReport, &v).unwrap_or_default().is_empty(), "{v}");
        Ok(self.path("t.json"))
    }

    /// `lz run --table` of an rms_norm over `tokens` rows of 256.
    fn run_rms_norm(&self, tokens: usize, table: &str, extra: &[&str]) -> TestResult<(i32, String, String)> {
        let req = self.path("req.json");
        let text = format!(
            r#"{{"op": "rms_norm", "tensors": {{"x": {{"dtype": "f32", "shape": [{tokens}, 256]}}, "weight": {{"dtype": "f32", "shape": [256]}}}}, "attrs": {{"eps": 1e-6}}}}"#
        );
        std::fs::write(&req, text)?;
        let inputs = self.path("in.safetensors");
        let t = |shape: &[usize]| HostTensor::from_f32(shape, vec![0.5; shape.iter().product()]);
        let map: BTreeMap<String, HostTensor> =
            [("x".to_owned(), t(&[tokens, 256])?), ("weight".to_owned(), t(&[256])?)].into();
        layerzero::tensor::io::write(Path::new(&inputs), &map)?;
        let out = self.path("out.safetensors");
        let mut args = vec!["run", "--request", &req, "--inputs", &inputs, "--out", &out, "--table", table];
        args.extend_from_slice(extra);
        run(&args)
    }

    fn readiness(&self, table: &str) -> TestResult<(i32, serde_json::Value)> {
        let (code, out, err) = run(&[
            "readiness-check",
            "--table",
            table,
            "--workload",
            &self.path("w.json"),
            "--perfdb",
            &self.path("db.sqlite"),
            "--json",
        ])?;
        let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}{err}"))?;
        assert!(violations(SchemaKind::ReadinessReport, &v).unwrap_or_default().is_empty(), "{v}");
        Ok((code, v))
    }
}

/// The failed check `name` of a readiness report.
pub(crate) fn failed<'a>(v: &'a serde_json::Value, name: &str) -> TestResult<&'a serde_json::Value> {
    let checks = v["checks"].as_array();
    let check = checks.and_then(|cs| cs.iter().find(|c| c["name"] == name && c["ok"] == false));
    Ok(check.ok_or_else(|| format!("no failed check {name}: {v}"))?)
}

fn edit(path: &str, f: impl FnOnce(&mut serde_json::Value)) -> TestResult {
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    f(&mut v);
    std::fs::write(path, v.to_string())?;
    Ok(())
}

#[test]
fn solve_then_readiness_then_run_serves_from_the_table() -> TestResult {
    let s = Setup::new()?;
    let table = s.solve()?;
    let (code, v) = s.readiness(&table)?;
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["ready"], true);
    // A request inside a bucket (tokens 5 is in 5..8) is served by the table.
    let (code, out, err) = s.run_rms_norm(5, &table, &["--json"])?;
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    assert_eq!(v["source"], "plan", "{v}");
    assert_eq!(v["kernel"], "cpu.rms_norm.fast");
    // Outside every bucket of the table: live, with PLAN_BUCKET_MISS.
    let (code, out, err) = s.run_rms_norm(100, &table, &["--json"])?;
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    assert_eq!(v["source"], "live");
    assert_eq!(v["plan_notes"][0]["code"], "PLAN_BUCKET_MISS", "{v}");
    // Strict plan mode refuses the miss.
    let (code, _, err) = s.run_rms_norm(100, &table, &["--plan-mode", "strict"])?;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("PLAN_BUCKET_MISS"), "{err}");
    Ok(())
}

#[test]
fn solving_twice_gives_the_same_table_apart_from_the_time() -> TestResult {
    let s = Setup::new()?;
    let table = s.solve()?;
    let first = std::fs::read_to_string(&table)?;
    std::thread::sleep(std::time::Duration::from_millis(1100));
    s.solve()?;
    let second = std::fs::read_to_string(&table)?;
    let strip = |t: &str| t.lines().filter(|l| !l.contains("\"created_at\"")).collect::<Vec<_>>().join("\n");
    assert_eq!(strip(&first), strip(&second));
    Ok(())
}

#[test]
fn a_table_with_invalid_json_fails_readiness_naming_the_path() -> TestResult {
    let s = Setup::new()?;
    let table = s.solve()?;
    std::fs::write(&table, "{ not json")?;
    let (code, v) = s.readiness(&table)?;
    assert_eq!(code, 1);
    let c = failed(&v, "table")?;
    assert!(c["detail"].as_str().is_some_and(|d| d.contains("t.json") && d.contains("invalid JSON")), "{c}");
    assert!(c["fix"].as_str().is_some_and(|f| f.contains("lz solve")), "{c}");
    Ok(())
}

#[test]
fn a_table_violating_its_schema_fails_readiness_naming_the_field() -> TestResult {
    let s = Setup::new()?;
    let table = s.solve()?;
    edit(&table, |v| v["entries"][0]["expected_ns"] = serde_json::json!("fast"))?;
    let (code, v) = s.readiness(&table)?;
    assert_eq!(code, 1);
    let c = failed(&v, "table")?;
    assert!(c["detail"].as_str().is_some_and(|d| d.contains("/entries/0/expected_ns")), "{c}");
    Ok(())
}

#[test]
fn a_table_for_other_hardware_or_policy_fails_readiness_with_the_reason_and_the_command() -> TestResult {
    let s = Setup::new()?;
    let table = s.solve()?;
    edit(&table, |v| v["header"]["hardware"]["fingerprint"] = serde_json::json!("0123456789abcdef"))?;
    let (code, v) = s.readiness(&table)?;
    assert_eq!(code, 1);
    let c = failed(&v, "table_matches_host")?;
    assert!(c["detail"].as_str().is_some_and(|d| d.contains("PLAN_HARDWARE_MISMATCH")), "{c}");
    assert!(c["fix"].as_str().is_some_and(|f| f.contains("lz solve --workload")), "{c}");
    let table = s.solve()?;
    edit(&table, |v| v["header"]["policy_hash"] = serde_json::json!("f".repeat(64)))?;
    let (_, v) = s.readiness(&table)?;
    assert!(failed(&v, "table_matches_host")?["detail"].as_str().is_some_and(|d| d.contains("PLAN_POLICY_MISMATCH")));
    Ok(())
}

#[test]
fn a_table_missing_buckets_of_the_workload_reports_its_coverage() -> TestResult {
    let s = Setup::new()?;
    let table = s.solve()?;
    edit(&table, |v| {
        if let Some(es) = v["entries"].as_array_mut() {
            es.truncate(3);
        }
    })?;
    let (code, v) = s.readiness(&table)?;
    assert_eq!(code, 1);
    let c = failed(&v, "coverage")?;
    assert!(c["detail"].as_str().is_some_and(|d| d.contains("3 of 7 buckets")), "{c}");
    Ok(())
}

#[test]
fn a_garbage_perfdb_fails_readiness_and_is_moved_aside() -> TestResult {
    let s = Setup::new()?;
    let table = s.solve()?;
    std::fs::write(s.path("db.sqlite"), b"this is not a database")?;
    let (code, v) = s.readiness(&table)?;
    assert_eq!(code, 1);
    let c = failed(&v, "perfdb")?;
    assert!(c["detail"].as_str().is_some_and(|d| d.contains("moved aside")), "{c}");
    let moved = std::fs::read_dir(s.dir.path())?
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().contains("db.sqlite.corrupt-"));
    assert!(moved, "the damaged file is kept");
    Ok(())
}

#[test]
fn doctor_reports_the_configured_table_loaded_or_refused() -> TestResult {
    let s = Setup::new()?;
    let table = s.solve()?;
    let doctor = |t: &str| -> TestResult<_> {
        let out = crate::cli::lz()?
            .args(["doctor", "--json", "--perfdb", &s.path("db.sqlite")])
            .env("LAYERZERO_DISPATCH_TABLE", t)
            .output()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        assert!(violations(SchemaKind::Doctor, &v).unwrap_or_default().is_empty(), "{v}");
        Ok((out.status.code(), v["plan"].clone()))
    };
    let (_, plan) = doctor(&table)?;
    assert_eq!(plan["status"], "loaded", "{plan}");
    assert_eq!(plan["entries"], 7);
    let spr = layerzero_tests::repo_root().join("dispatch_tables/spr-llama-3-8b.json").display().to_string();
    let (code, plan) = doctor(&spr)?;
    assert_eq!(code, Some(1));
    assert_eq!(plan["status"], "refused");
    assert!(plan["reason"].as_str().is_some_and(|r| r.contains("PLAN_HARDWARE_MISMATCH")), "{plan}");
    Ok(())
}
