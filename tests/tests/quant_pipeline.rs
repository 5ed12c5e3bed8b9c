//! Spec 002 §6.5: a quantized pipeline, embedding -> rms norm -> 4-bit linear (nf4 q/k/v
//! projection) -> attention -> 4-bit linear (nvfp4 head) -> sampling, dispatched on this CPU
//! and held to the f64 `cpu_reference` chain within the error bound the capability file
//! declares for the quantized kernel (read from the catalog, never restated here).

use std::cell::RefCell;

use layerzero::capabilities::spec::ErrorBound;
use layerzero::exec::args::{AttentionArgs, EmbeddingArgs, Int4Args, NormArgs, OpArgs, Outputs, SampleArgs};
use layerzero::model::attrs::{AttentionAttrs, Int4Attrs, NoAttrs, NormAttrs, SampleAttrs};
use layerzero::model::w4::W4Format;
use layerzero::tensor::rng::Rng;
use layerzero::tensor::{HostTensor, Storage};
use layerzero::{DType, LayerZero, Layout};
use layerzero_tests::TestResult;

const VOCAB: usize = 64;
const HIDDEN: usize = 64;
const HEADS: usize = 4;
const HEAD_DIM: usize = HIDDEN / HEADS;
const TOKENS: usize = 6;
const QUANTIZED: &str = "cpu.linear_int4.fast";

/// A tiny decoder's weights, the projections stored 4-bit.
struct Model {
    table: HostTensor,
    norm: HostTensor,
    /// nf4 [3 * HIDDEN, HIDDEN], absmax per 64.
    qkv: (HostTensor, HostTensor),
    /// nvfp4 [VOCAB, HIDDEN]: e4m3 scales per 16 and a global scale.
    head: (HostTensor, HostTensor, HostTensor),
}

fn random_codes(rng: &mut Rng, rows: usize, k: usize) -> TestResult<HostTensor> {
    // Any byte is two valid codes in every format.
    let bytes: Vec<i8> = (0..rows * k / 2).map(|_| rng.below(256) as u8 as i8).collect();
    Ok(HostTensor::new(Storage::I8(bytes.into()), &[rows, k / 2])?)
}

fn uniform(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<f32> {
    (0..n).map(|_| (lo + (hi - lo) * rng.uniform()) as f32).collect()
}

fn model() -> TestResult<Model> {
    let mut rng = Rng::new(65);
    let table = HostTensor::from_f32(&[VOCAB, HIDDEN], rng.normals(VOCAB * HIDDEN))?;
    let norm = HostTensor::from_f32(&[HIDDEN], uniform(&mut rng, HIDDEN, 0.75, 1.25))?;
    let qkv_scales = HostTensor::from_f32(&[3 * HIDDEN, 1], uniform(&mut rng, 3 * HIDDEN, 0.2, 0.4))?;
    let qkv = (random_codes(&mut rng, 3 * HIDDEN, HIDDEN)?, qkv_scales);
    let head_scales = uniform(&mut rng, VOCAB * HIDDEN / 16, 0.03, 0.08);
    let head_scales = HostTensor::from_f32_as(DType::Fp8E4M3, &[VOCAB, HIDDEN / 16], &head_scales)?;
    let global = HostTensor::from_f32(&[1], vec![1.5])?;
    let head = (random_codes(&mut rng, VOCAB, HIDDEN)?, head_scales, global);
    Ok(Model { table, norm, qkv, head })
}

/// What one pass produced, stage by stage, with the inputs of the quantized stages.
struct Pass {
    normed: HostTensor,
    qkv: HostTensor,
    attended: HostTensor,
    logits: HostTensor,
    tokens: HostTensor,
}

fn nf4_args(m: &Model, x: HostTensor) -> Int4Args {
    Int4Args {
        x,
        weight: m.qkv.0.clone(),
        scales: m.qkv.1.clone(),
        zeros: None,
        bias: None,
        global_scale: None,
        attrs: Int4Attrs::of(W4Format::Nf4, HIDDEN as u64),
    }
}

fn nvfp4_args(m: &Model, x: HostTensor) -> Int4Args {
    Int4Args {
        x,
        weight: m.head.0.clone(),
        scales: m.head.1.clone(),
        zeros: None,
        bias: None,
        global_scale: Some(m.head.2.clone()),
        attrs: Int4Attrs::of(W4Format::Nvfp4, 16),
    }
}

/// One pass of `ids` with every op run by `run`.
fn pass(m: &Model, ids: &HostTensor, run: &dyn Fn(OpArgs) -> TestResult<Outputs>) -> TestResult<Pass> {
    let out = |args: OpArgs, name: &str| -> TestResult<HostTensor> {
        run(args)?.remove(name).ok_or_else(|| format!("no output `{name}`").into())
    };
    let embedded =
        out(OpArgs::Embedding(EmbeddingArgs { ids: ids.clone(), table: m.table.clone(), attrs: NoAttrs {} }), "out")?;
    let norm =
        NormArgs { x: embedded, weight: m.norm.clone(), bias: None, residual: None, attrs: NormAttrs::default() };
    let normed = out(OpArgs::RmsNorm(norm), "out")?;
    let qkv = out(OpArgs::LinearInt4(nf4_args(m, normed.clone())), "out")?.contiguous();
    // q, k and v are views of the projection [S, 3 * HIDDEN]: BSHD with a row stride of 3 * HIDDEN.
    let part = |i: usize| -> TestResult<HostTensor> {
        let shape = [1, TOKENS, HEADS, HEAD_DIM];
        let strides = [TOKENS * 3 * HIDDEN, 3 * HIDDEN, HEAD_DIM, 1];
        Ok(qkv.view(&shape, &strides, i * HIDDEN)?.with_layout(Layout::Bshd))
    };
    let attrs = AttentionAttrs { causal: true, ..AttentionAttrs::default() };
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let attn = AttentionArgs { q, k, v, mask: None, cu_seqlens_q: None, cu_seqlens_k: None, attrs };
    let attended = out(OpArgs::Attention(attn), "out")?.contiguous();
    let rows = HostTensor::from_f32(&[TOKENS, HIDDEN], attended.to_f32_vec())?;
    let logits = out(OpArgs::LinearInt4(nvfp4_args(m, rows.clone())), "out")?;
    let greedy = SampleArgs { logits: logits.clone(), attrs: SampleAttrs::default() };
    let tokens = out(OpArgs::Sample(greedy), "tokens")?;
    Ok(Pass { normed, qkv, attended: rows, logits, tokens })
}

fn bound(lz: &LayerZero) -> TestResult<ErrorBound> {
    let i = lz.catalog().find(QUANTIZED).ok_or("no quantized kernel in the catalog")?;
    let spec = lz.catalog().kernel(i).1;
    let bounds = spec.properties.error_bound.as_ref().ok_or("no error_bound declared")?;
    Ok(*bounds.get(&DType::F32).ok_or("no f32 error_bound declared")?)
}

/// The worst |got - want| / (atol + rtol |want|) over the elements (<= 1 is within).
fn worst(bound: ErrorBound, want: &HostTensor, got: &HostTensor) -> f64 {
    let allowed = |r: f64| (bound.atol + bound.rtol * r.abs()).max(f64::MIN_POSITIVE);
    want.to_f64_vec().into_iter().zip(got.to_f64_vec()).map(|(r, o)| (o - r).abs() / allowed(r)).fold(0.0, f64::max)
}

#[test]
fn section_6_5_a_quantized_pipeline_runs_end_to_end_within_the_declared_bound() -> TestResult {
    let lz = LayerZero::detected()?;
    let bound = bound(&lz)?;
    let m = model()?;
    let ids = HostTensor::new(Storage::I64(vec![3, 17, 42, 5, 63, 0].into()), &[TOKENS])?;
    let chosen = RefCell::new(Vec::new());
    let dispatched = |args: OpArgs| -> TestResult<Outputs> {
        let d = lz.dispatch(&args)?;
        chosen.borrow_mut().push((args.op(), d.selection().kernel.clone()));
        Ok(d.outputs)
    };
    let registry = lz.registry();
    let reference = |args: OpArgs| -> TestResult<Outputs> {
        let id = format!("cpu_reference.{}.naive", args.op());
        Ok(registry.get(&id).ok_or_else(|| format!("no {id}"))?.run(&args)?)
    };
    let ours = pass(&m, &ids, &dispatched)?;
    let oracle = pass(&m, &ids, &reference)?;
    // The 4-bit stages ran on the quantized kernel the bound is declared for.
    let quantized: Vec<_> = chosen.borrow().iter().filter(|(op, _)| op.as_str() == "linear_int4").cloned().collect();
    assert_eq!(quantized.len(), 2, "{:?}", chosen.borrow());
    assert!(quantized.iter().all(|(_, k)| k == QUANTIZED), "{quantized:?}");
    // Each quantized stage, on the dispatched chain's own input, within its declared bound.
    let stage_qkv = reference(OpArgs::LinearInt4(nf4_args(&m, ours.normed.clone())))?["out"].clone();
    let stage_head = reference(OpArgs::LinearInt4(nvfp4_args(&m, ours.attended.clone())))?["out"].clone();
    let checks = [
        ("nf4 q/k/v projection (own input)", &stage_qkv, &ours.qkv),
        ("nvfp4 head (own input)", &stage_head, &ours.logits),
        // And the chain end to end: norm and attention in f32 do not push it past the bound.
        ("q/k/v through the chain", &oracle.qkv, &ours.qkv),
        ("attention through the chain", &oracle.attended, &ours.attended),
        ("logits through the chain", &oracle.logits, &ours.logits),
    ];
    for (what, want, got) in checks {
        let w = worst(bound, want, got);
        eprintln!("{what}: worst |d| / bound = {w:.3} ({bound:?})");
        assert!(w <= 1.0, "{what}: outside the declared {bound:?} (worst ratio {w})");
    }
    assert_eq!(ours.tokens.to_i64_vec(), oracle.tokens.to_i64_vec(), "greedy tokens");
    // Not a constant: the logits spread, so the tokens compared mean something.
    let logits = oracle.logits.to_f64_vec();
    let spread = logits.iter().cloned().fold(f64::MIN, f64::max) - logits.iter().cloned().fold(f64::MAX, f64::min);
    assert!(spread > 1.0, "logits spread only {spread}");
    Ok(())
}
