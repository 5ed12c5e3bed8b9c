//! The performance-regression check of E2E §18, as one program whose lines two builds can be
//! compared by (`tools/bench_hot_path.sh` runs this commit's and a base commit's builds
//! interleaved and prints the ratios):
//! - the hot path on one thread: a plan hit, a cache hit, selection from typed arguments on a
//!   hit, dispatch of an empty kernel on a plan hit (the overhead dispatch adds);
//! - a baked plan against live selection of the same request;
//! - cold start: a fresh host handle's first dispatch of a norm and a projection, with and
//!   without a warm-up (`LayerZero::warmup` of those buckets) before it.
//!
//! Each figure is the median of 15 batches, the measures interleaved batch by batch so that
//! a slow moment of the machine falls on all of them. Lines: `NAME MEDIAN_NS`.
//! Run: `cargo bench -p layerzero --bench hot_path`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use common::{PREFILL, planning, typed};
use layerzero::exec::args::{LinearArgs, NormArgs, OpArgs, Outputs};
use layerzero::model::attrs::{NoAttrs, NormAttrs};
use layerzero::runtime::WarmPoint;
use layerzero::{HostTensor, KernelError, LayerZero, PlanMode, Request, SelectionKey};

mod common;

const BATCHES: usize = 15;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Nanoseconds per call of `f` over `iters` calls.
fn per_call(iters: u32, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(iters)
}

/// A planning handle serving the shared bench table, every kernel it names an empty executor.
fn with_plan() -> LayerZero {
    let lz = planning();
    let table = common::table(&lz);
    let lz = lz.with_plan(&table, PlanMode::Prefer).expect("plan");
    let kernels: Vec<String> = table.entries.iter().map(|e| e.kernel.clone()).collect();
    kernels.iter().fold(lz, |lz, k| {
        lz.register(k, Arc::new(|_: &OpArgs| -> Result<Outputs, KernelError> { Ok(Outputs::new()) })).expect("register")
    })
}

/// The hot-path figures, nanoseconds per call.
fn hot() -> Vec<(&'static str, f64)> {
    let planned = with_plan();
    let cached = planning();
    let req = Request::from_json(PREFILL).expect("request");
    let key = SelectionKey::derive(&req);
    let args = typed();
    cached.select(&req).expect("select");
    cached.select_args(&args).expect("select");
    assert!(planned.lookup(&key).is_some() && cached.lookup(&key).is_some(), "hits");
    let live = planning().selector();
    let names = ["plan_hit", "cache_hit", "typed_select_cache_hit", "dispatch_plan_hit_empty_kernel", "live_select"];
    let mut samples = vec![Vec::new(); names.len()];
    for _ in 0..BATCHES {
        samples[0].push(per_call(200_000, || {
            black_box(planned.lookup(black_box(&key)).map(|h| h.index));
        }));
        samples[1].push(per_call(200_000, || {
            black_box(cached.lookup(black_box(&key)).map(|h| h.index));
        }));
        samples[2].push(per_call(200_000, || {
            black_box(cached.select_args(black_box(&args)).map(|h| h.index).ok());
        }));
        samples[3].push(per_call(50_000, || {
            black_box(planned.dispatch(black_box(&args)).map(|d| d.outputs.len()).ok());
        }));
        samples[4].push(per_call(2_000, || {
            black_box(live.select(black_box(&req)).map(|s| s.kernel.len()).ok());
        }));
    }
    names.into_iter().zip(samples.into_iter().map(median)).collect()
}

fn tensor(shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    HostTensor::from_f32(shape, (0..n).map(|i| ((i % 11) as f32 - 5.0) / 8.0).collect()).expect("tensor")
}

/// The first request of a host handle: a norm and a projection of a 256-wide model.
fn first_request() -> Vec<OpArgs> {
    vec![
        OpArgs::RmsNorm(NormArgs {
            x: tensor(&[8, 256]),
            weight: tensor(&[256]),
            bias: None,
            residual: None,
            attrs: NormAttrs { eps: Some(1e-6) },
        }),
        OpArgs::Linear(LinearArgs { x: tensor(&[8, 256]), weight: tensor(&[512, 256]), bias: None, attrs: NoAttrs {} }),
    ]
}

/// Cold start, nanoseconds: a fresh handle's first dispatches without and with a warm-up
/// (the handle's build and the warm-up are reported on their own), and the same dispatches
/// once the handle is warm.
fn cold() -> Vec<(&'static str, f64)> {
    let args = first_request();
    let points: Vec<WarmPoint> =
        args.iter().map(|a| WarmPoint { entry: a.op().as_str().to_owned(), request: a.describe() }).collect();
    // The first dispatches of a handle, then the same again (steady state), nanoseconds.
    let first = |lz: &LayerZero| {
        let run = || {
            let t = Instant::now();
            for a in &args {
                black_box(lz.dispatch(a).expect("dispatch").outputs.len());
            }
            t.elapsed().as_nanos() as f64
        };
        (run(), run())
    };
    let mut m: [Vec<f64>; 5] = Default::default();
    // The process's one-time costs (thread pools, capability parsing) fall on a handle built
    // before the measured ones.
    first(&LayerZero::host().expect("host"));
    for _ in 0..BATCHES {
        let t = Instant::now();
        let lz = LayerZero::host().expect("host");
        m[0].push(t.elapsed().as_nanos() as f64);
        let (cold, steady) = first(&lz);
        m[1].push(cold);
        m[4].push(steady);
        let lz = LayerZero::host().expect("host");
        let t = Instant::now();
        let report = lz.warmup(&points);
        assert_eq!(report.failed, 0, "warm-up failed: {report:?}");
        m[2].push(t.elapsed().as_nanos() as f64);
        m[3].push(first(&lz).0);
    }
    let names = [
        "cold_handle_build",
        "cold_first_dispatch_without_warmup",
        "cold_warmup",
        "cold_first_dispatch_after_warmup",
        "steady_dispatch",
    ];
    names.into_iter().zip(m.into_iter().map(median)).collect()
}

fn main() {
    for (name, ns) in hot().into_iter().chain(cold()) {
        println!("{name} {ns:.1}");
    }
}
