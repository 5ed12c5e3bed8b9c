//! Spec 002 §6.6, RoPE/ALiBi + attention fusion: attention that rotates q and k itself
//! (`attrs.rope`, `cpu.attention.flash` rotating rows as its engine reads them) matches the
//! unfused chain (`cpu.rope.fast`, then `cpu.attention.flash`) and the f64 oracle's chain
//! (`cpu_reference.rope.naive`, then `cpu_reference.attention.naive`) within §5's attention
//! tolerance, in both pair layouts and every scaling variant; where fusion is not eligible
//! the fused kernel's refusal names its reason and the chain runs; ALiBi over 2048 keys
//! matches the oracle.

use layerzero::compare::Category;
use layerzero::exec::args::{AttentionArgs, OpArgs, Outputs, RopeArgs};
use layerzero::model::attrs::{AttentionAttrs, RopeAttrs, RopeScaling, RopeStyle};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::policy::Policy;
use layerzero::tensor::rng::Rng;
use layerzero::tensor::{HostTensor, Storage};
use layerzero::{ErrorKind, LayerZero};
use layerzero_tests::{TestResult, close, codes};

/// A random normal tensor of `shape` in `dtype`, tagged `layout`.
fn normal(rng: &mut Rng, dtype: DType, shape: [usize; 4], layout: Layout) -> TestResult<HostTensor> {
    let values = rng.normals(shape.iter().product());
    Ok(HostTensor::from_f32_as(dtype, &shape, &values)?.with_layout(layout))
}

/// Attention of `hq` query heads over `hkv` kv heads of head dim `d`, `sq` queries against
/// `sk` keys (batch 2), q/k/v in `layout`, with `attrs`.
#[allow(clippy::too_many_arguments)]
fn attention(
    seed: u64,
    dtype: DType,
    layout: Layout,
    (sq, sk): (usize, usize),
    (hq, hkv, d): (usize, usize, usize),
    attrs: AttentionAttrs,
) -> TestResult<AttentionArgs> {
    let mut rng = Rng::new(seed);
    let shape = |s: usize, h: usize| if layout == Layout::Bhsd { [2, h, s, d] } else { [2, s, h, d] };
    Ok(AttentionArgs {
        q: normal(&mut rng, dtype, shape(sq, hq), layout)?,
        k: normal(&mut rng, dtype, shape(sk, hkv), layout)?,
        v: normal(&mut rng, dtype, shape(sk, hkv), layout)?,
        mask: None,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        attrs,
    })
}

fn positions(p: Vec<i64>) -> TestResult<HostTensor> {
    let n = p.len();
    Ok(HostTensor::new(Storage::I64(p.into()), &[n])?)
}

/// Runs kernel `id` directly (no selection) and takes its `out`.
fn run(lz: &LayerZero, id: &str, args: OpArgs) -> TestResult<HostTensor> {
    let exec = lz.registry().get(id).ok_or_else(|| format!("no executor for {id}"))?;
    let mut outs: Outputs = exec.run(&args)?;
    Ok(outs.remove("out").ok_or_else(|| format!("{id} returned no `out`"))?)
}

/// The unfused chain on kernels `rope` and `attn`: q rotated at `pos_q`, k at `pos_k`, then
/// attention without `attrs.rope`.
fn chain(
    lz: &LayerZero,
    (rope, attn): (&str, &str),
    a: &AttentionArgs,
    pos_q: Vec<i64>,
    pos_k: Vec<i64>,
) -> TestResult<HostTensor> {
    let r = a.attrs.rope.clone().ok_or("the case has no attrs.rope")?;
    let rotate = |t: &HostTensor, p: Vec<i64>| -> TestResult<HostTensor> {
        let args =
            RopeArgs { q: t.clone(), k: None, positions: Some(positions(p)?), cos: None, sin: None, attrs: r.clone() };
        run(lz, rope, OpArgs::Rope(args))
    };
    let mut plain = a.clone();
    plain.q = rotate(&a.q, pos_q)?;
    plain.k = rotate(&a.k, pos_k)?;
    plain.attrs.rope = None;
    run(lz, attn, OpArgs::Attention(plain))
}

const CPU: (&str, &str) = ("cpu.rope.fast", "cpu.attention.flash");
const ORACLE: (&str, &str) = ("cpu_reference.rope.naive", "cpu_reference.attention.naive");

/// Every scaling variant the core implements (long enough contexts engage each).
fn variants() -> Vec<(&'static str, Option<RopeScaling>)> {
    vec![
        ("default", None),
        ("linear", Some(RopeScaling::Linear { factor: 4.0 })),
        ("dynamic_ntk", Some(RopeScaling::DynamicNtk { factor: 2.0, original_max_position: 16 })),
        ("yarn", Some(RopeScaling::Yarn { factor: 4.0, original_max_position: 16, beta_fast: 32.0, beta_slow: 1.0 })),
        (
            "llama3",
            Some(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 16,
            }),
        ),
    ]
}

/// Holds the fused output of `a` to the cpu chain and the oracle's chain; returns the kernel that ran fused.
fn fused_matches_both_chains(
    lz: &LayerZero,
    what: &str,
    a: &AttentionArgs,
    sq: usize,
    sk: usize,
) -> TestResult<String> {
    let ran = lz.attention_with_rope(a)?;
    if !ran.fused() {
        return Err(format!(
            "{what}: the chain ran ({:?}); the fused kernel was refused: {:?}",
            ran.kernels, ran.fused_refused
        )
        .into());
    }
    let pos_q: Vec<i64> = (sk - sq..sk).map(|p| p as i64).collect();
    let pos_k: Vec<i64> = (0..sk).map(|p| p as i64).collect();
    let unfused = chain(lz, CPU, a, pos_q.clone(), pos_k.clone())?;
    let oracle = chain(lz, ORACLE, a, pos_q, pos_k)?;
    close::tensors(&format!("{what}: fused vs f64 chain"), Category::Attention, &oracle, &ran.out)?;
    close::tensors(&format!("{what}: unfused cpu chain vs f64 chain"), Category::Attention, &oracle, &unfused)?;
    close::tensors(&format!("{what}: fused vs unfused cpu chain"), Category::Attention, &unfused, &ran.out)?;
    Ok(ran.kernels.concat())
}

#[test]
fn section_6_6_fused_rope_attention_matches_the_chain_and_the_f64_reference_in_both_layouts() -> TestResult {
    let lz = LayerZero::host()?;
    for style in [RopeStyle::RotateHalf, RopeStyle::Interleaved] {
        for (name, scaling) in variants() {
            // Prefill (the tiled path, BSHD, causal, GQA 4:2) and a decode step (the split-KV
            // path, BHSD, rotating 16 of 32 dims).
            let rope = RopeAttrs { style, rotary_dim: None, base: None, scaling: scaling.clone() };
            let prefill = AttentionAttrs { causal: true, rope: Some(rope.clone()), ..AttentionAttrs::default() };
            let a = attention(11, DType::F32, Layout::Bshd, (40, 40), (4, 2, 32), prefill)?;
            let what = format!("{} {name} prefill", style.as_str());
            assert_eq!(fused_matches_both_chains(&lz, &what, &a, 40, 40)?, "cpu.attention.flash", "{what}");
            let partial = RopeAttrs { rotary_dim: Some(16), ..rope };
            let decode = AttentionAttrs { rope: Some(partial), ..AttentionAttrs::default() };
            let a = attention(12, DType::F32, Layout::Bhsd, (1, 40), (4, 2, 32), decode)?;
            let what = format!("{} {name} decode", style.as_str());
            assert_eq!(fused_matches_both_chains(&lz, &what, &a, 1, 40)?, "cpu.attention.flash", "{what}");
        }
        // bf16: the fused kernel rounds rotated rows to bf16 once, as the chain's rope output is.
        let rope = RopeAttrs { style, ..RopeAttrs::default() };
        let attrs = AttentionAttrs { causal: true, rope: Some(rope), ..AttentionAttrs::default() };
        let a = attention(13, DType::BF16, Layout::Bshd, (48, 64), (4, 4, 64), attrs)?;
        fused_matches_both_chains(&lz, &format!("{} bf16 prefill", style.as_str()), &a, 48, 64)?;
    }
    Ok(())
}

#[test]
fn section_6_6_packed_sequences_are_not_eligible_for_fusion_and_the_chain_runs_and_matches() -> TestResult {
    // Two sequences packed into batch 1: 3 queries over 6 keys, then 5 over 5.
    let rope = RopeAttrs { style: RopeStyle::Interleaved, ..RopeAttrs::default() };
    let attrs = AttentionAttrs { causal: true, rope: Some(rope), ..AttentionAttrs::default() };
    let mut a = attention(21, DType::F32, Layout::Bshd, (8, 11), (4, 2, 32), attrs)?;
    let mut rng = Rng::new(21);
    a.q = normal(&mut rng, DType::F32, [1, 8, 4, 32], Layout::Bshd)?;
    a.k = normal(&mut rng, DType::F32, [1, 11, 2, 32], Layout::Bshd)?;
    a.v = normal(&mut rng, DType::F32, [1, 11, 2, 32], Layout::Bshd)?;
    a.cu_seqlens_q = Some(HostTensor::new(Storage::I32(vec![0, 3, 8].into()), &[3])?);
    a.cu_seqlens_k = Some(HostTensor::new(Storage::I32(vec![0, 6, 11].into()), &[3])?);
    // The oracle, never meant to serve, is kept out so that the chain runs on the cpu kernels.
    let deny = Policy::from_json(r#"{"rules": [{"action": "deny", "kernels": "cpu_reference.*"}]}"#, "p")?;
    let lz = LayerZero::host()?.with_policy(deny)?;
    let report = lz.explain(&OpArgs::Attention(a.clone()).describe());
    assert_eq!(report.selected, None, "no attention kernel may take rope with cu_seqlens");
    assert!(codes(&report, "cpu.attention.flash")?.contains(&"FEATURES_EXCLUSIVE"), "{report:?}");
    assert!(codes(&report, "cpu_reference.attention.naive")?.contains(&"FUSED_ROPE_UNSUPPORTED"));
    let ran = lz.attention_with_rope(&a)?;
    assert!(!ran.fused());
    assert_eq!(ran.kernels, ["cpu.rope.fast", "cpu.rope.fast", "cpu.attention.flash"]);
    assert!(ran.fused_refused.iter().any(|r| r.code().as_str() == "FEATURES_EXCLUSIVE"), "{:?}", ran.fused_refused);
    // Each sequence's queries sit at the last positions of its own keys.
    let oracle = chain(&lz, ORACLE, &a, vec![3, 4, 5, 0, 1, 2, 3, 4], vec![0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4])?;
    close::tensors("packed chain vs f64 chain", Category::Attention, &oracle, &ran.out)
}

#[test]
fn section_6_6_fused_rope_with_more_queries_than_keys_is_an_invalid_request() -> TestResult {
    let rope = AttentionAttrs { rope: Some(RopeAttrs::default()), ..AttentionAttrs::default() };
    let a = attention(41, DType::F32, Layout::Bshd, (9, 8), (2, 2, 16), rope)?;
    let err = LayerZero::host()?.attention_with_rope(&a).err().ok_or("9 queries over 8 keys were accepted")?;
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("seq_q must be at most seq_k"), "{err}");
    // Refused by selection (the request), before any kernel runs.
    assert!(err.reasons().iter().any(|r| r.code().as_str() == "INVALID_REQUEST"), "{err}");
    Ok(())
}

#[test]
fn section_6_6_alibi_over_2048_keys_matches_the_f64_reference() -> TestResult {
    let lz = LayerZero::host()?;
    for (sq, layout) in [(8, Layout::Bshd), (1, Layout::Bhsd)] {
        let attrs = AttentionAttrs { causal: true, alibi: true, ..AttentionAttrs::default() };
        let a = attention(31, DType::F32, layout, (sq, 2048), (4, 4, 16), attrs)?;
        let args = OpArgs::Attention(a);
        let got = run(&lz, "cpu.attention.flash", args.clone())?;
        let want = run(&lz, "cpu_reference.attention.naive", args)?;
        close::tensors(&format!("alibi, {sq} queries over 2048 keys"), Category::Attention, &want, &got)?;
    }
    Ok(())
}
