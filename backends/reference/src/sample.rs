//! `sample`, the oracle: one token per row of logits [B, V], output `tokens` (i64 [B]).
//!
//! Semantics (shared with `cpu.sample.fast`, which must pick the same token):
//!
//! - Greedy (argmax, lowest index on ties) when `temperature` is 0, or when it is absent and
//!   no filter (`top_k` > 0, `top_p`, `min_p`) is set. Temperature 0 with a filter is greedy
//!   too: it is the limit of the tempered softmax, which every filter keeps.
//! - Otherwise, with `T` the temperature (1 when absent) and `m` the row's largest logit,
//!   each token gets the weight `w_i = exp((l_i - m) / T)` in f64 (so the largest weight is
//!   exactly 1 and `p_i = w_i / Z` with `Z` the sum of all weights in index order). When
//!   `m` is +inf the +inf logits share the mass (weight 1, others 0), the limit of softmax.
//! - The descending-probability order is the order of the logits, descending, ties by lower
//!   index: it equals the exact probability order, and ties in rounded weights cannot make
//!   two kernels disagree.
//! - Each filter keeps a prefix of that order, so the kept set is the shortest of: the first
//!   `top_k` tokens; the smallest prefix whose mass reaches `top_p` of the mass top-k left
//!   (Hugging Face's and vLLM's order: top-p sees the distribution renormalized after
//!   top-k; that mass is `Z_k`, the first `top_k` weights summed in that order, or `Z`
//!   without top-k); the tokens with `p_i >= min_p * p_max`, i.e. `w_i >= min_p` (a ratio,
//!   unchanged by renormalization); the tokens of nonzero weight.
//! - With `S` the kept weights summed in that order and `u = uniform(seed, row)` in [0, 1),
//!   the token is the first kept one whose running sum exceeds `u * S` (the last kept one if
//!   rounding leaves none).
//! - `uniform(seed, row)` is element `row` of the SplitMix64 stream keyed by `mix(seed)`:
//!   counter-based, so a row's draw depends only on (seed, row), never on thread count or
//!   the order rows are visited. The seed defaults to 0.
//!
//! Validation: logits rank 2 and a float dtype; a NaN logit is an error naming its row and
//! column; a row whose logits are all -inf cannot be sampled; temperature finite and >= 0;
//! 0 < top_p <= 1; 0 <= min_p <= 1.

use std::sync::Arc;

use super::wrong_op;
use layerzero_core::exec::args::{OpArgs, Outputs, SampleArgs};
use layerzero_core::exec::executor::{KernelError, Registry};
use layerzero_core::model::attrs::SampleAttrs;
use layerzero_core::model::op::Op;
use layerzero_core::tensor::{HostTensor, Storage};

/// Kernel id.
pub(crate) const SAMPLE: &str = "cpu_reference.sample.naive";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        SAMPLE,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Sample(a) => sample(a),
            other => Err(wrong_op(SAMPLE, Op::Sample, other)),
        }),
    );
}

use layerzero_core::exec::check::{expect_float, expect_rank, invalid};
use layerzero_core::exec::semantics::{SamplePlan as Plan, sample_kept, sample_plan, sample_uniform as uniform};

fn plan(a: &SampleAttrs) -> Result<Plan, KernelError> {
    sample_plan(a).map_err(KernelError::InvalidInput)
}

/// `sample` over any view of the logits.
pub(crate) fn sample(a: &SampleArgs) -> Result<Outputs, KernelError> {
    let logits = &a.logits;
    expect_rank("logits", logits, 2, "[batch, vocab]")?;
    expect_float("logits", logits)?;
    let plan = plan(&a.attrs)?;
    let (b, v) = (logits.shape()[0], logits.shape()[1]);
    if b > 0 && v == 0 {
        return Err(invalid(format!("tensor `logits` has shape {:?}; a row needs at least one token", logits.shape())));
    }
    let values = logits.to_f64_vec();
    let mut tokens = Vec::with_capacity(b);
    for (row, l) in values.chunks_exact(v.max(1)).take(b).enumerate() {
        tokens.push(sample_row(l, row, &plan)?);
    }
    let t = HostTensor::new(Storage::I64(tokens.into()), &[b])
        .map_err(|e| KernelError::Failed(format!("building the output: {e}")))?;
    Ok(Outputs::from([("tokens", t)]))
}

fn sample_row(l: &[f64], row: usize, plan: &Plan) -> Result<i64, KernelError> {
    if let Some(j) = l.iter().position(|x| x.is_nan()) {
        return Err(invalid(format!("tensor `logits` is NaN at [{row}, {j}]")));
    }
    // The lowest index holding the largest logit.
    let mut best = 0;
    for (j, &x) in l.iter().enumerate() {
        if x > l[best] {
            best = j;
        }
    }
    if plan.greedy {
        return Ok(best as i64);
    }
    if l[best] == f64::NEG_INFINITY {
        return Err(invalid(format!("row {row} of tensor `logits` is all -inf; there is no token to sample")));
    }
    let (kept, mass) = sample_kept(l, plan);
    // The largest weight is 1 >= min_p, and cap >= 1: `kept` is never empty.
    let target = uniform(plan.seed, row as u64) * mass;
    let mut run = 0.0;
    for &(i, wi) in &kept {
        run += wi;
        if run > target {
            return Ok(i as i64);
        }
    }
    Ok(kept.last().map_or(best, |&(i, _)| i) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use layerzero_core::model::dtype::DType;

    pub(crate) fn args(logits: HostTensor, attrs: SampleAttrs) -> OpArgs {
        OpArgs::Sample(SampleArgs { logits, attrs })
    }

    fn run(logits: &HostTensor, attrs: &SampleAttrs) -> Result<Vec<i64>, KernelError> {
        let mut r = Registry::new();
        register(&mut r);
        let outs = r
            .get(SAMPLE)
            .ok_or_else(|| KernelError::Failed(format!("{SAMPLE} is not registered")))?
            .run(&args(logits.clone(), attrs.clone()))?;
        assert_eq!(outs["tokens"].dtype(), DType::I64);
        Ok(outs["tokens"].to_i64_vec())
    }

    fn attrs(t: Option<f64>, k: Option<u64>, p: Option<f64>, mp: Option<f64>, seed: u64) -> SampleAttrs {
        SampleAttrs { temperature: t, top_k: k, top_p: p, min_p: mp, seed: Some(seed) }
    }

    /// The 0.999 quantile of chi-square with df degrees of freedom (df 1..=10).
    pub(crate) const CHI2_999: [f64; 10] =
        [10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588];

    /// The exact filtered, renormalized distribution, computed independently of the kernel:
    /// softmax in f64, sort by probability, top-k, renormalize, then top-p and min-p.
    pub(crate) fn exact(l: &[f64], t: f64, top_k: usize, top_p: f64, min_p: f64) -> Vec<f64> {
        let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = l.iter().map(|x| ((x - m) / t).exp()).collect();
        let z: f64 = e.iter().sum();
        let p: Vec<f64> = e.iter().map(|x| x / z).collect();
        let pmax = p.iter().cloned().fold(0.0, f64::max);
        let mut idx: Vec<usize> = (0..l.len()).collect();
        idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        let k_mass: f64 = idx.iter().take(if top_k == 0 { l.len() } else { top_k }).map(|&i| p[i]).sum();
        let mut keep = vec![false; l.len()];
        let mut cum = 0.0;
        for (rank, &i) in idx.iter().enumerate() {
            let in_k = top_k == 0 || rank < top_k;
            let in_p = cum < top_p * k_mass; // the renormalized mass before this token is below p
            let in_min = p[i] >= min_p * pmax;
            keep[i] = in_k && in_p && in_min;
            cum += p[i];
        }
        let kept: f64 = (0..l.len()).filter(|&i| keep[i]).map(|i| p[i]).sum();
        (0..l.len()).map(|i| if keep[i] { p[i] / kept } else { 0.0 }).collect()
    }

    /// Pearson's statistic of `counts` against `probs` (kept tokens only) and its degrees of
    /// freedom; asserts tokens of probability 0 never occur.
    pub(crate) fn chi_square(counts: &[u64], probs: &[f64], what: &str) -> (f64, usize) {
        let n: u64 = counts.iter().sum();
        let mut stat = 0.0;
        let mut cells = 0;
        for (i, (&c, &p)) in counts.iter().zip(probs).enumerate() {
            if p == 0.0 {
                assert_eq!(c, 0, "{what}: token {i} is outside the kept set but was drawn {c} times");
                continue;
            }
            let e = p * n as f64;
            assert!(e >= 5.0, "{what}: expected count {e} of token {i} is too small for the test");
            stat += (c as f64 - e).powi(2) / e;
            cells += 1;
        }
        (stat, cells - 1)
    }

    pub(crate) const LOGITS8: [f32; 8] = [0.5, 2.0, -1.0, 1.2, 0.1, 1.5, -0.3, 0.9];

    /// (name, temperature, top_k, top_p, min_p) of the distribution tests.
    /// (name, temperature, top_k, top_p, min_p).
    type Setting = (&'static str, Option<f64>, Option<u64>, Option<f64>, Option<f64>);

    pub(crate) const SETTINGS: [Setting; 6] = [
        ("temperature 0.7", Some(0.7), None, None, None),
        ("top_k 3", None, Some(3), None, None),
        ("top_p 0.8", None, None, Some(0.8), None),
        ("min_p 0.2", None, None, None, Some(0.2)),
        ("combined t 0.8, top_k 5, top_p 0.9, min_p 0.05", Some(0.8), Some(5), Some(0.9), Some(0.05)),
        ("combined t 1.3, top_k 6, min_p 0.1", Some(1.3), Some(6), None, Some(0.1)),
    ];

    pub(crate) fn exact_for(s: &Setting) -> Vec<f64> {
        let l: Vec<f64> = LOGITS8.iter().map(|&x| f64::from(x)).collect();
        exact(&l, s.1.unwrap_or(1.0), s.2.unwrap_or(0) as usize, s.3.unwrap_or(1.0), s.4.unwrap_or(0.0))
    }

    #[test]
    fn greedy_picks_the_argmax_and_the_lowest_index_on_ties() -> TestResult {
        let l = HostTensor::from_f32(&[3, 4], vec![0.1, 3.0, -2.0, 2.9, 5.0, 1.0, 5.0, 5.0, -1.0, -1.0, -1.0, -1.0])?;
        let greedy = SampleAttrs::default();
        assert_eq!(run(&l, &greedy)?, vec![1, 0, 0]);
        // Temperature 0 is greedy even with filters; seeds do not matter.
        assert_eq!(run(&l, &attrs(Some(0.0), Some(3), Some(0.5), None, 7))?, vec![1, 0, 0]);
        // top_k = 1 is greedy.
        for seed in 0..20 {
            assert_eq!(run(&l, &attrs(Some(1.5), Some(1), None, None, seed))?, vec![1, 0, 0]);
        }
        // A strided (transposed) view reads the same values.
        let lt = HostTensor::from_f32(&[4, 2], vec![0.0, 1.0, 7.0, 7.0, 2.0, 9.0, 7.0, 3.0])?;
        let view = lt.permute(&[1, 0])?;
        assert_eq!(run(&view, &greedy)?, vec![1, 2]);
        // -0.0 and 0.0 tie.
        let z = HostTensor::from_f32(&[1, 3], vec![-1.0, -0.0, 0.0])?;
        assert_eq!(run(&z, &greedy)?, vec![1]);
        Ok(())
    }

    #[test]
    fn bad_inputs_are_errors_naming_the_value() -> TestResult {
        let mut v = vec![0.0f32; 6];
        v[4] = f32::NAN;
        let l = HostTensor::from_f32(&[2, 3], v)?;
        let e = run(&l, &SampleAttrs::default()).err().ok_or("a NaN logit must be refused")?;
        assert!(matches!(&e, KernelError::InvalidInput(m) if m.contains("[1, 1]")), "{e}");
        let ok = HostTensor::from_f32(&[1, 3], vec![0.0, 1.0, 2.0])?;
        for (a, what) in [
            (attrs(Some(-1.0), None, None, None, 0), "temperature"),
            (attrs(Some(f64::NAN), None, None, None, 0), "temperature"),
            (attrs(None, None, Some(0.0), None, 0), "top_p"),
            (attrs(None, None, Some(1.5), None, 0), "top_p"),
            (attrs(None, None, None, Some(-0.1), 0), "min_p"),
            (attrs(None, None, None, Some(1.1), 0), "min_p"),
        ] {
            let e = run(&ok, &a).err().ok_or_else(|| format!("a bad {what} must be refused"))?;
            assert!(matches!(&e, KernelError::InvalidInput(m) if m.contains(what)), "{e}");
        }
        let inf = HostTensor::from_f32(&[1, 2], vec![f32::NEG_INFINITY; 2])?;
        assert!(matches!(run(&inf, &attrs(Some(1.0), None, None, None, 0)), Err(KernelError::InvalidInput(_))));
        assert_eq!(run(&inf, &SampleAttrs::default())?, vec![0]);
        let rank1 = HostTensor::from_f32(&[3], vec![0.0; 3])?;
        assert!(matches!(run(&rank1, &SampleAttrs::default()), Err(KernelError::InvalidInput(_))));
        let ints = HostTensor::new(Storage::I32(vec![1, 2].into()), &[1, 2])?;
        assert!(matches!(run(&ints, &SampleAttrs::default()), Err(KernelError::InvalidInput(_))));
        let empty = HostTensor::from_f32(&[2, 0], vec![])?;
        assert!(matches!(run(&empty, &SampleAttrs::default()), Err(KernelError::InvalidInput(_))));
        let none = HostTensor::from_f32(&[0, 5], vec![])?;
        assert_eq!(run(&none, &attrs(Some(1.0), None, None, None, 0))?, Vec::<i64>::new());
        // The wrong op.
        let mut r = Registry::new();
        register(&mut r);
        let other = OpArgs::Silu(layerzero_core::exec::args::SiluArgs { x: ok, attrs: Default::default() });
        assert!(matches!(
            r.get(SAMPLE).ok_or("sample is not registered")?.run(&other),
            Err(KernelError::Unsupported(_))
        ));
        Ok(())
    }

    #[test]
    fn infinite_logits_take_the_mass() -> TestResult {
        let l = HostTensor::from_f32(&[1, 4], vec![1.0, f32::INFINITY, 3.0, f32::INFINITY])?;
        let mut seen = [0; 4];
        for seed in 0..200 {
            seen[run(&l, &attrs(Some(1.0), None, None, None, seed))?[0] as usize] += 1;
        }
        assert_eq!(seen[0] + seen[2], 0);
        assert!(seen[1] > 50 && seen[3] > 50, "{seen:?}");
        Ok(())
    }

    #[test]
    fn the_same_seed_gives_the_same_tokens_and_rows_draw_independently() -> TestResult {
        let l = HostTensor::from_f32(&[64, 8], LOGITS8.repeat(64))?;
        let a = attrs(Some(1.0), None, None, None, 42);
        let first = run(&l, &a)?;
        assert_eq!(first, run(&l, &a)?);
        // Identical rows draw different tokens.
        let distinct: std::collections::BTreeSet<_> = first.iter().collect();
        assert!(distinct.len() >= 4, "{first:?}");
        // Another seed, other tokens.
        assert_ne!(first, run(&l, &attrs(Some(1.0), None, None, None, 43))?);
        // A row's draw depends only on (seed, row).
        let row5 = HostTensor::from_f32(&[6, 8], LOGITS8.repeat(6))?;
        assert_eq!(run(&row5, &a)?[5], first[5]);
        // The default seed is 0.
        let mut unseeded = a.clone();
        unseeded.seed = None;
        assert_eq!(run(&l, &unseeded)?, run(&l, &attrs(Some(1.0), None, None, None, 0))?);
        Ok(())
    }

    #[test]
    fn uniform_is_in_the_unit_interval_and_looks_uniform() {
        let n = 100_000;
        let mut bins = [0u64; 10];
        for i in 0..n {
            let u = uniform(i / 7, i % 7);
            assert!((0.0..1.0).contains(&u));
            bins[(u * 10.0) as usize] += 1;
        }
        let (stat, df) = chi_square(&bins, &[0.1; 10], "uniform");
        assert!(stat < CHI2_999[df - 1], "chi-square {stat} with {df} df");
    }

    #[test]
    fn draws_follow_the_filtered_distribution() -> TestResult {
        const N: u64 = 20_000;
        let l = HostTensor::from_f32(&[1, 8], LOGITS8.to_vec())?;
        for s in &SETTINGS {
            let probs = exact_for(s);
            // Over seeds (one row each).
            let mut counts = [0u64; 8];
            for seed in 0..N {
                counts[run(&l, &attrs(s.1, s.2, s.3, s.4, seed))?[0] as usize] += 1;
            }
            let (stat, df) = chi_square(&counts, &probs, s.0);
            println!("reference {}: chi-square {stat:.2}, df {df}, 0.999 quantile {}", s.0, CHI2_999[df - 1]);
            assert!(stat < CHI2_999[df - 1], "{}: chi-square {stat} with {df} df; counts {counts:?}", s.0);
            // Over rows (one seed).
            let rows = HostTensor::from_f32(&[N as usize, 8], LOGITS8.repeat(N as usize))?;
            let mut counts = [0u64; 8];
            for t in run(&rows, &attrs(s.1, s.2, s.3, s.4, 1234))? {
                counts[t as usize] += 1;
            }
            let (stat, df) = chi_square(&counts, &probs, s.0);
            println!("reference {} (rows): chi-square {stat:.2}, df {df}", s.0);
            assert!(stat < CHI2_999[df - 1], "{} over rows: chi-square {stat} with {df} df", s.0);
        }
        Ok(())
    }
}
