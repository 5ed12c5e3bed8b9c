//! `lz bench-select`: selection throughput from N threads sharing one handle (E2E §16), with
//! every answer checked against the single-threaded answer for the same request, and the
//! resident memory before and after (§11.2: bounded caches keep it flat under random shapes).
//!
//! Each request set holds one request per (validity key, buckets): the cache shares a
//! decision across a bucket, so two sizes of one bucket could get the answer of whichever
//! came first, and the single-threaded answer would depend on the order. With one request
//! per key it does not, and any difference is the runtime's fault.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::soak::{self, Sampler, rss_kib};
use super::{Outcome, print_json};
use layerzero::capabilities::catalog::KernelIndex;
use layerzero::error::{Error, ErrorKind, Result};
use layerzero::model::request::Request;
use layerzero::plan::SelectionKey;
use layerzero::plan::workload::Workload;
use layerzero::runtime::{Hit, LayerZero};

/// What `lz bench-select` was asked to do.
pub(super) struct BenchArgs {
    pub threads: Vec<usize>,
    pub seconds: f64,
    pub workload: Option<PathBuf>,
    pub random_shapes: bool,
    pub max_rss_growth_mb: f64,
    pub json: bool,
}

/// Most threads one row may use: far beyond any core count, short of exhausting the process.
const MAX_THREADS: usize = 1024;
/// Longest row: three days, the longest soak of the E2E specification (§11.2).
const MAX_SECONDS: f64 = 72.0 * 3600.0;
/// Selections between two looks at the clock (a hit costs tens of nanoseconds).
const CHUNK: usize = 256;
/// The seed of the random shapes and of each thread's draws.
const SEED: u64 = 0x5eed_1a7e_2e40_0016;

/// The built-in mixed set: attention prefill and decode, paged decode, norms, projections, a
/// fused MLP, an activation, an embedding and sampling, in f32 and bf16.
const BUILTIN: &str = r#"{"schema_version": 1, "name": "bench-select", "entries": [
  {"name": "attention.prefill.f32", "request": {"op": "attention", "tensors": {
     "q": {"dtype": "f32", "shape": [1, 16, 8, 64], "layout": "BSHD"},
     "k": {"dtype": "f32", "shape": [1, 16, 2, 64], "layout": "BSHD"},
     "v": {"dtype": "f32", "shape": [1, 16, 2, 64], "layout": "BSHD"}}, "attrs": {"causal": true}},
   "ranges": {"batch": [1, 2], "seq_q": [1, 1024], "seq_k": "seq_q"}},
  {"name": "attention.decode.bf16", "request": {"op": "attention", "tensors": {
     "q": {"dtype": "bf16", "shape": [1, 1, 32, 128], "layout": "BSHD"},
     "k": {"dtype": "bf16", "shape": [1, 1024, 8, 128], "layout": "BSHD"},
     "v": {"dtype": "bf16", "shape": [1, 1024, 8, 128], "layout": "BSHD"}}, "attrs": {"causal": true}},
   "ranges": {"batch": [1, 8], "seq_k": [16, 4096]}},
  {"name": "paged_attention.decode.f32", "request": {"op": "paged_attention", "tensors": {
     "q": {"dtype": "f32", "shape": [1, 1, 8, 64], "layout": "BSHD"},
     "k_cache": {"dtype": "f32", "shape": [512, 16, 2, 64], "layout": "NHD"},
     "v_cache": {"dtype": "f32", "shape": [512, 16, 2, 64], "layout": "NHD"},
     "block_table": {"dtype": "i32", "shape": [1, 8]},
     "context_lens": {"dtype": "i32", "shape": [1]}}, "attrs": {"causal": true}},
   "ranges": {"batch": [1, 4], "pages": [1, 64]}},
  {"name": "rms_norm.f32", "request": {"op": "rms_norm", "tensors": {
     "x": {"dtype": "f32", "shape": [1, 2048]}, "weight": {"dtype": "f32", "shape": [2048]}}},
   "ranges": {"tokens": [1, 4096]}},
  {"name": "rms_norm.bf16", "request": {"op": "rms_norm", "tensors": {
     "x": {"dtype": "bf16", "shape": [1, 4096]}, "weight": {"dtype": "bf16", "shape": [4096]}}, "attrs": {"eps": 1e-05}},
   "ranges": {"tokens": [1, 4096]}},
  {"name": "linear.f32", "request": {"op": "linear", "tensors": {
     "x": {"dtype": "f32", "shape": [1, 2048]}, "weight": {"dtype": "f32", "shape": [2048, 2048], "layout": "NT"}}},
   "ranges": {"m": [1, 1024]}},
  {"name": "linear.bf16", "request": {"op": "linear", "tensors": {
     "x": {"dtype": "bf16", "shape": [1, 4096]}, "weight": {"dtype": "bf16", "shape": [6144, 4096], "layout": "NT"}}},
   "ranges": {"m": [1, 1024]}},
  {"name": "mlp.f32", "request": {"op": "mlp", "tensors": {
     "x": {"dtype": "f32", "shape": [1, 1024]},
     "w_gate": {"dtype": "f32", "shape": [2816, 1024]},
     "w_up": {"dtype": "f32", "shape": [2816, 1024]},
     "w_down": {"dtype": "f32", "shape": [1024, 2816]}}, "attrs": {"activation": "silu"}},
   "ranges": {"m": [1, 256]}},
  {"name": "swiglu.bf16", "request": {"op": "swiglu", "tensors": {
     "x": {"dtype": "bf16", "shape": [1, 28672]}}, "attrs": {"split": true}},
   "ranges": {"tokens": [1, 1024]}},
  {"name": "embedding.f32", "request": {"op": "embedding", "tensors": {
     "ids": {"dtype": "i32", "shape": [1]}, "table": {"dtype": "f32", "shape": [32000, 2048]}}},
   "ranges": {"tokens": [1, 1024]}},
  {"name": "sample.f32", "request": {"op": "sample", "tensors": {
     "logits": {"dtype": "f32", "shape": [1, 32000]}}, "attrs": {"temperature": 0.6, "top_p": 0.9, "seed": 0}},
   "ranges": {"batch": [1, 16]}}
]}"#;

/// A selection reduced to what must not depend on threads: the kernel, its adaptations and
/// the exact score; or the kind of error.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    Selected { kernel: KernelIndex, transforms: usize, total_ns_bits: u64 },
    Failed(ErrorKind),
}

impl Answer {
    fn of(got: &Result<Hit<'_>>) -> Answer {
        match got {
            Ok(hit) => Answer::Selected {
                kernel: hit.index,
                transforms: hit.transforms.len(),
                total_ns_bits: hit.score.total_ns.to_bits(),
            },
            Err(e) => Answer::Failed(e.kind()),
        }
    }
}

/// The requests, their keys, and the single-threaded answer to each.
struct Set {
    requests: Vec<Request>,
    keys: Vec<SelectionKey>,
    expected: Vec<Answer>,
    /// Threads draw at random (random shapes) instead of walking the set in order.
    draw: bool,
    source: String,
}

/// One thread count's run.
#[derive(Debug, Serialize)]
struct Row {
    threads: usize,
    seconds: f64,
    selections: u64,
    selections_per_s: f64,
    per_thread_per_s: f64,
    plan_hits: u64,
    cache_hits: u64,
    cache_misses: u64,
    live: u64,
    shared: u64,
    wait_timeouts: u64,
    uncacheable: u64,
    cache_entries: usize,
    cache_entry_bound: usize,
    mismatches: u64,
    rss_kib_after: Option<u64>,
}

pub(super) fn run(a: BenchArgs) -> Result<Outcome> {
    if a.threads.is_empty() {
        return Err(Error::invalid("--threads: give at least one thread count (e.g. 1,2,16)"));
    }
    if let Some(bad) = a.threads.iter().find(|&&t| t == 0 || t > MAX_THREADS) {
        return Err(Error::invalid(format!("--threads {bad}: each thread count must be in 1..={MAX_THREADS}")));
    }
    if !(a.seconds.is_finite() && a.seconds > 0.0 && a.seconds <= MAX_SECONDS) {
        return Err(Error::invalid(format!("--seconds {}: must be above 0 and at most {MAX_SECONDS}", a.seconds)));
    }
    if a.workload.is_some() && a.random_shapes {
        return Err(Error::invalid("--random-shapes draws its own requests; it cannot be combined with --workload"));
    }
    let bound = soak::bound_kib(a.max_rss_growth_mb)?;
    let rss_start = rss_kib();
    // The reference handle answers every request once, alone; the rows use fresh handles.
    let reference = LayerZero::host()?;
    let set = build_set(&a, &reference)?;
    let hardware = reference.hardware().description.clone();
    drop(reference);
    let rss_ready = rss_kib();
    let mut rows = Vec::new();
    let mut first_mismatch = None;
    let total = Duration::from_secs_f64(a.seconds) * a.threads.len() as u32;
    let sampler = Sampler::start(soak::period_for(total), total / 4);
    for &threads in &a.threads {
        let lz = LayerZero::host()?;
        let (row, mismatch) = run_row(&lz, &set, threads, Duration::from_secs_f64(a.seconds));
        first_mismatch = first_mismatch.or(mismatch);
        drop(lz);
        rows.push(Row { rss_kib_after: rss_kib(), ..row });
    }
    let (series, period) = sampler.finish();
    let soak = soak::judge(&series, period, bound);
    let rss_end = rss_kib();
    let mismatches: u64 = rows.iter().map(|r| r.mismatches).sum();
    let checked: u64 = rows.iter().map(|r| r.selections).sum();
    if a.json {
        print_json(&json!({
            "hardware": hardware,
            "requests": set.requests.len(),
            "source": set.source,
            "random_shapes": a.random_shapes,
            "seconds_per_row": a.seconds,
            "rows": rows,
            "deterministic": mismatches == 0,
            "checked": checked,
            "mismatches": mismatches,
            "first_mismatch": first_mismatch,
            "rss_kib": {"start": rss_start, "ready": rss_ready, "end": rss_end},
            "rss_over_time": soak,
        }));
    } else {
        print!(
            "{}",
            render(&set, &a, &hardware, &rows, checked, first_mismatch.as_deref(), [rss_start, rss_ready, rss_end])
        );
        print!("{}", soak.render());
    }
    Ok(if mismatches == 0 && soak.within_bound { Outcome::Ok } else { Outcome::CheckFailed })
}

fn build_set(a: &BenchArgs, reference: &LayerZero) -> Result<Set> {
    let (requests, source, draw) = if a.random_shapes {
        // Eight times as many draws as the cache can intern (about half survive as distinct
        // keys): once it is full, most draws miss.
        let n = (reference.cache().capacity() * 16).max(1024);
        (random_requests(n), format!("random shapes, seed {SEED:#x}"), true)
    } else {
        let (workload, source) = match &a.workload {
            Some(path) => (Workload::load(path)?, path.display().to_string()),
            None => (Workload::from_json(BUILTIN, "the built-in set")?, "built-in mixed set".to_owned()),
        };
        let points = workload.points()?;
        (points.into_iter().map(|p| p.request).collect(), source, false)
    };
    let mut seen = HashSet::new();
    let mut set = Set { requests: Vec::new(), keys: Vec::new(), expected: Vec::new(), draw, source };
    for req in requests {
        let key = SelectionKey::derive(&req);
        if !seen.insert((key.validity, key.buckets())) {
            continue;
        }
        set.expected.push(Answer::of(&reference.select_keyed(&key, &req)));
        set.keys.push(key);
        set.requests.push(req);
    }
    if set.requests.is_empty() {
        return Err(Error::invalid(format!("{}: no request to select for", set.source)));
    }
    Ok(set)
}

/// Runs `threads` threads selecting from `set` on `lz` for `time`; the first mismatch found,
/// described.
fn run_row(lz: &LayerZero, set: &Set, threads: usize, time: Duration) -> (Row, Option<String>) {
    let start = Barrier::new(threads);
    let before = lz.counters();
    let results: Vec<(u64, u64, Duration, Option<String>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let start = &start;
                s.spawn(move || {
                    let mut rng = SplitMix(SEED ^ (t as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    // In order, every thread from the first request: cold misses meet.
                    let mut next = 0usize;
                    let (mut done, mut wrong, mut first) = (0u64, 0u64, None);
                    start.wait();
                    let began = Instant::now();
                    while began.elapsed() < time {
                        for _ in 0..CHUNK {
                            let i = if set.draw { rng.below(set.requests.len()) } else { next };
                            next = if next + 1 == set.requests.len() { 0 } else { next + 1 };
                            let got = Answer::of(&lz.select_keyed(&set.keys[i], &set.requests[i]));
                            if got != set.expected[i] {
                                wrong += 1;
                                first.get_or_insert_with(|| {
                                    format!(
                                        "request {i} ({}): alone {:?}, from {threads} threads {got:?}",
                                        set.requests[i].op.as_str(),
                                        set.expected[i]
                                    )
                                });
                            }
                        }
                        done += CHUNK as u64;
                    }
                    (done, wrong, began.elapsed(), first)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or((0, 1, Duration::ZERO, Some("a thread panicked".into()))))
            .collect()
    });
    let after = lz.counters();
    let selections: u64 = results.iter().map(|r| r.0).sum();
    let mismatches: u64 = results.iter().map(|r| r.1).sum();
    let secs = results.iter().map(|r| r.2.as_secs_f64()).fold(0.0, f64::max);
    let per_s = if secs > 0.0 { selections as f64 / secs } else { 0.0 };
    let first = results.into_iter().find_map(|r| r.3);
    let row = Row {
        threads,
        seconds: secs,
        selections,
        selections_per_s: per_s,
        per_thread_per_s: per_s / threads as f64,
        plan_hits: after.plan_hits - before.plan_hits,
        cache_hits: after.cache_hits - before.cache_hits,
        cache_misses: after.cache_misses - before.cache_misses,
        live: after.live - before.live,
        shared: after.shared - before.shared,
        wait_timeouts: after.wait_timeouts - before.wait_timeouts,
        uncacheable: after.uncacheable - before.uncacheable,
        cache_entries: lz.cache().len(),
        cache_entry_bound: lz.cache().capacity() * 2,
        mismatches,
        rss_kib_after: None,
    };
    (row, first)
}

/// SplitMix64: a seeded stream, the same on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n` > 0; the modulo bias is far below what a benchmark notices).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())]
    }
}

/// `n` requests of random shapes: norms, projections and attention with random widths,
/// heads, head sizes, dtypes and token counts, so that nearly every one has its own key.
fn random_requests(n: usize) -> Vec<Request> {
    let mut rng = SplitMix(SEED);
    let dtypes = ["f32", "bf16", "f16"];
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let dtype = rng.pick(&dtypes);
        let value = match rng.below(3) {
            0 => {
                let (tokens, hidden) = (1 + rng.below(4096), 64 * (1 + rng.below(128)));
                json!({"op": "rms_norm", "tensors": {
                    "x": {"dtype": dtype, "shape": [tokens, hidden]}, "weight": {"dtype": dtype, "shape": [hidden]}}})
            }
            1 => {
                let (m, k, outs) = (1 + rng.below(4096), 64 * (1 + rng.below(128)), 64 * (1 + rng.below(128)));
                json!({"op": "linear", "tensors": {
                    "x": {"dtype": dtype, "shape": [m, k]}, "weight": {"dtype": dtype, "shape": [outs, k], "layout": "NT"}}})
            }
            _ => {
                let (batch, kv, group) = (1 + rng.below(8), rng.pick(&[1, 2, 4, 8]), rng.pick(&[1, 2, 4, 8]));
                let head_dim = rng.pick(&[64, 80, 96, 128, 256]);
                let seq_k = 1 + rng.below(4096);
                let seq_q = if rng.below(2) == 0 { 1 } else { seq_k };
                let t =
                    |s: usize, h: usize| json!({"dtype": dtype, "shape": [batch, s, h, head_dim], "layout": "BSHD"});
                json!({"op": "attention", "tensors": {"q": t(seq_q, kv * group), "k": t(seq_k, kv), "v": t(seq_k, kv)},
                    "attrs": {"causal": rng.below(2) == 0}})
            }
        };
        // Every shape drawn is well formed; one that is not would be a bug here, so it is skipped.
        if let Ok(req) = Request::from_value(value) {
            out.push(req);
        }
    }
    out
}

fn render(
    set: &Set,
    a: &BenchArgs,
    hardware: &str,
    rows: &[Row],
    checked: u64,
    first_mismatch: Option<&str>,
    rss: [Option<u64>; 3],
) -> String {
    use std::fmt::Write as _;
    let mib = |k: Option<u64>| k.map_or_else(|| "n/a".to_owned(), |k| format!("{:.1} MiB", k as f64 / 1024.0));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "bench-select: {} requests ({}), {} s per row, on {hardware}",
        set.requests.len(),
        set.source,
        a.seconds
    );
    let _ = writeln!(
        s,
        "{:>7} {:>14} {:>14} {:>12} {:>12} {:>10} {:>8} {:>8} {:>9} {:>12} {:>10}",
        "threads",
        "selections/s",
        "per thread/s",
        "cache hits",
        "misses",
        "live",
        "shared",
        "timeouts",
        "plan hits",
        "entries",
        "mismatches"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:>7} {:>14.0} {:>14.0} {:>12} {:>12} {:>10} {:>8} {:>8} {:>9} {:>12} {:>10}",
            r.threads,
            r.selections_per_s,
            r.per_thread_per_s,
            r.cache_hits,
            r.cache_misses,
            r.live,
            r.shared,
            r.wait_timeouts,
            r.plan_hits,
            format!("{}/{}", r.cache_entries, r.cache_entry_bound),
            r.mismatches,
        );
    }
    match first_mismatch {
        None => {
            let _ = writeln!(s, "determinism: all {checked} answers equal the single-threaded answer");
        }
        Some(m) => {
            let _ = writeln!(
                s,
                "determinism: FAILED, {} of {checked} answers differ; first: {m}",
                rows.iter().map(|r| r.mismatches).sum::<u64>()
            );
        }
    }
    let after: Vec<String> =
        rows.iter().map(|r| format!("{} after {} thread(s)", mib(r.rss_kib_after), r.threads)).collect();
    let _ = writeln!(
        s,
        "resident memory: {} at start, {} with the requests and answers ready, {}; {} at end",
        mib(rss[0]),
        mib(rss[1]),
        after.join(", "),
        mib(rss[2])
    );
    s
}
