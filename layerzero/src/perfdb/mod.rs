//! The PerfDB: measured kernel timings on disk (SQLite in WAL mode, safe across processes).
//!
//! This is an I/O edge module: the pure selection core never reads it. The core is handed an
//! in-memory snapshot built from [`Row`]s.
//!
//! One row per measurement series, keyed by what was measured: kernel and kernel version,
//! backend version, hardware fingerprint, op, validity key and bucket. A new measurement of the
//! same thing replaces the old one. A file that is not a healthy PerfDB of a layout this build
//! understands (not SQLite, truncated, failing `PRAGMA quick_check`, an unreadable schema
//! version) is moved aside to `<name>.corrupt-<unix-seconds>[-n]` with its `-wal`/`-shm` files,
//! never deleted, and a fresh database is created; [`Opened::recovered`] says so. Two things are
//! never touched: a path that is not a regular file (a device node, a FIFO: refused), and a
//! PerfDB of a newer schema (another layerzero's: refused by [`PerfDb::open`], skipped with
//! a reason by [`PerfDb::open_for_reading`]).

pub mod parity;
mod recover;
mod schema;
pub mod stats;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use rusqlite::{Connection, ErrorCode, TransactionBehavior, params};
use serde::{Deserialize, Serialize};

pub use parity::{ParityRecord, ParityStatus};
pub use schema::CURRENT_VERSION as SCHEMA_VERSION;
pub use stats::{Summary, summarize};

use crate::error::{Error, ErrorKind, Result};
use schema::Found;

/// How long a writer waits for another process's lock before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// One measurement series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Kernel id, e.g. `cpu.attention.flash`.
    pub kernel: String,
    /// The kernel's version.
    pub kernel_version: String,
    /// Its backend.
    pub backend: String,
    /// The backend's version.
    pub backend_version: String,
    /// Hardware fingerprint of the machine measured on.
    pub fingerprint: String,
    /// Canonical op name.
    pub op: String,
    /// The validity key (exact fields) of the requests measured.
    pub key: String,
    /// The perf bucket.
    pub bucket: String,
    /// Samples kept (after outlier rejection).
    pub samples: u32,
    /// Median, ns.
    pub median_ns: f64,
    /// 10th percentile, ns.
    pub p10_ns: f64,
    /// 90th percentile, ns.
    pub p90_ns: f64,
    /// Median absolute deviation, ns.
    pub mad_ns: f64,
    /// Coefficient of variation of the kept samples.
    pub cv: f64,
    /// Who measured: e.g. `lz tune`, `runtime`, `import`.
    pub origin: String,
    /// When, in Unix seconds.
    pub created_at: i64,
}

impl Row {
    /// Checks that the row can be stored: the identifying text fields are not empty, there is at
    /// least one sample, and every timing is a finite, non-negative number.
    pub fn validate(&self) -> Result<()> {
        let what = || format!("perfdb row for kernel {:?} bucket {:?}", self.kernel, self.bucket);
        for (field, v) in [
            ("kernel", &self.kernel),
            ("kernel_version", &self.kernel_version),
            ("backend", &self.backend),
            ("backend_version", &self.backend_version),
            ("fingerprint", &self.fingerprint),
            ("op", &self.op),
        ] {
            if v.trim().is_empty() {
                return Err(Error::invalid(format!("{}: {field} is empty", what())));
            }
        }
        if self.samples == 0 {
            return Err(Error::invalid(format!("{}: samples is 0", what())));
        }
        for (field, v) in [
            ("median_ns", self.median_ns),
            ("p10_ns", self.p10_ns),
            ("p90_ns", self.p90_ns),
            ("mad_ns", self.mad_ns),
            ("cv", self.cv),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(Error::invalid(format!("{}: {field} = {v} is not a finite non-negative number", what())));
            }
        }
        Ok(())
    }
}

/// The selection core's view of a row (the core judges versions, hardware and confidence).
impl From<&Row> for crate::score::measured::Measured {
    fn from(r: &Row) -> Self {
        crate::score::measured::Measured {
            kernel: r.kernel.clone(),
            kernel_version: r.kernel_version.clone(),
            backend_version: r.backend_version.clone(),
            fingerprint: r.fingerprint.clone(),
            key: r.key.clone(),
            bucket: r.bucket.clone(),
            samples: r.samples,
            median_ns: r.median_ns,
            p10_ns: r.p10_ns,
            p90_ns: r.p90_ns,
            cv: r.cv,
        }
    }
}

/// What the database holds, for `lz doctor`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DbStats {
    /// The file.
    pub path: PathBuf,
    /// Rows stored.
    pub rows: u64,
    /// Distinct hardware fingerprints.
    pub fingerprints: u64,
    /// The newest `created_at`, if any row exists.
    pub last_tune: Option<i64>,
    /// `ok`, or what `PRAGMA quick_check` found.
    pub integrity: String,
    /// The schema version of the file.
    pub schema_version: u32,
    /// Parity records (`lz parity --record`, shadow checks), all machines.
    #[serde(default)]
    pub parity_records: u64,
    /// Of those, the failed ones.
    #[serde(default)]
    pub parity_failed: u64,
}

/// A damaged file that opening moved aside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovery {
    /// Where the damaged file is now.
    pub moved_to: PathBuf,
    /// What was wrong with it.
    pub why: String,
}

/// An open database, and whether opening had to move a damaged file aside.
#[derive(Debug)]
pub struct Opened {
    /// The database.
    pub db: PerfDb,
    /// The damaged file moved aside on the way, if any.
    pub recovered: Option<Recovery>,
}

/// An open PerfDB. Safe to share between threads; other processes may use the same file.
#[derive(Debug)]
pub struct PerfDb {
    conn: Mutex<Connection>,
    path: PathBuf,
    /// Rows skipped by reads so far, and why the last one was.
    skipped: Mutex<(u64, Option<String>)>,
}

/// Why a file could not be opened.
enum Failure {
    /// The file is not a healthy PerfDB we understand: move it aside.
    Damaged(String),
    /// A PerfDB of a newer layout: another layerzero's, not ours to touch.
    Newer(String),
    /// Anything else (permissions, locks, a foreign database): report, touch nothing.
    Fatal(Error),
}

fn sql_error(path: &Path, what: &str, e: rusqlite::Error) -> Error {
    Error::new(ErrorKind::Io, format!("perfdb {}: {what}: {e}", path.display())).with_source(e)
}

fn is_damage(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt))
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
}

/// Classifies an error met while opening.
fn failure(path: &Path, what: &str, e: rusqlite::Error) -> Failure {
    if is_damage(&e) { Failure::Damaged(format!("{what}: {e}")) } else { Failure::Fatal(sql_error(path, what, e)) }
}

/// Retries `f` while another process holds a lock, up to [`BUSY_TIMEOUT`] (some set-up steps
/// return busy without consulting the busy handler).
fn retry_busy<T>(mut f: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let start = Instant::now();
    loop {
        match f() {
            Err(e) if is_busy(&e) && start.elapsed() < BUSY_TIMEOUT => std::thread::sleep(Duration::from_millis(20)),
            r => return r,
        }
    }
}

/// `PRAGMA quick_check`: `ok`, or the problems found joined by `; `.
fn quick_check(conn: &Connection) -> rusqlite::Result<String> {
    let mut stmt = conn.prepare("PRAGMA quick_check(20)")?;
    let lines: Vec<String> = stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
    Ok(if lines.is_empty() { "ok".to_owned() } else { lines.join("; ") })
}

/// Checks the file's header before SQLite opens it, so that a file that is plainly not ours
/// (or cut short inside the header) is named as such; SQLite then checks the rest.
fn check_header(path: &Path) -> std::result::Result<(), Failure> {
    use std::io::Read;
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(Failure::Fatal(
                Error::new(ErrorKind::Io, format!("perfdb {}: {e}", path.display())).with_source(e),
            ));
        }
    };
    let mut header = Vec::with_capacity(100);
    if let Err(e) = f.by_ref().take(100).read_to_end(&mut header) {
        return Err(Failure::Fatal(
            Error::new(ErrorKind::Io, format!("perfdb {}: {e}", path.display())).with_source(e),
        ));
    }
    if header.is_empty() {
        return Ok(());
    }
    if !header.starts_with(b"SQLite format 3\0") {
        return Err(Failure::Damaged("not an SQLite database (no SQLite header)".to_owned()));
    }
    if header.len() < 100 {
        return Err(Failure::Damaged(format!("truncated: {} bytes, shorter than the 100-byte header", header.len())));
    }
    Ok(())
}

fn try_open(path: &Path) -> std::result::Result<PerfDb, Failure> {
    check_header(path)?;
    let conn = Connection::open(path).map_err(|e| failure(path, "cannot open", e))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| failure(path, "cannot set busy_timeout", e))?;
    retry_busy(|| conn.query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get::<_, i64>(0)))
        .map_err(|e| failure(path, "cannot read the schema", e))?;
    let integrity = retry_busy(|| quick_check(&conn)).map_err(|e| failure(path, "quick_check failed", e))?;
    if integrity != "ok" {
        return Err(Failure::Damaged(format!("integrity check failed: {integrity}")));
    }
    let mut conn = conn;
    set_up_schema(path, &mut conn)?;
    retry_busy(|| conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0)))
        .map_err(|e| failure(path, "cannot switch to WAL mode", e))?;
    conn.execute_batch("PRAGMA synchronous=NORMAL").map_err(|e| failure(path, "cannot set synchronous", e))?;
    Ok(PerfDb { conn: Mutex::new(conn), path: path.to_path_buf(), skipped: Mutex::new((0, None)) })
}

/// Creates the layout in a new file, migrates an older one, refuses a newer or foreign one.
fn set_up_schema(path: &Path, conn: &mut Connection) -> std::result::Result<(), Failure> {
    // BEGIN IMMEDIATE waits on the busy handler, so two processes creating the file in turn
    // do not both create the tables.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| failure(path, "cannot begin the set-up transaction", e))?;
    let found = schema::inspect(&tx).map_err(|e| failure(path, "cannot read the meta table", e))?;
    match found {
        Found::Empty => {
            schema::create(&tx, crate::time::now_unix()).map_err(|e| failure(path, "cannot create the tables", e))?
        }
        Found::Version(v) if v == schema::CURRENT_VERSION => {}
        Found::Version(v) if v > schema::CURRENT_VERSION => {
            return Err(Failure::Newer(format!(
                "perfdb {}: schema version {v} is newer than this layerzero ({}) understands (version {}); \
                 the file is left untouched",
                path.display(),
                env!("CARGO_PKG_VERSION"),
                schema::CURRENT_VERSION
            )));
        }
        Found::Version(v) => {
            schema::migrate(&tx, v, schema::CURRENT_VERSION, schema::MIGRATIONS).map_err(|e| match e {
                schema::MigrateError::NoStep(_) => Failure::Damaged(e.to_string()),
                schema::MigrateError::Sql(..) => {
                    Failure::Fatal(Error::new(ErrorKind::Io, format!("perfdb {}: {e}", path.display())))
                }
            })?
        }
        Found::Unreadable(v) => return Err(Failure::Damaged(format!("meta.schema_version {v:?} is not a number"))),
        Found::Foreign(tables) => {
            return Err(Failure::Fatal(Error::invalid(format!(
                "perfdb {}: not a LayerZero PerfDB (it has tables {} but no meta table); \
                 point LAYERZERO_PERFDB at another file",
                path.display(),
                tables.join(", ")
            ))));
        }
    }
    tx.commit().map_err(|e| failure(path, "cannot commit the set-up transaction", e))
}

const COLUMNS: &str = "kernel, kernel_version, backend, backend_version, fingerprint, op, req_key, bucket, \
                       samples, median_ns, p10_ns, p90_ns, mad_ns, cv, origin, created_at";
const ORDER: &str = "ORDER BY fingerprint, op, req_key, bucket, kernel, kernel_version, backend_version";

/// Why a row's timing cannot be used, if it cannot.
fn row_problem(r: &Row) -> Option<String> {
    let times = [("median_ns", r.median_ns), ("p10_ns", r.p10_ns), ("p90_ns", r.p90_ns), ("mad_ns", r.mad_ns)];
    if let Some((name, v)) = times.iter().find(|(_, v)| !v.is_finite() || *v < 0.0) {
        return Some(format!("{name} = {v} is not a duration"));
    }
    if !r.cv.is_finite() || r.cv < 0.0 {
        return Some(format!("cv = {} is not a coefficient of variation", r.cv));
    }
    (r.samples == 0).then(|| "samples = 0".to_owned())
}

fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        kernel: r.get(0)?,
        kernel_version: r.get(1)?,
        backend: r.get(2)?,
        backend_version: r.get(3)?,
        fingerprint: r.get(4)?,
        op: r.get(5)?,
        key: r.get(6)?,
        bucket: r.get(7)?,
        samples: r.get(8)?,
        median_ns: r.get(9)?,
        p10_ns: r.get(10)?,
        p90_ns: r.get(11)?,
        mad_ns: r.get(12)?,
        cv: r.get(13)?,
        origin: r.get(14)?,
        created_at: r.get(15)?,
    })
}

impl PerfDb {
    /// Opens (creating it and its folder if needed) the PerfDB at `path`. A damaged file is
    /// moved aside and replaced by a fresh database; `recovered` says where it went and why.
    pub fn open(path: &Path) -> Result<Opened> {
        match PerfDb::open_for_reading(path)? {
            Ok(opened) => Ok(opened),
            Err(newer) => Err(Error::new(ErrorKind::Io, newer)),
        }
    }

    /// [`open`](PerfDb::open) for a run that can go on without timings: a PerfDB of a newer
    /// layout comes back as `Ok(Err(reason))`, left untouched, for the caller to report.
    pub fn open_for_reading(path: &Path) -> Result<std::result::Result<Opened, String>> {
        if let Ok(meta) = std::fs::metadata(path)
            && !meta.is_file()
        {
            let what = if meta.is_dir() { "a directory" } else { "not a regular file (a device, a FIFO or a socket)" };
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "perfdb {} is {what}; the PerfDB must be a regular file (point LAYERZERO_PERFDB or --perfdb at one)",
                    path.display()
                ),
            ));
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| {
                Error::new(ErrorKind::Io, format!("perfdb {}: cannot create {}: {e}", path.display(), parent.display()))
                    .with_source(e)
            })?;
        }
        match try_open(path) {
            Ok(db) => Ok(Ok(Opened { db, recovered: None })),
            Err(Failure::Fatal(e)) => Err(e),
            Err(Failure::Newer(why)) => Ok(Err(why)),
            Err(Failure::Damaged(why)) => {
                let moved_to = recover::move_aside(path, crate::time::now_unix())?;
                match try_open(path) {
                    Ok(db) => Ok(Ok(Opened { db, recovered: Some(Recovery { moved_to, why }) })),
                    Err(Failure::Fatal(e)) => Err(e),
                    Err(Failure::Newer(why)) => Ok(Err(why)),
                    Err(Failure::Damaged(again)) => Err(Error::new(
                        ErrorKind::Io,
                        format!(
                            "perfdb {}: moved a damaged file aside to {} ({why}), but the new file is damaged too: {again}",
                            path.display(),
                            moved_to.display()
                        ),
                    )),
                }
            }
        }
    }

    /// The file this database lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes a consistent copy of the database to `to` (a new file; SQLite's `VACUUM
    /// INTO`), while other processes may go on writing.
    pub fn snapshot_to(&self, to: &Path) -> Result<()> {
        if to.exists() {
            return Err(Error::invalid(format!("perfdb snapshot: {} exists; give a new file", to.display())));
        }
        let target =
            to.to_str().ok_or_else(|| Error::invalid(format!("perfdb snapshot: {} is not UTF-8", to.display())))?;
        self.conn().execute("VACUUM INTO ?1", [target]).map_err(|e| self.err("snapshot", e))?;
        Ok(())
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // parking_lot locks do not poison: a panic while holding the lock leaves the
        // connection usable, and SQLite rolls back any transaction that was not committed.
        self.conn.lock()
    }

    fn err(&self, what: &str, e: rusqlite::Error) -> Error {
        sql_error(&self.path, what, e)
    }

    /// Stores `row`, replacing an earlier measurement of the same thing.
    pub fn insert(&self, row: &Row) -> Result<()> {
        self.insert_many(std::slice::from_ref(row))
    }

    /// Stores `rows` in one transaction (all or none), each replacing an earlier measurement of
    /// the same thing; within `rows`, the last one of a key wins.
    pub fn insert_many(&self, rows: &[Row]) -> Result<()> {
        for r in rows {
            r.validate()?;
        }
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.err("cannot begin a write transaction", e))?;
        {
            let mut stmt = tx
                .prepare_cached(&format!(
                    "INSERT INTO perf ({COLUMNS}, layerzero_version)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)
                     ON CONFLICT (kernel, kernel_version, backend_version, fingerprint, op, req_key, bucket)
                     DO UPDATE SET backend = excluded.backend, samples = excluded.samples,
                        median_ns = excluded.median_ns, p10_ns = excluded.p10_ns, p90_ns = excluded.p90_ns,
                        mad_ns = excluded.mad_ns, cv = excluded.cv, origin = excluded.origin,
                        created_at = excluded.created_at, layerzero_version = excluded.layerzero_version"
                ))
                .map_err(|e| self.err("cannot prepare the insert", e))?;
            for r in rows {
                stmt.execute(params![
                    r.kernel,
                    r.kernel_version,
                    r.backend,
                    r.backend_version,
                    r.fingerprint,
                    r.op,
                    r.key,
                    r.bucket,
                    r.samples,
                    r.median_ns,
                    r.p10_ns,
                    r.p90_ns,
                    r.mad_ns,
                    r.cv,
                    r.origin,
                    r.created_at,
                    env!("CARGO_PKG_VERSION"),
                ])
                .map_err(|e| self.err(&format!("cannot store the row for kernel {:?}", r.kernel), e))?;
            }
        }
        tx.commit().map_err(|e| self.err("cannot commit", e))
    }

    /// The rows `sql` selects. A row whose values do not convert (a negative sample count, a
    /// text where a number belongs) or make no sense as a timing (negative, NaN or infinite)
    /// is skipped and counted ([`PerfDb::skipped_rows`]), not allowed to fail the whole read.
    fn query(&self, sql: &str, args: &[&dyn rusqlite::ToSql]) -> Result<Vec<Row>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(sql).map_err(|e| self.err("cannot prepare a query", e))?;
        let mapped = stmt.query_map(args, read_row).map_err(|e| self.err("cannot read rows", e))?;
        let mut rows = Vec::new();
        let skip = |why: String| {
            let mut s = self.skipped.lock();
            s.0 += 1;
            s.1 = Some(why);
        };
        for r in mapped {
            match r {
                Ok(row) => match row_problem(&row) {
                    None => rows.push(row),
                    Some(why) => skip(format!("{} {} {}: {why}", row.kernel, row.key, row.bucket)),
                },
                Err(
                    e @ (rusqlite::Error::FromSqlConversionFailure(..)
                    | rusqlite::Error::IntegralValueOutOfRange(..)
                    | rusqlite::Error::InvalidColumnType(..)),
                ) => skip(e.to_string()),
                Err(e) => return Err(self.err("cannot read rows", e)),
            }
        }
        Ok(rows)
    }

    /// Rows the reads so far skipped as unreadable or nonsensical, and why the last one was.
    pub fn skipped_rows(&self) -> (u64, Option<String>) {
        self.skipped.lock().clone()
    }

    /// Every row, ordered by fingerprint, op, key, bucket, kernel, kernel version, backend version.
    pub fn rows(&self) -> Result<Vec<Row>> {
        self.query(&format!("SELECT {COLUMNS} FROM perf {ORDER}"), &[])
    }

    /// The rows measured on hardware `fingerprint`, in the order of [`PerfDb::rows`].
    pub fn rows_for(&self, fingerprint: &str) -> Result<Vec<Row>> {
        self.query(&format!("SELECT {COLUMNS} FROM perf WHERE fingerprint = ?1 {ORDER}"), &[&fingerprint])
    }

    /// Row count, fingerprints, last tune, integrity and schema version.
    pub fn stats(&self) -> Result<DbStats> {
        let conn = self.conn();
        let (rows, fingerprints, last_tune) = conn
            .query_row("SELECT count(*), count(DISTINCT fingerprint), max(created_at) FROM perf", [], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, Option<i64>>(2)?))
            })
            .map_err(|e| self.err("cannot count rows", e))?;
        let (parity_records, parity_failed) = conn
            .query_row("SELECT count(*), count(*) FILTER (WHERE status != 'pass') FROM parity", [], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
            })
            .map_err(|e| self.err("cannot count parity records", e))?;
        let integrity = quick_check(&conn).map_err(|e| self.err("quick_check failed", e))?;
        let version: String = conn
            .query_row("SELECT value FROM meta WHERE name = 'schema_version'", [], |r| r.get(0))
            .map_err(|e| self.err("cannot read meta.schema_version", e))?;
        Ok(DbStats {
            path: self.path.clone(),
            rows: u64::try_from(rows).unwrap_or(0),
            fingerprints: u64::try_from(fingerprints).unwrap_or(0),
            last_tune,
            integrity,
            schema_version: version.trim().parse().unwrap_or(0),
            parity_records: u64::try_from(parity_records).unwrap_or(0),
            parity_failed: u64::try_from(parity_failed).unwrap_or(0),
        })
    }

    /// blake3 (hex) of every row in the order of [`PerfDb::rows`], without `created_at`: two
    /// databases holding the same measurements have the same digest, whenever and in whatever
    /// order they were written.
    pub fn digest(&self) -> Result<String> {
        Ok(digest_rows(&self.rows()?))
    }
}

/// The digest of `rows` as [`PerfDb::digest`] computes it (rows sorted the same way first).
pub fn digest_rows(rows: &[Row]) -> String {
    let mut sorted: Vec<&Row> = rows.iter().collect();
    sorted.sort_by(|a, b| {
        (&a.fingerprint, &a.op, &a.key, &a.bucket, &a.kernel, &a.kernel_version, &a.backend_version).cmp(&(
            &b.fingerprint,
            &b.op,
            &b.key,
            &b.bucket,
            &b.kernel,
            &b.kernel_version,
            &b.backend_version,
        ))
    });
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"layerzero perfdb digest v1\n");
    for r in sorted {
        let line = serde_json::json!([
            r.kernel,
            r.kernel_version,
            r.backend,
            r.backend_version,
            r.fingerprint,
            r.op,
            r.key,
            r.bucket,
            r.samples,
            r.median_ns,
            r.p10_ns,
            r.p90_ns,
            r.mad_ns,
            r.cv,
            r.origin,
        ]);
        hasher.update(line.to_string().as_bytes());
        hasher.update(b"\n");
    }
    hasher.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests;
