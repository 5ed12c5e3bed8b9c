//! The parity gate: whether a kernel has been right on this machine. The runtime hands
//! selection the PerfDB's parity records ([`ParityFact`]); a record counts only for this
//! hardware fingerprint and the catalog's kernel and backend versions. A kernel whose last
//! comparison for the request's kind and bucket failed is refused (`PARITY_FAILED`) unless
//! the policy allows it (`allow_parity_failed`); under `require_parity: strict` a kernel
//! without a passing record is refused too (`PARITY_UNVERIFIED`); `warn` refuses nothing
//! unverified and reports it.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::capabilities::catalog::Catalog;
use crate::capabilities::spec::KernelSpec;
use crate::constraint::Sink;
use crate::hardware::profile::HardwareProfile;
use crate::policy::{Policy, RequireParity, glob_match};
use crate::reason::ReasonCode;

/// One parity record as selection reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParityFact {
    /// Kernel id.
    pub kernel: String,
    /// The kernel's version when compared.
    pub kernel_version: String,
    /// The backend's version when compared.
    pub backend_version: String,
    /// The machine compared on.
    pub fingerprint: String,
    /// The validity key (hex) of the request compared.
    pub key: String,
    /// Its perf bucket.
    pub bucket: String,
    /// Whether every element was within the tolerance.
    pub passed: bool,
    /// NMSE against the reference.
    pub nmse: Option<f64>,
    /// Largest absolute difference.
    pub max_abs: Option<f64>,
    /// Cosine similarity with the reference.
    pub cosine: Option<f64>,
    /// What failed, in words.
    pub detail: Option<String>,
    /// Who compared (`lz parity`, `shadow`).
    pub origin: String,
    /// When, Unix seconds.
    pub created_at: i64,
}

/// A kernel's standing for one kind of request on this machine.
#[derive(Debug, Clone, PartialEq)]
pub enum ParityVerdict {
    /// Its last comparison passed.
    Passed,
    /// Its last comparison failed: the figures and when, in words.
    Failed(String),
}

/// The parity records usable here, by (validity key, bucket) and kernel.
#[derive(Debug, Clone, Default)]
pub struct ParityBook {
    by_point: HashMap<(u128, String), BTreeMap<String, ParityVerdict>>,
    passed: usize,
    failed: usize,
    ignored: usize,
}

impl ParityBook {
    /// The records of `facts` made on `hardware` with the catalog's versions of their kernel;
    /// the others are counted as ignored. Of two records of one point and kernel, a failure
    /// stands (a record is replaced in the PerfDB, so two meet only across sources).
    pub fn build(facts: impl IntoIterator<Item = ParityFact>, catalog: &Catalog, hardware: &HardwareProfile) -> Self {
        let mut book = ParityBook::default();
        for f in facts {
            book.insert(f, catalog, hardware, false);
        }
        book.recount();
        book
    }

    /// This book with `facts` recorded since (a shadow check's, a `lz parity --record` while
    /// serving): each replaces what the book held for its point and kernel.
    pub fn with(
        &self,
        facts: impl IntoIterator<Item = ParityFact>,
        catalog: &Catalog,
        hardware: &HardwareProfile,
    ) -> ParityBook {
        let mut book = self.clone();
        for f in facts {
            book.insert(f, catalog, hardware, true);
        }
        book.recount();
        book
    }

    /// Files one record, or counts it ignored (another machine, another version). `newer`:
    /// it replaces the point's verdict for its kernel; else a failure already held stands.
    fn insert(&mut self, f: ParityFact, catalog: &Catalog, hardware: &HardwareProfile, newer: bool) {
        let current = catalog.find(&f.kernel).map(|i| catalog.kernel(i)).is_some_and(|(b, k)| {
            f.kernel_version == k.version.as_deref().unwrap_or(&b.version) && f.backend_version == b.version
        });
        let Ok(key) = u128::from_str_radix(&f.key, 16) else {
            self.ignored += 1;
            return;
        };
        if f.fingerprint != hardware.fingerprint || !current {
            self.ignored += 1;
            return;
        }
        let verdict = if f.passed { ParityVerdict::Passed } else { ParityVerdict::Failed(failure(&f)) };
        let slot = self.by_point.entry((key, f.bucket.clone())).or_default();
        if newer || !matches!(slot.get(&f.kernel), Some(ParityVerdict::Failed(_))) {
            slot.insert(f.kernel.clone(), verdict);
        }
    }

    fn recount(&mut self) {
        (self.passed, self.failed) = (0, 0);
        for slot in self.by_point.values() {
            for v in slot.values() {
                match v {
                    ParityVerdict::Passed => self.passed += 1,
                    ParityVerdict::Failed(_) => self.failed += 1,
                }
            }
        }
    }

    /// Whether `kernel` failed at the point (`key`, `bucket`), key in hex as tables hold it.
    pub fn failed_at(&self, key: &str, bucket: &str, kernel: &str) -> bool {
        let Ok(key) = u128::from_str_radix(key, 16) else { return false };
        matches!(self.point(key, bucket).and_then(|p| p.get(kernel)), Some(ParityVerdict::Failed(_)))
    }

    /// The verdicts of one point, by kernel.
    pub fn point(&self, key: u128, bucket: &str) -> Option<&BTreeMap<String, ParityVerdict>> {
        self.by_point.get(&(key, bucket.to_owned()))
    }

    /// Records usable here that passed.
    pub fn passed(&self) -> usize {
        self.passed
    }

    /// Records usable here that failed.
    pub fn failed(&self) -> usize {
        self.failed
    }

    /// Records of other machines or versions.
    pub fn ignored(&self) -> usize {
        self.ignored
    }

    /// True when no record is usable here.
    pub fn is_empty(&self) -> bool {
        self.by_point.is_empty()
    }

    /// A digest of what the gate reads (every point's verdicts): equal on two handles that
    /// gate every point alike.
    pub fn digest(&self) -> String {
        let mut lines: Vec<String> = Vec::new();
        for ((key, bucket), slot) in &self.by_point {
            for (kernel, v) in slot {
                let pass = matches!(v, ParityVerdict::Passed);
                lines.push(format!("{key:032x} {bucket} {kernel} {pass}"));
            }
        }
        lines.sort_unstable();
        blake3::hash(lines.join("\n").as_bytes()).to_hex().as_str()[..16].to_owned()
    }
}

/// A failed record's figures and time, in words.
fn failure(f: &ParityFact) -> String {
    let mut parts = Vec::new();
    if let Some(d) = &f.detail {
        parts.push(d.clone());
    }
    if let Some(c) = f.cosine {
        parts.push(format!("cosine {c:.4}"));
    }
    if let Some(n) = f.nmse {
        parts.push(format!("nmse {n:.3e}"));
    }
    if let Some(m) = f.max_abs {
        parts.push(format!("max_abs {m:.3e}"));
    }
    parts.push(format!("by {} at {}", f.origin, crate::time::format_utc(f.created_at)));
    parts.join(", ")
}

/// The kernel's standing in words for a report: `passed`, `failed`, `failed, allowed`,
/// `unverified`; `None` when no book is in use and the policy requires nothing.
pub(crate) fn standing(policy: &Policy, verdict: Option<&ParityVerdict>, kernel: &KernelSpec) -> Option<&'static str> {
    match verdict {
        Some(ParityVerdict::Passed) => Some("passed"),
        Some(ParityVerdict::Failed(_)) if allowed(policy, &kernel.id) => Some("failed, allowed"),
        Some(ParityVerdict::Failed(_)) => Some("failed"),
        None if policy.require_parity == RequireParity::Off => None,
        None => Some("unverified"),
    }
}

fn allowed(policy: &Policy, kernel: &str) -> bool {
    policy.allow_parity_failed.iter().any(|g| glob_match(g, kernel))
}

/// The gate: `PARITY_FAILED` for a failed record (unless allowed), `PARITY_UNVERIFIED` for
/// no passing record under `strict`.
pub(crate) fn judge<S: Sink>(policy: &Policy, verdict: Option<&ParityVerdict>, kernel: &KernelSpec, sink: &mut S) {
    match verdict {
        Some(ParityVerdict::Failed(why)) if !allowed(policy, &kernel.id) => {
            sink.reject(ReasonCode::PARITY_FAILED, || {
                format!(
                    "{}'s last comparison against the reference on this machine failed ({why}); \
                     list it in allow_parity_failed to run it anyway",
                    kernel.id
                )
            });
        }
        None if policy.require_parity == RequireParity::Strict => {
            sink.reject(ReasonCode::PARITY_UNVERIFIED, || {
                format!(
                    "{} has no passing parity record on this machine for this kind of request \
                     (require_parity: strict; run lz parity --record)",
                    kernel.id
                )
            });
        }
        _ => {}
    }
}
