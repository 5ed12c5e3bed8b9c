//! Capability groups: ranks on different machines (another GPU, another CPU ISA) cannot serve
//! one plan, but the ranks of each machine kind must. The ranks gather each other's facts
//! once, group themselves by hardware fingerprint, and every rank checks every group: a group
//! whose ranks differ fails on every rank (the engine stops as a whole, not a half of it);
//! what differs *between* groups is reported. When any rank's policy asks for one plan across
//! every rank, the differences between groups fail too.

use std::collections::BTreeMap;

use super::{Collective, Facts, gather_facts, mismatch_message};
use crate::error::{Error, ErrorKind, Result};

/// What agreement by capability group found (the same on every rank).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct CapabilityReport {
    /// Hardware fingerprint -> the ranks that have it.
    pub groups: BTreeMap<String, Vec<usize>>,
    /// Fact -> hardware fingerprint -> the value its group holds, for each fact on which the
    /// groups differ.
    pub differences: BTreeMap<String, BTreeMap<String, String>>,
}

/// Agrees `facts` within each capability group of `group`; with `one_plan` on any rank, across
/// every rank. Fails with `PlanMismatch` on every rank when a group's ranks differ (or, with
/// `one_plan`, when any do).
pub fn agree_by_capability(facts: &Facts, group: &dyn Collective, one_plan: bool) -> Result<CapabilityReport> {
    // Each rank's wish for one plan travels with its facts, so every rank decides alike.
    let mut mine = facts.clone();
    mine.items.insert(ONE_PLAN.to_owned(), one_plan.to_string());
    let mut all = gather_facts(&mine, group)?;
    let one_plan = all.iter().any(|f| f.items.get(ONE_PLAN).is_some_and(|v| v == "true"));
    for f in &mut all {
        f.items.remove(ONE_PLAN);
    }
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (rank, f) in all.iter().enumerate() {
        let fingerprint = f.items.get("hardware").cloned().unwrap_or_default();
        groups.entry(fingerprint).or_default().push(rank);
    }
    let mut failures = Vec::new();
    for (fingerprint, ranks) in &groups {
        let members: Vec<Facts> = ranks.iter().map(|&r| all[r].clone()).collect();
        if members.iter().any(|f| f != &members[0]) {
            failures.push(format!(
                "in the group of hardware {}: {}",
                short(fingerprint),
                mismatch_message(&members, ranks)
            ));
        }
    }
    if !failures.is_empty() {
        return Err(Error::new(ErrorKind::PlanMismatch, failures.join(" || ")));
    }
    let differences = differences(&all, &groups);
    if one_plan && groups.len() > 1 {
        let ranks: Vec<usize> = (0..all.len()).collect();
        return Err(Error::new(
            ErrorKind::PlanMismatch,
            format!(
                "the policy asks for one plan across every rank (`one_plan_across_ranks`), but the ranks form {} capability groups: {}",
                groups.len(),
                mismatch_message(&all, &ranks)
            ),
        ));
    }
    Ok(CapabilityReport { groups, differences })
}

/// [`agree_by_capability`] on facts a rank may have failed to list: it still takes part (with
/// [`Facts::unlisted`]), then returns its own error.
pub fn agree_by_capability_listed(
    facts: Result<Facts>,
    group: &dyn Collective,
    one_plan: bool,
) -> Result<CapabilityReport> {
    match facts {
        Ok(f) => agree_by_capability(&f, group, one_plan),
        Err(e) => {
            agree_by_capability(&Facts::unlisted(&e), group, one_plan)?;
            Err(e)
        }
    }
}

/// The marker a rank's one-plan wish travels under (not a fact of selection).
const ONE_PLAN: &str = "policy:one_plan_across_ranks";

/// For each fact on which the groups differ, the value of each group (read off its first rank:
/// the group's ranks agree by now).
fn differences(all: &[Facts], groups: &BTreeMap<String, Vec<usize>>) -> BTreeMap<String, BTreeMap<String, String>> {
    let names: std::collections::BTreeSet<&String> = all.iter().flat_map(|f| f.items.keys()).collect();
    let mut out = BTreeMap::new();
    for name in names {
        let values: BTreeMap<String, String> = groups
            .iter()
            .map(|(fp, ranks)| {
                (fp.clone(), all[ranks[0]].items.get(name).cloned().unwrap_or_else(|| "(absent)".into()))
            })
            .collect();
        let first = values.values().next();
        if values.values().any(|v| Some(v) != first) {
            out.insert(name.clone(), values);
        }
    }
    out
}

fn short(fp: &str) -> &str {
    fp.get(..12).unwrap_or(fp)
}
