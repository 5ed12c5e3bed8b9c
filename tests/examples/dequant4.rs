//! The 4-bit dequantize (issue 30, spec 002 §6.5 / §22): a `[4096, 4096]` weight of each
//! format (nf4 per 64, mxfp4 per 32, nvfp4 per 16, int4 per 128) dequantized to f32 by
//! `cpu.dequantize.fast` and by the f64 oracle `cpu_reference.dequantize.naive`, and, for
//! scale, the int8 per-channel dequantize of the same element count on the cpu kernel.
//! Prints the median of REPS calls of each, the cpu kernel's GB/s of weight bytes read, and
//! the oracle / cpu ratio measured in the same run; exit 1 when the cpu output leaves the
//! oracle by more than its two f32 roundings.
//!
//! `cargo run --release -p layerzero-tests --example dequant4 [REPS]` (default 15)

use std::time::{Duration, Instant};

use layerzero::exec::args::{DequantizeArgs, OpArgs};
use layerzero::model::attrs::{QuantAttrs, QuantScheme};
use layerzero::model::w4::{ScaleOrder, W4Format};
use layerzero::tensor::HostTensor;
use layerzero::{DType, LayerZero};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const N: usize = 4096;
const K: usize = 4096;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A deterministic byte stream (xorshift), as f32 values of i8 bytes.
fn bytes(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 56) as u8 as i8 as f32
        })
        .collect()
}

/// The dequantize arguments of a `format` weight with blocks of `group`, to f32.
fn w4_args(format: W4Format, group: usize) -> Result<OpArgs> {
    let x = HostTensor::from_f32_as(DType::I8, &[N, K / 2], &bytes(N * K / 2, 7))?;
    let blocks = N * K / group;
    let scale = match format {
        W4Format::Mxfp4 => HostTensor::from_f32_as(DType::I8, &[N, K / group], &vec![120.0; blocks])?,
        W4Format::Nvfp4 => HostTensor::from_f32_as(DType::Fp8E4M3, &[N, K / group], &vec![0.0625; blocks])?,
        W4Format::Int4 => HostTensor::from_f32_as(DType::BF16, &[N, K / group], &vec![0.01; blocks])?,
        W4Format::Nf4 => HostTensor::from_f32(&[N, K / group], vec![0.02; blocks])?,
    };
    let global_scale = (format == W4Format::Nvfp4).then(|| HostTensor::from_f32(&[1], vec![0.5])).transpose()?;
    let attrs = QuantAttrs {
        scheme: QuantScheme::PerBlock,
        block: Some([1, group as u64]),
        scale_layout: None,
        target: None,
        out_dtype: None,
        format: Some(format),
        scale_order: ScaleOrder::Linear,
    };
    Ok(OpArgs::Dequantize(DequantizeArgs { x, scale, global_scale, attrs }))
}

/// The int8 per-channel dequantize of `[N, K]`, to f32.
fn i8_args() -> Result<OpArgs> {
    let attrs = QuantAttrs {
        scheme: QuantScheme::PerChannel,
        block: None,
        scale_layout: None,
        target: None,
        out_dtype: None,
        format: None,
        scale_order: ScaleOrder::Linear,
    };
    let x = HostTensor::from_f32_as(DType::I8, &[N, K], &bytes(N * K, 11))?;
    let scale = HostTensor::from_f32(&[N], vec![0.01; N])?;
    Ok(OpArgs::Dequantize(DequantizeArgs { x, scale, global_scale: None, attrs }))
}

/// The median time of `reps` runs of `kernel`, and its last output.
fn time(lz: &LayerZero, kernel: &str, args: &OpArgs, reps: usize) -> Result<(Duration, HostTensor)> {
    let exec = lz.registry().get(kernel).ok_or_else(|| format!("{kernel} is not registered"))?;
    let mut out = exec.run(args)?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        out = exec.run(args)?;
        times.push(t.elapsed());
    }
    Ok((median(times), out.remove("out").ok_or("no out")?))
}

fn main() -> Result<()> {
    let reps: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(15).max(3);
    let lz = LayerZero::detected()?;
    println!("4-bit dequantize of [{N}, {K}] to f32 on {}, median of {reps} calls", lz.hardware().description);
    let (i8_time, _) = time(&lz, "cpu.dequantize.fast", &i8_args()?, reps)?;
    println!("int8 per-channel (cpu.dequantize.fast): {:.2} ms", i8_time.as_secs_f64() * 1e3);
    let mut ok = true;
    for (format, group) in [(W4Format::Nf4, 64), (W4Format::Mxfp4, 32), (W4Format::Nvfp4, 16), (W4Format::Int4, 128)] {
        let args = w4_args(format, group)?;
        let (fast, got) = time(&lz, "cpu.dequantize.fast", &args, reps)?;
        let (oracle, want) = time(&lz, "cpu_reference.dequantize.naive", &args, reps.min(5))?;
        // Two f32 roundings (scale * global, then code * scale) at most, against one.
        let off = want
            .to_f64_vec()
            .iter()
            .zip(got.to_f64_vec())
            .filter(|(r, o)| (*o - **r).abs() > r.abs() * 2f64.powi(-22))
            .count();
        ok &= off == 0;
        let gbs = (N * K / 2) as f64 / fast.as_secs_f64() / 1e9;
        println!(
            "{:5} block {group:3}: cpu {:.2} ms ({gbs:.2} GB/s packed), oracle {:.2} ms, oracle/cpu {:.1}x, 4-bit/int8 {:.2}x, {off} elements off",
            format.as_str(),
            fast.as_secs_f64() * 1e3,
            oracle.as_secs_f64() * 1e3,
            oracle.as_secs_f64() / fast.as_secs_f64(),
            fast.as_secs_f64() / i8_time.as_secs_f64(),
        );
    }
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
