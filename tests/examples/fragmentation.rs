//! The allocation-fragmentation stress of E2E §11.3, long: rounds of 80 projections and
//! norms over many sizes, each with new outputs, in a new shuffled order every round
//! (`layerzero_tests::stress`). Prints the median round time of the first and the last
//! tenth of the rounds and their ratio (fragmentation would slow the later ones), and VmRSS
//! after the warm-up and at the end. Exit 1 on any dispatch error.
//!
//! `cargo run --release -p layerzero-tests --example fragmentation [ROUNDS]` (default 2000)

use std::time::{Duration, Instant};

use layerzero::LayerZero;
use layerzero::policy::Policy;
use layerzero_tests::stress;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok());
    kib.map_or(f64::NAN, |k: u64| k as f64 / 1024.0)
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let rounds: u64 = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(2000).max(20);
    let cases = stress::cases()?;
    let lz = LayerZero::host()?
        .with_policy(Policy::from_json(r#"{"rules": [{"action": "deny", "kernels": "cpu_reference.*"}]}"#, "p")?)?;
    println!("fragmentation stress on {}: {} cases a round, {rounds} rounds", lz.hardware().description, cases.len());
    for r in 0..2 {
        stress::round(&lz, &cases, r, |_, _| Ok(())).map_err(|e| e.to_string())?;
    }
    let warm = rss_mib();
    let mut times = Vec::with_capacity(rounds as usize);
    let mut peak = warm;
    for r in 2..rounds + 2 {
        let t = Instant::now();
        stress::round(&lz, &cases, r, |_, _| Ok(())).map_err(|e| e.to_string())?;
        times.push(t.elapsed());
        if r % 50 == 0 {
            peak = peak.max(rss_mib());
        }
    }
    let tenth = times.len() / 10;
    let (first, last) = (median(&times[..tenth]), median(&times[times.len() - tenth..]));
    println!(
        "round median: first tenth {:.1} us, last tenth {:.1} us, last/first {:.3}",
        first.as_secs_f64() * 1e6,
        last.as_secs_f64() * 1e6,
        last.as_secs_f64() / first.as_secs_f64()
    );
    println!("VmRSS: {warm:.1} MiB after warm-up, peak {peak:.1} MiB, {:.1} MiB at end", rss_mib());
    Ok(())
}
