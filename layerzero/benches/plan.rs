//! The hot path on one thread: a plan hit and a cache hit for a key derived once (per layer,
//! say) whose perf values change per call; selection from typed arguments on a cache hit
//! (the figure an engine feels); dispatch of an empty kernel on a plan hit (the overhead
//! dispatch adds); the key derivation itself, `select(&Request)` on a hit, and live
//! selection for scale. Threads: `benches/threads.rs`.
//! Run: `cargo bench -p layerzero --bench plan`.

use std::sync::Arc;

use common::{PREFILL, planning, typed};
use layerzero::exec::args::{OpArgs, Outputs};
use layerzero::{KernelError, LayerZero, PlanMode, Request, SelectionKey};

mod common;

fn main() {
    divan::main();
}

fn with_plan() -> LayerZero {
    let lz = planning();
    let table = common::table(&lz);
    let lz = lz.with_plan(&table, PlanMode::Prefer).expect("plan");
    // An executor that does nothing, for every kernel the table names: dispatch overhead.
    let kernels: Vec<String> = table.entries.iter().map(|e| e.kernel.clone()).collect();
    kernels.iter().fold(lz, |lz, k| {
        lz.register(k, Arc::new(|_: &OpArgs| -> Result<Outputs, KernelError> { Ok(Outputs::new()) })).expect("register")
    })
}

/// Keys for sequence lengths 1000..1999 (two buckets): one per call, derived up front.
fn keys() -> Vec<SelectionKey> {
    let base = SelectionKey::derive(&Request::from_json(PREFILL).expect("request"));
    (0..1000u64).map(|i| SelectionKey { perf: [2, 1000 + i, 1000 + i], ..base }).collect()
}

fn warm_cache(lz: &LayerZero) {
    let req = Request::from_json(PREFILL).expect("request");
    for seq in [1000, 1500] {
        let r = layerzero::key::axes::resize(&req, &[2, seq, seq]).expect("resize");
        lz.select(&r).expect("select");
    }
}

#[divan::bench]
fn plan_hit(bencher: divan::Bencher) {
    let lz = with_plan();
    let keys = keys();
    let mut i = 0;
    bencher.bench_local(|| {
        i = (i + 1) % keys.len();
        lz.lookup(divan::black_box(&keys[i])).map(|h| h.index)
    });
}

#[divan::bench]
fn cache_hit(bencher: divan::Bencher) {
    let lz = planning();
    warm_cache(&lz);
    let keys = keys();
    let mut i = 0;
    bencher.bench_local(|| {
        i = (i + 1) % keys.len();
        lz.lookup(divan::black_box(&keys[i])).map(|h| h.index)
    });
}

#[divan::bench]
fn select_args_cache_hit(bencher: divan::Bencher) {
    let lz = planning();
    let args = typed();
    lz.select_args(&args).expect("select");
    bencher.bench_local(|| lz.select_args(divan::black_box(&args)).map(|h| h.index));
}

#[divan::bench]
fn typed_fingerprint(bencher: divan::Bencher) {
    let args = typed();
    bencher.bench_local(|| layerzero::plan::typed::fingerprint(divan::black_box(&args)));
}

#[divan::bench]
fn dispatch_plan_hit_empty_kernel(bencher: divan::Bencher) {
    let lz = with_plan();
    let args = typed();
    assert_eq!(lz.dispatch(&args).expect("dispatch").source(), layerzero::SelectionSource::Plan);
    bencher.bench_local(|| lz.dispatch(divan::black_box(&args)).map(|d| d.outputs.len()));
}

#[divan::bench]
fn derive_key(bencher: divan::Bencher) {
    let req = Request::from_json(PREFILL).expect("request");
    bencher.bench_local(|| SelectionKey::derive(divan::black_box(&req)));
}

#[divan::bench]
fn select_from_request_cache_hit(bencher: divan::Bencher) {
    let lz = planning();
    let req = Request::from_json(PREFILL).expect("request");
    lz.select(&req).expect("select");
    bencher.bench_local(|| lz.select(divan::black_box(&req)).map(|h| h.index));
}

#[divan::bench]
fn live_select(bencher: divan::Bencher) {
    let sel = planning().selector();
    let req = Request::from_json(PREFILL).expect("request");
    bencher.bench_local(|| sel.select(divan::black_box(&req)));
}
