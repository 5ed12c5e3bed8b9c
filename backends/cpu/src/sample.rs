//! `sample` kernels of the `cpu` backend: `cpu.sample.fast`.
//!
//! The semantics are those of `cpu_reference.sample.naive` (see that module), and this
//! kernel picks the same token for the same seed: the weights `exp((l - m) / T)`, the mass
//! `Z` (index order) and the running sums along the descending order are the same f64
//! operations in the same order. What is faster: rows run in parallel (rayon), logits are
//! read in place when they are contiguous f32, `Z` (a full pass of exps) is computed only
//! when `top_p` needs it, tokens that min-p or underflow must drop are never ordered, and
//! the descending order is built from packed u64 keys (logit order, index) by partial
//! selection (`select_nth_unstable`) over a prefix that grows fourfold until a filter ends
//! the kept set (top_k small: one selection of k keys), with a radix sort for large prefixes.

use std::sync::Arc;

use rayon::prelude::*;

use super::pack::f32_cow;
use super::pack::invalid;
use super::wrong_op;
use layerzero_core::exec::args::{OpArgs, Outputs, SampleArgs};
use layerzero_core::exec::executor::{KernelError, Registry};
use layerzero_core::model::attrs::SampleAttrs;
use layerzero_core::tensor::{HostTensor, Storage};

/// Kernel id.
pub(crate) const SAMPLE: &str = "cpu.sample.fast";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        SAMPLE,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Sample(a) => run(a),
            other => Err(wrong_op(SAMPLE, other)),
        }),
    );
}

use layerzero_core::exec::semantics::{SamplePlan as Plan, sample_plan, sample_uniform as uniform};

fn plan(a: &SampleAttrs) -> Result<Plan, KernelError> {
    sample_plan(a).map_err(KernelError::InvalidInput)
}

/// `cpu.sample.fast`.
pub(crate) fn run(a: &SampleArgs) -> Result<Outputs, KernelError> {
    let logits = &a.logits;
    if logits.rank() != 2 {
        return Err(invalid(format!(
            "tensor `logits` has shape {:?} (rank {}); expected [batch, vocab]",
            logits.shape(),
            logits.rank()
        )));
    }
    if !logits.dtype().is_float() {
        return Err(invalid(format!("tensor `logits` has dtype {}; expected a float dtype", logits.dtype())));
    }
    let plan = plan(&a.attrs)?;
    let (b, v) = (logits.shape()[0], logits.shape()[1]);
    if b > 0 && v == 0 {
        return Err(invalid(format!("tensor `logits` has shape {:?}; a row needs at least one token", logits.shape())));
    }
    if v > u32::MAX as usize {
        return Err(KernelError::Unsupported(format!("a vocabulary of {v} tokens is more than this kernel indexes")));
    }
    let data = f32_cow(logits);
    let results: Vec<Result<i64, KernelError>> = (0..b)
        .into_par_iter()
        .map_init(Scratch::default, |s, row| sample_row(&data[row * v..(row + 1) * v], row, &plan, s))
        .collect();
    let tokens = results.into_iter().collect::<Result<Vec<i64>, KernelError>>()?;
    let t = HostTensor::new(Storage::I64(tokens.into()), &[b])
        .map_err(|e| KernelError::Failed(format!("building the output: {e}")))?;
    Ok(Outputs::from([("tokens", t)]))
}

#[derive(Default)]
struct Scratch {
    keys: Vec<u64>,
    buf: Vec<u64>,
    w: Vec<f64>,
    kept: Vec<(u32, f64)>,
}

fn sample_row(l: &[f32], row: usize, plan: &Plan, s: &mut Scratch) -> Result<i64, KernelError> {
    let mut best = 0;
    for (j, &x) in l.iter().enumerate() {
        if x.is_nan() {
            return Err(invalid(format!("tensor `logits` is NaN at [{row}, {j}]")));
        }
        if x > l[best] {
            best = j;
        }
    }
    if plan.greedy {
        return Ok(best as i64);
    }
    let m = f64::from(l[best]);
    if m == f64::NEG_INFINITY {
        return Err(invalid(format!("row {row} of tensor `logits` is all -inf; there is no token to sample")));
    }
    let t = plan.temperature;
    let weight = |x: f32| {
        let x = f64::from(x);
        if m == f64::INFINITY { if x == f64::INFINITY { 1.0 } else { 0.0 } } else { ((x - m) / t).exp() }
    };
    // The key of token i sorts as descending logit, then ascending index: the high half is
    // the complement of the logit's order-preserving bits (-0.0 made +0.0 so that it ties
    // with 0.0), the low half the index.
    let key = |i: usize, x: f32| {
        let b = (x + 0.0).to_bits();
        let ord = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
        (u64::from(!ord) << 32) | i as u64
    };
    let cap = if plan.top_k == 0 { l.len() } else { usize::try_from(plan.top_k).unwrap_or(usize::MAX).min(l.len()) };
    // The top-p threshold is a fraction of the mass top-k keeps, summed exactly as the
    // reference does: the first `cap` weights in descending order, or (without top-k) every
    // weight in index order. The weights are kept for the walk below.
    s.w.clear();
    let threshold = plan.top_p.map(|p| {
        let mut z = 0.0;
        for &x in l {
            let wi = weight(x);
            s.w.push(wi);
            z += wi;
        }
        if cap < l.len() {
            s.keys.clear();
            s.keys.extend(l.iter().enumerate().map(|(i, &x)| key(i, x)));
            s.keys.select_nth_unstable(cap - 1);
            s.keys[..cap].sort_unstable();
            z = 0.0;
            for &k in &s.keys[..cap] {
                z += s.w[k as u32 as usize];
            }
        }
        p * z
    });
    // Candidates: every token that can pass the weight checks (the others have smaller
    // logits than every candidate, so they would end the walk anyway). A token whose logit
    // is below `lo` has a weight below min_p (with a margin far above rounding) or one that
    // underflows to 0.
    let lo = if m == f64::INFINITY {
        f64::INFINITY
    } else {
        let mut lo = m - 746.0 * t;
        if plan.min_p > 0.0 {
            let ln = plan.min_p.ln();
            lo = lo.max(m + t * ln - 1e-6 * (m.abs() + t * -ln + 1.0));
        }
        lo
    };
    s.keys.clear();
    s.keys.extend(l.iter().enumerate().filter(|&(_, &x)| f64::from(x) >= lo).map(|(i, &x)| key(i, x)));
    let cap = cap.min(s.keys.len());
    s.kept.clear();
    let mut mass = 0.0;
    let mut done = 0;
    // Without top-p nearly every candidate is kept: sort them at once. With it, select a
    // prefix that grows fourfold until the mass reaches the threshold.
    let mut chunk = if threshold.is_some() { cap.min(256) } else { cap };
    'prefix: while done < cap {
        let mut end = (done + chunk).min(cap);
        if (end - done) * 4 >= cap - done {
            end = cap;
        }
        let rest = &mut s.keys[done..];
        if end - done < rest.len() {
            rest.select_nth_unstable(end - done - 1);
        }
        if end - done > 2048 {
            radix_sort(&mut s.keys[done..end], &mut s.buf, l.len());
        } else {
            s.keys[done..end].sort_unstable();
        }
        for &k in &s.keys[done..end] {
            let i = k as u32;
            let wi = if s.w.is_empty() { weight(l[i as usize]) } else { s.w[i as usize] };
            if wi <= 0.0 || wi < plan.min_p {
                break 'prefix;
            }
            s.kept.push((i, wi));
            mass += wi;
            if threshold.is_some_and(|th| mass >= th) {
                break 'prefix;
            }
        }
        done = end;
        chunk = chunk.saturating_mul(4);
    }
    let target = uniform(plan.seed, row as u64) * mass;
    let mut run = 0.0;
    for &(i, wi) in &s.kept {
        run += wi;
        if run > target {
            return Ok(i64::from(i));
        }
    }
    Ok(s.kept.last().map_or(best as i64, |&(i, _)| i64::from(i)))
}

/// Sorts keys whose low half is an index below `n` and whose high half is anything
/// (LSD radix sort, 11-bit digits, skipping the always-zero bits and the digits every key
/// shares).
fn radix_sort(keys: &mut [u64], buf: &mut Vec<u64>, n: usize) {
    const BITS: u32 = 11;
    const MASK: u64 = (1 << BITS) - 1;
    let index_bits = usize::BITS - n.saturating_sub(1).leading_zeros();
    let shifts = (0..index_bits.div_ceil(BITS)).map(|d| d * BITS).chain((0..3).map(|d| 32 + d * BITS));
    buf.clear();
    buf.resize(keys.len(), 0);
    let mut counts = vec![0usize; 1 << BITS];
    for shift in shifts {
        counts.iter_mut().for_each(|c| *c = 0);
        for &k in keys.iter() {
            counts[((k >> shift) & MASK) as usize] += 1;
        }
        if counts.contains(&keys.len()) {
            continue;
        }
        let mut sum = 0;
        for c in counts.iter_mut() {
            let here = *c;
            *c = sum;
            sum += here;
        }
        for &k in keys.iter() {
            let d = ((k >> shift) & MASK) as usize;
            buf[counts[d]] = k;
            counts[d] += 1;
        }
        keys.copy_from_slice(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use layerzero_core::model::dtype::DType;
    use layerzero_core::tensor::rng::Rng;
    use layerzero_reference as cpu_reference;

    /// (temperature, top_k, top_p, min_p).
    type Filters = (Option<f64>, Option<u64>, Option<f64>, Option<f64>);

    fn attrs(t: Option<f64>, k: Option<u64>, p: Option<f64>, mp: Option<f64>, seed: u64) -> SampleAttrs {
        SampleAttrs { temperature: t, top_k: k, top_p: p, min_p: mp, seed: Some(seed) }
    }

    fn fast(logits: &HostTensor, a: &SampleAttrs) -> Result<Vec<i64>, KernelError> {
        let mut r = Registry::new();
        register(&mut r);
        let outs = r
            .get(SAMPLE)
            .ok_or_else(|| KernelError::Failed(format!("{SAMPLE} is not registered")))?
            .run(&OpArgs::Sample(SampleArgs { logits: logits.clone(), attrs: a.clone() }))?;
        assert_eq!(outs["tokens"].dtype(), DType::I64);
        assert_eq!(outs["tokens"].shape(), &[logits.shape()[0]]);
        Ok(outs["tokens"].to_i64_vec())
    }

    fn reference(logits: &HostTensor, a: &SampleAttrs) -> Result<Vec<i64>, KernelError> {
        let mut r = Registry::new();
        cpu_reference::register(&mut r);
        let outs = r
            .get("cpu_reference.sample.naive")
            .ok_or_else(|| KernelError::Failed("cpu_reference.sample.naive is not registered".into()))?
            .run(&OpArgs::Sample(SampleArgs { logits: logits.clone(), attrs: a.clone() }))?;
        Ok(outs["tokens"].to_i64_vec())
    }

    fn random_logits(b: usize, v: usize, scale: f64, seed: u64, dtype: DType) -> TestResult<HostTensor> {
        let mut rng = Rng::new(seed);
        let vals: Vec<f32> = (0..b * v).map(|_| (rng.normal() * scale) as f32).collect();
        Ok(HostTensor::from_f32_as(dtype, &[b, v], &vals)?)
    }

    #[test]
    fn fast_picks_the_reference_tokens() -> TestResult {
        let settings: [Filters; 14] = [
            (None, None, None, None),
            (Some(1.0), None, None, None),
            (Some(0.7), None, None, None),
            (None, Some(1), None, None),
            (None, Some(5), None, None),
            (Some(1.2), Some(40), None, None),
            (None, None, Some(0.9), None),
            (Some(0.5), None, Some(0.3), None),
            (None, None, None, Some(0.1)),
            (Some(0.9), Some(20), Some(0.95), Some(0.02)),
            (Some(2.0), Some(0), Some(1.0), Some(0.0)),
            (Some(0.0), Some(3), None, None),
            (Some(0.002), None, None, None),
            (Some(0.01), None, Some(0.99), Some(0.001)),
        ];
        let mut cases = 0;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for (v, scale) in [(7usize, 1.0), (50, 2.0), (300, 4.0), (2000, 1.5), (5000, 0.5)] {
                let l = random_logits(6, v, scale, v as u64 * 31 + dtype.size_bytes(), dtype)?;
                for (si, s) in settings.iter().enumerate() {
                    // Fewer draws for the large vocabularies (the reference sorts them).
                    for seed in 0..if v >= 2000 { 3u64 } else { 12 } {
                        let a = attrs(s.0, s.1, s.2, s.3, seed * 1_000_003 + si as u64);
                        assert_eq!(fast(&l, &a)?, reference(&l, &a)?, "{dtype} v {v} {s:?} seed {seed}");
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, 3 * 14 * (3 * 12 + 2 * 3));
        // Many exact ties (a few distinct values) and -inf entries.
        let mut rng = Rng::new(5);
        let vals: Vec<f32> = (0..4 * 500)
            .map(|i| match (i % 17, rng.below(6)) {
                (0, _) => f32::NEG_INFINITY,
                // -0.0 ties with 0.0.
                (_, 0) if i % 2 == 1 => -0.0,
                (_, r) => r as f32 * 0.5 - 1.0,
            })
            .collect();
        let l = HostTensor::from_f32(&[4, 500], vals)?;
        for seed in 0..40 {
            for s in [
                attrs(None, Some(30), None, None, seed),
                attrs(Some(0.3), None, Some(0.7), None, seed),
                attrs(Some(2.0), Some(200), None, Some(0.1), seed),
            ] {
                assert_eq!(fast(&l, &s)?, reference(&l, &s)?);
            }
        }
        // A strided view.
        let l = random_logits(40, 9, 1.0, 3, DType::F32)?;
        let view = HostTensor::from_f32(&[9, 40], l.permute(&[1, 0])?.to_f32_vec())?.permute(&[1, 0])?;
        let a = attrs(Some(1.0), Some(4), Some(0.9), None, 11);
        assert_eq!(fast(&view, &a)?, reference(&l, &a)?);
        Ok(())
    }

    #[test]
    fn radix_sort_sorts() {
        let mut rng = Rng::new(4);
        for n in [1usize, 3, 2049, 5000, 70_000] {
            let mut keys: Vec<u64> = (0..n).map(|i| (rng.below(1 << 32) << 32) | i as u64).collect();
            // Many equal high halves.
            for k in keys.iter_mut().step_by(3) {
                *k &= 0xFFFF_FFFF;
            }
            let mut want = keys.clone();
            want.sort_unstable();
            radix_sort(&mut keys, &mut Vec::new(), n);
            assert_eq!(keys, want, "n {n}");
        }
    }

    #[test]
    fn tokens_do_not_depend_on_the_thread_count() -> TestResult {
        let l = random_logits(64, 1000, 2.0, 9, DType::F32)?;
        let a = attrs(Some(0.8), None, Some(0.95), None, 77);
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
        let two = rayon::ThreadPoolBuilder::new().num_threads(2).build()?;
        let t1 = one.install(|| fast(&l, &a))?;
        let t2 = two.install(|| fast(&l, &a))?;
        assert_eq!(t1, t2);
        assert_eq!(t1, fast(&l, &a)?);
        assert_eq!(t1, reference(&l, &a)?);
        Ok(())
    }

    #[test]
    fn errors_match_the_reference() -> TestResult {
        let mut v = vec![0.0f32; 6];
        v[5] = f32::NAN;
        let l = HostTensor::from_f32(&[2, 3], v)?;
        for a in [SampleAttrs::default(), attrs(Some(1.0), None, None, None, 0)] {
            let e = fast(&l, &a).err().ok_or("a NaN logit must be refused")?;
            assert_eq!(reference(&l, &a).err().as_ref(), Some(&e));
            assert!(matches!(&e, KernelError::InvalidInput(m) if m.contains("[1, 2]")), "{e}");
        }
        let ok = HostTensor::from_f32(&[1, 3], vec![0.0, 1.0, 2.0])?;
        for a in [
            attrs(Some(-1.0), None, None, None, 0),
            attrs(Some(f64::INFINITY), None, None, None, 0),
            attrs(None, None, Some(0.0), None, 0),
            attrs(None, None, Some(f64::NAN), None, 0),
            attrs(None, None, None, Some(2.0), 0),
        ] {
            assert!(matches!(fast(&ok, &a), Err(KernelError::InvalidInput(_))), "{a:?}");
        }
        let empty = HostTensor::from_f32(&[1, 0], vec![])?;
        assert!(matches!(fast(&empty, &SampleAttrs::default()), Err(KernelError::InvalidInput(_))));
        let rank3 = HostTensor::from_f32(&[1, 1, 3], vec![0.0; 3])?;
        assert!(matches!(fast(&rank3, &SampleAttrs::default()), Err(KernelError::InvalidInput(_))));
        let mut r = Registry::new();
        register(&mut r);
        let other = OpArgs::Silu(layerzero_core::exec::args::SiluArgs { x: ok, attrs: Default::default() });
        assert!(matches!(
            r.get(SAMPLE).ok_or("sample is not registered")?.run(&other),
            Err(KernelError::Unsupported(_))
        ));
        Ok(())
    }

    /// The 0.999 quantile of chi-square with df degrees of freedom (df 1..=7).
    const CHI2_999: [f64; 7] = [10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322];

    /// The exact filtered, renormalized distribution (softmax in f64; top-k, renormalize,
    /// then top-p and min-p over the probability order).
    fn exact(l: &[f64], t: f64, top_k: usize, top_p: f64, min_p: f64) -> Vec<f64> {
        let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = l.iter().map(|x| ((x - m) / t).exp()).collect();
        let z: f64 = e.iter().sum();
        let p: Vec<f64> = e.iter().map(|x| x / z).collect();
        let mut idx: Vec<usize> = (0..l.len()).collect();
        idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        let mut keep = vec![false; l.len()];
        let k_mass: f64 = idx.iter().take(if top_k == 0 { l.len() } else { top_k }).map(|&i| p[i]).sum();
        let mut before = 0.0;
        for (rank, &i) in idx.iter().enumerate() {
            keep[i] = (top_k == 0 || rank < top_k) && before < top_p * k_mass && p[i] >= min_p * p[idx[0]];
            before += p[i];
        }
        let kept: f64 = (0..l.len()).filter(|&i| keep[i]).map(|i| p[i]).sum();
        (0..l.len()).map(|i| if keep[i] { p[i] / kept } else { 0.0 }).collect()
    }

    #[test]
    fn fast_draws_follow_the_filtered_distribution() -> TestResult {
        const N: usize = 20_000;
        let logits = [0.5f32, 2.0, -1.0, 1.2, 0.1, 1.5, -0.3, 0.9];
        let settings: [(&str, Filters); 5] = [
            ("temperature 0.7", (Some(0.7), None, None, None)),
            ("top_k 3", (None, Some(3), None, None)),
            ("top_p 0.8", (None, None, Some(0.8), None)),
            ("min_p 0.2", (None, None, None, Some(0.2))),
            ("combined t 0.8, top_k 5, top_p 0.9, min_p 0.05", (Some(0.8), Some(5), Some(0.9), Some(0.05))),
        ];
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let rows = HostTensor::from_f32_as(dtype, &[N, 8], &logits.repeat(N))?;
            // The distribution of the logits as stored (rounded to the dtype).
            let l: Vec<f64> = rows.to_f64_vec()[..8].to_vec();
            for (name, s) in &settings {
                let probs =
                    exact(&l, s.0.unwrap_or(1.0), s.1.unwrap_or(0) as usize, s.2.unwrap_or(1.0), s.3.unwrap_or(0.0));
                let mut counts = [0u64; 8];
                for t in fast(&rows, &attrs(s.0, s.1, s.2, s.3, 99))? {
                    counts[t as usize] += 1;
                }
                let mut stat = 0.0;
                let mut cells = 0;
                for (i, (&c, &p)) in counts.iter().zip(&probs).enumerate() {
                    if p == 0.0 {
                        assert_eq!(c, 0, "{dtype} {name}: token {i} is outside the kept set");
                        continue;
                    }
                    let e = p * N as f64;
                    stat += (c as f64 - e).powi(2) / e;
                    cells += 1;
                }
                let df = cells - 1;
                println!("fast {dtype} {name}: chi-square {stat:.2}, df {df}, 0.999 quantile {}", CHI2_999[df - 1]);
                assert!(stat < CHI2_999[df - 1], "{dtype} {name}: chi-square {stat} with {df} df; counts {counts:?}");
            }
        }
        Ok(())
    }
}
