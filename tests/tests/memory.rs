//! E2E spec §11, memory and stability: selection checks workspaces against the live
//! headroom (`MEMORY_HEADROOM_EXCEEDED`), prefers smaller workspaces under pressure, never
//! serves a choice made when memory was plentiful once it is scarce, and never loops
//! retrying a kernel that runs out of memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use layerzero::capabilities::catalog::Catalog;
use layerzero::exec::args::{OpArgs, Outputs};
use layerzero::exec::executor::{KernelError, Registry};
use layerzero::hardware::memory::MemoryGauge;
use layerzero::policy::Policy;
use layerzero::tensor::HostTensor;
use layerzero::{ErrorKind, LayerZero, ReasonCode};
use layerzero_tests::catalog::{Backend, Kernel};
use layerzero_tests::{TestResult, planner_with};

const MIB: u64 = 1 << 20;
const BIG: &str = "mem.attention.big";
const SMALL: &str = "mem.attention.small";

/// A faster kernel that needs 300 MiB of workspace and a slightly slower one that needs none.
fn catalog() -> TestResult<Arc<Catalog>> {
    let k = |id: &str, eff: f64, workspace: u64| {
        Kernel::attention(id).efficiency(eff).perf("launch_ns", 100).property("workspace_bytes", workspace)
    };
    Backend::new("mem", "cpu").kernel(k(BIG, 0.9, 300 * MIB)).kernel(k(SMALL, 0.8, 0)).catalog()
}

fn out() -> Result<Outputs, KernelError> {
    let mut o = Outputs::new();
    o.insert("out", HostTensor::from_f32(&[1], vec![1.0]).map_err(|e| KernelError::Failed(e.to_string()))?);
    Ok(o)
}

/// A handle on a 16 GiB machine whose headroom `gauge` reads.
fn handle(gauge: &Arc<MemoryGauge>, big: Arc<dyn layerzero::Executor>) -> TestResult<LayerZero> {
    let mut r = Registry::new();
    r.register(BIG, big);
    r.register(SMALL, Arc::new(|_: &OpArgs| out()));
    Ok(LayerZero::new(planner_with(catalog()?, "zen4", Policy::default())?, r)?.with_memory_gauge(gauge.clone())?)
}

fn selected(lz: &LayerZero) -> TestResult<String> {
    Ok(lz.select(&layerzero_tests::tiny_attention()?.describe())?.kernel.clone())
}

#[test]
fn a_workspace_larger_than_the_live_headroom_is_rejected_and_the_cached_choice_is_not_served() -> TestResult {
    let gauge = Arc::new(MemoryGauge::new(16 << 30));
    let lz = handle(&gauge, Arc::new(|_: &OpArgs| out()))?;
    gauge.set_available(8 << 30);
    assert_eq!(selected(&lz)?, BIG);
    assert_eq!(selected(&lz)?, BIG, "cached while memory is plentiful");
    // Another process takes almost everything: 200 MiB left, under pressure.
    gauge.set_available(200 * MIB);
    assert_eq!(selected(&lz)?, SMALL, "the choice cached before the pressure is not served");
    let report = lz.explain(&layerzero_tests::tiny_attention()?.describe());
    let big = report.candidate(BIG).ok_or_else(|| format!("{BIG} is not a candidate"))?;
    let why = big.reasons.iter().find(|r| r.code() == ReasonCode::MEMORY_HEADROOM_EXCEEDED);
    assert!(why.is_some_and(|r| r.message().contains("live reading")), "{:?}", big.reasons);
    // Memory comes back: the fast kernel again.
    gauge.set_available(8 << 30);
    assert_eq!(selected(&lz)?, BIG);
    Ok(())
}

#[test]
fn under_pressure_a_kernel_that_fits_but_needs_more_workspace_loses_to_a_smaller_one() -> TestResult {
    let gauge = Arc::new(MemoryGauge::new(16 << 30));
    let lz = handle(&gauge, Arc::new(|_: &OpArgs| out()))?;
    // 400 MiB free of 16 GiB: the 300 MiB workspace fits, but would take most of it.
    gauge.set_available(400 * MIB);
    assert!(gauge.under_pressure());
    let report = lz.explain(&layerzero_tests::tiny_attention()?.describe());
    assert!(report.candidate(BIG).is_some_and(|c| c.reasons.is_empty()), "it fits");
    assert_eq!(report.selected.as_deref(), Some(SMALL));
    assert!(report.candidate(BIG).and_then(|c| c.score.as_ref()).is_some_and(|s| s.policy_factor > 1.5));
    Ok(())
}

#[test]
fn a_kernel_that_keeps_running_out_of_memory_is_not_retried_in_a_loop() -> TestResult {
    let gauge = Arc::new(MemoryGauge::new(16 << 30));
    gauge.set_available(8 << 30);
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let lz = handle(
        &gauge,
        Arc::new(move |_: &OpArgs| -> Result<Outputs, KernelError> {
            c.fetch_add(1, Ordering::SeqCst);
            Err(KernelError::OutOfMemory("cudaMalloc of 300 MiB failed".to_owned()))
        }),
    )?;
    for _ in 0..20 {
        let d = lz.dispatch(&layerzero_tests::tiny_attention()?)?;
        assert_eq!(d.selection().kernel, SMALL);
    }
    let threshold = Policy::default().health.failure_threshold as usize;
    assert_eq!(calls.load(Ordering::SeqCst), threshold, "one try per dispatch until quarantined, then none");
    Ok(())
}

#[test]
fn when_no_kernel_fits_the_error_says_so_for_each_one() -> TestResult {
    let gauge = Arc::new(MemoryGauge::new(16 << 30));
    let lz = handle(&gauge, Arc::new(|_: &OpArgs| out()))?;
    gauge.set_available(0);
    // Even the no-workspace kernel needs room for its output.
    let err = lz.select(&layerzero_tests::tiny_attention()?.describe()).err().ok_or("nothing fits")?;
    assert_eq!(err.kind(), ErrorKind::NoKernel);
    assert!(err.reasons().iter().all(|r| r.code() == ReasonCode::MEMORY_HEADROOM_EXCEEDED), "{err}");
    Ok(())
}

#[test]
fn a_host_handle_reads_the_live_headroom_of_this_machine() -> TestResult {
    let lz = LayerZero::detected()?;
    let gauge = lz.selector().memory().map(|g| (g.available(), g.total()));
    let (available, total) = gauge.ok_or("a host handle has a memory gauge")?;
    assert!(available.is_some_and(|a| a > 0), "{available:?} of {total}");
    Ok(())
}
