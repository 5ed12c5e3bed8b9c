//! The workload of a model: every request its forward pass dispatches, with the ranges of
//! their perf axes for the batch sizes and context it will serve, so `lz tune`, `lz solve`
//! and `lz readiness-check` work per model.
//!
//! The requests are not written out by hand: a short run on zero weights of the model's
//! shapes (a prefill and a decode step on the contiguous cache, a batched decode on the
//! paged one) records what is dispatched, so the workload's keys are exactly the ones
//! generation looks up.

use std::collections::BTreeMap;

use super::forward::{KvKind, Session};
use super::weights::Weights;
use super::{Model, ModelConfig};
use layerzero::error::{Error, Result};
use layerzero::key::axes;
use layerzero::model::dtype::DType;
use layerzero::model::op::Op;
use layerzero::model::request::Request;
use layerzero::plan::SelectionKey;
use layerzero::plan::workload::{AxisRange, Entry, WORKLOAD_SCHEMA_VERSION, Workload};
use layerzero::runtime::LayerZero;

/// What the model will serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Serving {
    /// Most sequences decoded together.
    pub max_batch: usize,
    /// Longest sequence (prompt and generated tokens).
    pub max_seq: usize,
    /// Positions per page of the paged cache.
    pub page_size: usize,
}

/// The workload one rank serves of the Hugging Face model folder `dir`: its config split for
/// `tp` tensor-parallel ranks ([`ModelConfig::tensor_parallel`]), computed in `dtype` (else the
/// config's, else f32), up to `max_seq` positions (else the config's), named after the folder
/// (`<name>.tp<N>` when split), with the folder's tokenizer hash when it has one.
pub fn for_folder(
    lz: &LayerZero,
    dir: &std::path::Path,
    tp: usize,
    dtype: Option<DType>,
    max_batch: usize,
    max_seq: Option<usize>,
    page_size: usize,
) -> Result<Workload> {
    let config = ModelConfig::load(dir)?.tensor_parallel(tp)?;
    let dtype = dtype.or(config.dtype).unwrap_or(DType::F32);
    let serving = Serving { max_batch, max_seq: max_seq.unwrap_or(config.max_positions), page_size };
    let mut name = dir.file_name().map_or_else(|| "model".to_owned(), |n| n.to_string_lossy().into_owned());
    if tp > 1 {
        name = format!("{name}.tp{tp}");
    }
    let tokenizer_file = dir.join("tokenizer.json");
    let tokenizer = if tokenizer_file.exists() { Some(super::Tokenizer::load(&tokenizer_file)?) } else { None };
    workload(lz, &name, &config, dtype, serving, tokenizer.as_ref().map(super::Tokenizer::hash))
}

/// The workload of `config` computed in `dtype`, named `name`, for a model whose tokenizer
/// has `tokenizer_hash` (tables solved from it carry the hash, so a model scope with
/// another tokenizer refuses them).
pub fn workload(
    lz: &LayerZero,
    name: &str,
    config: &ModelConfig,
    dtype: DType,
    s: Serving,
    tokenizer_hash: Option<&str>,
) -> Result<Workload> {
    if s.max_batch == 0 || s.max_seq < 2 || s.page_size == 0 {
        return Err(Error::invalid(format!(
            "--max-batch {} and --page-size {} must be at least 1, --max-seq {} at least 2",
            s.max_batch, s.page_size, s.max_seq
        )));
    }
    let model = Model { dir: name.into(), config: config.clone(), weights: Weights::zeros(config, dtype)?, dtype };
    let recorded = record(lz, &model, s)?;
    let mut seen: BTreeMap<(u128, Vec<String>), ()> = BTreeMap::new();
    let mut counts: BTreeMap<Op, usize> = BTreeMap::new();
    let mut entries = Vec::new();
    for req in recorded {
        let key = SelectionKey::derive(&req);
        let ranges = ranges(&req, &key, s);
        let range_key: Vec<String> = ranges.iter().map(|(n, r)| format!("{n}={r:?}")).collect();
        if seen.insert((key.validity, range_key), ()).is_some() {
            continue;
        }
        let n = counts.entry(req.op).or_default();
        *n += 1;
        entries.push(Entry { name: format!("{}.{}", req.op, n), request: req.to_value(), ranges });
    }
    let w = Workload {
        schema_version: WORKLOAD_SCHEMA_VERSION,
        name: name.to_owned(),
        description: format!(
            "{} {}: hidden {}, {} layers, {} heads ({} KV) of {}, vocabulary {}, in {dtype}; up to {} sequences of {} tokens, pages of {}. Recorded from the forward pass by `lz workload`.",
            config.arch.as_str(),
            name,
            config.hidden,
            config.layers,
            config.heads,
            config.kv_heads,
            config.head_dim,
            config.vocab,
            s.max_batch,
            s.max_seq,
            s.page_size
        ),
        entries,
        tokenizer_hash: tokenizer_hash.map(str::to_owned),
    };
    // The result must be a workload `lz tune` and `lz solve` accept.
    Workload::from_json(&serde_json::to_string(&w).unwrap_or_default(), name)
}

/// Every request a prefill and a decode step dispatch, on one contiguous cache and on two
/// sequences' pages, and the sampling after them.
fn record(lz: &LayerZero, model: &Model, s: Serving) -> Result<Vec<Request>> {
    let mut recorded = Vec::new();
    // One sequence: a prefill of two tokens and a decode step.
    let mut one = Session::new(model, lz, 3)?.with_recording();
    one.forward(&[0, 1], false)?;
    one.forward(&[1], false)?;
    recorded.extend(one.take_recorded());
    // Two sequences on pages: each prefilled, then decoded together.
    let mut two = Session::with_cache(model, lz, &[3, 3], KvKind::Paged { page_size: s.page_size })?.with_recording();
    two.forward_batch(&[(0, &[0, 1])], false)?;
    two.forward_batch(&[(1, &[0, 1])], false)?;
    two.forward_batch(&[(0, &[1]), (1, &[1])], false)?;
    recorded.extend(two.take_recorded());
    // Sampling is dispatched by generation, after the forward pass.
    for batch in [1, 2] {
        recorded.push(Request::from_value(serde_json::json!({"op": "sample", "tensors": {
            "logits": {"dtype": "f32", "shape": [batch, model.config.vocab]}}}))?);
    }
    Ok(recorded)
}

/// The ranges of `req`'s perf axes over what the model will serve.
fn ranges(req: &Request, key: &SelectionKey, s: Serving) -> BTreeMap<String, AxisRange> {
    let tokens = s.max_seq.max(s.max_batch) as u64;
    let pages = s.max_seq.div_ceil(s.page_size) as u64;
    let names: Vec<String> = axes::axes(req.op).iter().map(|a| a.name.to_owned()).collect();
    match (req.op, key.perf) {
        // Prefill: queries and keys are the same positions.
        (Op::Attention, [_, q, k]) if q == k => [
            ("batch", AxisRange::Span([1, 1])),
            ("seq_q", AxisRange::Span([1, s.max_seq as u64])),
            ("seq_k", AxisRange::Tie("seq_q".into())),
        ]
        .into_iter()
        .map(|(n, r)| (n.to_owned(), r))
        .collect(),
        // Decode against the contiguous cache.
        (Op::Attention, _) => [("batch", AxisRange::Span([1, 1])), ("seq_k", AxisRange::Span([2, s.max_seq as u64]))]
            .into_iter()
            .map(|(n, r)| (n.to_owned(), r))
            .collect(),
        (Op::PagedAttention, _) => {
            [("batch", AxisRange::Span([1, s.max_batch as u64])), ("pages", AxisRange::Span([1, pages]))]
                .into_iter()
                .map(|(n, r)| (n.to_owned(), r))
                .collect()
        }
        (Op::Sample, _) => names.iter().map(|n| (n.clone(), AxisRange::Span([1, s.max_batch as u64]))).collect(),
        // Rows: every token count from one decode row to a whole prefill.
        _ => names.iter().map(|n| (n.clone(), AxisRange::Span([1, tokens]))).collect(),
    }
}
