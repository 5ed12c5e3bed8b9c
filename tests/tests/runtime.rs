//! The runtime: the request is derived from the arguments, a failing or panicking kernel is
//! reported and the next eligible one runs, a kernel without an executor is skipped with a
//! reason, and a kernel that keeps failing has its circuit opened.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use layerzero::LayerZero;
use layerzero::capabilities::catalog::Catalog;
use layerzero::exec::args::{OpArgs, Outputs};
use layerzero::exec::executor::{KernelError, Registry};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::tensor::HostTensor;
use layerzero::{ErrorKind, ReasonCode};
use layerzero_tests::catalog::{Backend, Kernel};
use layerzero_tests::{TestResult, planner_with};

/// Three CPU kernels with different speeds: fast (eff 0.9), mid (0.5), slow (0.1).
fn catalog() -> TestResult<Arc<Catalog>> {
    let k = |id: &str, eff: f64| Kernel::attention(id).efficiency(eff).perf("launch_ns", 100);
    let probe = Backend::new("probe", "cpu").kernel(k("probe.attention.fast", 0.9));
    probe.kernel(k("probe.attention.mid", 0.5)).kernel(k("probe.attention.slow", 0.1)).catalog()
}

fn args() -> TestResult<OpArgs> {
    layerzero_tests::tiny_attention()
}

fn ok_output(tag: f32) -> Result<Outputs, KernelError> {
    let mut o = Outputs::new();
    o.insert("out", HostTensor::from_f32(&[1], vec![tag]).map_err(|e| KernelError::Failed(e.to_string()))?);
    Ok(o)
}

fn runtime(registry: Registry) -> TestResult<LayerZero> {
    let selector = planner_with(catalog()?, "zen4", layerzero::policy::Policy::default())?;
    Ok(LayerZero::new(selector, registry)?.with_input_check(true))
}

#[test]
fn the_request_is_derived_from_the_arguments() -> TestResult {
    let req = args()?.describe();
    assert_eq!(req.op.as_str(), "attention");
    assert_eq!(req.get("q").map(|t| t.shape.clone()), Some(vec![1, 4, 2, 8]));
    assert_eq!(req.get("q").and_then(|t| t.layout), Some(Layout::Bshd));
    // A permuted view is described with its strides, so selection sees what runs.
    let q = HostTensor::zeros(DType::F32, &[1, 4, 2, 8])?.permute(&[0, 2, 1, 3])?;
    assert_eq!(q.desc().strides, Some(vec![64, 8, 16, 1]));
    Ok(())
}

#[test]
fn the_best_kernel_runs_when_it_works() -> TestResult {
    let mut r = Registry::new();
    r.register("probe.attention.fast", Arc::new(|_: &OpArgs| ok_output(1.0)));
    r.register("probe.attention.mid", Arc::new(|_: &OpArgs| ok_output(2.0)));
    let lz = runtime(r)?;
    let d = lz.dispatch(&args()?)?;
    assert_eq!(d.selection().kernel, "probe.attention.fast");
    assert!(!d.fell_back());
    assert_eq!(d.outputs["out"].to_f32_vec(), vec![1.0]);
    Ok(())
}

#[test]
fn a_panicking_kernel_is_reported_and_the_next_one_runs() -> TestResult {
    let mut r = Registry::new();
    r.register(
        "probe.attention.fast",
        Arc::new(|_: &OpArgs| -> Result<Outputs, KernelError> { panic!("boom in the kernel") }),
    );
    r.register("probe.attention.mid", Arc::new(|_: &OpArgs| Err(KernelError::Failed("device lost".to_owned()))));
    r.register("probe.attention.slow", Arc::new(|_: &OpArgs| ok_output(3.0)));
    let lz = runtime(r)?;
    let d = lz.dispatch(&args()?)?;
    assert_eq!(d.selection().kernel, "probe.attention.slow");
    assert!(d.fell_back());
    let reasons: Vec<(String, ReasonCode, String)> = d
        .failed()
        .iter()
        .filter_map(|a| a.reason.as_ref().map(|r| (a.kernel.clone(), r.code(), r.message().to_owned())))
        .collect();
    assert_eq!(reasons.len(), 2);
    assert_eq!(reasons[0].1, ReasonCode::KERNEL_FAILED);
    assert!(reasons[0].2.contains("panicked: boom in the kernel"), "{reasons:?}");
    assert!(reasons[1].2.contains("device lost"), "{reasons:?}");
    Ok(())
}

#[test]
fn a_kernel_without_an_executor_is_skipped_with_a_reason() -> TestResult {
    let mut r = Registry::new();
    r.register("probe.attention.mid", Arc::new(|_: &OpArgs| ok_output(2.0)));
    let lz = runtime(r)?;
    let d = lz.dispatch(&args()?)?;
    assert_eq!(d.selection().kernel, "probe.attention.mid");
    assert_eq!(d.failed()[0].reason.as_ref().map(|r| r.code()), Some(ReasonCode::EXECUTOR_NOT_REGISTERED));
    Ok(())
}

#[test]
fn invalid_input_stops_the_fallback_chain() -> TestResult {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let mut r = Registry::new();
    r.register(
        "probe.attention.fast",
        Arc::new(|_: &OpArgs| Err(KernelError::InvalidInput("block_table[0][3] = 99 is outside the cache".to_owned()))),
    );
    r.register(
        "probe.attention.mid",
        Arc::new(move |_: &OpArgs| {
            c.fetch_add(1, Ordering::SeqCst);
            ok_output(2.0)
        }),
    );
    let err = runtime(r)?.dispatch(&args()?).err().ok_or("must fail")?;
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("block_table[0][3] = 99"), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "a wrong input is not retried elsewhere");
    Ok(())
}

#[test]
fn repeated_failures_open_the_circuit() -> TestResult {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let mut r = Registry::new();
    r.register(
        "probe.attention.fast",
        Arc::new(move |_: &OpArgs| {
            c.fetch_add(1, Ordering::SeqCst);
            Err(KernelError::Failed("flaky".to_owned()))
        }),
    );
    r.register("probe.attention.mid", Arc::new(|_: &OpArgs| ok_output(2.0)));
    let rt = runtime(r)?;
    let threshold = layerzero::policy::HealthPolicy::default().failure_threshold;
    for _ in 0..threshold + 2 {
        let d = rt.dispatch(&args()?)?;
        assert_eq!(d.selection().kernel, "probe.attention.mid");
    }
    assert_eq!(calls.load(Ordering::SeqCst), threshold as usize, "an open circuit is not called");
    assert_eq!(rt.open_circuits(), vec!["probe.attention.fast".to_owned()]);
    let d = rt.dispatch(&args()?)?;
    assert_eq!(d.failed()[0].reason.as_ref().map(|r| r.code()), Some(ReasonCode::KERNEL_QUARANTINED));
    Ok(())
}

#[test]
fn nan_and_inf_inputs_are_computed_and_flagged() -> TestResult {
    let mut r = Registry::new();
    r.register("probe.attention.fast", Arc::new(|_: &OpArgs| ok_output(1.0)));
    let mut a = args()?;
    if let OpArgs::Attention(x) = &mut a {
        let mut v = vec![0.0f32; 64];
        v[3] = f32::NAN;
        v[9] = f32::INFINITY;
        x.k = HostTensor::from_f32(&[1, 4, 2, 8], v)?.with_layout(Layout::Bshd);
    }
    let lz = runtime(r)?;
    let d = lz.dispatch(&a)?;
    assert_eq!(d.input_flags().len(), 1);
    assert_eq!((d.input_flags()[0].tensor.as_str(), d.input_flags()[0].nan, d.input_flags()[0].inf), ("k", 1, 1));
    Ok(())
}
