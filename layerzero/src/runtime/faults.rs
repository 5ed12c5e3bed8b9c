//! Fault injection for drills: `LAYERZERO_FAULTS="KERNEL_OR_BACKEND=MODE[,...]"` makes the
//! named kernels (an exact kernel id, or a backend name for all its kernels) fail the way real
//! ones do, so that fallback, breakers and reports can be rehearsed on a healthy machine.
//! Modes: `error`, `panic`, `hang` (the call never returns by itself), `slow:MS`, `nan` (the
//! outputs become NaN), `oom`, `device_lost`, `fail_first:N` (the first N calls fail, then the
//! kernel works), and two silent ones that no NaN check sees (seed 004's bug class):
//! `garbage` (every float output reversed and scaled by 1.25: plausible, finite, wrong) and
//! `transpose_noop` (an output of two or more dims keeps the element order of its last two
//! dims swapped, as a transpose that did nothing would leave it). Resolved once per handle into a table by kernel index; a handle without
//! faults pays one branch per dispatch.
//!
//! A hung call needs a deadline to be abandoned: a kernel under `hang` always runs under one
//! (the policy's `kernel_timeout_ms`, else [`HANG_DEADLINE`]). Its thread sleeps until the
//! faults are dropped, so a drill leaks nothing past the handle that ran it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::capabilities::catalog::{Catalog, KernelIndex};
use crate::error::{Error, Result};
use crate::exec::args::Outputs;
use crate::health::FailureClass;
use crate::tensor::HostTensor;

/// How an injected fault behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// The kernel returns an error.
    Error,
    /// The kernel panics (caught by dispatch, as a real panic is).
    Panic,
    /// The kernel never returns by itself (abandoned at its deadline).
    Hang,
    /// The kernel sleeps this long, then runs.
    Slow(Duration),
    /// The kernel runs, then every float output is NaN.
    Nan,
    /// The kernel reports that it ran out of memory.
    Oom,
    /// The kernel reports that its device was lost.
    DeviceLost,
    /// The first N calls fail, then the kernel works.
    FailFirst(u64),
    /// The kernel runs, then every float output is reversed and scaled (finite, wrong).
    Garbage,
    /// The kernel runs, then each output's last two dims are left untransposed.
    TransposeNoop,
}

/// One parsed rule: a kernel id or a backend name, and a mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultRule {
    /// A kernel id (`cpu.linear.fast`) or a backend (`cpu`).
    pub target: String,
    /// What it does.
    pub mode: FaultMode,
}

/// Parses `LAYERZERO_FAULTS`'s value; an error names the variable and the item.
pub fn parse(spec: &str) -> Result<Vec<FaultRule>> {
    let bad = |item: &str, why: &str| Error::invalid(format!("LAYERZERO_FAULTS item {item:?}: {why}"));
    let mut rules = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (target, mode) = item.split_once('=').ok_or_else(|| bad(item, "expected KERNEL_OR_BACKEND=MODE"))?;
        let (target, mode) = (target.trim(), mode.trim());
        if target.is_empty() {
            return Err(bad(item, "the kernel or backend is empty"));
        }
        let number = |v: &str, what: &str| {
            v.trim().parse::<u64>().map_err(|_| bad(item, &format!("{what} must be a non-negative integer")))
        };
        let mode = match mode.split_once(':') {
            None => match mode {
                "error" => FaultMode::Error,
                "panic" => FaultMode::Panic,
                "nan" => FaultMode::Nan,
                "oom" => FaultMode::Oom,
                "device_lost" => FaultMode::DeviceLost,
                "hang" => FaultMode::Hang,
                "garbage" => FaultMode::Garbage,
                "transpose_noop" => FaultMode::TransposeNoop,
                other => {
                    return Err(bad(
                        item,
                        &format!(
                            "unknown mode {other:?} (error, panic, hang, slow:MS, nan, oom, device_lost, fail_first:N, \
                             garbage, transpose_noop)"
                        ),
                    ));
                }
            },
            Some(("slow", ms)) => FaultMode::Slow(Duration::from_millis(number(ms, "slow:MS")?)),
            Some(("fail_first", n)) => FaultMode::FailFirst(number(n, "fail_first:N")?),
            Some((other, _)) => return Err(bad(item, &format!("unknown mode {other:?}"))),
        };
        rules.push(FaultRule { target: target.to_owned(), mode });
    }
    Ok(rules)
}

/// Faults resolved against a catalog: per kernel index, the mode and its call counter.
#[derive(Debug)]
pub(crate) struct Faults {
    spec: String,
    by_kernel: Box<[Option<(FaultMode, AtomicU64)>]>,
    /// Set when the faults are dropped: hung calls return.
    released: Arc<AtomicBool>,
}

/// The deadline of a kernel under `hang` when the policy sets none.
pub const HANG_DEADLINE: Duration = Duration::from_secs(1);

impl Drop for Faults {
    fn drop(&mut self) {
        self.released.store(true, Ordering::Release);
    }
}

/// What dispatch does before (and after) running a kernel under a fault.
pub(crate) enum Injected {
    /// Fail this way instead of running.
    Fail(FailureClass, String),
    /// Panic instead of running.
    Panic(String),
    /// Never return (until the faults are dropped), then fail.
    Hang(Hang),
    /// Run, then make the float outputs NaN.
    PoisonOutputs,
    /// Run, then make the outputs wrong without a NaN ([`FaultMode::Garbage`],
    /// [`FaultMode::TransposeNoop`]).
    Corrupt(FaultMode),
    /// Run normally.
    Run,
}

impl Faults {
    /// `rules` for the kernels of `catalog` (a rule naming a kernel id beats its backend's);
    /// a rule that names nothing in the catalog is an error.
    pub(crate) fn resolve(spec: &str, rules: &[FaultRule], catalog: &Catalog) -> Result<Faults> {
        for r in rules {
            let known = catalog.kernels().any(|(_, b, k)| k.id == r.target || b.backend == r.target);
            if !known {
                return Err(Error::invalid(format!(
                    "LAYERZERO_FAULTS names {:?}, which is neither a kernel nor a backend of the catalog",
                    r.target
                )));
            }
        }
        let by_kernel = catalog
            .kernels()
            .map(|(_, b, k)| {
                let rule =
                    rules.iter().find(|r| r.target == k.id).or_else(|| rules.iter().find(|r| r.target == b.backend));
                rule.map(|r| (r.mode, AtomicU64::new(0)))
            })
            .collect();
        Ok(Faults { spec: spec.to_owned(), by_kernel, released: Arc::new(AtomicBool::new(false)) })
    }

    /// The spec these faults came from.
    pub(crate) fn spec(&self) -> &str {
        &self.spec
    }

    /// What to do for this call of `kernel`.
    pub(crate) fn inject(&self, kernel: KernelIndex) -> Injected {
        let Some(Some((mode, calls))) = self.by_kernel.get(kernel) else { return Injected::Run };
        let call = calls.fetch_add(1, Ordering::Relaxed);
        let note = "injected by LAYERZERO_FAULTS";
        match *mode {
            FaultMode::Error => Injected::Fail(FailureClass::Kernel, format!("failed ({note})")),
            FaultMode::Panic => Injected::Panic(format!("panic ({note})")),
            FaultMode::Hang => Injected::Hang(Hang(self.released.clone())),
            FaultMode::Slow(d) => {
                std::thread::sleep(d);
                Injected::Run
            }
            FaultMode::Nan => Injected::PoisonOutputs,
            FaultMode::Oom => Injected::Fail(FailureClass::OutOfMemory, format!("out of memory ({note})")),
            FaultMode::DeviceLost => Injected::Fail(FailureClass::DeviceLost, format!("device lost ({note})")),
            FaultMode::FailFirst(n) if call < n => {
                Injected::Fail(FailureClass::Kernel, format!("failed call {} of the first {n} ({note})", call + 1))
            }
            FaultMode::FailFirst(_) => Injected::Run,
            FaultMode::Garbage | FaultMode::TransposeNoop => Injected::Corrupt(*mode),
        }
    }
}

/// `outputs` made wrong the way `mode` says (only [`FaultMode::Garbage`] and
/// [`FaultMode::TransposeNoop`] change anything): for drills of the silent failures that
/// parity records and shadow checks exist to catch. Integer outputs are left alone.
pub fn corrupt(mode: FaultMode, mut outputs: Outputs) -> Outputs {
    if !matches!(mode, FaultMode::Garbage | FaultMode::TransposeNoop) {
        return outputs;
    }
    for t in outputs.values_mut().filter(|t| t.dtype().is_float()) {
        let mut v = t.to_f32_vec();
        match mode {
            FaultMode::Garbage => {
                v.reverse();
                v.iter_mut().for_each(|x| *x *= 1.25);
            }
            FaultMode::TransposeNoop => {
                let s = t.shape();
                let (r, c) = match s {
                    [.., r, c] if s.len() >= 2 && r * c > 0 => (*r, *c),
                    _ => continue,
                };
                // Each [r, c] matrix holds its transpose's elements in order, read as [r, c].
                let mut out = vec![0f32; v.len()];
                for (src, dst) in v.chunks_exact(r * c).zip(out.chunks_exact_mut(r * c)) {
                    for (k, d) in dst.iter_mut().enumerate() {
                        *d = src[(k % r) * c + k / r];
                    }
                }
                v = out;
            }
            _ => continue,
        }
        if let Ok(n) = HostTensor::from_f32_as(t.dtype(), t.shape(), &v) {
            *t = match t.layout() {
                Some(l) => n.with_layout(l),
                None => n,
            };
        }
    }
    outputs
}

/// The rule of `rules` for `kernel` of `backend` (a kernel id beats its backend), for tools
/// that run executors outside dispatch (`lz parity`).
pub fn rule_for<'r>(rules: &'r [FaultRule], kernel: &str, backend: &str) -> Option<&'r FaultRule> {
    rules.iter().find(|r| r.target == kernel).or_else(|| rules.iter().find(|r| r.target == backend))
}

/// A hung call: [`Hang::wait`] blocks until the faults that made it are dropped (at most
/// an hour).
pub(crate) struct Hang(Arc<AtomicBool>);

impl Hang {
    pub(crate) fn wait(&self) {
        let start = Instant::now();
        while !self.0.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(3600) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Every float output replaced by NaN of its dtype and shape.
pub(crate) fn poison(mut outputs: Outputs) -> Outputs {
    for t in outputs.values_mut().filter(|t| t.dtype().is_float()) {
        let nan = vec![f32::NAN; t.numel()];
        if let Ok(n) = HostTensor::from_f32_as(t.dtype(), t.shape(), &nan) {
            *t = match t.layout() {
                Some(l) => n.with_layout(l),
                None => n,
            };
        }
    }
    outputs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    #[test]
    fn the_silent_modes_leave_finite_values_in_the_wrong_places() -> TestResult {
        let x = HostTensor::from_f32(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])?;
        let out = |mode| -> TestResult<Vec<f32>> {
            let o = corrupt(mode, Outputs::from([("out", x.clone())]));
            Ok(o.get("out").ok_or("out")?.to_f32_vec())
        };
        assert_eq!(out(FaultMode::Garbage)?, vec![7.5, 6.25, 5.0, 3.75, 2.5, 1.25]);
        // [[1, 2, 3], [4, 5, 6]] read as if still in its transpose's order: [[1, 4, 2], [5, 3, 6]].
        assert_eq!(out(FaultMode::TransposeNoop)?, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        assert_eq!(out(FaultMode::Nan)?, x.to_f32_vec(), "only the silent modes change outputs here");
        Ok(())
    }

    #[test]
    fn every_mode_parses_and_bad_items_name_the_variable_and_the_item() -> TestResult {
        let rules = parse(
            "cpu.linear.fast=error, cpu=panic,x=slow:5,y=nan,z=oom,w=device_lost,v=fail_first:2,u=hang,t=garbage,\
             s=transpose_noop",
        )?;
        let modes: Vec<FaultMode> = rules.iter().map(|r| r.mode).collect();
        assert_eq!(
            modes,
            vec![
                FaultMode::Error,
                FaultMode::Panic,
                FaultMode::Slow(Duration::from_millis(5)),
                FaultMode::Nan,
                FaultMode::Oom,
                FaultMode::DeviceLost,
                FaultMode::FailFirst(2),
                FaultMode::Hang,
                FaultMode::Garbage,
                FaultMode::TransposeNoop
            ]
        );
        for (spec, says) in [
            ("cpu", "expected KERNEL_OR_BACKEND=MODE"),
            ("cpu=melt", "unknown mode \"melt\""),
            ("cpu=slow:soon", "slow:MS must be"),
            ("=error", "empty"),
        ] {
            let err = parse(spec).err().ok_or_else(|| format!("`{spec}` must be refused"))?.to_string();
            assert!(err.contains("LAYERZERO_FAULTS") && err.contains(says), "{spec}: {err}");
        }
        Ok(())
    }
}
