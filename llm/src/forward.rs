//! The forward pass of a decoder, one sequence: every op (embedding, RMSNorm with the
//! residual fused, the projections, RoPE, attention against the KV cache, the gated MLP, the
//! LM head) is a dispatch through LayerZero. The KV cache is preallocated per layer and
//! written in place; attention reads a view of its first `len` positions.
//!
//! With a dump, the stages HF transformers names are kept (`hidden.{i}`, `layer.{l}.{stage}`,
//! `logits.{k}`) so `lz diff` can find the first one that diverges.

use std::collections::BTreeMap;

use serde::Serialize;
use smallvec::SmallVec;

use super::Model;
use super::config::ModelConfig;
use super::weights::{Ffn, MoeWeights};
use crate::error::{Error, ErrorKind, Result};
use crate::exec::args::{
    AttentionArgs, EmbeddingArgs, LinearArgs, MlpArgs, MoeExpertsArgs, MoeRouteArgs, NormArgs, OpArgs, Outputs,
    PagedAttentionArgs, RopeArgs, SwigluArgs,
};
use crate::model::attrs::{AttentionAttrs, MlpAttrs, MoeRouteAttrs, NoAttrs, NormAttrs, SwigluAttrs};
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::op::Op;
use crate::runtime::{LayerZero, SelectionSource};
use crate::tensor::{HostTensor, Storage, row_major_strides};

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
}

/// How keys and values are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvKind {
    /// One contiguous `[1, capacity, kv_heads, head_dim]` buffer per layer: one sequence.
    #[default]
    Contiguous,
    /// A pool of `[pages, page_size, kv_heads, head_dim]` pages per layer addressed by a
    /// block table per sequence: several sequences decode together.
    Paged {
        /// Positions per page.
        page_size: usize,
    },
}

/// The KV cache: per layer, keys and values, and per sequence its length.
struct Kv {
    kind: KvKind,
    k: Vec<HostTensor>,
    v: Vec<HostTensor>,
    /// Per sequence: its pages (paged) and its length.
    pages: Vec<Vec<u32>>,
    lens: Vec<usize>,
    capacity: Vec<usize>,
}

/// Rows of the prefill-shaped requests with which the projections' kernels are prepared.
const PREPARE_ROWS: usize = 16;

/// Lets the kernels of the model's projections prepare their weights at load (pack them
/// into the layout a prefill wants), so that no prompt pays for it and none repacks.
fn prepare(model: &Model, lz: &LayerZero) -> Result<()> {
    let (c, w) = (&model.config, &model.weights);
    let x = |cols: usize| HostTensor::zeros(model.dtype, &[PREPARE_ROWS, cols]);
    let (xh, xq, xi) = (x(c.hidden)?, x(c.heads * c.head_dim)?, x(c.intermediate)?);
    // A request of this shape may select nothing where the real ones do (a strict plan
    // without its bucket): then the kernel prepares on its first call instead.
    let tolerant = |r: Result<String>| match r {
        Err(e) if e.kind() == ErrorKind::NoKernel => Ok(()),
        other => other.map(drop),
    };
    let linear = |x: &HostTensor, weight: &HostTensor| {
        tolerant(lz.prepare(&OpArgs::Linear(LinearArgs {
            x: x.clone(),
            weight: weight.clone(),
            bias: None,
            attrs: NoAttrs {},
        })))
    };
    for lw in &w.layers {
        for weight in [&lw.q, &lw.k, &lw.v] {
            linear(&xh, weight)?;
        }
        linear(&xq, &lw.o)?;
        match &lw.ffn {
            Ffn::Dense { gate, up, down, bias: Some(_) } => {
                linear(&xh, gate)?;
                linear(&xh, up)?;
                linear(&xi, down)?;
            }
            Ffn::Dense { gate, up, down, bias: None } => {
                tolerant(lz.prepare(&OpArgs::Mlp(MlpArgs {
                    x: xh.clone(),
                    w_gate: gate.clone(),
                    w_up: up.clone(),
                    w_down: down.clone(),
                    attrs: MlpAttrs::default(),
                })))?;
            }
            Ffn::Moe(m) => linear(&xh, &m.router)?,
        }
    }
    linear(&xh, &w.lm_head)?;
    Ok(())
}

/// Where an op's outputs are kept between calls, to be handed back as the buffers of the
/// same op's next call (so a warm decode step allocates no outputs). Each is used once per
/// forward pass, and the pass drops its own handles before the slot's next use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Embed,
    /// The first layer's input norm (it has no residual to add, so one output fewer than
    /// the others': sharing their slot would leave one buffer short every step).
    FirstNorm,
    AttnNorm,
    Q,
    K,
    V,
    QNorm,
    KNorm,
    Rope,
    Attn,
    O,
    FfnNorm,
    Mlp,
    Gate,
    Up,
    Act,
    Down,
    Router,
    Route,
    SharedGate,
    Experts,
    SharedOut,
    FinalNorm,
    Logits,
    Sample,
}

const SLOTS: usize = Slot::Sample as usize + 1;

/// The forward pass's small index inputs, and the f32 copy of logits computed in another
/// dtype, rewritten in place each call.
#[derive(Default)]
struct Inputs {
    ids: Option<HostTensor>,
    positions: Option<HostTensor>,
    table: Option<HostTensor>,
    lens: Option<HostTensor>,
    logits: Option<HostTensor>,
}

/// A tensor of `shape` holding `values`, written into `slot`'s storage when it is unshared
/// and has room (no allocation), else new; `slot` keeps a handle for next time.
macro_rules! refill {
    ($fn:ident, $t:ty, $variant:ident) => {
        fn $fn(slot: &mut Option<HostTensor>, values: impl Iterator<Item = $t>, shape: &[usize]) -> Result<HostTensor> {
            let n: usize = shape.iter().product();
            if let Some(old) = slot.take() {
                let mut shared = old.into_shared();
                if let Some(Storage::$variant(buf)) = std::sync::Arc::get_mut(&mut shared)
                    && !buf.is_mapped()
                    && buf.vec_mut().capacity() >= n
                {
                    let v = buf.vec_mut();
                    v.clear();
                    v.extend(values.take(n));
                    let t = HostTensor::from_shared(shared, shape)?;
                    *slot = Some(t.clone());
                    return Ok(t);
                }
            }
            let t = HostTensor::new(Storage::$variant(values.take(n).collect()), shape)?;
            *slot = Some(t.clone());
            Ok(t)
        }
    };
}
refill!(refill_i64, i64, I64);
refill!(refill_i32, i32, I32);
refill!(refill_f32, f32, F32);

/// Counts one dispatch of `op` that took `ns` into `stats`.
pub(crate) fn record(stats: &mut BTreeMap<Op, OpStats>, op: Op, d: &crate::runtime::Dispatch<'_>, ns: u64) {
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

/// Sequences being run: the model, the handle every op is dispatched through, the KV cache
/// and what ran.
pub struct Session<'m> {
    model: &'m Model,
    lz: &'m LayerZero,
    kv: Kv,
    /// Per slot, the outputs of its last call (handed back as buffers).
    bufs: [Outputs; SLOTS],
    inputs: Inputs,
    /// Per op, what ran.
    pub stats: BTreeMap<Op, OpStats>,
    dump: Option<BTreeMap<String, HostTensor>>,
    /// Every request dispatched, when recording (`lz workload`).
    record: Option<Vec<crate::model::request::Request>>,
}

/// A `[rows, cols]` row-major view of a contiguous tensor's elements starting at `offset`.
fn view(t: &HostTensor, shape: &[usize], offset: usize) -> Result<HostTensor> {
    t.view(shape, &row_major_strides(shape), t.offset() + offset)
}

impl<'m> Session<'m> {
    /// A session of one sequence with room for `capacity` positions (prompt and generated
    /// tokens) in a contiguous cache.
    pub fn new(model: &'m Model, lz: &'m LayerZero, capacity: usize) -> Result<Session<'m>> {
        Session::with_cache(model, lz, &[capacity], KvKind::Contiguous)
    }

    /// A session of `capacities.len()` sequences, each with room for its capacity, in a
    /// cache of `kind` (a contiguous cache holds one sequence).
    pub fn with_cache(model: &'m Model, lz: &'m LayerZero, capacities: &[usize], kind: KvKind) -> Result<Session<'m>> {
        let c = &model.config;
        if capacities.is_empty() || capacities.contains(&0) {
            return Err(Error::invalid("every sequence needs room for at least one position".to_owned()));
        }
        let (shape, pages) = match kind {
            KvKind::Contiguous if capacities.len() == 1 => {
                ([1, capacities[0], c.kv_heads, c.head_dim], vec![Vec::new()])
            }
            KvKind::Contiguous => {
                return Err(Error::invalid(format!(
                    "a contiguous KV cache holds one sequence; {} need a paged cache (--kv paged)",
                    capacities.len()
                )));
            }
            KvKind::Paged { page_size: 0 } => return Err(Error::invalid("--page-size must be at least 1".to_owned())),
            KvKind::Paged { page_size } => {
                let mut next = 0u32;
                let pages: Vec<Vec<u32>> = capacities
                    .iter()
                    .map(|&cap| {
                        let n = cap.div_ceil(page_size) as u32;
                        next += n;
                        // Pages are handed out back to front so that a sequence's pages are
                        // not in order: the block table, not the layout, decides.
                        (next - n..next).rev().collect()
                    })
                    .collect();
                ([next as usize, page_size, c.kv_heads, c.head_dim], pages)
            }
        };
        let layout = if matches!(kind, KvKind::Paged { .. }) { Layout::Nhd } else { Layout::Bshd };
        let cache = || -> Result<Vec<HostTensor>> {
            (0..c.layers).map(|_| HostTensor::zeros(model.dtype, &shape).map(|t| t.with_layout(layout))).collect()
        };
        prepare(model, lz)?;
        Ok(Session {
            model,
            lz,
            kv: Kv {
                kind,
                k: cache()?,
                v: cache()?,
                pages,
                lens: vec![0; capacities.len()],
                capacity: capacities.to_vec(),
            },
            bufs: std::array::from_fn(|_| Outputs::new()),
            inputs: Inputs::default(),
            stats: BTreeMap::new(),
            dump: None,
            record: None,
        })
    }

    /// Keeps every stage of the following forward calls for `lz diff`.
    pub fn with_dump(mut self) -> Session<'m> {
        self.dump = Some(BTreeMap::new());
        self
    }

    /// Records every request dispatched from now on.
    pub fn with_recording(mut self) -> Session<'m> {
        self.record = Some(Vec::new());
        self
    }

    /// The requests recorded so far.
    pub fn take_recorded(&mut self) -> Vec<crate::model::request::Request> {
        self.record.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The stages kept so far (empty without a dump).
    pub fn take_dump(&mut self) -> BTreeMap<String, HostTensor> {
        self.dump.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Positions cached for sequence `seq`.
    pub fn len(&self, seq: usize) -> usize {
        self.kv.lens.get(seq).copied().unwrap_or(0)
    }

    /// Forgets sequence `seq`'s positions from `len` on (a speculative round's rejected
    /// tokens): the next forward writes over them.
    pub fn truncate(&mut self, seq: usize, len: usize) -> Result<()> {
        match self.kv.lens.get_mut(seq) {
            Some(n) if len <= *n => {
                *n = len;
                Ok(())
            }
            Some(n) => Err(Error::invalid(format!("sequence {seq} caches {n} positions; it cannot grow to {len}"))),
            None => Err(Error::invalid(format!("sequence {seq} is not in this session"))),
        }
    }

    fn keep(&mut self, name: impl FnOnce() -> String, t: &HostTensor) {
        if let Some(d) = &mut self.dump {
            // Dumps are `[tokens, features]`, as HF's are: heads are flattened.
            let shape = match t.shape() {
                [.., h, dim] if t.rank() > 2 => vec![t.numel() / (h * dim).max(1), h * dim],
                s => s.to_vec(),
            };
            let f32s = HostTensor::from_f32(&shape, t.to_f32_vec());
            if let Ok(x) = f32s {
                d.insert(name(), x);
            }
        }
    }

    /// Dispatches one op into `slot`'s buffers and records what ran.
    fn run(&mut self, args: OpArgs, slot: Slot) -> Result<Outputs> {
        let op = args.op();
        if let Some(r) = &mut self.record {
            r.push(args.describe());
        }
        let start = std::time::Instant::now();
        let buffers = std::mem::take(&mut self.bufs[slot as usize]);
        let d = self.lz.dispatch_into(&args, buffers)?;
        drop(args);
        record(&mut self.stats, op, &d, start.elapsed().as_nanos() as u64);
        self.bufs[slot as usize] = d.outputs.clone();
        Ok(d.outputs)
    }

    /// Runs the `sample` op: the token ids it chose.
    pub(crate) fn sample(&mut self, args: OpArgs) -> Result<HostTensor> {
        self.take(args, Slot::Sample, "tokens")
    }

    fn out(&mut self, args: OpArgs, slot: Slot) -> Result<HostTensor> {
        self.take(args, slot, "out")
    }

    fn take(&mut self, args: OpArgs, slot: Slot, name: &str) -> Result<HostTensor> {
        let op = args.op();
        self.run(args, slot)?.remove(name).ok_or_else(|| Error::invalid(format!("{op} produced no `{name}` output")))
    }

    fn linear(
        &mut self,
        x: &HostTensor,
        weight: &HostTensor,
        bias: Option<&HostTensor>,
        slot: Slot,
    ) -> Result<HostTensor> {
        self.out(
            OpArgs::Linear(LinearArgs { x: x.clone(), weight: weight.clone(), bias: bias.cloned(), attrs: NoAttrs {} }),
            slot,
        )
    }

    fn rms_norm(
        &mut self,
        x: HostTensor,
        weight: &HostTensor,
        residual: Option<HostTensor>,
        slot: Slot,
    ) -> Result<Outputs> {
        let eps = Some(self.model.config.eps);
        self.run(
            OpArgs::RmsNorm(NormArgs { x, weight: weight.clone(), bias: None, residual, attrs: NormAttrs { eps } }),
            slot,
        )
    }

    /// Runs `ids` (the next tokens of sequence 0) through the model, appending their keys
    /// and values to the cache. Returns the logits `[rows, vocab]`: every position's when
    /// `all_logits`, else the last one's.
    pub fn forward(&mut self, ids: &[u32], all_logits: bool) -> Result<HostTensor> {
        self.forward_batch(&[(0, ids)], all_logits)
    }

    /// Runs a batch: either one sequence with any number of new tokens (a prefill), or
    /// several sequences with one new token each (a decode step). Returns the logits of
    /// each sequence's last token (`[sequences, vocab]`), or of every row with `all_logits`.
    ///
    /// The pass runs on a thread of the rayon pool (moved there once, when called from
    /// outside it), so that each parallel kernel runs inline on that worker and the other
    /// workers, still spinning from the last kernel, join in: a caller thread outside the
    /// pool would instead sleep and be woken once per kernel (measured on the 2-core VM:
    /// tens of microseconds per wake, about a quarter of a 125M model's decode step).
    pub fn forward_batch(&mut self, batch: &[(usize, &[u32])], all_logits: bool) -> Result<HostTensor> {
        rayon::scope(|_| self.forward_on_pool(batch, all_logits))
    }

    fn forward_on_pool(&mut self, batch: &[(usize, &[u32])], all_logits: bool) -> Result<HostTensor> {
        let model = self.model;
        let c: &ModelConfig = &model.config;
        let w = &model.weights;
        let b = batch.len();
        let s = batch.first().map_or(0, |(_, ids)| ids.len());
        if b == 0 || s == 0 || (b > 1 && batch.iter().any(|(_, ids)| ids.len() != 1)) {
            return Err(Error::invalid(
                "a batch is one sequence with new tokens, or several sequences with one new token each".to_owned(),
            ));
        }
        let mut starts: SmallVec<[usize; 8]> = SmallVec::with_capacity(b);
        for (i, &(seq, ids)) in batch.iter().enumerate() {
            if batch[..i].iter().any(|(other, _)| *other == seq) {
                return Err(Error::invalid(format!("sequence {seq} appears twice in one batch")));
            }
            let (Some(&len), Some(&cap)) = (self.kv.lens.get(seq), self.kv.capacity.get(seq)) else {
                return Err(Error::invalid(format!("sequence {seq} is not in this session")));
            };
            if let Some((k, id)) = ids.iter().enumerate().find(|(_, id)| **id as usize >= c.vocab) {
                return Err(Error::invalid(format!("token {k} is id {id}, outside the vocabulary of {}", c.vocab)));
            }
            if len + ids.len() > cap {
                return Err(Error::invalid(format!(
                    "{} positions do not fit: {len} are cached and sequence {seq} holds {cap}",
                    ids.len()
                )));
            }
            starts.push(len);
        }
        let rows = b * s;
        let flat = batch.iter().flat_map(|(_, ids)| ids.iter().map(|&i| i64::from(i)));
        let ids_t = refill_i64(&mut self.inputs.ids, flat, &[rows])?;
        let pos = starts.iter().flat_map(|&st| (st..st + s).map(|p| p as i64));
        let positions = refill_i64(&mut self.inputs.positions, pos, &[b, s])?;
        let embedded = self.out(
            OpArgs::Embedding(EmbeddingArgs { ids: ids_t, table: w.embed.clone(), attrs: NoAttrs {} }),
            Slot::Embed,
        )?;
        self.keep(|| "hidden.0".into(), &embedded);
        // The layer input and the residual stream; each is taken by the op that reads it,
        // so no handle outlives its slot's next use.
        let mut h = Some(embedded);
        let (qd, d) = (c.heads * c.head_dim, c.head_dim);
        let mut residual: Option<HostTensor> = None;
        for (l, lw) in w.layers.iter().enumerate() {
            // Input norm; from the second layer on it also adds the previous layer's output.
            let input = h.take().ok_or_else(|| Error::invalid("the layer has no input".to_owned()))?;
            let slot = if l == 0 { Slot::FirstNorm } else { Slot::AttnNorm };
            let mut o = self.rms_norm(input.clone(), &lw.attn_norm, residual.take(), slot)?;
            let x = o.remove("out").ok_or_else(|| Error::invalid("rms_norm produced no output".to_owned()))?;
            let res = match o.remove("residual_out") {
                Some(r) => {
                    // The previous layer's output: its buffer is written again by the MLP.
                    drop(input);
                    self.keep(|| format!("layer.{}.out", l - 1), &r);
                    self.keep(|| format!("hidden.{l}"), &r);
                    r
                }
                None => input,
            };
            self.keep(|| format!("layer.{l}.attn_norm"), &x);
            let mut q = self.linear(&x, &lw.q, lw.q_bias.as_ref(), Slot::Q)?;
            let mut k = self.linear(&x, &lw.k, lw.k_bias.as_ref(), Slot::K)?;
            let v = self.linear(&x, &lw.v, lw.v_bias.as_ref(), Slot::V)?;
            drop(x);
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                // Qwen3: RMSNorm over each head's dims, before RoPE.
                let qv = view(&q, &[rows, c.heads, d], 0)?;
                q = self.rms_norm(qv, qn, None, Slot::QNorm)?.remove("out").unwrap_or(q);
                let kv = view(&k, &[rows, c.kv_heads, d], 0)?;
                k = self.rms_norm(kv, kn, None, Slot::KNorm)?.remove("out").unwrap_or(k);
            }
            let mut rot = self.run(
                OpArgs::Rope(RopeArgs {
                    q: view(&q, &[b, s, c.heads, d], 0)?.with_layout(Layout::Bshd),
                    k: Some(view(&k, &[b, s, c.kv_heads, d], 0)?.with_layout(Layout::Bshd)),
                    positions: Some(positions.clone()),
                    cos: None,
                    sin: None,
                    attrs: c.rope.clone(),
                }),
                Slot::Rope,
            )?;
            drop((q, k));
            let q = rot.remove("out").ok_or_else(|| Error::invalid("rope produced no `out`".to_owned()))?;
            let k = rot.remove("out_k").ok_or_else(|| Error::invalid("rope produced no `out_k`".to_owned()))?;
            self.keep(|| format!("layer.{l}.q"), &q);
            self.keep(|| format!("layer.{l}.k"), &k);
            let attrs = AttentionAttrs {
                causal: true,
                window_left: c.windows.get(l).copied().flatten().map(|w| w as u64 - 1),
                ..AttentionAttrs::default()
            };
            let attn = self.attend(l, batch, &starts, s, q, &k, &v, attrs)?;
            drop((k, v));
            let attn = if attn.is_contiguous() { attn } else { attn.contiguous() };
            let attn = view(&attn, &[rows, qd], 0)?;
            self.keep(|| format!("layer.{l}.attn_out"), &attn);
            let proj = self.linear(&attn, &lw.o, lw.o_bias.as_ref(), Slot::O)?;
            drop(attn);
            self.keep(|| format!("layer.{l}.o_proj"), &proj);
            let mut o = self.rms_norm(proj, &lw.ffn_norm, Some(res), Slot::FfnNorm)?;
            let x = o.remove("out").ok_or_else(|| Error::invalid("rms_norm produced no output".to_owned()))?;
            let post =
                o.remove("residual_out").ok_or_else(|| Error::invalid("rms_norm dropped the residual".to_owned()))?;
            self.keep(|| format!("layer.{l}.post_attn"), &post);
            self.keep(|| format!("layer.{l}.ffn_norm"), &x);
            let ffn = match &lw.ffn {
                Ffn::Dense { gate, up, down, bias: None } => self.out(
                    OpArgs::Mlp(MlpArgs {
                        x,
                        w_gate: gate.clone(),
                        w_up: up.clone(),
                        w_down: down.clone(),
                        attrs: MlpAttrs::default(),
                    }),
                    Slot::Mlp,
                )?,
                Ffn::Dense { gate, up, down, bias: Some([bg, bu, bd]) } => {
                    let g = self.linear(&x, gate, Some(bg), Slot::Gate)?;
                    let u = self.linear(&x, up, Some(bu), Slot::Up)?;
                    let a = self.out(
                        OpArgs::Swiglu(SwigluArgs {
                            x: None,
                            gate: Some(g),
                            up: Some(u),
                            attrs: SwigluAttrs::default(),
                        }),
                        Slot::Act,
                    )?;
                    self.linear(&a, down, Some(bd), Slot::Down)?
                }
                Ffn::Moe(m) => self.moe(l, x, m)?,
            };
            self.keep(|| format!("layer.{l}.ffn_out"), &ffn);
            h = Some(ffn);
            residual = Some(post);
        }
        let last_h = h.take().ok_or_else(|| Error::invalid("the model has no output".to_owned()))?;
        let mut o = self.rms_norm(last_h, &w.norm, residual.take(), Slot::FinalNorm)?;
        let normed = o.remove("out").ok_or_else(|| Error::invalid("rms_norm produced no output".to_owned()))?;
        if let Some(r) = o.remove("residual_out") {
            self.keep(|| format!("layer.{}.out", c.layers - 1), &r);
        }
        self.keep(|| format!("hidden.{}", c.layers), &normed);
        for (&(seq, ids), _) in batch.iter().zip(&starts) {
            self.kv.lens[seq] += ids.len();
        }
        let last = if all_logits || s == 1 { normed } else { view(&normed, &[1, c.hidden], (s - 1) * c.hidden)? };
        let logits = self.linear(&last, &w.lm_head, None, Slot::Logits)?;
        if logits.dtype() == DType::F32 {
            return Ok(logits);
        }
        // Logits leave the model as f32 (sampling and the caller read them as such).
        let (st, off) = (logits.storage(), logits.offset());
        if logits.is_contiguous() {
            refill_f32(&mut self.inputs.logits, (off..off + logits.numel()).map(|i| st.get_f32(i)), logits.shape())
        } else {
            HostTensor::from_f32(logits.shape(), logits.to_f32_vec())
        }
    }

    /// A mixture of experts over `x` `[rows, H]`: the router's logits, `moe_route` picks
    /// each row's experts and weights, `moe_experts` runs and sums them. Qwen2-MoE's shared
    /// expert joins as more experts every row picks (its slices of the routed inner size),
    /// each weighted `sigmoid(shared_expert_gate(x))`: one grouped call for the whole block.
    fn moe(&mut self, l: usize, x: HostTensor, w: &MoeWeights) -> Result<HostTensor> {
        let m = self.model.config.moe.as_ref().ok_or_else(|| Error::invalid("the model has no experts".to_owned()))?;
        let rows = x.shape()[0];
        let logits = self.linear(&x, &w.router, None, Slot::Router)?;
        self.keep(|| format!("layer.{l}.router_logits"), &logits);
        let mut routed = self.run(
            OpArgs::MoeRoute(MoeRouteArgs {
                logits,
                attrs: MoeRouteAttrs { top_k: m.top_k as u64, renormalize: m.renormalize },
            }),
            Slot::Route,
        )?;
        let missing = |name: &str| Error::invalid(format!("moe_route produced no `{name}` output"));
        let mut experts = routed.remove("experts").ok_or_else(|| missing("experts"))?;
        let mut weights = routed.remove("weights").ok_or_else(|| missing("weights"))?;
        let experts_call = |x: HostTensor, experts: HostTensor, weights: HostTensor| {
            OpArgs::MoeExperts(MoeExpertsArgs {
                x,
                experts,
                weights,
                w_gate: w.gate.clone(),
                w_up: w.up.clone(),
                w_down: w.down.clone(),
                attrs: MlpAttrs::default(),
            })
        };
        if let Some(shared_gate) = &w.shared_gate {
            let slices = w.gate.shape()[0] - m.experts;
            let g = self.linear(&x, shared_gate, None, Slot::SharedGate)?.to_f64_vec();
            let scale: Vec<f32> = g.iter().map(|&z| (1.0 / (1.0 + (-z).exp())) as f32).collect();
            let (ids, wts) = (experts.to_i64_vec(), weights.to_f32_vec());
            let k = m.top_k;
            let width = k + slices;
            let mut all_ids = Vec::with_capacity(rows * width);
            let mut all_w = Vec::with_capacity(rows * width);
            for r in 0..rows {
                all_ids.extend(ids[r * k..(r + 1) * k].iter().map(|&e| e as i32));
                all_w.extend_from_slice(&wts[r * k..(r + 1) * k]);
                all_ids.extend((0..slices).map(|s| (m.experts + s) as i32));
                all_w.extend(std::iter::repeat_n(scale[r], slices));
            }
            if self.dump.is_some() {
                let only_ids: Vec<i32> = (0..rows).flat_map(|_| (0..slices).map(|s| (m.experts + s) as i32)).collect();
                let only_w: Vec<f32> = scale.iter().flat_map(|&s| std::iter::repeat_n(s, slices)).collect();
                let shared = self.out(
                    experts_call(
                        x.clone(),
                        HostTensor::new(Storage::I32(only_ids.into()), &[rows, slices])?,
                        HostTensor::new(Storage::F32(only_w.into()), &[rows, slices])?,
                    ),
                    Slot::SharedOut,
                )?;
                self.keep(|| format!("layer.{l}.shared_out"), &shared);
            }
            experts = HostTensor::new(Storage::I32(all_ids.into()), &[rows, width])?;
            weights = HostTensor::new(Storage::F32(all_w.into()), &[rows, width])?;
        }
        self.out(experts_call(x, experts, weights), Slot::Experts)
    }

    /// Writes the batch's keys and values into layer `l`'s cache and attends over each
    /// sequence's cached positions. `q` and `k` are `[b, s, heads, d]`, `v` is `[b * s, kvd]`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &mut self,
        l: usize,
        batch: &[(usize, &[u32])],
        starts: &[usize],
        s: usize,
        q: HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        attrs: AttentionAttrs,
    ) -> Result<HostTensor> {
        let c = &self.model.config;
        let (kvd, d, b) = (c.kv_heads * c.head_dim, c.head_dim, batch.len());
        match self.kv.kind {
            KvKind::Contiguous => {
                let start = starts[0];
                self.kv.k[l].write_at(start * kvd, k)?;
                self.kv.v[l].write_at(start * kvd, v)?;
                let ctx = start + s;
                self.out(
                    OpArgs::Attention(AttentionArgs {
                        q: q.with_layout(Layout::Bshd),
                        k: view(&self.kv.k[l], &[1, ctx, c.kv_heads, d], 0)?.with_layout(Layout::Bshd),
                        v: view(&self.kv.v[l], &[1, ctx, c.kv_heads, d], 0)?.with_layout(Layout::Bshd),
                        mask: None,
                        cu_seqlens_q: None,
                        cu_seqlens_k: None,
                        attrs,
                    }),
                    Slot::Attn,
                )
            }
            KvKind::Paged { page_size } => {
                let k = k.contiguous();
                for (i, (&(seq, _), &start)) in batch.iter().zip(starts).enumerate() {
                    for t in 0..s {
                        let pos = start + t;
                        let page = self.kv.pages[seq][pos / page_size] as usize;
                        let at = (page * page_size + pos % page_size) * kvd;
                        let row = (i * s + t) * kvd;
                        self.kv.k[l].write_at(at, &view(&k, &[kvd], row)?)?;
                        self.kv.v[l].write_at(at, &view(v, &[kvd], row)?)?;
                    }
                }
                let width = batch.iter().map(|(seq, _)| self.kv.pages[*seq].len()).max().unwrap_or(0);
                let pages = &self.kv.pages;
                let entries = batch.iter().flat_map(|&(seq, _)| {
                    let p = &pages[seq];
                    (0..width).map(move |i| p.get(i).map_or(0, |&page| page as i32))
                });
                let block_table = refill_i32(&mut self.inputs.table, entries, &[b, width])?;
                let lens = starts.iter().map(|&start| (start + s) as i32);
                let context_lens = refill_i32(&mut self.inputs.lens, lens, &[b])?;
                self.out(
                    OpArgs::PagedAttention(PagedAttentionArgs {
                        q: q.with_layout(Layout::Bshd),
                        k_cache: self.kv.k[l].clone(),
                        v_cache: self.kv.v[l].clone(),
                        block_table,
                        context_lens,
                        k_scale: None,
                        v_scale: None,
                        attrs,
                    }),
                    Slot::Attn,
                )
            }
        }
    }
}
