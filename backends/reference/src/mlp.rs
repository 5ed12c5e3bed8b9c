//! `mlp` of the `cpu_reference` backend: `out = (act(x @ w_gate^T) * (x @ w_up^T)) @
//! w_down^T`, every product and the activation in f64, rounded once to x's dtype.

use std::sync::Arc;

use layerzero_core::exec::args::{MlpArgs, OpArgs, Outputs};
use layerzero_core::exec::executor::{KernelError, Registry};
use layerzero_core::model::op::Op;
use layerzero_core::tensor::HostTensor;

use super::{from_f64_as, wrong_op};

/// MLP kernel id.
pub const MLP: &str = "cpu_reference.mlp.naive";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        MLP,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Mlp(a) => mlp(a).map(|t| Outputs::from([("out", t)])),
            other => Err(wrong_op(MLP, Op::Mlp, other)),
        }),
    );
}

use super::activation::activate;

/// `mlp` in f64, rounded once to x's dtype.
pub fn mlp(a: &MlpArgs) -> Result<HostTensor, KernelError> {
    let (lead, m, h, i) = a.dims()?;
    let x = a.x.to_f64_vec();
    let (wg, wu, wd) = (a.w_gate.to_f64_vec(), a.w_up.to_f64_vec(), a.w_down.to_f64_vec());
    let act = a.attrs.activation;
    let mut out = vec![0.0f64; m * h];
    let mut hidden = vec![0.0f64; i];
    for r in 0..m {
        let xr = &x[r * h..(r + 1) * h];
        for (j, hv) in hidden.iter_mut().enumerate() {
            let g: f64 = xr.iter().zip(&wg[j * h..(j + 1) * h]).map(|(a, b)| a * b).sum();
            let u: f64 = xr.iter().zip(&wu[j * h..(j + 1) * h]).map(|(a, b)| a * b).sum();
            *hv = activate(act, g) * u;
        }
        for (c, o) in out[r * h..(r + 1) * h].iter_mut().enumerate() {
            *o = hidden.iter().zip(&wd[c * i..(c + 1) * i]).map(|(a, b)| a * b).sum();
        }
    }
    let mut shape = lead;
    shape.push(h);
    from_f64_as(a.x.dtype(), &shape, &out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use layerzero_core::model::attrs::Activation;
    use layerzero_core::model::attrs::MlpAttrs;
    use layerzero_core::model::dtype::DType;

    #[test]
    fn activations_known_values() {
        let close = |a: f64, b: f64| assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{a} vs {b}");
        close(activate(Activation::Silu, 1.0), 0.731_058_578_630_004_9);
        close(activate(Activation::Gelu, 1.0), 0.841_344_746_068_542_9);
        close(activate(Activation::Gelu, -1.0), -0.158_655_253_931_457_05);
        close(activate(Activation::GeluTanh, 1.0), 0.841_191_990_607_477_2);
        assert_eq!(activate(Activation::Gelu, 0.0), 0.0);
    }

    #[test]
    fn hand_computed_mlp_and_shape_errors() -> TestResult {
        // H = 2, I = 1: gate = x0 + x1, up = x0 - x1, out = [h, 2h].
        let x = HostTensor::from_f32(&[1, 2], vec![2.0, 1.0])?;
        let args = MlpArgs {
            x,
            w_gate: HostTensor::from_f32(&[1, 2], vec![1.0, 1.0])?,
            w_up: HostTensor::from_f32(&[1, 2], vec![1.0, -1.0])?,
            w_down: HostTensor::from_f32(&[2, 1], vec![1.0, 2.0])?,
            attrs: MlpAttrs { activation: Activation::Silu },
        };
        let h = 3.0 / (1.0 + (-3.0f64).exp());
        assert_eq!(mlp(&args)?.to_f32_vec(), vec![h as f32, (2.0 * h) as f32]);
        let mut bad = args.clone();
        bad.w_down = HostTensor::from_f32(&[1, 2], vec![1.0, 2.0])?;
        assert!(
            matches!(mlp(&bad), Err(KernelError::InvalidInput(m)) if m.contains("`w_down`") && m.contains("[2, 1]"))
        );
        let mut bad = args.clone();
        bad.x = HostTensor::zeros(DType::F32, &[1, 3])?;
        assert!(matches!(mlp(&bad), Err(KernelError::InvalidInput(m)) if m.contains("`w_gate`")));
        Ok(())
    }
}
