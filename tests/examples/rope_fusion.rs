//! What fusing RoPE into attention saves (spec 002 §6.6): `cpu.attention.flash` rotating q
//! and k as it reads them (`attrs.rope`) against the unfused chain (`cpu.rope.fast` on q and
//! on k, then `cpu.attention.flash`): the fused call through `LayerZero::attention_with_rope`
//! (selection included), the chain's three kernels run directly (no selection: the
//! comparison favours the chain), calls interleaved, for a prefill and a decode shape in f32
//! and bf16. Prints the median of each, and the chain's time over the fused one.
//!
//! `cargo run --release -p layerzero-tests --example rope_fusion [CALLS]`

use std::time::{Duration, Instant};

use layerzero::LayerZero;
use layerzero::compare::{Category, check_tensors};
use layerzero::exec::args::{AttentionArgs, OpArgs, RopeArgs};
use layerzero::model::attrs::{AttentionAttrs, RopeAttrs};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::tensor::rng::Rng;
use layerzero::tensor::{HostTensor, Storage};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn normal(rng: &mut Rng, dtype: DType, shape: [usize; 4]) -> Result<HostTensor> {
    let v = rng.normals(shape.iter().product());
    Ok(HostTensor::from_f32_as(dtype, &shape, &v)?.with_layout(Layout::Bshd))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn positions(range: std::ops::Range<usize>) -> Result<HostTensor> {
    let p: Vec<i64> = range.map(|x| x as i64).collect();
    let n = p.len();
    Ok(HostTensor::new(Storage::I64(p.into()), &[n])?)
}

/// The chain: rope on q (at the keys' last positions) and on k, then attention.
fn chain(lz: &LayerZero, a: &AttentionArgs, sq: usize, sk: usize) -> Result<HostTensor> {
    let rope = a.attrs.rope.clone().ok_or("no rope")?;
    let run = |args: OpArgs| -> Result<HostTensor> {
        let exec = match &args {
            OpArgs::Rope(_) => lz.registry().get("cpu.rope.fast"),
            _ => lz.registry().get("cpu.attention.flash"),
        }
        .ok_or("no executor")?;
        Ok(exec.run(&args)?.remove("out").ok_or("no out")?)
    };
    let rotate = |t: &HostTensor, p: HostTensor| {
        run(OpArgs::Rope(RopeArgs {
            q: t.clone(),
            k: None,
            positions: Some(p),
            cos: None,
            sin: None,
            attrs: rope.clone(),
        }))
    };
    let mut plain = a.clone();
    plain.q = rotate(&a.q, positions(sk - sq..sk)?)?;
    plain.k = rotate(&a.k, positions(0..sk)?)?;
    plain.attrs.rope = None;
    run(OpArgs::Attention(plain))
}

fn main() -> Result<()> {
    let calls: usize = std::env::args().nth(1).map_or(Ok(21), |n| n.parse())?;
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    println!("{cpu}, {} hardware threads, {calls} calls each, interleaved", threads());
    let lz = LayerZero::host()?;
    println!("{:<34} {:>12} {:>12} {:>8}", "case", "fused", "chain", "chain/fused");
    for dtype in [DType::F32, DType::BF16] {
        for (name, b, sq, sk) in
            [("prefill 1x1024, 32/8 heads, d128", 1, 1024, 1024), ("decode 8x1 over 4096", 8, 1, 4096)]
        {
            let mut rng = Rng::new(7);
            let a = AttentionArgs {
                q: normal(&mut rng, dtype, [b, sq, 32, 128])?,
                k: normal(&mut rng, dtype, [b, sk, 8, 128])?,
                v: normal(&mut rng, dtype, [b, sk, 8, 128])?,
                mask: None,
                cu_seqlens_q: None,
                cu_seqlens_k: None,
                attrs: AttentionAttrs { causal: true, rope: Some(RopeAttrs::default()), ..AttentionAttrs::default() },
            };
            // Same numbers first (the tests hold both to the f64 oracle).
            let fused = lz.attention_with_rope(&a)?;
            if !fused.fused() {
                return Err(format!("{name}: the fused kernel did not run: {:?}", fused.fused_refused).into());
            }
            check_tensors(name, Category::Attention, &chain(&lz, &a, sq, sk)?, &fused.out)?;
            let (mut f, mut c) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
            for _ in 0..calls {
                let t = Instant::now();
                std::hint::black_box(lz.attention_with_rope(&a)?);
                f.push(t.elapsed());
                let t = Instant::now();
                std::hint::black_box(chain(&lz, &a, sq, sk)?);
                c.push(t.elapsed());
            }
            let (f, c) = (median(f), median(c));
            let label = format!("{name} {dtype}");
            println!("{label:<34} {:>10.3}ms {:>10.3}ms {:>8.2}", ms(f), ms(c), c.as_secs_f64() / f.as_secs_f64());
        }
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
