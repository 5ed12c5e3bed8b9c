//! Row-wise kernels of the `cpu` backend against this machine's copy bandwidth: rms_norm and
//! layer_norm over [4096, 4096] (f32, bf16), swiglu over a split [4096, 2 * 5504] f32, and an
//! embedding lookup of 4096 ids in a [32000, 4096] f32 table; each next to a plain copy of
//! the same number of bytes (read + written), so the throughput column gives the ratio.
//! `LZ_BENCH_BACKEND=onednn` (with oneDNN found, e.g. `LAYERZERO_ONEDNN_LIB`) measures the
//! `onednn` kernel of each op instead of the `cpu` one; a bench whose op that backend lacks
//! measures nothing.
//! Run: `cargo bench -p layerzero --bench rows`; `LZ_ROWS_TABLE=1 cargo bench -p layerzero
//! --bench rows` instead prints one table (ms, GB/s, % of copy) measured with the kernel and
//! its copies interleaved, round by round, which keeps the ratio honest on a busy machine.

use std::sync::OnceLock;

use divan::Bencher;
use divan::counter::BytesCount;
use layerzero::exec::args::{EmbeddingArgs, NormArgs, OpArgs, SwigluArgs};
use layerzero::exec::executor::Registry;
use layerzero::model::attrs::{NoAttrs, NormAttrs, SwigluAttrs};
use layerzero::model::dtype::DType;
use layerzero::tensor::{HostTensor, Storage};
use rayon::prelude::*;

fn main() {
    if std::env::var_os("LZ_ROWS_TABLE").is_some() {
        table();
    } else {
        divan::main();
    }
}

const ROWS: usize = 4096;
const HIDDEN: usize = 4096;
const INTER: usize = 5504;
const VOCAB: usize = 32000;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(layerzero::builtin_registry)
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

fn tensor(dtype: DType, shape: &[usize], seed: u64) -> HostTensor {
    HostTensor::from_f32_as(dtype, shape, &values(shape.iter().product(), seed)).expect("tensor")
}

/// The kernel measured for `cpu_kernel`'s op: itself, or with `LZ_BENCH_BACKEND=onednn` the
/// `onednn` kernel of the op (`None`: that backend has none).
fn kernel_for(cpu_kernel: &str) -> Option<&'static str> {
    let onednn = std::env::var("LZ_BENCH_BACKEND").is_ok_and(|b| b == "onednn");
    let op = cpu_kernel.split('.').nth(1)?;
    let id = match (onednn, op) {
        (false, _) => return registry().kernels().find(|k| *k == cpu_kernel),
        (true, "layer_norm") => "onednn.layer_norm.lnorm",
        (true, "swiglu") => "onednn.swiglu.eltwise_mul",
        (true, "silu") => "onednn.silu.eltwise",
        (true, "gelu") => "onednn.gelu.eltwise",
        _ => return None,
    };
    registry().kernels().find(|k| *k == id)
}

fn run(bencher: Bencher, kernel: &str, args: OpArgs, bytes: usize) {
    let Some(kernel) = kernel_for(kernel) else { return };
    let exec = registry().get(kernel).expect("kernel registered").clone();
    if exec.run(&args).is_err() {
        return;
    }
    bencher.counter(BytesCount::new(bytes)).bench_local(|| exec.run(divan::black_box(&args)));
}

/// As [`run`], each call handed the previous call's outputs as its buffers (a serving loop's
/// steady state, as `lz tune` times kernels): no new buffer, so no page faults in the time.
fn run_reusing(bencher: Bencher, kernel: &str, args: OpArgs, bytes: usize) {
    let Some(kernel) = kernel_for(kernel) else { return };
    let exec = registry().get(kernel).expect("kernel registered").clone();
    let Ok(mut spare) = exec.run(&args) else { return };
    bencher.counter(BytesCount::new(bytes)).bench_local(|| {
        spare = exec.run_into(divan::black_box(&args), std::mem::take(&mut spare)).expect("ran once already");
    });
}

fn norm_args(dtype: DType) -> NormArgs {
    NormArgs {
        x: tensor(dtype, &[ROWS, HIDDEN], 1),
        weight: tensor(dtype, &[HIDDEN], 2),
        bias: None,
        residual: None,
        attrs: NormAttrs::default(),
    }
}

fn norm_bytes(dtype: DType) -> usize {
    2 * ROWS * HIDDEN * dtype.size_bytes() as usize
}

#[divan::bench(args = [DType::F32, DType::BF16], sample_count = 30)]
fn rms_norm_4096x4096(bencher: Bencher, dtype: DType) {
    run(bencher, "cpu.rms_norm.fast", OpArgs::RmsNorm(norm_args(dtype)), norm_bytes(dtype));
}

#[divan::bench(args = [DType::F32, DType::BF16], sample_count = 30)]
fn layer_norm_4096x4096(bencher: Bencher, dtype: DType) {
    let mut a = norm_args(dtype);
    a.bias = Some(tensor(dtype, &[HIDDEN], 3));
    run(bencher, "cpu.layer_norm.fast", OpArgs::LayerNorm(a), norm_bytes(dtype));
}

#[divan::bench(sample_count = 30)]
fn swiglu_split_4096x11008_f32(bencher: Bencher) {
    let x = tensor(DType::F32, &[ROWS, 2 * INTER], 4);
    let a = SwigluArgs { x: Some(x), gate: None, up: None, attrs: SwigluAttrs { split: true } };
    run(bencher, "cpu.swiglu.fast", OpArgs::Swiglu(a), 3 * ROWS * INTER * 4);
}

#[divan::bench(sample_count = 30)]
fn swiglu_separate_4096x5504_f32(bencher: Bencher) {
    let (gate, up) = (tensor(DType::F32, &[ROWS, INTER], 6), tensor(DType::F32, &[ROWS, INTER], 7));
    let a = SwigluArgs { x: None, gate: Some(gate), up: Some(up), attrs: SwigluAttrs { split: false } };
    run(bencher, "cpu.swiglu.fast", OpArgs::Swiglu(a), 3 * ROWS * INTER * 4);
}

#[divan::bench(args = [DType::F32, DType::BF16], sample_count = 30)]
fn gelu_4096x5504(bencher: Bencher, dtype: DType) {
    let a = layerzero::exec::args::GeluArgs { x: tensor(dtype, &[ROWS, INTER], 8), attrs: Default::default() };
    run(bencher, "cpu.gelu.fast", OpArgs::Gelu(a), 2 * ROWS * INTER * dtype.size_bytes() as usize);
}

#[divan::bench(sample_count = 30)]
fn embedding_4096_of_32000x4096_f32(bencher: Bencher) {
    let ids: Vec<i64> = (0..ROWS as u64).map(|i| (i.wrapping_mul(2_654_435_761) % VOCAB as u64) as i64).collect();
    let ids = HostTensor::new(Storage::I64(ids.into()), &[ROWS]).expect("ids");
    let a = EmbeddingArgs { ids, table: tensor(DType::F32, &[VOCAB, HIDDEN], 5), attrs: NoAttrs {} };
    run(bencher, "cpu.embedding.fast", OpArgs::Embedding(a), 2 * ROWS * HIDDEN * 4);
}

/// Row counts of decode and small prefills: time must grow with the rows, with no step
/// where the work starts being split across threads (outputs reused, as in serving).
const SMALL_ROWS: [usize; 12] = [1, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256, 1024];

/// rms_norm over 2048 f32 columns at [`SMALL_ROWS`].
#[divan::bench(args = SMALL_ROWS, sample_count = 100)]
fn rms_norm_rows_x2048_f32(bencher: Bencher, rows: usize) {
    let a = NormArgs {
        x: tensor(DType::F32, &[rows, 2048], 1),
        weight: tensor(DType::F32, &[2048], 2),
        bias: None,
        residual: None,
        attrs: NormAttrs::default(),
    };
    run_reusing(bencher, "cpu.rms_norm.fast", OpArgs::RmsNorm(a), 2 * rows * 2048 * 4);
}

/// swiglu (separate gate and up) over 5504 f32 columns at [`SMALL_ROWS`].
#[divan::bench(args = SMALL_ROWS, sample_count = 100)]
fn swiglu_rows_x5504_f32(bencher: Bencher, rows: usize) {
    let (gate, up) = (tensor(DType::F32, &[rows, 5504], 6), tensor(DType::F32, &[rows, 5504], 7));
    let a = SwigluArgs { x: None, gate: Some(gate), up: Some(up), attrs: SwigluAttrs { split: false } };
    run_reusing(bencher, "cpu.swiglu.fast", OpArgs::Swiglu(a), 3 * rows * 5504 * 4);
}

/// Bytes moved (read + written) by the copies: those of the bf16 norms, the f32 norms and
/// the embedding, and swiglu.
const COPY_BYTES: [usize; 3] = [2 * ROWS * HIDDEN * 2, 2 * ROWS * HIDDEN * 4, 3 * ROWS * INTER * 4];

// Outputs (the kernels' and the copies') are dropped outside the timed region by divan.

/// A plain copy into a new buffer (`Vec::clone`: one thread, `memcpy`), as the kernels
/// write into new buffers: this is the baseline of the ratio.
#[divan::bench(args = COPY_BYTES, sample_count = 30)]
fn copy_new_buffer(bencher: Bencher, bytes: usize) {
    let src = vec![1u8; bytes / 2];
    bencher.counter(BytesCount::new(bytes)).bench_local(|| divan::black_box(&src).clone());
}

/// The same copy on rayon's threads (as the kernels run).
#[divan::bench(args = COPY_BYTES, sample_count = 30)]
fn copy_new_buffer_rayon(bencher: Bencher, bytes: usize) {
    let src = vec![1u8; bytes / 2];
    bencher.counter(BytesCount::new(bytes)).bench_local(|| {
        let mut dst = vec![0u8; src.len()];
        dst.par_chunks_mut(1 << 17)
            .zip(divan::black_box(&src).par_chunks(1 << 17))
            .for_each(|(d, s)| d.copy_from_slice(s));
        dst
    });
}

/// A copy into a buffer already faulted in: the memory bandwidth without the cost of
/// first-touch page faults (context, not the baseline: every kernel returns new buffers).
#[divan::bench(args = COPY_BYTES, sample_count = 30)]
fn copy_existing_buffer(bencher: Bencher, bytes: usize) {
    let src = vec![1u8; bytes / 2];
    let mut dst = vec![0u8; bytes / 2];
    dst.copy_from_slice(&src);
    bencher.counter(BytesCount::new(bytes)).bench_local(|| {
        divan::black_box(&mut dst).copy_from_slice(divan::black_box(&src));
        divan::black_box(&dst);
    });
}

/// Median and minimum of the samples, in seconds.
fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0])
}

fn time<T>(f: impl FnOnce() -> T) -> f64 {
    let t = std::time::Instant::now();
    let out = divan::black_box(f());
    let s = t.elapsed().as_secs_f64();
    drop(out);
    s
}

/// Copy of `bytes / 2` bytes into a new buffer: the faster of `memcpy` on one thread and a
/// rayon copy.
fn copy_time(src: &[u8]) -> f64 {
    let one = time(|| src.to_vec());
    let par = time(|| {
        let mut dst = vec![0u8; src.len()];
        dst.par_chunks_mut(1 << 17).zip(src.par_chunks(1 << 17)).for_each(|(d, s)| d.copy_from_slice(s));
        dst
    });
    one.min(par)
}

fn table() {
    let rounds: usize = std::env::var("LZ_ROWS_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(15);
    let ln = |dtype| {
        let mut a = norm_args(dtype);
        a.bias = Some(tensor(dtype, &[HIDDEN], 3));
        OpArgs::LayerNorm(a)
    };
    let ids: Vec<i64> = (0..ROWS as u64).map(|i| (i.wrapping_mul(2_654_435_761) % VOCAB as u64) as i64).collect();
    let emb = EmbeddingArgs {
        ids: HostTensor::new(Storage::I64(ids.into()), &[ROWS]).expect("ids"),
        table: tensor(DType::F32, &[VOCAB, HIDDEN], 5),
        attrs: NoAttrs {},
    };
    let swiglu = SwigluArgs {
        x: Some(tensor(DType::F32, &[ROWS, 2 * INTER], 4)),
        gate: None,
        up: None,
        attrs: SwigluAttrs { split: true },
    };
    let cases: Vec<(&str, &str, OpArgs, usize)> = vec![
        ("rms_norm 4096x4096 f32", "cpu.rms_norm.fast", OpArgs::RmsNorm(norm_args(DType::F32)), norm_bytes(DType::F32)),
        (
            "rms_norm 4096x4096 bf16",
            "cpu.rms_norm.fast",
            OpArgs::RmsNorm(norm_args(DType::BF16)),
            norm_bytes(DType::BF16),
        ),
        ("layer_norm 4096x4096 f32", "cpu.layer_norm.fast", ln(DType::F32), norm_bytes(DType::F32)),
        ("layer_norm 4096x4096 bf16", "cpu.layer_norm.fast", ln(DType::BF16), norm_bytes(DType::BF16)),
        ("swiglu split 4096x11008 f32", "cpu.swiglu.fast", OpArgs::Swiglu(swiglu), 3 * ROWS * INTER * 4),
        ("embedding 4096 of 32000x4096 f32", "cpu.embedding.fast", OpArgs::Embedding(emb), 2 * ROWS * HIDDEN * 4),
    ];
    println!("{rounds} interleaved rounds; bytes = read + written; copy = the same bytes into a new buffer");
    println!(
        "{:<34} {:>9} {:>8} {:>9} {:>8} {:>8} {:>10}",
        "case", "ms (med)", "GB/s", "copy ms", "GB/s", "% copy", "% (best)"
    );
    let only = std::env::var("LZ_ROWS_CASE").unwrap_or_default();
    for (name, kernel, args, bytes) in cases.into_iter().filter(|c| c.0.contains(only.as_str())) {
        let exec = registry().get(kernel).expect("kernel registered").clone();
        let src = vec![1u8; bytes / 2];
        exec.run(&args).expect("kernel runs");
        let (mut k, mut c) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            k.push(time(|| exec.run(&args)));
            c.push(copy_time(&src));
        }
        let ((km, kmin), (cm, cmin)) = (stats(k), stats(c));
        let gbs = |s: f64| bytes as f64 / s / 1e9;
        println!(
            "{name:<34} {:>9.2} {:>8.2} {:>9.2} {:>8.2} {:>7.0}% {:>9.0}%",
            km * 1e3,
            gbs(km),
            cm * 1e3,
            gbs(cm),
            100.0 * cm / km,
            100.0 * cmin / kmin
        );
    }
}
