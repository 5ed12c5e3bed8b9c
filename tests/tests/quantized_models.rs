//! Models whose projections are quantized at load (`lz generate --weights int8|int4`): the
//! quantized kernels are selected and dispatched for every projection, the logits stay within
//! each format's declared bound of the dense model's, and the load keeps no dense copy.

use layerzero::LayerZero;
use layerzero::model::op::Op;
use layerzero::model::w4::ActQuant;
use layerzero_llm::{self as llm, Model, WeightQuant};
use layerzero_tests::{TestResult, repo_root};

/// Worst |logit - dense logit| over the dense logits' largest magnitude, per format, on the
/// tiny random models below (measured at most 0.032 for int8 and 0.41 for int4: uniform
/// random weights have no structure for a 4-bit grid to fit; the 125M model's figures are
/// in the README).
const BOUND_INT8: f64 = 0.05;
const BOUND_INT4: f64 = 0.6;

fn logits_and_ops(model: &Model, lz: &LayerZero) -> TestResult<(Vec<f64>, Vec<Op>)> {
    let mut s = llm::Session::new(model, lz, 16)?;
    let prompt = [1, 17, 42, 99, 3, 250, 7, 64];
    let mut logits = s.forward(&prompt, true)?.to_f64_vec();
    logits.extend(s.forward(&[5], true)?.to_f64_vec());
    Ok((logits, s.take_stats().into_keys().collect()))
}

fn relative_error(got: &[f64], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
    got.iter().zip(want).fold(0f64, |m, (a, b)| m.max((a - b).abs())) / scale
}

#[test]
fn quantized_projections_run_their_kernels_and_keep_the_logits_within_the_declared_bound() -> TestResult {
    let lz = LayerZero::detected()?;
    for name in ["llama-gqa", "qwen2", "qwen3"] {
        let dir = repo_root().join("tests/models").join(name);
        let dense = Model::load(&dir, None)?;
        let (want, dense_ops) = logits_and_ops(&dense, &lz)?;
        assert!(!dense_ops.contains(&Op::LinearInt4) && !dense_ops.contains(&Op::LinearW8a8), "{name}: {dense_ops:?}");
        for (quant, bound, op) in [
            (WeightQuant::Int8 { group: 32 }, BOUND_INT8, Op::LinearW8a8),
            (WeightQuant::int4(32), BOUND_INT4, Op::LinearInt4),
            (WeightQuant::Int4 { group: 32, activations: ActQuant::F32 }, BOUND_INT4, Op::LinearInt4),
        ] {
            let model = Model::load_with(&dir, None, llm::Residence::Resident, Some(quant))?;
            let layer = &model.weights.layers[0];
            assert!(layer.q.dense().is_none() && layer.o.dense().is_none(), "{name} {quant}");
            // q/k/v and gate/up stacked, for a decode step's one projection each.
            assert!(layer.qkv.is_some() && layer.gate_up.is_some(), "{name} {quant}");
            let (got, ops) = logits_and_ops(&model, &lz)?;
            assert!(ops.contains(&op), "{name} {quant}: {op} never ran: {ops:?}");
            assert_eq!(
                ops.contains(&Op::Quantize),
                matches!(quant, WeightQuant::Int8 { .. }),
                "{name} {quant}: {ops:?}"
            );
            let err = relative_error(&got, &want);
            assert!(err <= bound, "{name} {quant}: logits error {err:.4} over the bound {bound}");
            assert!(err > 0.0, "{name} {quant}: the logits are the dense model's exactly; nothing was quantized");
        }
    }
    Ok(())
}

#[test]
fn quantized_projections_are_smaller_and_the_bad_group_sizes_are_refused_by_name() -> TestResult {
    let dir = repo_root().join("tests/models/llama-gqa");
    let bytes = |m: &Model| -> usize {
        let l = &m.weights.layers[0];
        [&l.q, &l.k, &l.v, &l.o].iter().map(|p| p.bytes()).sum()
    };
    let dense = bytes(&Model::load(&dir, None)?);
    let int8 = bytes(&Model::load_with(&dir, None, llm::Residence::Resident, Some(WeightQuant::Int8 { group: 32 }))?);
    let int4 = bytes(&Model::load_with(&dir, None, llm::Residence::Resident, Some(WeightQuant::int4(32)))?);
    assert!(int8 * 3 < dense && int4 * 6 < dense, "f32 {dense} B, int8 {int8} B, int4 {int4} B");
    // 64 input features do not divide into groups of 48.
    let e = Model::load_with(&dir, None, llm::Residence::Resident, Some(WeightQuant::int4(48)))
        .err()
        .ok_or("groups of 48 over 64 features were taken")?;
    assert!(e.to_string().contains("--group-size 48") && e.to_string().contains("q_proj"), "{e}");
    Ok(())
}

/// The dense weight a quantized projection stands for.
fn dequantized(p: &llm::Proj) -> TestResult<llm::Proj> {
    let [n, k] = p.shape();
    let values: Vec<f32> = match p {
        llm::Proj::Dense(_) => return Ok(p.clone()),
        llm::Proj::Int8 { weight, scale, group } => {
            let (w, s) = (weight.to_f32_vec(), scale.to_f32_vec());
            (0..n * k).map(|i| w[i] * s[i / group]).collect()
        }
        llm::Proj::Int4 { packed, scales, group, .. } => {
            let (b, s) = (packed.to_f64_vec(), scales.to_f32_vec());
            (0..n * k)
                .map(|i| {
                    let byte = b[i / 2] as i8 as u8;
                    let q = if i % 2 == 0 { byte & 15 } else { byte >> 4 };
                    (f32::from(q) - 8.0) * s[i / group]
                })
                .collect()
        }
    };
    Ok(llm::Proj::Dense(layerzero::tensor::HostTensor::from_f32(&[n, k], values)?))
}

#[test]
fn an_int4_model_computes_exactly_what_its_codes_and_scales_say() -> TestResult {
    // The same model with each projection replaced by its dequantized weight, run by the dense
    // kernels: the int4 kernels' logits (f32 activations) match it to f32 rounding, so the
    // error above is the format's, not the kernels'.
    let lz = LayerZero::detected()?;
    let f32_activations = WeightQuant::Int4 { group: 32, activations: ActQuant::F32 };
    for name in ["llama-gqa", "qwen2"] {
        let dir = repo_root().join("tests/models").join(name);
        let quant = Model::load_with(&dir, None, llm::Residence::Resident, Some(f32_activations))?;
        let mut widened = quant.clone();
        for l in &mut widened.weights.layers {
            (l.qkv, l.gate_up) = (None, None);
            for p in [&mut l.q, &mut l.k, &mut l.v, &mut l.o] {
                *p = dequantized(p)?;
            }
            if let llm::Ffn::Dense { gate, up, down, .. } = &mut l.ffn {
                for p in [gate, up, down] {
                    *p = dequantized(p)?;
                }
            }
        }
        let (got, _) = logits_and_ops(&quant, &lz)?;
        let (want, ops) = logits_and_ops(&widened, &lz)?;
        assert!(!ops.contains(&Op::LinearInt4), "{name}: the widened model still ran int4: {ops:?}");
        let err = relative_error(&got, &want);
        assert!(err <= 1e-4, "{name}: int4 logits {err:.2e} from the dequantized model's");
    }
    Ok(())
}

#[test]
fn lz_generate_serves_quantized_weights_and_refuses_bad_options_with_exit_2() -> TestResult {
    let dir = repo_root().join("tests/models/llama-gqa");
    let run = |extra: &[&str]| {
        layerzero_tests::lz().and_then(|mut c| {
            Ok(c.arg("generate").arg("--model").arg(&dir).args(["--prompt-ids", "1,2,3"]).args(extra).output()?)
        })
    };
    for (flags, weights, op) in [
        (&["--weights", "int8"][..], "int8 (group 32)", "linear_w8a8"),
        (&["--weights", "int4", "--group-size", "16"][..], "int4 (group 16, int8 activations)", "linear_int4"),
        (&["--weights", "int4", "--activations", "f32"][..], "int4 (group 32, f32 activations)", "linear_int4"),
    ] {
        let out = run(&[flags, &["--max-new-tokens", "3", "--json"]].concat())?;
        assert!(out.status.success(), "{flags:?}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let bad = layerzero::schema::violations(layerzero::schema::SchemaKind::GenerateReport, &v)?;
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(v["weights"], weights);
        assert!(v["ops"][op]["kernels"].as_object().is_some_and(|k| !k.is_empty()), "{flags:?}: {}", v["ops"]);
    }
    for (flags, names) in [
        (&["--weights", "q5"][..], "--weights q5"),
        (&["--weights", "int8", "--group-size", "0"][..], "--group-size 0"),
        (&["--weights", "int4", "--group-size", "7"][..], "--group-size 7"),
        (&["--weights", "int8", "--activations", "f32"][..], "--activations f32"),
    ] {
        let out = run(flags)?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(names), "{flags:?}: {err}");
    }
    Ok(())
}
