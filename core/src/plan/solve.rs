//! Solving: a decision for every (op, validity key, bucket) of a workload, written as a
//! dispatch table. Pure: the caller supplies the selector (hardware, policy, measurements),
//! the time and the command line, so identical inputs give identical tables.

use std::collections::BTreeSet;

use super::table::{
    DispatchTable, HardwareId, Header, RunnerUp, TABLE_SCHEMA_VERSION, TableEntry, Unsolved, WorkloadId,
};
use super::workload::Workload;
use crate::error::Result;
use crate::key::KEY_FORMAT;
use crate::select::{ScoreSource, Selector};

/// What a solve needs besides the selector.
#[derive(Debug, Clone)]
pub struct Provenance {
    /// Digest of the PerfDB rows the selector's measurements came from (None: model only).
    pub perfdb_digest: Option<String>,
    /// RFC 3339 UTC time.
    pub created_at: String,
    /// The command line.
    pub command: String,
}

/// Solves every point of `workload` with `selector`.
pub fn solve(workload: &Workload, selector: &Selector, provenance: Provenance) -> Result<DispatchTable> {
    let mut entries = Vec::new();
    let mut unsolved = Vec::new();
    for p in workload.points()? {
        let bucket = p.buckets.text(p.key.op);
        match selector.ranked(&p.request) {
            Ok(ranked) => {
                let best = &ranked[0];
                entries.push(TableEntry {
                    entry: p.entry.clone(),
                    op: p.key.op,
                    key: p.key.validity_hex(),
                    bucket,
                    buckets: p.buckets.0[..p.key.axes as usize].to_vec(),
                    kernel: best.kernel.clone(),
                    backend: best.backend.clone(),
                    expected_ns: round_ns(best.score.total_ns),
                    source: best.score.source,
                    samples: best.score.measurement.as_ref().map(|m| m.samples),
                    runner_up: ranked
                        .get(1)
                        .map(|r| RunnerUp { kernel: r.kernel.clone(), expected_ns: round_ns(r.score.total_ns) }),
                    request: p.request.to_value(),
                });
            }
            Err(e) => {
                let codes: BTreeSet<String> = e.reasons().iter().map(|r| r.code().as_str().to_owned()).collect();
                unsolved.push(Unsolved { entry: p.entry.clone(), bucket, codes: codes.into_iter().collect() });
            }
        }
    }
    entries.sort_by(|a, b| (a.op.as_str(), &a.key, &a.buckets).cmp(&(b.op.as_str(), &b.key, &b.buckets)));
    let hw = selector.hardware();
    let workload_value = serde_json::to_value(workload).unwrap_or(serde_json::Value::Null);
    Ok(DispatchTable {
        schema_version: TABLE_SCHEMA_VERSION,
        header: Header {
            layerzero_version: env!("CARGO_PKG_VERSION").to_owned(),
            key_format: KEY_FORMAT,
            hardware: HardwareId::of(hw),
            capabilities_hash: selector.catalog().hash().to_owned(),
            policy_hash: selector.policy_hash().to_owned(),
            perfdb_digest: provenance.perfdb_digest,
            tokenizer_hash: workload.tokenizer_hash.clone(),
            workload: WorkloadId { name: workload.name.clone(), hash: crate::canonical::hash(&workload_value) },
            created_at: provenance.created_at,
            command: provenance.command,
        },
        entries,
        unsolved,
    })
}

/// Tables print expected times to 0.1 ns: stable text, no false precision.
fn round_ns(ns: f64) -> f64 {
    (ns * 10.0).round() / 10.0
}

/// How many entries used each score source.
pub fn sources(table: &DispatchTable) -> [(ScoreSource, usize); 3] {
    let count = |s| table.entries.iter().filter(|e| e.source == s).count();
    [
        (ScoreSource::Model, count(ScoreSource::Model)),
        (ScoreSource::Perfdb, count(ScoreSource::Perfdb)),
        (ScoreSource::Blended, count(ScoreSource::Blended)),
    ]
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::TestResult;
    use crate::capabilities::catalog::Catalog;
    use crate::hardware::named;
    use crate::plan::SelectionKey;
    use crate::plan::table::Plan;
    use crate::policy::Policy;

    const W: &str = r#"{"schema_version": 1, "name": "t", "entries": [
        {"name": "norm", "request": {"op": "rms_norm", "tensors": {
            "x": {"dtype": "bf16", "shape": [8, 4096]}, "weight": {"dtype": "bf16", "shape": [4096]}},
            "attrs": {"eps": 1e-6}}, "ranges": {"tokens": [1, 300]}},
        {"name": "attn", "request": {"op": "attention", "tensors": {
            "q": {"dtype": "bf16", "shape": [1, 16, 32, 128], "layout": "BSHD"},
            "k": {"dtype": "bf16", "shape": [1, 16, 8, 128], "layout": "BSHD"},
            "v": {"dtype": "bf16", "shape": [1, 16, 8, 128], "layout": "BSHD"}},
            "attrs": {"causal": true}}, "ranges": {"seq_q": [1, 4096], "seq_k": "seq_q"}}
    ]}"#;

    fn selector(hw: &str) -> TestResult<Selector> {
        Ok(Selector::planning(Catalog::builtin()?, Arc::new(named::load(hw)?), Arc::new(Policy::default()))?)
    }

    fn prov(t: &str) -> Provenance {
        Provenance { perfdb_digest: None, created_at: t.into(), command: "lz solve".into() }
    }

    #[test]
    fn identical_inputs_give_identical_tables_apart_from_the_time() -> TestResult {
        let w = Workload::from_json(W, "w.json")?;
        let mut a = solve(&w, &selector("h100")?, prov("2026-01-01T00:00:00Z"))?;
        let b = solve(&w, &selector("h100")?, prov("2026-01-02T00:00:00Z"))?;
        assert_ne!(a.to_json(), b.to_json());
        a.header.created_at = b.header.created_at.clone();
        assert_eq!(a.to_json(), b.to_json());
        Ok(())
    }

    #[test]
    fn every_bucket_gets_an_entry_that_the_plan_serves_for_any_size_in_it() -> TestResult {
        let w = Workload::from_json(W, "w.json")?;
        let s = selector("h100")?;
        let table = solve(&w, &s, prov("t"))?;
        assert_eq!(
            table.entries.len(),
            10 + 13,
            "tokens 1..300: 10 buckets (1, 2, 3..4, ..., 257..512); seq 1..4096: 13"
        );
        let plan = Plan::new(&table, &s).map_err(|r| r.to_string())?;
        assert_eq!(plan.len(), table.entries.len());
        assert!(plan.dropped().is_empty(), "{:?}", plan.dropped());
        // A size inside a bucket, not the representative, is served by the plan.
        let mut req = crate::model::request::Request::from_value(
            serde_json::from_str::<serde_json::Value>(W)?["entries"][1]["request"].clone(),
        )?;
        req = crate::key::axes::resize(&req, &[1, 3000, 3000])?;
        let hit = plan.get(&SelectionKey::derive(&req)).ok_or("bucket 2049..4096 is missing from the plan")?;
        assert_eq!(hit.selection.kernel, s.select(&req)?.kernel);
        Ok(())
    }

    #[test]
    fn a_table_for_another_machine_is_refused_with_the_hardware_reason() -> TestResult {
        let w = Workload::from_json(W, "w.json")?;
        let table = solve(&w, &selector("h100")?, prov("t"))?;
        let err = Plan::new(&table, &selector("a100")?).err().ok_or("a table for another machine must be refused")?;
        assert_eq!(err.code(), crate::reason::ReasonCode::PLAN_HARDWARE_MISMATCH);
        Ok(())
    }
}
