//! Parity records: whether a kernel has been right on a machine, next to its timings.
//!
//! One record per kernel (and kernel and backend version), hardware fingerprint, op, dtype,
//! validity key and perf bucket: the last comparison of its outputs against the reference
//! there (`lz parity --record`), with the figures it was judged by. A new comparison of the
//! same thing replaces the old one, as a new timing does. Records live in the PerfDB file's
//! `parity` table, so they share its safety (WAL, a damaged file moved aside, a newer layout
//! left alone) and every process reading that file sees every record.

use rusqlite::{TransactionBehavior, params};
use serde::{Deserialize, Serialize};

use super::PerfDb;
use crate::error::{Error, Result};

/// The outcome of one comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParityStatus {
    /// Every element within the tolerance.
    Pass,
    /// Elements outside the tolerance (or the outputs' shapes or names differ from the
    /// reference's): the kernel computed something else.
    Fail,
}

impl ParityStatus {
    /// `pass` or `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            ParityStatus::Pass => "pass",
            ParityStatus::Fail => "fail",
        }
    }

    fn parse(s: &str) -> Option<ParityStatus> {
        match s {
            "pass" => Some(ParityStatus::Pass),
            "fail" => Some(ParityStatus::Fail),
            _ => None,
        }
    }
}

/// One kernel's last comparison against the reference on one machine, for one kind of
/// request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParityRecord {
    /// Kernel id, e.g. `cpu.linear.fast`.
    pub kernel: String,
    /// The kernel's version.
    pub kernel_version: String,
    /// Its backend.
    pub backend: String,
    /// The backend's version.
    pub backend_version: String,
    /// Hardware fingerprint of the machine it ran on.
    pub fingerprint: String,
    /// Canonical op name.
    pub op: String,
    /// The dtype of the request's first tensor.
    pub dtype: String,
    /// The validity key (exact fields) of the request compared.
    pub key: String,
    /// The perf bucket of the request compared.
    pub bucket: String,
    /// The case or call compared (a parity case's name, `shadow` for a serving check).
    pub case: String,
    /// Pass or fail.
    pub status: ParityStatus,
    /// Normalised mean squared error against the reference (absent when no output compared).
    pub nmse: Option<f64>,
    /// Largest absolute difference.
    pub max_abs: Option<f64>,
    /// Cosine similarity of the output with the reference (the lowest over the outputs).
    pub cosine: Option<f64>,
    /// Relative tolerance applied.
    pub rtol: f64,
    /// Absolute tolerance applied.
    pub atol: f64,
    /// What a failure was, in words (elements outside, a shape that differs).
    pub detail: Option<String>,
    /// Who compared: `lz parity`, `shadow`, `lz tune`.
    pub origin: String,
    /// When, in Unix seconds.
    pub created_at: i64,
}

impl ParityRecord {
    /// The record as selection's parity gate reads it.
    pub fn fact(&self) -> crate::select::ParityFact {
        crate::select::ParityFact {
            kernel: self.kernel.clone(),
            kernel_version: self.kernel_version.clone(),
            backend_version: self.backend_version.clone(),
            fingerprint: self.fingerprint.clone(),
            key: self.key.clone(),
            bucket: self.bucket.clone(),
            passed: self.status == ParityStatus::Pass,
            nmse: self.nmse,
            max_abs: self.max_abs,
            cosine: self.cosine,
            detail: self.detail.clone(),
            origin: self.origin.clone(),
            created_at: self.created_at,
        }
    }

    /// Checks that the record can be stored: the identifying fields are not empty and every
    /// figure is a finite number (a cosine within [-1, 1]).
    pub fn validate(&self) -> Result<()> {
        let what = || format!("parity record for kernel {:?} bucket {:?}", self.kernel, self.bucket);
        for (field, v) in [
            ("kernel", &self.kernel),
            ("kernel_version", &self.kernel_version),
            ("backend", &self.backend),
            ("backend_version", &self.backend_version),
            ("fingerprint", &self.fingerprint),
            ("op", &self.op),
            ("dtype", &self.dtype),
        ] {
            if v.trim().is_empty() {
                return Err(Error::invalid(format!("{}: {field} is empty", what())));
            }
        }
        // A kernel that wrote infinities fails with an infinite error: that is a figure too.
        for (field, v) in [("nmse", self.nmse), ("max_abs", self.max_abs)] {
            if let Some(v) = v.filter(|v| v.is_nan() || *v < 0.0) {
                return Err(Error::invalid(format!("{}: {field} = {v} is not a non-negative number", what())));
            }
        }
        if let Some(c) = self.cosine.filter(|c| !(-1.0 - 1e-9..=1.0 + 1e-9).contains(c)) {
            return Err(Error::invalid(format!("{}: cosine = {c} is not within [-1, 1]", what())));
        }
        for (field, v) in [("rtol", self.rtol), ("atol", self.atol)] {
            if !v.is_finite() || v < 0.0 {
                return Err(Error::invalid(format!("{}: {field} = {v} is not a finite non-negative number", what())));
            }
        }
        Ok(())
    }
}

const COLUMNS: &str = "kernel, kernel_version, backend, backend_version, fingerprint, op, dtype, req_key, bucket, \
                       case_name, status, nmse, max_abs, cosine, rtol, atol, detail, origin, created_at";
const ORDER: &str = "ORDER BY fingerprint, op, dtype, req_key, bucket, kernel, kernel_version, backend_version";

fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<(ParityRecord, String)> {
    let status: String = r.get(10)?;
    let record = ParityRecord {
        kernel: r.get(0)?,
        kernel_version: r.get(1)?,
        backend: r.get(2)?,
        backend_version: r.get(3)?,
        fingerprint: r.get(4)?,
        op: r.get(5)?,
        dtype: r.get(6)?,
        key: r.get(7)?,
        bucket: r.get(8)?,
        case: r.get(9)?,
        status: ParityStatus::Fail,
        nmse: r.get(11)?,
        max_abs: r.get(12)?,
        cosine: r.get(13)?,
        rtol: r.get(14)?,
        atol: r.get(15)?,
        detail: r.get(16)?,
        origin: r.get(17)?,
        created_at: r.get(18)?,
    };
    Ok((record, status))
}

impl PerfDb {
    /// Stores `records` in one transaction (all or none), each replacing an earlier record of
    /// the same kernel, versions, machine, op, dtype, key and bucket.
    pub fn insert_parity(&self, records: &[ParityRecord]) -> Result<()> {
        for r in records {
            r.validate()?;
        }
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.err("cannot begin a write transaction", e))?;
        {
            let mut stmt = tx
                .prepare_cached(&format!(
                    "INSERT INTO parity ({COLUMNS}, layerzero_version)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)
                     ON CONFLICT (kernel, kernel_version, backend_version, fingerprint, op, dtype, req_key, bucket)
                     DO UPDATE SET backend = excluded.backend, case_name = excluded.case_name,
                        status = excluded.status, nmse = excluded.nmse, max_abs = excluded.max_abs,
                        cosine = excluded.cosine, rtol = excluded.rtol, atol = excluded.atol,
                        detail = excluded.detail, origin = excluded.origin, created_at = excluded.created_at,
                        layerzero_version = excluded.layerzero_version"
                ))
                .map_err(|e| self.err("cannot prepare the parity insert", e))?;
            for r in records {
                stmt.execute(params![
                    r.kernel,
                    r.kernel_version,
                    r.backend,
                    r.backend_version,
                    r.fingerprint,
                    r.op,
                    r.dtype,
                    r.key,
                    r.bucket,
                    r.case,
                    r.status.as_str(),
                    r.nmse,
                    r.max_abs,
                    r.cosine,
                    r.rtol,
                    r.atol,
                    r.detail,
                    r.origin,
                    r.created_at,
                    env!("CARGO_PKG_VERSION"),
                ])
                .map_err(|e| self.err(&format!("cannot store the parity record of kernel {:?}", r.kernel), e))?;
            }
        }
        tx.commit().map_err(|e| self.err("cannot commit", e))
    }

    /// The records `sql` selects; one whose status or figures make no sense is skipped and
    /// counted ([`PerfDb::skipped_rows`]), as an unreadable timing row is.
    fn query_parity(&self, sql: &str, args: &[&dyn rusqlite::ToSql]) -> Result<Vec<ParityRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(sql).map_err(|e| self.err("cannot prepare a query", e))?;
        let mapped = stmt.query_map(args, read).map_err(|e| self.err("cannot read parity records", e))?;
        let mut out = Vec::new();
        for r in mapped {
            let problem = match r {
                Ok((mut record, status)) => match ParityStatus::parse(&status) {
                    Some(s) => {
                        record.status = s;
                        match record.validate() {
                            Ok(()) => {
                                out.push(record);
                                continue;
                            }
                            Err(e) => e.to_string(),
                        }
                    }
                    None => format!("parity record of {}: status {status:?} is neither pass nor fail", record.kernel),
                },
                Err(
                    e @ (rusqlite::Error::FromSqlConversionFailure(..)
                    | rusqlite::Error::IntegralValueOutOfRange(..)
                    | rusqlite::Error::InvalidColumnType(..)),
                ) => e.to_string(),
                Err(e) => return Err(self.err("cannot read parity records", e)),
            };
            let mut s = self.skipped.lock();
            s.0 += 1;
            s.1 = Some(problem);
        }
        Ok(out)
    }

    /// Every parity record, ordered by fingerprint, op, dtype, key, bucket, kernel, versions.
    pub fn parity(&self) -> Result<Vec<ParityRecord>> {
        self.query_parity(&format!("SELECT {COLUMNS} FROM parity {ORDER}"), &[])
    }

    /// The parity records of hardware `fingerprint`, in the order of [`PerfDb::parity`].
    pub fn parity_for(&self, fingerprint: &str) -> Result<Vec<ParityRecord>> {
        self.query_parity(&format!("SELECT {COLUMNS} FROM parity WHERE fingerprint = ?1 {ORDER}"), &[&fingerprint])
    }
}
