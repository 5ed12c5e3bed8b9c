//! What the encoder-decoder and vision forward passes share: dispatching an op while counting
//! what ran, keeping named stages for a dump, and the projections and LayerNorms (with the
//! residual fused) their blocks are made of.

use std::collections::BTreeMap;
use std::time::Instant;

use super::forward::{OpStats, record};
use crate::error::{Error, Result};
use crate::exec::args::{GeluArgs, LinearArgs, NormArgs, OpArgs, Outputs};
use crate::model::attrs::{GeluAttrs, NoAttrs, NormAttrs};
use crate::model::op::Op;
use crate::runtime::{Dispatch, LayerZero};
use crate::tensor::HostTensor;

/// A weight and its bias: a projection (`[out, in]`, `[out]`) or a LayerNorm's scale and
/// shift (`[d]`, `[d]`).
#[derive(Debug, Clone)]
pub struct Affine {
    /// The weight.
    pub weight: HostTensor,
    /// The bias.
    pub bias: HostTensor,
}

/// Dispatches one forward pass's ops through a handle.
pub(crate) struct Dispatcher<'a> {
    lz: &'a LayerZero,
    /// Per op, what ran.
    pub(crate) stats: BTreeMap<Op, OpStats>,
    /// The stages kept, when dumping.
    pub(crate) dump: Option<BTreeMap<String, HostTensor>>,
}

impl<'a> Dispatcher<'a> {
    /// A pass through `lz`, keeping stages when `dump`.
    pub(crate) fn new(lz: &'a LayerZero, dump: bool) -> Dispatcher<'a> {
        Dispatcher { lz, stats: BTreeMap::new(), dump: dump.then(BTreeMap::new) }
    }

    /// Dispatches `args` and counts what ran.
    pub(crate) fn dispatch(&mut self, args: &OpArgs) -> Result<Dispatch<'a>> {
        let start = Instant::now();
        let d = self.lz.dispatch(args)?;
        record(&mut self.stats, args.op(), &d, start.elapsed().as_nanos() as u64);
        Ok(d)
    }

    /// The outputs of `args`.
    pub(crate) fn run(&mut self, args: OpArgs) -> Result<Outputs> {
        Ok(self.dispatch(&args)?.outputs)
    }

    /// The `out` output of `args`.
    pub(crate) fn out(&mut self, args: OpArgs) -> Result<HostTensor> {
        let op = args.op();
        self.run(args)?.remove("out").ok_or_else(|| Error::invalid(format!("{op} produced no `out`")))
    }

    /// Keeps `t` as stage `name` (as f32), when dumping.
    pub(crate) fn keep(&mut self, name: impl FnOnce() -> String, t: &HostTensor) {
        if let Some(d) = &mut self.dump
            && let Ok(x) = HostTensor::from_f32(t.shape(), t.to_f32_vec())
        {
            d.insert(name(), x);
        }
    }

    /// `x W^T + b`.
    pub(crate) fn linear(&mut self, x: &HostTensor, p: &Affine) -> Result<HostTensor> {
        self.out(OpArgs::Linear(LinearArgs {
            x: x.clone(),
            weight: p.weight.clone(),
            bias: Some(p.bias.clone()),
            attrs: NoAttrs {},
        }))
    }

    /// The exact GELU of `x`.
    pub(crate) fn gelu(&mut self, x: HostTensor) -> Result<HostTensor> {
        self.out(OpArgs::Gelu(GeluArgs { x, attrs: GeluAttrs::default() }))
    }

    /// `norm(x + residual)` and the sum (`norm(x)` and `x` without a residual).
    pub(crate) fn layer_norm(
        &mut self,
        x: HostTensor,
        n: &Affine,
        residual: Option<HostTensor>,
        eps: f64,
    ) -> Result<(HostTensor, HostTensor)> {
        let fused = residual.is_some();
        let mut o = self.run(OpArgs::LayerNorm(NormArgs {
            x: x.clone(),
            weight: n.weight.clone(),
            bias: Some(n.bias.clone()),
            residual,
            attrs: NormAttrs { eps: Some(eps) },
        }))?;
        let out = o.remove("out").ok_or_else(|| Error::invalid("layer_norm produced no `out`".to_owned()))?;
        let sum = if fused {
            o.remove("residual_out").ok_or_else(|| Error::invalid("layer_norm dropped the residual".to_owned()))?
        } else {
            x
        };
        Ok((out, sum))
    }
}
