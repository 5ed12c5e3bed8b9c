//! Generation: prefill the prompt, then decode one token at a time, every token chosen by
//! the `sample` op (greedy when the temperature is 0), with per-phase timing.

use std::collections::BTreeMap;
use std::time::Instant;

use super::Model;
use super::forward::{OpStats, Session};
use crate::error::{Error, Result};
use crate::exec::args::{OpArgs, SampleArgs};
use crate::model::attrs::SampleAttrs;
use crate::model::op::Op;
use crate::runtime::LayerZero;
use crate::tensor::HostTensor;

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
    /// Keep every stage and the logits of every step (`--dump`).
    pub dump: bool,
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
        }
    }
}

/// What a generation produced.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The prompt.
    pub prompt_ids: Vec<u32>,
    /// The generated tokens.
    pub generated_ids: Vec<u32>,
    /// Prefill time, ns.
    pub prefill_ns: u64,
    /// Decode time over every token after the first, ns.
    pub decode_ns: u64,
    /// Per op, what ran.
    pub stats: BTreeMap<Op, OpStats>,
    /// With `dump`: the stages of the prefill and `logits.{k}`.
    pub dump: BTreeMap<String, HostTensor>,
}

impl Generation {
    fn sample_attrs(&self, step: usize) -> SampleAttrs {
        if self.temperature <= 0.0 {
            return SampleAttrs::default();
        }
        SampleAttrs {
            temperature: Some(self.temperature),
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: None,
            // One counter-based stream per step: the same seed gives the same tokens.
            seed: Some(self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(step as u64)),
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
    let dynamic = matches!(c.rope.scaling, Some(crate::model::attrs::RopeScaling::DynamicNtk { .. }));
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
    check_prompt(model, prompt, g.max_new_tokens)?;
    let mut session = Session::new(model, lz, prompt.len() + g.max_new_tokens.max(1))?;
    if g.dump {
        session = session.with_dump();
    }
    let mut generated = Vec::with_capacity(g.max_new_tokens);
    let mut dump = BTreeMap::new();
    let start = Instant::now();
    let mut logits = session.forward(prompt, g.dump)?;
    if g.dump {
        dump.extend(session.take_dump());
        dump.insert("logits.0".to_owned(), logits.clone());
        let v = model.config.vocab;
        logits = logits.view(&[1, v], &[v, 1], (prompt.len() - 1) * v)?;
    }
    let mut prefill_ns = 0;
    let mut decode_start = Instant::now();
    for step in 0..g.max_new_tokens {
        let token = sample(&mut session, logits, g, step)?;
        if step == 0 {
            prefill_ns = start.elapsed().as_nanos() as u64;
            decode_start = Instant::now();
        }
        generated.push(token);
        on_token(token);
        let done = g.stop_at_eos && model.config.eos.contains(&token);
        if done || step + 1 == g.max_new_tokens {
            break;
        }
        logits = session.forward(&[token], false)?;
        if g.dump {
            session.take_dump();
            dump.insert(format!("logits.{}", step + 1), logits.clone());
        }
    }
    let decode_ns = if generated.len() > 1 { decode_start.elapsed().as_nanos() as u64 } else { 0 };
    Ok(Generated {
        prompt_ids: prompt.to_vec(),
        generated_ids: generated,
        prefill_ns,
        decode_ns,
        stats: std::mem::take(&mut session.stats),
        dump,
    })
}

fn sample(session: &mut Session<'_>, logits: HostTensor, g: &Generation, step: usize) -> Result<u32> {
    let tokens = session.sample(OpArgs::Sample(SampleArgs { logits, attrs: g.sample_attrs(step) }))?;
    let id =
        tokens.to_f64_vec().first().copied().ok_or_else(|| Error::invalid("sample returned no token".to_owned()))?;
    u32::try_from(id as i64).map_err(|_| Error::invalid(format!("sample returned token {id}")))
}
