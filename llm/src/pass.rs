//! The one dispatch helper every model's forward pass goes through (decoders, the
//! encoder-decoder, the vision model): an op dispatched while counting what ran, its named
//! output taken with an error that names the op, its buffers kept for its next call, and
//! named stages kept for a dump (`lz diff`).

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use layerzero::error::{Error, Result};
use layerzero::exec::args::{OpArgs, Outputs};
use layerzero::model::op::Op;
use layerzero::model::request::Request;
use layerzero::runtime::{Dispatch, LayerZero, SelectionSource};
use layerzero::tensor::HostTensor;

/// Runs a whole pass on a rayon worker, so each parallel kernel starts inline there
/// (`forward::Session::forward_batch` says why): the process's pool, or in a forked child a
/// pool of the child's own, the parent's workers having stayed in the parent
/// (`layerzero::backend::cpu::fork`); a child that cannot start one gets an error, not a hang.
pub fn on_pool<T: Send>(pass: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    layerzero::backend::cpu::fork::in_live_pool(|| rayon::scope(|_| pass()))
        .map_err(|why| Error::new(layerzero::error::ErrorKind::KernelFailed, why))?
}

/// A weight and its bias: a projection (`[out, in]`, `[out]`) or a LayerNorm's scale and
/// shift (`[d]`, `[d]`).
#[derive(Debug, Clone)]
pub struct Affine {
    /// The weight.
    pub weight: HostTensor,
    /// The bias.
    pub bias: HostTensor,
}

/// What ran for one op over a generation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OpStats {
    /// Calls, by the kernel that produced the outputs.
    pub kernels: BTreeMap<String, u64>,
    /// Selections served by the dispatch table.
    pub plan_hits: u64,
    /// Selections served by the selection cache.
    pub cache_hits: u64,
    /// Live selections.
    pub live: u64,
    /// Calls whose first choice failed and another kernel ran.
    pub fallbacks: u64,
    /// Wall time in these calls (selection, kernels, output allocation), ns.
    pub ns: u64,
    /// Of `ns`, selecting (when the handle times dispatches: `--profile`), ns.
    #[serde(skip_serializing_if = "is_zero")]
    pub select_ns: u64,
    /// Of `ns`, running the kernels with the runtime's guards (when timed), ns.
    #[serde(skip_serializing_if = "is_zero")]
    pub run_ns: u64,
    /// Bytes of the calls' tensors, inputs and outputs (what a kernel reads and writes at
    /// least: the weights, for a decode step's projections; when timed).
    #[serde(skip_serializing_if = "is_zero")]
    pub bytes: u64,
}

/// The shadow checks of one stage of a model (`lz generate --verify-every`): a layer, or what
/// runs outside the layers (embedding, final norm, head, sampling).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageCheck {
    /// `layer.3`, or `outside`.
    pub stage: String,
    /// Calls checked.
    pub checks: u64,
    /// The lowest cosine with the reference.
    pub min_cosine: f64,
    /// The op of that lowest cosine.
    pub worst_op: String,
    /// The largest NMSE.
    pub max_nmse: f64,
    /// Checks that diverged: `kernel (op): cosine c, compared`.
    pub diverged: Vec<String>,
}

impl StageCheck {
    fn new(stage: String) -> StageCheck {
        StageCheck { stage, checks: 0, min_cosine: 1.0, worst_op: String::new(), max_nmse: 0.0, diverged: Vec::new() }
    }

    fn add(&mut self, c: &layerzero::runtime::Checked) {
        self.checks += 1;
        if c.cosine < self.min_cosine || self.worst_op.is_empty() {
            self.min_cosine = self.min_cosine.min(c.cosine);
            self.worst_op = c.op.as_str().to_owned();
        }
        self.max_nmse = self.max_nmse.max(c.nmse);
        if c.diverged {
            self.diverged.push(format!("{} ({}): cosine {:.4}, {}", c.kernel, c.op, c.cosine, c.compared));
        }
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Where an op's outputs wait between calls, to be handed back as the buffers of its next
/// call (so a warm decode step allocates no outputs). Layers are given one when built; the
/// pass holds what is in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot(usize);

/// Hands out slots while a model's layers are built: the same name, the same slot.
#[derive(Debug, Default)]
pub(crate) struct Slots(Vec<&'static str>);

impl Slots {
    /// The slot called `name`, new on its first request.
    pub(crate) fn named(&mut self, name: &'static str) -> Slot {
        match self.0.iter().position(|n| *n == name) {
            Some(i) => Slot(i),
            None => {
                self.0.push(name);
                Slot(self.0.len() - 1)
            }
        }
    }
}

/// Dispatches one model's ops through a handle.
pub(crate) struct Pass<'a> {
    lz: &'a LayerZero,
    /// Per slot, the outputs of its last call.
    kept: Vec<Outputs>,
    /// Per op, what ran.
    pub(crate) stats: BTreeMap<Op, OpStats>,
    /// The stages kept, when dumping.
    pub(crate) dump: Option<BTreeMap<String, HostTensor>>,
    /// Every request dispatched, when recording (`lz workload`).
    pub(crate) record: Option<Vec<Request>>,
    /// The layer being run (`None`: outside the layers), for the shadow checks' report.
    pub(crate) layer: Option<usize>,
    /// Shadow checks by stage (layers in order, then outside).
    pub(crate) checks: BTreeMap<usize, StageCheck>,
}

impl<'a> Pass<'a> {
    /// A pass through `lz`, keeping stages when `dump`.
    pub(crate) fn new(lz: &'a LayerZero, dump: bool) -> Pass<'a> {
        Pass {
            lz,
            kept: Vec::new(),
            stats: BTreeMap::new(),
            dump: dump.then(BTreeMap::new),
            record: None,
            layer: None,
            checks: BTreeMap::new(),
        }
    }

    /// Dispatches `args` into `buffers` and counts what ran.
    pub(crate) fn dispatch(&mut self, args: &OpArgs, buffers: Outputs) -> Result<Dispatch<'a>> {
        if let Some(r) = &mut self.record {
            r.push(args.describe());
        }
        let start = Instant::now();
        let d = self.lz.dispatch_into(args, buffers)?;
        record(&mut self.stats, args.op(), &d, start.elapsed().as_nanos() as u64);
        for c in d.shadow_checks() {
            let (key, stage) = match self.layer {
                Some(l) => (l, format!("layer.{l}")),
                None => (usize::MAX, "outside".to_owned()),
            };
            self.checks.entry(key).or_insert_with(|| StageCheck::new(stage)).add(c);
        }
        if let (Some(t), Some(s)) = (d.timing(), self.stats.get_mut(&args.op())) {
            s.select_ns += t.select_ns;
            s.run_ns += t.run_ns;
            let bytes = |x: &HostTensor| x.numel() as u64 * x.dtype().size_bytes();
            let out: u64 = d.outputs.iter().map(|(_, x)| bytes(x)).sum();
            s.bytes += match args {
                // A lookup reads the rows it gathers, not its table.
                OpArgs::Embedding(e) => bytes(&e.ids) + 2 * out,
                _ => args.tensors().iter().map(|(_, x)| bytes(x)).sum::<u64>() + out,
            };
        }
        Ok(d)
    }

    /// The outputs of `args`, written into `slot`'s buffers, which then keep them for the
    /// next call (fresh buffers, not kept, without a slot). The caller drops its handles
    /// before the slot's next use, or that call cannot write in place.
    pub(crate) fn run(&mut self, args: OpArgs, slot: Option<Slot>) -> Result<Outputs> {
        let Some(Slot(i)) = slot else {
            return Ok(self.dispatch(&args, Outputs::new())?.outputs);
        };
        if i >= self.kept.len() {
            self.kept.resize_with(i + 1, Outputs::new);
        }
        let buffers = std::mem::take(&mut self.kept[i]);
        let d = self.dispatch(&args, buffers)?;
        // The arguments hold views of earlier outputs: released before anything else runs.
        drop(args);
        self.kept[i] = d.outputs.clone();
        Ok(d.outputs)
    }

    /// The shadow checks so far, by stage in order; collecting starts again.
    pub(crate) fn take_checks(&mut self) -> Vec<StageCheck> {
        std::mem::take(&mut self.checks).into_values().collect()
    }

    /// The `out` output of `args` (see [`run`](Pass::run)).
    pub(crate) fn out(&mut self, args: OpArgs, slot: Option<Slot>) -> Result<HostTensor> {
        let op = args.op();
        take(&mut self.run(args, slot)?, op, "out")
    }

    /// Keeps `t` as stage `name` (as f32), when dumping. Dumps are `[tokens, features]`, as
    /// HF's are: heads are flattened.
    pub(crate) fn keep(&mut self, name: impl FnOnce() -> String, t: &HostTensor) {
        if let Some(d) = &mut self.dump {
            let shape = match t.shape() {
                [.., h, dim] if t.rank() > 2 => vec![t.numel() / (h * dim).max(1), h * dim],
                s => s.to_vec(),
            };
            if let Ok(x) = HostTensor::from_f32(&shape, t.to_f32_vec()) {
                d.insert(name(), x);
            }
        }
    }
}

/// Output `name` of an `op` call's `outputs`.
pub(crate) fn take(outputs: &mut Outputs, op: Op, name: &str) -> Result<HostTensor> {
    outputs.remove(name).ok_or_else(|| Error::invalid(format!("{op} produced no `{name}` output")))
}

/// `a`'s counts added into `b`'s (a generation's phases into its whole).
pub(crate) fn merged(a: &BTreeMap<Op, OpStats>, mut b: BTreeMap<Op, OpStats>) -> BTreeMap<Op, OpStats> {
    for (op, s) in a {
        let t = b.entry(*op).or_default();
        for (k, n) in &s.kernels {
            *t.kernels.entry(k.clone()).or_default() += n;
        }
        t.plan_hits += s.plan_hits;
        t.cache_hits += s.cache_hits;
        t.live += s.live;
        t.fallbacks += s.fallbacks;
        t.ns += s.ns;
        t.select_ns += s.select_ns;
        t.run_ns += s.run_ns;
        t.bytes += s.bytes;
    }
    b
}

/// Counts one dispatch of `op` that took `ns` into `stats`.
fn record(stats: &mut BTreeMap<Op, OpStats>, op: Op, d: &Dispatch<'_>, ns: u64) {
    let s = stats.entry(op).or_default();
    s.ns += ns;
    let kernel = &d.selection().kernel;
    match s.kernels.get_mut(kernel) {
        Some(n) => *n += 1,
        None => {
            s.kernels.insert(kernel.clone(), 1);
        }
    }
    match d.source() {
        SelectionSource::Plan => s.plan_hits += 1,
        SelectionSource::Cache => s.cache_hits += 1,
        SelectionSource::Live => s.live += 1,
    }
    if d.fell_back() {
        s.fallbacks += 1;
    }
}
