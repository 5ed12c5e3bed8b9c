//! RoPE fused into attention, or the unfused chain when no kernel takes it fused: an
//! attention call whose `attrs.rope` asks for q and k to be rotated first runs one kernel
//! that rotates them as it reads them when one is eligible; otherwise `rope` rotates q (the
//! queries at the last positions of their keys) and k, and attention runs on the rotated
//! tensors. Both paths go through selection and dispatch (policy, health, fallback), so a
//! policy that denies the fused kernel, or a request it refuses, gets the chain.

use super::LayerZero;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::args::{AttentionArgs, OpArgs, RopeArgs, layout_of};
use crate::model::attrs::RopeAttrs;
use crate::model::layout::Layout;
use crate::reason::Reason;
use crate::tensor::{HostTensor, Storage};

/// The output of attention with RoPE and the way it was computed.
#[derive(Debug)]
pub struct RopeAttention {
    /// The attention output.
    pub out: HostTensor,
    /// The kernels that ran, in order: one (fused), or rope (q), rope (k), attention.
    pub kernels: Vec<String>,
    /// Why no kernel took RoPE fused (every attention candidate's reasons); empty when the
    /// fused kernel ran.
    pub fused_refused: Vec<Reason>,
}

impl RopeAttention {
    /// True when one kernel rotated q and k inside attention.
    pub fn fused(&self) -> bool {
        self.kernels.len() == 1
    }
}

impl LayerZero {
    /// Attention of `args`, whose `attrs.rope` must be set: the best kernel that applies
    /// RoPE inside attention, or, when selection finds none (`NoKernel`), the chain `rope`
    /// then attention. Key `j` sits at position `j` and query row `i` at `i + seq_k - seq_q`
    /// (per packed sequence with cu_seqlens). Errors: a request without `attrs.rope`; those
    /// of selection other than `NoKernel`; those of dispatch.
    pub fn attention_with_rope(&self, args: &AttentionArgs) -> Result<RopeAttention> {
        let Some(rope) = args.attrs.rope.clone() else {
            return Err(Error::invalid("attention_with_rope: attrs.rope is not set; call dispatch instead"));
        };
        let fused = OpArgs::Attention(args.clone());
        let refused = match self.select_args(&fused) {
            Ok(_) => {
                let mut d = self.dispatch(&fused)?;
                let kernel = d.selection().kernel.clone();
                let out = take(&mut d.outputs)?;
                return Ok(RopeAttention { out, kernels: vec![kernel], fused_refused: Vec::new() });
            }
            Err(e) if e.kind() == ErrorKind::NoKernel => e.reasons().to_vec(),
            Err(e) => return Err(e),
        };
        let (pos_q, pos_k) = positions(args)?;
        let mut kernels = Vec::with_capacity(3);
        let q = self.rotate(&args.q, pos_q, &rope, &mut kernels)?;
        let k = self.rotate(&args.k, pos_k, &rope, &mut kernels)?;
        let mut plain = args.clone();
        plain.q = q;
        plain.k = k;
        plain.attrs.rope = None;
        let mut d = self.dispatch(&OpArgs::Attention(plain))?;
        kernels.push(d.selection().kernel.clone());
        let out = take(&mut d.outputs)?;
        Ok(RopeAttention { out, kernels, fused_refused: refused })
    }

    fn rotate(
        &self,
        t: &HostTensor,
        positions: HostTensor,
        rope: &RopeAttrs,
        ran: &mut Vec<String>,
    ) -> Result<HostTensor> {
        let args =
            RopeArgs { q: t.clone(), k: None, positions: Some(positions), cos: None, sin: None, attrs: rope.clone() };
        let mut d = self.dispatch(&OpArgs::Rope(args))?;
        ran.push(d.selection().kernel.clone());
        take(&mut d.outputs)
    }
}

fn take(outputs: &mut crate::exec::args::Outputs) -> Result<HostTensor> {
    outputs.remove("out").ok_or_else(|| Error::new(ErrorKind::KernelFailed, "the kernel returned no `out`"))
}

/// Sequence length of a BSHD or BHSD tensor.
fn seq_len(t: &HostTensor) -> Result<usize> {
    let axis = if layout_of(t) == Layout::Bhsd { 2 } else { 1 };
    t.shape().get(axis).copied().ok_or_else(|| Error::invalid(format!("attention q/k have shape {:?}", t.shape())))
}

/// Offsets of `cu_seqlens_*` (i32 or i64 `[N+1]`).
fn offsets(t: &HostTensor) -> Vec<usize> {
    let n = t.shape().first().copied().unwrap_or(0);
    let stride = t.strides().first().copied().unwrap_or(1);
    (0..n).map(|i| t.storage().get_f64(t.offset() + i * stride).max(0.0) as usize).collect()
}

/// The positions of q's rows and of k's rows (i64 `[S]`): the queries of each sequence at
/// the last positions of its keys.
fn positions(a: &AttentionArgs) -> Result<(HostTensor, HostTensor)> {
    let (sq, sk) = (seq_len(&a.q)?, seq_len(&a.k)?);
    let spans = match (&a.cu_seqlens_q, &a.cu_seqlens_k) {
        (Some(cq), Some(ck)) => {
            let (cq, ck) = (offsets(cq), offsets(ck));
            cq.windows(2).zip(ck.windows(2)).map(|(q, k)| (q[0], q[1], k[0], k[1])).collect::<Vec<_>>()
        }
        _ => vec![(0, sq, 0, sk)],
    };
    let (mut pq, mut pk) = (vec![0i64; sq], vec![0i64; sk]);
    for (q0, q1, k0, k1) in spans {
        let (n, m) = (q1.saturating_sub(q0), k1.saturating_sub(k0));
        if n > m || q1 > sq || k1 > sk {
            return Err(Error::invalid(format!(
                "attrs.rope places queries at the last positions of their keys; a sequence has {n} queries \
                 (rows {q0}..{q1} of {sq}) and {m} keys (rows {k0}..{k1} of {sk})"
            )));
        }
        for (i, p) in pq[q0..q1].iter_mut().enumerate() {
            *p = (m - n + i) as i64;
        }
        for (j, p) in pk[k0..k1].iter_mut().enumerate() {
            *p = j as i64;
        }
    }
    let tensor = |v: Vec<i64>| {
        let n = v.len();
        HostTensor::new(Storage::I64(v.into()), &[n])
    };
    Ok((tensor(pq)?, tensor(pk)?))
}
