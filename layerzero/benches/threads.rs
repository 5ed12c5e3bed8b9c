//! The hot path on one shared handle from 1 and 2 threads: throughput of plan hits, cache
//! hits and typed selection on a cache hit, and the 2-thread / 1-thread ratio (2.0 is
//! perfect scaling). Medians of interleaved rounds.
//! Run: `cargo bench -p layerzero --bench threads`.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use common::{PREFILL, planning, typed};
use layerzero::{PlanMode, Request, SelectionKey};

mod common;

const CALLS: usize = 2_000_000;
const ROUNDS: usize = 7;

fn main() {
    let planned = {
        let lz = planning();
        let table = common::table(&lz);
        Arc::new(lz.with_plan(&table, PlanMode::Prefer).expect("plan"))
    };
    let cached = Arc::new(planning());
    let req = Request::from_json(PREFILL).expect("request");
    for seq in [1000, 1500] {
        cached.select(&layerzero::key::axes::resize(&req, &[2, seq, seq]).expect("resize")).expect("select");
    }
    let base = SelectionKey::derive(&req);
    let keys: Arc<Vec<SelectionKey>> =
        Arc::new((0..1000u64).map(|i| SelectionKey { perf: [2, 1000 + i, 1000 + i], ..base }).collect());
    let args = Arc::new(typed());
    cached.select_args(&args).expect("select");

    type Case = (&'static str, Arc<dyn Fn(usize) -> usize + Send + Sync>);
    let cases: Vec<Case> = vec![
        ("plan hit", {
            let (lz, keys) = (planned.clone(), keys.clone());
            Arc::new(move |i| lz.lookup(black_box(&keys[i % 1000])).map_or(0, |h| h.index))
        }),
        ("cache hit", {
            let (lz, keys) = (cached.clone(), keys.clone());
            Arc::new(move |i| lz.lookup(black_box(&keys[i % 1000])).map_or(0, |h| h.index))
        }),
        ("typed select, cache hit", {
            let (lz, args) = (cached.clone(), args.clone());
            Arc::new(move |_| lz.select_args(black_box(&args)).map_or(0, |h| h.index))
        }),
    ];
    println!("{} threads available; {CALLS} calls per thread per round, {ROUNDS} rounds, medians", num_threads());
    println!("{:<26} {:>14} {:>14} {:>8}", "case", "1 thread Mops", "2 threads Mops", "ratio");
    for (name, f) in &cases {
        let mut one = Vec::new();
        let mut two = Vec::new();
        for _ in 0..ROUNDS {
            one.push(throughput(f, 1));
            two.push(throughput(f, 2));
        }
        let (a, b) = (median(&mut one), median(&mut two));
        println!("{name:<26} {a:>14.1} {b:>14.1} {:>8.2}", b / a);
    }
}

fn num_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Millions of calls per second over `threads` threads calling `f` CALLS times each.
fn throughput(f: &Arc<dyn Fn(usize) -> usize + Send + Sync>, threads: usize) -> f64 {
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (f, barrier) = (f.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let mut acc = 0usize;
                for i in 0..CALLS {
                    acc = acc.wrapping_add(f(i + t * 7));
                }
                black_box(acc)
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        let _ = h.join();
    }
    (threads * CALLS) as f64 / start.elapsed().as_secs_f64() / 1e6
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
