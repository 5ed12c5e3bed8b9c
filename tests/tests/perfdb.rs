//! The PerfDB through the public API and `lz doctor`: round trip, upsert, digest, recovery of
//! damaged files (moved aside, never lost), several processes writing at once, and the knobs
//! that choose its path.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use layerzero::perfdb::{PerfDb, Row, SCHEMA_VERSION, digest_rows};
use layerzero::schema::{SchemaKind, violations};
use layerzero_tests::{TestResult, lz};

fn row(kernel: &str, bucket: &str, median: f64) -> Row {
    Row {
        kernel: kernel.to_owned(),
        kernel_version: "1".to_owned(),
        backend: "cpu".to_owned(),
        backend_version: "0.1.0".to_owned(),
        fingerprint: "hw-test".to_owned(),
        op: "rms_norm".to_owned(),
        key: "f32/hidden4096".to_owned(),
        bucket: bucket.to_owned(),
        samples: 30,
        median_ns: median,
        p10_ns: median * 0.95,
        p90_ns: median * 1.05,
        mad_ns: 1.0,
        cv: 0.01,
        origin: "test".to_owned(),
        created_at: 1_750_000_000,
    }
}

#[test]
fn round_trip_upsert_and_digest() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("nested/perfdb.sqlite");
    let rows: Vec<Row> = (0..10).map(|i| row("cpu.rms_norm", &format!("b{i:02}"), 100.0 + f64::from(i))).collect();
    let digest = {
        let opened = PerfDb::open(&path)?;
        assert!(opened.recovered.is_none());
        opened.db.insert_many(&rows)?;
        let mut newer = rows[3].clone();
        newer.median_ns = 42.0;
        newer.created_at += 10;
        opened.db.insert(&newer)?;
        let got = opened.db.rows()?;
        assert_eq!(got.len(), 10);
        assert_eq!(got[3], newer);
        opened.db.digest()?
    };
    // Reopened: same rows, same digest; a copy written backwards at another time agrees.
    let again = PerfDb::open(&path)?.db;
    assert_eq!(again.digest()?, digest);
    let other = PerfDb::open(&dir.path().join("other.sqlite"))?.db;
    for r in again.rows()?.iter().rev() {
        let mut r = r.clone();
        r.created_at = 0;
        other.insert(&r)?;
    }
    assert_eq!(other.digest()?, digest);
    assert_eq!(digest_rows(&other.rows()?), digest);
    let stats = again.stats()?;
    assert_eq!((stats.rows, stats.fingerprints, stats.last_tune), (10, 1, Some(1_750_000_010)));
    assert_eq!((stats.integrity.as_str(), stats.schema_version), ("ok", SCHEMA_VERSION));
    assert_eq!(again.rows_for("hw-test")?.len(), 10);
    assert!(again.rows_for("other")?.is_empty());
    Ok(())
}

#[test]
fn garbage_and_truncated_files_are_moved_aside_not_lost() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("perfdb.sqlite");
    // A real database, closed (its WAL folded back into the file).
    {
        let db = PerfDb::open(&path)?.db;
        db.insert_many(&(0..50).map(|i| row("cpu.rms_norm", &i.to_string(), 1.0)).collect::<Vec<_>>())?;
    }
    let whole = std::fs::read(&path)?;
    assert!(whole.len() > 100);
    let truncated = whole[..100].to_vec();
    let garbage = b"\x00\x01 not sqlite at all \xff".repeat(64);
    let mut seen = Vec::new();
    for content in [truncated, garbage] {
        std::fs::write(&path, &content)?;
        let opened = PerfDb::open(&path)?;
        let r = opened.recovered.ok_or("the damaged file was not reported")?;
        assert_eq!(std::fs::read(&r.moved_to)?, content, "{r:?}");
        assert!(!r.why.is_empty());
        assert!(!seen.contains(&r.moved_to), "{r:?} overwrote an earlier one");
        seen.push(r.moved_to);
        // The fresh database works.
        opened.db.insert(&row("cpu.rms_norm", "1", 1.0))?;
        assert_eq!(opened.db.rows()?.len(), 1);
    }
    Ok(())
}

/// Child mode of [`processes_writing_at_once_lose_nothing`]: inserts 300 rows one transaction
/// at a time into the database named by `LAYERZERO_TEST_PERFDB_CHILD`.
#[test]
#[ignore = "run by processes_writing_at_once_lose_nothing in child processes"]
fn child_inserts() -> TestResult {
    let (Some(path), Some(id)) =
        (std::env::var_os("LAYERZERO_TEST_PERFDB_CHILD"), std::env::var("LAYERZERO_TEST_PERFDB_ID").ok())
    else {
        return Ok(());
    };
    let db = PerfDb::open(Path::new(&path))?.db;
    for i in 0..300 {
        db.insert(&row(&format!("cpu.child{id}"), &i.to_string(), f64::from(i)))?;
    }
    Ok(())
}

#[test]
fn processes_writing_at_once_lose_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    // Not created beforehand: the children also race to create it.
    let path = dir.path().join("perfdb.sqlite");
    let exe = std::env::current_exe()?;
    let children: Vec<_> = (0..4)
        .map(|id| {
            std::process::Command::new(&exe)
                .args(["--exact", "child_inserts", "--ignored", "--test-threads=1"])
                .env("LAYERZERO_TEST_PERFDB_CHILD", &path)
                .env("LAYERZERO_TEST_PERFDB_ID", id.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    for child in children {
        let out = child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("1 passed"), "the child test did not run: {text}");
    }
    let opened = PerfDb::open(&path)?;
    assert!(opened.recovered.is_none());
    let rows = opened.db.rows()?;
    assert_eq!(rows.len(), 1200);
    for id in 0..4 {
        assert_eq!(rows.iter().filter(|r| r.kernel == format!("cpu.child{id}")).count(), 300);
    }
    assert_eq!(opened.db.stats()?.integrity, "ok");
    Ok(())
}

fn doctor_json(cmd: &mut Command, perfdb: Option<&Path>) -> TestResult<(i32, serde_json::Value)> {
    cmd.args(["doctor", "--json"]);
    if let Some(p) = perfdb {
        cmd.arg("--perfdb").arg(p);
    }
    let out = cmd.output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{e}: {text}{}", String::from_utf8_lossy(&out.stderr)))?;
    let problems = violations(SchemaKind::Doctor, &v).unwrap_or_default();
    assert!(problems.is_empty(), "{problems:?}\n{text}");
    Ok((out.status.code().unwrap_or(-1), v))
}

#[test]
fn doctor_reports_a_recovery() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("perfdb.sqlite");
    std::fs::write(&path, b"definitely not a database")?;
    let (code, v) = doctor_json(lz()?.env("LAYERZERO_HOME", dir.path()), Some(&path))?;
    assert_eq!(code, 0, "{v}");
    let db = &v["perfdb"];
    assert_eq!(db["path"], path.display().to_string());
    assert_eq!(db["exists"], true);
    assert_eq!(db["rows"], 0);
    assert_eq!(db["integrity"], "ok");
    assert_eq!(db["schema_version"], SCHEMA_VERSION);
    let moved = db["recovered"]["moved_to"].as_str().ok_or("no recovery reported")?;
    assert_eq!(std::fs::read(moved)?, b"definitely not a database");
    assert!(db["recovered"]["why"].as_str().is_some_and(|w| w.contains("not an SQLite database")), "{db}");

    // The text form says so too; a healthy file afterwards reports no recovery.
    std::fs::write(&path, b"garbage again")?;
    let out = lz()?.env("LAYERZERO_HOME", dir.path()).args(["doctor", "--perfdb"]).arg(&path).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("RECOVERED") && text.contains("moved aside to") && text.contains(".corrupt-"), "{text}");
    assert!(text.contains("LAYERZERO_PLAN_MODE") && text.contains("enum(off|prefer|strict)"), "{text}");
    let (code, v) = doctor_json(lz()?.env("LAYERZERO_HOME", dir.path()), Some(&path))?;
    assert_eq!(code, 0);
    assert!(v["perfdb"]["recovered"].is_null(), "{v}");
    Ok(())
}

#[test]
fn doctor_finds_the_perfdb_through_the_knobs_and_never_creates_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (code, v) = doctor_json(lz()?.env("LAYERZERO_HOME", dir.path()), None)?;
    assert_eq!(code, 0, "{v}");
    let expected: PathBuf = dir.path().join("perfdb.sqlite");
    assert_eq!(v["perfdb"]["path"], expected.display().to_string());
    assert_eq!(v["perfdb"]["exists"], false);
    assert!(v["perfdb"]["rows"].is_null());
    assert!(!expected.exists(), "doctor created the PerfDB");

    let explicit = dir.path().join("elsewhere/db.sqlite");
    let (_, v) = doctor_json(lz()?.env("LAYERZERO_HOME", dir.path()).env("LAYERZERO_PERFDB", &explicit), None)?;
    assert_eq!(v["perfdb"]["path"], explicit.display().to_string());

    // Every knob is listed with its current value; a bad value fails the check, naming it.
    let (code, v) = doctor_json(
        lz()?
            .env("LAYERZERO_HOME", dir.path())
            .env("LAYERZERO_PLAN_MODE", "sometimes")
            .env("LAYERZERO_CACHE_CAPACITY", "64"),
        None,
    )?;
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["ok"], false);
    let knobs = v["knobs"].as_array().ok_or("no knobs")?;
    assert_eq!(knobs.len(), layerzero::knobs::all().len());
    let find = |name: &str| knobs.iter().find(|k| k["name"] == name).cloned().unwrap_or_default();
    assert_eq!(find("LAYERZERO_CACHE_CAPACITY")["current"], "64");
    assert!(find("LAYERZERO_CACHE_CAPACITY")["error"].is_null());
    assert_eq!(find("LAYERZERO_PLAN_MODE")["type"], "enum(off|prefer|strict)");
    assert_eq!(find("LAYERZERO_PLAN_MODE")["default"], "prefer");
    let err = find("LAYERZERO_PLAN_MODE")["error"].as_str().unwrap_or_default().to_owned();
    assert!(err.contains("LAYERZERO_PLAN_MODE") && err.contains("sometimes"), "{err}");
    assert_eq!(find("LAYERZERO_CACHE_CAPACITY")["default"], "4096");
    assert!(find("LAYERZERO_DISPATCH_TABLE")["current"].is_null());
    Ok(())
}
