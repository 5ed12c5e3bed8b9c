//! The LLM attention shape of E2E spec §6.1 (32 query heads over 8 KV heads, head dim 128,
//! causal) on host tensors: a prefill and one decode step run through the runtime, held to
//! the float64 oracle (`cpu_reference`) on sampled query rows, since the oracle over every
//! row of a long sequence would take too long.

use layerzero::compare::Category;
use layerzero::exec::args::{AttentionArgs, OpArgs};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::tensor::HostTensor;
use layerzero::{Dispatch, LayerZero};

use crate::{TestResult, causal, close, policy};

/// Query heads of the spec's shape.
pub const HEADS_Q: usize = 32;
/// KV heads of the spec's shape.
pub const HEADS_KV: usize = 8;
/// Head dim of the spec's shape.
pub const HEAD_DIM: usize = 128;

/// The oracle kernel every output is held to.
pub const ORACLE: &str = "cpu_reference.attention.naive";

/// Deterministic values in `[-amp, amp)` (xorshift64*, so no test depends on a crate's RNG).
pub fn values(seed: u64, n: usize, amp: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u = (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
            (2.0 * u - 1.0) * amp
        })
        .collect()
}

/// `n` distinct query rows of `0..seq`, sorted: the first, the last, and pseudo-random others.
pub fn sample_rows(seq: usize, n: usize, seed: u64) -> Vec<usize> {
    let mut rows = vec![0, seq - 1];
    for x in values(seed, 4 * n, 1.0) {
        if rows.len() >= n.min(seq) {
            break;
        }
        let r = (((x + 1.0) / 2.0 * seq as f32) as usize).min(seq - 1);
        if !rows.contains(&r) {
            rows.push(r);
        }
    }
    rows.sort_unstable();
    rows
}

/// One sequence of `seq` tokens plus the token a decode step adds, in one dtype: the values
/// are kept as the dtype holds them, so every slice of them is exact.
pub struct Gqa {
    /// The dtype of q, k, v and the output.
    pub dtype: DType,
    /// Tokens in the prefill (the cache a decode step reads).
    pub seq: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Gqa {
    /// `seq + 1` tokens of queries, keys and values from `seed`. Queries are larger than keys
    /// so that softmax is peaked, not nearly uniform over thousands of keys.
    pub fn new(dtype: DType, seq: usize, seed: u64) -> TestResult<Gqa> {
        let rounded =
            |v: Vec<f32>| -> TestResult<Vec<f32>> { Ok(HostTensor::from_f32_as(dtype, &[v.len()], &v)?.to_f32_vec()) };
        let n = seq + 1;
        Ok(Gqa {
            dtype,
            seq,
            q: rounded(values(seed, n * HEADS_Q * HEAD_DIM, 3.0))?,
            k: rounded(values(seed + 1, n * HEADS_KV * HEAD_DIM, 1.0))?,
            v: rounded(values(seed + 2, n * HEADS_KV * HEAD_DIM, 1.0))?,
        })
    }

    /// Tokens `from..to` of `data` (`heads` per token) as a BSHD tensor of batch 1.
    fn tensor(&self, data: &[f32], heads: usize, from: usize, to: usize) -> TestResult<HostTensor> {
        let row = heads * HEAD_DIM;
        let t = HostTensor::from_f32_as(self.dtype, &[1, to - from, heads, HEAD_DIM], &data[from * row..to * row])?;
        Ok(t.with_layout(Layout::Bshd))
    }

    /// Causal attention of queries `q0..q1` over keys `0..k1` (bottom-right aligned: the
    /// last query sees every key).
    fn call(&self, q0: usize, q1: usize, k1: usize) -> TestResult<OpArgs> {
        Ok(OpArgs::Attention(AttentionArgs {
            q: self.tensor(&self.q, HEADS_Q, q0, q1)?,
            k: self.tensor(&self.k, HEADS_KV, 0, k1)?,
            v: self.tensor(&self.v, HEADS_KV, 0, k1)?,
            mask: None,
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            attrs: causal(),
        }))
    }

    /// The prefill: `seq` queries over `seq` keys.
    pub fn prefill(&self) -> TestResult<OpArgs> {
        self.call(0, self.seq, self.seq)
    }

    /// The last chunk of a chunked prefill: the last `n` queries over all `seq` keys (query
    /// row `r` of the chunk is row `seq - n + r` of the prefill).
    pub fn last_queries(&self, n: usize) -> TestResult<OpArgs> {
        self.call(self.seq - n.min(self.seq), self.seq, self.seq)
    }

    /// The decode step: the next token's query over the cache plus its own key.
    pub fn decode(&self) -> TestResult<OpArgs> {
        self.call(self.seq, self.seq + 1, self.seq + 1)
    }

    /// Query row `i` of the prefill as a problem of its own: one query over keys `0..=i`,
    /// which is what causal masking leaves row `i` of the prefill.
    pub fn row(&self, i: usize) -> TestResult<OpArgs> {
        self.call(i, i + 1, i + 1)
    }
}

/// A handle locked to the oracle.
pub fn oracle() -> TestResult<LayerZero> {
    let locked = policy(&format!(r#"{{"rules": [{{"action": "lock", "kernels": "{ORACLE}"}}]}}"#))?;
    Ok(LayerZero::detected()?.with_policy(locked)?)
}

/// A dispatch served by a fast kernel, first try: not the oracle, no fallback.
pub fn served_first_try(d: &Dispatch<'_>) -> TestResult {
    let kernel = &d.selection().kernel;
    if kernel == ORACLE {
        return Err(format!("the oracle {ORACLE} served the call; a fast kernel should").into());
    }
    if !d.failed().is_empty() {
        return Err(
            format!("{kernel} served after {} failed attempt(s); no fallback expected", d.failed().len()).into()
        );
    }
    Ok(())
}

/// Rows `rows` of the prefill output `out` ([1, seq, 32, 128]) match the oracle's answer for
/// each row's own problem, within the attention tolerance of the dtype (§5).
pub fn prefill_rows_match(g: &Gqa, out: &HostTensor, rows: &[usize], oracle: &LayerZero) -> TestResult {
    if out.shape() != [1, g.seq, HEADS_Q, HEAD_DIM] {
        return Err(format!("prefill output has shape {:?}", out.shape()).into());
    }
    let got = out.to_f64_vec();
    let row = HEADS_Q * HEAD_DIM;
    for &i in rows {
        let want = oracle.dispatch(&g.row(i)?)?.outputs["out"].to_f64_vec();
        let what = format!("{} prefill of {} tokens, query row {i}", g.dtype, g.seq);
        close::values(&what, Category::Attention, g.dtype, &want, &got[i * row..(i + 1) * row])?;
    }
    Ok(())
}

/// The decode output matches the oracle's on the same call.
pub fn decode_matches(g: &Gqa, out: &HostTensor, oracle: &LayerZero) -> TestResult {
    let want = oracle.dispatch(&g.decode()?)?.outputs["out"].to_f64_vec();
    let what = format!("{} decode step over {} cached tokens", g.dtype, g.seq);
    close::values(&what, Category::Attention, g.dtype, &want, &out.to_f64_vec())
}
