//! The runtime: select, apply the planned transforms, execute, fall back when a kernel
//! fails, and say so. A kernel that errors or panics never takes the process down.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::args::{OpArgs, Outputs};
use super::executor::{KernelError, Registry};
use crate::error::{Error, ErrorKind, Result};
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::reason::{Reason, ReasonCode};
use crate::select::{Selection, Selector};
use crate::tensor::HostTensor;
use crate::transform::{Transform, TransformKind};

/// Consecutive failures after which a kernel's circuit opens.
pub const BREAKER_THRESHOLD: u32 = 3;
/// How long an open circuit stays open before one trial call.
pub const BREAKER_COOLDOWN: Duration = Duration::from_secs(30);

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
#[derive(Debug, Clone)]
pub struct Dispatch {
    /// Named outputs.
    pub outputs: Outputs,
    /// The selection that produced them.
    pub selection: Selection,
    /// Every kernel tried, in order (the last one succeeded).
    pub attempts: Vec<Attempt>,
    /// Inputs with NaN/Inf.
    pub input_flags: Vec<InputFlag>,
}

impl Dispatch {
    /// True when the first choice did not run.
    pub fn fell_back(&self) -> bool {
        self.attempts.len() > 1
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Health {
    consecutive_failures: u32,
    opened_at: Option<Instant>,
}

/// Selection plus execution.
#[derive(Debug)]
pub struct Runtime {
    selector: Selector,
    registry: Registry,
    health: Mutex<BTreeMap<String, Health>>,
}

impl Runtime {
    /// A runtime over a selector and the executors it may run.
    pub fn new(selector: Selector, registry: Registry) -> Runtime {
        Runtime { selector, registry, health: Mutex::new(BTreeMap::new()) }
    }

    /// The selector.
    pub fn selector(&self) -> &Selector {
        &self.selector
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Selects for `args`, runs the best eligible kernel, and falls back to the next one
    /// (in score order) when a kernel has no executor, its circuit is open, or it fails.
    pub fn dispatch(&self, args: &OpArgs) -> Result<Dispatch> {
        let request = args.describe();
        let ranked = self.selector.ranked(&request)?;
        let input_flags = flags(args);
        let mut attempts = Vec::new();
        for sel in ranked {
            match self.try_run(&sel, args) {
                Ok(outputs) => {
                    attempts.push(Attempt { kernel: sel.kernel.clone(), ok: true, reason: None });
                    return Ok(Dispatch { outputs, selection: sel, attempts, input_flags });
                }
                Err(reason) => {
                    let invalid = reason.code() == ReasonCode::INVALID_REQUEST;
                    attempts.push(Attempt { kernel: sel.kernel.clone(), ok: false, reason: Some(reason.clone()) });
                    if invalid {
                        // The inputs are wrong for every kernel: falling back would only repeat it.
                        return Err(
                            Error::new(ErrorKind::InvalidInput, reason.message().to_owned()).with_reasons(vec![reason])
                        );
                    }
                }
            }
        }
        let reasons: Vec<Reason> = attempts.iter().filter_map(|a| a.reason.clone()).collect();
        let tried: Vec<String> = attempts.iter().map(|a| a.kernel.clone()).collect();
        Err(Error::new(ErrorKind::NoKernel, format!("every eligible kernel failed: {}", tried.join(", ")))
            .with_reasons(reasons))
    }

    /// Runs one selected kernel (transforms included), with the breaker and panic guard.
    pub fn run_selection(&self, sel: &Selection, args: &OpArgs) -> Result<Outputs> {
        self.try_run(sel, args).map_err(|r| {
            let kind =
                if r.code() == ReasonCode::INVALID_REQUEST { ErrorKind::InvalidInput } else { ErrorKind::NoKernel };
            Error::new(kind, r.to_string()).with_reasons(vec![r])
        })
    }

    fn try_run(&self, sel: &Selection, args: &OpArgs) -> std::result::Result<Outputs, Reason> {
        let Some(exec) = self.registry.get(&sel.kernel) else {
            return Err(Reason::new(
                ReasonCode::EXECUTOR_NOT_REGISTERED,
                format!("no executor is registered for {} in this process", sel.kernel),
            ));
        };
        if let Some(open) = self.circuit_open(&sel.kernel) {
            return Err(Reason::new(
                ReasonCode::BACKEND_UNHEALTHY,
                format!(
                    "{} failed {BREAKER_THRESHOLD} times in a row; its circuit is open for {}s more",
                    sel.kernel,
                    open.as_secs()
                ),
            ));
        }
        let adapted = apply_transforms(args, &sel.transforms)
            .map_err(|e| Reason::new(ReasonCode::KERNEL_FAILED, format!("transform before {}: {e}", sel.kernel)))?;
        let result = catch_unwind(AssertUnwindSafe(|| exec.run(&adapted)));
        let outcome = match result {
            Ok(Ok(outputs)) => cast_outputs_back(outputs, &sel.transforms)
                .map_err(|e| Reason::new(ReasonCode::KERNEL_FAILED, format!("{}: output cast: {e}", sel.kernel))),
            Ok(Err(KernelError::InvalidInput(m))) => {
                return Err(Reason::new(ReasonCode::INVALID_REQUEST, format!("{}: {m}", sel.kernel)));
            }
            Ok(Err(e)) => Err(Reason::new(ReasonCode::KERNEL_FAILED, format!("{}: {e}", sel.kernel))),
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_owned());
                Err(Reason::new(ReasonCode::KERNEL_FAILED, format!("{} panicked: {msg}", sel.kernel)))
            }
        };
        self.record(&sel.kernel, outcome.is_ok());
        outcome
    }

    fn circuit_open(&self, kernel: &str) -> Option<Duration> {
        let health = self.health.lock().unwrap_or_else(|p| p.into_inner());
        let h = health.get(kernel)?;
        let opened = h.opened_at?;
        let elapsed = opened.elapsed();
        // After the cooldown one trial call goes through (half-open).
        if elapsed >= BREAKER_COOLDOWN { None } else { Some(BREAKER_COOLDOWN - elapsed) }
    }

    fn record(&self, kernel: &str, ok: bool) {
        let mut health = self.health.lock().unwrap_or_else(|p| p.into_inner());
        let h = health.entry(kernel.to_owned()).or_default();
        if ok {
            *h = Health::default();
        } else {
            h.consecutive_failures += 1;
            if h.consecutive_failures >= BREAKER_THRESHOLD {
                h.opened_at = Some(Instant::now());
            }
        }
    }

    /// Kernels whose circuit is open now.
    pub fn open_circuits(&self) -> Vec<String> {
        let health = self.health.lock().unwrap_or_else(|p| p.into_inner());
        health
            .iter()
            .filter(|(_, h)| h.opened_at.is_some_and(|t| t.elapsed() < BREAKER_COOLDOWN))
            .map(|(k, _)| k.clone())
            .collect()
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

/// Applies the input transforms a selection planned.
pub fn apply_transforms(args: &OpArgs, transforms: &[Transform]) -> Result<OpArgs> {
    if transforms.is_empty() {
        return Ok(args.clone());
    }
    args.map_tensors(|name, t| {
        let mut t = t.clone();
        for tr in transforms.iter().filter(|tr| tr.tensor == name) {
            t = match tr.kind {
                TransformKind::Transpose => {
                    let to = if tr.to == Layout::Bhsd.as_str() { Layout::Bhsd } else { Layout::Bshd };
                    t.permute(&[0, 2, 1, 3])?.contiguous().with_layout(to)
                }
                TransformKind::MakeContiguous => {
                    let l = t.layout();
                    let c = t.contiguous();
                    match l {
                        Some(l) => c.with_layout(l),
                        None => c,
                    }
                }
                TransformKind::Cast => cast(&t, tr.to)?,
            };
        }
        Ok(t)
    })
}

fn cast(t: &HostTensor, to: &str) -> Result<HostTensor> {
    let d: DType = to.parse().map_err(Error::invalid)?;
    let c = HostTensor::from_f32_as(d, t.shape(), &t.to_f32_vec())?;
    Ok(match t.layout() {
        Some(l) => c.with_layout(l),
        None => c,
    })
}

fn cast_outputs_back(mut outputs: Outputs, transforms: &[Transform]) -> Result<Outputs> {
    if let Some(tr) = transforms.iter().find(|t| t.kind == TransformKind::Cast && t.tensor == "out") {
        for t in outputs.values_mut() {
            if t.dtype().is_float() {
                *t = cast(t, tr.to)?;
            }
        }
    }
    Ok(outputs)
}
