//! Human renderings of reports and tables.

use std::fmt::Write as _;

use layerzero::capabilities::spec::{BackendSpec, KernelSpec};
use layerzero::hardware::profile::HardwareProfile;
use layerzero::reason::{Category, ReasonCode};
use layerzero::select::{SelectionReport, Verdict};

/// A duration for people: ns, µs, ms or s.
pub(super) fn duration(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.2} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.3} ms", ns / 1e6)
    } else {
        format!("{:.3} s", ns / 1e9)
    }
}

/// Unix seconds as `YYYY-MM-DD HH:MM:SS UTC` (for people).
pub(super) fn utc(secs: i64) -> String {
    let [y, mo, d, h, mi, s] = layerzero::time::civil(secs);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02} UTC")
}

/// Unix seconds as RFC 3339 `YYYY-MM-DDTHH:MM:SSZ` (for files).
pub(super) fn rfc3339(secs: i64) -> String {
    layerzero::time::format_utc(secs)
}

fn request_line(r: &SelectionReport) -> String {
    let mut parts = Vec::new();
    for (name, t) in &r.request.tensors {
        let layout = t.layout.map(|l| format!(" {l}")).unwrap_or_default();
        let strided = if t.strides.is_some() && !t.is_contiguous() { " strided" } else { "" };
        parts.push(format!("{name}={} {:?}{layout}{strided}", t.dtype, t.shape));
    }
    format!("{} {}", r.request.op, parts.join(", "))
}

/// The one-line reason `which` prints when nothing qualifies.
pub(super) fn no_selection_line(r: &SelectionReport) -> String {
    if let Some(e) = r.request_errors.first() {
        return format!("no kernel: invalid request: {e}");
    }
    format!(
        "no kernel qualifies for {} on {} ({} candidates rejected; run `lz explain` for the reasons)",
        r.request.op,
        r.hardware.name,
        r.candidates.len()
    )
}

/// `lz explain` for people: the winner and its arithmetic, then every candidate.
pub(super) fn explain(r: &SelectionReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "request:   {}", request_line(r));
    let _ =
        writeln!(out, "hardware:  {} [{}] on {} ({} mode)", r.hardware.name, r.hardware.fingerprint, r.device, r.mode);
    let _ = writeln!(out, "hashes:    capabilities {}  policy {}", &r.capabilities_hash[..16], &r.policy_hash[..16]);
    if let Some(l) = &r.lock {
        let _ = writeln!(out, "lock:      policy rule {} locks {}", l.rule, l.kernel);
    }
    for e in &r.request_errors {
        let _ = writeln!(out, "error:     {e}");
    }
    match r.selected_candidate() {
        Some(c) => {
            let _ = writeln!(out, "selected:  {}", c.kernel);
            if let Some(s) = &c.score {
                let m = &s.model;
                let _ = writeln!(
                    out,
                    "  score:   total {} = (estimated {} [{}] + transforms {}) x policy {}",
                    duration(s.total_ns),
                    duration(s.estimated_ns),
                    s.source.as_str(),
                    duration(s.transform_ns),
                    s.policy_factor
                );
                let _ = writeln!(
                    out,
                    "  model:   max(compute {}, memory {}) + launch {}  ({:.3e} flop, {:.3e} bytes)",
                    duration(m.compute_ns),
                    duration(m.memory_ns),
                    duration(m.launch_ns),
                    m.flops,
                    m.bytes
                );
            }
            for t in &c.transforms {
                let _ = writeln!(
                    out,
                    "  transform: {} {} {} -> {} ({} bytes, {})",
                    t.kind.as_str(),
                    t.tensor,
                    t.from,
                    t.to,
                    t.bytes,
                    duration(t.ns)
                );
            }
            if !r.fused_ops.is_empty() {
                let _ = writeln!(out, "  fused:   {}", r.fused_ops.join(", "));
            }
        }
        None => {
            let _ = writeln!(out, "selected:  none");
        }
    }
    let _ = writeln!(out, "\ncandidates ({}):", r.candidates.len());
    let width = r.candidates.iter().map(|c| c.kernel.len()).max().unwrap_or(6).max(6);
    let _ = writeln!(out, "  {:<9} {:<width$}  {:>12}  REASONS", "VERDICT", "KERNEL", "TOTAL");
    let mut order: Vec<&layerzero::select::CandidateReport> = r.candidates.iter().collect();
    order.sort_by(|a, b| {
        let rank = |v: Verdict| match v {
            Verdict::Selected => 0,
            Verdict::Eligible => 1,
            Verdict::Rejected => 2,
        };
        let total = |c: &layerzero::select::CandidateReport| c.score.as_ref().map_or(f64::INFINITY, |s| s.total_ns);
        rank(a.verdict).cmp(&rank(b.verdict)).then(total(a).total_cmp(&total(b))).then(a.kernel.cmp(&b.kernel))
    });
    for c in order {
        let total = c.score.as_ref().map_or_else(|| "-".to_owned(), |s| duration(s.total_ns));
        let first = c.reasons.first().map_or_else(
            || {
                if c.transforms.is_empty() {
                    "-".to_owned()
                } else {
                    format!("needs {} transform(s)", c.transforms.len())
                }
            },
            |r| r.to_string(),
        );
        let _ = writeln!(out, "  {:<9} {:<width$}  {:>12}  {first}", c.verdict.as_str(), c.kernel, total);
        for reason in c.reasons.iter().skip(1) {
            let _ = writeln!(out, "  {:<9} {:<width$}  {:>12}  {reason}", "", "", "");
        }
        // A standing that no reason already states: passed, unverified under `warn`, a
        // failure the policy allows.
        if let Some(p) = c.parity.filter(|_| c.reasons.iter().all(|r| r.code().category() != Category::Parity)) {
            let _ = writeln!(out, "  {:<9} {:<width$}  {:>12}  parity: {p} on this machine", "", "", "");
        }
    }
    out
}

/// `lz list-kernels` for people.
pub(super) fn kernel_table(rows: &[(usize, &BackendSpec, &KernelSpec)], runs: &dyn Fn(&str) -> bool) -> String {
    let mut out = String::new();
    let width = rows.iter().map(|(_, _, k)| k.id.len()).max().unwrap_or(6).max(6);
    let _ = writeln!(
        out,
        "{:<width$}  {:<16} {:<5} {:<16} {:<10} {:<5} PROPERTIES",
        "KERNEL", "OP", "DEV", "EXECUTION", "VERSION", "RUNS"
    );
    for (_, b, k) in rows {
        let p = &k.properties;
        let mut props = Vec::new();
        if p.deterministic {
            props.push("deterministic");
        }
        if p.graph_safe {
            props.push("graph_safe");
        }
        if p.needs_jit {
            props.push("jit");
        }
        let exec = format!("{:?}", b.execution).to_lowercase();
        let _ = writeln!(
            out,
            "{:<width$}  {:<16} {:<5} {:<16} {:<10} {:<5} {}",
            k.id,
            k.op.as_str(),
            k.device_kind(b).as_str(),
            exec,
            k.version.as_deref().unwrap_or(&b.version),
            if runs(&k.id) { "yes" } else { "no" },
            props.join(" ")
        );
    }
    let _ = writeln!(out, "{} kernels", rows.len());
    out
}

/// `lz hardware` for people.
pub(super) fn hardware(p: &HardwareProfile, notes: &[String]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "profile:     {} [{}]", p.name, p.fingerprint);
    let _ = writeln!(out, "description: {}", p.description);
    for (i, d) in p.devices.iter().enumerate() {
        let role = if i == 0 { "primary" } else { "device" };
        let _ = writeln!(out, "{role}:     {} {} ({})", d.kind, d.name, d.vendor);
        if let Some(cc) = d.compute_capability {
            let _ = writeln!(out, "  compute capability {cc}");
        }
        if let Some(g) = &d.gfx {
            let _ = writeln!(out, "  gfx {g}");
        }
        if let Some(v) = &d.driver {
            let _ = writeln!(out, "  driver {v}");
        }
        if let Some(v) = &d.runtime {
            let _ = writeln!(out, "  runtime {v}");
        }
        if let Some(b) = d.l2_bytes {
            let _ = writeln!(out, "  L2 {:.1} MiB", b as f64 / (1u64 << 20) as f64);
        }
        if !d.isa.is_empty() {
            let _ = writeln!(out, "  isa: {}", d.isa.names());
        }
        let _ = writeln!(
            out,
            "  memory {:.1} GiB, bandwidth {} GB/s, {} compute units",
            d.memory_bytes as f64 / (1u64 << 30) as f64,
            d.memory_bandwidth_gbps,
            d.compute_units
        );
        let peaks: Vec<String> = d.peak_tflops.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "  peak TFLOP/s: {}", peaks.join(", "));
    }
    for n in notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

/// `lz hardware --measure` for people: each figure measured next to its nominal estimate.
pub(super) fn measured(
    cpu: &layerzero::hardware::profile::DeviceProfile,
    m: &layerzero::host::measure::Measured,
    path: &std::path::Path,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{} (cap {}, {} threads), measured {}", m.cpu, m.cap, m.threads, m.measured_at);
    let _ = writeln!(out, "{:<34} {:>12} {:>12}", "figure", "nominal", "measured");
    let _ = writeln!(out, "{:<34} {:>12} {:>12}", "copy bandwidth, GB/s", cpu.memory_bandwidth_gbps, m.copy_gbps);
    for (dt, v) in &m.peak_tflops {
        let nominal = cpu.peak_tflops.get(dt).map_or("-".to_owned(), |x| x.to_string());
        let _ = writeln!(out, "{:<34} {:>12} {:>12}", format!("peak {dt}, TFLOP/s"), nominal, v);
    }
    for (path_name, v) in &m.mac_per_ns_per_thread {
        let _ = writeln!(out, "{:<34} {:>12} {:>12}", format!("{path_name} multiply-adds/ns/thread"), "-", v);
    }
    let _ = writeln!(out, "{:<34} {:>12} {:>12}", "fork-join, us", "-", m.fork_join_us);
    let split = m.split_min_bytes.map_or("never".to_owned(), |b| format!("{:.2} MB", b as f64 / 1e6));
    let _ = writeln!(out, "{:<34} {:>12} {:>12}", "row work split from", "32768 elts", split);
    if let Some(t) = m.team_call_us {
        let _ = writeln!(out, "{:<34} {:>12} {:>12}", "decode team call, us", "-", t);
    }
    if let Some(b) = m.team_split_min_bytes {
        let _ = writeln!(out, "{:<34} {:>12} {:>12}", "decode op split from", "-", format!("{:.2} MB", b as f64 / 1e6));
    }
    let _ =
        writeln!(out, "stored in {} for fingerprint {}; detection uses it from now on", path.display(), m.fingerprint);
    out
}

/// `lz reason-codes` for people.
pub(super) fn reason_codes() -> String {
    let mut out = String::new();
    for c in ReasonCode::ALL {
        let _ = writeln!(out, "{:<32} {:<12} {}", c.as_str(), c.category().as_str(), c.meaning());
    }
    out
}

#[cfg(test)]
mod date_tests {
    use super::{rfc3339, utc};

    #[test]
    fn unix_seconds_become_civil_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_750_000_000), "2025-06-15 15:06:40 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(-86_400), "1969-12-31 00:00:00 UTC");
        assert_eq!(rfc3339(1_750_000_000), "2025-06-15T15:06:40Z");
    }
}
