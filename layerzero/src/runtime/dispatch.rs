//! Dispatch: run the selected kernel (planned transforms applied), and when it fails, the
//! next eligible kernel in score order, saying so. A kernel that errors or panics never
//! takes the process down; its breaker counts the failure.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use serde::Serialize;

use super::counters::Counter;
use super::faults::{Injected, poison};
use super::hot::Hit;
use super::{LayerZero, SelectionSource};
use crate::error::{Error, ErrorKind, Result};
use crate::exec::args::{OpArgs, Outputs};
use crate::exec::executor::{Executor, KernelError, panic_text};
use crate::health::BREAKER_THRESHOLD;
use crate::reason::{Reason, ReasonCode};
use crate::select::Selection;
use crate::transform::{apply_transforms, cast_outputs_back};

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
}

#[derive(Debug, Default)]
struct Extra {
    failed: Vec<Attempt>,
    input_flags: Vec<InputFlag>,
}

impl Dispatch<'_> {
    /// The selection whose kernel produced the outputs.
    pub fn selection(&self) -> &Selection {
        &self.ran
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
    /// (in score order) when a kernel has no executor, its circuit is open, or it fails.
    /// Errors: those of selection; `InvalidInput` when a kernel finds the inputs invalid
    /// (another kernel would too); `KernelFailed` when every eligible kernel failed, with
    /// each attempt's reason.
    pub fn dispatch(&self, args: &OpArgs) -> Result<Dispatch<'_>> {
        self.dispatch_into(args, Outputs::new())
    }

    /// As [`dispatch`](LayerZero::dispatch), handing in buffers to write the outputs into,
    /// by output name (`out`, `residual_out`, ...): a kernel that can reuses a buffer that
    /// holds the output's dtype, has room for it and is shared with no other tensor, so a
    /// loop that hands back last step's outputs allocates nothing for them. The outputs
    /// come back in [`Dispatch::outputs`] (the buffers themselves where they were used).
    pub fn dispatch_into(&self, args: &OpArgs, buffers: Outputs) -> Result<Dispatch<'_>> {
        let first = self.select_args(args)?;
        let input_flags = if self.check_inputs { flags(args) } else { Vec::new() };
        let mut failed = Vec::new();
        match self.try_run(&first, first.executor(), args, buffers) {
            Ok(outputs) => {
                let extra = (!input_flags.is_empty()).then(|| Box::new(Extra { failed, input_flags }));
                return Ok(Dispatch { outputs, ran: first, extra });
            }
            Err(reason) => self.note_failure(&first, reason, &mut failed)?,
        }
        self.bump(Counter::Fallbacks);
        let source = first.source();
        let notes = first.into_notes();
        let selector = self.selector();
        let request = args.describe();
        for sel in selector.ranked(&request)? {
            if failed.iter().any(|a| a.kernel == sel.kernel) {
                continue;
            }
            let hit = self.live_hit(sel);
            match self.try_run(&hit, hit.executor(), args, Outputs::new()) {
                Ok(outputs) => {
                    let ran = hit.standing_in_for(source, notes);
                    return Ok(Dispatch { outputs, ran, extra: Some(Box::new(Extra { failed, input_flags })) });
                }
                Err(reason) => self.note_failure(&hit, reason, &mut failed)?,
            }
        }
        let reasons: Vec<Reason> = failed.iter().filter_map(|a| a.reason.clone()).collect();
        let tried: Vec<&str> = failed.iter().map(|a| a.kernel.as_str()).collect();
        Err(Error::new(ErrorKind::KernelFailed, format!("every eligible kernel failed: {}", tried.join(", ")))
            .with_reasons(reasons))
    }

    /// Lets the kernel that `args` select prepare its constant operands before the first
    /// call (the `cpu` linear packs a bf16 weight into pair panels, once, kept while the
    /// weight lives); returns that kernel's id. Call it at load with arguments of the shape
    /// the engine will run (`llm::Session` does, with a prefill's shape, for every
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
        failed.push(Attempt { kernel: sel.kernel.clone(), ok: false, reason: Some(reason) });
        Ok(())
    }

    /// Runs one selected kernel (transforms included), with the breaker and the panic guard.
    pub fn run_selection(&self, sel: &Selection, args: &OpArgs) -> Result<Outputs> {
        self.try_run(sel, self.executor(sel.index), args, Outputs::new()).map_err(|r| {
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
        if let Some(open) = self.health.open_for(sel.index) {
            return Err(Reason::new(
                ReasonCode::BACKEND_UNHEALTHY,
                format!(
                    "{} failed {BREAKER_THRESHOLD} times in a row; its circuit is open for {}s more",
                    sel.kernel,
                    open.as_secs()
                ),
            ));
        }
        // Drills: a fault injected for this kernel fails it, panics it or poisons its outputs
        // here, so the fallback and the breaker below see what a real failure looks like.
        let injected = self.faults.as_ref().map_or(Injected::Run, |f| f.inject(sel.index));
        if let Injected::Fail(why) = &injected {
            self.health.record(sel.index, false);
            return Err(Reason::new(ReasonCode::KERNEL_FAILED, format!("{}: {why}", sel.kernel)));
        }
        // A kernel that panics drops the buffers it was given; they are outputs to be
        // overwritten, never inputs, so nothing the caller reads is lost.
        let result = if let Injected::Panic(why) = &injected {
            catch_unwind(|| -> std::result::Result<Outputs, KernelError> { std::panic::panic_any(why.clone()) })
        } else if sel.transforms.is_empty() {
            catch_unwind(AssertUnwindSafe(|| exec.run_into(args, buffers)))
        } else {
            // Adapted inputs may change the outputs' dtype: the caller's buffers would not fit.
            let adapted = apply_transforms(args, &sel.transforms)
                .map_err(|e| Reason::new(ReasonCode::KERNEL_FAILED, format!("transform before {}: {e}", sel.kernel)))?;
            catch_unwind(AssertUnwindSafe(|| exec.run(&adapted)))
        };
        let result = match (injected, result) {
            (Injected::PoisonOutputs, Ok(Ok(outputs))) => Ok(Ok(poison(outputs))),
            (_, r) => r,
        };
        let outcome = match result {
            Ok(Ok(outputs)) if sel.transforms.is_empty() => Ok(outputs),
            Ok(Ok(outputs)) => cast_outputs_back(outputs, &sel.transforms)
                .map_err(|e| Reason::new(ReasonCode::KERNEL_FAILED, format!("{}: output cast: {e}", sel.kernel))),
            Ok(Err(KernelError::InvalidInput(m))) => {
                return Err(Reason::new(ReasonCode::INVALID_REQUEST, format!("{}: {m}", sel.kernel)));
            }
            Ok(Err(e)) => Err(Reason::new(ReasonCode::KERNEL_FAILED, format!("{}: {e}", sel.kernel))),
            Err(payload) => {
                let msg = panic_text(payload.as_ref());
                Err(Reason::new(ReasonCode::KERNEL_FAILED, format!("{} panicked: {msg}", sel.kernel)))
            }
        };
        self.health.record(sel.index, outcome.is_ok());
        outcome
    }
}

fn flags(args: &OpArgs) -> Vec<InputFlag> {
    args.tensors()
        .into_iter()
        .filter_map(|(name, t)| {
            let (nan, inf) = t.non_finite();
            (nan + inf > 0).then(|| InputFlag { tensor: name.to_owned(), nan, inf })
        })
        .collect()
}
