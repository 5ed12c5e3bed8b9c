//! Dispatch tables: the file `lz solve` writes (`schemas/dispatch_table.schema.json`) and
//! the verified in-memory [`Plan`] a runtime probes.
//!
//! Loading checks, in order: JSON, schema version and key format (`PLAN_SCHEMA_MISMATCH`),
//! the schema, then against the selector: hardware fingerprint, capabilities hash, policy
//! hash (`PLAN_*_MISMATCH`). Each entry is then judged live for its kernel (so the table
//! supplies the choice and live checks supply validity and transforms); an entry whose
//! kernel is unknown or no longer eligible is dropped with `PLAN_KERNEL_INELIGIBLE`.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{FoldHasher, Resolved};
use crate::capabilities::catalog::KernelIndex;
use crate::error::{Error, ErrorKind};
use crate::exec::executor::Executor;
use crate::hardware::profile::HardwareProfile;
use crate::key::{Buckets, KEY_FORMAT, SelectionKey};
use crate::model::op::Op;
use crate::model::request::Request;
use crate::reason::{Reason, ReasonCode};
use crate::schema::{self, SchemaKind};
use crate::select::{ScoreSource, Selector};

/// The table format this build writes and reads.
pub const TABLE_SCHEMA_VERSION: u32 = 1;

/// A dispatch table file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchTable {
    /// Format version.
    pub schema_version: u32,
    /// Provenance.
    pub header: Header,
    /// Decisions, sorted by (op, key, buckets).
    pub entries: Vec<TableEntry>,
    /// Buckets no kernel qualifies for.
    pub unsolved: Vec<Unsolved>,
}

/// What a table was made from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// layerzero version that solved it.
    pub layerzero_version: String,
    /// Selection-key format of its keys.
    pub key_format: u32,
    /// The hardware it was solved for.
    pub hardware: HardwareId,
    /// Capabilities hash.
    pub capabilities_hash: String,
    /// Policy hash.
    pub policy_hash: String,
    /// Digest of the PerfDB rows used (absent: model only).
    pub perfdb_digest: Option<String>,
    /// The tokenizer of the model the workload was recorded from: a model scope with
    /// another one refuses the table (`TOKENIZER_HASH_MISMATCH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_hash: Option<String>,
    /// The workload.
    pub workload: WorkloadId,
    /// RFC 3339 UTC; the only field two identical solves differ in.
    pub created_at: String,
    /// The command that made it.
    pub command: String,
}

/// A hardware profile's identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareId {
    /// Profile name.
    pub name: String,
    /// Fingerprint.
    pub fingerprint: String,
    /// The driver of the machine (its first device naming one), so a mismatch names both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
}

impl HardwareId {
    /// The identity of `hw`.
    pub fn of(hw: &HardwareProfile) -> HardwareId {
        HardwareId { name: hw.name.clone(), fingerprint: hw.fingerprint.clone(), driver: driver_of(hw) }
    }
}

/// The driver of `hw`'s first device that names one.
fn driver_of(hw: &HardwareProfile) -> Option<String> {
    hw.devices.iter().find_map(|d| d.driver.clone())
}

/// A workload's identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadId {
    /// Its name.
    pub name: String,
    /// blake3 of its canonical JSON.
    pub hash: String,
}

/// One decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableEntry {
    /// Workload entry name.
    pub entry: String,
    /// The op.
    pub op: Op,
    /// Validity key, 32 hex digits.
    pub key: String,
    /// Bucket text.
    pub bucket: String,
    /// Bucket indices, one per perf axis.
    pub buckets: Vec<u8>,
    /// The chosen kernel.
    pub kernel: String,
    /// Its backend.
    pub backend: String,
    /// Its expected time at the representative request, ns.
    pub expected_ns: f64,
    /// Where the expectation comes from.
    pub source: ScoreSource,
    /// PerfDB samples behind it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u32>,
    /// The second-best kernel, if any.
    #[serde(default)]
    pub runner_up: Option<RunnerUp>,
    /// The representative request of the bucket.
    pub request: serde_json::Value,
}

/// The second-best kernel of an entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerUp {
    /// Kernel id.
    pub kernel: String,
    /// Its expected time, ns.
    pub expected_ns: f64,
}

/// A bucket nothing qualifies for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unsolved {
    /// Workload entry name.
    pub entry: String,
    /// Bucket text.
    pub bucket: String,
    /// The reason codes of every candidate.
    pub codes: Vec<String>,
}

/// Why a table file could not be used, with the path and the field.
#[derive(Debug, Clone)]
pub struct Rejected {
    /// The code (`PLAN_SCHEMA_MISMATCH` for unreadable or invalid files too).
    pub reason: Reason,
    /// The error to print.
    pub error: Error,
}

impl DispatchTable {
    /// Reads a table file. Invalid JSON, a schema violation or another schema version is
    /// an error naming the path and the field, carrying `PLAN_SCHEMA_MISMATCH`.
    pub fn read(path: &Path) -> std::result::Result<DispatchTable, Rejected> {
        let origin = path.display().to_string();
        let text = crate::files::read_to_string(path)
            .map_err(|e| rejected(ReasonCode::PLAN_SCHEMA_MISMATCH, ErrorKind::Io, e.message().to_owned()))?;
        DispatchTable::parse(&text, &origin)
    }

    /// Parses a table document (see [`DispatchTable::read`]).
    pub fn parse(text: &str, origin: &str) -> std::result::Result<DispatchTable, Rejected> {
        let schema_err = |kind, m: String| rejected(ReasonCode::PLAN_SCHEMA_MISMATCH, kind, m);
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| schema_err(ErrorKind::InvalidInput, format!("{origin}: invalid JSON: {e}")))?;
        match value.get("schema_version").and_then(serde_json::Value::as_u64) {
            Some(v) if v == u64::from(TABLE_SCHEMA_VERSION) => {}
            other => {
                let got = other.map_or("absent".to_owned(), |v| v.to_string());
                return Err(schema_err(
                    ErrorKind::Schema,
                    format!(
                        "{origin}: field `schema_version` is {got}; this layerzero reads dispatch tables of version {TABLE_SCHEMA_VERSION} (re-run the `command` in its header)"
                    ),
                ));
            }
        }
        schema::validate(SchemaKind::DispatchTable, &value, origin).map_err(|e| {
            let m = e.message().to_owned();
            schema_err(ErrorKind::Schema, m)
        })?;
        let table: DispatchTable = serde_path_to_error::deserialize(value)
            .map_err(|e| schema_err(ErrorKind::Schema, format!("{origin}: field `{}`: {}", e.path(), e.inner())))?;
        if table.header.key_format != KEY_FORMAT {
            return Err(schema_err(
                ErrorKind::Schema,
                format!(
                    "{origin}: field `header.key_format` is {}; this layerzero derives keys in format {KEY_FORMAT}",
                    table.header.key_format
                ),
            ));
        }
        Ok(table)
    }

    /// The table as JSON: the header pretty, then one line per entry (diffable, a quarter
    /// of the pretty size); byte-stable for equal tables.
    pub fn to_json(&self) -> String {
        let mut s = String::from("{\n\"schema_version\": ");
        s.push_str(&self.schema_version.to_string());
        s.push_str(",\n\"header\": ");
        s.push_str(&serde_json::to_string_pretty(&self.header).unwrap_or_default());
        for (name, items) in [
            ("entries", self.entries.iter().map(line).collect::<Vec<_>>()),
            ("unsolved", self.unsolved.iter().map(line).collect::<Vec<_>>()),
        ] {
            s.push_str(&format!(",\n\"{name}\": ["));
            for (i, item) in items.iter().enumerate() {
                s.push_str(if i == 0 { "\n  " } else { ",\n  " });
                s.push_str(item);
            }
            s.push_str(if items.is_empty() { "]" } else { "\n]" });
        }
        s.push_str("\n}\n");
        s
    }

    /// Checks the header against what `selector` would decide with; the first mismatch.
    pub fn check_header(&self, selector: &Selector) -> std::result::Result<(), Reason> {
        let h = &self.header;
        let here = selector.hardware();
        if h.hardware.fingerprint != here.fingerprint {
            let (then, now) = (h.hardware.driver.as_deref(), driver_of(here));
            let drivers = if then != now.as_deref() {
                format!(" (driver {} then, {} here)", then.unwrap_or("none"), now.as_deref().unwrap_or("none"))
            } else {
                String::new()
            };
            return Err(Reason::new(
                ReasonCode::PLAN_HARDWARE_MISMATCH,
                format!(
                    "the table was solved for {} ({}); this is {} ({}){drivers}",
                    h.hardware.name,
                    short(&h.hardware.fingerprint),
                    here.name,
                    short(&here.fingerprint)
                ),
            ));
        }
        if h.capabilities_hash != selector.catalog().hash() {
            return Err(Reason::new(
                ReasonCode::PLAN_CAPABILITIES_MISMATCH,
                format!(
                    "the table was solved with capabilities {}; these are {}",
                    short(&h.capabilities_hash),
                    short(selector.catalog().hash())
                ),
            ));
        }
        if h.policy_hash != selector.policy_hash() {
            return Err(Reason::new(
                ReasonCode::PLAN_POLICY_MISMATCH,
                format!(
                    "the table was solved under policy {}; this policy is {}",
                    short(&h.policy_hash),
                    short(selector.policy_hash())
                ),
            ));
        }
        Ok(())
    }
}

/// One-line JSON of a table item.
fn line<T: Serialize>(item: &T) -> String {
    serde_json::to_string(item).unwrap_or_default()
}

fn rejected(code: ReasonCode, kind: ErrorKind, message: String) -> Rejected {
    Rejected {
        reason: Reason::new(code, message.clone()),
        error: Error::new(kind, message.clone()).with_reasons(vec![Reason::new(code, message)]),
    }
}

fn short(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}

/// The probe key of a plan or cache: validity plus buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanKey {
    /// Validity hash (the op is part of it).
    pub validity: u128,
    /// Buckets.
    pub buckets: Buckets,
}

impl std::hash::Hash for PlanKey {
    /// Two words: the validity hash is already a hash, and the buckets fit in one word.
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u128(self.validity);
        state.write_u64(self.buckets.word());
    }
}

/// An entry dropped at load.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DroppedEntry {
    /// Workload entry name.
    pub entry: String,
    /// Bucket text.
    pub bucket: String,
    /// The kernel it named.
    pub kernel: String,
    /// Why.
    pub reasons: Vec<Reason>,
}

/// A verified table: a hash probe plus a bucket index away from a selection.
#[derive(Debug, Clone)]
pub struct Plan {
    map: HashMap<PlanKey, Resolved, BuildHasherDefault<FoldHasher>>,
    header: Header,
    dropped: Vec<DroppedEntry>,
}

impl Plan {
    /// Verifies `table` against `selector` (header, then every entry) into a plan. Entries
    /// carry no executor until [`Plan::bind`].
    pub fn new(table: &DispatchTable, selector: &Selector) -> std::result::Result<Plan, Reason> {
        table.check_header(selector)?;
        let mut map = HashMap::with_capacity_and_hasher(table.entries.len(), BuildHasherDefault::default());
        let mut dropped = Vec::new();
        for e in &table.entries {
            let drop = |reasons: Vec<Reason>| DroppedEntry {
                entry: e.entry.clone(),
                bucket: e.bucket.clone(),
                kernel: e.kernel.clone(),
                reasons,
            };
            let request = match Request::from_value(e.request.clone()) {
                Ok(r) => r,
                Err(err) => {
                    dropped.push(drop(vec![Reason::new(ReasonCode::PLAN_SCHEMA_MISMATCH, err.to_string())]));
                    continue;
                }
            };
            let key = SelectionKey::derive(&request);
            let buckets = key.buckets();
            let consistent =
                key.validity_hex() == e.key && buckets.is_some_and(|b| b.0[..key.axes as usize] == e.buckets[..]);
            let Some(buckets) = buckets.filter(|_| consistent) else {
                dropped.push(drop(vec![Reason::new(
                    ReasonCode::PLAN_SCHEMA_MISMATCH,
                    format!("entry `{}` {}: its key or buckets do not match its request", e.entry, e.bucket),
                )]));
                continue;
            };
            match selector.evaluate(&request, &e.kernel) {
                Ok(sel) => {
                    let resolved = Resolved { selection: Arc::new(sel), executor: None };
                    map.insert(PlanKey { validity: key.validity, buckets }, resolved);
                }
                Err(reasons) => {
                    let mut rs = vec![Reason::new(
                        ReasonCode::PLAN_KERNEL_INELIGIBLE,
                        format!("entry `{}` {} names {}, which is not eligible here", e.entry, e.bucket, e.kernel),
                    )];
                    rs.extend(reasons);
                    dropped.push(drop(rs));
                }
            }
        }
        Ok(Plan { map, header: table.header.clone(), dropped })
    }

    /// Resolves every entry's executor (`executor_of` by the kernel's dense index).
    pub fn bind(&mut self, executor_of: impl Fn(KernelIndex) -> Option<Arc<dyn Executor>>) {
        for r in self.map.values_mut() {
            r.executor = executor_of(r.selection.index);
        }
    }

    /// The entry for `key`, if the table has its bucket.
    #[inline]
    pub fn get(&self, key: &SelectionKey) -> Option<&Resolved> {
        let buckets = key.buckets()?;
        self.map.get(&PlanKey { validity: key.validity, buckets })
    }

    /// The kernels the plan serves, sorted, each once.
    pub fn kernels(&self) -> Vec<&str> {
        let mut k: Vec<&str> = self.map.values().map(|r| r.selection.kernel.as_str()).collect();
        k.sort_unstable();
        k.dedup();
        k
    }

    /// Entries served.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no entry survived.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The table's header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Entries dropped at load, with reasons.
    pub fn dropped(&self) -> &[DroppedEntry] {
        &self.dropped
    }
}

/// Reads a table and verifies it; a file error is the `Rejected` error.
pub fn load(path: &Path, selector: &Selector) -> std::result::Result<Plan, Rejected> {
    let table = DispatchTable::read(path)?;
    Plan::new(&table, selector).map_err(|reason| Rejected {
        error: Error::new(ErrorKind::InvalidInput, format!("{}: {}", path.display(), reason))
            .with_reasons(vec![reason.clone()]),
        reason,
    })
}
