//! Parity of the fast kernels with the `cpu_reference` oracle (f64) on odd shapes, every
//! declared feature, strided views and every dtype; and their input errors.

use crate::TestResult;
use layerzero_core::compare::{self, Category};
use layerzero_core::exec::args::{AttentionArgs, OpArgs, Outputs, PagedAttentionArgs, RopeArgs, strided_copy};
use layerzero_core::exec::executor::{KernelError, Registry};
use layerzero_core::exec::semantics::{alibi_distance, alibi_slopes, softmax_scale, visible_keys};
use layerzero_core::model::attrs::{AttentionAttrs, CausalAlignment, RopeAttrs, RopeScaling, RopeStyle};
use layerzero_core::model::dtype::DType;
use layerzero_core::model::layout::Layout;
use layerzero_core::tensor::{HostTensor, Storage};
use layerzero_reference::attention::attention as ref_attention;
use layerzero_reference::paged::paged_attention as ref_paged;
use layerzero_reference::rope::rope as ref_rope;
use layerzero_reference::test_util::values;

use super::{attention, paged, rope};

fn t(shape: &[usize], seed: u64, dtype: DType, layout: Layout) -> TestResult<HostTensor> {
    let n = shape.iter().product();
    Ok(HostTensor::from_f32_as(dtype, shape, &values(n, seed))?.with_layout(layout))
}

/// A BSHD tensor [b, s, h, d] as a non-contiguous BHSD view (permuted).
fn bhsd_view(x: &HostTensor) -> TestResult<HostTensor> {
    Ok(x.permute(&[0, 2, 1, 3])?.with_layout(Layout::Bhsd))
}

/// The fast kernel's output, in the reference's layout and dtype, within the table's attention
/// tolerance of it.
fn assert_close(ours: &HostTensor, want: &HostTensor, what: &str) {
    assert_eq!(ours.layout(), want.layout(), "{what}: layout");
    assert!(ours.is_contiguous(), "{what}: contiguous");
    let close = compare::check_tensors(what, Category::Attention, want, ours);
    assert!(close.is_ok(), "{}", close.err().unwrap_or_default());
}

fn args(q: HostTensor, k: HostTensor, v: HostTensor, attrs: AttentionAttrs) -> AttentionArgs {
    AttentionArgs { q, k, v, mask: None, cu_seqlens_q: None, cu_seqlens_k: None, attrs }
}

/// Logical values of a BSHD/BHSD tensor in canonical [b, s, h, d] order, with its sizes.
fn canonical(x: &HostTensor) -> TestResult<(Vec<f64>, [usize; 4])> {
    let x = if x.layout() == Some(Layout::Bhsd) { x.permute(&[0, 2, 1, 3])? } else { x.clone() };
    let s = x.shape();
    Ok((x.to_f64_vec(), [s[0], s[1], s[2], s[3]]))
}

/// A plain f64 attention written here from `exec::semantics` (the reference oracle is far
/// too slow for the larger shapes in a debug build). Returns the output's logical values in
/// the output's layout order.
fn naive(a: &AttentionArgs) -> TestResult<Vec<f64>> {
    let ((q, [b, nq, hq, d]), (k, [bk, nk, hkv, _]), (v, [_, _, _, dv])) =
        (canonical(&a.q)?, canonical(&a.k)?, canonical(&a.v)?);
    let segs: Vec<(usize, usize, usize, usize, usize, usize, usize)> = match (&a.cu_seqlens_q, &a.cu_seqlens_k) {
        (Some(cq), Some(ck)) => {
            let (cq, ck) = (cq.to_i64_vec(), ck.to_i64_vec());
            (0..cq.len() - 1)
                .map(|n| {
                    (
                        0,
                        cq[n] as usize,
                        (cq[n + 1] - cq[n]) as usize,
                        0,
                        ck[n] as usize,
                        (ck[n + 1] - ck[n]) as usize,
                        n,
                    )
                })
                .collect()
        }
        _ => (0..b).map(|bb| (bb, 0, nq, bb, 0, nk, bb)).collect(),
    };
    let _ = bk;
    let mask = a.mask.as_ref().map(|m| (m.to_f64_vec(), m.shape().to_vec(), m.dtype() == DType::Bool));
    let full = [segs.len(), hq, nq, nk];
    let bias = |idx: [usize; 4]| -> Option<f64> {
        let Some((vals, shape, is_bool)) = &mask else { return Some(0.0) };
        let r = shape.len();
        let mut flat = 0;
        for (m, &size) in shape.iter().enumerate() {
            let f = 4 - r + m;
            let i = if size == 1 { 0 } else { idx[f] };
            flat = flat * size + i;
        }
        let _ = full;
        let x = vals[flat];
        if *is_bool { (x != 0.0).then_some(0.0) } else { Some(x) }
    };
    let scale = softmax_scale(&a.attrs, d);
    let slopes = alibi_slopes(hq);
    let g = hq / hkv;
    let mut out = vec![0f64; b * nq * hq * dv];
    for &(qb, q0, sq, kb, k0, sk, mb) in &segs {
        for h in 0..hq {
            for i in 0..sq {
                let (lo, hi) = visible_keys(i, sq, sk, &a.attrs);
                let mut scores = Vec::new();
                for j in lo..hi {
                    let Some(bv) = bias([mb, h, q0 + i, k0 + j]) else { continue };
                    let qrow = &q[((qb * nq + q0 + i) * hq + h) * d..][..d];
                    let krow = &k[((kb * nk + k0 + j) * hkv + h / g) * d..][..d];
                    let dot: f64 = qrow.iter().zip(krow).map(|(x, y)| x * y).sum();
                    let mut s = scale * dot;
                    if let Some(c) = a.attrs.softcap {
                        s = c * (s / c).tanh();
                    }
                    if a.attrs.alibi {
                        s -= slopes[h] * alibi_distance(i, j, sq, sk);
                    }
                    scores.push((j, s + bv));
                }
                let mx = scores.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
                if mx == f64::NEG_INFINITY {
                    continue;
                }
                let w: Vec<(usize, f64)> = scores.iter().map(|&(j, s)| (j, (s - mx).exp())).collect();
                let total: f64 = w.iter().map(|x| x.1).sum();
                let o = &mut out[((qb * nq + q0 + i) * hq + h) * dv..][..dv];
                for &(j, wj) in &w {
                    let vrow = &v[((kb * nk + k0 + j) * hkv + h / g) * dv..][..dv];
                    for (od, &vd) in o.iter_mut().zip(vrow) {
                        *od += wj / total * vd;
                    }
                }
            }
        }
    }
    if a.q.layout() == Some(Layout::Bhsd) {
        let mut o2 = vec![0f64; out.len()];
        for bb in 0..b {
            for s in 0..nq {
                for h in 0..hq {
                    for dd in 0..dv {
                        o2[((bb * hq + h) * nq + s) * dv + dd] = out[((bb * nq + s) * hq + h) * dv + dd];
                    }
                }
            }
        }
        out = o2;
    }
    Ok(out)
}

/// The fast kernel's output within the table's attention tolerance of values computed in f64.
fn close_values(ours: &HostTensor, want: &[f64], what: &str) {
    let close = compare::check(what, Category::Attention, ours.dtype(), want, &ours.to_f64_vec());
    assert!(close.is_ok(), "{}", close.err().unwrap_or_default());
}

/// Ours against the naive f64 attention, and against the reference oracle when it is cheap.
fn check(a: &AttentionArgs, what: &str) -> TestResult {
    let ours = attention::run(a, &mut Outputs::new()).map_err(|e| format!("{what}: {e}"))?;
    let cost = a.q.numel() * a.k.shape()[..3].iter().product::<usize>() / a.q.shape()[0].max(1);
    if cost <= 400_000 {
        assert_close(&ours["out"], &ref_attention(a)?, what);
    }
    close_values(&ours["out"], &naive(a)?, what);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn dense(
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    dv: usize,
    dtype: DType,
) -> TestResult<AttentionArgs> {
    let q = t(&[b, sq, hq, d], 1, dtype, Layout::Bshd)?;
    let k = t(&[b, sk, hkv, d], 2, dtype, Layout::Bshd)?;
    let v = t(&[b, sk, hkv, dv], 3, dtype, Layout::Bshd)?;
    Ok(args(q, k, v, AttentionAttrs::default()))
}

fn causal() -> AttentionAttrs {
    AttentionAttrs { causal: true, ..Default::default() }
}

#[test]
fn self_attention_odd_lengths_head_dims_and_gqa() -> TestResult {
    let cases = [
        (1, 64, 4, 4),
        (7, 80, 8, 2),
        (63, 96, 8, 1),
        (130, 128, 8, 2),
        (130, 64, 4, 4),
        (63, 256, 8, 1),
        (7, 256, 4, 1),
        (130, 80, 8, 1),
    ];
    for (s, d, hq, hkv) in cases {
        for attrs in [AttentionAttrs::default(), causal()] {
            let mut a = dense(if s > 63 { 1 } else { 2 }, s, s, hq, hkv, d, d, DType::F32)?;
            a.attrs = attrs.clone();
            check(&a, &format!("s={s} d={d} hq={hq} hkv={hkv} causal={}", attrs.causal))?;
        }
    }
    Ok(())
}

#[test]
fn cross_attention_both_alignments_and_different_v_dim() -> TestResult {
    for (sq, sk) in [(7, 130), (130, 63), (63, 7), (5, 1), (1, 130), (3, 200)] {
        for align in [CausalAlignment::BottomRight, CausalAlignment::TopLeft] {
            for is_causal in [false, true] {
                let mut a = dense(1, sq, sk, 8, 2, 64, 48, DType::F32)?;
                a.attrs = AttentionAttrs { causal: is_causal, causal_alignment: align, ..Default::default() };
                check(&a, &format!("sq={sq} sk={sk} {align:?} causal={is_causal}"))?;
            }
        }
    }
    Ok(())
}

#[test]
fn windows_alibi_softcap_and_scale() -> TestResult {
    let variants = [
        AttentionAttrs { causal: true, window_left: Some(16), ..Default::default() },
        AttentionAttrs { window_left: Some(5), ..Default::default() },
        AttentionAttrs { causal: true, window_left: Some(0), ..Default::default() },
        AttentionAttrs { causal: true, alibi: true, ..Default::default() },
        AttentionAttrs { alibi: true, softcap: Some(20.0), scale: Some(0.3), ..Default::default() },
        AttentionAttrs { causal: true, softcap: Some(5.0), ..Default::default() },
        AttentionAttrs { causal: true, scale: Some(1.7), window_left: Some(40), alibi: true, ..Default::default() },
    ];
    for (n, attrs) in variants.iter().enumerate() {
        for (sq, sk) in [(130, 130), (2, 130), (63, 100)] {
            // 12 heads (ALiBi's non-power-of-two slopes), GQA 4.
            let mut a = dense(1, sq, sk, 12, 3, 64, 64, DType::F32)?;
            a.attrs = attrs.clone();
            check(&a, &format!("variant {n} sq={sq} sk={sk}"))?;
        }
    }
    Ok(())
}

#[test]
fn masks_bool_and_float_broadcast_with_causal() -> TestResult {
    let (b, sq, sk, hq) = (2, 63, 70, 4);
    let keep: Vec<bool> = (0..sq * sk).map(|i| (i * 7919) % 5 != 0).collect();
    let bool_mask = HostTensor::new(Storage::Bool(keep), &[sq, sk])?;
    let float_mask = t(&[b, 1, sq, sk], 9, DType::F32, Layout::Bshd)?;
    let mut full_row_masked = vec![true; hq * 2 * sk];
    full_row_masked[..sk].fill(false); // head 0, row 0: nothing visible
    let small = HostTensor::new(Storage::Bool(full_row_masked), &[1, hq, 2, sk])?;
    for mask in [bool_mask, float_mask, t(&[sk], 4, DType::BF16, Layout::Bshd)?] {
        for attrs in [AttentionAttrs::default(), causal()] {
            let mut a = dense(b, sq, sk, hq, 2, 80, 80, DType::F32)?;
            a.mask = Some(mask.clone());
            a.attrs = attrs;
            check(&a, &format!("mask {:?} {:?}", mask.dtype(), mask.shape()))?;
        }
    }
    for sq in [2, 66] {
        let mut a = dense(1, 2, sk, hq, 1, 64, 64, DType::F32)?;
        if sq != 2 {
            a = dense(1, sq, sk, hq, 1, 64, 64, DType::F32)?;
        }
        a.mask = Some(if sq == 2 { small.clone() } else { HostTensor::new(Storage::Bool(vec![false; sk]), &[sk])? });
        let out = attention::run(&a, &mut Outputs::new())?["out"].to_f32_vec();
        if sq == 2 {
            assert!(out[..64].iter().all(|&x| x == 0.0));
        } else {
            assert!(out.iter().all(|&x| x == 0.0));
        }
        check(&a, "fully masked rows")?;
    }
    Ok(())
}

#[test]
fn varlen_packed_sequences_with_causal_and_mask() -> TestResult {
    let (tq, tk) = (200, 260);
    let cq = HostTensor::new(Storage::I32(vec![0, 5, 5, 70, 200].into()), &[5])?;
    let ck = HostTensor::new(Storage::I32(vec![0, 9, 12, 90, 260].into()), &[5])?;
    for attrs in
        [AttentionAttrs::default(), causal(), AttentionAttrs { causal: true, alibi: true, ..Default::default() }]
    {
        let mut a = dense(1, tq, tk, 8, 2, 64, 64, DType::F32)?;
        a.cu_seqlens_q = Some(cq.clone());
        a.cu_seqlens_k = Some(ck.clone());
        a.attrs = attrs;
        check(&a, "varlen")?;
        a.mask = Some(t(&[4, 1, tq, tk], 5, DType::F32, Layout::Bshd)?);
        check(&a, "varlen with mask")?;
    }
    // A gap (rows 3..5 belong to no sequence) gives zeros; i64 offsets work.
    let mut a = dense(1, 9, 9, 2, 2, 16, 16, DType::F32)?;
    a.cu_seqlens_q = Some(HostTensor::new(Storage::I64(vec![0, 3, 3].into()), &[3])?);
    a.cu_seqlens_k = Some(HostTensor::new(Storage::I64(vec![0, 4, 9].into()), &[3])?);
    check(&a, "varlen gap")?;
    Ok(())
}

#[test]
fn bhsd_strided_views_and_half_dtypes() -> TestResult {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for attrs in [causal(), AttentionAttrs::default()] {
            let base = dense(if dtype == DType::F32 { 2 } else { 1 }, 63, 130, 8, 2, 96, 96, dtype)?;
            // BHSD permuted views of BSHD storage.
            let a = args(bhsd_view(&base.q)?, bhsd_view(&base.k)?, bhsd_view(&base.v)?, attrs.clone());
            check(&a, &format!("bhsd view {dtype}"))?;
            // Padded strides (BSHD) and a mix of layouts.
            let q = strided_copy(&base.q, &[63 * 8 * 100 + 11, 8 * 100, 100, 1])?;
            let k = strided_copy(&base.k, &[130 * 2 * 97 + 3, 2 * 97, 97, 1])?;
            let a = args(q, k, bhsd_view(&base.v)?, attrs.clone());
            check(&a, &format!("padded strides {dtype}"))?;
            // Head dim not unit-stride (a transposed view of the last two dims).
            let kt = base.k.contiguous();
            let kv = kt
                .view(&[base.q.shape()[0], 130, 2, 96], &[130 * 2 * 96, 1, 130 * 96, 130], 0)?
                .with_layout(Layout::Bshd);
            let a = args(base.q.clone(), kv, base.v.clone(), attrs);
            check(&a, &format!("non-unit head-dim stride {dtype}"))?;
        }
    }
    Ok(())
}

#[test]
fn bf16_prefill_on_every_head_dim_group_and_option() -> TestResult {
    // With AMX the bf16 tile products run on bf16 tiles (rows padded to 16, q.k dims to 32).
    let cases =
        [(7, 64, 4, 4, 48), (63, 80, 12, 4, 80), (130, 96, 8, 1, 96), (130, 128, 6, 2, 40), (20, 256, 3, 1, 256)];
    for (s, d, hq, hkv, dv) in cases {
        for attrs in [
            causal(),
            AttentionAttrs::default(),
            AttentionAttrs {
                causal: true,
                window_left: Some(9),
                alibi: true,
                softcap: Some(8.0),
                ..Default::default()
            },
        ] {
            let mut a = dense(1, s, s + 3, hq, hkv, d, dv, DType::BF16)?;
            a.attrs = attrs.clone();
            check(&a, &format!("bf16 s={s} d={d} hq={hq} hkv={hkv}"))?;
            a.mask = Some(t(&[s, s + 3], 8, DType::BF16, Layout::Bshd)?);
            check(&a, &format!("bf16 masked s={s} d={d}"))?;
        }
    }
    Ok(())
}

#[test]
fn bf16_prefill_on_vdpbf16ps_pairs_where_a_cpu_has_no_amx() -> TestResult {
    // The operands AMX takes, multiplied by vdpbf16ps instead (a Zen 4 or Zen 5).
    if !super::simd::avx512_bf16() {
        return Ok(());
    }
    super::simd::force_bf16_pairs(true);
    for (s, d, hq, hkv, dv) in [(7, 64, 4, 4, 48), (130, 128, 6, 2, 40), (600, 128, 4, 1, 128)] {
        for attrs in [causal(), AttentionAttrs { causal: true, softcap: Some(8.0), ..Default::default() }] {
            let mut a = dense(1, s, s + 3, hq, hkv, d, dv, DType::BF16)?;
            a.attrs = attrs;
            check(&a, &format!("bf16 pairs s={s} d={d} hq={hq} hkv={hkv}"))?;
        }
    }
    super::simd::force_bf16_pairs(false);
    Ok(())
}

#[test]
fn long_sequences_cross_several_key_tiles() -> TestResult {
    for dtype in [DType::F32, DType::BF16] {
        for attrs in [causal(), AttentionAttrs { causal: true, window_left: Some(300), ..Default::default() }] {
            let mut a = dense(1, 1100, 1100, 2, 1, 32, 32, dtype)?;
            a.attrs = attrs.clone();
            check(&a, &format!("long {dtype} window {:?}", attrs.window_left))?;
        }
        let mut a = dense(1, 600, 1300, 2, 2, 16, 16, dtype)?;
        a.attrs = AttentionAttrs { causal: true, causal_alignment: CausalAlignment::TopLeft, ..Default::default() };
        check(&a, &format!("long cross {dtype}"))?;
    }
    Ok(())
}

#[test]
fn decode_split_kv_against_long_caches() -> TestResult {
    for (sq, sk) in [(1, 1000), (3, 777), (4, 1), (1, 0)] {
        for (hq, hkv) in [(8, 1), (8, 8), (16, 2)] {
            for attrs in [causal(), AttentionAttrs { window_left: Some(300), causal: true, ..Default::default() }] {
                let mut a = dense(if hq == 16 { 2 } else { 1 }, sq, sk, hq, hkv, 128, 128, DType::F32)?;
                a.attrs = attrs.clone();
                check(&a, &format!("decode sq={sq} sk={sk} hq={hq} hkv={hkv}"))?;
                // BHSD caches: heads outer, one task per kv head.
                let b = args(a.q.clone(), bhsd_view(&a.k)?, bhsd_view(&a.v)?, attrs);
                check(&b, "decode bhsd")?;
            }
        }
    }
    let mut a = dense(1, 1, 500, 4, 2, 64, 64, DType::BF16)?;
    a.attrs.softcap = Some(30.0);
    a.attrs.alibi = true;
    check(&a, "decode bf16 softcap alibi")?;
    Ok(())
}

#[test]
fn attention_input_errors_are_invalid_input() -> TestResult {
    let bad_heads = dense(1, 4, 4, 6, 4, 8, 8, DType::F32)?;
    assert!(matches!(attention::run(&bad_heads, &mut Outputs::new()), Err(KernelError::InvalidInput(_))));
    let mut bad_mask = dense(1, 4, 5, 2, 2, 8, 8, DType::F32)?;
    bad_mask.mask = Some(t(&[3, 5], 1, DType::F32, Layout::Bshd)?);
    assert!(
        matches!(attention::run(&bad_mask, &mut Outputs::new()), Err(KernelError::InvalidInput(m)) if m.contains("mask"))
    );
    let mut bad_cu = dense(1, 8, 8, 2, 2, 8, 8, DType::F32)?;
    bad_cu.cu_seqlens_q = Some(HostTensor::new(Storage::I32(vec![0, 5, 3].into()), &[3])?);
    bad_cu.cu_seqlens_k = Some(HostTensor::new(Storage::I32(vec![0, 4, 8].into()), &[3])?);
    assert!(
        matches!(attention::run(&bad_cu, &mut Outputs::new()), Err(KernelError::InvalidInput(m)) if m.contains("[2] = 3"))
    );
    bad_cu.cu_seqlens_q = Some(HostTensor::new(Storage::I32(vec![0, 5, 9].into()), &[3])?);
    assert!(
        matches!(attention::run(&bad_cu, &mut Outputs::new()), Err(KernelError::InvalidInput(m)) if m.contains("9"))
    );
    bad_cu.cu_seqlens_k = None;
    assert!(matches!(attention::run(&bad_cu, &mut Outputs::new()), Err(KernelError::InvalidInput(_))));
    let mut dropout = dense(1, 4, 4, 2, 2, 8, 8, DType::F32)?;
    dropout.attrs.dropout_p = 0.1;
    assert!(matches!(attention::run(&dropout, &mut Outputs::new()), Err(KernelError::Unsupported(_))));
    let rank3 = args(
        t(&[4, 2, 8], 1, DType::F32, Layout::Bshd)?,
        t(&[4, 2, 8], 1, DType::F32, Layout::Bshd)?,
        t(&[4, 2, 8], 1, DType::F32, Layout::Bshd)?,
        AttentionAttrs::default(),
    );
    assert!(
        matches!(attention::run(&rank3, &mut Outputs::new()), Err(KernelError::InvalidInput(m)) if m.contains("`q`"))
    );
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Paged attention.

struct Paged {
    layout: Layout,
    page_size: usize,
    i64_table: bool,
    dtype: DType,
    scaled: bool,
    sq: usize,
}

/// Builds a paged problem whose pages are scattered in a shuffled order.
fn paged_args(c: &Paged, lens: &[usize], attrs: AttentionAttrs) -> TestResult<PagedAttentionArgs> {
    let (hq, hkv, d, dv) = (8usize, 2usize, 64usize, 48usize);
    let b = lens.len();
    let ps = c.page_size;
    let max_pages = lens.iter().map(|l| l.div_ceil(ps)).max().unwrap_or(0) + 1;
    let pages = b * max_pages + 1;
    // A permutation of the physical pages (an LCG shuffle).
    let mut perm: Vec<usize> = (0..pages).collect();
    let mut x = 12345u64;
    for i in (1..pages).rev() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        perm.swap(i, (x >> 33) as usize % (i + 1));
    }
    let mut table = vec![-1i64; b * max_pages];
    for bb in 0..b {
        for p in 0..lens[bb].div_ceil(ps) {
            table[bb * max_pages + p] = perm[bb * max_pages + p] as i64;
        }
    }
    let shape = |dd: usize| match c.layout {
        Layout::Hnd => [pages, hkv, ps, dd],
        _ => [pages, ps, hkv, dd],
    };
    let kc = t(&shape(d), 21, c.dtype, c.layout)?;
    let vc = t(&shape(dv), 22, c.dtype, c.layout)?;
    let block_table = if c.i64_table {
        HostTensor::new(Storage::I64(table.into()), &[b, max_pages])?
    } else {
        HostTensor::new(Storage::I32(table.iter().map(|&x| x as i32).collect()), &[b, max_pages])?
    };
    let context_lens = HostTensor::new(Storage::I32(lens.iter().map(|&l| l as i32).collect()), &[b])?;
    let q = t(&[b, c.sq, hq, d], 23, DType::F32, Layout::Bshd)?;
    let (k_scale, v_scale) = if c.scaled {
        (Some(HostTensor::from_f32(&[hkv], vec![0.5, 1.5])?), Some(HostTensor::from_f32(&[1], vec![0.25])?))
    } else {
        (None, None)
    };
    Ok(PagedAttentionArgs { q, k_cache: kc, v_cache: vc, block_table, context_lens, k_scale, v_scale, attrs })
}

fn check_paged(a: &PagedAttentionArgs, what: &str) -> TestResult {
    let want = ref_paged(a)?;
    let ours = paged::run(a, &mut Outputs::new()).map_err(|e| format!("{what}: {e}"))?;
    assert_close(&ours["out"], &want, what);
    Ok(())
}

#[test]
fn paged_page_sizes_layouts_tables_and_query_counts() -> TestResult {
    for page_size in [1, 16, 256] {
        for layout in [Layout::Nhd, Layout::Hnd] {
            for (sq, i64_table) in [(1, false), (3, true), (9, false)] {
                let c = Paged { layout, page_size, i64_table, dtype: DType::F32, scaled: false, sq };
                let lens = [300, 1, 0, 17];
                check_paged(&paged_args(&c, &lens, causal())?, &format!("ps={page_size} {layout} sq={sq}"))?;
                let attrs = AttentionAttrs {
                    causal: true,
                    causal_alignment: CausalAlignment::TopLeft,
                    window_left: Some(100),
                    alibi: true,
                    softcap: Some(10.0),
                    ..Default::default()
                };
                check_paged(&paged_args(&c, &lens, attrs)?, &format!("ps={page_size} {layout} sq={sq} options"))?;
            }
        }
    }
    Ok(())
}

#[test]
fn paged_half_and_fp8_caches_with_scales() -> TestResult {
    for dtype in [DType::F16, DType::BF16, DType::Fp8E4M3, DType::Fp8E5M2, DType::F32] {
        for layout in [Layout::Nhd, Layout::Hnd] {
            for sq in [1, 6] {
                let c = Paged { layout, page_size: 16, i64_table: false, dtype, scaled: true, sq };
                check_paged(&paged_args(&c, &[100, 33], causal())?, &format!("{dtype} {layout} sq={sq}"))?;
            }
        }
    }
    // bf16 caches and queries, no scales: the bf16 (AMX) tile path.
    for layout in [Layout::Nhd, Layout::Hnd] {
        let c = Paged { layout, page_size: 16, i64_table: true, dtype: DType::BF16, scaled: false, sq: 20 };
        let mut a = paged_args(&c, &[100, 33], causal())?;
        a.q = t(a.q.shape(), 23, DType::BF16, Layout::Bshd)?;
        check_paged(&a, &format!("bf16 unscaled {layout}"))?;
    }
    Ok(())
}

#[test]
fn paged_bad_tables_and_lengths_are_invalid_input() -> TestResult {
    let c = Paged { layout: Layout::Nhd, page_size: 16, i64_table: false, dtype: DType::F32, scaled: false, sq: 1 };
    let mut a = paged_args(&c, &[40, 20], causal())?;
    let mut table = a.block_table.to_i64_vec();
    let max_pages = a.block_table.shape()[1];
    table[max_pages + 1] = 999;
    a.block_table = HostTensor::new(Storage::I32(table.iter().map(|&x| x as i32).collect()), &[2, max_pages])?;
    let err = paged::run(&a, &mut Outputs::new()).err().ok_or("a block_table entry past the pages must be refused")?;
    assert!(matches!(&err, KernelError::InvalidInput(m) if m.contains("block_table[1, 1] = 999")), "{err}");
    let mut a = paged_args(&c, &[40, 20], causal())?;
    a.context_lens = HostTensor::new(Storage::I32(vec![40, 4000].into()), &[2])?;
    let err = paged::run(&a, &mut Outputs::new()).err().ok_or("a context length past the cache must be refused")?;
    assert!(matches!(&err, KernelError::InvalidInput(m) if m.contains("context_lens[1] = 4000")), "{err}");
    let mut a = paged_args(&c, &[40, 20], causal())?;
    a.context_lens = HostTensor::new(Storage::I32(vec![-1, 3].into()), &[2])?;
    assert!(matches!(paged::run(&a, &mut Outputs::new()), Err(KernelError::InvalidInput(_))));
    let mut a = paged_args(&c, &[40, 20], causal())?;
    a.k_cache = a.k_cache.contiguous();
    a.k_cache = HostTensor::new(a.k_cache.storage().clone(), a.k_cache.shape())?;
    assert!(
        matches!(paged::run(&a, &mut Outputs::new()), Err(KernelError::InvalidInput(m)) if m.contains("layout tag"))
    );
    let mut a = paged_args(&c, &[40, 20], causal())?;
    a.k_scale = Some(HostTensor::from_f32(&[3], vec![1.0; 3])?);
    assert!(matches!(paged::run(&a, &mut Outputs::new()), Err(KernelError::InvalidInput(m)) if m.contains("k_scale")));
    Ok(())
}

// ----------------------------------------------------------------------------------------
// RoPE.

fn check_rope(a: &RopeArgs, what: &str) -> TestResult {
    let want = ref_rope(a)?;
    let ours = rope::run(a).map_err(|e| format!("{what}: {e}"))?;
    assert_eq!(ours.len(), want.len(), "{what}: outputs");
    for (name, w) in &want {
        let o = &ours[name];
        assert_eq!(o.shape(), w.shape(), "{what}: {name} shape");
        assert_eq!(o.dtype(), w.dtype(), "{what}: {name} dtype");
        assert_eq!(o.layout(), w.layout(), "{what}: {name} layout");
        let (x, y) = (o.to_f64_vec(), w.to_f64_vec());
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            // Same f64 math rounded once: equal to the last bit.
            assert_eq!(p, q, "{what}: {name} element {i}");
        }
    }
    Ok(())
}

fn rope_args(q: HostTensor, k: Option<HostTensor>, attrs: RopeAttrs) -> RopeArgs {
    RopeArgs { q, k, positions: None, cos: None, sin: None, attrs }
}

#[test]
fn rope_styles_partial_positions_scalings_tables_and_dtypes() -> TestResult {
    let scalings = [
        None,
        Some(RopeScaling::Linear { factor: 4.0 }),
        Some(RopeScaling::DynamicNtk { factor: 2.0, original_max_position: 64 }),
        Some(RopeScaling::Yarn { factor: 8.0, original_max_position: 256, beta_fast: 32.0, beta_slow: 1.0 }),
        Some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 8192,
        }),
    ];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for style in [RopeStyle::RotateHalf, RopeStyle::Interleaved] {
            for (rotary_dim, scaling) in [(None, 0), (Some(32), 1), (Some(64), 2), (None, 3), (Some(16), 4)] {
                let attrs = RopeAttrs { style, rotary_dim, base: Some(500000.0), scaling: scalings[scaling].clone() };
                let q = t(&[2, 7, 4, 64], 1, dtype, Layout::Bshd)?;
                let k = t(&[2, 7, 2, 64], 2, dtype, Layout::Bshd)?;
                let mut a = rope_args(q.clone(), Some(k.clone()), attrs.clone());
                check_rope(&a, &format!("{dtype} {style:?} {rotary_dim:?} scaling {scaling}"))?;
                // Positions [S] and [B, S] far out (f32 angles would miss by ~1e-4).
                a.positions = Some(HostTensor::new(Storage::I64(vec![4096, 4097, 9000, 5, 0, 70000, 3].into()), &[7])?);
                check_rope(&a, "positions [S]")?;
                let pos: Vec<i32> = (0..14).map(|i| i * 613 % 8191).collect();
                a.positions = Some(HostTensor::new(Storage::I32(pos.into()), &[2, 7])?);
                check_rope(&a, "positions [B, S]")?;
                // BHSD views and padded strides.
                let b = rope_args(bhsd_view(&q)?, Some(strided_copy(&k, &[7 * 2 * 70, 2 * 70, 70, 1])?), attrs);
                check_rope(&b, "bhsd view")?;
            }
        }
    }
    // cos/sin tables.
    let q = bhsd_view(&t(&[1, 5, 3, 32], 3, DType::F32, Layout::Bshd)?)?;
    let mut a = rope_args(q, None, RopeAttrs { rotary_dim: Some(24), ..Default::default() });
    a.cos = Some(t(&[10, 12], 4, DType::F32, Layout::Bshd)?);
    a.sin = Some(t(&[10, 12], 5, DType::BF16, Layout::Bshd)?);
    a.positions = Some(HostTensor::new(Storage::I32(vec![9, 0, 3, 3, 1].into()), &[5])?);
    check_rope(&a, "tables")?;
    // Untagged input stays untagged.
    let q = HostTensor::from_f32(&[1, 3, 2, 8], values(48, 7))?;
    check_rope(&rope_args(q, None, RopeAttrs::default()), "untagged")?;
    Ok(())
}

#[test]
fn rope_input_errors_are_invalid_input() -> TestResult {
    let q = t(&[1, 5, 3, 32], 3, DType::F32, Layout::Bshd)?;
    let odd = rope_args(q.clone(), None, RopeAttrs { rotary_dim: Some(7), ..Default::default() });
    assert!(matches!(rope::run(&odd), Err(KernelError::InvalidInput(m)) if m.contains("rotary_dim")));
    let mut neg = rope_args(q.clone(), None, RopeAttrs::default());
    neg.positions = Some(HostTensor::new(Storage::I32(vec![0, 1, -2, 3, 4].into()), &[5])?);
    assert!(matches!(rope::run(&neg), Err(KernelError::InvalidInput(m)) if m.contains("-2")));
    let mut short = rope_args(q.clone(), None, RopeAttrs::default());
    short.cos = Some(t(&[3, 16], 4, DType::F32, Layout::Bshd)?);
    short.sin = Some(t(&[3, 16], 5, DType::F32, Layout::Bshd)?);
    assert!(matches!(rope::run(&short), Err(KernelError::InvalidInput(m)) if m.contains("positions reach 4")));
    let mismatched = rope_args(q, Some(t(&[1, 4, 3, 32], 3, DType::F32, Layout::Bshd)?), RopeAttrs::default());
    assert!(matches!(rope::run(&mismatched), Err(KernelError::InvalidInput(_))));
    Ok(())
}

#[test]
fn registered_kernels_run_their_op_and_reject_others() -> TestResult {
    let mut r = Registry::new();
    super::register(&mut r);
    let a = dense(1, 3, 3, 2, 1, 8, 8, DType::F32)?;
    let op = OpArgs::Attention(a.clone());
    let out = r.get("cpu.attention.flash").ok_or("cpu.attention.flash is not registered")?.run(&op)?;
    assert_close(&out["out"], &ref_attention(&a)?, "registry");
    assert!(matches!(
        r.get("cpu.rope.fast").ok_or("cpu.rope.fast is not registered")?.run(&op),
        Err(KernelError::Unsupported(_))
    ));
    assert!(matches!(
        r.get("cpu.paged_attention.split_kv").ok_or("cpu.paged_attention.split_kv is not registered")?.run(&op),
        Err(KernelError::Unsupported(_))
    ));
    let rope_op = OpArgs::Rope(rope_args(a.q.clone(), Some(a.k.clone()), RopeAttrs::default()));
    let outs = r.get("cpu.rope.fast").ok_or("cpu.rope.fast is not registered")?.run(&rope_op)?;
    assert!(outs.contains_key("out") && outs.contains_key("out_k"));
    assert!(matches!(
        r.get("cpu.attention.flash").ok_or("cpu.attention.flash is not registered")?.run(&rope_op),
        Err(KernelError::Unsupported(_))
    ));
    Ok(())
}
