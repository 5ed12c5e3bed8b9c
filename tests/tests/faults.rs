//! Fault injection (`LAYERZERO_FAULTS`, `LayerZero::with_faults`): drills of fallback and
//! breakers on a healthy machine.

use layerzero::LayerZero;
use layerzero::exec::args::{LinearArgs, OpArgs};
use layerzero::model::attrs::NoAttrs;
use layerzero::tensor::HostTensor;

fn linear() -> OpArgs {
    let t = |shape: &[usize], scale: f32| {
        let n: usize = shape.iter().product();
        HostTensor::from_f32(shape, (0..n).map(|i| ((i % 7) as f32 - 3.0) * scale).collect())
            .unwrap_or_else(|e| panic!("{e}"))
    };
    OpArgs::Linear(LinearArgs { x: t(&[4, 64], 0.5), weight: t(&[48, 64], 0.1), bias: None, attrs: NoAttrs {} })
}

fn drill(spec: &str) -> LayerZero {
    LayerZero::detected().and_then(|lz| lz.with_faults(spec)).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

#[test]
fn an_injected_error_falls_back_and_the_answer_is_unchanged() {
    let args = linear();
    let healthy = LayerZero::detected().unwrap_or_else(|e| panic!("{e}"));
    let first = healthy.dispatch(&args).unwrap_or_else(|e| panic!("{e}"));
    let kernel = first.selection().kernel.clone();
    let want = first.outputs["out"].to_f64_vec();
    let lz = drill(&format!("{kernel}=error"));
    assert_eq!(lz.faults(), Some(format!("{kernel}=error").as_str()));
    let d = lz.dispatch(&args).unwrap_or_else(|e| panic!("{e}"));
    assert!(d.fell_back() && d.selection().kernel != kernel, "{:?}", d.attempts());
    let why = d.failed()[0].reason.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(why.contains("KERNEL_FAILED") && why.contains("LAYERZERO_FAULTS"), "{why}");
    let got = d.outputs["out"].to_f64_vec();
    assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-4));
}

#[test]
fn fail_first_fails_exactly_n_calls_then_the_kernel_runs_again() {
    let args = linear();
    let kernel = healthy_kernel(&args);
    let lz = drill(&format!("{kernel}=fail_first:2"));
    let ran: Vec<bool> =
        (0..4).map(|_| lz.dispatch(&args).map(|d| !d.fell_back()).unwrap_or_else(|e| panic!("{e}"))).collect();
    assert_eq!(ran, vec![false, false, true, true]);
}

/// The kernel a healthy handle runs for `args`.
fn healthy_kernel(args: &OpArgs) -> String {
    LayerZero::detected()
        .and_then(|lz| lz.dispatch(args).map(|d| d.selection().kernel.clone()))
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_backend_wide_panic_is_caught_and_served_by_another_backend() {
    let args = linear();
    let kernel = healthy_kernel(&args);
    let backend = kernel.split('.').next().unwrap_or_default().to_owned();
    let lz = drill(&format!("{backend}=panic"));
    let d = lz.dispatch(&args).unwrap_or_else(|e| panic!("{e}"));
    assert!(!d.selection().kernel.starts_with(&format!("{backend}.")), "{}", d.selection().kernel);
    let why = d.failed()[0].reason.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(why.contains("panicked"), "{why}");
}

#[test]
fn nan_mode_poisons_the_outputs_of_the_kernel_it_names() {
    let args = linear();
    let kernel = healthy_kernel(&args);
    let lz = drill(&format!("{kernel}=nan"));
    let d = lz.dispatch(&args).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.selection().kernel, kernel, "a poisoned kernel still runs");
    assert!(d.outputs["out"].to_f64_vec().iter().all(|v| v.is_nan()));
}

#[test]
fn a_fault_naming_nothing_in_the_catalog_is_refused() {
    let err = LayerZero::detected().and_then(|lz| lz.with_faults("no.such.kernel=error")).err();
    let msg = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains("LAYERZERO_FAULTS") && msg.contains("no.such.kernel"), "{msg}");
    assert!(LayerZero::detected().and_then(|lz| lz.with_faults("")).is_ok_and(|lz| lz.faults().is_none()));
}
