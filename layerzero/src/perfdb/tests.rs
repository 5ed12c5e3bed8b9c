use super::*;
use crate::TestResult;

fn row(kernel: &str, fingerprint: &str, bucket: &str, median: f64) -> Row {
    Row {
        kernel: kernel.to_owned(),
        kernel_version: "1".to_owned(),
        backend: kernel.split('.').next().unwrap_or("cpu").to_owned(),
        backend_version: "0.1.0".to_owned(),
        fingerprint: fingerprint.to_owned(),
        op: "attention".to_owned(),
        key: "bf16/d128/causal".to_owned(),
        bucket: bucket.to_owned(),
        samples: 20,
        median_ns: median,
        p10_ns: median * 0.9,
        p90_ns: median * 1.1,
        mad_ns: median * 0.01,
        cv: 0.02,
        origin: "test".to_owned(),
        created_at: 1_700_000_000,
    }
}

fn fresh(dir: &tempfile::TempDir) -> TestResult<PerfDb> {
    let opened = PerfDb::open(&dir.path().join("sub/dir/perfdb.sqlite"))?;
    assert!(opened.recovered.is_none());
    Ok(opened.db)
}

#[test]
fn round_trip_and_order() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = fresh(&dir)?;
    let rows = vec![row("cpu.b", "hw2", "64", 10.0), row("cpu.a", "hw1", "128", 20.5), row("cpu.a", "hw1", "64", 3.25)];
    db.insert_many(&rows)?;
    let got = db.rows()?;
    assert_eq!(got, vec![rows[1].clone(), rows[2].clone(), rows[0].clone()]);
    assert_eq!(db.rows_for("hw1")?, vec![rows[1].clone(), rows[2].clone()]);
    assert!(db.rows_for("nope")?.is_empty());
    let mode: String = db.conn().query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    assert_eq!(mode, "wal");
    // Reopening finds the rows.
    let path = db.path().to_path_buf();
    drop(db);
    let again = PerfDb::open(&path)?;
    assert!(again.recovered.is_none());
    assert_eq!(again.db.rows()?.len(), 3);
    Ok(())
}

#[test]
fn upsert_latest_wins() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = fresh(&dir)?;
    db.insert(&row("cpu.a", "hw1", "64", 10.0))?;
    let mut newer = row("cpu.a", "hw1", "64", 7.0);
    newer.created_at += 60;
    newer.origin = "retune".to_owned();
    db.insert(&newer)?;
    assert_eq!(db.rows()?, vec![newer.clone()]);
    // A different kernel version is a different series.
    let mut v2 = newer.clone();
    v2.kernel_version = "2".to_owned();
    db.insert(&v2)?;
    assert_eq!(db.rows()?.len(), 2);
    // Within one batch, the last of a key wins.
    let mut last = newer.clone();
    last.median_ns = 5.0;
    db.insert_many(&[newer.clone(), last.clone()])?;
    assert!(db.rows()?.contains(&last));
    Ok(())
}

#[test]
fn invalid_rows_are_refused_and_nothing_of_the_batch_is_stored() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = fresh(&dir)?;
    let mut bad = row("cpu.a", "hw1", "64", 10.0);
    bad.p90_ns = f64::NAN;
    let err = db
        .insert_many(&[row("cpu.b", "hw1", "64", 1.0), bad])
        .err()
        .ok_or("a batch with an unusable row must be refused")?
        .to_string();
    assert!(err.contains("p90_ns") && err.contains("NaN") && err.contains("cpu.a"), "{err}");
    let mut empty = row("cpu.a", "hw1", "64", 10.0);
    empty.fingerprint = String::new();
    assert!(
        db.insert(&empty).is_err_and(|e| e.kind() == ErrorKind::InvalidInput && e.message().contains("fingerprint"))
    );
    let mut zero = row("cpu.a", "hw1", "64", 10.0);
    zero.samples = 0;
    assert!(db.insert(&zero).is_err());
    assert!(db.rows()?.is_empty());
    Ok(())
}

#[test]
fn digest_ignores_order_and_time_but_not_measurements() -> TestResult {
    let dir = tempfile::tempdir()?;
    let a = PerfDb::open(&dir.path().join("a.sqlite"))?.db;
    let b = PerfDb::open(&dir.path().join("b.sqlite"))?.db;
    let rows = vec![row("cpu.b", "hw2", "64", 10.0), row("cpu.a", "hw1", "128", 20.5), row("cpu.a", "hw1", "64", 3.25)];
    let empty = a.digest()?;
    assert_eq!(empty.len(), 64);
    a.insert_many(&rows)?;
    for r in rows.iter().rev() {
        let mut r = r.clone();
        r.created_at += 1000;
        b.insert(&r)?;
    }
    assert_eq!(a.digest()?, b.digest()?);
    assert_eq!(a.digest()?, digest_rows(&rows));
    assert_ne!(a.digest()?, empty);
    b.insert(&row("cpu.a", "hw1", "64", 3.5))?;
    assert_ne!(a.digest()?, b.digest()?);
    Ok(())
}

#[test]
fn stats_count_rows_fingerprints_and_last_tune() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = fresh(&dir)?;
    let s = db.stats()?;
    assert_eq!((s.rows, s.fingerprints, s.last_tune), (0, 0, None));
    assert_eq!((s.integrity.as_str(), s.schema_version), ("ok", SCHEMA_VERSION));
    let mut late = row("cpu.a", "hw2", "64", 1.0);
    late.created_at = 1_800_000_000;
    db.insert_many(&[row("cpu.a", "hw1", "64", 1.0), row("cpu.b", "hw1", "64", 1.0), late])?;
    let s = db.stats()?;
    assert_eq!((s.rows, s.fingerprints, s.last_tune), (3, 2, Some(1_800_000_000)));
    assert_eq!(s.path, db.path());
    Ok(())
}

fn set_version(path: &Path, v: &str) -> rusqlite::Result<()> {
    let conn = Connection::open(path)?;
    conn.execute("UPDATE meta SET value = ?1 WHERE name = 'schema_version'", [v])?;
    Ok(())
}

fn assert_moved(path: &Path, recovered: Option<&Recovery>, content: &[u8], why: &str) -> TestResult {
    let r = recovered.ok_or("not recovered")?;
    assert!(r.why.contains(why), "{r:?}");
    let name = r.moved_to.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    assert!(name.starts_with("perfdb.sqlite.corrupt-"), "{name}");
    assert_eq!(r.moved_to.parent(), path.parent());
    assert_eq!(std::fs::read(&r.moved_to)?, content);
    Ok(())
}

#[test]
fn garbage_is_moved_aside_with_its_content() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("perfdb.sqlite");
    let garbage = b"this is not a database, but someone's notes\n".repeat(200);
    std::fs::write(&path, &garbage)?;
    let opened = PerfDb::open(&path)?;
    assert_moved(&path, opened.recovered.as_ref(), &garbage, "not an SQLite database")?;
    opened.db.insert(&row("cpu.a", "hw1", "64", 1.0))?;
    assert_eq!(opened.db.rows()?.len(), 1);
    Ok(())
}

#[test]
fn damaged_body_with_a_valid_header_is_moved_aside() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("perfdb.sqlite");
    {
        let db = PerfDb::open(&path)?.db;
        db.insert_many(&(0..200).map(|i| row("cpu.a", "hw1", &i.to_string(), 1.0)).collect::<Vec<_>>())?;
        db.conn().execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?;
    }
    // Keep the header, scribble over every page after the first.
    let mut bytes = std::fs::read(&path)?;
    assert!(bytes.len() > 8192);
    for b in bytes.iter_mut().skip(4096) {
        *b = 0x5a;
    }
    std::fs::write(&path, &bytes)?;
    let opened = PerfDb::open(&path)?;
    assert_moved(&path, opened.recovered.as_ref(), &bytes, "")?;
    assert!(opened.db.rows()?.is_empty());
    Ok(())
}

#[test]
fn truncated_file_is_moved_aside() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("perfdb.sqlite");
    {
        let db = PerfDb::open(&path)?.db;
        db.insert(&row("cpu.a", "hw1", "64", 1.0))?;
        db.conn().execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?;
    }
    for len in [100usize, 60, 4000] {
        let whole = std::fs::read(&path)?;
        let cut = whole[..len.min(whole.len())].to_vec();
        std::fs::write(&path, &cut)?;
        for side in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(recover::with_suffix(&path, side));
        }
        let opened = PerfDb::open(&path)?;
        assert_moved(&path, opened.recovered.as_ref(), &cut, "")?;
        opened.db.insert(&row("cpu.a", "hw1", "64", 1.0))?;
        opened.db.conn().execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?;
    }
    Ok(())
}

#[test]
fn a_newer_schema_is_left_untouched_and_refused_or_skipped_with_a_reason() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("perfdb.sqlite");
    drop(PerfDb::open(&path)?);
    set_version(&path, "99")?;
    let before = std::fs::read(&path)?;
    let err = PerfDb::open(&path).err().ok_or("opened a newer PerfDB")?;
    assert!(err.message().contains("schema version 99 is newer") && err.message().contains("left untouched"), "{err}");
    let skipped = PerfDb::open_for_reading(&path)?.err().ok_or("read a newer PerfDB")?;
    assert!(skipped.contains("schema version 99 is newer"), "{skipped}");
    assert_eq!(std::fs::read(&path)?, before, "the file is as it was");
    let siblings = std::fs::read_dir(dir.path())?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains("corrupt"))
        .count();
    assert_eq!(siblings, 0, "nothing was moved aside");
    Ok(())
}

#[cfg(unix)]
#[test]
fn a_device_named_as_the_perfdb_is_refused_and_never_moved() -> TestResult {
    use std::os::unix::fs::FileTypeExt;
    if !std::path::Path::new("/dev/zero").exists() {
        return Ok(());
    }
    let err = PerfDb::open(std::path::Path::new("/dev/zero")).err().ok_or("opened /dev/zero")?;
    assert!(err.message().contains("not a regular file") && err.message().contains("LAYERZERO_PERFDB"), "{err}");
    assert!(std::fs::metadata("/dev/zero")?.file_type().is_char_device(), "/dev/zero is still the device");
    Ok(())
}

#[test]
fn an_unreadable_schema_is_moved_aside() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("perfdb.sqlite");
    drop(PerfDb::open(&path)?);
    set_version(&path, "x")?;
    let opened = PerfDb::open(&path)?;
    let r = opened.recovered.clone().ok_or("not recovered")?;
    assert!(r.why.contains("\"x\" is not a number"), "{r:?}");
    // The file moved aside still says what it was.
    let moved = Connection::open(&r.moved_to)?;
    let kept: String = moved.query_row("SELECT value FROM meta WHERE name = 'schema_version'", [], |r| r.get(0))?;
    assert_eq!(kept, "x");
    assert_eq!(opened.db.stats()?.schema_version, SCHEMA_VERSION);
    Ok(())
}

#[test]
fn a_foreign_database_is_refused_and_left_alone() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("perfdb.sqlite");
    Connection::open(&path)?.execute_batch("CREATE TABLE accounts (id INTEGER); INSERT INTO accounts VALUES (7);")?;
    let err = PerfDb::open(&path).err().ok_or("opened a foreign database")?;
    assert!(err.message().contains("not a LayerZero PerfDB") && err.message().contains("accounts"), "{err}");
    assert!(err.message().contains(&path.display().to_string()));
    let n: i64 = Connection::open(&path)?.query_row("SELECT id FROM accounts", [], |r| r.get(0))?;
    assert_eq!(n, 7);
    assert_eq!(std::fs::read_dir(dir.path())?.count(), 1);
    Ok(())
}

#[test]
fn an_empty_file_becomes_a_database() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("perfdb.sqlite");
    std::fs::write(&path, b"")?;
    let opened = PerfDb::open(&path)?;
    assert!(opened.recovered.is_none());
    assert_eq!(opened.db.stats()?.schema_version, SCHEMA_VERSION);
    Ok(())
}

#[test]
fn unopenable_path_is_an_error_naming_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"x")?;
    let path = blocker.join("perfdb.sqlite");
    let err = PerfDb::open(&path).err().ok_or("opened under a file")?;
    assert_eq!(err.kind(), ErrorKind::Io);
    assert!(err.message().contains(&path.display().to_string()), "{err}");
    Ok(())
}

#[test]
fn threads_share_one_handle() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = std::sync::Arc::new(fresh(&dir)?);
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || -> Result<()> {
                for i in 0..50 {
                    db.insert(&row(&format!("cpu.k{t}"), "hw1", &i.to_string(), 1.0))?;
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "thread panicked")??;
    }
    assert_eq!(db.rows()?.len(), 200);
    Ok(())
}

#[test]
fn rows_with_unusable_values_are_skipped_and_counted_not_fatal() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("perfdb.sqlite");
    let db = PerfDb::open(&path)?.db;
    db.insert_many(&[row("cpu.a", "hw1", "64", 5.0), row("cpu.b", "hw1", "64", 6.0), row("cpu.c", "hw1", "64", 7.0)])?;
    let conn = Connection::open(&path)?;
    conn.execute("UPDATE perf SET samples = -3 WHERE kernel = 'cpu.b'", [])?;
    conn.execute("UPDATE perf SET median_ns = -1.0 WHERE kernel = 'cpu.c'", [])?;
    drop(conn);
    let rows = db.rows_for("hw1")?;
    assert_eq!(rows.iter().map(|r| r.kernel.as_str()).collect::<Vec<_>>(), vec!["cpu.a"]);
    let (n, why) = db.skipped_rows();
    assert_eq!(n, 2);
    assert!(why.is_some_and(|w| w.contains("cpu.c") && w.contains("median_ns")));
    Ok(())
}

fn parity_record(kernel: &str, fingerprint: &str, bucket: &str, status: ParityStatus) -> ParityRecord {
    ParityRecord {
        kernel: kernel.to_owned(),
        kernel_version: "1".to_owned(),
        backend: kernel.split('.').next().unwrap_or("cpu").to_owned(),
        backend_version: "0.1.0".to_owned(),
        fingerprint: fingerprint.to_owned(),
        op: "linear".to_owned(),
        dtype: "f32".to_owned(),
        key: "k".to_owned(),
        bucket: bucket.to_owned(),
        case: "linear f32".to_owned(),
        status,
        nmse: Some(if status == ParityStatus::Pass { 1e-12 } else { 0.9 }),
        max_abs: Some(if status == ParityStatus::Pass { 1e-6 } else { f64::INFINITY }),
        cosine: Some(if status == ParityStatus::Pass { 1.0 } else { 0.006 }),
        rtol: 1e-4,
        atol: 1e-5,
        detail: (status == ParityStatus::Fail).then(|| "64 of 64 elements outside the tolerance".to_owned()),
        origin: "test".to_owned(),
        created_at: 1_700_000_000,
    }
}

#[test]
fn parity_records_round_trip_replace_and_count() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = fresh(&dir)?;
    let a = parity_record("cpu.linear.fast", "hw1", "m=1", ParityStatus::Pass);
    let b = parity_record("onednn.linear.matmul", "hw1", "m=1", ParityStatus::Fail);
    let c = parity_record("cpu.linear.fast", "hw2", "m=1", ParityStatus::Fail);
    db.insert_parity(&[a.clone(), b.clone(), c.clone()])?;
    assert_eq!(db.parity_for("hw1")?, vec![a.clone(), b.clone()]);
    assert_eq!(db.parity()?.len(), 3);
    let s = db.stats()?;
    assert_eq!((s.parity_records, s.parity_failed, s.rows), (3, 2, 0));
    // A new comparison of the same thing replaces the old one.
    let fixed = ParityRecord {
        created_at: 1_700_000_100,
        ..parity_record("onednn.linear.matmul", "hw1", "m=1", ParityStatus::Pass)
    };
    db.insert_parity(std::slice::from_ref(&fixed))?;
    assert_eq!(db.parity_for("hw1")?, vec![a, fixed]);
    assert_eq!(db.stats()?.parity_failed, 1);
    Ok(())
}

#[test]
fn a_nonsense_parity_record_is_refused_on_write_and_skipped_on_read() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = fresh(&dir)?;
    let bad = ParityRecord { cosine: Some(3.0), ..parity_record("cpu.x", "hw1", "m=1", ParityStatus::Pass) };
    let err = db.insert_parity(&[bad]).err().ok_or("a cosine of 3 must be refused")?.to_string();
    assert!(err.contains("cosine = 3"), "{err}");
    db.insert_parity(&[parity_record("cpu.x", "hw1", "m=1", ParityStatus::Pass)])?;
    db.conn().execute_batch("UPDATE parity SET status = 'maybe'")?;
    assert!(db.parity()?.is_empty());
    let (skipped, why) = db.skipped_rows();
    assert_eq!(skipped, 1);
    assert!(why.unwrap_or_default().contains("neither pass nor fail"));
    Ok(())
}

#[test]
fn a_version_1_file_opens_with_its_rows_and_an_empty_parity_table() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("v1.sqlite");
    {
        let conn = rusqlite::Connection::open(&path)?;
        conn.execute_batch(schema::CREATE_V1)?;
        conn.execute_batch("INSERT INTO meta (name, value) VALUES ('schema_version', '1')")?;
        conn.execute(
            &format!(
                "INSERT INTO perf ({COLUMNS}, layerzero_version) VALUES ('cpu.a', '1', 'cpu', '0.1.0', 'hw1', \
                      'attention', 'k', '64', 20, 10.0, 9.0, 11.0, 0.1, 0.02, 'test', 1700000000, 'old')"
            ),
            [],
        )?;
    }
    let opened = PerfDb::open(&path)?;
    assert!(opened.recovered.is_none());
    assert_eq!(opened.db.rows()?.len(), 1);
    assert!(opened.db.parity()?.is_empty());
    assert_eq!(opened.db.stats()?.schema_version, SCHEMA_VERSION);
    Ok(())
}
