//! The cost model: modeled time of a kernel on a device, from FLOPs, bytes, the device's
//! peaks and the kernel's efficiencies. Measured times (PerfDB) replace it when present.
//!
//! `estimated_ns = max(flops / (peak[dtype] * eff_compute), bytes / (bandwidth * eff_mem)) + launch_ns`

pub mod calibration;
pub mod measured;

use serde::{Deserialize, Serialize};

use crate::capabilities::spec::KernelSpec;
use crate::hardware::profile::DeviceProfile;
use crate::model::attrs::{Attrs, CausalAlignment};
use crate::model::op::Op;
use crate::model::problem::{AttentionDims, Dims, Problem};
use crate::model::request::Request;
use crate::reason::Reason;
use crate::transform::Transform;
use measured::{MeasurementRef, RowVerdict};

/// Where an estimate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreSource {
    /// The analytic cost model.
    Model,
    /// A confident PerfDB measurement.
    Perfdb,
    /// A PerfDB measurement down-weighted for its variance, blended with the model.
    Blended,
}

impl ScoreSource {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            ScoreSource::Model => "model",
            ScoreSource::Perfdb => "perfdb",
            ScoreSource::Blended => "blended",
        }
    }
}

/// The arithmetic behind a candidate's rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Score {
    /// Kernel time, ns.
    pub estimated_ns: f64,
    /// Where `estimated_ns` comes from.
    pub source: ScoreSource,
    /// Time of the transforms, ns.
    pub transform_ns: f64,
    /// Product of matching prefer/avoid factors.
    pub policy_factor: f64,
    /// (estimated + transform) x policy_factor; lowest wins.
    pub total_ns: f64,
    /// The cost-model terms.
    pub model: Estimate,
    /// The PerfDB measurement behind `estimated_ns` (absent: the model alone).
    pub measurement: Option<MeasurementRef>,
    /// PerfDB rows for this kernel and bucket that were not used, with the reason.
    pub notes: Vec<Reason>,
}

/// The terms of a modeled estimate.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Estimate {
    /// Floating-point operations.
    pub flops: f64,
    /// Bytes moved to and from memory.
    pub bytes: f64,
    /// flops / (peak * eff_compute), ns.
    pub compute_ns: f64,
    /// bytes / (bandwidth * eff_mem), ns.
    pub memory_ns: f64,
    /// Fixed per-call cost, ns.
    pub launch_ns: f64,
    /// max(compute, memory) + launch, ns.
    pub estimated_ns: f64,
    /// The coefficients came from this machine's calibration, not the capability file.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub calibrated: bool,
}

/// The modeled estimate of `kernel` on `problem`, with `calibration`'s coefficients for it
/// when it has them.
pub fn modeled(
    kernel: &KernelSpec,
    req: &Request,
    problem: &Problem,
    dev: &DeviceProfile,
    calibration: Option<&calibration::Calibration>,
) -> Estimate {
    match calibration {
        Some(c) => {
            let (perf, calibrated) = c.perf(&kernel.id, problem.dtype, &kernel.perf);
            Estimate { calibrated, ..estimate_with(&perf, kernel, req, problem, dev) }
        }
        None => estimate(kernel, req, problem, dev),
    }
}

/// The score stage: the modeled time (`model`, from [`modeled`]), replaced or blended by a
/// PerfDB measurement where one is usable (an unusable row becomes a note), plus the
/// transforms' time, times the policy's prefer/avoid factor. Lowest total wins.
pub fn total(model: Estimate, measured: Option<&RowVerdict>, transforms: &[Transform], policy_factor: f64) -> Score {
    let (mut estimated_ns, mut source, mut measurement, mut notes) =
        (model.estimated_ns, ScoreSource::Model, None, Vec::new());
    match measured {
        Some(RowVerdict::Use(m)) => {
            estimated_ns = measured::blend(m, model.estimated_ns);
            source = if m.weight >= 1.0 { ScoreSource::Perfdb } else { ScoreSource::Blended };
            measurement = Some(m.clone());
        }
        Some(RowVerdict::Ignored(r)) => notes.push(r.clone()),
        None => {}
    }
    let transform_ns = transforms.iter().fold(0.0, |a, t| a + t.ns);
    let total_ns = (estimated_ns + transform_ns) * policy_factor;
    Score { estimated_ns, source, transform_ns, policy_factor, total_ns, model, measurement, notes }
}

/// Models `kernel` running `problem` on `dev`.
pub fn estimate(kernel: &KernelSpec, req: &Request, problem: &Problem, dev: &DeviceProfile) -> Estimate {
    estimate_with(&kernel.perf, kernel, req, problem, dev)
}

/// Models `kernel` running `problem` on `dev` with the coefficients `p` (a calibration's).
pub fn estimate_with(
    p: &crate::capabilities::spec::PerfModel,
    kernel: &KernelSpec,
    req: &Request,
    problem: &Problem,
    dev: &DeviceProfile,
) -> Estimate {
    let (flops, bytes) = work(kernel, req, problem);
    let compute_ns = flops / (dev.peak_flops(problem.dtype) * p.eff_compute) * 1e9;
    let memory_ns = bytes / (dev.bandwidth_bytes_per_s() * p.eff_mem) * 1e9;
    Estimate {
        flops,
        bytes,
        compute_ns,
        memory_ns,
        launch_ns: p.launch_ns,
        estimated_ns: compute_ns.max(memory_ns) + p.launch_ns,
        calibrated: false,
    }
}

/// (FLOPs, bytes) of a request on `kernel`.
fn work(kernel: &KernelSpec, req: &Request, problem: &Problem) -> (f64, f64) {
    let out_bytes = problem.output_elements() as f64 * problem.dtype.size_bytes() as f64;
    let in_bytes = problem.input_bytes as f64;
    match problem.dims {
        Dims::Attention(a) => {
            let keys = visible_keys(req, &a);
            let per_head = keys * (2.0 * a.head_dim as f64 + 2.0 * a.head_dim_v as f64);
            let flops = a.batch as f64 * a.heads_q as f64 * per_head;
            // A paged cache is a pool shared by every sequence: a call reads the pages its
            // block table reaches, not the pool.
            let in_bytes = match a.paged {
                Some(_) => {
                    let pool: u64 = ["k_cache", "v_cache"].iter().filter_map(|n| req.get(n)).map(|t| t.bytes()).sum();
                    let reached = a.batch as f64
                        * a.seq_k as f64
                        * a.heads_kv as f64
                        * (a.head_dim + a.head_dim_v) as f64
                        * a.kv_dtype.size_bytes() as f64;
                    in_bytes - pool as f64 + reached.min(pool as f64)
                }
                None => in_bytes,
            };
            (flops, in_bytes + out_bytes)
        }
        Dims::Rows { rows, hidden } => {
            let per_elem = match req.op {
                Op::LayerNorm => 8.0,
                Op::RmsNorm | Op::Rope | Op::Gelu | Op::Swiglu | Op::Geglu => 6.0,
                Op::Sample | Op::MoeRoute => 10.0,
                _ => 1.0,
            };
            (rows as f64 * hidden as f64 * per_elem, in_bytes + out_bytes)
        }
        Dims::Gemm { m, n, k } => {
            // A patch embedding's GEMM runs on its patches gathered into an [m, k] f32
            // matrix: written once, read back.
            let patches = if req.op == Op::PatchEmbed { 2.0 * m as f64 * k as f64 * 4.0 } else { 0.0 };
            (2.0 * m as f64 * n as f64 * k as f64, in_bytes + out_bytes + patches)
        }
        Dims::Mlp { tokens, hidden, intermediate, top_k, .. } => {
            let rows = tokens as f64 * top_k as f64;
            let flops = 6.0 * rows * hidden as f64 * intermediate as f64;
            // An unfused chain writes the gate and up projections and the activation, and
            // reads them back (f32); a fused kernel keeps them in cache.
            let intermediates = if kernel.perf.fused { 0.0 } else { 6.0 * rows * intermediate as f64 * 4.0 };
            (flops, in_bytes + out_bytes + intermediates)
        }
        Dims::None => (0.0, in_bytes),
    }
}

/// Sum over query rows of the keys each row attends to (causal and window aware).
fn visible_keys(req: &Request, a: &AttentionDims) -> f64 {
    let Attrs::Attention(at) = &req.attrs else { return (a.seq_q * a.seq_k) as f64 };
    let (sq, sk) = (a.seq_q as i128, a.seq_k as i128);
    let offset = match (at.causal, at.causal_alignment) {
        (false, _) => None,
        (true, CausalAlignment::BottomRight) => Some(sk - sq),
        (true, CausalAlignment::TopLeft) => Some(0),
    };
    // Row i sees keys [lo(i), hi(i)] clipped to [0, sk).
    let total = match (offset, at.window_left) {
        (None, None) => sq.saturating_mul(sk),
        (Some(off), None) => clamped_sum(off + 1, sq, sk),
        (Some(off), Some(w)) => clamped_sum(off + 1, sq, sk) - clamped_sum(off - w as i128, sq, sk),
        (None, Some(w)) => sq.saturating_mul(sk) - clamped_sum(-(w as i128), sq, sk),
    };
    total.max(0) as f64
}

/// sum_{x = a}^{a + n - 1} clamp(x, 0, cap), in closed form.
fn clamped_sum(a: i128, n: i128, cap: i128) -> i128 {
    if n <= 0 || cap <= 0 {
        return 0;
    }
    let b = a + n - 1;
    // Part in [1, cap - 1]: arithmetic series.
    let lo = a.max(1);
    let hi = b.min(cap - 1);
    let middle = if hi >= lo { (lo + hi).saturating_mul(hi - lo + 1) / 2 } else { 0 };
    // Part >= cap contributes cap each.
    let top_start = a.max(cap);
    let top = if b >= top_start { (b - top_start + 1).saturating_mul(cap) } else { 0 };
    middle.saturating_add(top)
}

#[cfg(test)]
mod tests {
    use super::clamped_sum;

    fn brute(a: i128, n: i128, cap: i128) -> i128 {
        (a..a + n).map(|x| x.clamp(0, cap)).sum()
    }

    #[test]
    fn clamped_sum_matches_the_loop_it_replaces() {
        for a in -10..12 {
            for n in 0..15 {
                for cap in 0..9 {
                    assert_eq!(clamped_sum(a, n, cap), brute(a, n, cap), "a={a} n={n} cap={cap}");
                }
            }
        }
    }
}
