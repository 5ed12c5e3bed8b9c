//! The health system (issue 12, items 1 and 2): breakers per kernel and per backend with
//! half-open trials, failure classes that decide the scope, deadlines, output checks, and
//! the settings that come from the policy and its knobs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use layerzero::capabilities::catalog::Catalog;
use layerzero::exec::args::{OpArgs, Outputs};
use layerzero::exec::executor::{KernelError, Registry};
use layerzero::policy::Policy;
use layerzero::tensor::HostTensor;
use layerzero::{ErrorKind, LayerZero, ReasonCode};
use layerzero_tests::catalog::{Backend, Kernel as FakeKernel, catalog_of};
use layerzero_tests::{TestResult, planner_with, policy};

/// Two backends on the CPU: `main` with a fast kernel (8 MiB of workspace) and a mid one
/// (16 MiB), `spare` with a slow kernel that needs none.
fn catalog() -> TestResult<Arc<Catalog>> {
    let k = |id: &str, eff: f64, workspace: u64| {
        FakeKernel::attention(id).efficiency(eff).perf("launch_ns", 100).property("workspace_bytes", workspace)
    };
    let main = Backend::new("main", "cpu").kernel(k(FAST, 0.9, 8 << 20)).kernel(k(MID, 0.5, 16 << 20));
    catalog_of([main, Backend::new("spare", "cpu").kernel(k(SLOW, 0.1, 0))])
}

const FAST: &str = "main.attention.fast";
const MID: &str = "main.attention.mid";
const SLOW: &str = "spare.attention.slow";

fn args() -> TestResult<OpArgs> {
    layerzero_tests::tiny_attention()
}

fn out(tag: f32) -> Result<Outputs, KernelError> {
    let mut o = Outputs::new();
    o.insert("out", HostTensor::from_f32(&[1], vec![tag]).map_err(|e| KernelError::Failed(e.to_string()))?);
    Ok(o)
}

type Kernel = Arc<dyn Fn(&OpArgs) -> Result<Outputs, KernelError> + Send + Sync>;

/// A handle where `fast`, `mid` and `slow` run the given closures (each answers its tag).
fn handle(policy: Policy, fast: Kernel, mid: Kernel, slow: Kernel) -> TestResult<LayerZero> {
    let mut r = Registry::new();
    r.register(FAST, Arc::new(move |a: &OpArgs| fast(a)));
    r.register(MID, Arc::new(move |a: &OpArgs| mid(a)));
    r.register(SLOW, Arc::new(move |a: &OpArgs| slow(a)));
    Ok(LayerZero::new(planner_with(catalog()?, "zen4", policy)?, r)?)
}

fn works(tag: f32) -> Kernel {
    Arc::new(move |_: &OpArgs| out(tag))
}

fn fails(error: fn(String) -> KernelError, calls: &Arc<AtomicUsize>) -> Kernel {
    let calls = calls.clone();
    Arc::new(move |_: &OpArgs| {
        calls.fetch_add(1, Ordering::SeqCst);
        Err(error("broken on purpose".to_owned()))
    })
}

fn codes(d: &layerzero::Dispatch<'_>) -> Vec<ReasonCode> {
    d.failed().iter().filter_map(|a| a.reason.as_ref().map(|r| r.code())).collect()
}

fn ran(lz: &LayerZero) -> TestResult<(String, Vec<ReasonCode>)> {
    let d = lz.dispatch(&args()?)?;
    Ok((d.selection().kernel.clone(), codes(&d)))
}

#[test]
fn a_failing_kernel_is_quarantined_at_the_policy_threshold_and_reports_show_the_time_left() -> TestResult {
    let calls = Arc::new(AtomicUsize::new(0));
    let lz = handle(
        policy(r#"{"health": {"failure_threshold": 2}}"#)?,
        fails(KernelError::Failed, &calls),
        works(2.0),
        works(3.0),
    )?;
    assert_eq!(ran(&lz)?, (MID.to_owned(), vec![ReasonCode::KERNEL_FAILED]));
    assert_eq!(ran(&lz)?, (MID.to_owned(), vec![ReasonCode::KERNEL_FAILED]));
    assert_eq!(ran(&lz)?, (MID.to_owned(), vec![ReasonCode::KERNEL_QUARANTINED]), "the third call is refused");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "a quarantined kernel is not called");
    let report = lz.explain(&args()?.describe());
    let fast = report.candidate(FAST).ok_or_else(|| format!("{FAST} is not a candidate"))?;
    let why = fast.reasons.last().ok_or("no reason")?;
    assert_eq!(why.code(), ReasonCode::KERNEL_QUARANTINED);
    assert!(why.message().contains("s more") && why.message().contains("broken on purpose"), "{why}");
    assert_eq!(report.selected.as_deref(), Some(MID), "explain names what dispatch runs");
    let c = lz.counters();
    assert_eq!((c.kernel_failures, c.breaker_opens, c.refused_by_health, c.fallbacks), (2, 1, 1, 3));
    let h = lz.health_report();
    assert_eq!(h.kernels.len(), 1);
    assert_eq!((h.kernels[0].name.as_str(), h.kernels[0].state, h.kernels[0].opens), (FAST, "open", 1));
    assert!(h.kernels[0].left_ms.is_some_and(|ms| ms > 25_000 && ms <= 30_000));
    Ok(())
}

#[test]
fn after_the_cooldown_a_trial_call_probes_the_kernel_and_its_success_closes_the_breaker() -> TestResult {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    // Fails its first two calls, then works.
    let flaky: Kernel = Arc::new(move |_: &OpArgs| {
        if c.fetch_add(1, Ordering::SeqCst) < 2 { Err(KernelError::Failed("warming up".to_owned())) } else { out(1.0) }
    });
    let lz = handle(
        policy(r#"{"health": {"failure_threshold": 2, "cooldown_ms": 500, "half_open_trials": 1}}"#)?,
        flaky,
        works(2.0),
        works(3.0),
    )?;
    ran(&lz)?;
    ran(&lz)?;
    assert_eq!(ran(&lz)?.1, vec![ReasonCode::KERNEL_QUARANTINED]);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(lz.health_report().kernels[0].state, "half_open");
    assert_eq!(ran(&lz)?, (FAST.to_owned(), vec![]), "the trial call runs and succeeds");
    assert_eq!(lz.health_report().kernels[0].state, "closed");
    assert_eq!(ran(&lz)?, (FAST.to_owned(), vec![]));
    Ok(())
}

#[test]
fn a_failed_trial_quarantines_the_kernel_for_another_cooldown() -> TestResult {
    let calls = Arc::new(AtomicUsize::new(0));
    let lz = handle(
        policy(r#"{"health": {"failure_threshold": 1, "cooldown_ms": 500}}"#)?,
        fails(KernelError::Failed, &calls),
        works(2.0),
        works(3.0),
    )?;
    ran(&lz)?;
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(ran(&lz)?.1, vec![ReasonCode::KERNEL_FAILED], "the trial is a real call");
    assert_eq!(ran(&lz)?.1, vec![ReasonCode::KERNEL_QUARANTINED], "and its failure reopens the breaker");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    Ok(())
}

#[test]
fn a_lost_device_disables_every_kernel_of_its_backend_until_a_probe_succeeds() -> TestResult {
    let lost = Arc::new(AtomicUsize::new(0));
    let mid_calls = Arc::new(AtomicUsize::new(0));
    let m = mid_calls.clone();
    let mid: Kernel = Arc::new(move |_: &OpArgs| {
        m.fetch_add(1, Ordering::SeqCst);
        out(2.0)
    });
    let lz =
        handle(policy(r#"{"health": {"cooldown_ms": 500}}"#)?, fails(KernelError::DeviceLost, &lost), mid, works(3.0))?;
    // The device is lost under the fast kernel: its sibling on the same backend is not
    // tried; the other backend answers.
    let d = lz.dispatch(&args()?)?;
    assert_eq!(d.selection().kernel, SLOW);
    assert_eq!(codes(&d), vec![ReasonCode::DEVICE_LOST, ReasonCode::BACKEND_UNHEALTHY]);
    assert!(d.failed()[1].reason.as_ref().is_some_and(|r| r.message().contains("backend main is disabled")));
    assert_eq!(mid_calls.load(Ordering::SeqCst), 0);
    assert_eq!(lz.health_report().backends[0].name, "main");
    // After the cooldown the next call of the backend is its probe; fast still fails, so
    // the backend stays disabled; a probe through mid would re-enable it.
    std::thread::sleep(Duration::from_millis(600));
    let d = lz.dispatch(&args()?)?;
    assert_eq!(codes(&d), vec![ReasonCode::DEVICE_LOST, ReasonCode::BACKEND_UNHEALTHY]);
    assert_eq!(lost.load(Ordering::SeqCst), 2, "one probe per cooldown, no retry loop");
    Ok(())
}

#[test]
fn a_device_reset_is_found_by_the_probe_and_the_backend_serves_again() -> TestResult {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    // The device is lost on the first call and back (reset) afterwards.
    let resets: Kernel = Arc::new(move |_: &OpArgs| {
        if c.fetch_add(1, Ordering::SeqCst) == 0 {
            Err(KernelError::DeviceLost("GPU fell off the bus".to_owned()))
        } else {
            out(1.0)
        }
    });
    let lz = handle(policy(r#"{"health": {"cooldown_ms": 500}}"#)?, resets, works(2.0), works(3.0))?;
    assert_eq!(ran(&lz)?.0, SLOW);
    assert_eq!(ran(&lz)?.0, SLOW, "disabled during the cooldown");
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(ran(&lz)?, (FAST.to_owned(), vec![]), "the probe succeeds");
    assert!(lz.health_report().backends.iter().all(|b| b.state == "closed"));
    Ok(())
}

#[test]
fn out_of_memory_tries_the_kernel_with_a_smaller_workspace_first() -> TestResult {
    let calls = Arc::new(AtomicUsize::new(0));
    let mid_calls = Arc::new(AtomicUsize::new(0));
    let m = mid_calls.clone();
    let mid: Kernel = Arc::new(move |_: &OpArgs| {
        m.fetch_add(1, Ordering::SeqCst);
        out(2.0)
    });
    let lz = handle(Policy::default(), fails(KernelError::OutOfMemory, &calls), mid, works(3.0))?;
    let d = lz.dispatch(&args()?)?;
    // mid scores better than slow but needs more workspace than the kernel that ran out of
    // memory; slow needs none: it runs next.
    assert_eq!(d.selection().kernel, SLOW);
    assert_eq!(codes(&d), vec![ReasonCode::KERNEL_OUT_OF_MEMORY]);
    assert_eq!(mid_calls.load(Ordering::SeqCst), 0);
    Ok(())
}

#[test]
fn when_every_kernel_fails_the_error_names_each_attempt_and_its_reason() -> TestResult {
    let calls = Arc::new(AtomicUsize::new(0));
    let lz = handle(
        Policy::default(),
        fails(KernelError::Failed, &calls),
        fails(KernelError::OutOfMemory, &calls),
        fails(KernelError::Failed, &calls),
    )?;
    let err = lz.dispatch(&args()?).err().ok_or("every kernel fails")?;
    assert_eq!(err.kind(), ErrorKind::KernelFailed);
    let text = err.to_string();
    for needle in [FAST, MID, SLOW, "KERNEL_FAILED", "KERNEL_OUT_OF_MEMORY", "3 tried"] {
        assert!(text.contains(needle), "{needle} missing from: {text}");
    }
    assert_eq!(err.reasons().len(), 3);
    Ok(())
}

#[test]
fn a_kernel_past_its_deadline_is_abandoned_quarantined_and_the_next_one_answers() -> TestResult {
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = release.clone();
    let hangs: Kernel = Arc::new(move |_: &OpArgs| {
        while !r.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(2));
        }
        out(99.0)
    });
    let lz = handle(policy(r#"{"kernel_timeout_ms": 50}"#)?, hangs, works(2.0), works(3.0))?;
    // The kernel blocks until released: this returns only because the deadline abandons it.
    let d = lz.dispatch(&args()?)?;
    assert_eq!(d.selection().kernel, MID);
    assert_eq!(d.outputs["out"].to_f32_vec(), vec![2.0], "the late kernel's answer is not used");
    assert_eq!(codes(&d), vec![ReasonCode::KERNEL_TIMEOUT]);
    assert_eq!(ran(&lz)?.1, vec![ReasonCode::KERNEL_QUARANTINED], "a timeout quarantines at once");
    let h = lz.health_report();
    assert_eq!((h.abandoned_running, h.abandoned_total, lz.counters().timeouts), (1, 1, 1));
    release.store(true, Ordering::Release);
    let mut running = lz.health_report().abandoned_running;
    for _ in 0..500 {
        if running == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
        running = lz.health_report().abandoned_running;
    }
    assert_eq!(running, 0, "the abandoned call returned but is still counted as running");
    Ok(())
}

#[test]
fn more_abandoned_calls_than_the_bound_disable_the_backend() -> TestResult {
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hang = |r: Arc<std::sync::atomic::AtomicBool>| -> Kernel {
        Arc::new(move |_: &OpArgs| {
            while !r.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(2));
            }
            out(0.0)
        })
    };
    let lz = handle(
        policy(r#"{"kernel_timeout_ms": 20, "health": {"max_abandoned": 1}}"#)?,
        hang(release.clone()),
        hang(release.clone()),
        works(3.0),
    )?;
    let d = lz.dispatch(&args()?)?;
    assert_eq!(d.selection().kernel, SLOW);
    assert_eq!(codes(&d), vec![ReasonCode::KERNEL_TIMEOUT, ReasonCode::KERNEL_TIMEOUT]);
    let h = lz.health_report();
    assert!(h.backends.iter().any(|b| b.name == "main" && b.state == "open"), "{h:?}");
    assert!(h.backends[0].last_failure.as_deref().is_some_and(|w| w.contains("abandoned")), "{h:?}");
    release.store(true, Ordering::Release);
    Ok(())
}

#[test]
fn outputs_with_nan_from_finite_inputs_fall_back_only_when_validation_is_on() -> TestResult {
    let nan: Kernel = Arc::new(|_: &OpArgs| out(f32::NAN));
    let on = handle(policy(r#"{"validate_outputs": true}"#)?, nan.clone(), works(2.0), works(3.0))?;
    let d = on.dispatch(&args()?)?;
    assert_eq!((d.selection().kernel.as_str(), codes(&d)), (MID, vec![ReasonCode::KERNEL_OUTPUT_INVALID]));
    assert!(d.failed()[0].reason.as_ref().is_some_and(|r| r.message().contains("1 NaN")));
    assert_eq!(on.counters().invalid_outputs, 1);
    let off = handle(Policy::default(), nan, works(2.0), works(3.0))?;
    let d = off.dispatch(&args()?)?;
    assert_eq!(d.selection().kernel, FAST, "without the check the NaN goes through");
    Ok(())
}

#[test]
fn a_failed_attempt_never_modifies_the_inputs() -> TestResult {
    let before: Vec<Vec<f32>> = {
        let a = args()?;
        a.tensors().iter().map(|(_, t)| t.to_f32_vec()).collect()
    };
    let a = args()?;
    let calls = Arc::new(AtomicUsize::new(0));
    let lz = handle(
        policy(r#"{"validate_outputs": true}"#)?,
        fails(KernelError::Failed, &calls),
        works(f32::NAN),
        works(3.0),
    )?;
    let d = lz.dispatch(&a)?;
    assert_eq!(d.selection().kernel, SLOW);
    let after: Vec<Vec<f32>> = a.tensors().iter().map(|(_, t)| t.to_f32_vec()).collect();
    assert_eq!(before, after);
    Ok(())
}

#[test]
fn health_settings_change_on_a_serving_handle_without_changing_the_policy_hash() -> TestResult {
    let calls = Arc::new(AtomicUsize::new(0));
    let lz = handle(Policy::default(), fails(KernelError::Failed, &calls), works(2.0), works(3.0))?;
    let hash = lz.selector().policy_hash().to_owned();
    lz.set_policy(policy(
        r#"{"health": {"failure_threshold": 1}, "kernel_timeout_ms": 1000, "validate_outputs": true}"#,
    )?)?;
    assert_eq!(lz.selector().policy_hash(), hash, "runtime settings are not part of the policy hash");
    let c = lz.health_report().config;
    assert_eq!((c.failure_threshold, c.kernel_timeout, c.validate_outputs), (1, Some(Duration::from_secs(1)), true));
    ran(&lz)?;
    assert_eq!(ran(&lz)?.1, vec![ReasonCode::KERNEL_QUARANTINED], "the new threshold of 1 applies at once");
    Ok(())
}

#[test]
fn knobs_override_the_policy_health_fields_and_bad_values_name_the_variable() -> TestResult {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| std::ffi::OsString::from(v))
    };
    let mut p = Policy::default();
    let set = env(&[
        ("LAYERZERO_FAILURE_THRESHOLD", "5"),
        ("LAYERZERO_COOLDOWN_MS", "250"),
        ("LAYERZERO_KERNEL_TIMEOUT_MS", "40"),
        ("LAYERZERO_VALIDATE_OUTPUTS", "yes"),
    ]);
    let applied = p.apply_overrides(&layerzero::knobs::Settings::from_lookup(&set)?.policy_overrides());
    assert_eq!(
        (p.health.failure_threshold, p.health.cooldown_ms, p.kernel_timeout_ms, p.validate_outputs),
        (5, 250, Some(40), true)
    );
    assert_eq!(
        applied.iter().map(|o| o.field).collect::<Vec<_>>(),
        vec!["health.failure_threshold", "health.cooldown_ms", "kernel_timeout_ms", "validate_outputs"]
    );
    for (bad, says) in [
        (env(&[("LAYERZERO_FAILURE_THRESHOLD", "0")]), "LAYERZERO_FAILURE_THRESHOLD=0"),
        (env(&[("LAYERZERO_KERNEL_TIMEOUT_MS", "soon")]), "LAYERZERO_KERNEL_TIMEOUT_MS=\"soon\""),
    ] {
        let err = layerzero::knobs::Settings::from_lookup(&bad).err();
        assert!(err.as_ref().is_some_and(|e| e.to_string().contains(says)), "{err:?}");
    }
    let err = Policy::from_json(r#"{"health": {"failure_threshold": 0}}"#, "p.json").err();
    assert!(err.as_ref().is_some_and(|e| e.to_string().contains("failure_threshold")), "{err:?}");
    Ok(())
}

#[test]
fn a_shape_the_jit_cannot_compile_falls_back_without_quarantining_the_kernel() -> TestResult {
    // E2E §10.5: the kernel refuses the shape at once on every call (its JIT remembers the
    // failure), the next kernel serves, and the kernel's breaker stays closed for other shapes.
    let calls = Arc::new(AtomicUsize::new(0));
    let lz = handle(
        policy(r#"{"health": {"failure_threshold": 2}}"#)?,
        fails(KernelError::CompileFailed, &calls),
        works(2.0),
        works(3.0),
    )?;
    for _ in 0..5 {
        assert_eq!(ran(&lz)?, (MID.to_owned(), vec![ReasonCode::JIT_COMPILE_FAILED]));
    }
    let c = lz.counters();
    assert_eq!((c.jit_compile_failures, c.kernel_failures, c.breaker_opens), (5, 0, 0), "{c:?}");
    assert!(lz.open_circuits().is_empty(), "a compile failure is not a health failure: {:?}", lz.open_circuits());
    Ok(())
}
