//! Running sequences through a decoder: a [`Session`] holds the model's layers
//! (`decoder`), its KV cache (`kv`) and what ran, checks each batch, and
//! hands back f32 logits. Every op is a dispatch through LayerZero, on a rayon worker.

use std::collections::BTreeMap;

use super::Model;
use super::decoder::Decoder;
use super::kv::KvCache;
pub use super::kv::KvKind;
pub use super::pass::OpStats;
use super::pass::{Pass, Slot, Slots, take};
use super::refill::{refill_f32, refill_i64};
use layerzero::error::{Error, Result};
use layerzero::exec::args::OpArgs;
use layerzero::model::dtype::DType;
use layerzero::model::op::Op;
use layerzero::model::request::Request;
use layerzero::runtime::LayerZero;
use layerzero::tensor::HostTensor;

/// Sequences being run: the model's layers, the pass every op is dispatched through, the KV
/// cache and what ran.
pub struct Session<'m> {
    decoder: Decoder<'m>,
    pass: Pass<'m>,
    kv: KvCache,
    vocab: usize,
    /// The token ids and the f32 copy of logits computed in another dtype, rewritten in
    /// place each call.
    ids: Option<HostTensor>,
    logits: Option<HostTensor>,
    /// Where the `sample` op's outputs are kept.
    sample_slot: Slot,
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
        let kv = KvCache::new(&model.config, model.dtype, capacities, kind)?;
        let mut slots = Slots::default();
        let decoder = Decoder::new(model, &mut slots)?;
        decoder.prepare(model, lz)?;
        Ok(Session {
            decoder,
            pass: Pass::new(lz, false),
            kv,
            vocab: model.config.vocab,
            ids: None,
            logits: None,
            sample_slot: slots.named("sample"),
        })
    }

    /// Keeps every stage of the following forward calls for `lz diff`.
    pub fn with_dump(mut self) -> Session<'m> {
        self.pass.dump = Some(BTreeMap::new());
        self
    }

    /// Records every request dispatched from now on.
    pub fn with_recording(mut self) -> Session<'m> {
        self.pass.record = Some(Vec::new());
        self
    }

    /// The requests recorded so far.
    pub fn take_recorded(&mut self) -> Vec<Request> {
        self.pass.record.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The stages kept so far (empty without a dump).
    pub fn take_dump(&mut self) -> BTreeMap<String, HostTensor> {
        self.pass.dump.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Per op, what ran so far; counting starts again.
    pub fn take_stats(&mut self) -> BTreeMap<Op, OpStats> {
        std::mem::take(&mut self.pass.stats)
    }

    /// The shadow checks made so far (`shadow_check` in the handle's policy), by stage:
    /// each layer, then what runs outside them; collecting starts again.
    pub fn take_checks(&mut self) -> Vec<crate::pass::StageCheck> {
        self.pass.take_checks()
    }

    /// Positions cached for sequence `seq`.
    pub fn len(&self, seq: usize) -> usize {
        self.kv.room(seq).map_or(0, |(len, _)| len)
    }

    /// Forgets sequence `seq`'s positions from `len` on (a speculative round's rejected
    /// tokens): the next forward writes over them.
    pub fn truncate(&mut self, seq: usize, len: usize) -> Result<()> {
        self.kv.truncate(seq, len)
    }

    /// Runs the `sample` op: the token ids it chose.
    pub(crate) fn sample(&mut self, args: OpArgs) -> Result<HostTensor> {
        take(&mut self.pass.run(args, Some(self.sample_slot))?, Op::Sample, "tokens")
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
        crate::pass::on_pool(|| self.forward_on_pool(batch, all_logits))
    }

    fn forward_on_pool(&mut self, batch: &[(usize, &[u32])], all_logits: bool) -> Result<HostTensor> {
        let s = self.check(batch)?;
        let flat = batch.iter().flat_map(|(_, ids)| ids.iter().map(|&i| i64::from(i)));
        let ids = refill_i64(&mut self.ids, flat, &[batch.len() * s])?;
        let step = self.kv.step(batch.iter().map(|&(seq, _)| seq), s)?;
        let logits = self.decoder.forward(&mut self.pass, ids, &mut self.kv, &step, all_logits)?;
        self.kv.commit(step);
        if logits.dtype() == DType::F32 {
            return Ok(logits);
        }
        // Logits leave the model as f32 (sampling and the caller read them as such).
        let (st, off) = (logits.storage(), logits.offset());
        if logits.is_contiguous() {
            refill_f32(&mut self.logits, (off..off + logits.numel()).map(|i| st.get_f32(i)), logits.shape())
        } else {
            HostTensor::from_f32(logits.shape(), logits.to_f32_vec())
        }
    }

    /// Checks that `batch` is one sequence with new tokens or several with one each, every
    /// sequence in the session once, its ids in the vocabulary and room for them: the new
    /// tokens per sequence.
    fn check(&self, batch: &[(usize, &[u32])]) -> Result<usize> {
        let s = batch.first().map_or(0, |(_, ids)| ids.len());
        if s == 0 || (batch.len() > 1 && batch.iter().any(|(_, ids)| ids.len() != 1)) {
            return Err(Error::invalid(
                "a batch is one sequence with new tokens, or several sequences with one new token each".to_owned(),
            ));
        }
        for (i, &(seq, ids)) in batch.iter().enumerate() {
            if batch[..i].iter().any(|(other, _)| *other == seq) {
                return Err(Error::invalid(format!("sequence {seq} appears twice in one batch")));
            }
            let Some((len, cap)) = self.kv.room(seq) else {
                return Err(Error::invalid(format!("sequence {seq} is not in this session")));
            };
            if let Some((k, id)) = ids.iter().enumerate().find(|(_, id)| **id as usize >= self.vocab) {
                return Err(Error::invalid(format!("token {k} is id {id}, outside the vocabulary of {}", self.vocab)));
            }
            if len + ids.len() > cap {
                return Err(Error::invalid(format!(
                    "{} positions do not fit: {len} are cached and sequence {seq} holds {cap}",
                    ids.len()
                )));
            }
        }
        Ok(s)
    }
}
