//! Linear and MLP speed of the `cpu` backend, through the builtin registry:
//! - `linear_f32` / `linear_bf16`: decode 1x4096x4096 and prefill 512x4096x4096 (M x K x N,
//!   NT weight); items/s are FLOP/s (2 M N K), bytes/s the weight bytes read per call.
//! - `linear_small_m`: the GEMV / sgemm crossover (M = 1..32, f32).
//! - `copy_weight`: a copy of the same weight bytes (one `copy_from_slice`, and one split
//!   over the rayon threads), the bandwidth the decode GEMV is compared with.
//! - `mlp`: `cpu.mlp.chain` vs `cpu.mlp.fused`, 128 tokens, H = 1024, I = 2816.
//! - `linear_decode` / `read_weights`: the decode GEMVs of a 125M Llama, weights from
//!   memory, against a plain parallel read of the same bytes.
//! - `linear_w4`: `cpu.linear_int4.fast` on 4096 x 4096 4-bit weights of each format (int4 g128,
//!   nf4 g64, mxfp4 g32, nvfp4 g16) against `cpu.linear.fast` on the f32 weight, M = 1 and 64.
//!
//! `LZ_BENCH_BACKEND=onednn` measures `onednn.linear.matmul` in the `linear_*` groups (its
//! weight packed on the first call, as a served model's is).
//! Run: `cargo bench -p layerzero --bench linear` (matrixmultiply reads `MATMUL_NUM_THREADS`,
//! rayon `RAYON_NUM_THREADS`).

use std::sync::Arc;

use divan::Bencher;
use divan::counter::{BytesCount, ItemsCount};
use layerzero::exec::args::{Int4Args, LinearArgs, MlpArgs, OpArgs};
use layerzero::exec::executor::Executor;
use layerzero::model::attrs::{Activation, Int4Attrs, MlpAttrs, NoAttrs};
use layerzero::model::dtype::DType;
use layerzero::model::w4::W4Format;
use layerzero::tensor::{HostTensor, Storage};
use rayon::prelude::*;

fn main() {
    divan::main();
}

const K: usize = 4096;
const N: usize = 4096;

/// Deterministic values in [-scale, scale).
fn tensor(dtype: DType, shape: &[usize], seed: u64, scale: f32) -> HostTensor {
    let n: usize = shape.iter().product();
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let v: Vec<f32> = (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    HostTensor::from_f32_as(dtype, shape, &v).expect("tensor")
}

fn kernel(id: &str) -> Arc<dyn Executor> {
    layerzero::builtin_registry().get(id).cloned().unwrap_or_else(|| panic!("{id} is not registered"))
}

/// The linear kernel measured: `cpu.linear.fast`, or `onednn.linear.matmul` with
/// `LZ_BENCH_BACKEND=onednn` (oneDNN found, e.g. through `LAYERZERO_ONEDNN_LIB`).
fn linear_kernel() -> Arc<dyn Executor> {
    let onednn = std::env::var("LZ_BENCH_BACKEND").is_ok_and(|b| b == "onednn");
    kernel(if onednn { "onednn.linear.matmul" } else { "cpu.linear.fast" })
}

fn bench_linear(bencher: Bencher, dtype: DType, m: usize) {
    let exec = linear_kernel();
    let args = OpArgs::Linear(LinearArgs {
        x: tensor(dtype, &[m, K], 1, 1.0),
        weight: tensor(dtype, &[N, K], 2, 0.02),
        bias: None,
        attrs: NoAttrs {},
    });
    let bytes = N * K * dtype.size_bytes() as usize;
    // A backend without this dtype under the ISA cap in force measures nothing.
    if let Err(e) = exec.run(&args) {
        eprintln!("linear {dtype} m={m}: {e}");
        return;
    }
    bencher
        .counter(ItemsCount::new(2 * m * N * K))
        .counter(BytesCount::new(bytes))
        .bench_local(|| exec.run(divan::black_box(&args)).expect("linear runs").len());
}

/// The arguments of a 4-bit linear of `format` (`[m, K] x [N, K]`), random codes and scales.
fn w4_args(format: &str, m: usize) -> OpArgs {
    let (format, group, scale) = match format {
        "int4" => (W4Format::Int4, 128, DType::F32),
        "nf4" => (W4Format::Nf4, 64, DType::F32),
        "mxfp4" => (W4Format::Mxfp4, 32, DType::I8),
        _ => (W4Format::Nvfp4, 16, DType::Fp8E4M3),
    };
    let bytes: Vec<i8> = tensor(DType::F32, &[N, K / 2], 3, 128.0).to_f32_vec().iter().map(|&v| v as i8).collect();
    let scales = match scale {
        // E8M0 exponents 2^-9 .. 2^-5.
        DType::I8 => HostTensor::new(Storage::I8(vec![120i8; N * K / group].into()), &[N, K / group]).expect("scales"),
        d => tensor(d, &[N, K / group], 4, 0.01),
    };
    OpArgs::LinearInt4(Int4Args {
        x: tensor(DType::F32, &[m, K], 1, 1.0),
        weight: HostTensor::new(Storage::I8(bytes.into()), &[N, K / 2]).expect("weight"),
        scales,
        zeros: None,
        bias: None,
        global_scale: None,
        attrs: Int4Attrs::of(format, group as u64),
    })
}

/// `FORMAT_mM`: 4-bit weights of FORMAT (or `f32` dense) at M rows.
#[divan::bench(
    args = ["f32_m1", "int4_m1", "nf4_m1", "mxfp4_m1", "nvfp4_m1", "f32_m64", "int4_m64", "nf4_m64", "mxfp4_m64", "nvfp4_m64"],
    sample_count = 20,
    sample_size = 1
)]
fn linear_w4(bencher: Bencher, case: &str) {
    let (format, m) = case.split_once("_m").expect("FORMAT_mM");
    let m: usize = m.parse().expect("M");
    let (exec, args) = if format == "f32" {
        let w = tensor(DType::F32, &[N, K], 2, 0.02);
        let x = tensor(DType::F32, &[m, K], 1, 1.0);
        (kernel("cpu.linear.fast"), OpArgs::Linear(LinearArgs { x, weight: w, bias: None, attrs: NoAttrs {} }))
    } else {
        (kernel("cpu.linear_int4.fast"), w4_args(format, m))
    };
    bencher
        .counter(ItemsCount::new(2 * m * N * K))
        .bench_local(|| exec.run(divan::black_box(&args)).expect("linear runs").len());
}

/// f32, M x 4096 x 4096 (1 = decode, 512 = prefill).
#[divan::bench(args = [1, 512], sample_count = 40, sample_size = 1)]
fn linear_f32(bencher: Bencher, m: usize) {
    bench_linear(bencher, DType::F32, m);
}

/// bf16, M x 4096 x 4096.
#[divan::bench(args = [1, 512], sample_count = 40, sample_size = 1)]
fn linear_bf16(bencher: Bencher, m: usize) {
    bench_linear(bencher, DType::BF16, m);
}

/// f32 with few rows: where the GEMV hands over to sgemm.
#[divan::bench(args = [2, 4, 8, 16, 32], sample_count = 10, sample_size = 1)]
fn linear_small_m(bencher: Bencher, m: usize) {
    bench_linear(bencher, DType::F32, m);
}

/// A copy of the 4096 x 4096 weight bytes (f32: 64 MiB; bf16: 32 MiB); counted bytes are
/// the bytes read, as for the GEMV.
#[divan::bench(args = ["f32", "bf16", "f32_parallel", "bf16_parallel"], sample_count = 20, sample_size = 1)]
fn copy_weight(bencher: Bencher, case: &str) {
    let bytes = N * K * if case.starts_with("f32") { 4 } else { 2 };
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let parallel = case.ends_with("parallel");
    let chunk = bytes.div_ceil(rayon::current_num_threads().max(1));
    bencher.counter(BytesCount::new(bytes)).bench_local(|| {
        if parallel {
            dst.par_chunks_mut(chunk).zip(src.par_chunks(chunk)).for_each(|(d, s)| d.copy_from_slice(s));
        } else {
            dst.copy_from_slice(divan::black_box(&src));
        }
        dst[bytes / 2]
    });
}

/// Gated MLP, 128 tokens, H 1024, I 2816 (f32 and bf16): the chain and the fused kernel.
#[divan::bench(args = ["chain_f32", "fused_f32", "chain_bf16", "fused_bf16"], sample_count = 10, sample_size = 1)]
fn mlp(bencher: Bencher, case: &str) {
    let (t, h, i) = (128usize, 1024usize, 2816usize);
    let dtype = if case.ends_with("bf16") { DType::BF16 } else { DType::F32 };
    let exec = kernel(if case.starts_with("chain") { "cpu.mlp.chain" } else { "cpu.mlp.fused" });
    let args = OpArgs::Mlp(MlpArgs {
        x: tensor(dtype, &[t, h], 3, 1.0),
        w_gate: tensor(dtype, &[i, h], 4, 0.03),
        w_up: tensor(dtype, &[i, h], 5, 0.03),
        w_down: tensor(dtype, &[h, i], 6, 0.02),
        attrs: MlpAttrs { activation: Activation::Silu },
    });
    bencher
        .counter(ItemsCount::new(3 * 2 * t * h * i))
        .bench_local(|| exec.run(divan::black_box(&args)).expect("mlp runs").len());
}

/// Decode GEMVs of the 125M Llama of `tools/bench_generate.py` (N x K: q/o 768x768, gate/up
/// 2048x768, down 768x2048, lm_head 32000x768), each call on the next of enough weight
/// copies to hold about 256 MiB, so weights come from memory as in a real decode step,
/// not from the last call's cache. Eight calls per sample run on one rayon worker, as a
/// decode step does (`Session::forward_batch`), so the caller's hand-off to the pool is
/// paid once per eight. Compare bytes/s with `read_weights`.
#[divan::bench(
    args = ["f32_768x768", "f32_2048x768", "f32_768x2048", "f32_32000x768", "bf16_768x768", "bf16_2048x768", "bf16_768x2048", "bf16_32000x768"],
    sample_count = 50,
    sample_size = 4
)]
fn linear_decode(bencher: Bencher, case: &str) {
    let (dtype, shape) = case.split_once('_').expect("dtype_shape");
    let dtype = if dtype == "f32" { DType::F32 } else { DType::BF16 };
    let (n, k) = shape.split_once('x').expect("NxK");
    let (n, k): (usize, usize) = (n.parse().expect("N"), k.parse().expect("K"));
    let bytes = n * k * dtype.size_bytes() as usize;
    let copies = (256usize << 20).div_ceil(bytes).max(2);
    let exec = kernel("cpu.linear.fast");
    let args: Vec<OpArgs> = (0..copies)
        .map(|c| {
            OpArgs::Linear(LinearArgs {
                x: tensor(dtype, &[1, k], 1, 1.0),
                weight: tensor(dtype, &[n, k], 2 + c as u64, 0.02),
                bias: None,
                attrs: NoAttrs {},
            })
        })
        .collect();
    let mut i = 0;
    bencher.counter(BytesCount::new(8 * bytes)).bench_local(|| {
        i = (i + 8) % copies;
        rayon::scope(|_| {
            (0..8)
                .map(|j| exec.run(divan::black_box(&args[(i + j) % copies])).expect("linear runs").len())
                .sum::<usize>()
        })
    });
}

/// A parallel read (sum) of 256 MiB in slices of `bytes` per call (eight per sample, on one
/// worker, as `linear_decode`): the memory bandwidth the decode GEMV is held against.
#[divan::bench(args = [1 << 20, 4 << 20, 48 << 20], sample_count = 50, sample_size = 4)]
fn read_weights(bencher: Bencher, bytes: usize) {
    let total = 256usize << 20;
    let src: Vec<f32> = (0..total / 4).map(|i| (i % 7) as f32).collect();
    let per = bytes / 4;
    let copies = total / bytes;
    let chunk = per.div_ceil(rayon::current_num_threads().max(1) * 4);
    let mut i = 0;
    bencher.counter(BytesCount::new(8 * bytes)).bench_local(|| {
        i = (i + 8) % copies;
        rayon::scope(|_| {
            (0..8)
                .map(|j| {
                    let at = (i + j) % copies;
                    src[at * per..(at + 1) * per].par_chunks(chunk).map(lanes_sum).sum::<f32>()
                })
                .sum::<f32>()
        })
    });
}

/// A sum in 64 independent lanes (vectorizes; a plain `sum` is one serial chain).
fn lanes_sum(v: &[f32]) -> f32 {
    let mut a = [0f32; 64];
    for c in v.chunks_exact(64) {
        for l in 0..64 {
            a[l] += c[l];
        }
    }
    a.iter().sum()
}
