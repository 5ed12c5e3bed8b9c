//! What an engine author writes: one `use` line, then select, explain and dispatch on this
//! machine. Run from the repository root: `cargo run --example engine`.

use layerzero as lz;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> lz::Result<()> {
    // Attention for one prefill of 128 tokens, 8 query heads over 2 KV heads (GQA).
    let t = |heads: usize| {
        let n = 128 * heads * 64;
        let values = (0..n).map(|i| ((i % 97) as f32 - 48.0) / 97.0).collect();
        lz::HostTensor::from_f32(&[1, 128, heads, 64], values).map(|x| x.with_layout(lz::Layout::Bshd))
    };
    let attention = lz::OpArgs::Attention(lz::AttentionArgs {
        q: t(8)?,
        k: t(2)?,
        v: t(2)?,
        mask: None,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        attrs: lz::AttentionAttrs { causal: true, ..Default::default() },
    });
    show("attention", &attention)?;

    // RMSNorm over 16 rows of 4096.
    let x = lz::HostTensor::from_f32(&[16, 4096], (0..16 * 4096).map(|i| (i % 13) as f32 * 0.1).collect())?;
    let weight = lz::HostTensor::from_f32(&[4096], vec![1.0; 4096])?;
    let norm = lz::OpArgs::RmsNorm(lz::NormArgs { x, weight, bias: None, residual: None, attrs: Default::default() });
    show("rms_norm", &norm)?;

    let c = lz::host()?.counters();
    println!("counters: {} live selections, {} cache hits, {} fallbacks", c.live, c.cache_hits, c.fallbacks);
    Ok(())
}

/// Selects, explains and runs one call, printing the kernel and why it won.
fn show(name: &str, args: &lz::OpArgs) -> lz::Result<()> {
    let request = args.describe();
    let chosen = lz::select(&request)?;
    println!("== {name} on {}", lz::host()?.hardware().name);
    println!(
        "selected  {} ({}): {:.1} us ({} estimate), {} selection",
        chosen.kernel,
        chosen.backend,
        chosen.score.total_ns / 1e3,
        chosen.score.source.as_str(),
        chosen.source().as_str()
    );
    for candidate in &lz::explain(&request)?.candidates {
        match (&candidate.score, candidate.reasons.first()) {
            (_, Some(why)) => println!("  rejected  {:<34} {why}", candidate.kernel),
            (Some(s), None) if candidate.kernel != chosen.kernel => {
                println!("  eligible  {:<34} {:.1} us", candidate.kernel, s.total_ns / 1e3)
            }
            _ => {}
        }
    }
    let ran = lz::dispatch(args)?;
    let out = &ran.outputs["out"];
    println!("ran       {} -> out {:?}, {} fallback(s)\n", ran.selection().kernel, out.shape(), ran.failed().len());
    Ok(())
}
