//! What subprocess isolation costs per call: the example plugin's fused add + RMSNorm run
//! through `dispatch`, loaded in this process and isolated in a worker, calls interleaved,
//! for a few sizes. Prints the median of each, the added time and the ratio.
//!
//! `cargo run --release -p layerzero-tests --example isolation_overhead [CALLS]`

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use layerzero::NormArgs;
use layerzero::backend::plugin::Plugin;
use layerzero::backend::plugin::worker::WorkerOptions;
use layerzero::capabilities::catalog::Catalog;
use layerzero::prelude::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn build(args: &[&str]) -> Result<PathBuf> {
    let root = layerzero_tests::repo_root();
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&root)
        .args(["build", "-q", "--release"])
        .args(args)
        .status()?;
    if !status.success() {
        return Err(format!("cargo build {args:?} failed").into());
    }
    Ok(std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from).join("release"))
}

fn args(rows: usize, h: usize) -> Result<OpArgs> {
    let x = HostTensor::from_f32(&[rows, h], (0..rows * h).map(|i| ((i % 13) as f32 - 6.0) / 3.0).collect())?;
    let residual = HostTensor::from_f32(&[rows, h], (0..rows * h).map(|i| ((i % 5) as f32 - 2.0) / 7.0).collect())?;
    let weight = HostTensor::from_f32(&[h], (0..h).map(|i| 0.5 + (i % 3) as f32 / 4.0).collect())?;
    Ok(OpArgs::RmsNorm(NormArgs { x, weight, bias: None, residual: Some(residual), attrs: Default::default() }))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let calls: usize = std::env::args().nth(1).map_or(Ok(300), |n| n.parse())?;
    let release = build(&["-p", "layerzero-plugin-example"])?;
    build(&["-p", "layerzero-plugin", "--bin", "layerzero-plugin-worker"])?;
    let lib = release.join(format!(
        "{}layerzero_plugin_example{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    let local = Arc::new(Plugin::open(&lib)?);
    let options = WorkerOptions {
        program: release.join(format!("layerzero-plugin-worker{}", std::env::consts::EXE_SUFFIX)),
        deadline: Duration::from_secs(30),
    };
    let remote = Arc::new(Plugin::open_isolated(&lib, &local.library_hash, options)?);
    let kernel = "fusedops@0.1.0.rms_norm.add_fused";
    let policy =
        || Policy::from_json(&format!(r#"{{"rules": [{{"action": "lock", "kernels": "{kernel}"}}]}}"#), "lock");
    let here = LayerZero::detected_with_plugins(Catalog::builtin()?, &[local])?.with_policy(policy()?)?;
    let there = LayerZero::detected_with_plugins(Catalog::builtin()?, &[remote])?.with_policy(policy()?)?;
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    println!("{cpu}; {calls} calls each, interleaved; medians");
    println!("{:>12} {:>12} {:>12} {:>12} {:>8}", "shape", "in-process", "isolated", "added", "ratio");
    for (rows, h) in [(1, 64), (8, 4096), (64, 4096), (512, 4096)] {
        let a = args(rows, h)?;
        for _ in 0..10 {
            here.dispatch(&a)?;
            there.dispatch(&a)?;
        }
        let (mut t_here, mut t_there) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
        for _ in 0..calls {
            let t = Instant::now();
            here.dispatch(&a)?;
            t_here.push(t.elapsed());
            let t = Instant::now();
            there.dispatch(&a)?;
            t_there.push(t.elapsed());
        }
        let (h_med, t_med) = (median(t_here), median(t_there));
        println!(
            "{:>12} {:>10.1}us {:>10.1}us {:>10.1}us {:>7.2}x",
            format!("{rows}x{h}"),
            h_med.as_secs_f64() * 1e6,
            t_med.as_secs_f64() * 1e6,
            (t_med.as_secs_f64() - h_med.as_secs_f64()) * 1e6,
            t_med.as_secs_f64() / h_med.as_secs_f64()
        );
    }
    Ok(())
}
