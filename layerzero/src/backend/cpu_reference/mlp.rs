//! `mlp` of the `cpu_reference` backend: `out = (act(x @ w_gate^T) * (x @ w_up^T)) @
//! w_down^T`, every product and the activation in f64, rounded once to x's dtype.

use std::sync::Arc;

use crate::exec::args::{MlpArgs, OpArgs, Outputs};
use crate::exec::executor::{KernelError, Registry};
use crate::model::attrs::Activation;
use crate::model::layout::Layout;
use crate::model::op::Op;
use crate::tensor::HostTensor;

use super::linear::{expect_dense_float, rows_of};
use super::{from_f64_as, invalid, wrong_op};

/// MLP kernel id.
pub const MLP: &str = "cpu_reference.mlp.naive";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        MLP,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Mlp(a) => mlp(a).map(|t| Outputs::from([("out".to_owned(), t)])),
            other => Err(wrong_op(MLP, Op::Mlp, other)),
        }),
    );
}

/// Checks the tensors of an MLP: returns (leading shape of x, M, H, I).
pub(crate) fn mlp_dims(a: &MlpArgs) -> Result<(Vec<usize>, usize, usize, usize), KernelError> {
    expect_dense_float("x", &a.x)?;
    let (lead, m, h) = rows_of("x", &a.x)?;
    for (name, t) in [("w_gate", &a.w_gate), ("w_up", &a.w_up), ("w_down", &a.w_down)] {
        expect_dense_float(name, t)?;
        if matches!(t.layout(), Some(l) if l != Layout::Nt) {
            return Err(invalid(format!(
                "tensor `{name}` has layout {}; mlp weights are [out_features, in_features] (NT)",
                t.layout().map_or("none", |l| l.as_str())
            )));
        }
    }
    let &[i, gh] = a.w_gate.shape() else {
        return Err(invalid(format!("tensor `w_gate` has shape {:?}; expected rank 2 [I, H]", a.w_gate.shape())));
    };
    if gh != h {
        return Err(invalid(format!(
            "tensor `w_gate` has shape {:?}; expected [I, H] with H = {h} from x {:?}",
            a.w_gate.shape(),
            a.x.shape()
        )));
    }
    if a.w_up.shape() != [i, h] {
        return Err(invalid(format!("tensor `w_up` has shape {:?}; expected [I, H] = [{i}, {h}]", a.w_up.shape())));
    }
    if a.w_down.shape() != [h, i] {
        return Err(invalid(format!("tensor `w_down` has shape {:?}; expected [H, I] = [{h}, {i}]", a.w_down.shape())));
    }
    m.checked_mul(i.max(h)).ok_or_else(|| invalid(format!("x {:?} with I = {i} overflows", a.x.shape())))?;
    Ok((lead, m, h, i))
}

/// erfc(z) in f64 (about 1e-13 relative or better): 1 - the Maclaurin series of erf below
/// 2, a continued fraction (modified Lentz) from 2; `2 - erfc(-z)` for negative z.
pub(crate) fn erfc(z: f64) -> f64 {
    if z.is_nan() {
        return z;
    }
    if z < 0.0 {
        return 2.0 - erfc(-z);
    }
    if z < 2.0 {
        // erf(z) = 2/sqrt(pi) * sum_n (-1)^n z^(2n+1) / (n! (2n+1)).
        let z2 = z * z;
        let (mut term, mut sum) = (z, z);
        for n in 1..200 {
            term *= -z2 / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        return 1.0 - sum * std::f64::consts::FRAC_2_SQRT_PI;
    }
    if z > 27.0 {
        return 0.0;
    }
    // erfc(z) = exp(-z^2)/sqrt(pi) * 1/(z + (1/2)/(z + 1/(z + (3/2)/(z + 2/(z + ...))))).
    let tiny = 1e-300;
    let mut f = z;
    let (mut c, mut d) = (z, 0.0f64);
    for n in 1..500 {
        let an = n as f64 / 2.0;
        d = z + an * d;
        d = if d.abs() < tiny { tiny } else { d };
        c = z + an / c;
        c = if c.abs() < tiny { tiny } else { c };
        d = 1.0 / d;
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    (-z * z).exp() / std::f64::consts::PI.sqrt() / f
}

/// The activation in f64: silu `x / (1 + e^-x)`; gelu `x/2 * erfc(-x / sqrt 2)`; gelu_tanh
/// `x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub(crate) fn activate(act: Activation, x: f64) -> f64 {
    match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::Gelu => 0.5 * x * erfc(-x / std::f64::consts::SQRT_2),
        Activation::GeluTanh => {
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            0.5 * x * (1.0 + u.tanh())
        }
    }
}

/// `mlp` in f64, rounded once to x's dtype.
pub fn mlp(a: &MlpArgs) -> Result<HostTensor, KernelError> {
    let (lead, m, h, i) = mlp_dims(a)?;
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
    use crate::model::attrs::MlpAttrs;
    use crate::model::dtype::DType;

    #[test]
    fn erfc_known_values() {
        // Reference values (Abramowitz & Stegun / mpmath).
        for (z, want) in [
            (0.0, 1.0),
            (0.5, 0.479_500_122_186_953_5),
            (1.0, 0.157_299_207_050_285_13),
            (2.0, 0.004_677_734_981_047_266),
            (3.0, 2.209_049_699_858_544e-5),
            (5.0, 1.537_459_794_428_035e-12),
            (-1.0, 1.842_700_792_949_715),
        ] {
            let got = erfc(z);
            assert!((got - want).abs() <= 1e-13 * want.abs().max(1e-300), "erfc({z}) = {got}, want {want}");
        }
        assert_eq!(erfc(30.0), 0.0);
        assert_eq!(erfc(-30.0), 2.0);
    }

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
    fn hand_computed_mlp_and_shape_errors() {
        // H = 2, I = 1: gate = x0 + x1, up = x0 - x1, out = [h, 2h].
        let x = HostTensor::from_f32(&[1, 2], vec![2.0, 1.0]).unwrap();
        let args = MlpArgs {
            x,
            w_gate: HostTensor::from_f32(&[1, 2], vec![1.0, 1.0]).unwrap(),
            w_up: HostTensor::from_f32(&[1, 2], vec![1.0, -1.0]).unwrap(),
            w_down: HostTensor::from_f32(&[2, 1], vec![1.0, 2.0]).unwrap(),
            attrs: MlpAttrs { activation: Activation::Silu },
        };
        let h = 3.0 / (1.0 + (-3.0f64).exp());
        assert_eq!(mlp(&args).unwrap().to_f32_vec(), vec![h as f32, (2.0 * h) as f32]);
        let mut bad = args.clone();
        bad.w_down = HostTensor::from_f32(&[1, 2], vec![1.0, 2.0]).unwrap();
        assert!(
            matches!(mlp(&bad), Err(KernelError::InvalidInput(m)) if m.contains("`w_down`") && m.contains("[2, 1]"))
        );
        let mut bad = args.clone();
        bad.x = HostTensor::zeros(DType::F32, &[1, 3]).unwrap();
        assert!(matches!(mlp(&bad), Err(KernelError::InvalidInput(m)) if m.contains("`w_gate`")));
    }
}
