//! A model's weights: HF tensor names read from one or more memory-mapped `*.safetensors`
//! shards, every tensor the config implies checked for presence, shape and dtype, and cast
//! once to the compute dtype where it differs. A tensor already in the compute dtype is
//! either copied once into huge-page memory (`Residence::Resident`, the default) or read in
//! place from the map (`Residence::Mapped`). A missing, truncated or contradicting file is an error naming the file and
//! the tensor.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::config::ModelConfig;
pub use super::quant::{Proj, WeightQuant};
use layerzero::error::{Error, ErrorKind, Result};
use layerzero::model::dtype::DType;
use layerzero::tensor::{HostTensor, Residence, io};

/// One decoder layer's weights (projections `[out, in]`, as HF stores them).
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// input_layernorm `[H]`.
    pub attn_norm: HostTensor,
    /// q_proj `[heads * head_dim, H]`.
    pub q: Proj,
    /// k_proj `[kv_heads * head_dim, H]`.
    pub k: Proj,
    /// v_proj `[kv_heads * head_dim, H]`.
    pub v: Proj,
    /// o_proj `[H, heads * head_dim]`.
    pub o: Proj,
    /// q/k/v biases, when the model has them.
    pub q_bias: Option<HostTensor>,
    /// See `q_bias`.
    pub k_bias: Option<HostTensor>,
    /// See `q_bias`.
    pub v_bias: Option<HostTensor>,
    /// o_proj bias.
    pub o_bias: Option<HostTensor>,
    /// Qwen3: q_norm and k_norm `[head_dim]`.
    pub q_norm: Option<HostTensor>,
    /// See `q_norm`.
    pub k_norm: Option<HostTensor>,
    /// post_attention_layernorm `[H]`.
    pub ffn_norm: HostTensor,
    /// The MLP.
    pub ffn: Ffn,
    /// q, k and v stacked into one projection, `q`, `k` and `v` above being views of it, where
    /// the weights were copied at load anyway (resident, cast or quantized): a decode step
    /// projects them in one pass and one dispatch.
    pub qkv: Option<Qkv>,
    /// A quantized MLP's gate and up stacked (`[2 I, H]`: gate's rows, then up's), `gate` and
    /// `up` in `ffn` being views of it: one projection, its halves read by SwiGLU. (A dense
    /// MLP without biases runs as one `mlp` op already.)
    pub gate_up: Option<Proj>,
}

/// q_proj, k_proj and v_proj stacked (`[qd + 2 kvd, H]`: q's rows, then k's, then v's), with
/// their biases likewise when the model has them.
#[derive(Debug, Clone)]
pub struct Qkv {
    /// The stacked projection (dense, or the quantized codes and scales of each row).
    pub weight: Proj,
    /// The stacked biases.
    pub bias: Option<HostTensor>,
}

impl LayerWeights {
    /// Stacks q, k and v (and their biases) into [`Qkv`], each becoming a view of it (one copy
    /// of the weights, in huge-page memory as resident weights are).
    fn stack_qkv(&mut self) -> Result<()> {
        let Some((weight, [q, k, v])) = stack_projs([&self.q, &self.k, &self.v])? else { return Ok(()) };
        (self.q, self.k, self.v) = (q, k, v);
        let bias = match (&self.q_bias, &self.k_bias, &self.v_bias) {
            (Some(q), Some(k), Some(v)) => {
                let (b, r) = stack_rows([q, k, v])?;
                self.q_bias = Some(rows_of(&b, 0, r[0])?);
                self.k_bias = Some(rows_of(&b, r[0], r[1])?);
                self.v_bias = Some(rows_of(&b, r[0] + r[1], r[2])?);
                Some(b)
            }
            _ => None,
        };
        self.qkv = Some(Qkv { weight, bias });
        Ok(())
    }

    /// Stacks a quantized MLP's gate and up (no biases) into `gate_up`, each becoming a view.
    fn stack_gate_up(&mut self) -> Result<()> {
        let Ffn::Dense { gate, up, bias: None, .. } = &mut self.ffn else { return Ok(()) };
        if gate.dense().is_some() {
            return Ok(());
        }
        let Some((both, [g, u])) = stack_projs([&*gate, &*up])? else { return Ok(()) };
        (*gate, *up) = (g, u);
        self.gate_up = Some(both);
        Ok(())
    }

    /// The decode's one-pass projections, where the weights were copied at load (weights
    /// served from the map stay there, unstacked).
    fn stack(&mut self) -> Result<()> {
        if [&self.q, &self.k, &self.v].iter().any(|p| p.dense().is_some_and(|t| t.storage().is_mapped())) {
            return Ok(());
        }
        self.stack_qkv()?;
        self.stack_gate_up()
    }
}

/// `parts` stacked by rows into one projection of their kind (dense in their dtype; int8 or
/// int4 codes and scales, the same group and activations), with each part as a view of its
/// rows; `None` when they are not of one kind.
fn stack_projs<const N: usize>(parts: [&Proj; N]) -> Result<Option<(Proj, [Proj; N])>> {
    let first = parts[0];
    if !parts.iter().all(|p| first.stacks_with(p)) {
        return Ok(None);
    }
    let (codes, rows) = stack_rows(parts.map(|p| p.operands().0))?;
    let scales = all_some(parts.map(|p| p.operands().1)).map(stack_rows).transpose()?.map(|(s, _)| s);
    // Each part: its rows of the stacked codes (and scales).
    let mut views = Vec::with_capacity(N);
    let mut r0 = 0;
    for &r in &rows {
        let s = scales.as_ref().map(|s| rows_of(s, r0, r)).transpose()?;
        views.push(first.with_operands(rows_of(&codes, r0, r)?, s));
        r0 += r;
    }
    let views = views.try_into().ok().and_then(all_some);
    Ok(first.with_operands(codes, scales).zip(views))
}

/// The values, when every one is there.
fn all_some<T, const N: usize>(v: [Option<T>; N]) -> Option<[T; N]> {
    let v: Option<Vec<T>> = v.into_iter().collect();
    v?.try_into().ok()
}

/// Tensors of one dtype and trailing shape stacked along their first dim (resident, as
/// copied weights are), with each one's row count.
fn stack_rows<const N: usize>(parts: [&HostTensor; N]) -> Result<(HostTensor, [usize; N])> {
    let tail: Vec<usize> = parts[0].shape().get(1..).unwrap_or_default().to_vec();
    let per: usize = tail.iter().product();
    let rows = parts.map(|p| p.shape().first().copied().unwrap_or(0));
    let mut vals = Vec::with_capacity(rows.iter().sum::<usize>() * per);
    for p in parts {
        vals.extend(p.to_f32_vec());
    }
    let shape: Vec<usize> = std::iter::once(rows.iter().sum()).chain(tail).collect();
    let packed = HostTensor::from_f32_as(parts[0].dtype(), &shape, &vals)?;
    Ok((HostTensor::new(packed.storage().resident(), &shape)?, rows))
}

/// Rows `r0..r0 + r` of `t` as a view.
fn rows_of(t: &HostTensor, r0: usize, r: usize) -> Result<HostTensor> {
    let tail = t.shape().get(1..).unwrap_or_default();
    let per: usize = tail.iter().product();
    let shape: Vec<usize> = std::iter::once(r).chain(tail.iter().copied()).collect();
    let mut strides = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    t.view(&shape, &strides, r0 * per)
}

/// A layer's MLP.
// One per layer, read in place: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Ffn {
    /// A gated MLP.
    Dense {
        /// gate_proj `[I, H]`.
        gate: Proj,
        /// up_proj `[I, H]`.
        up: Proj,
        /// down_proj `[H, I]`.
        down: Proj,
        /// MLP biases (gate, up, down), when the model has them.
        bias: Option<[HostTensor; 3]>,
    },
    /// A mixture of experts.
    Moe(MoeWeights),
}

/// A mixture of experts' weights, the experts stacked as `moe_experts` takes them.
#[derive(Debug, Clone)]
pub struct MoeWeights {
    /// The router `[E, H]`.
    pub router: HostTensor,
    /// Every expert's gate_proj `[E + S, I, H]`: the E routed experts, then the shared
    /// expert's S slices of I inner columns (Qwen2-MoE).
    pub gate: HostTensor,
    /// Every expert's up_proj `[E + S, I, H]`.
    pub up: HostTensor,
    /// Every expert's down_proj `[E + S, H, I]`.
    pub down: HostTensor,
    /// Qwen2-MoE: shared_expert_gate `[1, H]`.
    pub shared_gate: Option<HostTensor>,
}

/// Every weight of a model, in the compute dtype.
#[derive(Debug, Clone)]
pub struct Weights {
    /// embed_tokens `[V, H]`.
    pub embed: HostTensor,
    /// The decoder layers.
    pub layers: Vec<LayerWeights>,
    /// The final norm `[H]`.
    pub norm: HostTensor,
    /// lm_head `[V, H]` (the embedding table when tied).
    pub lm_head: HostTensor,
    /// The dtype the files store.
    pub stored: DType,
}

/// The shard files of a model folder, as HF writes them: `model.safetensors`, or the files
/// a `model.safetensors.index.json` names.
fn shards(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        if !single.is_file() {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "{}: neither model.safetensors nor model.safetensors.index.json is in the model folder",
                    dir.display()
                ),
            ));
        }
        return Ok(vec![single]);
    }
    let origin = index.display().to_string();
    let text = layerzero::files::read_to_string(&index)?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(serde_json::Value::as_object)
        .ok_or_else(|| Error::invalid(format!("{origin}: field `weight_map` is missing or not an object")))?;
    let mut files = BTreeSet::new();
    for (name, file) in map {
        let f =
            file.as_str().ok_or_else(|| Error::invalid(format!("{origin}: field `weight_map.{name}` is {file}")))?;
        files.insert(f);
    }
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
}

/// Takes the named tensors out of a model folder's shards, checking each one.
pub(crate) struct Take<'a> {
    tensors: BTreeMap<String, (HostTensor, PathBuf)>,
    dir: &'a Path,
    /// The dtype tensors are returned in.
    pub(crate) compute: DType,
    residence: Residence,
    /// Projections quantized as they are taken ([`Take::proj`]).
    quant: Option<WeightQuant>,
}

impl<'a> Take<'a> {
    /// Maps every shard of `dir`; tensors come out in `compute` (`None`: the stored dtype,
    /// returned too), those already in it served as `residence` says.
    pub(crate) fn open(dir: &'a Path, compute: Option<DType>, residence: Residence) -> Result<(Take<'a>, DType)> {
        let mut tensors = BTreeMap::new();
        let mut stored = None;
        for file in shards(dir)? {
            // Resident weights are copied out piece by piece, each piece released as it is
            // copied (`Buf::resident`): faulting the whole file in first would double the peak.
            for (name, t) in io::read_mapped_with(&file, residence == Residence::Mapped)? {
                // Precomputed RoPE tables are derived from the config, never read.
                if name.ends_with("rotary_emb.inv_freq") {
                    continue;
                }
                stored.get_or_insert(t.dtype());
                tensors.insert(name, (t, file.clone()));
            }
        }
        let stored = stored.unwrap_or(DType::F32);
        let compute = compute.unwrap_or(stored);
        if !matches!(compute, DType::F32 | DType::BF16) {
            return Err(Error::invalid(format!("compute dtype {compute} is not supported (f32 or bf16)")));
        }
        Ok((Take { tensors, dir, compute, residence, quant: None }, stored))
    }

    /// Whether the files hold `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Drops `name` if present (a tensor that duplicates another, such as a tied head).
    pub(crate) fn skip(&mut self, name: &str) {
        self.tensors.remove(name);
    }

    /// Refuses any tensor not taken: the files describe another model than the config.
    pub(crate) fn finish(self, what: &str) -> Result<()> {
        if let Some((name, (_, file))) = self.tensors.into_iter().next() {
            return Err(Error::invalid(format!(
                "{}: tensor `{name}` is not part of {what} as the config describes it",
                file.display()
            )));
        }
        Ok(())
    }

    pub(crate) fn take(&mut self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        self.take_with(name, shape, false)
    }

    /// A projection's weight: as [`take`](Take::take) does, or quantized straight from the
    /// map (its pages given back once read) when the load quantizes.
    pub(crate) fn proj(&mut self, name: &str, shape: &[usize]) -> Result<Proj> {
        let Some(how) = self.quant else { return self.take(name, shape).map(Proj::Dense) };
        let t = self.take_with(name, shape, true)?;
        let p = Proj::Dense(t.clone()).quantized(how).map_err(|e| Error::invalid(format!("`{name}`: {e}")))?;
        t.storage().release_mapped();
        Ok(p)
    }

    /// [`take`](Take::take), a tensor in the compute dtype left in the map when `keep_mapped`
    /// and the load quantizes.
    fn take_with(&mut self, name: &str, shape: &[usize], keep_mapped: bool) -> Result<HostTensor> {
        let (t, file) = self.tensors.remove(name).ok_or_else(|| {
            Error::invalid(format!(
                "{}: tensor `{name}` is missing from the model's safetensors files",
                self.dir.display()
            ))
        })?;
        if t.shape() != shape {
            return Err(Error::invalid(format!(
                "{}: tensor `{name}` has shape {:?}; the config implies {shape:?}",
                file.display(),
                t.shape()
            )));
        }
        if !t.dtype().is_float() {
            return Err(Error::invalid(format!(
                "{}: tensor `{name}` has dtype {}; weights must be f32, bf16 or f16",
                file.display(),
                t.dtype()
            )));
        }
        if t.dtype() != self.compute {
            return HostTensor::from_f32_as(self.compute, shape, &t.to_f32_vec());
        }
        if self.quant.is_some() && keep_mapped {
            return Ok(t);
        }
        Ok(match self.residence {
            Residence::Resident if t.storage().is_mapped() => HostTensor::new(t.storage().resident(), shape)?,
            _ => t,
        })
    }

    pub(crate) fn maybe(&mut self, name: &str, shape: &[usize], present: bool) -> Result<Option<HostTensor>> {
        if present { self.take(name, shape).map(Some) } else { Ok(None) }
    }

    /// A tensor's elements as f32 (stacking experts copies them once, in any dtype).
    fn take_f32(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.take(name, shape).map(|t| t.to_f32_vec())
    }

    /// Layer `l`'s mixture of experts, from the hub's layout (one tensor per expert and
    /// projection: Mixtral's `block_sparse_moe.experts.{e}.w1/w3/w2`, Qwen2-MoE's
    /// `mlp.experts.{e}.gate_proj/up_proj/down_proj`) or transformers 5's (per layer
    /// `mlp.experts.gate_up_proj` `[E, 2I, H]` and `mlp.experts.down_proj` `[E, H, I]`),
    /// stacked into `[E + S, ...]` with the shared expert's S slices after the routed ones.
    fn moe(&mut self, l: usize, c: &ModelConfig, m: &super::config::MoeConfig) -> Result<MoeWeights> {
        let (h, i, e) = (c.hidden, m.intermediate, m.experts);
        let block = if self.tensors.contains_key(&format!("model.layers.{l}.block_sparse_moe.gate.weight")) {
            "block_sparse_moe"
        } else {
            "mlp"
        };
        let p = |s: &str| format!("model.layers.{l}.{block}.{s}");
        let router = self.take(&p("gate.weight"), &[e, h])?;
        let slices = m.shared_intermediate.map_or(0, |s| s / i);
        let n = e + slices;
        let (mut gate, mut up, mut down) =
            (Vec::with_capacity(n * i * h), Vec::with_capacity(n * i * h), Vec::with_capacity(n * h * i));
        if self.tensors.contains_key(&p("experts.gate_up_proj")) {
            let gu = self.take_f32(&p("experts.gate_up_proj"), &[e, 2 * i, h])?;
            for x in gu.chunks_exact(2 * i * h) {
                gate.extend_from_slice(&x[..i * h]);
                up.extend_from_slice(&x[i * h..]);
            }
            down.extend(self.take_f32(&p("experts.down_proj"), &[e, h, i])?);
        } else {
            let [wg, wu, wd] =
                if block == "block_sparse_moe" { ["w1", "w3", "w2"] } else { ["gate_proj", "up_proj", "down_proj"] };
            for x in 0..e {
                gate.extend(self.take_f32(&p(&format!("experts.{x}.{wg}.weight")), &[i, h])?);
                up.extend(self.take_f32(&p(&format!("experts.{x}.{wu}.weight")), &[i, h])?);
                down.extend(self.take_f32(&p(&format!("experts.{x}.{wd}.weight")), &[h, i])?);
            }
        }
        let shared_gate = match m.shared_intermediate {
            Some(si) => {
                gate.extend(self.take_f32(&p("shared_expert.gate_proj.weight"), &[si, h])?);
                up.extend(self.take_f32(&p("shared_expert.up_proj.weight"), &[si, h])?);
                // down_proj `[H, S*I]`: slice s is columns s*I..(s+1)*I of every row.
                let sd = self.take_f32(&p("shared_expert.down_proj.weight"), &[h, si])?;
                for s in 0..slices {
                    for row in sd.chunks_exact(si) {
                        down.extend_from_slice(&row[s * i..(s + 1) * i]);
                    }
                }
                Some(self.take(&p("shared_expert_gate.weight"), &[1, h])?)
            }
            None => None,
        };
        Ok(MoeWeights {
            router,
            gate: HostTensor::from_f32_as(self.compute, &[n, i, h], &gate)?,
            up: HostTensor::from_f32_as(self.compute, &[n, i, h], &up)?,
            down: HostTensor::from_f32_as(self.compute, &[n, h, i], &down)?,
            shared_gate,
        })
    }
}

impl Weights {
    /// Zero weights of the shapes `config` implies (planning: the shapes, not the values,
    /// decide which kernels run).
    pub fn zeros(config: &ModelConfig, dtype: DType) -> Result<Weights> {
        let c = config;
        let (h, i, v, d) = (c.hidden, c.intermediate, c.vocab, c.head_dim);
        let (qd, kvd) = (c.heads * d, c.kv_heads * d);
        let z = |shape: &[usize]| HostTensor::zeros(dtype, shape);
        let opt = |present: bool, shape: &[usize]| if present { z(shape).map(Some) } else { Ok(None) };
        let layers = (0..c.layers)
            .map(|l| {
                Ok(LayerWeights {
                    attn_norm: z(&[h])?,
                    q: Proj::Dense(z(&[qd, h])?),
                    k: Proj::Dense(z(&[kvd, h])?),
                    v: Proj::Dense(z(&[kvd, h])?),
                    o: Proj::Dense(z(&[h, qd])?),
                    q_bias: opt(c.qkv_bias, &[qd])?,
                    k_bias: opt(c.qkv_bias, &[kvd])?,
                    v_bias: opt(c.qkv_bias, &[kvd])?,
                    o_bias: opt(c.o_bias, &[h])?,
                    q_norm: opt(c.qk_norm, &[d])?,
                    k_norm: opt(c.qk_norm, &[d])?,
                    ffn_norm: z(&[h])?,
                    ffn: match &c.moe {
                        Some(m) if m.sparse[l] => {
                            let n = m.experts + m.shared_intermediate.map_or(0, |s| s / m.intermediate);
                            Ffn::Moe(MoeWeights {
                                router: z(&[m.experts, h])?,
                                gate: z(&[n, m.intermediate, h])?,
                                up: z(&[n, m.intermediate, h])?,
                                down: z(&[n, h, m.intermediate])?,
                                shared_gate: opt(m.shared_intermediate.is_some(), &[1, h])?,
                            })
                        }
                        _ => Ffn::Dense {
                            gate: Proj::Dense(z(&[i, h])?),
                            up: Proj::Dense(z(&[i, h])?),
                            down: Proj::Dense(z(&[h, i])?),
                            bias: if c.mlp_bias { Some([z(&[i])?, z(&[i])?, z(&[h])?]) } else { None },
                        },
                    },
                    qkv: None,
                    gate_up: None,
                })
                .and_then(|mut layer: LayerWeights| {
                    layer.stack()?;
                    Ok(layer)
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let embed = z(&[v, h])?;
        let lm_head = if c.tied { embed.clone() } else { z(&[v, h])? };
        Ok(Weights { embed, layers, norm: z(&[h])?, lm_head, stored: dtype })
    }

    /// Reads every weight `config` implies from `dir`, in `compute` dtype (`None`: the
    /// stored dtype), those already in it served as `residence` says.
    pub fn load(dir: &Path, config: &ModelConfig, compute: Option<DType>, residence: Residence) -> Result<Weights> {
        Weights::load_with(dir, config, compute, residence, None)
    }

    /// [`load`](Weights::load), the projections quantized as `quant` says as each is read:
    /// read from the map and its pages given back, never copied dense, so the load peaks
    /// near the quantized size, not the dense one.
    pub fn load_with(
        dir: &Path,
        config: &ModelConfig,
        compute: Option<DType>,
        residence: Residence,
        quant: Option<WeightQuant>,
    ) -> Result<Weights> {
        let (mut t, stored) = Take::open(dir, compute, residence)?;
        t.quant = quant;
        let c = config;
        let (h, i, v, d) = (c.hidden, c.intermediate, c.vocab, c.head_dim);
        let (qd, kvd) = (c.heads * d, c.kv_heads * d);
        let embed = t.take("model.embed_tokens.weight", &[v, h])?;
        let mut layers = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            layers.push(LayerWeights {
                attn_norm: t.take(&p("input_layernorm.weight"), &[h])?,
                q: t.proj(&p("self_attn.q_proj.weight"), &[qd, h])?,
                k: t.proj(&p("self_attn.k_proj.weight"), &[kvd, h])?,
                v: t.proj(&p("self_attn.v_proj.weight"), &[kvd, h])?,
                o: t.proj(&p("self_attn.o_proj.weight"), &[h, qd])?,
                q_bias: t.maybe(&p("self_attn.q_proj.bias"), &[qd], c.qkv_bias)?,
                k_bias: t.maybe(&p("self_attn.k_proj.bias"), &[kvd], c.qkv_bias)?,
                v_bias: t.maybe(&p("self_attn.v_proj.bias"), &[kvd], c.qkv_bias)?,
                o_bias: t.maybe(&p("self_attn.o_proj.bias"), &[h], c.o_bias)?,
                q_norm: t.maybe(&p("self_attn.q_norm.weight"), &[d], c.qk_norm)?,
                k_norm: t.maybe(&p("self_attn.k_norm.weight"), &[d], c.qk_norm)?,
                ffn_norm: t.take(&p("post_attention_layernorm.weight"), &[h])?,
                ffn: match &c.moe {
                    Some(m) if m.sparse[l] => Ffn::Moe(t.moe(l, c, m)?),
                    _ => Ffn::Dense {
                        gate: t.proj(&p("mlp.gate_proj.weight"), &[i, h])?,
                        up: t.proj(&p("mlp.up_proj.weight"), &[i, h])?,
                        down: t.proj(&p("mlp.down_proj.weight"), &[h, i])?,
                        bias: if c.mlp_bias {
                            Some([
                                t.take(&p("mlp.gate_proj.bias"), &[i])?,
                                t.take(&p("mlp.up_proj.bias"), &[i])?,
                                t.take(&p("mlp.down_proj.bias"), &[h])?,
                            ])
                        } else {
                            None
                        },
                    },
                },
                qkv: None,
                gate_up: None,
            });
            // Copied weights (resident, cast or quantized) are stacked for the decode's one-pass
            // projections; weights served from the map stay there.
            layers.last_mut().ok_or_else(|| Error::invalid("no layer"))?.stack()?;
        }
        let norm = t.take("model.norm.weight", &[h])?;
        let lm_head = if c.tied {
            // A tied checkpoint may still store the head; it is the same table.
            t.tensors.remove("lm_head.weight");
            embed.clone()
        } else {
            t.take("lm_head.weight", &[v, h])?
        };
        t.finish(&format!("a {}-layer {} model", c.layers, c.arch.as_str()))?;
        Ok(Weights { embed, layers, norm, lm_head, stored })
    }
}
