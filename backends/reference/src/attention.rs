//! Dense attention, the oracle: for every query row, score every visible key in f64,
//! softmax, and sum the value rows. The meaning of each option is `exec::semantics`.
//!
//! With `cu_seqlens_q`/`cu_seqlens_k` a mask is indexed by the packed positions: it
//! broadcasts to [N, Hq, total_q, total_k] and sequence `n`'s row `i`, key `j` read
//! `mask[n, h, cu_q[n] + i, cu_k[n] + j]`. Packed rows outside every sequence are zeros.

use super::{Heads, from_f64_as, index_values, zeros_for};
use layerzero_core::exec::args::AttentionArgs;
use layerzero_core::exec::check::{expect_float, invalid};
use layerzero_core::exec::executor::KernelError;
use layerzero_core::exec::semantics::{alibi_distance, alibi_slopes, softmax_scale, visible_keys};
use layerzero_core::model::attrs::AttentionAttrs;
use layerzero_core::model::dtype::DType;
use layerzero_core::tensor::HostTensor;

/// The score of query row `i` and key `j` before any mask: scaled, soft-capped, then
/// ALiBi-biased (`slope` is the head's ALiBi slope, ignored without `attrs.alibi`).
#[inline]
#[allow(clippy::too_many_arguments)]
pub(crate) fn score(
    dot: f64,
    scale: f64,
    a: &AttentionAttrs,
    slope: f64,
    i: usize,
    j: usize,
    seq_q: usize,
    seq_k: usize,
) -> f64 {
    let mut s = scale * dot;
    if let Some(c) = a.softcap {
        s = c * (s / c).tanh();
    }
    if a.alibi {
        s -= slope * alibi_distance(i, j, seq_q, seq_k);
    }
    s
}

/// `sum_j softmax(s)_j * value(j, d)` for `d < dv` over the `(key, score)` pairs. Scores of
/// -inf drop out; with no finite score the row is zeros (never NaN). A NaN score (from a
/// NaN input) propagates, as it should from an oracle.
pub(crate) fn softmax_weighted_sum(
    scores: &[(usize, f64)],
    dv: usize,
    value: impl Fn(usize, usize) -> f64,
) -> Vec<f64> {
    let mut out = vec![0.0f64; dv];
    let max = scores.iter().map(|&(_, s)| s).fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY && !scores.iter().any(|(_, s)| s.is_nan()) {
        return out;
    }
    let weights: Vec<(usize, f64)> = scores.iter().map(|&(j, s)| (j, (s - max).exp())).collect();
    let total: f64 = weights.iter().map(|&(_, w)| w).sum();
    for (d, o) in out.iter_mut().enumerate() {
        *o = weights.iter().map(|&(j, w)| w * value(j, d)).sum::<f64>() / total;
    }
    out
}

/// A mask read with broadcasting over [B, Hq, Sq, Sk] (trailing dims aligned, as NumPy).
struct Mask<'a> {
    t: &'a HostTensor,
    is_bool: bool,
    /// For each of the 4 full dims: the mask dim it maps to, or None when broadcast.
    dims: [Option<usize>; 4],
}

impl<'a> Mask<'a> {
    fn new(t: &'a HostTensor, full: [usize; 4]) -> Result<Mask<'a>, KernelError> {
        let is_bool = match t.dtype() {
            DType::Bool => true,
            d if d.is_float() => false,
            other => {
                return Err(invalid(format!(
                    "tensor `mask` has dtype {other}; a mask is bool (keep) or float (additive)"
                )));
            }
        };
        let rank = t.rank();
        let cannot = || {
            invalid(format!(
                "tensor `mask` shape {:?} does not broadcast to [batch, heads, seq_q, seq_k] = {full:?}",
                t.shape()
            ))
        };
        if rank > 4 {
            return Err(cannot());
        }
        let mut dims = [None; 4];
        for (m, &size) in t.shape().iter().enumerate() {
            let f = 4 - rank + m;
            if size == full[f] && size != 1 {
                dims[f] = Some(m);
            } else if size != 1 {
                return Err(cannot());
            }
        }
        Ok(Mask { t, is_bool, dims })
    }

    /// The additive bias of element [b, h, i, j]: None removes the key.
    fn bias(&self, full: [usize; 4]) -> Option<f64> {
        let mut idx = [0usize; 4];
        let rank = self.t.rank();
        for (f, m) in self.dims.iter().enumerate() {
            if let Some(m) = *m {
                idx[m] = full[f];
            }
        }
        let v = self.t.at(&idx[..rank]);
        if self.is_bool { (v != 0.0).then_some(0.0) } else { Some(v) }
    }
}

/// One sequence of the batch: where its queries and keys are and which mask batch it reads.
struct Segment {
    qb: usize,
    q0: usize,
    sq: usize,
    kb: usize,
    k0: usize,
    sk: usize,
    mask_b: usize,
}

/// Offsets `cu` ([N+1], non-decreasing, within `0..=total`) of a packed tensor.
fn offsets(name: &str, t: &HostTensor, total: usize) -> Result<Vec<usize>, KernelError> {
    if t.rank() != 1 || t.shape()[0] == 0 {
        return Err(invalid(format!("tensor `{name}` has shape {:?}; expected [num_sequences + 1]", t.shape())));
    }
    let cu = index_values(name, t)?;
    let mut prev = 0i64;
    for (n, &c) in cu.iter().enumerate() {
        if c < prev || c > total as i64 {
            return Err(invalid(format!(
                "{name}[{n}] = {c}; offsets must be non-decreasing, start at 0 or more and stay within the {total} packed tokens"
            )));
        }
        prev = c;
    }
    Ok(cu.into_iter().map(|c| c as usize).collect())
}

/// Dense attention (see `AttentionArgs`): output in q's layout with head dim Dv, q's dtype.
pub fn attention(args: &AttentionArgs) -> Result<HostTensor, KernelError> {
    let a = &args.attrs;
    a.check()?;
    if a.rope.is_some() {
        // The oracle of fused RoPE is the chain: `rope`, then this kernel.
        return Err(KernelError::Unsupported(
            "attrs.rope: the reference attention takes q and k already rotated".into(),
        ));
    }
    for (name, t) in [("q", &args.q), ("k", &args.k), ("v", &args.v)] {
        expect_float(name, t)?;
    }
    let q = Heads::new("q", &args.q)?;
    let k = Heads::new("k", &args.k)?;
    let v = Heads::new("v", &args.v)?;
    if k.d != q.d {
        return Err(invalid(format!("k head_dim {} != q head_dim {}", k.d, q.d)));
    }
    if (v.b, v.s, v.h) != (k.b, k.s, k.h) {
        return Err(invalid(format!(
            "v [batch, seq, heads] = [{}, {}, {}] != k's [{}, {}, {}]",
            v.b, v.s, v.h, k.b, k.s, k.h
        )));
    }
    if k.h == 0 || q.h % k.h != 0 {
        return Err(invalid(format!("q heads {} are not a multiple of kv heads {}", q.h, k.h)));
    }
    let group = q.h / k.h;

    let segments: Vec<Segment> = match (&args.cu_seqlens_q, &args.cu_seqlens_k) {
        (None, None) => {
            if k.b != q.b {
                return Err(invalid(format!("k batch {} != q batch {}", k.b, q.b)));
            }
            (0..q.b).map(|b| Segment { qb: b, q0: 0, sq: q.s, kb: b, k0: 0, sk: k.s, mask_b: b }).collect()
        }
        (Some(cq), Some(ck)) => {
            if q.b != 1 || k.b != 1 {
                return Err(invalid(format!(
                    "ragged attention packs sequences into batch 1; q batch is {}, k/v batch is {}",
                    q.b, k.b
                )));
            }
            let cq = offsets("cu_seqlens_q", cq, q.s)?;
            let ck = offsets("cu_seqlens_k", ck, k.s)?;
            if cq.len() != ck.len() {
                return Err(invalid(format!(
                    "cu_seqlens_q has {} entries and cu_seqlens_k {}; they must describe the same sequences",
                    cq.len(),
                    ck.len()
                )));
            }
            (0..cq.len() - 1)
                .map(|n| Segment {
                    qb: 0,
                    q0: cq[n],
                    sq: cq[n + 1] - cq[n],
                    kb: 0,
                    k0: ck[n],
                    sk: ck[n + 1] - ck[n],
                    mask_b: n,
                })
                .collect()
        }
        (Some(_), None) | (None, Some(_)) => {
            return Err(invalid("ragged attention needs both `cu_seqlens_q` and `cu_seqlens_k`; one is missing"));
        }
    };

    let full = [segments.len(), q.h, q.s, k.s];
    let mask = args.mask.as_ref().map(|m| Mask::new(m, full)).transpose()?;
    let scale = softmax_scale(a, q.d);
    let slopes = if a.alibi { alibi_slopes(q.h) } else { vec![0.0; q.h] };
    let dv = v.d;
    let mut out = zeros_for(&q.out_shape(dv))?;

    for seg in &segments {
        for h in 0..q.h {
            let hk = h / group;
            for i in 0..seg.sq {
                let (lo, hi) = visible_keys(i, seg.sq, seg.sk, a);
                let mut scores = Vec::with_capacity(hi - lo);
                for j in lo..hi {
                    let bias = match &mask {
                        Some(m) => match m.bias([seg.mask_b, h, seg.q0 + i, seg.k0 + j]) {
                            Some(b) => b,
                            None => continue,
                        },
                        None => 0.0,
                    };
                    let dot: f64 =
                        (0..q.d).map(|d| q.at(seg.qb, seg.q0 + i, h, d) * k.at(seg.kb, seg.k0 + j, hk, d)).sum();
                    scores.push((j, score(dot, scale, a, slopes[h], i, j, seg.sq, seg.sk) + bias));
                }
                let row = softmax_weighted_sum(&scores, dv, |j, d| v.at(seg.kb, seg.k0 + j, hk, d));
                for (d, x) in row.into_iter().enumerate() {
                    out[q.out_index(seg.qb, seg.q0 + i, h, d, dv)] = x;
                }
            }
        }
    }
    Ok(from_f64_as(args.q.dtype(), &q.out_shape(dv), &out)?.with_layout(q.layout()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::test_util::{close, tensor, values};
    use layerzero_core::model::attrs::CausalAlignment;
    use layerzero_core::model::layout::Layout;

    fn args(q: HostTensor, k: HostTensor, v: HostTensor, attrs: AttentionAttrs) -> AttentionArgs {
        AttentionArgs { q, k, v, mask: None, cu_seqlens_q: None, cu_seqlens_k: None, attrs }
    }

    fn run(q: &HostTensor, k: &HostTensor, v: &HostTensor, attrs: AttentionAttrs) -> TestResult<Vec<f32>> {
        Ok(attention(&args(q.clone(), k.clone(), v.clone(), attrs))?.to_f32_vec())
    }

    /// BSHD [b, s, h, d] -> a contiguous BHSD copy.
    fn to_bhsd(t: &HostTensor) -> TestResult<HostTensor> {
        Ok(t.permute(&[0, 2, 1, 3])?.contiguous().with_layout(Layout::Bhsd))
    }

    fn causal() -> AttentionAttrs {
        AttentionAttrs { causal: true, ..Default::default() }
    }

    #[test]
    fn one_key_returns_v_exactly() -> TestResult {
        let q = tensor(&[2, 3, 4, 8], 1, Layout::Bshd)?;
        let k = tensor(&[2, 1, 2, 8], 2, Layout::Bshd)?;
        let v = tensor(&[2, 1, 2, 5], 3, Layout::Bshd)?;
        let out = attention(&args(q, k, v.clone(), AttentionAttrs::default()))?;
        assert_eq!(out.shape(), &[2, 3, 4, 5]);
        assert_eq!(out.layout(), Some(Layout::Bshd));
        for b in 0..2 {
            for i in 0..3 {
                for h in 0..4 {
                    for d in 0..5 {
                        assert_eq!(out.at(&[b, i, h, d]), v.at(&[b, 0, h / 2, d]));
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn uniform_scores_average_v() -> TestResult {
        let q = tensor(&[1, 2, 1, 4], 1, Layout::Bshd)?;
        let k = HostTensor::from_f32(&[1, 3, 1, 4], [0.5f32, -1.0, 2.0, 0.25].repeat(3))?;
        let v = HostTensor::from_f32(&[1, 3, 1, 2], vec![1.0, 10.0, 2.0, 20.0, 6.0, 60.0])?;
        close(&run(&q, &k, &v, AttentionAttrs::default())?, &[3.0, 30.0, 3.0, 30.0], 1e-5);
        Ok(())
    }

    #[test]
    fn hand_computed_scores_with_scale_softcap_and_alibi() -> TestResult {
        // One head, D = 1, q = 1, keys 2 and 0: dots 2, 0.
        let q = HostTensor::from_f32(&[1, 1, 1, 1], vec![1.0])?;
        let k = HostTensor::from_f32(&[1, 2, 1, 1], vec![2.0, 0.0])?;
        let v = HostTensor::from_f32(&[1, 2, 1, 1], vec![1.0, 0.0])?;
        let softmax_first = |s0: f64, s1: f64| (s0.exp() / (s0.exp() + s1.exp())) as f32;
        let plain = run(&q, &k, &v, AttentionAttrs { scale: Some(0.5), ..Default::default() })?;
        close(&plain, &[softmax_first(1.0, 0.0)], 1e-6);
        let capped = run(&q, &k, &v, AttentionAttrs { scale: Some(0.5), softcap: Some(0.5), ..Default::default() })?;
        close(&capped, &[softmax_first(0.5 * 2f64.tanh(), 0.0)], 1e-6);
        // ALiBi, 1 head: slope 2^-8; the single query sits at key position 1 (bottom-right),
        // so key 0 is 1 away and key 1 is 0 away.
        let alibi = run(&q, &k, &v, AttentionAttrs { scale: Some(0.5), alibi: true, ..Default::default() })?;
        close(&alibi, &[softmax_first(1.0 - 2f64.powi(-8), 0.0)], 1e-6);
        Ok(())
    }

    #[test]
    fn causal_row_zero_equals_v0_and_window_zero_sees_only_itself() -> TestResult {
        let q = tensor(&[1, 4, 2, 8], 1, Layout::Bshd)?;
        let k = tensor(&[1, 4, 2, 8], 2, Layout::Bshd)?;
        let v = tensor(&[1, 4, 2, 8], 3, Layout::Bshd)?;
        let out = attention(&args(q.clone(), k.clone(), v.clone(), causal()))?;
        for h in 0..2 {
            for d in 0..8 {
                assert!((out.at(&[0, 0, h, d]) - v.at(&[0, 0, h, d])).abs() < 1e-7);
            }
        }
        let own = AttentionAttrs { causal: true, window_left: Some(0), ..Default::default() };
        close(&run(&q, &k, &v, own)?, &v.to_f32_vec(), 1e-7);
        Ok(())
    }

    #[test]
    fn causal_alignments_for_cross_attention() -> TestResult {
        // Sq = 2, Sk = 3: top-left row 0 sees key 0 only; bottom-right row 1 sees all keys.
        let q = tensor(&[1, 2, 1, 4], 1, Layout::Bshd)?;
        let k = tensor(&[1, 3, 1, 4], 2, Layout::Bshd)?;
        let v = tensor(&[1, 3, 1, 4], 3, Layout::Bshd)?;
        let tl = AttentionAttrs { causal: true, causal_alignment: CausalAlignment::TopLeft, ..Default::default() };
        let top_left = run(&q, &k, &v, tl)?;
        close(&top_left[..4], &v.to_f32_vec()[..4], 1e-7);
        let bottom_right = run(&q, &k, &v, causal())?;
        let full = run(&q, &k, &v, AttentionAttrs::default())?;
        close(&bottom_right[4..], &full[4..], 1e-7);
        // Sq > Sk bottom-right: the first row has no visible key and gives zeros.
        let q3 = tensor(&[1, 3, 1, 4], 4, Layout::Bshd)?;
        let k2 = tensor(&[1, 2, 1, 4], 5, Layout::Bshd)?;
        let out = run(&q3, &k2, &k2, causal())?;
        assert_eq!(&out[..4], &[0.0; 4]);
        assert!(out.iter().all(|x| x.is_finite()));
        Ok(())
    }

    #[test]
    fn fully_masked_rows_give_zeros() -> TestResult {
        let q = tensor(&[1, 2, 1, 4], 1, Layout::Bshd)?;
        let k = tensor(&[1, 3, 1, 4], 2, Layout::Bshd)?;
        let v = tensor(&[1, 3, 1, 4], 3, Layout::Bshd)?;
        let keep = HostTensor::new(
            layerzero_core::tensor::Storage::Bool(vec![false, false, false, true, true, false]),
            &[2, 3],
        )?;
        let mut a = args(q.clone(), k.clone(), v.clone(), AttentionAttrs::default());
        a.mask = Some(keep);
        let by_bool = attention(&a)?.to_f32_vec();
        assert_eq!(&by_bool[..4], &[0.0; 4]);
        let inf = f32::NEG_INFINITY;
        a.mask = Some(HostTensor::from_f32(&[1, 1, 2, 3], vec![inf, inf, inf, 0.0, 0.0, inf])?);
        let by_float = attention(&a)?.to_f32_vec();
        close(&by_float, &by_bool, 0.0);
        // Row 1 keeps keys 0 and 1: the same as attention over those two keys alone.
        let k01 = k.view(&[1, 2, 1, 4], &[12, 4, 4, 1], 0)?;
        let v01 = v.view(&[1, 2, 1, 4], &[12, 4, 4, 1], 0)?;
        close(&by_bool[4..], &run(&q, &k01, &v01, AttentionAttrs::default())?[4..], 1e-6);
        Ok(())
    }

    #[test]
    fn masks_broadcast_and_bad_masks_are_invalid_input() -> TestResult {
        let q = tensor(&[2, 3, 2, 4], 1, Layout::Bshd)?;
        let k = tensor(&[2, 5, 2, 4], 2, Layout::Bshd)?;
        let v = tensor(&[2, 5, 2, 4], 3, Layout::Bshd)?;
        let row = values(5, 9);
        let mut full = Vec::new();
        for _ in 0..2 * 2 * 3 {
            full.extend_from_slice(&row);
        }
        let mut a = args(q, k, v, AttentionAttrs::default());
        a.mask = Some(HostTensor::from_f32(&[5], row.clone())?);
        let broadcast = attention(&a)?.to_f32_vec();
        a.mask = Some(HostTensor::from_f32(&[2, 2, 3, 5], full)?);
        close(&attention(&a)?.to_f32_vec(), &broadcast, 0.0);
        // A stride-0 (expanded) view broadcasts the same way.
        let base = HostTensor::from_f32(&[5], row)?;
        a.mask = Some(base.view(&[2, 2, 3, 5], &[0, 0, 0, 1], 0)?);
        close(&attention(&a)?.to_f32_vec(), &broadcast, 0.0);
        a.mask = Some(HostTensor::from_f32(&[3, 4], vec![0.0; 12])?);
        let err = attention(&a).err().ok_or("a mask that cannot broadcast must be refused")?;
        assert!(matches!(&err, KernelError::InvalidInput(m) if m.contains("[3, 4]") && m.contains("[2, 2, 3, 5]")));
        a.mask = Some(HostTensor::new(layerzero_core::tensor::Storage::I32(vec![1; 5].into()), &[5])?);
        assert!(matches!(attention(&a), Err(KernelError::InvalidInput(_))));
        Ok(())
    }

    #[test]
    fn bhsd_bshd_and_permuted_views_agree() -> TestResult {
        let q = tensor(&[2, 5, 4, 8], 1, Layout::Bshd)?;
        let k = tensor(&[2, 6, 2, 8], 2, Layout::Bshd)?;
        let v = tensor(&[2, 6, 2, 3], 3, Layout::Bshd)?;
        let attrs = AttentionAttrs { causal: true, alibi: true, softcap: Some(2.0), window_left: Some(3), ..causal() };
        let bshd = attention(&args(q.clone(), k.clone(), v.clone(), attrs.clone()))?;
        let bhsd = attention(&args(to_bhsd(&q)?, to_bhsd(&k)?, to_bhsd(&v)?, attrs.clone()))?;
        assert_eq!(bhsd.shape(), &[2, 4, 5, 3]);
        assert_eq!(bhsd.layout(), Some(Layout::Bhsd));
        close(&bhsd.permute(&[0, 2, 1, 3])?.to_f32_vec(), &bshd.to_f32_vec(), 1e-6);
        // BHSD storage seen through a permuted BSHD-shaped view: strided reads.
        let view =
            |t: &HostTensor| -> TestResult<_> { Ok(to_bhsd(t)?.permute(&[0, 2, 1, 3])?.with_layout(Layout::Bshd)) };
        let strided = attention(&args(view(&q)?, view(&k)?, view(&v)?, attrs))?;
        assert!(!view(&q)?.is_contiguous());
        close(&strided.to_f32_vec(), &bshd.to_f32_vec(), 0.0);
        Ok(())
    }

    #[test]
    fn gqa_equals_mha_with_repeated_kv() -> TestResult {
        let q = tensor(&[1, 4, 6, 4], 1, Layout::Bshd)?;
        let k = tensor(&[1, 5, 2, 4], 2, Layout::Bshd)?;
        let v = tensor(&[1, 5, 2, 4], 3, Layout::Bshd)?;
        let repeat = |t: &HostTensor| -> TestResult<_> {
            let mut out = Vec::new();
            for s in 0..5 {
                for h in 0..6 {
                    for d in 0..4 {
                        out.push(t.at(&[0, s, h / 3, d]) as f32);
                    }
                }
            }
            Ok(HostTensor::from_f32(&[1, 5, 6, 4], out)?)
        };
        let attrs = AttentionAttrs { alibi: true, ..causal() };
        close(&run(&q, &k, &v, attrs.clone())?, &run(&q, &repeat(&k)?, &repeat(&v)?, attrs)?, 0.0);
        Ok(())
    }

    #[test]
    fn cu_seqlens_equal_running_sequences_separately() -> TestResult {
        let (lq, lk) = ([2usize, 0, 3], [4usize, 1, 3]);
        let q = tensor(&[1, 5, 2, 4], 1, Layout::Bshd)?;
        let k = tensor(&[1, 8, 1, 4], 2, Layout::Bshd)?;
        let v = tensor(&[1, 8, 1, 4], 3, Layout::Bshd)?;
        let attrs = AttentionAttrs { alibi: true, ..causal() };
        let mut a = args(q.clone(), k.clone(), v.clone(), attrs.clone());
        a.cu_seqlens_q = Some(HostTensor::new(layerzero_core::tensor::Storage::I32(vec![0, 2, 2, 5].into()), &[4])?);
        a.cu_seqlens_k = Some(HostTensor::new(layerzero_core::tensor::Storage::I32(vec![0, 4, 5, 8].into()), &[4])?);
        let packed = attention(&a)?.to_f32_vec();
        let (mut q0, mut k0) = (0, 0);
        for n in 0..3 {
            let part = |t: &HostTensor, s0: usize, len: usize| -> TestResult<_> {
                let h = t.shape()[2];
                Ok(t.view(&[1, len, h, 4], &[t.shape()[1] * h * 4, h * 4, 4, 1], s0 * h * 4)?)
            };
            if lq[n] > 0 {
                let alone = run(&part(&q, q0, lq[n])?, &part(&k, k0, lk[n])?, &part(&v, k0, lk[n])?, attrs.clone())?;
                close(&packed[q0 * 8..(q0 + lq[n]) * 8], &alone, 0.0);
            }
            q0 += lq[n];
            k0 += lk[n];
        }
        // Offsets that decrease or run past the packed tokens are invalid input.
        a.cu_seqlens_k = Some(HostTensor::new(layerzero_core::tensor::Storage::I32(vec![0, 4, 3, 8].into()), &[4])?);
        assert!(matches!(attention(&a), Err(KernelError::InvalidInput(m)) if m.contains("cu_seqlens_k[2] = 3")));
        a.cu_seqlens_k = Some(HostTensor::new(layerzero_core::tensor::Storage::I32(vec![0, 4, 5, 9].into()), &[4])?);
        assert!(matches!(attention(&a), Err(KernelError::InvalidInput(_))));
        a.cu_seqlens_k = None;
        assert!(matches!(attention(&a), Err(KernelError::InvalidInput(_))));
        Ok(())
    }

    #[test]
    fn dtype_dropout_and_shape_errors() -> TestResult {
        let q = tensor(&[1, 2, 2, 4], 1, Layout::Bshd)?;
        let k = tensor(&[1, 3, 2, 4], 2, Layout::Bshd)?;
        let qb = HostTensor::from_f32_as(DType::BF16, &[1, 2, 2, 4], &q.to_f32_vec())?;
        let out = attention(&args(qb, k.clone(), k.clone(), AttentionAttrs::default()))?;
        assert_eq!(out.dtype(), DType::BF16);
        let dropout = AttentionAttrs { dropout_p: 0.1, ..Default::default() };
        assert!(matches!(attention(&args(q.clone(), k.clone(), k.clone(), dropout)), Err(KernelError::Unsupported(_))));
        let k3 = tensor(&[1, 3, 3, 4], 2, Layout::Bshd)?;
        assert!(matches!(
            attention(&args(q.clone(), k3.clone(), k3, AttentionAttrs::default())),
            Err(KernelError::InvalidInput(_))
        ));
        let short = tensor(&[1, 3, 2, 3], 2, Layout::Bshd)?;
        assert!(matches!(
            attention(&args(q.clone(), short.clone(), short, AttentionAttrs::default())),
            Err(KernelError::InvalidInput(_))
        ));
        let flat = HostTensor::from_f32(&[8], vec![0.0; 8])?;
        assert!(matches!(
            attention(&args(flat, k.clone(), k, AttentionAttrs::default())),
            Err(KernelError::InvalidInput(_))
        ));
        Ok(())
    }
}
