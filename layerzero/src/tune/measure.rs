//! The timing protocol of `lz tune`.
//!
//! 1. Warm-up: runs until at least [`Protocol::warmup_runs`] runs and
//!    [`Protocol::warmup_time`] have passed (one run of a kernel slower than that suffices);
//!    it also estimates the time of one call.
//! 2. Samples: each sample times a batch of back-to-back calls long enough
//!    ([`Protocol::min_sample_time`]) that the clock's resolution and overhead do not
//!    matter, and records the time per call. Each call is handed the previous call's
//!    outputs as its buffers, as a serving loop hands them back (`Executor::run_into`): a
//!    kernel that writes into them allocates nothing, so the timing holds neither a new
//!    buffer's first-touch page faults nor the allocator's size thresholds (with new
//!    buffers, `rms_norm` over 2048 f32 columns took 33 µs for 64 rows and 217 µs for 128).
//! 3. Adaptive stop: after [`Protocol::min_samples`] samples, stop as soon as the series is
//!    steady (MAD / median <= [`Protocol::target_rel_mad`], or the 95% confidence interval
//!    of the median within [`Protocol::target_rel_ci`] of it); always stop at
//!    [`Protocol::max_samples`]; stop at the per-kernel time cap [`Protocol::time_cap`] once
//!    [`Protocol::min_samples_capped`] samples exist (the fewest PerfDB rows need to be
//!    used), and unconditionally at [`Protocol::hard_cap`].
//! 4. Summary: [`crate::perfdb::stats::summarize`] rejects outliers by MAD and gives median,
//!    percentiles, MAD and cv of the rest.
//!
//! The kernels competing for one problem are timed together ([`measure_interleaved`]):
//! after each one's warm-up, samples are taken round by round, one of each kernel per round,
//! so a change of the machine's load while they are timed shifts all their series alike
//! rather than favouring the one that happened to run in a quiet moment; the group stops as
//! one, so every series covers the same rounds.
//!
//! Only the kernel is timed: inputs are prepared (transforms applied) before. A kernel that
//! returns an error or panics ends its series with a [`Failure`]; it is reported, not fatal.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::exec::args::{OpArgs, Outputs};
use crate::exec::executor::{Executor, KernelError, panic_text};
use crate::perfdb::stats::{self, Summary};

/// The knobs of the protocol.
#[derive(Debug, Clone)]
pub struct Protocol {
    /// Fewest warm-up runs.
    pub warmup_runs: u32,
    /// Least warm-up time (one run longer than this is enough).
    pub warmup_time: Duration,
    /// Least duration of one sample's batch of calls.
    pub min_sample_time: Duration,
    /// Most calls in one sample.
    pub max_batch: u32,
    /// Samples before the adaptive stop is considered.
    pub min_samples: u32,
    /// Most samples.
    pub max_samples: u32,
    /// Steady when MAD / median is at most this.
    pub target_rel_mad: f64,
    /// Steady when the 95% confidence half-width of the median, relative to it, is at most this.
    pub target_rel_ci: f64,
    /// Per-kernel time (warm-up included) after which sampling stops once
    /// `min_samples_capped` samples exist.
    pub time_cap: Duration,
    /// Samples a capped series still collects (PerfDB rows with fewer are not used).
    pub min_samples_capped: u32,
    /// Per-kernel time after which sampling stops whatever it has.
    pub hard_cap: Duration,
}

impl Default for Protocol {
    fn default() -> Protocol {
        Protocol {
            warmup_runs: 1,
            warmup_time: Duration::from_millis(20),
            // Longer than a scheduler time slice: under contention from other processes a
            // shorter sample is either preempted or not (bimodal samples, high cv, rows the
            // selector down-weights); a longer one averages the contention.
            min_sample_time: Duration::from_millis(5),
            max_batch: 100_000,
            min_samples: 10,
            max_samples: 50,
            target_rel_mad: 0.02,
            target_rel_ci: 0.01,
            time_cap: Duration::from_secs(2),
            min_samples_capped: crate::score::measured::MIN_SAMPLES,
            hard_cap: Duration::from_secs(20),
        }
    }
}

impl Protocol {
    /// The knobs as JSON (durations in milliseconds).
    pub fn to_json(&self) -> serde_json::Value {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        serde_json::json!({
            "warmup_runs": self.warmup_runs,
            "warmup_ms": ms(self.warmup_time),
            "min_sample_ms": ms(self.min_sample_time),
            "min_samples": self.min_samples,
            "max_samples": self.max_samples,
            "target_rel_mad": self.target_rel_mad,
            "target_rel_ci": self.target_rel_ci,
            "time_cap_ms": ms(self.time_cap),
            "min_samples_capped": self.min_samples_capped,
            "hard_cap_ms": ms(self.hard_cap),
        })
    }

    /// A quick protocol for tests: few samples, short caps.
    pub fn quick() -> Protocol {
        Protocol {
            warmup_time: Duration::from_millis(1),
            min_sample_time: Duration::from_micros(50),
            min_samples: 5,
            max_samples: 8,
            time_cap: Duration::from_millis(200),
            hard_cap: Duration::from_secs(2),
            ..Protocol::default()
        }
    }
}

/// A finished series.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// Statistics of the kept samples (times per call, ns).
    pub summary: Summary,
    /// Calls per sample.
    pub batch: u32,
    /// Warm-up runs.
    pub warmup_runs: u32,
    /// Time the kernel spent being timed, warm-up included.
    pub elapsed: Duration,
    /// Why sampling stopped.
    pub stop: Stop,
}

/// Why a series stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// The series was steady.
    Steady,
    /// It reached the most samples.
    MaxSamples,
    /// It reached the per-kernel time cap.
    TimeCap,
    /// The run's deadline passed.
    Deadline,
}

impl Stop {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Stop::Steady => "steady",
            Stop::MaxSamples => "max_samples",
            Stop::TimeCap => "time_cap",
            Stop::Deadline => "deadline",
        }
    }
}

/// A kernel that failed while being timed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// What went wrong.
    pub message: String,
}

/// Times `exec` on `args` (already adapted for it) by the protocol. `deadline` (the run's
/// budget) ends sampling early once the capped minimum of samples exists.
pub fn measure(
    exec: &dyn Executor,
    args: &OpArgs,
    p: &Protocol,
    deadline: Option<Instant>,
) -> Result<Measurement, Failure> {
    let mut out = measure_interleaved(&[Candidate { exec, args }], p, deadline);
    out.pop().unwrap_or_else(|| Err(Failure { message: "nothing was measured".to_owned() }))
}

/// One kernel of an interleaved group: its executor and its (adapted) inputs.
#[derive(Clone, Copy)]
pub struct Candidate<'a> {
    /// The executor.
    pub exec: &'a dyn Executor,
    /// Its inputs, transforms applied.
    pub args: &'a OpArgs,
}

/// One kernel's series in progress.
struct Series {
    warmup_runs: u32,
    batch: u32,
    samples: Vec<f64>,
    /// Time this kernel has spent (warm-up and samples), for its caps.
    spent: Duration,
    /// The last call's outputs, handed to the next call as its buffers.
    spare: Outputs,
    stop: Option<Stop>,
    failure: Option<Failure>,
}

impl Series {
    /// Why this series should stop now, if it should. Counts are of kept samples (after
    /// outlier rejection), as the PerfDB row records them.
    fn stop_now(&self, p: &Protocol, deadline: Option<Instant>) -> Option<Stop> {
        let kept = stats::summarize(&self.samples);
        let n_kept = kept.map_or(0, |s| s.samples);
        if let Some(s) = &kept
            && n_kept >= p.min_samples.max(1)
            && steady(s, p)
        {
            return Some(Stop::Steady);
        }
        if self.samples.len() as u32 >= p.max_samples.max(1) {
            return Some(Stop::MaxSamples);
        }
        if !self.samples.is_empty() && self.spent >= p.hard_cap {
            return Some(Stop::TimeCap);
        }
        if n_kept >= p.min_samples_capped && self.spent >= p.time_cap {
            return Some(Stop::TimeCap);
        }
        if n_kept >= p.min_samples_capped && deadline.is_some_and(|d| Instant::now() >= d) {
            return Some(Stop::Deadline);
        }
        None
    }
}

/// Times several kernels on the same problem, interleaved: each warms up, then samples are
/// taken round by round, one sample of every kernel still sampling per round (the order
/// rotating), so a change in the machine's load while the group runs (another process, a
/// frequency change) shifts every kernel's series alike instead of favouring whichever
/// kernel ran in the quiet moment. Each sample follows one untimed call of its kernel, so
/// it measures the kernel's steady state rather than the switch from the kernel before it
/// (measured on the 2-core VM: oneDNN's OpenMP workers, spinning after its call, slowed the
/// next rayon kernel by up to 2x, which made the winner depend on the order). The group
/// stops as one ([`group_stops`]): every kernel's series covers the same rounds. The results
/// are in the order of `group`.
pub fn measure_interleaved(
    group: &[Candidate<'_>],
    p: &Protocol,
    deadline: Option<Instant>,
) -> Vec<Result<Measurement, Failure>> {
    let mut series: Vec<Series> = group
        .iter()
        .map(|c| {
            let mut spare = Outputs::new();
            let (warmup_runs, batch, spent, failure) = match warm_up(c, p, &mut spare) {
                Ok((runs, batch, spent)) => (runs, batch, spent, None),
                Err(f) => (0, 1, Duration::ZERO, Some(f)),
            };
            Series {
                warmup_runs,
                batch,
                samples: Vec::with_capacity(p.max_samples as usize),
                spent,
                spare,
                stop: None,
                failure,
            }
        })
        .collect();
    let mut round = 0usize;
    loop {
        if group_stops(&mut series, p, deadline) {
            break;
        }
        for j in 0..group.len() {
            let i = (j + round) % group.len();
            let s = &mut series[i];
            if s.failure.is_some() {
                continue;
            }
            let c = &group[i];
            // Another kernel ran just before: one untimed call first, so the sample sees this
            // kernel in its own steady state, not the switch (another backend's thread pool
            // still spinning or asleep, caches holding the other kernel's data).
            if group.len() > 1 {
                let t = Instant::now();
                let lead = call(c.exec, c.args, std::mem::take(&mut s.spare));
                s.spent += t.elapsed();
                match lead {
                    Ok(o) => s.spare = o,
                    Err(f) => {
                        s.failure = Some(f);
                        continue;
                    }
                }
            }
            let t = Instant::now();
            let mut failed = None;
            for _ in 0..s.batch {
                match call(c.exec, c.args, std::mem::take(&mut s.spare)) {
                    Ok(o) => s.spare = o,
                    Err(f) => {
                        failed = Some(f);
                        break;
                    }
                }
            }
            let dt = t.elapsed();
            s.spent += dt;
            match failed {
                Some(f) => s.failure = Some(f),
                None => s.samples.push(dt.as_nanos() as f64 / f64::from(s.batch)),
            }
        }
        round += 1;
    }
    series
        .into_iter()
        .map(|s| {
            if let Some(f) = s.failure {
                return Err(f);
            }
            let summary = stats::summarize(&s.samples)
                .ok_or_else(|| Failure { message: "no usable timing sample".to_owned() })?;
            Ok(Measurement {
                summary,
                batch: s.batch,
                warmup_runs: s.warmup_runs,
                elapsed: s.spent,
                stop: s.stop.unwrap_or(Stop::MaxSamples),
            })
        })
        .collect()
}

/// Whether the group stops sampling now, each kernel's reason recorded when it does. The
/// group samples as one: every kernel in every round until all of them are steady, or one of
/// them reaches a cap (its samples, its time, the deadline) once every kernel has the
/// capped minimum of samples (or one reached its hard limit). A kernel that stopped alone
/// while the others went on would have its series from another stretch of time than
/// theirs: on the 2-vCPU VM, oneDNN's linear steadied after 11 rounds and the `cpu` kernel
/// sampled 28 more alone, and the verified times flipped the rows' order (16% regret).
fn group_stops(series: &mut [Series], p: &Protocol, deadline: Option<Instant>) -> bool {
    let live = |s: &Series| s.failure.is_none();
    let wants: Vec<Option<Stop>> =
        series.iter().map(|s| if live(s) { s.stop_now(p, deadline) } else { None }).collect();
    let n_live = series.iter().filter(|s| live(s)).count();
    let capped = wants.iter().flatten().find(|w| **w != Stop::Steady).copied();
    let all_want = wants.iter().flatten().count() == n_live;
    let kept = |s: &Series| stats::summarize(&s.samples).map_or(0, |k| k.samples);
    let hard = |s: &Series| s.samples.len() as u32 >= p.max_samples.max(1) || s.spent >= p.hard_cap;
    let enough = series.iter().filter(|s| live(s)).all(|s| kept(s) >= p.min_samples_capped);
    let stop = n_live == 0
        || all_want
        || (capped.is_some() && (enough || series.iter().any(|s| live(s) && !s.samples.is_empty() && hard(s))));
    if !stop {
        return false;
    }
    for (s, w) in series.iter_mut().zip(wants) {
        if live(s) {
            s.stop = w.or(capped);
        }
    }
    true
}

/// Warm-up: at least `warmup_runs` runs and `warmup_time` (or the time cap); returns the
/// runs, the calls per sample (from the fastest warm-up call) and the time spent.
fn warm_up(c: &Candidate<'_>, p: &Protocol, spare: &mut Outputs) -> Result<(u32, u32, Duration), Failure> {
    let start = Instant::now();
    let mut runs = 0u32;
    let mut fastest = Duration::MAX;
    loop {
        let t = Instant::now();
        *spare = call(c.exec, c.args, std::mem::take(spare))?;
        fastest = fastest.min(t.elapsed());
        runs += 1;
        let elapsed = start.elapsed();
        if (runs >= p.warmup_runs.max(1) && elapsed >= p.warmup_time) || elapsed >= p.time_cap {
            break;
        }
    }
    let per_call = fastest.as_secs_f64().max(1e-9);
    let batch = (p.min_sample_time.as_secs_f64() / per_call).ceil().clamp(1.0, f64::from(p.max_batch.max(1))) as u32;
    Ok((runs, batch, start.elapsed()))
}

/// The 95% confidence half-width of the median relative to it, from the MAD: the median's
/// standard error is about `1.253 * sigma / sqrt(n)` for normal data, `sigma = 1.4826 MAD`.
pub fn rel_ci95(s: &Summary) -> f64 {
    if s.median <= 0.0 || s.samples == 0 {
        return f64::INFINITY;
    }
    1.96 * 1.2533 * stats::MAD_SCALE * s.mad / (s.median * f64::from(s.samples).sqrt())
}

fn steady(s: &Summary, p: &Protocol) -> bool {
    s.median > 0.0 && (s.mad / s.median <= p.target_rel_mad || rel_ci95(s) <= p.target_rel_ci)
}

/// One call given the previous call's outputs as its buffers (as a serving loop hands them
/// back: a kernel that writes into them allocates nothing, so a new buffer's page faults
/// and the allocator's thresholds stay out of the timing), with errors and panics turned
/// into a [`Failure`].
fn call(exec: &dyn Executor, args: &OpArgs, buffers: Outputs) -> Result<Outputs, Failure> {
    match catch_unwind(AssertUnwindSafe(|| exec.run_into(args, buffers))) {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(Failure { message: kernel_error(&e) }),
        Err(payload) => Err(Failure { message: format!("panicked: {}", panic_text(payload.as_ref())) }),
    }
}

fn kernel_error(e: &KernelError) -> String {
    e.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::exec::args::SiluArgs;
    use crate::model::attrs::NoAttrs;
    use crate::tensor::HostTensor;

    fn args() -> TestResult<OpArgs> {
        Ok(OpArgs::Silu(SiluArgs { x: HostTensor::from_f32(&[4], vec![1.0; 4])?, attrs: NoAttrs {} }))
    }

    #[test]
    fn a_steady_kernel_gets_a_summary_within_the_sample_bounds() -> TestResult {
        let exec = |_: &OpArgs| -> Result<Outputs, KernelError> {
            std::thread::sleep(Duration::from_micros(200));
            Ok(Outputs::new())
        };
        let p = Protocol::quick();
        let m = measure(&exec, &args()?, &p, None).map_err(|e| e.message)?;
        assert!(m.summary.samples >= 1 && m.summary.samples + m.summary.rejected <= p.max_samples);
        assert!(m.summary.median >= 150_000.0, "{:?}", m.summary);
        assert!(m.warmup_runs >= 1);
        Ok(())
    }

    #[test]
    fn errors_and_panics_are_failures_not_crashes() -> TestResult {
        let failing = |_: &OpArgs| -> Result<Outputs, KernelError> { Err(KernelError::Failed("boom".into())) };
        let e = measure(&failing, &args()?, &Protocol::quick(), None).err().ok_or("a failing kernel must fail")?;
        assert!(e.message.contains("boom"), "{e:?}");
        let panicking = |_: &OpArgs| -> Result<Outputs, KernelError> { panic!("kaboom") };
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let e = measure(&panicking, &args()?, &Protocol::quick(), None);
        std::panic::set_hook(prev);
        assert!(e.err().ok_or("a panicking kernel must fail")?.message.contains("kaboom"));
        Ok(())
    }

    #[test]
    fn a_slow_kernel_stops_at_the_cap_with_the_minimum_samples() -> TestResult {
        let exec = |_: &OpArgs| -> Result<Outputs, KernelError> {
            std::thread::sleep(Duration::from_millis(30));
            Ok(Outputs::new())
        };
        let p = Protocol { time_cap: Duration::from_millis(50), min_samples_capped: 3, ..Protocol::quick() };
        let m = measure(&exec, &args()?, &p, None).map_err(|e| e.message)?;
        assert_eq!(m.stop, Stop::TimeCap);
        assert!(m.summary.samples >= 3 && m.summary.samples + m.summary.rejected <= 5, "{:?}", m.summary);
        assert_eq!(m.batch, 1);
        Ok(())
    }

    #[test]
    fn the_confidence_interval_shrinks_with_samples() -> TestResult {
        let s = |n| Summary { samples: n, rejected: 0, median: 100.0, p10: 90.0, p90: 110.0, mad: 5.0, cv: 0.07 };
        assert!(rel_ci95(&s(40)) < rel_ci95(&s(10)));
        Ok(())
    }
}
