//! Fault injection (`LAYERZERO_FAULTS`, `LayerZero::with_faults`): drills of fallback and
//! breakers on a healthy machine.

use layerzero::LayerZero;
use layerzero::compare::Category;
use layerzero::exec::args::{LinearArgs, OpArgs};
use layerzero::model::attrs::NoAttrs;
use layerzero::model::dtype::DType;
use layerzero::tensor::HostTensor;
use layerzero_tests::{TestResult, close};

fn linear() -> TestResult<OpArgs> {
    let t = |shape: &[usize], scale: f32| {
        let n: usize = shape.iter().product();
        HostTensor::from_f32(shape, (0..n).map(|i| ((i % 7) as f32 - 3.0) * scale).collect())
    };
    Ok(OpArgs::Linear(LinearArgs { x: t(&[4, 64], 0.5)?, weight: t(&[48, 64], 0.1)?, bias: None, attrs: NoAttrs {} }))
}

fn drill(spec: &str) -> TestResult<LayerZero> {
    Ok(LayerZero::detected().and_then(|lz| lz.with_faults(spec)).map_err(|e| format!("{spec}: {e}"))?)
}

#[test]
fn an_injected_error_falls_back_and_the_answer_is_unchanged() -> TestResult {
    let args = linear()?;
    let healthy = LayerZero::detected()?;
    let first = healthy.dispatch(&args)?;
    let kernel = first.selection().kernel.clone();
    let want = first.outputs["out"].to_f64_vec();
    let lz = drill(&format!("{kernel}=error"))?;
    assert_eq!(lz.faults(), Some(format!("{kernel}=error").as_str()));
    let d = lz.dispatch(&args)?;
    assert!(d.fell_back() && d.selection().kernel != kernel, "{:?}", d.attempts());
    let why = d.failed()[0].reason.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(why.contains("KERNEL_FAILED") && why.contains("LAYERZERO_FAULTS"), "{why}");
    let got = d.outputs["out"].to_f64_vec();
    close::values(&d.selection().kernel, Category::Gemm, DType::F32, &want, &got)?;
    Ok(())
}

#[test]
fn fail_first_fails_exactly_n_calls_then_the_kernel_runs_again() -> TestResult {
    let args = linear()?;
    let kernel = healthy_kernel(&args)?;
    let lz = drill(&format!("{kernel}=fail_first:2"))?;
    let ran: Vec<bool> = (0..4).map(|_| lz.dispatch(&args).map(|d| !d.fell_back())).collect::<Result<_, _>>()?;
    assert_eq!(ran, vec![false, false, true, true]);
    Ok(())
}

/// The kernel a healthy handle runs for `args`.
fn healthy_kernel(args: &OpArgs) -> TestResult<String> {
    Ok(LayerZero::detected()?.dispatch(args)?.selection().kernel.clone())
}

#[test]
fn a_backend_wide_panic_is_caught_and_served_by_another_backend() -> TestResult {
    let args = linear()?;
    let kernel = healthy_kernel(&args)?;
    let backend = kernel.split('.').next().unwrap_or_default().to_owned();
    let lz = drill(&format!("{backend}=panic"))?;
    let d = lz.dispatch(&args)?;
    assert!(!d.selection().kernel.starts_with(&format!("{backend}.")), "{}", d.selection().kernel);
    let why = d.failed()[0].reason.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(why.contains("panicked"), "{why}");
    Ok(())
}

#[test]
fn nan_mode_poisons_the_outputs_of_the_kernel_it_names() -> TestResult {
    let args = linear()?;
    let kernel = healthy_kernel(&args)?;
    let lz = drill(&format!("{kernel}=nan"))?;
    let d = lz.dispatch(&args)?;
    assert_eq!(d.selection().kernel, kernel, "a poisoned kernel still runs");
    assert!(d.outputs["out"].to_f64_vec().iter().all(|v| v.is_nan()));
    Ok(())
}

#[test]
fn a_fault_naming_nothing_in_the_catalog_is_refused() -> TestResult {
    let err = LayerZero::detected().and_then(|lz| lz.with_faults("no.such.kernel=error")).err();
    let msg = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains("LAYERZERO_FAULTS") && msg.contains("no.such.kernel"), "{msg}");
    assert!(LayerZero::detected().and_then(|lz| lz.with_faults("")).is_ok_and(|lz| lz.faults().is_none()));
    Ok(())
}
