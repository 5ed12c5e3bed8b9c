//! `cpu.attention.flash`: dense attention (BSHD/BHSD, any strides, GQA, masks, varlen).

use smallvec::SmallVec;

use layerzero_core::exec::args::{AttentionArgs, Outputs, layout_of};
use layerzero_core::exec::executor::KernelError;
use layerzero_core::exec::semantics::{alibi_slopes, softmax_scale};
use layerzero_core::model::layout::Layout;
use layerzero_core::tensor::Storage;

use super::engine::{KvAddr, KvSrc, MaskView, Mods, Problem, Rotary, Seq, output_into};
use super::pack::{Bshd, ints, invalid, output};

/// Validated cumulative sequence offsets: `cu[n]..cu[n+1]` within `0..=limit`.
fn offsets(t: &layerzero_core::tensor::HostTensor, name: &str, limit: usize) -> Result<Vec<usize>, KernelError> {
    if t.rank() != 1 {
        return Err(invalid(format!("`{name}` must have rank 1 ([N+1]); its shape is {:?}", t.shape())));
    }
    let v = ints(t, name)?;
    if v.is_empty() {
        return Err(invalid(format!("`{name}` is empty; it needs N+1 >= 1 offsets")));
    }
    let mut out = Vec::with_capacity(v.len());
    for (i, &x) in v.iter().enumerate() {
        if x < 0 || x as u64 > limit as u64 {
            return Err(invalid(format!("`{name}`[{i}] = {x} is outside 0..={limit} (the packed sequence length)")));
        }
        if i > 0 && x < v[i - 1] {
            return Err(invalid(format!("`{name}`[{i}] = {x} is less than `{name}`[{}] = {}", i - 1, v[i - 1])));
        }
        out.push(x as usize);
    }
    Ok(out)
}

/// The fused RoPE table of `a.attrs.rope`: keys at positions `0..sk`, queries at the last
/// `sq` of them. Packed sequences (cu_seqlens) would each need their own positions: they are
/// refused (the capability file declares rope and varlen exclusive).
fn rotary(a: &AttentionArgs, sq: usize, sk: usize, d: usize) -> Result<Option<Rotary>, KernelError> {
    let Some(r) = &a.attrs.rope else { return Ok(None) };
    if a.cu_seqlens_q.is_some() || a.cu_seqlens_k.is_some() {
        return Err(KernelError::Unsupported(
            "attrs.rope with cu_seqlens: packed sequences are rotated by the unfused chain (rope, then attention)"
                .into(),
        ));
    }
    if sq > sk {
        return Err(invalid(format!(
            "attrs.rope places the {sq} queries at the last positions of the {sk} keys; seq_q must be at most seq_k"
        )));
    }
    Rotary::new(r, d, sk).map(Some)
}

/// Runs dense attention (output into `bufs["out"]` when it fits).
pub(crate) fn run<'a>(a: &'a AttentionArgs, bufs: &mut Outputs) -> Result<Outputs, KernelError> {
    a.attrs.check()?;
    let q = Bshd::new(&a.q, "q")?;
    let k = Bshd::new(&a.k, "k")?;
    let v = Bshd::new(&a.v, "v")?;
    let [b, sq, hq, d] = q.n;
    let [bk, sk, hkv, dk] = k.n;
    let [bv, skv, hkv_v, dv] = v.n;
    if bv != bk {
        return Err(invalid(format!("v batch {bv} != k batch {bk}")));
    }
    if dk != d {
        return Err(invalid(format!("head dims differ: q {d}, k {dk}")));
    }
    if skv != sk || hkv_v != hkv {
        return Err(invalid(format!("v has {skv} keys and {hkv_v} heads; k has {sk} keys and {hkv} heads")));
    }
    if hq > 0 && (hkv == 0 || hq % hkv != 0) {
        return Err(invalid(format!("query heads {hq} are not a multiple of kv heads {hkv}")));
    }
    let layout = layout_of(&a.q);
    if hq == 0 || b == 0 || sq == 0 || dv == 0 {
        return finish(Storage::zeros(a.q.dtype(), b * sq * hq * dv), [b, sq, hq, dv], layout);
    }
    let rotary = rotary(a, sq, sk, d)?;
    let kv_src = |t: &Bshd<'a>, bb: usize, j0: usize, rot: bool| KvSrc {
        st: t.st,
        sd: t.s[3],
        sh: t.s[2],
        addr: KvAddr::Dense { base: t.off + bb * t.s[0] + j0 * t.s[1], sj: t.s[1] },
        scale: None,
        rot: if rot { rotary.as_ref() } else { None },
    };
    let seqs: SmallVec<[Seq; 8]> = match (&a.cu_seqlens_q, &a.cu_seqlens_k) {
        (None, None) if bk != b => return Err(invalid(format!("k batch {bk} != q batch {b}"))),
        (None, None) => (0..b)
            .map(|bb| Seq {
                b: bb,
                q0: 0,
                sq,
                sk,
                mask_b: bb,
                mask_k0: 0,
                k: kv_src(&k, bb, 0, true),
                v: kv_src(&v, bb, 0, false),
            })
            .collect(),
        (Some(cq), Some(ck)) => {
            if b != 1 || bk != 1 {
                return Err(invalid(format!(
                    "ragged attention packs sequences into batch 1; q batch is {b}, k/v batch is {bk}"
                )));
            }
            let cq = offsets(cq, "cu_seqlens_q", sq)?;
            let ck = offsets(ck, "cu_seqlens_k", sk)?;
            if cq.len() != ck.len() {
                return Err(invalid(format!(
                    "cu_seqlens_q has {} offsets and cu_seqlens_k {}; they must match",
                    cq.len(),
                    ck.len()
                )));
            }
            (0..cq.len() - 1)
                .map(|n| Seq {
                    b: 0,
                    q0: cq[n],
                    sq: cq[n + 1] - cq[n],
                    sk: ck[n + 1] - ck[n],
                    mask_b: n,
                    mask_k0: ck[n],
                    k: kv_src(&k, 0, ck[n], true),
                    v: kv_src(&v, 0, ck[n], false),
                })
                .collect()
        }
        _ => return Err(invalid("cu_seqlens_q and cu_seqlens_k must be given together")),
    };
    let mask = a.mask.as_ref().map(|m| MaskView::new(m, [seqs.len(), hq, sq, sk])).transpose()?;
    let p = Problem {
        q,
        hq,
        hkv,
        d,
        dv,
        scale: softmax_scale(&a.attrs, d) as f32,
        attrs: &a.attrs,
        mods: Mods { softcap: a.attrs.softcap.map(|c| c as f32), alibi: a.attrs.alibi.then(|| alibi_slopes(hq)), mask },
        seqs,
        bf16: [&a.q, &a.k, &a.v].iter().all(|t| t.dtype() == layerzero_core::model::dtype::DType::BF16),
        rope: rotary.as_ref(),
    };
    output_into(&p, [b, sq, hq, dv], layout, a.q.dtype(), bufs)
}

fn finish(storage: Storage, n: [usize; 4], layout: Layout) -> Result<Outputs, KernelError> {
    Ok(Outputs::from([("out", output(storage, n, layout)?)]))
}
