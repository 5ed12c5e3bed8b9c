//! An engine that only selects, built with `layerzero = { default-features = false }`: its
//! dependency tree holds no SQLite, tokenizers, png, clap or indicatif (a test of the
//! workspace checks that with `cargo tree`). It plans for an H100 from this machine and
//! asks what this machine would run. Run: `cargo run -p layerzero-example-selection`.

use layerzero as lz;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> lz::Result<()> {
    // A Llama-3-8B prefill of 2048 tokens: 32 query heads over 8 KV heads.
    let attention = lz::Request::from_json(
        r#"{"op": "attention",
            "tensors": {"q": {"dtype": "bf16", "shape": [1, 2048, 32, 128], "layout": "BSHD"},
                        "k": {"dtype": "bf16", "shape": [1, 2048, 8, 128], "layout": "BSHD"},
                        "v": {"dtype": "bf16", "shape": [1, 2048, 8, 128], "layout": "BSHD"}},
            "attrs": {"causal": true}}"#,
    )?;
    let h100 = lz::LayerZero::planning("h100")?;
    let chosen = h100.select(&attention)?;
    println!("on an h100: {} ({})", chosen.kernel, chosen.backend);
    for c in h100.explain(&attention).candidates.iter().filter(|c| !c.reasons.is_empty()).take(3) {
        println!("  rejected {}: {}", c.kernel, c.reasons[0]);
    }
    let norm = lz::Request::from_json(
        r#"{"op": "rms_norm", "tensors": {"x": {"dtype": "f32", "shape": [16, 4096]},
                                          "weight": {"dtype": "f32", "shape": [4096]}}}"#,
    )?;
    let here = lz::select(&norm)?;
    let report = lz::explain(&norm)?;
    println!("here: {} ({}), {} candidates", here.kernel, here.backend, report.candidates.len());
    Ok(())
}
