//! The hot path: a plan hit and a cache hit for a key derived once (per layer, say) whose
//! perf values change per call, the key derivation itself, and live selection for scale.
//! Run: `cargo bench -p layerzero --bench plan`.

use std::sync::Arc;

use layerzero::capabilities::catalog::Catalog;
use layerzero::exec::executor::Registry;
use layerzero::exec::runtime::{PlanMode, Runtime};
use layerzero::hardware::named;
use layerzero::model::request::Request;
use layerzero::plan::SelectionKey;
use layerzero::plan::solve::{self, Provenance};
use layerzero::plan::workload::Workload;
use layerzero::policy::Policy;
use layerzero::select::Selector;

fn main() {
    divan::main();
}

const WORKLOAD: &str = r#"{"schema_version": 1, "name": "bench", "entries": [
    {"name": "attn", "request": {"op": "attention", "tensors": {
        "q": {"dtype": "bf16", "shape": [1, 16, 32, 128], "layout": "BSHD"},
        "k": {"dtype": "bf16", "shape": [1, 16, 8, 128], "layout": "BSHD"},
        "v": {"dtype": "bf16", "shape": [1, 16, 8, 128], "layout": "BSHD"}},
        "attrs": {"causal": true}}, "ranges": {"batch": [1, 8], "seq_q": [1, 8192], "seq_k": "seq_q"}}
]}"#;

const PREFILL: &str = r#"{"op": "attention", "tensors": {
    "q": {"dtype": "bf16", "shape": [2, 1500, 32, 128], "layout": "BSHD"},
    "k": {"dtype": "bf16", "shape": [2, 1500, 8, 128], "layout": "BSHD"},
    "v": {"dtype": "bf16", "shape": [2, 1500, 8, 128], "layout": "BSHD"}},
    "attrs": {"causal": true}}"#;

fn selector() -> Selector {
    let catalog = Catalog::builtin().expect("shipped capabilities load");
    let profile = Arc::new(named::load("h100").expect("shipped profile"));
    Selector::planning(catalog, profile, Arc::new(Policy::default())).expect("selector")
}

fn with_plan() -> Runtime {
    let w = Workload::from_json(WORKLOAD, "bench").expect("workload");
    let prov = Provenance { perfdb_digest: None, created_at: String::new(), command: String::new() };
    let table = solve::solve(&w, &selector(), prov).expect("solve");
    Runtime::new(selector(), Registry::new()).with_plan(&table, PlanMode::Prefer).expect("plan")
}

/// Keys for sequence lengths 1000..1999 (two buckets): one per call, derived up front.
fn keys() -> Vec<SelectionKey> {
    let base = SelectionKey::derive(&Request::from_json(PREFILL).expect("request"));
    (0..1000u64).map(|i| SelectionKey { perf: [2, 1000 + i, 1000 + i], ..base }).collect()
}

#[divan::bench]
fn plan_hit(bencher: divan::Bencher) {
    let rt = with_plan();
    let keys = keys();
    let mut i = 0;
    bencher.bench_local(|| {
        i = (i + 1) % keys.len();
        rt.lookup(divan::black_box(&keys[i])).map(|(s, _)| s)
    });
}

#[divan::bench]
fn cache_hit(bencher: divan::Bencher) {
    let rt = Runtime::new(selector(), Registry::new());
    let req = Request::from_json(PREFILL).expect("request");
    for seq in [1000, 1500] {
        let r = layerzero::plan::axes::resize(&req, &[2, seq, seq]).expect("resize");
        rt.select(&r).expect("select");
    }
    let keys = keys();
    let mut i = 0;
    bencher.bench_local(|| {
        i = (i + 1) % keys.len();
        rt.lookup(divan::black_box(&keys[i])).map(|(s, _)| s)
    });
}

#[divan::bench]
fn derive_key(bencher: divan::Bencher) {
    let req = Request::from_json(PREFILL).expect("request");
    bencher.bench_local(|| SelectionKey::derive(divan::black_box(&req)));
}

#[divan::bench]
fn select_from_request_cache_hit(bencher: divan::Bencher) {
    let rt = Runtime::new(selector(), Registry::new());
    let req = Request::from_json(PREFILL).expect("request");
    rt.select(&req).expect("select");
    bencher.bench_local(|| rt.select(divan::black_box(&req)).map(|c| c.selection));
}

#[divan::bench]
fn live_select(bencher: divan::Bencher) {
    let sel = selector();
    let req = Request::from_json(PREFILL).expect("request");
    bencher.bench_local(|| sel.select(divan::black_box(&req)));
}
