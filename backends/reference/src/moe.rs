//! `moe_route` and `moe_experts`, the oracle.
//!
//! `moe_route`: for each token the softmax of its expert logits in f64, rounded once to f32
//! (the op's probabilities are f32; f64 is how the oracle gets them right). The top_k
//! experts are the first k of the logits' descending order, ties by lower index: that order
//! is the exact probability order, so rounding cannot reorder two experts. `experts` is
//! i32 [T, k] in that order and `weights` f32 [T, k] are their probabilities, or
//! `w_j / sum of the kept w` when `renormalize`. A NaN logit is an error naming [t, e]; a
//! token whose logits are all -inf has no distribution (error); +inf logits share the mass.
//!
//! `moe_experts`: for every token t and slot j, `e = experts[t, j]`,
//! `y = w_down[e] (act(w_gate[e] x_t) * (w_up[e] x_t))` and `out[t] += weights[t, j] * y`,
//! all in f64 and rounded once to x's dtype. Activations: silu `x / (1 + exp(-x))`, gelu
//! `0.5 x (1 + erf(x / sqrt 2))` (erf from its everywhere-positive series, to about 1e-15),
//! gelu_tanh `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.

use std::cmp::Ordering;
use std::sync::Arc;

use super::{from_f64_as, index_values, out, wrong_op, zeros_for};
use layerzero_core::exec::args::{MoeExpertsArgs, MoeRouteArgs, OpArgs, Outputs};
use layerzero_core::exec::executor::{KernelError, Registry};
use layerzero_core::model::op::Op;
use layerzero_core::tensor::{HostTensor, Storage};

/// Routing kernel id.
pub(crate) const MOE_ROUTE: &str = "cpu_reference.moe_route.naive";
/// Expert MLP kernel id.
pub(crate) const MOE_EXPERTS: &str = "cpu_reference.moe_experts.naive";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        MOE_ROUTE,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::MoeRoute(a) => moe_route(a),
            other => Err(wrong_op(MOE_ROUTE, Op::MoeRoute, other)),
        }),
    );
    registry.register(
        MOE_EXPERTS,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::MoeExperts(a) => moe_experts(a).map(out),
            other => Err(wrong_op(MOE_EXPERTS, Op::MoeExperts, other)),
        }),
    );
}

fn failed(e: impl std::fmt::Display) -> KernelError {
    KernelError::Failed(format!("building the output: {e}"))
}

/// `moe_route` over any view of the logits.
pub(crate) fn moe_route(a: &MoeRouteArgs) -> Result<Outputs, KernelError> {
    let logits = &a.logits;
    expect_rank("logits", logits, 2, "[tokens, experts]")?;
    expect_float("logits", logits)?;
    let (t, e) = (logits.shape()[0], logits.shape()[1]);
    let k = usize::try_from(a.attrs.top_k).ok().filter(|&k| k >= 1 && k <= e).ok_or_else(|| {
        invalid(format!(
            "attrs.top_k is {}; it must be in [1, {e}] (`logits` has shape {:?}: {e} experts)",
            a.attrs.top_k,
            logits.shape()
        ))
    })?;
    if i32::try_from(e).is_err() {
        return Err(KernelError::Unsupported(format!("{e} experts do not fit the i32 `experts` output")));
    }
    let values = logits.to_f64_vec();
    let mut experts = Vec::with_capacity(t * k);
    let mut weights = Vec::with_capacity(t * k);
    for (row, l) in values.chunks_exact(e).enumerate() {
        if let Some(j) = l.iter().position(|x| x.is_nan()) {
            return Err(invalid(format!("tensor `logits` is NaN at [{row}, {j}]")));
        }
        let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return Err(invalid(format!("row {row} of tensor `logits` is all -inf; it routes to no expert")));
        }
        let w: Vec<f64> = l
            .iter()
            .map(|&x| if m == f64::INFINITY { f64::from(u8::from(x == f64::INFINITY)) } else { (x - m).exp() })
            .collect();
        let z: f64 = w.iter().sum();
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|&i, &j| l[j].partial_cmp(&l[i]).unwrap_or(Ordering::Equal).then(i.cmp(&j)));
        let top = &order[..k];
        let denom = if a.attrs.renormalize { top.iter().map(|&i| w[i]).sum() } else { z };
        for &i in top {
            experts.push(i as i32);
            weights.push((w[i] / denom) as f32);
        }
    }
    let experts = HostTensor::new(Storage::I32(experts.into()), &[t, k]).map_err(failed)?;
    let weights = HostTensor::new(Storage::F32(weights.into()), &[t, k]).map_err(failed)?;
    Ok(Outputs::from([("experts", experts), ("weights", weights)]))
}

use super::activation::activate;
use layerzero_core::exec::check::{MoeDims, expect_float, expect_rank, invalid};

/// The expert ids, each checked to lie in [0, experts).
fn expert_ids(a: &MoeExpertsArgs, d: &MoeDims) -> Result<Vec<usize>, KernelError> {
    let ids = index_values("experts", &a.experts)?;
    ids.iter()
        .enumerate()
        .map(|(pos, &e)| {
            usize::try_from(e).ok().filter(|&e| e < d.experts).ok_or_else(|| {
                invalid(format!(
                    "tensor `experts` holds {e} at [{}, {}]; expert ids must be in [0, {})",
                    pos / d.slots.max(1),
                    pos % d.slots.max(1),
                    d.experts
                ))
            })
        })
        .collect()
}

/// `moe_experts` over any views of its inputs.
pub(crate) fn moe_experts(a: &MoeExpertsArgs) -> Result<HostTensor, KernelError> {
    let d = a.dims()?;
    let ids = expert_ids(a, &d)?;
    let (h, i_dim) = (d.hidden, d.inter);
    let mut out = zeros_for(&[d.tokens, h])?;
    let x = a.x.to_f64_vec();
    let weights = a.weights.to_f64_vec();
    let (wg, wu, wd) = (a.w_gate.to_f64_vec(), a.w_up.to_f64_vec(), a.w_down.to_f64_vec());
    let mut act = vec![0.0f64; i_dim];
    for t in 0..d.tokens {
        let xt = &x[t * h..(t + 1) * h];
        for j in 0..d.slots {
            let e = ids[t * d.slots + j];
            let w = weights[t * d.slots + j];
            for (i, a_i) in act.iter_mut().enumerate() {
                let row = (e * i_dim + i) * h;
                let g: f64 = (0..h).map(|c| wg[row + c] * xt[c]).sum();
                let u: f64 = (0..h).map(|c| wu[row + c] * xt[c]).sum();
                *a_i = activate(a.attrs.activation, g) * u;
            }
            for (c, o) in out[t * h..(t + 1) * h].iter_mut().enumerate() {
                let row = (e * h + c) * i_dim;
                let y: f64 = (0..i_dim).map(|i| wd[row + i] * act[i]).sum();
                *o += w * y;
            }
        }
    }
    from_f64_as(a.x.dtype(), &[d.tokens, h], &out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use layerzero_core::model::attrs::Activation;
    use layerzero_core::model::attrs::{MlpAttrs, MoeRouteAttrs};
    use layerzero_core::model::dtype::DType;

    fn route(logits: &HostTensor, top_k: u64, renormalize: bool) -> Result<(Vec<i64>, Vec<f32>), KernelError> {
        let mut r = Registry::new();
        register(&mut r);
        let args =
            OpArgs::MoeRoute(MoeRouteArgs { logits: logits.clone(), attrs: MoeRouteAttrs { top_k, renormalize } });
        let outs = r
            .get(MOE_ROUTE)
            .ok_or_else(|| KernelError::Failed(format!("{MOE_ROUTE} is not registered")))?
            .run(&args)?;
        assert_eq!(outs["experts"].dtype(), DType::I32);
        assert_eq!(outs["weights"].dtype(), DType::F32);
        Ok((outs["experts"].to_i64_vec(), outs["weights"].to_f32_vec()))
    }

    #[test]
    fn route_is_the_hand_computed_softmax_top_k() -> TestResult {
        // Row 0: logits [0, ln 2, ln 3, ln 4] -> probabilities [1, 2, 3, 4] / 10.
        // Row 1: a tie between experts 1 and 3 goes to the lower index.
        let l = HostTensor::from_f32(&[2, 4], vec![0.0, 2f32.ln(), 3f32.ln(), 4f32.ln(), 0.0, 1.0, -1.0, 1.0])?;
        let (ex, w) = route(&l, 2, false)?;
        assert_eq!(ex, vec![3, 2, 1, 3]);
        let e1 = 1f64.exp();
        let z1 = 1.0 + 2.0 * e1 + (-1f64).exp();
        let want = [0.4, 0.3, e1 / z1, e1 / z1];
        for (a, b) in w.iter().zip(want) {
            assert!((f64::from(*a) - b).abs() < 1e-7, "{w:?} vs {want:?}");
        }
        let (ex, w) = route(&l, 2, true)?;
        assert_eq!(ex, vec![3, 2, 1, 3]);
        for (a, b) in w.iter().zip([4.0 / 7.0, 3.0 / 7.0, 0.5, 0.5]) {
            assert!((f64::from(*a) - b).abs() < 1e-7, "{w:?}");
        }
        assert!((w[0] + w[1] - 1.0).abs() < 1e-6 && (w[2] + w[3] - 1.0).abs() < 1e-6);
        // top_k = E returns every expert in descending order; all weights sum to 1.
        let (ex, w) = route(&l, 4, false)?;
        assert_eq!(ex, vec![3, 2, 1, 0, 1, 3, 0, 2]);
        assert!((w[..4].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        // -inf experts are never preferred over finite ones; +inf takes the mass.
        let l = HostTensor::from_f32(&[2, 3], vec![f32::NEG_INFINITY, 0.0, 1.0, 0.0, f32::INFINITY, 5.0])?;
        let (ex, w) = route(&l, 1, false)?;
        assert_eq!((ex, w), (vec![2, 1], vec![(1.0 / (1.0 + (-1f64).exp())) as f32, 1.0]));
        Ok(())
    }

    #[test]
    fn route_rejects_bad_input() -> TestResult {
        let l = HostTensor::from_f32(&[2, 3], vec![0.0, 1.0, 2.0, 3.0, f32::NAN, 0.0])?;
        let e = route(&l, 1, false).err().ok_or("a NaN logit must be refused")?;
        assert!(matches!(&e, KernelError::InvalidInput(m) if m.contains("[1, 1]")), "{e}");
        let l = HostTensor::from_f32(&[1, 3], vec![0.0; 3])?;
        for k in [0, 4] {
            let e = route(&l, k, true).err().ok_or_else(|| format!("top_k = {k} must be refused"))?;
            assert!(matches!(&e, KernelError::InvalidInput(m) if m.contains("top_k")), "{e}");
        }
        let l = HostTensor::from_f32(&[1, 2], vec![f32::NEG_INFINITY; 2])?;
        assert!(matches!(route(&l, 1, false), Err(KernelError::InvalidInput(_))));
        let l = HostTensor::new(Storage::I32(vec![1, 2].into()), &[1, 2])?;
        assert!(matches!(route(&l, 1, false), Err(KernelError::InvalidInput(_))));
        let l = HostTensor::from_f32(&[0, 4], vec![])?;
        let (ex, w) = route(&l, 2, false)?;
        assert!(ex.is_empty() && w.is_empty());
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn experts_args(
        x: &[f32],
        t: usize,
        h: usize,
        ids: Vec<i32>,
        w: &[f32],
        k: usize,
        e: usize,
        i: usize,
        act: Activation,
    ) -> TestResult<MoeExpertsArgs> {
        let mut rng = layerzero_core::tensor::rng::Rng::new(11);
        let wg = rng.normals(e * i * h);
        let wu = rng.normals(e * i * h);
        let wd = rng.normals(e * h * i);
        Ok(MoeExpertsArgs {
            x: HostTensor::from_f32(&[t, h], x.to_vec())?,
            experts: HostTensor::new(Storage::I32(ids.into()), &[t, k])?,
            weights: HostTensor::from_f32(&[t, k], w.to_vec())?,
            w_gate: HostTensor::from_f32(&[e, i, h], wg)?,
            w_up: HostTensor::from_f32(&[e, i, h], wu)?,
            w_down: HostTensor::from_f32(&[e, h, i], wd)?,
            attrs: MlpAttrs { activation: act },
        })
    }

    #[test]
    fn experts_match_a_hand_checkable_case() -> TestResult {
        // One token, hidden 2, intermediate 1, two experts: gate/up/down are tiny matrices.
        let a = MoeExpertsArgs {
            x: HostTensor::from_f32(&[1, 2], vec![1.0, 2.0])?,
            experts: HostTensor::new(Storage::I64(vec![1, 0].into()), &[1, 2])?,
            weights: HostTensor::from_f32(&[1, 2], vec![0.75, 0.25])?,
            // expert 0: gate [1, 0], up [0, 1]; expert 1: gate [0, 1], up [1, 1].
            w_gate: HostTensor::from_f32(&[2, 1, 2], vec![1.0, 0.0, 0.0, 1.0])?,
            w_up: HostTensor::from_f32(&[2, 1, 2], vec![0.0, 1.0, 1.0, 1.0])?,
            // expert 0: down [[1], [2]]; expert 1: down [[-1], [0.5]].
            w_down: HostTensor::from_f32(&[2, 2, 1], vec![1.0, 2.0, -1.0, 0.5])?,
            attrs: MlpAttrs { activation: Activation::Silu },
        };
        let silu = |v: f64| v / (1.0 + (-v).exp());
        // expert 0: g = 1, u = 2 -> a = 2 silu(1); y = [a, 2a].
        // expert 1: g = 2, u = 3 -> a = 3 silu(2); y = [-a, a / 2].
        let (a0, a1) = (2.0 * silu(1.0), 3.0 * silu(2.0));
        let want = [0.25 * a0 - 0.75 * a1, 0.25 * 2.0 * a0 + 0.75 * 0.5 * a1];
        let got = moe_experts(&a)?.to_f64_vec();
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6 * w.abs().max(1.0), "{got:?} vs {want:?}");
        }
        Ok(())
    }

    #[test]
    fn experts_match_a_dense_per_token_computation() -> TestResult {
        let (t, h, k, e, i) = (3, 5, 2, 4, 3);
        let x = layerzero_core::tensor::rng::Rng::new(3).normals(t * h);
        let ids = vec![0, 3, 2, 2, 1, 0];
        let w = [0.6, 0.4, 0.5, 0.5, 0.9, 0.1];
        for act in [Activation::Silu, Activation::Gelu, Activation::GeluTanh] {
            let a = experts_args(&x, t, h, ids.clone(), &w, k, e, i, act)?;
            let got = moe_experts(&a)?;
            assert_eq!((got.shape(), got.dtype()), (&[t, h][..], DType::F32));
            let got = got.to_f64_vec();
            let (wg, wu, wd) = (a.w_gate.to_f64_vec(), a.w_up.to_f64_vec(), a.w_down.to_f64_vec());
            for tok in 0..t {
                let mut want = vec![0.0; h];
                for j in 0..k {
                    let ex = ids[tok * k + j] as usize;
                    // A dense MLP for this expert, written as matrix products.
                    let gate: Vec<f64> = (0..i)
                        .map(|r| (0..h).map(|c| wg[ex * i * h + r * h + c] * f64::from(x[tok * h + c])).sum())
                        .collect();
                    let up: Vec<f64> = (0..i)
                        .map(|r| (0..h).map(|c| wu[ex * i * h + r * h + c] * f64::from(x[tok * h + c])).sum())
                        .collect();
                    let hmid: Vec<f64> = gate.iter().zip(&up).map(|(&g, &u)| activate(act, g) * u).collect();
                    for (c, o) in want.iter_mut().enumerate() {
                        let y: f64 = (0..i).map(|r| wd[ex * h * i + c * i + r] * hmid[r]).sum();
                        *o += f64::from(w[tok * k + j]) * y;
                    }
                }
                for c in 0..h {
                    let g = got[tok * h + c];
                    assert!(
                        (g - want[c]).abs() <= 1e-6 * want[c].abs().max(1e-3),
                        "{act:?} [{tok}, {c}]: {g} vs {}",
                        want[c]
                    );
                }
            }
        }
        Ok(())
    }

    #[test]
    fn experts_reject_bad_input() -> TestResult {
        let x = vec![0.5f32; 2 * 4];
        let a = experts_args(&x, 2, 4, vec![0, 1, 2, 3], &[0.5; 4], 2, 3, 2, Activation::Silu)?;
        let e = moe_experts(&a).err().ok_or("an expert index past the experts must be refused")?;
        assert!(matches!(&e, KernelError::InvalidInput(m) if m.contains("[1, 1]") && m.contains(" 3 ")), "{e}");
        let mut neg = a.clone();
        neg.experts = HostTensor::new(Storage::I64(vec![0, -1, 2, 0].into()), &[2, 2])?;
        let e = moe_experts(&neg).err().ok_or("a negative expert index must be refused")?;
        assert!(matches!(&e, KernelError::InvalidInput(m) if m.contains("[0, 1]") && m.contains("-1")), "{e}");
        let mut bad = a.clone();
        bad.experts = HostTensor::new(Storage::I32(vec![0, 1, 2, 0].into()), &[2, 2])?;
        bad.w_down = HostTensor::from_f32(&[3, 2, 4], vec![0.0; 24])?;
        let e = moe_experts(&bad).err().ok_or("a w_down of the wrong shape must be refused")?;
        assert!(matches!(&e, KernelError::InvalidInput(m) if m.contains("w_down")), "{e}");
        let mut bad2 = a.clone();
        bad2.experts = HostTensor::from_f32(&[2, 2], vec![0.0; 4])?;
        assert!(matches!(moe_experts(&bad2), Err(KernelError::InvalidInput(m)) if m.contains("experts")));
        let mut bad3 = a.clone();
        bad3.weights = HostTensor::from_f32(&[2, 1], vec![0.0; 2])?;
        bad3.experts = HostTensor::new(Storage::I32(vec![0, 1, 2, 0].into()), &[2, 2])?;
        assert!(matches!(moe_experts(&bad3), Err(KernelError::InvalidInput(m)) if m.contains("weights")));
        let mut r = Registry::new();
        register(&mut r);
        assert!(matches!(
            r.get(MOE_ROUTE).ok_or("moe_route is not registered")?.run(&OpArgs::MoeExperts(a)),
            Err(KernelError::Unsupported(_))
        ));
        Ok(())
    }
}
