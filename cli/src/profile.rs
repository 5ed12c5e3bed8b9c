//! `lz generate --profile`: where a generation's time went, per phase (prefill, decode) and
//! op: wall time, selection, the kernels with the runtime's guards, what remained in the
//! dispatch (buffers, telemetry), the bytes the op's tensors hold against this machine's
//! measured copy bandwidth, and the time spent outside any dispatch (the model's own code
//! between ops). Forking and joining threads is inside each kernel's time; the report puts
//! the measured cost of one fork-join beside the number of dispatches per step, an upper
//! bound of what waiting for threads can cost.

use std::collections::BTreeMap;
use std::fmt::Write;

use layerzero::error::Result;
use layerzero::model::op::Op;
use layerzero_llm as llm;
use serde_json::{Value, json};

/// The machine's measured copy bandwidth (GB/s, read + written), fork-join and call on the
/// warm decode team (µs), from `lz hardware --measure`'s file, measured first where it
/// holds nothing for this host.
fn machine() -> Result<(f64, f64, Option<f64>, String)> {
    let path = layerzero::host::measure::path();
    layerzero::host::measure::ensure(&path)?;
    let nominal = layerzero::host::detect::detect_nominal();
    let file = layerzero::host::measure::load(&path)?;
    Ok(match file.hosts.get(&nominal.profile.fingerprint) {
        Some(m) => (m.copy_gbps, m.fork_join_us, m.team_call_us, m.cpu.clone()),
        None => (0.0, 0.0, None, "unmeasured".to_owned()),
    })
}

/// One phase: `steps` units the per-step figures divide by (the prompt's tokens for the
/// prefill, decode steps for the decode), its wall time, what ran.
fn phase(name: &str, steps: usize, wall_ns: u64, stats: &BTreeMap<Op, llm::OpStats>, machine: (f64, f64)) -> Value {
    let (copy_gbps, fork_join_us) = machine;
    let per = steps.max(1) as f64;
    let mut ops = Vec::new();
    let mut in_dispatch = 0u64;
    let mut calls_total = 0u64;
    for (op, s) in stats {
        let calls: u64 = s.kernels.values().sum();
        calls_total += calls;
        in_dispatch += s.ns;
        let gbps = if s.run_ns > 0 { s.bytes as f64 / s.run_ns as f64 } else { 0.0 };
        ops.push(json!({
            "op": op.as_str(),
            "kernels": s.kernels,
            "calls_per_step": calls as f64 / per,
            "us_per_step": s.ns as f64 / per / 1e3,
            "select_us_per_step": s.select_ns as f64 / per / 1e3,
            "run_us_per_step": s.run_ns as f64 / per / 1e3,
            "rest_us_per_step": s.ns.saturating_sub(s.select_ns + s.run_ns) as f64 / per / 1e3,
            "mb_per_step": s.bytes as f64 / per / 1e6,
            "gb_per_s": gbps,
            "pct_of_copy_bandwidth": if copy_gbps > 0.0 { 100.0 * gbps / copy_gbps } else { 0.0 },
            "share_of_wall": if wall_ns > 0 { s.ns as f64 / wall_ns as f64 } else { 0.0 },
        }));
    }
    let bytes: u64 = stats.values().map(|s| s.bytes).sum();
    let wall_s = wall_ns as f64 / 1e9;
    json!({
        "phase": name,
        "steps": steps,
        "wall_ms": wall_ns as f64 / 1e6,
        "wall_us_per_step": wall_ns as f64 / per / 1e3,
        "dispatches_per_step": calls_total as f64 / per,
        "fork_join_bound_us_per_step": calls_total as f64 / per * fork_join_us,
        "outside_dispatch_us_per_step": wall_ns.saturating_sub(in_dispatch) as f64 / per / 1e3,
        "mb_per_step": bytes as f64 / per / 1e6,
        "gb_per_s_over_wall": if wall_s > 0.0 { bytes as f64 / 1e9 / wall_s } else { 0.0 },
        "ops": ops,
    })
}

/// The profile of a generation (`--profile`): the machine's figures and both phases.
pub(super) fn report(out: &llm::Generated, prompt_tokens: usize) -> Result<Value> {
    let (copy_gbps, fork_join_us, team_call_us, cpu) = machine()?;
    Ok(json!({
        "cpu": cpu,
        "threads": rayon::current_num_threads(),
        "copy_gbps": copy_gbps,
        "fork_join_us": fork_join_us,
        "team_call_us": team_call_us,
        "phases": [
            phase("prefill", prompt_tokens, out.prefill_ns, &out.prefill_stats, (copy_gbps, fork_join_us)),
            phase("decode", out.decode_steps, out.decode_ns, &out.decode_stats, (copy_gbps, fork_join_us)),
        ],
    }))
}

/// The profile for people.
pub(super) fn render(p: &Value) -> String {
    let f = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let mut o = String::new();
    let _ = writeln!(
        o,
        "profile on {} ({} threads): copy bandwidth {:.1} GB/s, fork-join {:.1} us{} (lz hardware --measure)",
        p["cpu"].as_str().unwrap_or("?"),
        p["threads"],
        f(p, "copy_gbps"),
        f(p, "fork_join_us"),
        p["team_call_us"].as_f64().map(|t| format!(", decode team call {t:.2} us")).unwrap_or_default()
    );
    for ph in p["phases"].as_array().into_iter().flatten() {
        let unit = if ph["phase"] == "prefill" { "prompt token" } else { "decode step" };
        let _ = writeln!(
            o,
            "\n{}: {:.1} us per {unit} over {} ({:.1} dispatches each, {:.1} MB of tensors, {:.1} GB/s over the wall time); outside any dispatch {:.1} us",
            ph["phase"].as_str().unwrap_or("?"),
            f(ph, "wall_us_per_step"),
            ph["steps"],
            f(ph, "dispatches_per_step"),
            f(ph, "mb_per_step"),
            f(ph, "gb_per_s_over_wall"),
            f(ph, "outside_dispatch_us_per_step"),
        );
        let _ = writeln!(
            o,
            "  waiting for threads: at most {:.1} us per {unit} ({:.1} dispatches x one measured fork-join), inside `run`",
            f(ph, "fork_join_bound_us_per_step"),
            f(ph, "dispatches_per_step"),
        );
        let _ = writeln!(
            o,
            "  {:<16} {:>7} {:>9} {:>8} {:>9} {:>8} {:>7} {:>7} {:>6} {:>6}  kernel",
            "op", "calls", "us", "select", "run", "rest", "MB", "GB/s", "%bw", "%wall"
        );
        for r in ph["ops"].as_array().into_iter().flatten() {
            let kernels: Vec<String> =
                r["kernels"].as_object().into_iter().flatten().map(|(k, n)| format!("{k} x{n}")).collect();
            let _ = writeln!(
                o,
                "  {:<16} {:>7.1} {:>9.1} {:>8.2} {:>9.1} {:>8.2} {:>7.2} {:>7.1} {:>6.1} {:>6.1}  {}",
                r["op"].as_str().unwrap_or("?"),
                f(r, "calls_per_step"),
                f(r, "us_per_step"),
                f(r, "select_us_per_step"),
                f(r, "run_us_per_step"),
                f(r, "rest_us_per_step"),
                f(r, "mb_per_step"),
                f(r, "gb_per_s"),
                f(r, "pct_of_copy_bandwidth"),
                100.0 * f(r, "share_of_wall"),
                kernels.join(", ")
            );
        }
    }
    let _ = writeln!(
        o,
        "\n(us: wall time per step in the op's dispatches = select + run + rest; run holds the kernel with the runtime's guards, \
         its threads' fork-join included; GB/s: the op's tensor bytes over its run time.)"
    );
    o
}
