//! A decoder-only transformer as its layers: the token embedding, pre-norm blocks
//! (attention and MLP, each after an RMSNorm that adds the residual stream, fused), the
//! final norm and the LM head.
//!
//! With a dump, the stages HF transformers names are kept (`hidden.{i}`, `layer.{l}.{stage}`)
//! so `lz diff` can find the first one that diverges. The residual sum that enters block `l`
//! is computed by its first norm, so that is where `layer.{l-1}.out` is kept.
//!
//! Every block's layers share one set of output slots: blocks run one after another and
//! each drops its handles before the next starts, so one block's buffers serve them all.

use super::Model;
use super::kv::{KvCache, Step};
use super::nn::attention::Attention;
use super::nn::mlp::FeedForward;
use super::nn::{Embedding, Linear, Norm, view};
use super::pass::{Pass, Slots};
use layerzero::error::{Error, Result};
use layerzero::runtime::LayerZero;
use layerzero::tensor::HostTensor;

/// Rows of the prefill-shaped requests with which the projections' kernels are prepared.
const PREPARE_ROWS: usize = 16;

/// What flows from one block to the next: the block's output, and the residual stream it is
/// still to be added to (by the next norm, fused). The embedding has no stream yet.
struct Residual {
    branch: HostTensor,
    stream: Option<HostTensor>,
}

/// One pre-norm decoder layer.
struct Block<'w> {
    layer: usize,
    attn_norm: Norm<'w>,
    attn: Attention<'w>,
    ffn_norm: Norm<'w>,
    ffn: FeedForward<'w>,
}

impl Block<'_> {
    /// `h` through attention and the MLP, each added to the residual stream.
    fn forward(&self, cx: &mut Pass<'_>, h: Residual, kv: &mut KvCache, step: &Step) -> Result<Residual> {
        let l = self.layer;
        cx.layer = Some(l);
        let (x, stream) = self.attn_norm.add(cx, h.branch, h.stream)?;
        if l > 0 {
            cx.keep(|| format!("layer.{}.out", l - 1), &stream);
            cx.keep(|| format!("hidden.{l}"), &stream);
        }
        cx.keep(|| format!("layer.{l}.attn_norm"), &x);
        let a = self.attn.forward(cx, x, kv, step)?;
        let (x, stream) = self.ffn_norm.add(cx, a, Some(stream))?;
        cx.keep(|| format!("layer.{l}.post_attn"), &stream);
        cx.keep(|| format!("layer.{l}.ffn_norm"), &x);
        let f = self.ffn.forward(cx, x)?;
        cx.keep(|| format!("layer.{l}.ffn_out"), &f);
        Ok(Residual { branch: f, stream: Some(stream) })
    }
}

/// A decoder model's layers, over its weights.
pub(crate) struct Decoder<'w> {
    embed: Embedding<'w>,
    blocks: Vec<Block<'w>>,
    norm: Norm<'w>,
    lm_head: Linear<'w>,
}

impl<'w> Decoder<'w> {
    /// The layers of `model`, their output slots named in `slots`.
    pub(crate) fn new(model: &'w Model, slots: &mut Slots) -> Result<Decoder<'w>> {
        let (c, w) = (&model.config, &model.weights);
        let mut blocks = Vec::with_capacity(w.layers.len());
        for (l, lw) in w.layers.iter().enumerate() {
            // The first block's input norm adds no residual, so it has one output fewer than
            // the others': sharing their slot would leave one buffer short every step.
            let input = slots.named(if l == 0 { "first_norm" } else { "attn_norm" });
            blocks.push(Block {
                layer: l,
                attn_norm: Norm::rms(&lw.attn_norm, c.eps, input),
                attn: Attention::new(l, lw, c, slots),
                ffn_norm: Norm::rms(&lw.ffn_norm, c.eps, slots.named("ffn_norm")),
                ffn: FeedForward::new(l, &lw.ffn, lw.gate_up.as_ref(), c, slots)?,
            });
        }
        Ok(Decoder {
            embed: Embedding::new(&w.embed, Some(slots.named("embed"))),
            blocks,
            norm: Norm::rms(&w.norm, c.eps, slots.named("final_norm")),
            lm_head: Linear::dense(&w.lm_head, None, slots.named("logits")),
        })
    }

    /// Lets the kernels of the projections prepare their weights now (pack them into the
    /// layout a prefill wants), so that no prompt pays for it and none repacks.
    pub(crate) fn prepare(&self, model: &Model, lz: &LayerZero) -> Result<()> {
        let c = &model.config;
        let x = |cols: usize| HostTensor::zeros(model.dtype, &[PREPARE_ROWS, cols]);
        let (xh, xq, xi) = (x(c.hidden)?, x(c.heads * c.head_dim)?, x(c.intermediate)?);
        for block in &self.blocks {
            block.attn.prepare(lz, &xh, &xq)?;
            block.ffn.prepare(lz, &xh, &xi)?;
        }
        self.lm_head.prepare(lz, &xh)
    }

    /// The logits of `ids` (`step`'s new tokens, `[rows]`), their keys and values written
    /// into `kv`: of every row with `all_logits` or in a decode step, else each sequence's
    /// last (a prefill's last token).
    pub(crate) fn forward(
        &self,
        cx: &mut Pass<'_>,
        ids: HostTensor,
        kv: &mut KvCache,
        step: &Step,
        all_logits: bool,
    ) -> Result<HostTensor> {
        let embedded = self.embed.forward(cx, ids)?;
        cx.keep(|| "hidden.0".into(), &embedded);
        let mut h = Residual { branch: embedded, stream: None };
        for block in &self.blocks {
            h = block.forward(cx, h, kv, step)?;
        }
        cx.layer = None;
        let x = self.final_norm(cx, h)?;
        let x = if all_logits || step.len == 1 { x } else { last_row(&x)? };
        self.lm_head.forward(cx, &x)
    }

    /// The last block's output added to the stream (the last layer's output) and normalized.
    fn final_norm(&self, cx: &mut Pass<'_>, h: Residual) -> Result<HostTensor> {
        let (x, stream) = self.norm.add(cx, h.branch, h.stream)?;
        let layers = self.blocks.len();
        if let Some(last) = layers.checked_sub(1) {
            cx.keep(|| format!("layer.{last}.out"), &stream);
        }
        cx.keep(|| format!("hidden.{layers}"), &x);
        Ok(x)
    }
}

/// The last row of `x` `[rows, H]` (one sequence's prefill).
fn last_row(x: &HostTensor) -> Result<HostTensor> {
    let &[rows, width] = x.shape() else {
        return Err(Error::invalid(format!("the final norm's output has shape {:?}; expected [rows, H]", x.shape())));
    };
    view(x, &[1, width], rows.saturating_sub(1) * width)
}
