//! Every rank serves the same choice. The ranks of a distributed engine each hold a handle;
//! before serving they *agree*: each lists the facts that decide its choices (the catalog,
//! the policy in force, the dispatch table, the hardware, the libraries it loaded and, with a
//! workload, the kernel of every bucket), hashes them into words, and one min/max all-reduce
//! over the group says whether every rank holds the same. When they differ, the ranks gather
//! each other's facts and every rank fails with the same error naming the ranks and what
//! differs (`ErrorKind::PlanMismatch`), instead of serving different kernels (different
//! numerics, or different collectives and a deadlock).
//!
//! The transport is the engine's own (torch.distributed in the Python package, MPI behind the
//! `mpi` feature): a [`Collective`] of the group. LayerZero opens no socket of its own.
//!
//! A selection the plan does not hold (a miss) is made live on each rank, and it is the same on
//! every rank because selection is a pure function of what agreement compares: the catalog, the
//! policy, the hardware profile, the measured timings (`measurements`) and the cost-model
//! calibration; nothing is measured at serving time. So a miss is not broadcast from the root
//! (a collective in the serving path would stall every rank on the slowest, and deadlock
//! when only some ranks miss); agreeing once at start-up covers every later miss.

mod groups;
#[cfg(feature = "mpi")]
pub mod mpi;
mod root;

pub use groups::{CapabilityReport, agree_by_capability, agree_by_capability_listed};
pub use root::{from_root, solve_on_root};

use std::collections::BTreeMap;

use crate::error::{Error, ErrorKind, Result};
use crate::plan::workload::Workload;
use crate::runtime::LayerZero;

/// A process group, as the engine's transport provides it. Hash words travel as `i64`
/// (gloo has no unsigned min/max).
pub trait Collective {
    /// This process's rank in the group.
    fn rank(&self) -> usize;
    /// How many ranks the group has.
    fn size(&self) -> usize;
    /// The element-wise minimum and maximum of `words` over every rank.
    fn all_reduce_min_max(&self, words: &[i64]) -> Result<(Vec<i64>, Vec<i64>)>;
    /// Every rank's `bytes`, by rank.
    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// The root's bytes, on every rank (`bytes` is read on the root only).
    fn broadcast(&self, bytes: &[u8], root: usize) -> Result<Vec<u8>>;
}

/// What decides a handle's choices, by name (`catalog`, `policy`, `table`, `hardware`,
/// `library:<backend>`, and with a workload `bucket:<entry> <bucket>` naming its kernel).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Facts {
    /// Name -> value.
    pub items: BTreeMap<String, String>,
}

impl Facts {
    /// What a rank whose facts could not be listed (a bad workload, a table that does not
    /// load) contributes instead: its error. The others then fail naming it, rather than wait
    /// in a collective this rank never joins.
    pub fn unlisted(error: &Error) -> Facts {
        Facts { items: BTreeMap::from([("error".to_owned(), error.to_string())]) }
    }

    /// The facts as hash words: blake3 of their canonical JSON, as four `i64`.
    pub fn words(&self) -> Vec<i64> {
        let text = serde_json::to_string(&self.items).unwrap_or_default();
        let hash = blake3::hash(text.as_bytes());
        hash.as_bytes().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect()
    }
}

impl LayerZero {
    /// The facts this handle's choices follow from; with `workload`, the kernel it selects for
    /// every bucket (a bucket no kernel serves is named with its error).
    pub fn agreement_facts(&self, workload: Option<&Workload>) -> Result<Facts> {
        let selector = self.selector();
        let mut items = BTreeMap::new();
        items.insert("catalog".to_owned(), selector.catalog().hash().to_owned());
        items.insert("policy".to_owned(), selector.policy_hash().to_owned());
        items.insert("hardware".to_owned(), selector.hardware().fingerprint.clone());
        let table = self.table().map_or_else(
            || "none".to_owned(),
            |t| blake3::hash(t.to_json().as_bytes()).to_hex().as_str()[..16].to_owned(),
        );
        items.insert("table".to_owned(), table);
        let measured = selector.measurements().map_or_else(|| "none".to_owned(), |m| m.digest());
        items.insert("measurements".to_owned(), measured);
        // Parity records refuse kernels: ranks that hold different ones choose differently.
        let parity = selector.parity().map_or_else(|| "none".to_owned(), |p| p.digest());
        items.insert("parity".to_owned(), parity);
        let calibration = selector.calibration().map_or_else(
            || "none".to_owned(),
            |c| {
                blake3::hash(serde_json::to_string(c).unwrap_or_default().as_bytes()).to_hex().as_str()[..16].to_owned()
            },
        );
        items.insert("calibration".to_owned(), calibration);
        for b in selector.catalog().backends() {
            if let Some(lib) = selector.availability().library(&b.backend) {
                items.insert(format!("library:{}", b.backend), lib.version.clone());
            }
        }
        if let Some(w) = workload {
            for p in w.points()? {
                let name = format!("bucket:{} {}", p.entry, p.buckets.text(p.key.op));
                let kernel = match self.select(&p.request) {
                    Ok(hit) => hit.kernel.clone(),
                    Err(e) => format!("none ({:?})", e.kind()),
                };
                items.insert(name, kernel);
            }
        }
        Ok(Facts { items })
    }

    /// Agrees this handle with the other ranks of `group` ([`agree`] over
    /// [`LayerZero::agreement_facts`]).
    pub fn agree(&self, group: &dyn Collective, workload: Option<&Workload>) -> Result<()> {
        agree_listed(self.agreement_facts(workload), group)
    }

    /// Agrees by capability group ([`agree_by_capability`]); one plan across every rank when
    /// this handle's policy sets `one_plan_across_ranks` (or another rank's does).
    pub fn agree_by_capability(&self, group: &dyn Collective, workload: Option<&Workload>) -> Result<CapabilityReport> {
        let one_plan = self.selector().policy().one_plan_across_ranks;
        agree_by_capability_listed(self.agreement_facts(workload), group, one_plan)
    }
}

/// Agrees `facts` over `group`: `Ok` when every rank holds the same; otherwise, on every rank,
/// an error of kind `PlanMismatch` naming each fact that differs and which ranks hold which
/// value.
pub fn agree(facts: &Facts, group: &dyn Collective) -> Result<()> {
    let words = facts.words();
    let (min, max) = group.all_reduce_min_max(&words)?;
    if min == max {
        return Ok(());
    }
    let all = gather_facts(facts, group)?;
    let ranks: Vec<usize> = (0..all.len()).collect();
    Err(Error::new(ErrorKind::PlanMismatch, mismatch_message(&all, &ranks)))
}

/// [`agree`] on facts a rank may have failed to list: it still takes part (with
/// [`Facts::unlisted`]), then returns its own error.
pub fn agree_listed(facts: Result<Facts>, group: &dyn Collective) -> Result<()> {
    match facts {
        Ok(f) => agree(&f, group),
        Err(e) => {
            agree(&Facts::unlisted(&e), group)?;
            Err(e)
        }
    }
}

/// Every rank's facts, by rank.
fn gather_facts(facts: &Facts, group: &dyn Collective) -> Result<Vec<Facts>> {
    let mine = serde_json::to_vec(facts).map_err(|e| Error::invalid(format!("encoding the facts: {e}")))?;
    group
        .all_gather(&mine)?
        .iter()
        .enumerate()
        .map(|(rank, bytes)| {
            serde_json::from_slice(bytes)
                .map_err(|e| Error::invalid(format!("rank {rank}'s facts cannot be read: {e}")))
        })
        .collect()
}

/// "the 4 ranks would not serve the same kernels: they disagree on 1 fact(s): policy: ranks
/// 0,2,3 have 248a..; rank 1 has d82d.." over the ranks `ranks` (whose facts are `all`).
fn mismatch_message(all: &[Facts], ranks: &[usize]) -> String {
    // A rank that could not list its facts differs in everything: name its error alone.
    let unlisted: Vec<String> = ranks
        .iter()
        .zip(all)
        .filter_map(|(rank, f)| f.items.get("error").map(|e| format!("rank {rank} could not list its choices: {e}")))
        .collect();
    if !unlisted.is_empty() {
        return format!("the {} ranks cannot agree: {}", all.len(), unlisted.join(" | "));
    }
    let names: std::collections::BTreeSet<&String> = all.iter().flat_map(|f| f.items.keys()).collect();
    let mut lines = Vec::new();
    for name in names {
        let mut by_value: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (rank, f) in ranks.iter().zip(all) {
            by_value.entry(f.items.get(name).map_or("(absent)", String::as_str)).or_default().push(*rank);
        }
        if by_value.len() > 1 {
            // The value of the lowest rank first: "ranks 0,2,3 have X; rank 1 has Y".
            let mut by_value: Vec<(&str, Vec<usize>)> = by_value.into_iter().collect();
            by_value.sort_by_key(|(_, ranks)| ranks.first().copied());
            let parts: Vec<String> = by_value
                .iter()
                .map(|(value, ranks)| {
                    let list: Vec<String> = ranks.iter().map(ToString::to_string).collect();
                    let who = if ranks.len() == 1 { "rank" } else { "ranks" };
                    format!("{who} {} {} {value}", list.join(","), if ranks.len() == 1 { "has" } else { "have" })
                })
                .collect();
            lines.push(format!("{name}: {}", parts.join("; ")));
        }
    }
    format!(
        "the {} ranks would not serve the same kernels: they disagree on {} fact(s): {}",
        all.len(),
        lines.len(),
        lines.join(" | ")
    )
}

#[cfg(test)]
mod tests;
