//! The PerfDB layout, its version, and the migrations from older versions.
//!
//! A database records its layout version in `meta.schema_version`. Opening one at an older
//! version applies the steps of [`MIGRATIONS`] in order, each inside the opening transaction;
//! a newer (or unreadable) version is not ours to touch and is reported as such.

use rusqlite::{OptionalExtension, Transaction};

/// The layout this build writes.
pub const CURRENT_VERSION: u32 = 2;

/// The version-1 layout. One row per measurement series; the unique key is what a
/// measurement is of, so a new measurement of the same thing replaces the old one.
pub(crate) const CREATE_V1: &str = "
CREATE TABLE meta (
    name  TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) STRICT;
CREATE TABLE perf (
    kernel            TEXT NOT NULL,
    kernel_version    TEXT NOT NULL,
    backend           TEXT NOT NULL,
    backend_version   TEXT NOT NULL,
    fingerprint       TEXT NOT NULL,
    op                TEXT NOT NULL,
    req_key           TEXT NOT NULL,
    bucket            TEXT NOT NULL,
    samples           INTEGER NOT NULL,
    median_ns         REAL NOT NULL,
    p10_ns            REAL NOT NULL,
    p90_ns            REAL NOT NULL,
    mad_ns            REAL NOT NULL,
    cv                REAL NOT NULL,
    origin            TEXT NOT NULL,
    created_at        INTEGER NOT NULL,
    layerzero_version TEXT NOT NULL,
    UNIQUE (kernel, kernel_version, backend_version, fingerprint, op, req_key, bucket)
) STRICT;
CREATE INDEX perf_by_fingerprint ON perf (fingerprint);
";

/// Version 2 adds the `parity` table ([`super::parity`]): whether a kernel has been right
/// on a machine, one record per kernel, versions, machine, op, dtype, key and bucket.
pub(crate) const CREATE_PARITY: &str = "
CREATE TABLE parity (
    kernel            TEXT NOT NULL,
    kernel_version    TEXT NOT NULL,
    backend           TEXT NOT NULL,
    backend_version   TEXT NOT NULL,
    fingerprint       TEXT NOT NULL,
    op                TEXT NOT NULL,
    dtype             TEXT NOT NULL,
    req_key           TEXT NOT NULL,
    bucket            TEXT NOT NULL,
    case_name         TEXT NOT NULL,
    status            TEXT NOT NULL,
    nmse              REAL,
    max_abs           REAL,
    cosine            REAL,
    rtol              REAL NOT NULL,
    atol              REAL NOT NULL,
    detail            TEXT,
    origin            TEXT NOT NULL,
    created_at        INTEGER NOT NULL,
    layerzero_version TEXT NOT NULL,
    UNIQUE (kernel, kernel_version, backend_version, fingerprint, op, dtype, req_key, bucket)
) STRICT;
CREATE INDEX parity_by_fingerprint ON parity (fingerprint);
";

fn add_parity(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(CREATE_PARITY)
}

/// One step from version `from` to `from + 1`.
pub(crate) struct Migration {
    pub from: u32,
    pub what: &'static str,
    pub apply: fn(&Transaction<'_>) -> rusqlite::Result<()>,
}

/// The shipped migration steps, in order: a change of layout bumps [`CURRENT_VERSION`] and
/// appends the step from the previous one.
pub(crate) const MIGRATIONS: &[Migration] = &[Migration { from: 1, what: "add the parity table", apply: add_parity }];

/// What opening found in the file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// No tables: a new file.
    Empty,
    /// A PerfDB at this version.
    Version(u32),
    /// A PerfDB whose `schema_version` is not a number.
    Unreadable(String),
    /// Tables, but not ours.
    Foreign(Vec<String>),
}

pub(crate) fn inspect(tx: &Transaction<'_>) -> rusqlite::Result<Found> {
    let mut stmt = tx.prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")?;
    let tables: Vec<String> = stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
    if tables.is_empty() {
        return Ok(Found::Empty);
    }
    if !tables.iter().any(|t| t == "meta") {
        return Ok(Found::Foreign(tables));
    }
    let v: Option<String> =
        tx.query_row("SELECT value FROM meta WHERE name = 'schema_version'", [], |r| r.get(0)).optional()?;
    Ok(match v {
        Some(v) => match v.trim().parse::<u32>() {
            Ok(n) => Found::Version(n),
            Err(_) => Found::Unreadable(v),
        },
        None => Found::Unreadable("(missing)".to_owned()),
    })
}

/// Creates the current layout in an empty database.
pub(crate) fn create(tx: &Transaction<'_>, now: i64) -> rusqlite::Result<()> {
    tx.execute_batch(CREATE_V1)?;
    tx.execute_batch(CREATE_PARITY)?;
    set_meta(tx, "schema_version", &CURRENT_VERSION.to_string())?;
    set_meta(tx, "created_by", env!("CARGO_PKG_VERSION"))?;
    set_meta(tx, "created_at", &now.to_string())?;
    Ok(())
}

pub(crate) fn set_meta(tx: &Transaction<'_>, name: &str, value: &str) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO meta (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        [name, value],
    )?;
    Ok(())
}

/// Applies `steps` from version `from` up to `to`; `Err` names the missing step.
pub(crate) fn migrate(
    tx: &Transaction<'_>,
    from: u32,
    to: u32,
    steps: &[Migration],
) -> std::result::Result<(), MigrateError> {
    let mut v = from;
    while v < to {
        let Some(step) = steps.iter().find(|m| m.from == v) else {
            return Err(MigrateError::NoStep(v));
        };
        (step.apply)(tx).map_err(|e| MigrateError::Sql(v, step.what, e))?;
        v += 1;
        set_meta(tx, "schema_version", &v.to_string()).map_err(|e| MigrateError::Sql(v, "set schema_version", e))?;
    }
    Ok(())
}

#[derive(Debug)]
pub(crate) enum MigrateError {
    /// No step starts at this version.
    NoStep(u32),
    /// The step from this version failed.
    Sql(u32, &'static str, rusqlite::Error),
}

impl std::fmt::Display for MigrateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MigrateError::NoStep(v) => write!(f, "no migration from schema version {v}"),
            MigrateError::Sql(v, what, e) => write!(f, "migration from schema version {v} ({what}) failed: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::TestResult;
    use rusqlite::Connection;

    use super::*;

    fn add_note(tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch("ALTER TABLE perf ADD COLUMN note TEXT NOT NULL DEFAULT ''")
    }

    fn rename_note(tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch("ALTER TABLE perf RENAME COLUMN note TO remark")
    }

    /// The framework, exercised with test-only steps on a version-1 file.
    #[test]
    fn migrations_apply_in_order_and_record_the_version() -> TestResult {
        let steps = [
            Migration { from: 2, what: "rename note", apply: rename_note },
            Migration { from: 1, what: "add note", apply: add_note },
        ];
        let mut conn = Connection::open_in_memory()?;
        let tx = conn.transaction()?;
        tx.execute_batch(CREATE_V1)?;
        set_meta(&tx, "schema_version", "1")?;
        assert_eq!(inspect(&tx)?, Found::Version(1));
        assert!(migrate(&tx, 1, 3, &steps).is_ok());
        assert_eq!(inspect(&tx)?, Found::Version(3));
        let n: i64 =
            tx.query_row("SELECT count(*) FROM pragma_table_info('perf') WHERE name = 'remark'", [], |r| r.get(0))?;
        assert_eq!(n, 1);
        // A gap is an error naming the version.
        let err = migrate(&tx, 3, 5, &steps).err().ok_or("a gap in the migrations must be refused")?.to_string();
        assert_eq!(err, "no migration from schema version 3");
        // The shipped list leads to the current version with nothing to do.
        assert!(migrate(&tx, CURRENT_VERSION, CURRENT_VERSION, MIGRATIONS).is_ok());
        assert!(MIGRATIONS.iter().all(|m| m.from < CURRENT_VERSION));
        Ok(())
    }

    #[test]
    fn a_version_1_file_gains_the_parity_table() -> TestResult {
        let mut conn = Connection::open_in_memory()?;
        let tx = conn.transaction()?;
        tx.execute_batch(CREATE_V1)?;
        set_meta(&tx, "schema_version", "1")?;
        assert!(migrate(&tx, 1, CURRENT_VERSION, MIGRATIONS).is_ok());
        assert_eq!(inspect(&tx)?, Found::Version(CURRENT_VERSION));
        let n: i64 = tx.query_row("SELECT count(*) FROM sqlite_schema WHERE name = 'parity'", [], |r| r.get(0))?;
        assert_eq!(n, 1);
        Ok(())
    }

    #[test]
    fn inspect_tells_empty_foreign_and_unreadable() -> TestResult {
        let mut conn = Connection::open_in_memory()?;
        let tx = conn.transaction()?;
        assert_eq!(inspect(&tx)?, Found::Empty);
        tx.execute_batch("CREATE TABLE other (x)")?;
        assert_eq!(inspect(&tx)?, Found::Foreign(vec!["other".to_owned()]));
        tx.execute_batch("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT)")?;
        assert_eq!(inspect(&tx)?, Found::Unreadable("(missing)".to_owned()));
        set_meta(&tx, "schema_version", "two")?;
        assert_eq!(inspect(&tx)?, Found::Unreadable("two".to_owned()));
        Ok(())
    }
}
