//! Health: a circuit breaker per kernel and per backend (closed -> open -> half-open with a
//! limited number of trial calls), the failure classes that decide which one a failure
//! opens, and the count of abandoned (timed-out) calls still running.
//!
//! Scope by class (E2E spec §11.4, §13): a kernel that errors, panics, returns invalid
//! outputs or runs out of memory counts towards its own breaker; a timeout quarantines the
//! kernel at once; a lost device (or an illegal memory access) disables the whole backend
//! at once, until a trial call after the cooldown succeeds: that call is the probe.
//!
//! Breakers are atomics in arrays indexed by the catalog's dense kernel index (and the
//! backend's position in the catalog), so a dispatch of a healthy kernel reads two words
//! and writes none. Thresholds come from the policy (`health`, `kernel_timeout_ms`,
//! `validate_outputs`; their `LAYERZERO_*` knobs override them) and can change while
//! serving.

mod breaker;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

pub use self::breaker::State;
use self::breaker::{Admit, Breaker, Limits};
use crate::capabilities::catalog::{Catalog, KernelIndex};
use crate::policy::Policy;
use crate::reason::{Reason, ReasonCode};

/// How a kernel call failed; the class decides what the failure disables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// It returned an error or panicked.
    Kernel,
    /// It returned NaN/Inf where its inputs had none (`validate_outputs`).
    OutputInvalid,
    /// Its output diverged from the reference's in a shadow check: quarantined at once (a
    /// kernel that computes garbage is not given more calls to prove it).
    OutputDiverged,
    /// It did not return within the deadline; it was abandoned.
    Timeout,
    /// It ran out of memory: the next kernel with a smaller workspace is preferred.
    OutOfMemory,
    /// Its device was lost (or it made an illegal memory access): the whole backend is
    /// disabled until a probe succeeds.
    DeviceLost,
    /// The worker process running it (an isolated plugin's) crashed or hung and was killed.
    WorkerLost,
}

impl FailureClass {
    /// The reason code a failure of this class is reported with.
    pub fn code(self) -> ReasonCode {
        match self {
            FailureClass::Kernel => ReasonCode::KERNEL_FAILED,
            FailureClass::OutputInvalid => ReasonCode::KERNEL_OUTPUT_INVALID,
            FailureClass::OutputDiverged => ReasonCode::KERNEL_OUTPUT_DIVERGED,
            FailureClass::Timeout => ReasonCode::KERNEL_TIMEOUT,
            FailureClass::OutOfMemory => ReasonCode::KERNEL_OUT_OF_MEMORY,
            FailureClass::DeviceLost => ReasonCode::DEVICE_LOST,
            FailureClass::WorkerLost => ReasonCode::KERNEL_WORKER_LOST,
        }
    }
}

/// The health settings in force (from the policy and its knobs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HealthConfig {
    /// Consecutive failures that open a kernel's breaker.
    pub failure_threshold: u32,
    /// How long an open breaker refuses calls.
    #[serde(rename = "cooldown_ms", serialize_with = "millis")]
    pub cooldown: Duration,
    /// Trial calls let through once the cooldown passed.
    pub half_open_trials: u32,
    /// Per-kernel deadline (absent: kernels run on the caller's thread, without one).
    #[serde(rename = "kernel_timeout_ms", serialize_with = "opt_millis")]
    pub kernel_timeout: Option<Duration>,
    /// Abandoned calls of one backend still running beyond which the backend is disabled.
    pub max_abandoned: u32,
    /// Outputs are checked for NaN/Inf the inputs did not have.
    pub validate_outputs: bool,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn opt_millis<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => millis(d, s),
        None => s.serialize_none(),
    }
}

impl HealthConfig {
    /// The settings a policy asks for.
    pub fn of(policy: &Policy) -> HealthConfig {
        let h = &policy.health;
        HealthConfig {
            failure_threshold: h.failure_threshold.max(1),
            cooldown: Duration::from_millis(h.cooldown_ms),
            half_open_trials: h.half_open_trials.max(1),
            kernel_timeout: policy.kernel_timeout_ms.map(Duration::from_millis),
            max_abandoned: h.max_abandoned,
            validate_outputs: policy.validate_outputs,
        }
    }
}

impl Default for HealthConfig {
    fn default() -> HealthConfig {
        HealthConfig::of(&Policy::default())
    }
}

/// Why a call may not run now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refusal {
    /// The kernel is quarantined.
    Kernel(Duration),
    /// Its backend is disabled.
    Backend(Duration),
}

/// One breaker in a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BreakerReport {
    /// Kernel id or backend name.
    pub name: String,
    /// `closed`, `open` or `half_open`.
    pub state: &'static str,
    /// Milliseconds left in the cooldown (open only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left_ms: Option<u64>,
    /// Consecutive failures (closed only).
    pub consecutive_failures: u32,
    /// Times it opened.
    pub opens: u64,
    /// The last failure's message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
}

/// The health of a handle: settings, every breaker that is not closed and clean, and the
/// abandoned calls.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HealthReport {
    /// The settings in force.
    pub config: HealthConfig,
    /// Kernels whose breaker is open, half-open, or counting failures, or has ever opened.
    pub kernels: Vec<BreakerReport>,
    /// Backends likewise.
    pub backends: Vec<BreakerReport>,
    /// Calls abandoned at their deadline that are still running.
    pub abandoned_running: u64,
    /// Calls abandoned at their deadline since the handle was built.
    pub abandoned_total: u64,
}

/// The breakers of every kernel and backend of one catalog.
#[derive(Debug)]
pub struct Health {
    epoch: Instant,
    threshold: AtomicU32,
    cooldown_ns: AtomicU64,
    trials: AtomicU32,
    /// Deadline in nanoseconds; 0 = none.
    timeout_ns: AtomicU64,
    max_abandoned: AtomicU32,
    validate: AtomicBool,
    kernels: Box<[Breaker]>,
    backends: Box<[Breaker]>,
    backend_of: Box<[u32]>,
    kernel_names: Box<[String]>,
    backend_names: Box<[String]>,
    /// Abandoned calls still running, per backend.
    abandoned: Box<[AtomicU32]>,
    abandoned_total: AtomicU64,
}

impl Health {
    /// Closed breakers for every kernel and backend of `catalog`, under `config`.
    pub fn new(catalog: &Catalog, config: HealthConfig) -> Health {
        let backend_names: Box<[String]> = catalog.backends().iter().map(|b| b.backend.clone()).collect();
        let backend_of = catalog
            .kernels()
            .map(|(_, b, _)| {
                let i = backend_names.iter().position(|n| *n == b.backend).unwrap_or(0);
                u32::try_from(i).unwrap_or(0)
            })
            .collect();
        let h = Health {
            epoch: Instant::now(),
            threshold: AtomicU32::new(0),
            cooldown_ns: AtomicU64::new(0),
            trials: AtomicU32::new(0),
            timeout_ns: AtomicU64::new(0),
            max_abandoned: AtomicU32::new(0),
            validate: AtomicBool::new(false),
            kernels: catalog.kernels().map(|_| Breaker::default()).collect(),
            backends: backend_names.iter().map(|_| Breaker::default()).collect(),
            backend_of,
            kernel_names: catalog.kernels().map(|(_, _, k)| k.id.clone()).collect(),
            abandoned: backend_names.iter().map(|_| AtomicU32::new(0)).collect(),
            backend_names,
            abandoned_total: AtomicU64::new(0),
        };
        h.configure(config);
        h
    }

    /// Changes the settings; breakers keep their state.
    pub fn configure(&self, c: HealthConfig) {
        self.threshold.store(c.failure_threshold.max(1), Ordering::Relaxed);
        self.cooldown_ns.store(nanos(c.cooldown), Ordering::Relaxed);
        self.trials.store(c.half_open_trials.max(1), Ordering::Relaxed);
        self.timeout_ns.store(c.kernel_timeout.map_or(0, |d| nanos(d).max(1)), Ordering::Relaxed);
        self.max_abandoned.store(c.max_abandoned, Ordering::Relaxed);
        self.validate.store(c.validate_outputs, Ordering::Relaxed);
    }

    /// The settings in force.
    pub fn config(&self) -> HealthConfig {
        let l = self.limits();
        HealthConfig {
            failure_threshold: l.threshold,
            cooldown: l.cooldown,
            half_open_trials: l.trials,
            kernel_timeout: self.deadline(),
            max_abandoned: self.max_abandoned.load(Ordering::Relaxed),
            validate_outputs: self.validate_outputs(),
        }
    }

    /// The per-kernel deadline, if any.
    #[inline]
    pub fn deadline(&self) -> Option<Duration> {
        match self.timeout_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// Whether outputs are checked for NaN/Inf.
    #[inline]
    pub fn validate_outputs(&self) -> bool {
        self.validate.load(Ordering::Relaxed)
    }

    fn limits(&self) -> Limits {
        Limits {
            threshold: self.threshold.load(Ordering::Relaxed),
            cooldown: Duration::from_nanos(self.cooldown_ns.load(Ordering::Relaxed)),
            trials: self.trials.load(Ordering::Relaxed),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
    }

    fn backend(&self, kernel: KernelIndex) -> Option<usize> {
        self.backend_of.get(kernel).and_then(|&b| usize::try_from(b).ok())
    }

    /// May `kernel` run now? A refusal says which breaker refused and for how long. A call
    /// admitted as a trial must be followed by [`Health::record`].
    #[inline]
    pub(crate) fn admit(&self, kernel: KernelIndex) -> Result<(), Refusal> {
        let (Some(k), Some(b)) = (self.kernels.get(kernel), self.backend(kernel).and_then(|b| self.backends.get(b)))
        else {
            return Ok(());
        };
        // A healthy call reads two words: the clock and the limits only matter once open.
        if b.is_closed() && k.is_closed() {
            return Ok(());
        }
        let (now, limits) = (self.now(), self.limits());
        let backend = b.admit(now, limits);
        if let Admit::Refuse(left) = backend {
            return Err(Refusal::Backend(left));
        }
        match k.admit(now, limits) {
            Admit::Refuse(left) => {
                if backend == Admit::Trial {
                    b.untrial();
                }
                Err(Refusal::Kernel(left))
            }
            Admit::Pass | Admit::Trial => Ok(()),
        }
    }

    /// Whether `kernel` would be refused now, without taking a trial slot (for reports).
    pub(crate) fn refused_now(&self, kernel: KernelIndex) -> Option<Refusal> {
        let (now, limits) = (self.now(), self.limits());
        let backend = self.backend(kernel).and_then(|b| self.backends.get(b))?;
        if let State::Open { left } = backend.state(now, limits) {
            return Some(Refusal::Backend(left));
        }
        match self.kernels.get(kernel)?.state(now, limits) {
            State::Open { left } => Some(Refusal::Kernel(left)),
            _ => None,
        }
    }

    /// The reason a refusal is reported with: `KERNEL_QUARANTINED` or `BACKEND_UNHEALTHY`,
    /// with the time left and the last failure.
    pub(crate) fn refusal_reason(&self, kernel: KernelIndex, refusal: &Refusal) -> Reason {
        let name = self.kernel_names.get(kernel).map_or("?", String::as_str);
        let wait = |left: &Duration| {
            if left.is_zero() {
                "until its trial call returns".to_owned()
            } else {
                format!("for {:.1} s more", left.as_secs_f64())
            }
        };
        match refusal {
            Refusal::Kernel(left) => {
                let last = self.kernels.get(kernel).and_then(Breaker::last_failure).unwrap_or_default();
                Reason::new(
                    ReasonCode::KERNEL_QUARANTINED,
                    format!("{name} is quarantined {} (last failure: {last})", wait(left)),
                )
            }
            Refusal::Backend(left) => {
                let b = self.backend(kernel).unwrap_or(0);
                let last = self.backends.get(b).and_then(Breaker::last_failure).unwrap_or_default();
                let bname = self.backend_names.get(b).map_or("?", String::as_str);
                Reason::new(
                    ReasonCode::BACKEND_UNHEALTHY,
                    format!("backend {bname} is disabled {} (last failure: {last}); {name} did not run", wait(left)),
                )
            }
        }
    }

    /// Records the outcome of one call of `kernel`: `None` for success, else the class and
    /// message of its failure. True when the failure opened a breaker.
    #[inline]
    pub(crate) fn record(&self, kernel: KernelIndex, failure: Option<(FailureClass, &str)>) -> bool {
        let (Some(k), Some(b)) = (self.kernels.get(kernel), self.backend(kernel).and_then(|b| self.backends.get(b)))
        else {
            return false;
        };
        let Some((class, why)) = failure else {
            k.succeeded();
            b.succeeded();
            return false;
        };
        let (now, limits) = (self.now(), self.limits());
        match class {
            FailureClass::DeviceLost => b.failed(now, limits, true, why),
            FailureClass::Timeout | FailureClass::OutputDiverged => k.failed(now, limits, true, why),
            FailureClass::Kernel
            | FailureClass::OutputInvalid
            | FailureClass::OutOfMemory
            | FailureClass::WorkerLost => k.failed(now, limits, false, why),
        }
    }

    /// A call of `kernel` was abandoned at its deadline. When its backend has more abandoned
    /// calls still running than the bound, the backend is disabled rather than leaking more
    /// threads. Call [`Health::returned`] when the abandoned call ends.
    pub(crate) fn abandoned(&self, kernel: KernelIndex) {
        self.abandoned_total.fetch_add(1, Ordering::Relaxed);
        let Some(b) = self.backend(kernel) else { return };
        let running = self.abandoned.get(b).map_or(0, |a| a.fetch_add(1, Ordering::AcqRel) + 1);
        let bound = self.max_abandoned.load(Ordering::Relaxed);
        if running > bound {
            let why = format!("{running} abandoned calls are still running (the bound is {bound})");
            if let Some(breaker) = self.backends.get(b) {
                breaker.failed(self.now(), self.limits(), true, &why);
            }
        }
    }

    /// An abandoned call of `kernel` ended (its result was discarded).
    pub(crate) fn returned(&self, kernel: KernelIndex) {
        if let Some(a) = self.backend(kernel).and_then(|b| self.abandoned.get(b)) {
            let _ = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
    }

    /// Kernels whose breaker refuses calls now (open, not yet half-open).
    pub fn quarantined(&self) -> impl Iterator<Item = (KernelIndex, Duration)> + '_ {
        let (now, limits) = (self.now(), self.limits());
        self.kernels.iter().enumerate().filter_map(move |(i, k)| match k.state(now, limits) {
            State::Open { left } => Some((i, left)),
            _ => None,
        })
    }

    /// Backends disabled now (open, not yet half-open), by name.
    pub fn disabled_backends(&self) -> impl Iterator<Item = (&str, Duration)> + '_ {
        let (now, limits) = (self.now(), self.limits());
        self.backends.iter().zip(self.backend_names.iter()).filter_map(move |(b, n)| match b.state(now, limits) {
            State::Open { left } => Some((n.as_str(), left)),
            _ => None,
        })
    }

    /// Settings, every breaker with something to say, and abandoned calls.
    pub fn report(&self) -> HealthReport {
        let (now, limits) = (self.now(), self.limits());
        let list = |breakers: &[Breaker], names: &[String]| -> Vec<BreakerReport> {
            breakers
                .iter()
                .zip(names)
                .filter_map(|(b, name)| {
                    let state = b.state(now, limits);
                    let clean = state == State::Closed { failures: 0 } && b.opens() == 0;
                    (!clean).then(|| BreakerReport {
                        name: name.clone(),
                        state: state.as_str(),
                        left_ms: match state {
                            State::Open { left } => Some(u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
                            _ => None,
                        },
                        consecutive_failures: match state {
                            State::Closed { failures } => failures,
                            _ => 0,
                        },
                        opens: b.opens(),
                        last_failure: b.last_failure(),
                    })
                })
                .collect()
        };
        HealthReport {
            config: self.config(),
            kernels: list(&self.kernels, &self.kernel_names),
            backends: list(&self.backends, &self.backend_names),
            abandoned_running: self.abandoned.iter().map(|a| u64::from(a.load(Ordering::Relaxed))).sum(),
            abandoned_total: self.abandoned_total.load(Ordering::Relaxed),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    fn health(config: HealthConfig) -> TestResult<(Health, KernelIndex, KernelIndex)> {
        let catalog = Catalog::builtin()?;
        let find = |id: &str| catalog.find(id).ok_or_else(|| format!("{id} is not in the catalog"));
        let (a, b) = (find("cpu.attention.flash")?, find("cpu.linear.fast")?);
        Ok((Health::new(&catalog, config), a, b))
    }

    #[test]
    fn a_kernel_error_opens_only_that_kernel_after_the_threshold() -> TestResult {
        let (h, attn, linear) = health(HealthConfig { failure_threshold: 2, ..HealthConfig::default() })?;
        assert!(!h.record(attn, Some((FailureClass::Kernel, "boom"))));
        assert!(h.admit(attn).is_ok(), "one failure is below the threshold of 2");
        assert!(h.record(attn, Some((FailureClass::Kernel, "boom"))));
        let refusal = h.admit(attn).err().ok_or("the kernel should be quarantined")?;
        let reason = h.refusal_reason(attn, &refusal);
        assert_eq!(reason.code(), ReasonCode::KERNEL_QUARANTINED);
        assert!(reason.message().contains("s more") && reason.message().contains("boom"), "{reason}");
        assert!(h.admit(linear).is_ok(), "a sibling kernel of the same backend still runs");
        assert_eq!(h.quarantined().map(|(k, _)| k).collect::<Vec<_>>(), vec![attn]);
        Ok(())
    }

    #[test]
    fn a_lost_device_disables_every_kernel_of_the_backend_at_once() -> TestResult {
        let (h, attn, linear) = health(HealthConfig::default())?;
        assert!(h.record(attn, Some((FailureClass::DeviceLost, "device lost"))));
        let refusal = h.admit(linear).err().ok_or("the backend should be disabled")?;
        assert_eq!(h.refusal_reason(linear, &refusal).code(), ReasonCode::BACKEND_UNHEALTHY);
        assert_eq!(h.disabled_backends().map(|(b, _)| b.to_owned()).collect::<Vec<_>>(), vec!["cpu".to_owned()]);
        Ok(())
    }

    #[test]
    fn after_the_cooldown_one_trial_probes_and_its_success_closes_the_backend() -> TestResult {
        let (h, attn, linear) =
            health(HealthConfig { cooldown: Duration::from_millis(20), ..HealthConfig::default() })?;
        h.record(attn, Some((FailureClass::DeviceLost, "device lost")));
        std::thread::sleep(Duration::from_millis(30));
        assert!(h.admit(linear).is_ok(), "the first call after the cooldown is the probe");
        assert!(h.admit(attn).is_err(), "a second call waits for the probe");
        h.record(linear, None);
        assert!(h.admit(attn).is_ok(), "a successful probe re-enables the backend");
        assert!(h.report().backends.iter().all(|b| b.state == "closed"));
        Ok(())
    }

    #[test]
    fn a_timeout_quarantines_at_once_and_too_many_abandoned_calls_disable_the_backend() -> TestResult {
        let (h, attn, linear) = health(HealthConfig { max_abandoned: 1, ..HealthConfig::default() })?;
        assert!(h.record(attn, Some((FailureClass::Timeout, "no answer in 5 ms"))));
        assert!(h.admit(attn).is_err());
        h.abandoned(attn);
        assert!(h.admit(linear).is_ok(), "one abandoned call is within the bound");
        h.abandoned(attn);
        assert!(h.admit(linear).is_err(), "a second one exceeds it: the backend stops taking calls");
        h.returned(attn);
        h.returned(attn);
        h.returned(attn);
        let r = h.report();
        assert_eq!((r.abandoned_running, r.abandoned_total), (0, 2));
        Ok(())
    }
}
