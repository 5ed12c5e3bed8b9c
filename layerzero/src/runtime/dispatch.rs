//! Dispatch: run the selected kernel (planned transforms applied), and when it fails, the
//! next eligible kernel in score order, saying so. A kernel that errors, panics, hangs past
//! its deadline or returns invalid outputs never takes the process down; the health system
//! (`crate::health`) counts the failure in the scope its class decides.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::Serialize;

use super::counters::Counter;
use super::deadline::Ended;
use super::faults::{HANG_DEADLINE, Injected, poison};
use super::hot::Hit;
use super::{LayerZero, SelectionSource};
use crate::error::{Error, ErrorKind, Result};
use crate::exec::args::{OpArgs, Outputs};
use crate::exec::executor::{Executor, KernelError, panic_text};
use crate::health::FailureClass;
use crate::reason::{Reason, ReasonCode};
use crate::select::Selection;
use crate::telemetry;
use crate::transform::{Transform, apply_transforms, cast_outputs_back};

/// What happened to one kernel during a dispatch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    /// Kernel id.
    pub kernel: String,
    /// True when it produced the outputs.
    pub ok: bool,
    /// Why it did not (absent when ok).
    pub reason: Option<Reason>,
}

/// A float input containing NaN or Inf: computed anyway, flagged.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InputFlag {
    /// Tensor name.
    pub tensor: String,
    /// NaN count.
    pub nan: usize,
    /// Inf count.
    pub inf: usize,
}

/// The result of a dispatch.
#[derive(Debug)]
pub struct Dispatch<'a> {
    /// Named outputs.
    pub outputs: Outputs,
    /// The selection that produced them, with the first choice's source and plan notes.
    ran: Hit<'a>,
    /// What only a fallback or an input check produces (kept out of line: the common
    /// dispatch has neither).
    extra: Option<Box<Extra>>,
    /// Where the call's time went, when the handle times dispatches.
    timing: Option<Timing>,
}

/// Where one dispatch's time went ([`LayerZero::set_dispatch_timing`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    /// Selecting the first choice (a plan or cache hit, or a live selection), ns.
    pub select_ns: u64,
    /// Running the kernels tried, with the runtime's guards around each (health, faults,
    /// the output check) and any fallback's selection, ns.
    pub run_ns: u64,
}

#[derive(Debug, Default)]
struct Extra {
    failed: Vec<Attempt>,
    input_flags: Vec<InputFlag>,
    checks: Vec<super::Checked>,
}

impl Dispatch<'_> {
    /// The selection whose kernel produced the outputs.
    pub fn selection(&self) -> &Selection {
        &self.ran
    }

    /// Where the call's time went; `None` unless the handle times dispatches.
    pub fn timing(&self) -> Option<Timing> {
        self.timing
    }

    /// The same, shared.
    pub fn selection_arc(&self) -> Arc<Selection> {
        self.ran.selection()
    }

    /// Where the first choice came from.
    pub fn source(&self) -> SelectionSource {
        self.ran.source()
    }

    /// Plan notes of the first choice (`PLAN_BUCKET_MISS`, a refused table).
    pub fn notes(&self) -> &[Reason] {
        self.ran.notes()
    }

    /// Kernels that were tried and did not run, in order.
    pub fn failed(&self) -> &[Attempt] {
        self.extra.as_ref().map_or(&[], |e| &e.failed)
    }

    /// Float inputs with NaN/Inf (only when the handle checks inputs: `with_input_check`).
    pub fn input_flags(&self) -> &[InputFlag] {
        self.extra.as_ref().map_or(&[], |e| &e.input_flags)
    }

    /// The shadow checks made during this dispatch (`shadow_check` in the policy): of the
    /// kernel that ran, and of one that diverged before it.
    pub fn shadow_checks(&self) -> &[super::Checked] {
        self.extra.as_ref().map_or(&[], |e| &e.checks)
    }

    /// True when the first choice did not run.
    pub fn fell_back(&self) -> bool {
        !self.failed().is_empty()
    }

    /// Every kernel tried, in order; the last one produced the outputs.
    pub fn attempts(&self) -> Vec<Attempt> {
        let mut all = self.failed().to_vec();
        all.push(Attempt { kernel: self.ran.kernel.clone(), ok: true, reason: None });
        all
    }
}

impl LayerZero {
    /// Selects for `args`, runs the best eligible kernel, and falls back to the next one
    /// (in score order) when a kernel has no executor, is quarantined, its backend is
    /// disabled, or it fails (after running out of memory, kernels with a smaller workspace
    /// are tried first). Errors: those of selection; `InvalidInput` when a kernel finds the
    /// inputs invalid (another kernel would too); `KernelFailed` when every eligible kernel
    /// failed, naming each attempt and its reason. A failed attempt never modifies the
    /// inputs (kernels read them through shared, immutable tensors).
    pub fn dispatch(&self, args: &OpArgs) -> Result<Dispatch<'_>> {
        self.dispatch_into(args, Outputs::new())
    }

    /// As [`dispatch`](LayerZero::dispatch), handing in buffers to write the outputs into,
    /// by output name (`out`, `residual_out`, ...): a kernel that can reuses a buffer that
    /// holds the output's dtype, has room for it and is shared with no other tensor, so a
    /// loop that hands back last step's outputs allocates nothing for them. The outputs
    /// come back in [`Dispatch::outputs`] (the buffers themselves where they were used).
    pub fn dispatch_into(&self, args: &OpArgs, buffers: Outputs) -> Result<Dispatch<'_>> {
        let span = telemetry::dispatch_span();
        let _inside = span.enter();
        let result = self.dispatch_untraced(args, buffers);
        if !span.is_disabled() {
            let outcome = result.as_ref().map(|d| telemetry::Dispatched {
                kernel: &d.selection().kernel,
                backend: &d.selection().backend,
                source: d.source().as_str(),
                failed: d.failed().iter().filter_map(|a| a.reason.as_ref().map(|r| r.code().as_str())).collect(),
            });
            telemetry::record_dispatch(&span, outcome);
        }
        match &result {
            Ok(d) if d.fell_back() => self.log_dispatch(args, Some(d.selection()), d.failed(), None),
            Err(e) if e.kind() == ErrorKind::KernelFailed => self.log_dispatch(args, None, &[], Some(e)),
            _ => {}
        }
        result
    }

    /// Records a dispatch that fell back or failed in the handle's recent decisions.
    #[cold]
    fn log_dispatch(&self, args: &OpArgs, ran: Option<&Selection>, failed: &[Attempt], error: Option<&Error>) {
        let req = self.describe(args);
        let mut record = telemetry::SelectionRecord::of("dispatch", &req, ran, &self.parts.catalog);
        for a in failed {
            record.failed_attempt(&a.kernel, a.reason.as_ref().map_or("", |r| r.code().as_str()));
        }
        if let Some(e) = error {
            for r in e.reasons() {
                record.failed_attempt("", r.code().as_str());
            }
            record.error = Some(format!("{:?}", e.kind()));
        }
        self.recent.push(record);
    }

    fn dispatch_untraced(&self, args: &OpArgs, buffers: Outputs) -> Result<Dispatch<'_>> {
        if !self.time_dispatches.load(Ordering::Relaxed) {
            return self.dispatch_selected(args, buffers);
        }
        let start = std::time::Instant::now();
        let first = self.select_args(args)?;
        let selected = start.elapsed();
        let mut d = self.run_selected(first, args, buffers)?;
        let ns = |t: std::time::Duration| u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
        d.timing = Some(Timing { select_ns: ns(selected), run_ns: ns(start.elapsed().saturating_sub(selected)) });
        Ok(d)
    }

    fn dispatch_selected(&self, args: &OpArgs, buffers: Outputs) -> Result<Dispatch<'_>> {
        let first = self.select_args(args)?;
        self.run_selected(first, args, buffers)
    }

    /// Runs the first choice `first` for `args`, falling back in score order.
    fn run_selected<'h>(&'h self, first: Hit<'h>, args: &OpArgs, buffers: Outputs) -> Result<Dispatch<'h>> {
        let input_flags = if self.check_inputs.load(Ordering::Relaxed) { flags(args) } else { Vec::new() };
        let checking = self.shadow.on();
        if checking {
            // Checks of an earlier dispatch that ended in an error are not this one's.
            super::shadow::drain();
        }
        let mut failed = Vec::new();
        let first_oom = match self.try_run(&first, first.executor(), args, buffers) {
            Ok(outputs) => {
                let checks = if checking { super::shadow::drain() } else { Vec::new() };
                let extra = (!input_flags.is_empty() || !checks.is_empty())
                    .then(|| Box::new(Extra { failed, input_flags, checks }));
                return Ok(Dispatch { outputs, ran: first, extra, timing: None });
            }
            Err(reason) => {
                let oom = reason.code() == ReasonCode::KERNEL_OUT_OF_MEMORY;
                self.note_failure(&first, reason, &mut failed)?;
                oom.then_some(first.index)
            }
        };
        self.bump(Counter::Fallbacks);
        let source = first.source();
        let notes = first.into_notes();
        let selector = self.selector();
        let request = self.describe(args);
        let mut ranked = selector.ranked(&request)?;
        if let Some(k) = first_oom {
            self.smaller_first(k, &mut ranked);
        }
        let mut tried = 0;
        while tried < ranked.len() {
            let sel = ranked[tried].clone();
            tried += 1;
            if failed.iter().any(|a| a.kernel == sel.kernel) {
                continue;
            }
            let hit = self.live_hit(sel);
            match self.try_run(&hit, hit.executor(), args, Outputs::new()) {
                Ok(outputs) => {
                    let ran = hit.standing_in_for(source, notes);
                    let checks = if checking { super::shadow::drain() } else { Vec::new() };
                    let extra = Some(Box::new(Extra { failed, input_flags, checks }));
                    return Ok(Dispatch { outputs, ran, extra, timing: None });
                }
                Err(reason) => {
                    let oom = reason.code() == ReasonCode::KERNEL_OUT_OF_MEMORY;
                    self.note_failure(&hit, reason, &mut failed)?;
                    if oom {
                        self.smaller_first(hit.index, &mut ranked[tried..]);
                    }
                }
            }
        }
        let listed: Vec<String> = failed
            .iter()
            .map(|a| match &a.reason {
                Some(r) => format!("{} ({}: {})", a.kernel, r.code(), r.message()),
                None => a.kernel.clone(),
            })
            .collect();
        let reasons: Vec<Reason> = failed.iter().filter_map(|a| a.reason.clone()).collect();
        Err(Error::new(
            ErrorKind::KernelFailed,
            format!("every eligible kernel failed ({} tried): {}", failed.len(), listed.join("; ")),
        )
        .with_reasons(reasons))
    }

    /// After `failed` ran out of memory, moves the kernels with a smaller workspace to the
    /// front of `rest` (score order kept within each group), larger ones to the back.
    fn smaller_first(&self, failed: crate::capabilities::catalog::KernelIndex, rest: &mut [Selection]) {
        let ws = |k| self.parts.catalog.kernel(k).1.properties.workspace_bytes;
        let limit = ws(failed);
        rest.sort_by_key(|s| ws(s.index).cmp(&limit));
    }

    /// Lets the kernel that `args` select prepare its constant operands before the first
    /// call (the `cpu` linear packs a bf16 weight into pair panels, once, kept while the
    /// weight lives); returns that kernel's id. Call it at load with arguments of the shape
    /// the engine will run (`layerzero_llm::Session` does, with a prefill's shape, for every
    /// projection). A kernel that fails to prepare is an error; running it later still
    /// works (it prepares on first use).
    pub fn prepare(&self, args: &OpArgs) -> Result<String> {
        let sel = self.select_args(args)?;
        let kernel = sel.selection().kernel.clone();
        if let (Some(exec), true) = (sel.executor(), sel.selection().transforms.is_empty()) {
            match catch_unwind(AssertUnwindSafe(|| exec.prepare(args))) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(Error::new(ErrorKind::KernelFailed, format!("preparing {kernel}: {e}"))),
                Err(p) => {
                    let why = crate::exec::executor::panic_text(p.as_ref());
                    return Err(Error::new(ErrorKind::KernelFailed, format!("preparing {kernel} panicked: {why}")));
                }
            }
        }
        Ok(kernel)
    }

    /// Records a failed attempt; invalid inputs end the dispatch (falling back would only
    /// repeat the failure).
    fn note_failure(&self, sel: &Selection, reason: Reason, failed: &mut Vec<Attempt>) -> Result<()> {
        if reason.code() == ReasonCode::INVALID_REQUEST {
            return Err(Error::new(ErrorKind::InvalidInput, reason.message().to_owned()).with_reasons(vec![reason]));
        }
        let r = telemetry::redact::current();
        tracing::warn!(
            target: "layerzero::dispatch",
            kernel = %telemetry::redact::Field(&sel.kernel, r.kernels()),
            code = reason.code().as_str(),
            message = %if r.kernels() { "[redacted]" } else { reason.message() },
            "kernel did not run; falling back"
        );
        failed.push(Attempt { kernel: sel.kernel.clone(), ok: false, reason: Some(reason) });
        Ok(())
    }

    /// Runs one selected kernel (transforms included), under the health system, the panic
    /// guard, the deadline and the output check.
    pub fn run_selection(&self, sel: &Selection, args: &OpArgs) -> Result<Outputs> {
        let ran = self.try_run(sel, self.executor(sel.index), args, Outputs::new());
        // A shadow check's figures go to a dispatch's caller; here no one collects them.
        if self.shadow.on() {
            super::shadow::drain();
        }
        ran.map_err(|r| {
            let kind =
                if r.code() == ReasonCode::INVALID_REQUEST { ErrorKind::InvalidInput } else { ErrorKind::KernelFailed };
            Error::new(kind, r.to_string()).with_reasons(vec![r])
        })
    }

    fn try_run(
        &self,
        sel: &Selection,
        exec: Option<&Arc<dyn Executor>>,
        args: &OpArgs,
        buffers: Outputs,
    ) -> std::result::Result<Outputs, Reason> {
        let Some(exec) = exec else {
            return Err(Reason::new(
                ReasonCode::EXECUTOR_NOT_REGISTERED,
                format!("no executor is registered for {} in this process", sel.kernel),
            ));
        };
        if !exec.takes_device_memory()
            && let Some((name, device)) = args.on_device()
        {
            return Err(Reason::new(
                ReasonCode::DEVICE_KIND_MISMATCH,
                format!("tensor `{name}` is on {device}; {}'s executor reads host memory only", sel.kernel),
            ));
        }
        if let Err(refusal) = self.health.admit(sel.index) {
            self.bump(Counter::RefusedByHealth);
            return Err(self.health.refusal_reason(sel.index, &refusal));
        }
        // Drills: a fault injected for this kernel fails it, panics it, hangs it or poisons
        // its outputs here, so the fallback and the breakers see what a real failure does.
        let injected = self.faults.as_ref().map_or(Injected::Run, |f| f.inject(sel.index));
        let hangs = matches!(injected, Injected::Hang(_));
        let drilled = matches!(injected, Injected::Corrupt(_));
        // An executor that kills its own late calls (an isolated worker) is not abandoned. One
        // that takes device memory runs on the caller's thread: torch's current CUDA stream
        // (and a graph being captured on it) is the calling thread's, and a kernel launch
        // returns at once anyway.
        let direct = exec.kills_at_deadline() || exec.takes_device_memory();
        let deadline = self.health.deadline().filter(|_| !direct).or(hangs.then_some(HANG_DEADLINE));
        let result = match deadline {
            None => run_guarded(exec, &sel.kernel, &sel.transforms, args, buffers, injected),
            Some(deadline) => self.run_with_deadline(sel, exec, args, injected, deadline),
        };
        let result = match result {
            Ok(outputs) if self.health.validate_outputs() => check_outputs(&sel.kernel, outputs, args),
            r => r,
        };
        let result = match result {
            // A drill's corrupted output is the drill's doing: learned, not persisted.
            Ok(outputs) => match self.shadow(sel, args, &outputs, drilled) {
                super::shadow::Verdict::Agrees => Ok(outputs),
                super::shadow::Verdict::Diverged(message, _) => {
                    Err(Failed::Class(FailureClass::OutputDiverged, message))
                }
            },
            r => r,
        };
        match result {
            Ok(outputs) => {
                self.health.record(sel.index, None);
                Ok(outputs)
            }
            Err(Failed::InvalidInput(message)) => Err(Reason::new(ReasonCode::INVALID_REQUEST, message)),
            // A shape the JIT cannot compile says nothing of the kernel's health on other
            // shapes; the kernel refuses it at once from now on.
            Err(Failed::Compile(message)) => {
                self.bump(Counter::JitCompileFailures);
                Err(Reason::new(ReasonCode::JIT_COMPILE_FAILED, message))
            }
            Err(Failed::Class(class, message)) => {
                self.bump(Counter::KernelFailures);
                match class {
                    FailureClass::Timeout => self.bump(Counter::Timeouts),
                    FailureClass::OutputInvalid => self.bump(Counter::InvalidOutputs),
                    _ => {}
                }
                if self.health.record(sel.index, Some((class, &message))) {
                    self.bump(Counter::BreakerOpens);
                    let r = telemetry::redact::current();
                    tracing::warn!(
                        target: "layerzero::health",
                        kernel = %telemetry::redact::Field(&sel.kernel, r.kernels()),
                        class = ?class,
                        "breaker opened: the kernel is quarantined or its backend disabled"
                    );
                }
                Err(Reason::new(class.code(), message))
            }
        }
    }

    /// Runs the kernel on a runner thread and waits at most `deadline`; a late call is
    /// abandoned (counted until it returns) and reported as a timeout.
    fn run_with_deadline(
        &self,
        sel: &Selection,
        exec: &Arc<dyn Executor>,
        args: &OpArgs,
        injected: Injected,
        deadline: std::time::Duration,
    ) -> std::result::Result<Outputs, Failed> {
        let (exec, kernel, transforms, owned) =
            (exec.clone(), sel.kernel.clone(), sel.transforms.clone(), args.clone());
        let (health, index) = (self.health.clone(), sel.index);
        let runners = self.runners.get_or_init(super::deadline::Runners::new);
        // The caller's buffers stay with the caller: a late kernel must not write into them.
        let ended = runners.call(
            deadline,
            move || run_guarded(&exec, &kernel, &transforms, &owned, Outputs::new(), injected),
            move || health.returned(index),
        );
        match ended {
            Ok(Ended::Done(result)) => result,
            Ok(Ended::Late) => {
                self.health.abandoned(sel.index);
                Err(Failed::Class(
                    FailureClass::Timeout,
                    format!(
                        "{} did not return within its deadline of {} ms; abandoned (a late result is discarded)",
                        sel.kernel,
                        deadline.as_millis()
                    ),
                ))
            }
            Err(e) => {
                Err(Failed::Class(FailureClass::Kernel, format!("{}: could not start a runner: {e}", sel.kernel)))
            }
        }
    }
}

/// How one call failed.
enum Failed {
    /// The inputs are invalid: no other kernel would do better.
    InvalidInput(String),
    /// The kernel's JIT cannot compile these inputs' shape.
    Compile(String),
    /// A failure of this class.
    Class(FailureClass, String),
}

/// Runs a kernel where rayon has live workers: in a forked child, a pool of the child's own
/// (`layerzero_cpu::fork`), not the parent's, whose threads did not survive the fork.
#[inline]
fn live<T: Send>(kernel: &str, run: impl FnOnce() -> T + Send) -> std::result::Result<T, Failed> {
    layerzero_cpu::fork::in_live_pool(run)
        .map_err(|why| Failed::Class(FailureClass::Kernel, format!("{kernel}: {why}")))
}

/// Runs one kernel with its transforms and the injected fault, catching panics.
fn run_guarded(
    exec: &Arc<dyn Executor>,
    kernel: &str,
    transforms: &[Transform],
    args: &OpArgs,
    buffers: Outputs,
    injected: Injected,
) -> std::result::Result<Outputs, Failed> {
    let fail = |m: String| Failed::Class(FailureClass::Kernel, m);
    match &injected {
        Injected::Fail(class, why) => return Err(Failed::Class(*class, format!("{kernel}: {why}"))),
        Injected::Hang(h) => {
            h.wait();
            return Err(fail(format!("{kernel}: released from an injected hang")));
        }
        _ => {}
    }
    // A kernel that panics drops the buffers it was given; they are outputs to be
    // overwritten, never inputs, so nothing the caller reads is lost.
    let result = if let Injected::Panic(why) = &injected {
        catch_unwind(|| -> std::result::Result<Outputs, KernelError> { std::panic::panic_any(why.clone()) })
    } else if transforms.is_empty() {
        live(kernel, || catch_unwind(AssertUnwindSafe(|| exec.run_into(args, buffers))))?
    } else {
        // Adapted inputs may change the outputs' dtype: the caller's buffers would not fit.
        let adapted =
            apply_transforms(args, transforms).map_err(|e| fail(format!("transform before {kernel}: {e}")))?;
        live(kernel, || catch_unwind(AssertUnwindSafe(|| exec.run(&adapted))))?
    };
    let result = match (injected, result) {
        (Injected::PoisonOutputs, Ok(Ok(outputs))) => Ok(Ok(poison(outputs))),
        (Injected::Corrupt(mode), Ok(Ok(outputs))) => Ok(Ok(super::faults::corrupt(mode, outputs))),
        (_, r) => r,
    };
    match result {
        Ok(Ok(outputs)) if transforms.is_empty() => Ok(outputs),
        Ok(Ok(outputs)) => {
            cast_outputs_back(outputs, transforms).map_err(|e| fail(format!("{kernel}: output cast: {e}")))
        }
        Ok(Err(KernelError::InvalidInput(m))) => Err(Failed::InvalidInput(format!("{kernel}: {m}"))),
        Ok(Err(KernelError::CompileFailed(m))) => Err(Failed::Compile(format!("{kernel}: {m}"))),
        Ok(Err(e @ KernelError::OutOfMemory(_))) => {
            Err(Failed::Class(FailureClass::OutOfMemory, format!("{kernel}: {e}")))
        }
        Ok(Err(e @ KernelError::DeviceLost(_))) => {
            Err(Failed::Class(FailureClass::DeviceLost, format!("{kernel}: {e}")))
        }
        Ok(Err(e @ KernelError::WorkerLost(_))) => {
            Err(Failed::Class(FailureClass::WorkerLost, format!("{kernel}: {e}")))
        }
        Ok(Err(e)) => Err(fail(format!("{kernel}: {e}"))),
        Err(payload) => Err(fail(format!("{kernel} panicked: {}", panic_text(payload.as_ref())))),
    }
}

/// `validate_outputs`: NaN or Inf in an output where no input had any is the kernel's fault.
fn check_outputs(kernel: &str, outputs: Outputs, args: &OpArgs) -> std::result::Result<Outputs, Failed> {
    let bad: Vec<String> = outputs
        .iter()
        // Device memory is not read from the host: its outputs are the device's to check.
        .filter(|(_, t)| t.dtype().is_float() && t.device().is_none())
        .filter_map(|(name, t)| {
            let (nan, inf) = t.non_finite();
            (nan + inf > 0).then(|| format!("`{name}` has {nan} NaN and {inf} Inf values"))
        })
        .collect();
    if bad.is_empty() || !flags(args).is_empty() {
        return Ok(outputs);
    }
    Err(Failed::Class(FailureClass::OutputInvalid, format!("{kernel}: output {} from finite inputs", bad.join(", "))))
}

fn flags(args: &OpArgs) -> Vec<InputFlag> {
    args.tensors()
        .into_iter()
        .filter(|(_, t)| t.device().is_none())
        .filter_map(|(name, t)| {
            let (nan, inf) = t.non_finite();
            (nan + inf > 0).then(|| InputFlag { tensor: name.to_owned(), nan, inf })
        })
        .collect()
}
