//! A decoder layer's feed-forward part: the gated MLP (one fused `mlp` call, or with
//! biases its projections and SwiGLU one by one) or a mixture of experts (Mixtral,
//! Qwen2-MoE).

use super::{Linear, prepare};
use crate::config::ModelConfig;
use crate::pass::{Pass, Slot, Slots, take};
use crate::weights::{Ffn, MoeWeights, Proj};
use layerzero::error::{Error, Result};
use layerzero::exec::args::{MlpArgs, MoeExpertsArgs, MoeRouteArgs, OpArgs, SwigluArgs};
use layerzero::model::attrs::{MlpAttrs, MoeRouteAttrs, SwigluAttrs};
use layerzero::model::op::Op;
use layerzero::runtime::LayerZero;
use layerzero::tensor::{HostTensor, Storage};

/// A layer's MLP, dense or routed.
pub(crate) enum FeedForward<'w> {
    /// `down(silu(gate(x)) * up(x))`.
    Mlp(Mlp<'w>),
    /// A mixture of experts.
    Moe(MoeBlock<'w>),
}

impl<'w> FeedForward<'w> {
    /// Layer `l`'s MLP over `w`; every layer's shares `slots`' buffers.
    pub(crate) fn new(
        l: usize,
        w: &'w Ffn,
        gate_up: Option<&'w Proj>,
        c: &ModelConfig,
        slots: &mut Slots,
    ) -> Result<FeedForward<'w>> {
        Ok(match w {
            Ffn::Dense { gate: Proj::Dense(gate), up: Proj::Dense(up), down: Proj::Dense(down), bias: None } => {
                FeedForward::Mlp(Mlp::Fused { gate, up, down, slot: slots.named("mlp") })
            }
            // Biased, or quantized: the projections and SwiGLU one by one.
            Ffn::Dense { gate, up, down, bias } => {
                let [bg, bu, bd] = match bias {
                    Some([g, u, d]) => [Some(g), Some(u), Some(d)],
                    None => [None; 3],
                };
                FeedForward::Mlp(Mlp::Unfused {
                    gate: Linear::new(gate, bg, slots.named("mlp.gate"), slots),
                    up: Linear::new(up, bu, slots.named("mlp.up"), slots),
                    gate_up: gate_up.map(|p| Linear::new(p, None, slots.named("mlp.gate_up"), slots)),
                    act: slots.named("mlp.act"),
                    down: Linear::new(down, bd, slots.named("mlp.down"), slots),
                })
            }
            Ffn::Moe(m) => FeedForward::Moe(MoeBlock::new(l, m, c, slots)?),
        })
    }

    /// Prepares the weights for inputs like `x` `[rows, H]` and `inner` `[rows, I]`.
    pub(crate) fn prepare(&self, lz: &LayerZero, x: &HostTensor, inner: &HostTensor) -> Result<()> {
        match self {
            FeedForward::Mlp(Mlp::Fused { gate, up, down, .. }) => prepare(lz, &Mlp::fused(x.clone(), gate, up, down)),
            FeedForward::Mlp(Mlp::Unfused { gate, up, down, .. }) => {
                gate.prepare(lz, x)?;
                up.prepare(lz, x)?;
                down.prepare(lz, inner)
            }
            FeedForward::Moe(moe) => moe.router.prepare(lz, x),
        }
    }

    /// The MLP of `x` `[rows, H]`.
    pub(crate) fn forward(&self, cx: &mut Pass<'_>, x: HostTensor) -> Result<HostTensor> {
        match self {
            FeedForward::Mlp(mlp) => mlp.forward(cx, x),
            FeedForward::Moe(moe) => moe.forward(cx, x),
        }
    }
}

/// A gated MLP.
pub(crate) enum Mlp<'w> {
    /// Without biases: one `mlp` call.
    Fused { gate: &'w HostTensor, up: &'w HostTensor, down: &'w HostTensor, slot: Slot },
    /// With biases, or quantized: the gate and up projections (one stacked projection where
    /// the layer has it, SwiGLU reading its halves), SwiGLU, the down projection.
    Unfused { gate: Linear<'w>, up: Linear<'w>, gate_up: Option<Linear<'w>>, act: Slot, down: Linear<'w> },
}

impl Mlp<'_> {
    fn fused(x: HostTensor, gate: &HostTensor, up: &HostTensor, down: &HostTensor) -> OpArgs {
        OpArgs::Mlp(MlpArgs {
            x,
            w_gate: gate.clone(),
            w_up: up.clone(),
            w_down: down.clone(),
            attrs: MlpAttrs::default(),
        })
    }

    fn forward(&self, cx: &mut Pass<'_>, x: HostTensor) -> Result<HostTensor> {
        match self {
            Mlp::Fused { gate, up, down, slot } => cx.out(Mlp::fused(x, gate, up, down), Some(*slot)),
            Mlp::Unfused { gate, up, gate_up, act, down } => {
                let swiglu = match gate_up {
                    Some(both) => {
                        let gu = both.forward(cx, &x)?;
                        SwigluArgs { x: Some(gu), gate: None, up: None, attrs: SwigluAttrs { split: true } }
                    }
                    None => {
                        let [g, u] = Linear::forward_shared(cx, &x, [gate, up])?;
                        SwigluArgs { x: None, gate: Some(g), up: Some(u), attrs: SwigluAttrs::default() }
                    }
                };
                let a = cx.out(OpArgs::Swiglu(swiglu), Some(*act))?;
                down.forward(cx, &a)
            }
        }
    }
}

/// A mixture of experts: the router's logits, `moe_route` picks each row's experts and
/// weights, `moe_experts` runs and sums them. Qwen2-MoE's shared expert joins as more
/// experts every row picks (its slices of the routed inner size), each weighted
/// `sigmoid(shared_expert_gate(x))`: one grouped call for the whole block.
pub(crate) struct MoeBlock<'w> {
    layer: usize,
    router: Linear<'w>,
    route: MoeRouteAttrs,
    route_slot: Slot,
    /// Qwen2-MoE: shared_expert_gate, and the shared expert's slices of the stacked weights.
    shared: Option<(Linear<'w>, usize)>,
    w: &'w MoeWeights,
    /// Routed experts.
    experts: usize,
    slot: Slot,
    /// The shared expert alone, run only for a dump.
    shared_slot: Slot,
}

impl<'w> MoeBlock<'w> {
    fn new(l: usize, w: &'w MoeWeights, c: &ModelConfig, slots: &mut Slots) -> Result<MoeBlock<'w>> {
        let m = c.moe.as_ref().ok_or_else(|| Error::invalid("the model has no experts".to_owned()))?;
        let slices = w.gate.shape()[0].saturating_sub(m.experts);
        Ok(MoeBlock {
            layer: l,
            router: Linear::dense(&w.router, None, slots.named("moe.router")),
            route: MoeRouteAttrs { top_k: m.top_k as u64, renormalize: m.renormalize },
            route_slot: slots.named("moe.route"),
            shared: w.shared_gate.as_ref().map(|g| (Linear::dense(g, None, slots.named("moe.shared_gate")), slices)),
            w,
            experts: m.experts,
            slot: slots.named("moe.experts"),
            shared_slot: slots.named("moe.shared_out"),
        })
    }

    fn experts_call(&self, x: HostTensor, experts: HostTensor, weights: HostTensor) -> OpArgs {
        OpArgs::MoeExperts(MoeExpertsArgs {
            x,
            experts,
            weights,
            w_gate: self.w.gate.clone(),
            w_up: self.w.up.clone(),
            w_down: self.w.down.clone(),
            attrs: MlpAttrs::default(),
        })
    }

    fn forward(&self, cx: &mut Pass<'_>, x: HostTensor) -> Result<HostTensor> {
        let l = self.layer;
        let logits = self.router.forward(cx, &x)?;
        cx.keep(|| format!("layer.{l}.router_logits"), &logits);
        let mut routed =
            cx.run(OpArgs::MoeRoute(MoeRouteArgs { logits, attrs: self.route.clone() }), Some(self.route_slot))?;
        let mut experts = take(&mut routed, Op::MoeRoute, "experts")?;
        let mut weights = take(&mut routed, Op::MoeRoute, "weights")?;
        if let Some((gate, slices)) = &self.shared {
            (experts, weights) = self.add_shared(cx, &x, gate, *slices, &experts, &weights)?;
        }
        cx.out(self.experts_call(x, experts, weights), Some(self.slot))
    }

    /// Each row's routed experts and weights followed by the shared expert's `slices`,
    /// weighted by the row's `sigmoid(gate(x))`.
    fn add_shared(
        &self,
        cx: &mut Pass<'_>,
        x: &HostTensor,
        gate: &Linear<'_>,
        slices: usize,
        experts: &HostTensor,
        weights: &HostTensor,
    ) -> Result<(HostTensor, HostTensor)> {
        let (rows, k) = (x.shape()[0], self.route.top_k as usize);
        let g = gate.forward(cx, x)?.to_f64_vec();
        let scale: Vec<f32> = g.iter().map(|&z| (1.0 / (1.0 + (-z).exp())) as f32).collect();
        let (ids, wts) = (experts.to_i64_vec(), weights.to_f32_vec());
        let shared_ids = || (0..slices).map(|s| (self.experts + s) as i32);
        let width = k + slices;
        let mut all_ids = Vec::with_capacity(rows * width);
        let mut all_w = Vec::with_capacity(rows * width);
        for r in 0..rows {
            all_ids.extend(ids[r * k..(r + 1) * k].iter().map(|&e| e as i32));
            all_w.extend_from_slice(&wts[r * k..(r + 1) * k]);
            all_ids.extend(shared_ids());
            all_w.extend(std::iter::repeat_n(scale[r], slices));
        }
        if cx.dump.is_some() {
            let only_ids: Vec<i32> = (0..rows).flat_map(|_| shared_ids()).collect();
            let only_w: Vec<f32> = scale.iter().flat_map(|&s| std::iter::repeat_n(s, slices)).collect();
            let call = self.experts_call(
                x.clone(),
                HostTensor::new(Storage::I32(only_ids.into()), &[rows, slices])?,
                HostTensor::new(Storage::F32(only_w.into()), &[rows, slices])?,
            );
            let shared = cx.out(call, Some(self.shared_slot))?;
            let l = self.layer;
            cx.keep(|| format!("layer.{l}.shared_out"), &shared);
        }
        Ok((
            HostTensor::new(Storage::I32(all_ids.into()), &[rows, width])?,
            HostTensor::new(Storage::F32(all_w.into()), &[rows, width])?,
        ))
    }
}
