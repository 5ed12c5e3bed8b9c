//! Generation: prefill the prompt, then decode one token at a time, every token chosen by
//! the `sample` op (greedy when the temperature is 0), with per-phase timing.

use std::collections::BTreeMap;
use std::time::Instant;

use super::Model;
use super::forward::{KvKind, OpStats, Session};
use layerzero::error::{Error, Result};
use layerzero::exec::args::{OpArgs, SampleArgs};
use layerzero::model::attrs::SampleAttrs;
use layerzero::model::op::Op;
use layerzero::runtime::LayerZero;
use layerzero::tensor::HostTensor;

/// How to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    /// 0 is greedy.
    pub temperature: f64,
    /// Keep the k most probable tokens (sampling only).
    pub top_k: Option<u64>,
    /// Keep the smallest set of tokens whose mass reaches p (sampling only).
    pub top_p: Option<f64>,
    /// Seed of the sampler; the same seed gives the same tokens.
    pub seed: u64,
    /// Stop after an end-of-sequence token.
    pub stop_at_eos: bool,
    /// Keep every stage and the logits of every step (`--dump`; one prompt only).
    pub dump: bool,
    /// The KV cache (several prompts need a paged one).
    pub kv: KvKind,
}

impl Default for Generation {
    fn default() -> Generation {
        Generation {
            max_new_tokens: 32,
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
            stop_at_eos: true,
            dump: false,
            kv: KvKind::Contiguous,
        }
    }
}

/// One prompt and what was generated for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    /// The prompt.
    pub prompt_ids: Vec<u32>,
    /// The generated tokens.
    pub generated_ids: Vec<u32>,
}

/// What a generation produced.
#[derive(Debug, Clone)]
pub struct Generated {
    /// Per prompt, in the order given.
    pub sequences: Vec<Sequence>,
    /// Prefill time (every prompt through the model and its first token chosen), ns.
    pub prefill_ns: u64,
    /// Decode time over every step after the first token, ns.
    pub decode_ns: u64,
    /// Decode steps run (each one token for every sequence still going).
    pub decode_steps: usize,
    /// Per op, what ran (prefill and decode).
    pub stats: BTreeMap<Op, OpStats>,
    /// Of `stats`, what ran in the prefill (every prompt and its first token).
    pub prefill_stats: BTreeMap<Op, OpStats>,
    /// Of `stats`, what ran in the decode steps.
    pub decode_stats: BTreeMap<Op, OpStats>,
    /// With `dump`: the stages of the prefill and `logits.{k}`.
    pub dump: BTreeMap<String, HostTensor>,
    /// The shadow checks made (when the handle's policy has `shadow_check`), by stage.
    pub checks: Vec<crate::pass::StageCheck>,
}

impl Generated {
    /// The first prompt.
    pub fn prompt_ids(&self) -> &[u32] {
        self.sequences.first().map_or(&[], |s| &s.prompt_ids)
    }

    /// The tokens generated for the first prompt.
    pub fn generated_ids(&self) -> &[u32] {
        self.sequences.first().map_or(&[], |s| &s.generated_ids)
    }
}

impl Generation {
    fn greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Sampling options for sequence `seq` at `step`: one counter-based stream per sequence
    /// and step, so a prompt gets the same tokens alone or in a batch.
    fn sample_attrs(&self, seq: usize, step: usize) -> SampleAttrs {
        if self.greedy() {
            return SampleAttrs::default();
        }
        let stream = (seq as u64).wrapping_mul(0xd134_2543_de82_ef95) ^ step as u64;
        SampleAttrs {
            temperature: Some(self.temperature),
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: None,
            seed: Some(self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(stream)),
        }
    }
}

/// Checks a prompt against the model: not empty, ids inside the vocabulary, prompt and
/// generation inside the context.
pub fn check_prompt(model: &Model, prompt: &[u32], max_new_tokens: usize) -> Result<()> {
    let c = &model.config;
    if prompt.is_empty() {
        return Err(Error::invalid("the prompt is empty".to_owned()));
    }
    if let Some((i, id)) = prompt.iter().enumerate().find(|(_, id)| **id as usize >= c.vocab) {
        return Err(Error::invalid(format!(
            "prompt token {i} is id {id}, outside the model's vocabulary of {} (config.json `vocab_size`)",
            c.vocab
        )));
    }
    let need = prompt.len() + max_new_tokens;
    // Dynamic NTK scaling exists to run past the trained context; other models stop there.
    let dynamic = matches!(c.rope.scaling, Some(layerzero::model::attrs::RopeScaling::DynamicNtk { .. }));
    if need > c.max_positions && !dynamic {
        return Err(Error::invalid(format!(
            "the prompt ({} tokens) and {max_new_tokens} new tokens need {need} positions; the model's context is {} (config.json `max_position_embeddings`)",
            prompt.len(),
            c.max_positions
        )));
    }
    Ok(())
}

/// Generates from `prompt`, calling `on_token` with each token as it is chosen.
pub fn generate(
    model: &Model,
    lz: &LayerZero,
    prompt: &[u32],
    g: &Generation,
    mut on_token: impl FnMut(u32),
) -> Result<Generated> {
    generate_batch(model, lz, &[prompt.to_vec()], g, |_, t| on_token(t))
}

/// Generates for several prompts of any lengths: each prompt is prefilled on its own, then
/// every sequence still going decodes one token per step in one batch over the paged cache.
/// `on_token(prompt index, token)` is called as tokens are chosen.
pub fn generate_batch(
    model: &Model,
    lz: &LayerZero,
    prompts: &[Vec<u32>],
    g: &Generation,
    mut on_token: impl FnMut(usize, u32),
) -> Result<Generated> {
    if prompts.is_empty() {
        return Err(Error::invalid("no prompt to generate from".to_owned()));
    }
    if g.dump && prompts.len() > 1 {
        return Err(Error::invalid("--dump keeps the stages of one prompt; give one".to_owned()));
    }
    for (i, p) in prompts.iter().enumerate() {
        check_prompt(model, p, g.max_new_tokens)
            .map_err(|e| if prompts.len() > 1 { Error::invalid(format!("prompt {i}: {}", e.message())) } else { e })?;
    }
    let capacities: Vec<usize> = prompts.iter().map(|p| p.len() + g.max_new_tokens.max(1)).collect();
    let mut session = Session::with_cache(model, lz, &capacities, g.kv)?;
    if g.dump {
        session = session.with_dump();
    }
    let v = model.config.vocab;
    let mut sequences: Vec<Sequence> =
        prompts.iter().map(|p| Sequence { prompt_ids: p.clone(), generated_ids: Vec::new() }).collect();
    let mut dump = BTreeMap::new();
    let start = Instant::now();
    let mut last = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let mut logits = session.forward_batch(&[(i, p)], g.dump)?;
        if g.dump {
            dump.extend(session.take_dump());
            dump.insert("logits.0".to_owned(), logits.clone());
            logits = logits.view(&[1, v], &[v, 1], (p.len() - 1) * v)?;
        }
        last.push(logits);
    }
    let mut tokens = Vec::with_capacity(prompts.len());
    for (i, logits) in last.into_iter().enumerate() {
        let chosen = sample(&mut session, logits, g, &[i], 0)?;
        tokens.push(only_token(chosen)?);
    }
    let prefill_ns = start.elapsed().as_nanos() as u64;
    let prefill_stats = session.take_stats();
    let decode_start = Instant::now();
    let mut active: Vec<usize> = (0..prompts.len()).collect();
    let mut steps = 0;
    for step in 0..g.max_new_tokens {
        let mut next = Vec::with_capacity(active.len());
        for (&i, &t) in active.iter().zip(&tokens) {
            sequences[i].generated_ids.push(t);
            on_token(i, t);
            let done = g.stop_at_eos && model.config.eos.contains(&t);
            if !done && step + 1 < g.max_new_tokens {
                next.push((i, t));
            }
        }
        if next.is_empty() {
            break;
        }
        let ids: Vec<[u32; 1]> = next.iter().map(|&(_, t)| [t]).collect();
        let batch: Vec<(usize, &[u32])> = next.iter().zip(&ids).map(|(&(i, _), id)| (i, &id[..])).collect();
        let logits = session.forward_batch(&batch, false)?;
        steps += 1;
        if g.dump {
            session.take_dump();
            dump.insert(format!("logits.{}", step + 1), logits.clone());
        }
        active = next.iter().map(|&(i, _)| i).collect();
        tokens = sample(&mut session, logits, g, &active, step + 1)?;
    }
    let decode_ns = if steps > 0 { decode_start.elapsed().as_nanos() as u64 } else { 0 };
    let decode_stats = session.take_stats();
    let stats = crate::pass::merged(&prefill_stats, decode_stats.clone());
    let checks = session.take_checks();
    Ok(Generated {
        sequences,
        prefill_ns,
        decode_ns,
        decode_steps: steps,
        stats,
        prefill_stats,
        decode_stats,
        dump,
        checks,
    })
}

/// Chooses one token per row of `logits` (`[seqs.len(), vocab]`): one `sample` call for
/// greedy, one per row when sampling (each sequence has its own stream).
fn sample(
    session: &mut Session<'_>,
    logits: HostTensor,
    g: &Generation,
    seqs: &[usize],
    step: usize,
) -> Result<Vec<u32>> {
    let to_ids = token_ids;
    if g.greedy() {
        return to_ids(session.sample(OpArgs::Sample(SampleArgs { logits, attrs: SampleAttrs::default() }))?);
    }
    let v = logits.shape().last().copied().unwrap_or(0);
    let mut out = Vec::with_capacity(seqs.len());
    for (row, &seq) in seqs.iter().enumerate() {
        let one = logits.view(&[1, v], &[v, 1], logits.offset() + row * v)?;
        out.extend(to_ids(
            session.sample(OpArgs::Sample(SampleArgs { logits: one, attrs: g.sample_attrs(seq, step) }))?,
        )?);
    }
    Ok(out)
}

/// The token ids of a `sample` op's `tokens` output (one per row of its logits).
pub(crate) fn token_ids(tokens: HostTensor) -> Result<Vec<u32>> {
    tokens
        .to_f64_vec()
        .iter()
        .map(|&id| u32::try_from(id as i64).map_err(|_| Error::invalid(format!("sample returned token {id}"))))
        .collect()
}

/// The one token of a one-row `sample` result.
pub(crate) fn only_token(tokens: Vec<u32>) -> Result<u32> {
    tokens.first().copied().ok_or_else(|| Error::invalid("sample returned no token".to_owned()))
}
