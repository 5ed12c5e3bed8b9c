//! A decoder layer's self-attention: the q/k/v projections (biased for Qwen2; one stacked
//! projection for a decode step's single row, where the weights are stacked), q and k
//! RMS-normalized per head (Qwen3), RoPE, the new keys and values written into the layer's
//! KV cache, attention over every cached position (GQA, sliding windows), the output
//! projection.

use super::{Linear, Norm, view};
use crate::config::ModelConfig;
use crate::kv::{KvCache, Step};
use crate::pass::{Pass, Slot, Slots, take};
use crate::weights::LayerWeights;
use layerzero::error::Result;
use layerzero::exec::args::{OpArgs, RopeArgs};
use layerzero::model::attrs::{AttentionAttrs, RopeAttrs};
use layerzero::model::layout::Layout;
use layerzero::model::op::Op;
use layerzero::runtime::LayerZero;
use layerzero::tensor::HostTensor;

/// Self-attention of layer `layer` against its KV cache.
pub(crate) struct Attention<'w> {
    layer: usize,
    q: Linear<'w>,
    k: Linear<'w>,
    v: Linear<'w>,
    /// q, k and v in one projection (one row: a decode step), where the weights are stacked.
    qkv: Option<Linear<'w>>,
    o: Linear<'w>,
    /// Qwen3: q_norm and k_norm, over each head's dims before RoPE.
    qk_norm: Option<(Norm<'w>, Norm<'w>)>,
    rope: RopeAttrs,
    rope_slot: Slot,
    /// Causal, with the layer's sliding window.
    attrs: AttentionAttrs,
    slot: Slot,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl<'w> Attention<'w> {
    /// Layer `l`'s attention over `w`; every layer's attention shares `slots`' buffers.
    pub(crate) fn new(l: usize, w: &'w LayerWeights, c: &ModelConfig, slots: &mut Slots) -> Attention<'w> {
        let qk_norm = match (&w.q_norm, &w.k_norm) {
            (Some(q), Some(k)) => {
                Some((Norm::rms(q, c.eps, slots.named("attn.q_norm")), Norm::rms(k, c.eps, slots.named("attn.k_norm"))))
            }
            _ => None,
        };
        Attention {
            layer: l,
            q: Linear::new(&w.q, w.q_bias.as_ref(), slots.named("attn.q"), slots),
            k: Linear::new(&w.k, w.k_bias.as_ref(), slots.named("attn.k"), slots),
            v: Linear::new(&w.v, w.v_bias.as_ref(), slots.named("attn.v"), slots),
            qkv: w.qkv.as_ref().map(|p| Linear::new(&p.weight, p.bias.as_ref(), slots.named("attn.qkv"), slots)),
            o: Linear::new(&w.o, w.o_bias.as_ref(), slots.named("attn.o"), slots),
            qk_norm,
            rope: c.rope.clone(),
            rope_slot: slots.named("attn.rope"),
            attrs: AttentionAttrs {
                causal: true,
                window_left: c.windows.get(l).copied().flatten().map(|w| w as u64 - 1),
                ..AttentionAttrs::default()
            },
            slot: slots.named("attn"),
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
        }
    }

    /// Prepares the projections for inputs like `x` `[rows, H]` and `heads` `[rows, heads * d]`.
    pub(crate) fn prepare(&self, lz: &LayerZero, x: &HostTensor, heads: &HostTensor) -> Result<()> {
        for p in [&self.q, &self.k, &self.v] {
            p.prepare(lz, x)?;
        }
        self.o.prepare(lz, heads)
    }

    /// Attention of `x` `[rows, H]` over the cache, `step`'s keys and values written first.
    pub(crate) fn forward(
        &self,
        cx: &mut Pass<'_>,
        x: HostTensor,
        kv: &mut KvCache,
        step: &Step,
    ) -> Result<HostTensor> {
        let l = self.layer;
        let (q, k, v) = match &self.qkv {
            // One row: its q, k and v are contiguous pieces of the one projection's row.
            Some(p) if step.rows() == 1 => {
                let (qd, kvd) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
                let qkv = p.forward(cx, &x)?;
                (view(&qkv, &[1, qd], 0)?, view(&qkv, &[1, kvd], qd)?, view(&qkv, &[1, kvd], qd + kvd)?)
            }
            _ => {
                let [q, k, v] = Linear::forward_shared(cx, &x, [&self.q, &self.k, &self.v])?;
                (q, k, v)
            }
        };
        drop(x);
        let (q, k) = self.rotate(cx, q, k, step)?;
        cx.keep(|| format!("layer.{l}.q"), &q);
        cx.keep(|| format!("layer.{l}.k"), &k);
        kv.write(l, step, &k, &v)?;
        drop((k, v));
        let attn = cx.out(kv.attention(l, step, q, self.attrs.clone())?, Some(self.slot))?;
        let attn = if attn.is_contiguous() { attn } else { attn.contiguous() };
        let attn = view(&attn, &[step.rows(), self.heads * self.head_dim], 0)?;
        cx.keep(|| format!("layer.{l}.attn_out"), &attn);
        let out = self.o.forward(cx, &attn)?;
        drop(attn);
        cx.keep(|| format!("layer.{l}.o_proj"), &out);
        Ok(out)
    }

    /// `q` and `k` (`[rows, heads * d]`) normalized per head where the model does, then
    /// rotated at `step`'s positions: `[b, s, heads, d]` each.
    fn rotate(&self, cx: &mut Pass<'_>, q: HostTensor, k: HostTensor, step: &Step) -> Result<(HostTensor, HostTensor)> {
        let (rows, b, s, d) = (step.rows(), step.sequences(), step.len, self.head_dim);
        let (q, k) = match &self.qk_norm {
            Some((qn, kn)) => (
                qn.forward(cx, view(&q, &[rows, self.heads, d], 0)?)?,
                kn.forward(cx, view(&k, &[rows, self.kv_heads, d], 0)?)?,
            ),
            None => (q, k),
        };
        let mut o = cx.run(
            OpArgs::Rope(RopeArgs {
                q: view(&q, &[b, s, self.heads, d], 0)?.with_layout(Layout::Bshd),
                k: Some(view(&k, &[b, s, self.kv_heads, d], 0)?.with_layout(Layout::Bshd)),
                positions: Some(step.positions.clone()),
                cos: None,
                sin: None,
                attrs: self.rope.clone(),
            }),
            Some(self.rope_slot),
        )?;
        Ok((take(&mut o, Op::Rope, "out")?, take(&mut o, Op::Rope, "out_k")?))
    }
}
