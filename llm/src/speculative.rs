//! Speculative decoding: a small draft model proposes up to `k` tokens one at a time, the
//! target scores all of them in one forward pass, and the longest prefix the target agrees
//! with is kept, followed by one token of the target's own (so every round yields at least
//! one token, and a round whose drafts all pass yields `k + 1`).
//!
//! - **Greedy**: a draft passes when it is the target's argmax at its position; the target's
//!   argmax replaces the first that does not. The tokens are the target's greedy tokens.
//! - **Sampling**: the rejection rule of Leviathan et al. and Chen et al. (2023). A draft `x`
//!   drawn from the draft's distribution `q` passes with probability `min(1, p(x) / q(x))`,
//!   where `p` is the target's; the first that fails is replaced by a draw from
//!   `max(0, p - q)` renormalized; when all pass, one more token is drawn from the target's
//!   next distribution. Each token is then distributed exactly as the target alone would
//!   draw it. `p` and `q` are the distributions the `sample` op draws from (temperature,
//!   top-k and top-p applied alike to both), and every draw has its own counter-based stream
//!   (purpose, position), so a seed gives the same tokens on every machine.
//!
//! Both models keep every committed token but the last in their KV cache; a rejected
//! round's positions are forgotten ([`Session::truncate`]) and written over.

use std::collections::BTreeMap;
use std::time::Instant;

use super::Model;
use super::forward::{OpStats, Session};
use super::generate::{Generation, check_prompt, only_token, token_ids};
use layerzero::error::{Error, Result};
use layerzero::exec::args::{OpArgs, SampleArgs};
use layerzero::exec::semantics::{SamplePlan, sample_kept, sample_plan, sample_uniform};
use layerzero::model::attrs::SampleAttrs;
use layerzero::model::op::Op;
use layerzero::runtime::LayerZero;
use layerzero::tensor::HostTensor;

/// What a speculative generation produced.
#[derive(Debug, Clone)]
pub struct Speculated {
    /// The generated tokens.
    pub generated_ids: Vec<u32>,
    /// Draft-then-verify rounds (one target forward each).
    pub rounds: usize,
    /// Tokens the draft proposed.
    pub drafted: usize,
    /// Proposed tokens the target kept.
    pub accepted: usize,
    /// Wall time from the first prefill to the last token, ns.
    pub ns: u64,
    /// Of which both models' prefill of the prompt (all but its last token), ns.
    pub prefill_ns: u64,
    /// Per op, what ran for the target.
    pub target_stats: BTreeMap<Op, OpStats>,
    /// Per op, what ran for the draft.
    pub draft_stats: BTreeMap<Op, OpStats>,
}

impl Speculated {
    /// Accepted over drafted tokens (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 { 0.0 } else { self.accepted as f64 / self.drafted as f64 }
    }
}

/// Checks that `draft` can draft for `target`: token ids mean the same to both.
pub fn check_draft(target: &Model, draft: &Model) -> Result<()> {
    let (t, d) = (target.config.vocab, draft.config.vocab);
    if t != d {
        return Err(Error::invalid(format!(
            "the draft's vocabulary is {d} tokens and the target's {t} (config.json `vocab_size` of {} and {}); \
             a draft must share the target's tokens",
            draft.dir.display(),
            target.dir.display()
        )));
    }
    Ok(())
}

/// The independent random streams of a speculative generation.
#[derive(Clone, Copy)]
enum Stream {
    /// The draft's proposal at a position.
    Draft = 1,
    /// The accept-or-reject draw at a position.
    Accept = 2,
    /// The target's own token at a position (after a rejection, or after every draft passed).
    Target = 3,
}

fn uniform(seed: u64, stream: Stream, position: usize) -> f64 {
    let key = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (stream as u64).wrapping_mul(0xd134_2543_de82_ef95);
    sample_uniform(key, position as u64)
}

/// The distribution `sample` draws from for one row of logits, dense over the vocabulary.
fn distribution(row: &[f32], plan: &SamplePlan) -> Result<Vec<f64>> {
    let l: Vec<f64> = row.iter().map(|&x| f64::from(x)).collect();
    if let Some(j) = l.iter().position(|x| x.is_nan()) {
        return Err(Error::invalid(format!("the logits are NaN at token {j}")));
    }
    if l.iter().all(|&x| x == f64::NEG_INFINITY) {
        return Err(Error::invalid("the logits are all -inf; there is no token to sample".to_owned()));
    }
    let (kept, mass) = sample_kept(&l, plan);
    let mut p = vec![0.0; l.len()];
    for (i, w) in kept {
        p[i] = w / mass;
    }
    Ok(p)
}

/// The first token whose running weight exceeds `u` times the total (the last with weight
/// if rounding leaves none).
fn draw(weights: &[f64], u: f64) -> u32 {
    let total: f64 = weights.iter().sum();
    let target = u * total;
    let mut run = 0.0;
    let mut last = 0;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            run += w;
            last = i;
            if run > target {
                break;
            }
        }
    }
    last as u32
}

/// The argmax of each row of `logits`, by the `sample` op (greedy).
fn argmax(session: &mut Session<'_>, logits: HostTensor) -> Result<Vec<u32>> {
    token_ids(session.sample(OpArgs::Sample(SampleArgs { logits, attrs: SampleAttrs::default() }))?)
}

/// Generates from `prompt` with `target`, `draft` proposing up to `k` tokens a round; calls
/// `on_token` with each token as it is committed. `g.kv` and `g.dump` do not apply (one
/// sequence, contiguous caches). Both models select through `lz`; to keep each model's
/// plan, selection caches and counters apart, see [`speculate_scoped`].
pub fn speculate(
    target: &Model,
    draft: &Model,
    lz: &LayerZero,
    prompt: &[u32],
    g: &Generation,
    k: usize,
    on_token: impl FnMut(u32),
) -> Result<Speculated> {
    speculate_scoped((target, lz), (draft, lz), prompt, g, k, on_token)
}

/// [`speculate`] with each model selecting through its own handle (a model scope each,
/// `ModelScope::speculate`): neither model's plan or cached selections serve the other,
/// and each scope's counters count its own model's calls (E2E §6.17).
pub fn speculate_scoped(
    (target, target_lz): (&Model, &LayerZero),
    (draft, draft_lz): (&Model, &LayerZero),
    prompt: &[u32],
    g: &Generation,
    k: usize,
    mut on_token: impl FnMut(u32),
) -> Result<Speculated> {
    let plan = check(target, draft, prompt, g, k)?;
    // A round drafts at most what the budget leaves (max_new_tokens - 1 past the committed
    // tokens), so no cache ever holds more than the prompt and the budget, whatever k is.
    let capacity = prompt.len() + g.max_new_tokens;
    let mut run = Run {
        ts: Session::new(target, target_lz, capacity)?,
        ds: Session::new(draft, draft_lz, capacity)?,
        g,
        plan,
        vocab: target.config.vocab,
        all: prompt.to_vec(),
    };
    let mut out: Vec<u32> = Vec::with_capacity(g.max_new_tokens);
    let (mut rounds, mut drafted, mut accepted) = (0, 0, 0);
    let start = Instant::now();
    // The last prompt token is the first round's input, so every token is drafted and verified.
    let head = &prompt[..prompt.len() - 1];
    if !head.is_empty() {
        run.ts.forward(head, false)?;
        run.ds.forward(head, false)?;
    }
    let prefill_ns = start.elapsed().as_nanos() as u64;
    let mut done = g.max_new_tokens == 0;
    while !done {
        let base = out.len();
        // Drafts leave room for the target's own token inside max_new_tokens.
        let kk = k.min(g.max_new_tokens - base - 1);
        let (drafts, qs) = run.propose(base, kk)?;
        let (n, next) = run.verify(base, &drafts, &qs)?;
        rounds += 1;
        drafted += kk;
        accepted += n;
        for &t in drafts[..n].iter().chain(std::iter::once(&next)) {
            out.push(t);
            run.all.push(t);
            on_token(t);
            if (g.stop_at_eos && target.config.eos.contains(&t)) || out.len() == g.max_new_tokens {
                done = true;
                break;
            }
        }
        run.rollback()?;
    }
    Ok(Speculated {
        generated_ids: out,
        rounds,
        drafted,
        accepted,
        ns: start.elapsed().as_nanos() as u64,
        prefill_ns,
        target_stats: run.ts.take_stats(),
        draft_stats: run.ds.take_stats(),
    })
}

/// Checks the options, the draft and the prompt against both models: the plan both
/// models' distributions are drawn from.
fn check(target: &Model, draft: &Model, prompt: &[u32], g: &Generation, k: usize) -> Result<SamplePlan> {
    if k == 0 {
        return Err(Error::invalid("--draft-tokens must be at least 1".to_owned()));
    }
    if g.dump {
        return Err(Error::invalid(
            "--dump keeps the stages of one model; it does not combine with --draft".to_owned(),
        ));
    }
    check_draft(target, draft)?;
    check_prompt(target, prompt, g.max_new_tokens)?;
    check_prompt(draft, prompt, g.max_new_tokens)
        .map_err(|e| Error::invalid(format!("the draft model: {}", e.message())))?;
    sample_plan(&SampleAttrs {
        temperature: Some(g.temperature),
        top_k: g.top_k,
        top_p: g.top_p,
        min_p: None,
        seed: None,
    })
    .map_err(Error::invalid)
}

/// A speculative generation under way: both models' sessions and every committed token
/// (the prompt's included).
struct Run<'m, 'g> {
    ts: Session<'m>,
    ds: Session<'m>,
    g: &'g Generation,
    plan: SamplePlan,
    vocab: usize,
    all: Vec<u32>,
}

impl Run<'_, '_> {
    fn greedy(&self) -> bool {
        self.g.temperature <= 0.0
    }

    /// `kk` tokens the draft proposes one at a time from position `base` of the generated
    /// tokens, and (sampling) the distribution each was drawn from.
    fn propose(&mut self, base: usize, kk: usize) -> Result<(Vec<u32>, Vec<Vec<f64>>)> {
        let mut pending: Vec<u32> = self.all[self.ds.len(0)..].to_vec();
        let mut drafts = Vec::with_capacity(kk);
        let mut qs = Vec::with_capacity(kk);
        for i in 0..kk {
            let logits = self.ds.forward(&pending, false)?;
            let x = if self.greedy() {
                only_token(argmax(&mut self.ds, logits)?)?
            } else {
                let q = distribution(&logits.to_f32_vec(), &self.plan)?;
                let x = draw(&q, uniform(self.g.seed, Stream::Draft, base + i));
                qs.push(q);
                x
            };
            drafts.push(x);
            pending.clear();
            pending.push(x);
        }
        Ok((drafts, qs))
    }

    /// The target scores `drafts` in one forward pass: how many it keeps, and its own token
    /// after them.
    fn verify(&mut self, base: usize, drafts: &[u32], qs: &[Vec<f64>]) -> Result<(usize, u32)> {
        let (v, kk) = (self.vocab, drafts.len());
        let mut tokens = self.all[self.ts.len(0)..].to_vec();
        tokens.extend_from_slice(drafts);
        let logits = self.ts.forward(&tokens, true)?;
        // The rows that score the drafts and the token after them.
        let rows = logits.view(&[kk + 1, v], &[v, 1], logits.offset() + (tokens.len() - kk - 1) * v)?;
        if self.greedy() {
            let picks = argmax(&mut self.ts, rows)?;
            let n = drafts.iter().zip(&picks).take_while(|(d, p)| d == p).count();
            let next =
                picks.get(n).copied().ok_or_else(|| Error::invalid("sample returned too few tokens".to_owned()))?;
            return Ok((n, next));
        }
        let values = rows.to_f32_vec();
        let row = |i: usize| &values[i * v..(i + 1) * v];
        let seed = self.g.seed;
        for (i, (&x, q)) in drafts.iter().zip(qs).enumerate() {
            let p = distribution(row(i), &self.plan)?;
            let x = x as usize;
            // x was drawn from q, so q[x] > 0.
            if uniform(seed, Stream::Accept, base + i) * q[x] < p[x] {
                continue;
            }
            let residual: Vec<f64> = p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect();
            let u = uniform(seed, Stream::Target, base + i);
            // p < q at x leaves mass elsewhere; rounding alone could empty it.
            let t = if residual.iter().sum::<f64>() > 0.0 { draw(&residual, u) } else { draw(&p, u) };
            return Ok((i, t));
        }
        Ok((kk, draw(&distribution(row(kk), &self.plan)?, uniform(seed, Stream::Target, base + kk))))
    }

    /// Each cache keeps the committed tokens it holds, all but the last: a rejected round's
    /// positions are written over by the next.
    fn rollback(&mut self) -> Result<()> {
        let keep = self.all.len() - 1;
        let (tl, dl) = (self.ts.len(0), self.ds.len(0));
        self.ts.truncate(0, keep.min(tl))?;
        self.ds.truncate(0, keep.min(dl))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draw_picks_by_running_weight_and_skips_empty_tokens() {
        let w = [0.0, 0.25, 0.0, 0.75];
        assert_eq!(draw(&w, 0.0), 1);
        assert_eq!(draw(&w, 0.2), 1);
        assert_eq!(draw(&w, 0.3), 3);
        assert_eq!(draw(&w, 0.999_999), 3);
    }

    #[test]
    fn streams_differ_by_purpose_and_position() {
        let a = uniform(7, Stream::Draft, 0);
        assert_ne!(a, uniform(7, Stream::Accept, 0));
        assert_ne!(a, uniform(7, Stream::Draft, 1));
        assert_ne!(a, uniform(8, Stream::Draft, 0));
        assert_eq!(a, uniform(7, Stream::Draft, 0));
    }
}
