//! The layers models are made of. Each holds references into the loaded weights and the
//! slot its outputs are kept in between calls, and its `forward` dispatches through a
//! [`Pass`]: the decoder's layers here and in [`attention`] and [`mlp`], the projections and
//! norms of the encoder-decoder and the vision model too.

pub(crate) mod attention;
pub(crate) mod mlp;

use super::pass::{Affine, Pass, Slot, Slots, take};
use super::quant::Proj;
use layerzero::error::{ErrorKind, Result};
use layerzero::exec::args::{EmbeddingArgs, GeluArgs, Int4Args, LinearArgs, NormArgs, OpArgs, QuantizeArgs, W8a8Args};
use layerzero::model::attrs::{
    GeluAttrs, Int4Attrs, NoAttrs, NormAttrs, QuantAttrs, QuantScheme, ScaleLayout, W8a8Attrs,
};
use layerzero::model::op::Op;
use layerzero::runtime::LayerZero;
use layerzero::tensor::{HostTensor, row_major_strides};

/// A row-major view of `shape` over a contiguous tensor's elements from `offset` on.
pub(crate) fn view(t: &HostTensor, shape: &[usize], offset: usize) -> Result<HostTensor> {
    t.view(shape, &row_major_strides(shape), t.offset() + offset)
}

/// Lets the kernel `args` select prepare its constant operands (pack weights) now. A
/// request shaped for preparing may select nothing where the real ones do (a strict plan
/// without its bucket): then the kernel prepares on its first call instead.
pub(crate) fn prepare(lz: &LayerZero, args: &OpArgs) -> Result<()> {
    match lz.prepare(args) {
        Err(e) if e.kind() == ErrorKind::NoKernel => Ok(()),
        other => other.map(drop),
    }
}

/// A [`Linear`]'s weight: dense, or quantized at load.
#[derive(Clone, Copy)]
enum Weight<'w> {
    Dense(&'w HostTensor),
    Quantized(&'w Proj),
}

/// `x W^T (+ b)`: `linear` on a dense weight, `linear_int4` on a 4-bit one, and on an int8
/// one `quantize` (x in the weight's blocks) then `linear_w8a8`.
pub(crate) struct Linear<'w> {
    weight: Weight<'w>,
    bias: Option<&'w HostTensor>,
    slot: Option<Slot>,
    /// Where an int8 projection's quantized input waits between calls.
    x8: Option<Slot>,
}

impl<'w> Linear<'w> {
    /// A projection writing into `slot`.
    pub(crate) fn new(weight: &'w Proj, bias: Option<&'w HostTensor>, slot: Slot, slots: &mut Slots) -> Linear<'w> {
        let x8 = matches!(weight, Proj::Int8 { .. }).then(|| slots.named("linear.x8"));
        let weight = match weight {
            Proj::Dense(t) => Weight::Dense(t),
            quantized => Weight::Quantized(quantized),
        };
        Linear { weight, bias, slot: Some(slot), x8 }
    }

    /// A dense projection writing into `slot`.
    pub(crate) fn dense(weight: &'w HostTensor, bias: Option<&'w HostTensor>, slot: Slot) -> Linear<'w> {
        Linear { weight: Weight::Dense(weight), bias, slot: Some(slot), x8: None }
    }

    /// A dense projection with its bias, its outputs not kept.
    pub(crate) fn affine(p: &'w Affine) -> Linear<'w> {
        Linear { weight: Weight::Dense(&p.weight), bias: Some(&p.bias), slot: None, x8: None }
    }

    /// The projections `ps` of one `x` (q, k and v; gate and up): int8 ones in the same blocks
    /// share one `quantize` of x.
    pub(crate) fn forward_shared<const N: usize>(
        cx: &mut Pass<'_>,
        x: &HostTensor,
        ps: [&Linear<'_>; N],
    ) -> Result<[HostTensor; N]> {
        let group = |p: &Linear<'_>| match p.weight {
            Weight::Quantized(Proj::Int8 { group, .. }) => Some(*group),
            _ => None,
        };
        let shared = group(ps[0]).filter(|g| ps.iter().all(|p| group(p) == Some(*g)));
        // An array filled in place (a decode step allocates nothing), each slot overwritten.
        let mut out: [HostTensor; N] = std::array::from_fn(|_| x.clone());
        let quantized = shared.map(|g| quantize_x(cx, x, g, ps[0].x8)).transpose()?;
        for (o, p) in out.iter_mut().zip(ps) {
            *o = match &quantized {
                Some((xq, xs)) => p.w8a8(cx, x, xq, xs)?,
                None => p.forward(cx, x)?,
            };
        }
        Ok(out)
    }

    /// `linear_w8a8` of x quantized as (`xq`, `xs`) against this int8 weight.
    fn w8a8(&self, cx: &mut Pass<'_>, x: &HostTensor, xq: &HostTensor, xs: &HostTensor) -> Result<HostTensor> {
        let Weight::Quantized(Proj::Int8 { weight, scale, group }) = self.weight else {
            return Err(layerzero::error::Error::invalid("linear_w8a8 of a projection that is not int8".to_owned()));
        };
        let args = OpArgs::LinearW8a8(W8a8Args {
            x: xq.clone(),
            x_scale: xs.clone(),
            weight: weight.clone(),
            w_scale: scale.clone(),
            bias: self.bias.cloned(),
            attrs: W8a8Attrs { out_dtype: Some(x.dtype()), group_size: Some(*group as u64) },
        });
        cx.out(args, self.slot)
    }

    pub(crate) fn forward(&self, cx: &mut Pass<'_>, x: &HostTensor) -> Result<HostTensor> {
        let bias = self.bias.cloned();
        let args = match self.weight {
            Weight::Dense(w) | Weight::Quantized(Proj::Dense(w)) => {
                OpArgs::Linear(LinearArgs { x: x.clone(), weight: w.clone(), bias, attrs: NoAttrs {} })
            }
            Weight::Quantized(Proj::Int4 { packed, scales, group, activations }) => OpArgs::LinearInt4(Int4Args {
                x: x.clone(),
                weight: packed.clone(),
                scales: scales.clone(),
                zeros: None,
                bias,
                global_scale: None,
                attrs: Int4Attrs { activations: *activations, ..Int4Attrs::int4(*group as u64) },
            }),
            Weight::Quantized(Proj::Int8 { group, .. }) => {
                let (xq, xs) = quantize_x(cx, x, *group, self.x8)?;
                return self.w8a8(cx, x, &xq, &xs);
            }
        };
        cx.out(args, self.slot)
    }

    /// Prepares a dense weight for inputs shaped like `x` (the bias plays no part in
    /// packing); the quantized kernels read their weights as they are.
    pub(crate) fn prepare(&self, lz: &LayerZero, x: &HostTensor) -> Result<()> {
        let Weight::Dense(w) = self.weight else { return Ok(()) };
        let args = LinearArgs { x: x.clone(), weight: w.clone(), bias: None, attrs: NoAttrs {} };
        prepare(lz, &OpArgs::Linear(args))
    }
}

/// x quantized in blocks of `group` (`quantize`, per block `[1, group]`, row-major scales):
/// the codes and the scales.
fn quantize_x(cx: &mut Pass<'_>, x: &HostTensor, group: usize, slot: Option<Slot>) -> Result<(HostTensor, HostTensor)> {
    let attrs = QuantAttrs {
        block: Some([1, group as u64]),
        scale_layout: Some(ScaleLayout::RowMajor),
        ..QuantAttrs::of(QuantScheme::PerBlock)
    };
    let mut q = cx.run(OpArgs::Quantize(QuantizeArgs { x: x.clone(), attrs }), slot)?;
    Ok((take(&mut q, Op::Quantize, "out")?, take(&mut q, Op::Quantize, "scale")?))
}

/// RMSNorm (decoders) or LayerNorm with its shift (BART, ViT), either with the residual
/// add fused: `norm(x + residual)`, and the sum.
pub(crate) struct Norm<'w> {
    op: Op,
    weight: &'w HostTensor,
    bias: Option<&'w HostTensor>,
    eps: f64,
    slot: Option<Slot>,
}

impl<'w> Norm<'w> {
    /// RMSNorm writing into `slot`.
    pub(crate) fn rms(weight: &'w HostTensor, eps: f64, slot: Slot) -> Norm<'w> {
        Norm { op: Op::RmsNorm, weight, bias: None, eps, slot: Some(slot) }
    }

    /// LayerNorm with scale and shift `n`, its outputs not kept.
    pub(crate) fn layer(n: &'w Affine, eps: f64) -> Norm<'w> {
        Norm { op: Op::LayerNorm, weight: &n.weight, bias: Some(&n.bias), eps, slot: None }
    }

    fn args(&self, x: HostTensor, residual: Option<HostTensor>) -> OpArgs {
        let args = NormArgs {
            x,
            weight: self.weight.clone(),
            bias: self.bias.cloned(),
            residual,
            attrs: NormAttrs { eps: Some(self.eps) },
        };
        if self.op == Op::RmsNorm { OpArgs::RmsNorm(args) } else { OpArgs::LayerNorm(args) }
    }

    /// `norm(x)`.
    pub(crate) fn forward(&self, cx: &mut Pass<'_>, x: HostTensor) -> Result<HostTensor> {
        cx.out(self.args(x, None), self.slot)
    }

    /// `norm(x + residual)` and `x + residual`; without a residual, `norm(x)` and `x`.
    pub(crate) fn add(
        &self,
        cx: &mut Pass<'_>,
        x: HostTensor,
        residual: Option<HostTensor>,
    ) -> Result<(HostTensor, HostTensor)> {
        match residual {
            None => Ok((self.forward(cx, x.clone())?, x)),
            Some(r) => {
                // `x` goes into the call and no handle of it stays here, so its buffer can be
                // written again by the op that produced it.
                let mut o = cx.run(self.args(x, Some(r)), self.slot)?;
                Ok((take(&mut o, self.op, "out")?, take(&mut o, self.op, "residual_out")?))
            }
        }
    }
}

/// Rows of an embedding table, by token id.
pub(crate) struct Embedding<'w> {
    table: &'w HostTensor,
    slot: Option<Slot>,
}

impl<'w> Embedding<'w> {
    /// A lookup in `table` writing into `slot` (none: not kept).
    pub(crate) fn new(table: &'w HostTensor, slot: Option<Slot>) -> Embedding<'w> {
        Embedding { table, slot }
    }

    /// The rows of `ids` `[n]`: `[n, width]`.
    pub(crate) fn forward(&self, cx: &mut Pass<'_>, ids: HostTensor) -> Result<HostTensor> {
        cx.out(OpArgs::Embedding(EmbeddingArgs { ids, table: self.table.clone(), attrs: NoAttrs {} }), self.slot)
    }
}

/// The exact GELU of `x` (outputs not kept).
pub(crate) fn gelu(cx: &mut Pass<'_>, x: HostTensor) -> Result<HostTensor> {
    cx.out(OpArgs::Gelu(GeluArgs { x, attrs: GeluAttrs::default() }), None)
}
