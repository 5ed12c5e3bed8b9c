//! E2E spec §6.1 at long context: the 32/8-head GQA causal prefill (head dim 128) and a
//! decode step over its cache, executed on this CPU through `dispatch`. Prints the kernel,
//! the prefill time, the median decode time, and checks sampled prefill rows and the decode
//! output against the float64 oracle.
//!
//! `cargo run --release -p layerzero-tests --example long_context [TOKENS [CHUNK [DTYPE]]]`
//! (defaults 32768, all of them, f32). CHUNK < TOKENS runs only the last CHUNK queries of
//! the prefill over every key (the costliest chunk of a chunked prefill), for a machine
//! without the time or memory for the whole of it.

use std::time::{Duration, Instant};

use layerzero::LayerZero;
use layerzero::compare::Category;
use layerzero::model::dtype::DType;
use layerzero_tests::gqa::{self, Gqa, HEAD_DIM, HEADS_KV, HEADS_Q};
use layerzero_tests::{TestResult, close};

fn arg<T: std::str::FromStr>(i: usize, default: T) -> TestResult<T> {
    match std::env::args().nth(i) {
        None => Ok(default),
        Some(s) => s.parse().map_err(|_| format!("argument {i} `{s}` is not valid").into()),
    }
}

fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let name = info.lines().find_map(|l| l.strip_prefix("model name").and_then(|r| r.split(':').nth(1)));
    name.map_or_else(|| std::env::consts::ARCH.to_owned(), |n| n.trim().to_owned())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() -> TestResult {
    let seq: usize = arg(1, 32768)?;
    let chunk: usize = arg(2, seq)?.min(seq);
    let dtype: DType = arg(3, DType::F32)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{} ({threads} threads), {dtype}, H={HEADS_Q} Hkv={HEADS_KV} d={HEAD_DIM}, causal", cpu_name());
    let (lz, oracle) = (LayerZero::detected()?, gqa::oracle()?);
    let started = Instant::now();
    let g = Gqa::new(dtype, seq, 32)?;
    let call = g.last_queries(chunk)?;
    println!("inputs made in {:.1?}", started.elapsed());

    let started = Instant::now();
    let prefill = lz.dispatch(&call)?;
    let took = started.elapsed();
    gqa::served_first_try(&prefill)?;
    let kernel = prefill.selection().kernel.clone();
    let flops = 4.0 * HEADS_Q as f64 * HEAD_DIM as f64 * chunk as f64 * (seq - chunk / 2) as f64;
    println!(
        "prefill: {chunk} of {seq} queries over {seq} keys by {kernel}: {took:.2?} ({:.1} GFLOP/s)",
        flops / took.as_secs_f64() / 1e9
    );
    // Sampled rows of the chunk against the oracle on each row's own problem.
    let out = prefill.outputs["out"].to_f64_vec();
    let row = HEADS_Q * HEAD_DIM;
    for r in gqa::sample_rows(chunk, 8, 5) {
        let i = seq - chunk + r;
        let want = oracle.dispatch(&g.row(i)?)?.outputs["out"].to_f64_vec();
        close::values(&format!("prefill row {i}"), Category::Attention, dtype, &want, &out[r * row..(r + 1) * row])?;
    }
    println!("prefill: 8 sampled rows match the f64 oracle (rtol/atol of {dtype}, §5)");
    drop(prefill);

    let step = g.decode()?;
    let mut times = Vec::new();
    for _ in 0..15 {
        let started = Instant::now();
        let d = lz.dispatch(&step)?;
        times.push(started.elapsed());
        gqa::served_first_try(&d)?;
    }
    let d = lz.dispatch(&step)?;
    gqa::decode_matches(&g, &d.outputs["out"], &oracle)?;
    println!(
        "decode: 1 query over {} keys by {}: median {:.2?} of 15 (min {:.2?}); matches the f64 oracle",
        seq + 1,
        d.selection().kernel,
        median(times.clone()),
        times.iter().min().copied().unwrap_or_default()
    );
    Ok(())
}
