//! BART's forward pass, every op a dispatch: the encoder runs once over a batch of inputs
//! (right-padded, a bool key mask per row when lengths differ); each input's decoder keeps
//! its self-attention cache (written in place, one position per step) apart from its
//! cross-attention keys and values (computed once from that input's encoder rows). Post-norm
//! layers: every LayerNorm takes its residual fused (`layer_norm` with `residual`).
//!
//! Without the cache, every step runs the decoder over all tokens so far and recomputes the
//! cross-attention keys and values: the same tokens, at a quadratic cost (the check that the
//! caches are right).

use std::collections::BTreeMap;
use std::time::Instant;

use super::{Attn, Layer, POSITION_OFFSET, Seq2SeqModel};
use crate::generate::{Generation, Sequence, only_token, token_ids};
use crate::nn::{Embedding, Linear, Norm, gelu, view};
use crate::pass::{OpStats, Pass, take};
use layerzero::error::{Error, Result};
use layerzero::exec::args::{AttentionArgs, LinearArgs, OpArgs, SampleArgs};
use layerzero::model::attrs::{AttentionAttrs, NoAttrs, SampleAttrs};
use layerzero::model::layout::Layout;
use layerzero::model::op::Op;
use layerzero::runtime::LayerZero;
use layerzero::tensor::{HostTensor, Storage};

/// What an encoder-decoder generation produced.
#[derive(Debug, Clone)]
pub struct Seq2SeqGenerated {
    /// Per input: the input and the generated tokens.
    pub sequences: Vec<Sequence>,
    /// Encoder time, ns.
    pub encode_ns: u64,
    /// Decoder time over every step, ns.
    pub decode_ns: u64,
    /// Decoder steps run, over every input.
    pub decode_steps: usize,
    /// Per op, what ran.
    pub stats: BTreeMap<Op, OpStats>,
    /// With `g.dump` (one input): the encoder's stages, a teacher-forced decoder pass's
    /// stages and `logits.{k}` of each step.
    pub dump: BTreeMap<String, HostTensor>,
}

fn ids_tensor(ids: impl Iterator<Item = usize>) -> Result<HostTensor> {
    let v: Vec<i64> = ids.map(|i| i as i64).collect();
    let n = v.len();
    HostTensor::new(Storage::I64(v.into()), &[n])
}

/// The dispatching state of one generation: the pass and the model.
struct Bart<'m> {
    cx: Pass<'m>,
    model: &'m Seq2SeqModel,
}

impl<'m> std::ops::Deref for Bart<'m> {
    type Target = Pass<'m>;
    fn deref(&self) -> &Pass<'m> {
        &self.cx
    }
}

impl std::ops::DerefMut for Bart<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.cx
    }
}

/// One input's decoder state: per layer, the self-attention keys and values
/// `[1, capacity, heads, head_dim]` (`len` written) and the cross-attention ones
/// `[1, encoder length, heads, head_dim]`.
struct Decoder {
    self_kv: Vec<(HostTensor, HostTensor)>,
    len: usize,
    cross_kv: Vec<(HostTensor, HostTensor)>,
}

impl Bart<'_> {
    /// `norm(x + residual)` and the sum.
    fn layer_norm(
        &mut self,
        x: HostTensor,
        n: &super::Norm,
        residual: Option<HostTensor>,
    ) -> Result<(HostTensor, HostTensor)> {
        Norm::layer(n, super::EPS).add(&mut self.cx, x, residual)
    }

    /// `x W^T + b`.
    fn linear(&mut self, x: &HostTensor, p: &super::Proj) -> Result<HostTensor> {
        Linear::affine(p).forward(&mut self.cx, x)
    }

    /// Token embeddings plus learned positions `start..start + n` per row, normalized.
    fn embed(
        &mut self,
        ids: &[i64],
        rows: usize,
        start: usize,
        pos: &HostTensor,
        ln: &super::Norm,
    ) -> Result<HostTensor> {
        let n = ids.len() / rows.max(1);
        let tokens = HostTensor::new(Storage::I64(ids.to_vec().into()), &[ids.len()])?;
        let model = self.model;
        let tok = Embedding::new(&model.weights.shared, None).forward(&mut self.cx, tokens)?;
        let positions = ids_tensor((0..rows).flat_map(|_| (start..start + n).map(|p| p + POSITION_OFFSET)))?;
        let p = Embedding::new(pos, None).forward(&mut self.cx, positions)?;
        Ok(self.layer_norm(tok, ln, Some(p))?.0)
    }

    /// Attention of `q` `[b * sq, d]` over `k`, `v` (`[b, sk, heads, head_dim]` views) →
    /// `[b * sq, d]`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &mut self,
        q: &HostTensor,
        k: HostTensor,
        v: HostTensor,
        (b, sq, heads): (usize, usize, usize),
        mask: Option<HostTensor>,
        causal: bool,
    ) -> Result<HostTensor> {
        let d = self.model.config.d_model;
        let hd = d / heads;
        let args = OpArgs::Attention(AttentionArgs {
            q: view(q, &[b, sq, heads, hd], 0)?.with_layout(Layout::Bshd),
            k: k.with_layout(Layout::Bshd),
            v: v.with_layout(Layout::Bshd),
            mask,
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            attrs: AttentionAttrs { causal, ..AttentionAttrs::default() },
        });
        let out = self.out(args, None)?;
        let out = if out.is_contiguous() { out } else { out.contiguous() };
        view(&out, &[b * sq, d], 0)
    }

    fn ffn(&mut self, x: &HostTensor, l: &Layer) -> Result<HostTensor> {
        let h = self.linear(x, &l.fc1)?;
        let a = gelu(&mut self.cx, h)?;
        self.linear(&a, &l.fc2)
    }

    /// The encoder over `inputs` right-padded to the longest: `[rows * s, d]` and `s`.
    fn encode(&mut self, inputs: &[Vec<u32>]) -> Result<(HostTensor, usize)> {
        let c = &self.model.config;
        let (rows, s) = (inputs.len(), inputs.iter().map(Vec::len).max().unwrap_or(0));
        let ids: Vec<i64> = inputs
            .iter()
            .flat_map(|x| x.iter().map(|&t| i64::from(t)).chain(std::iter::repeat_n(i64::from(c.pad), s - x.len())))
            .collect();
        // Padded keys are masked out; an unpadded batch needs no mask.
        let mask = if inputs.iter().all(|x| x.len() == s) {
            None
        } else {
            let keep: Vec<bool> = inputs.iter().flat_map(|x| (0..s).map(move |j| j < x.len())).collect();
            Some(HostTensor::new(Storage::Bool(keep), &[rows, 1, 1, s])?)
        };
        let w = &self.model.weights;
        let mut h = self.embed(&ids, rows, 0, &w.enc_pos, &w.enc_ln)?;
        self.keep(|| "enc.hidden.0".into(), &h);
        let heads = c.encoder_heads;
        let hd = c.d_model / heads;
        for (l, layer) in w.encoder.iter().enumerate() {
            let (q, k, v) = self.qkv(&h, &layer.self_attn)?;
            let kv = |t: &HostTensor| view(t, &[rows, s, heads, hd], 0);
            let a = self.attend(&q, kv(&k)?, kv(&v)?, (rows, s, heads), mask.clone(), false)?;
            let a = self.linear(&a, &layer.self_attn.o)?;
            self.keep(|| format!("enc.layer.{l}.attn_out"), &a);
            let (x, _) = self.layer_norm(a, &layer.self_ln, Some(h))?;
            self.keep(|| format!("enc.layer.{l}.attn_ln"), &x);
            let f = self.ffn(&x, layer)?;
            self.keep(|| format!("enc.layer.{l}.ffn_out"), &f);
            h = self.layer_norm(f, &layer.ffn_ln, Some(x))?.0;
            self.keep(|| format!("enc.layer.{l}.out"), &h);
            self.keep(|| format!("enc.hidden.{}", l + 1), &h);
        }
        Ok((h, s))
    }

    fn qkv(&mut self, x: &HostTensor, a: &Attn) -> Result<(HostTensor, HostTensor, HostTensor)> {
        Ok((self.linear(x, &a.q)?, self.linear(x, &a.k)?, self.linear(x, &a.v)?))
    }

    /// A decoder state for the encoder rows `enc` `[len, d]` with room for `capacity`
    /// decoder positions: the cross-attention keys and values computed here, once.
    fn decoder(&mut self, enc: &HostTensor, capacity: usize) -> Result<Decoder> {
        let c = &self.model.config;
        let (heads, len) = (c.decoder_heads, enc.shape()[0]);
        let hd = c.d_model / heads;
        let mut cross_kv = Vec::with_capacity(c.decoder_layers);
        let mut self_kv = Vec::with_capacity(c.decoder_layers);
        for layer in &self.model.weights.decoder {
            let (attn, _) =
                layer.cross.as_ref().ok_or_else(|| Error::invalid("a decoder layer lacks encoder_attn".to_owned()))?;
            let k = self.linear(enc, &attn.k)?;
            let v = self.linear(enc, &attn.v)?;
            cross_kv.push((view(&k, &[1, len, heads, hd], 0)?, view(&v, &[1, len, heads, hd], 0)?));
            let cache = || HostTensor::zeros(self.model.dtype, &[1, capacity, heads, hd]);
            self_kv.push((cache()?, cache()?));
        }
        Ok(Decoder { self_kv, len: 0, cross_kv })
    }

    /// Runs `tokens` (the next decoder positions) through the decoder, appending their keys
    /// and values to its self-attention cache: the logits of every row `[n, V]`.
    fn decode(&mut self, st: &mut Decoder, tokens: &[u32]) -> Result<HostTensor> {
        let c = &self.model.config;
        let w = &self.model.weights;
        let (n, start, heads) = (tokens.len(), st.len, c.decoder_heads);
        let (hd, d) = (c.d_model / heads, c.d_model);
        if start + n > st.self_kv.first().map_or(0, |(k, _)| k.shape()[1]) {
            return Err(Error::invalid(format!("{n} decoder positions do not fit after {start}")));
        }
        if start + n > c.max_positions {
            return Err(Error::invalid(format!(
                "decoder position {} is past the model's {} (config.json `max_position_embeddings`)",
                start + n - 1,
                c.max_positions
            )));
        }
        let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
        let mut h = self.embed(&ids, 1, start, &w.dec_pos, &w.dec_ln)?;
        self.keep(|| "dec.hidden.0".into(), &h);
        for (l, layer) in w.decoder.iter().enumerate() {
            let (q, k, v) = self.qkv(&h, &layer.self_attn)?;
            let (kc, vc) = &mut st.self_kv[l];
            kc.write_at(start * d, &k)?;
            vc.write_at(start * d, &v)?;
            let ctx = start + n;
            let (kc, vc) = (view(kc, &[1, ctx, heads, hd], 0)?, view(vc, &[1, ctx, heads, hd], 0)?);
            let a = self.attend(&q, kc, vc, (1, n, heads), None, true)?;
            let a = self.linear(&a, &layer.self_attn.o)?;
            self.keep(|| format!("dec.layer.{l}.self_attn_out"), &a);
            let (x, _) = self.layer_norm(a, &layer.self_ln, Some(h))?;
            self.keep(|| format!("dec.layer.{l}.self_attn_ln"), &x);
            let (cross, cross_ln) = layer.cross.as_ref().ok_or_else(|| Error::invalid("no encoder_attn".to_owned()))?;
            let q = self.linear(&x, &cross.q)?;
            let (ck, cv) = st.cross_kv[l].clone();
            let a = self.attend(&q, ck, cv, (1, n, heads), None, false)?;
            let a = self.linear(&a, &cross.o)?;
            self.keep(|| format!("dec.layer.{l}.cross_attn_out"), &a);
            let (y, _) = self.layer_norm(a, cross_ln, Some(x))?;
            self.keep(|| format!("dec.layer.{l}.cross_attn_ln"), &y);
            let f = self.ffn(&y, layer)?;
            self.keep(|| format!("dec.layer.{l}.ffn_out"), &f);
            h = self.layer_norm(f, &layer.ffn_ln, Some(y))?.0;
            self.keep(|| format!("dec.layer.{l}.out"), &h);
            self.keep(|| format!("dec.hidden.{}", l + 1), &h);
        }
        st.len += n;
        let head = OpArgs::Linear(LinearArgs {
            x: h,
            weight: w.lm_head.clone(),
            bias: Some(w.logits_bias.clone()),
            attrs: NoAttrs {},
        });
        let logits = self.out(head, None)?;
        Ok(if logits.dtype() == layerzero::model::dtype::DType::F32 {
            logits
        } else {
            HostTensor::from_f32(logits.shape(), logits.to_f32_vec())?
        })
    }

    /// The greedy token of a one-row `logits`.
    fn greedy(&mut self, logits: HostTensor) -> Result<u32> {
        let mut o = self.run(OpArgs::Sample(SampleArgs { logits, attrs: SampleAttrs::default() }), None)?;
        only_token(token_ids(take(&mut o, Op::Sample, "tokens")?)?)
    }
}

/// The encoder's output for `inputs` right-padded to the longest: `[inputs, longest, d]`
/// (rows past an input's length are padding: computed, but meaningless).
pub fn encode(model: &Seq2SeqModel, lz: &LayerZero, inputs: &[Vec<u32>]) -> Result<HostTensor> {
    let g = Generation { max_new_tokens: 0, ..Generation::default() };
    check(model, inputs, &g)?;
    let mut pass = Bart { cx: Pass::new(lz, false), model };
    let (h, s) = crate::pass::on_pool(|| pass.encode(inputs))?;
    view(&h, &[inputs.len(), s, model.config.d_model], 0)
}

/// Generates for each input (the encoder's token ids): the encoder once over the padded
/// batch, then for each input a greedy decoder from the decoder start token, with its caches
/// (`use_cache`) or recomputing every step. Sampling is not offered for encoder-decoders.
pub fn generate(
    model: &Seq2SeqModel,
    lz: &LayerZero,
    inputs: &[Vec<u32>],
    g: &Generation,
    use_cache: bool,
) -> Result<Seq2SeqGenerated> {
    check(model, inputs, g)?;
    let mut pass = Bart { cx: Pass::new(lz, g.dump), model };
    crate::pass::on_pool(|| run(&mut pass, inputs, g, use_cache))
}

/// Checks inputs and options against the model.
fn check(model: &Seq2SeqModel, inputs: &[Vec<u32>], g: &Generation) -> Result<()> {
    let c = &model.config;
    if inputs.is_empty() {
        return Err(Error::invalid("no input to generate from".to_owned()));
    }
    if g.temperature > 0.0 {
        return Err(Error::invalid(format!(
            "--temperature {}: encoder-decoder generation is greedy only",
            g.temperature
        )));
    }
    if g.dump && inputs.len() > 1 {
        return Err(Error::invalid("--dump keeps the stages of one input; give one".to_owned()));
    }
    for (i, x) in inputs.iter().enumerate() {
        let name = if inputs.len() > 1 { format!("input {i}") } else { "the input".to_owned() };
        if x.is_empty() {
            return Err(Error::invalid(format!("{name} is empty")));
        }
        if let Some((j, id)) = x.iter().enumerate().find(|(_, id)| **id as usize >= c.vocab) {
            return Err(Error::invalid(format!(
                "{name}: token {j} is id {id}, outside the model's vocabulary of {} (config.json `vocab_size`)",
                c.vocab
            )));
        }
        if x.len() > c.max_positions {
            return Err(Error::invalid(format!(
                "{name} has {} tokens; the encoder's positions end at {} (config.json `max_position_embeddings`)",
                x.len(),
                c.max_positions
            )));
        }
    }
    if g.max_new_tokens > c.max_positions {
        return Err(Error::invalid(format!(
            "{} new tokens need {} decoder positions; the model has {} (config.json `max_position_embeddings`)",
            g.max_new_tokens, g.max_new_tokens, c.max_positions
        )));
    }
    Ok(())
}

fn run(pass: &mut Bart<'_>, inputs: &[Vec<u32>], g: &Generation, use_cache: bool) -> Result<Seq2SeqGenerated> {
    let c = &pass.model.config;
    let d = c.d_model;
    let start = Instant::now();
    let (enc, s) = pass.encode(inputs)?;
    let encode_ns = start.elapsed().as_nanos() as u64;
    // The encoder's stages; the decoder's come from one teacher-forced pass at the end, so
    // the steps run without keeping theirs (only their logits).
    let dumping = pass.dump.is_some();
    let mut dump = pass.dump.take().unwrap_or_default();
    let decode_start = Instant::now();
    let mut sequences = Vec::with_capacity(inputs.len());
    let mut steps = 0;
    let capacity = g.max_new_tokens.max(1);
    for (i, x) in inputs.iter().enumerate() {
        let rows = view(&enc, &[x.len(), d], i * s * d)?;
        let mut tokens = vec![c.decoder_start];
        let mut generated = Vec::with_capacity(g.max_new_tokens);
        let mut st = if use_cache { Some(pass.decoder(&rows, capacity)?) } else { None };
        for step in 0..g.max_new_tokens {
            let logits = match &mut st {
                Some(st) => pass.decode(st, &tokens[tokens.len() - 1..])?,
                None => {
                    let mut fresh = pass.decoder(&rows, capacity)?;
                    let all = pass.decode(&mut fresh, &tokens)?;
                    let v = all.shape()[1];
                    view(&all, &[1, v], (tokens.len() - 1) * v)?
                }
            };
            steps += 1;
            if dumping {
                dump.insert(format!("logits.{step}"), logits.clone());
            }
            let t = pass.greedy(logits)?;
            generated.push(t);
            tokens.push(t);
            if g.stop_at_eos && c.eos.contains(&t) {
                break;
            }
        }
        sequences.push(Sequence { prompt_ids: x.clone(), generated_ids: generated });
    }
    let decode_ns = decode_start.elapsed().as_nanos() as u64;
    if let (true, Some(seq)) = (dumping, sequences.first())
        && let Some(n) = seq.generated_ids.len().checked_sub(1)
    {
        let mut forced = vec![c.decoder_start];
        forced.extend_from_slice(&seq.generated_ids[..n]);
        let rows = view(&enc, &[seq.prompt_ids.len(), d], 0)?;
        pass.dump = Some(BTreeMap::new());
        let mut st = pass.decoder(&rows, n + 1)?;
        pass.decode(&mut st, &forced)?;
        dump.extend(pass.dump.take().unwrap_or_default());
    }
    Ok(Seq2SeqGenerated {
        sequences,
        encode_ns,
        decode_ns,
        decode_steps: steps,
        stats: std::mem::take(&mut pass.stats),
        dump,
    })
}
