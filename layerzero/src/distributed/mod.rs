//! Every rank serves the same choice. The ranks of a distributed engine each hold a handle;
//! before serving they *agree*: each lists the facts that decide its choices (the catalog,
//! the policy in force, the dispatch table, the hardware, the libraries it loaded and, with a
//! workload, the kernel of every bucket), hashes them into words, and one min/max all-reduce
//! over the group says whether every rank holds the same. When they differ, the ranks gather
//! each other's facts and every rank fails with the same error naming the ranks and what
//! differs (`ErrorKind::PlanMismatch`), instead of serving different kernels (different
//! numerics, or different collectives and a deadlock).
//!
//! The transport is the engine's own (torch.distributed in the Python package, MPI behind a
//! feature): a [`Collective`] of the group. LayerZero opens no socket of its own.

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
    let mine = serde_json::to_vec(facts).map_err(|e| Error::invalid(format!("encoding the facts: {e}")))?;
    let gathered = group.all_gather(&mine)?;
    let all: Vec<Facts> = gathered
        .iter()
        .enumerate()
        .map(|(rank, bytes)| {
            serde_json::from_slice(bytes)
                .map_err(|e| Error::invalid(format!("rank {rank}'s facts cannot be read: {e}")))
        })
        .collect::<Result<_>>()?;
    Err(Error::new(ErrorKind::PlanMismatch, mismatch_message(&all)))
}

/// "ranks disagree on N facts: policy: ranks 0,2,3 have 248a.., rank 1 has d82d..; ...".
fn mismatch_message(all: &[Facts]) -> String {
    let names: std::collections::BTreeSet<&String> = all.iter().flat_map(|f| f.items.keys()).collect();
    let mut lines = Vec::new();
    for name in names {
        let mut by_value: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (rank, f) in all.iter().enumerate() {
            by_value.entry(f.items.get(name).map_or("(absent)", String::as_str)).or_default().push(rank);
        }
        if by_value.len() > 1 {
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
