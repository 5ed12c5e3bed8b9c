//! A ViT's forward pass, every op a dispatch: the patch embedding, `[CLS; patches]`, the
//! pre-norm blocks, the final LayerNorm, the CLS row pooled and the classifier. With a dump,
//! the stages transformers names are kept (`patch_embed`, `hidden.{i}`, `layer.{l}.*`,
//! `final_norm`, `pooled`, `logits`).

use std::collections::BTreeMap;
use std::time::Instant;

use super::{VitLayer, VitModel};
use crate::nn::{Linear, Norm, gelu, view};
use crate::pass::{OpStats, Pass, take};
use layerzero::error::{Error, Result};
use layerzero::exec::args::{AttentionArgs, OpArgs, Outputs, PatchEmbedArgs};
use layerzero::model::attrs::{AttentionAttrs, PatchEmbedAttrs};
use layerzero::model::layout::Layout;
use layerzero::model::op::Op;
use layerzero::runtime::LayerZero;
use layerzero::tensor::HostTensor;
use layerzero::transform::Transform;

/// What a forward pass produced.
#[derive(Debug, Clone)]
pub struct Classified {
    /// The CLS row after the final LayerNorm `[1, D]`.
    pub pooled: HostTensor,
    /// The classifier's logits `[1, labels]` (none for a bare `ViTModel`).
    pub logits: Option<Vec<f32>>,
    /// Wall time, ns.
    pub ns: u64,
    /// Per op, what ran.
    pub stats: BTreeMap<Op, OpStats>,
    /// With `dump`: every stage (`patch_embed`, `hidden.{i}`, `layer.{l}.*`, `final_norm`,
    /// `pooled`, `logits`).
    pub dump: BTreeMap<String, HostTensor>,
    /// What ran the patch embedding: the kernel and the adaptations applied for it (an NCHW
    /// image relaid out for a channels-last kernel, with its modeled cost).
    pub patch_embed: Option<(String, Vec<Transform>)>,
}

/// Runs `image` (`[1, C, H, W]` tagged NCHW, or `[1, H, W, C]` tagged NHWC, in the model's
/// dtype or any float dtype) through the model.
pub fn classify(model: &VitModel, lz: &LayerZero, image: &HostTensor, dump: bool) -> Result<Classified> {
    let image = input(model, image)?;
    let mut cx = Pass::new(lz, dump);
    let mut patch_embed = None;
    let start = Instant::now();
    let (pooled, logits) = crate::pass::on_pool(|| -> Result<(HostTensor, Option<Vec<f32>>)> {
        let (x, ran) = embed(&mut cx, model, image)?;
        patch_embed = Some(ran);
        let (mut branch, mut stream) = (x, model.positions.clone());
        for (l, layer) in model.layers.iter().enumerate() {
            (branch, stream) = layer.forward(&mut cx, model, l, branch, stream)?;
        }
        head(&mut cx, model, branch, stream)
    })?;
    Ok(Classified {
        pooled,
        logits,
        ns: start.elapsed().as_nanos() as u64,
        stats: cx.stats,
        dump: cx.dump.unwrap_or_default(),
        patch_embed,
    })
}

/// `image` checked against the model's size and cast to its dtype.
fn input(model: &VitModel, image: &HostTensor) -> Result<HostTensor> {
    let c = &model.config;
    let s = c.image_size;
    let want: [usize; 4] = match image.layout() {
        Some(Layout::Nhwc) => [1, s, s, c.channels],
        _ => [1, c.channels, s, s],
    };
    if image.shape() != want {
        return Err(Error::invalid(format!(
            "the image has shape {:?}; the model takes {want:?} ({} channels of {s}x{s}, config.json `image_size`)",
            image.shape(),
            c.channels
        )));
    }
    if image.dtype() == model.dtype {
        return Ok(image.clone());
    }
    Ok(HostTensor::from_f32_as(model.dtype, image.shape(), &image.to_f32_vec())?
        .with_layout(image.layout().unwrap_or(Layout::Nchw)))
}

/// `[CLS; patches]` `[N + 1, D]`, and what ran the patch embedding.
fn embed(cx: &mut Pass<'_>, model: &VitModel, image: HostTensor) -> Result<(HostTensor, (String, Vec<Transform>))> {
    let (d, n) = (model.config.hidden, model.config.patches());
    let args = OpArgs::PatchEmbed(PatchEmbedArgs {
        image,
        weight: model.patch.weight.clone(),
        bias: Some(model.patch.bias.clone()),
        attrs: PatchEmbedAttrs { patch: model.config.patch as u64 },
    });
    let ran = cx.dispatch(&args, Outputs::new())?;
    let what = (ran.selection().kernel.clone(), ran.selection().transforms.clone());
    let mut outputs = ran.outputs;
    let patches = take(&mut outputs, Op::PatchEmbed, "out")?;
    let patches = view(&patches, &[n, d], 0)?;
    cx.keep(|| "patch_embed".into(), &patches);
    // A copy into one buffer (data movement, as a KV cache write).
    let mut x = HostTensor::zeros(model.dtype, &[n + 1, d])?;
    x.write_at(0, &model.cls)?;
    x.write_at(d, &patches.contiguous())?;
    Ok((x, what))
}

impl VitLayer {
    /// Block `l`: `branch` added to the residual `stream` and normalized, attention, added
    /// and normalized again, the MLP; its output and the stream it is still to be added to.
    fn forward(
        &self,
        cx: &mut Pass<'_>,
        model: &VitModel,
        l: usize,
        branch: HostTensor,
        stream: HostTensor,
    ) -> Result<(HostTensor, HostTensor)> {
        let eps = model.config.eps;
        let (h, res) = Norm::layer(&self.attn_norm, eps).add(cx, branch, Some(stream))?;
        cx.keep(|| format!("hidden.{l}"), &res);
        if l > 0 {
            cx.keep(|| format!("layer.{}.out", l - 1), &res);
        }
        cx.keep(|| format!("layer.{l}.attn_norm"), &h);
        let a = self.attention(cx, model, &h)?;
        cx.keep(|| format!("layer.{l}.attn_out"), &a);
        let o = Linear::affine(&self.o).forward(cx, &a)?;
        cx.keep(|| format!("layer.{l}.o_proj"), &o);
        let (f, post) = Norm::layer(&self.ffn_norm, eps).add(cx, o, Some(res))?;
        cx.keep(|| format!("layer.{l}.post_attn"), &post);
        cx.keep(|| format!("layer.{l}.ffn_norm"), &f);
        let g = Linear::affine(&self.fc1).forward(cx, &f)?;
        let g = gelu(cx, g)?;
        let out = Linear::affine(&self.fc2).forward(cx, &g)?;
        cx.keep(|| format!("layer.{l}.ffn_out"), &out);
        Ok((out, post))
    }

    /// Self-attention over every row of `h` `[N + 1, D]`, before the output projection.
    fn attention(&self, cx: &mut Pass<'_>, model: &VitModel, h: &HostTensor) -> Result<HostTensor> {
        let c = &model.config;
        let (rows, d) = (c.patches() + 1, c.hidden);
        let mut heads = |p: &super::Affine| -> Result<HostTensor> {
            let t = Linear::affine(p).forward(cx, h)?;
            Ok(view(&t, &[1, rows, c.heads, d / c.heads], 0)?.with_layout(Layout::Bshd))
        };
        let (q, k, v) = (heads(&self.q)?, heads(&self.k)?, heads(&self.v)?);
        let args = OpArgs::Attention(AttentionArgs {
            q,
            k,
            v,
            mask: None,
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            attrs: AttentionAttrs::default(),
        });
        let a = cx.out(args, None)?;
        let a = if a.is_contiguous() { a } else { a.contiguous() };
        a.view(&[rows, d], &[d, 1], a.offset())
    }
}

/// The final LayerNorm of `branch` added to `stream`, its CLS row, and the classifier's
/// logits of it (a classifier's only).
fn head(
    cx: &mut Pass<'_>,
    model: &VitModel,
    branch: HostTensor,
    stream: HostTensor,
) -> Result<(HostTensor, Option<Vec<f32>>)> {
    let c = &model.config;
    let (normed, last) = Norm::layer(&model.norm, c.eps).add(cx, branch, Some(stream))?;
    cx.keep(|| format!("hidden.{}", c.layers), &last);
    if let Some(l) = c.layers.checked_sub(1) {
        cx.keep(|| format!("layer.{l}.out"), &last);
    }
    cx.keep(|| "final_norm".into(), &normed);
    let pooled = normed.view(&[1, c.hidden], &[c.hidden, 1], normed.offset())?;
    cx.keep(|| "pooled".into(), &pooled);
    let logits = match &model.classifier {
        Some(classifier) => {
            let l = Linear::affine(classifier).forward(cx, &pooled)?;
            cx.keep(|| "logits".into(), &l);
            Some(l.to_f32_vec())
        }
        None => None,
    };
    Ok((pooled, logits))
}
