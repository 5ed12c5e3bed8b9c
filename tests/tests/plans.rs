//! Plans and the selection cache at run time: a table serves its buckets, a miss selects
//! live and says `PLAN_BUCKET_MISS`, a table for another machine, catalog, policy or schema
//! is refused with its reason, and no policy change can ever serve a stale cached choice.

use std::sync::Arc;

use layerzero::capabilities::catalog::Catalog;
use layerzero::exec::executor::Registry;
use layerzero::hardware::named;
use layerzero::key::axes;
use layerzero::model::dtype::DType;
use layerzero::model::request::Request;
use layerzero::plan::SelectionKey;
use layerzero::plan::solve::{self, Provenance};
use layerzero::plan::table::DispatchTable;
use layerzero::plan::workload::Workload;
use layerzero::policy::Policy;
use layerzero::select::Selector;
use layerzero::{ErrorKind, ReasonCode};
use layerzero::{LayerZero, PlanMode, SelectionSource};
use layerzero_tests::{TestResult, attention, repo_root};

const WORKLOAD: &str = r#"{"schema_version": 1, "name": "plans-test", "entries": [
    {"name": "attn", "request": {"op": "attention", "tensors": {
        "q": {"dtype": "bf16", "shape": [1, 16, 32, 128], "layout": "BSHD"},
        "k": {"dtype": "bf16", "shape": [1, 16, 8, 128], "layout": "BSHD"},
        "v": {"dtype": "bf16", "shape": [1, 16, 8, 128], "layout": "BSHD"}},
        "attrs": {"causal": true}}, "ranges": {"batch": [1, 4], "seq_q": [64, 2048], "seq_k": "seq_q"}}
]}"#;

fn selector(hw: &str, policy: Policy) -> TestResult<Selector> {
    Ok(Selector::planning(Catalog::builtin()?, Arc::new(named::load(hw)?), Arc::new(policy))?)
}

fn table(hw: &str, policy: Policy) -> TestResult<DispatchTable> {
    let w = Workload::from_json(WORKLOAD, "w.json")?;
    let prov = Provenance { perfdb_digest: None, created_at: "2026-11-21T00:00:00Z".into(), command: "test".into() };
    Ok(solve::solve(&w, &selector(hw, policy)?, prov)?)
}

fn runtime(hw: &str, policy: Policy) -> TestResult<LayerZero> {
    Ok(LayerZero::new(selector(hw, policy)?, Registry::new())?)
}

fn prefill(batch: u64, seq: u64) -> Request {
    let mut r = attention(DType::BF16, batch, seq, seq, 32, 8, 128);
    r.attrs = layerzero::model::attrs::Attrs::Attention(layerzero::model::attrs::AttentionAttrs {
        causal: true,
        ..Default::default()
    });
    r
}

#[test]
fn a_loaded_table_serves_every_size_inside_its_buckets() -> TestResult {
    let rt = runtime("h100", Policy::default())?.with_plan(&table("h100", Policy::default())?, PlanMode::Prefer)?;
    for (b, s) in [(1, 64), (1, 100), (3, 777), (4, 2048)] {
        let c = rt.select(&prefill(b, s))?;
        assert_eq!(c.source(), SelectionSource::Plan, "batch {b} seq {s}");
        assert!(c.notes().is_empty());
        // The plan's choice is the live choice at the representative size of the bucket.
        let live = rt.selector().select(&prefill(b, s))?;
        assert_eq!(c.kernel, live.kernel);
    }
    assert_eq!(rt.counters().plan_hits, 4);
    Ok(())
}

#[test]
fn a_bucket_the_table_lacks_is_selected_live_with_plan_bucket_miss_and_counted() -> TestResult {
    let rt = runtime("h100", Policy::default())?.with_plan(&table("h100", Policy::default())?, PlanMode::Prefer)?;
    let c = rt.select(&prefill(1, 8192))?;
    assert_eq!(c.source(), SelectionSource::Live);
    assert_eq!(c.notes().first().map(|r| r.code()), Some(ReasonCode::PLAN_BUCKET_MISS));
    assert_eq!(rt.counters().plan_misses, 1);
    // The same miss again is a cache hit, still reported as a plan miss.
    let again = rt.select(&prefill(1, 8000))?;
    assert_eq!(again.source(), SelectionSource::Cache);
    assert_eq!(again.notes().first().map(|r| r.code()), Some(ReasonCode::PLAN_BUCKET_MISS));
    assert_eq!(rt.counters().plan_misses, 2);
    Ok(())
}

#[test]
fn strict_plan_mode_refuses_a_miss() -> TestResult {
    let rt = runtime("h100", Policy::default())?.with_plan(&table("h100", Policy::default())?, PlanMode::Strict)?;
    let e = rt.select(&prefill(1, 8192)).err().ok_or("strict mode must refuse")?;
    assert_eq!(e.reasons().first().map(|r| r.code()), Some(ReasonCode::PLAN_BUCKET_MISS));
    Ok(())
}

#[test]
fn a_table_for_another_machine_catalog_or_policy_is_refused_with_its_reason() -> TestResult {
    let deny = Policy::from_json(r#"{"rules": [{"action": "deny", "kernels": "flash_attn_3.*"}]}"#, "p.json")?;
    let mut other_caps = table("h100", Policy::default())?;
    other_caps.header.capabilities_hash = "0".repeat(64);
    let cases = [
        (table("a100", Policy::default())?, Policy::default(), ReasonCode::PLAN_HARDWARE_MISMATCH),
        (other_caps, Policy::default(), ReasonCode::PLAN_CAPABILITIES_MISMATCH),
        (table("h100", Policy::default())?, deny, ReasonCode::PLAN_POLICY_MISMATCH),
    ];
    for (t, policy, code) in cases {
        let e = runtime("h100", policy.clone())?
            .with_plan(&t, PlanMode::Strict)
            .err()
            .ok_or_else(|| format!("strict mode must refuse {code}"))?;
        assert_eq!(e.reasons()[0].code(), code);
        // Prefer mode selects live and every selection carries the reason.
        let rt = runtime("h100", policy)?.with_plan(&t, PlanMode::Prefer)?;
        assert!(rt.plan().is_none());
        let c = rt.select(&prefill(1, 128))?;
        assert_eq!(c.source(), SelectionSource::Live);
        assert_eq!(c.notes()[0].code(), code);
    }
    Ok(())
}

#[test]
fn a_table_of_an_older_schema_version_is_refused_naming_the_field() -> TestResult {
    let path = repo_root().join("tests/data/dispatch_table_v0.json");
    let r = DispatchTable::read(&path).err().ok_or("an old table must be refused")?;
    assert_eq!(r.reason.code(), ReasonCode::PLAN_SCHEMA_MISMATCH);
    assert!(r.error.to_string().contains("schema_version"), "{}", r.error);
    assert!(r.error.to_string().contains("dispatch_table_v0.json"), "{}", r.error);
    Ok(())
}

#[test]
fn a_table_entry_naming_a_kernel_that_is_no_longer_eligible_is_dropped_with_a_reason() -> TestResult {
    let mut t = table("h100", Policy::default())?;
    let victim = t.entries[0].clone();
    t.entries[0].kernel = "cpu.attention.flash".into(); // a CPU kernel for a CUDA request
    let rt = runtime("h100", Policy::default())?.with_plan(&t, PlanMode::Prefer)?;
    let plan = rt.plan().ok_or("the table itself matches")?;
    assert_eq!(plan.dropped().len(), 1);
    assert_eq!(plan.dropped()[0].reasons[0].code(), ReasonCode::PLAN_KERNEL_INELIGIBLE);
    assert_eq!(plan.dropped()[0].bucket, victim.bucket);
    Ok(())
}

#[test]
fn a_policy_change_never_serves_a_selection_cached_under_the_old_policy() -> TestResult {
    let rt = runtime("h100", Policy::default())?;
    let first = rt.select(&prefill(1, 1024))?;
    assert_eq!(rt.select(&prefill(1, 1000))?.source(), SelectionSource::Cache);
    let deny = format!(r#"{{"rules": [{{"action": "deny", "kernels": "{}"}}]}}"#, first.kernel);
    rt.set_policy(Policy::from_json(&deny, "p.json")?)?;
    let after = rt.select(&prefill(1, 1000))?;
    assert_eq!(after.source(), SelectionSource::Live);
    assert_ne!(after.kernel, first.kernel);
    Ok(())
}

#[test]
fn the_cache_is_bounded_and_serves_only_kernels_eligible_for_the_exact_request() -> TestResult {
    let rt = runtime("h100", Policy::default())?.with_cache_capacity(16);
    for hd in [64, 96, 128, 256] {
        for s in 1..=40 {
            let r = attention(DType::BF16, 1, s * 13, s * 13, 32, 8, hd);
            let c = rt.select(&r)?;
            // Within a bucket the fastest kernel may differ by size; validity may not.
            let report = rt.selector().explain(&r);
            let served = report.candidate(&c.kernel).ok_or("unknown kernel")?;
            assert!(
                served.score.is_some(),
                "head_dim {hd} seq {}: {} served but {:?}",
                s * 13,
                served.kernel,
                served.reasons
            );
        }
    }
    assert_eq!(rt.cache().capacity(), 16);
    assert!(rt.cache().len() <= 32, "at most two interned entries per slot");
    Ok(())
}

/// Requests that share a key get the same verdict from every check: perturb the perf axes
/// within their buckets (keeping every other field) and compare eligibility sets.
#[test]
fn requests_sharing_a_key_share_every_verdict() -> TestResult {
    let cases = layerzero_tests::cases::load_cases(&repo_root().join("tests/data/selection_cases.json"))?;
    let mut compared = 0;
    for case in &cases {
        let Ok(hw) = named::load(&case.hardware) else { continue };
        let Ok(request) = Request::from_value(case.request.clone()) else { continue };
        let policy = match &case.policy {
            Some(p) => Policy::from_json(&p.to_string(), "case policy")?,
            None => Policy::default(),
        };
        let sel = Selector::planning(Catalog::builtin()?, Arc::new(hw), Arc::new(policy))?;
        let key = SelectionKey::derive(&request);
        let Some(b) = key.buckets() else { continue };
        let axes_of = axes::axes(request.op);
        // Every other value of each bucket (bounded), one axis at a time.
        for (a, axis) in axes_of.iter().enumerate() {
            let (lo, hi) = axis.anchor.range(b.0[a]);
            let step = ((hi - lo) / 4).max(1);
            let mut v = lo;
            while v <= hi {
                let mut to = key.perf;
                to[a] = v;
                if let Ok(r) = axes::resize(&request, &to[..key.axes as usize]) {
                    let k2 = SelectionKey::derive(&r);
                    if k2.validity == key.validity && k2.buckets() == Some(b) {
                        let verdicts = |req: &Request| -> Vec<(String, bool)> {
                            sel.explain(req).candidates.iter().map(|c| (c.kernel.clone(), c.score.is_some())).collect()
                        };
                        assert_eq!(verdicts(&request), verdicts(&r), "case {} axis {} = {v}", case.name, axis.name);
                        compared += 1;
                    }
                }
                v += step;
            }
        }
    }
    assert!(compared > 50, "only {compared} comparisons");
    Ok(())
}

#[test]
fn plan_mode_errors_are_input_errors() -> TestResult {
    let e = runtime("h100", Policy::default())?
        .with_plan(&table("a100", Policy::default())?, PlanMode::Strict)
        .err()
        .ok_or("must refuse")?;
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    Ok(())
}
