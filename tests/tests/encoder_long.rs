//! E2E §6.13 at the spec's encoder lengths (128, 512, 2048): a tiny BART with 2048 positions
//! (`tests/models/bart-long`) against HF transformers over a padded batch of two inputs of
//! different lengths (`tools/hf_reference_seq2seq_long.py`), its decoder with and without
//! its caches, and the attention kernels its masked encoder and its cross-attention select.

use std::collections::BTreeMap;
use std::path::PathBuf;

use layerzero::exec::args::{AttentionArgs, OpArgs};
use layerzero::model::attrs::AttentionAttrs;
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::select::SelectionReport;
use layerzero::tensor::{HostTensor, Storage, io};
use layerzero::{LayerZero, Request};
use layerzero_llm::Generation;
use layerzero_llm::seq2seq::{self, Seq2SeqModel};
use layerzero_tests::{TestResult, repo_root};

const LENGTHS: [usize; 3] = [128, 512, 2048];
/// Within the parity table's f32 tolerance for whole-model stages (as `encoder_decoder.rs`).
const TOLERANCE: f64 = 1e-5;

fn dir() -> PathBuf {
    repo_root().join("tests/models/bart-long")
}

fn reference() -> TestResult<BTreeMap<String, HostTensor>> {
    Ok(io::read(&dir().join("reference.safetensors"))?)
}

fn rows(t: &HostTensor) -> Vec<Vec<u32>> {
    let n = t.shape()[1];
    let v: Vec<u32> = t.to_f64_vec().iter().map(|&x| x as u32).collect();
    v.chunks(n).map(<[u32]>::to_vec).collect()
}

/// The two encoder inputs of length `l`'s batch, unpadded.
fn inputs(r: &BTreeMap<String, HostTensor>, l: usize) -> Vec<Vec<u32>> {
    let mask = rows(&r[&format!("len{l}.batch.attention_mask")]);
    rows(&r[&format!("len{l}.batch.input_ids")])
        .into_iter()
        .zip(&mask)
        .map(|(row, m)| row.into_iter().zip(m).filter(|(_, keep)| **keep == 1).map(|(t, _)| t).collect())
        .collect()
}

fn greedy(n: usize, dump: bool) -> Generation {
    Generation { max_new_tokens: n, stop_at_eos: false, dump, ..Generation::default() }
}

/// The largest absolute difference of `ours` from `theirs`.
fn worst(ours: &[f64], theirs: &[f64]) -> f64 {
    ours.iter().zip(theirs).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max)
}

#[test]
fn section_6_13_the_encoder_at_128_512_and_2048_positions_matches_hf_over_a_padded_batch() -> TestResult {
    let (r, model, lz) = (reference()?, Seq2SeqModel::load(&dir(), None)?, LayerZero::detected()?);
    assert!(model.config.max_positions >= 2048, "{}", model.config.max_positions);
    for l in LENGTHS {
        let inputs = inputs(&r, l);
        assert_eq!(inputs.iter().map(Vec::len).collect::<Vec<_>>(), [l, 3 * l / 4], "a ragged batch");
        let enc = seq2seq::encode(&model, &lz, &inputs)?;
        let hf = &r[&format!("len{l}.batch.enc.last")];
        assert_eq!(enc.shape(), hf.shape());
        let (ours, theirs, d) = (enc.to_f64_vec(), hf.to_f64_vec(), enc.shape()[2]);
        // Rows past an input's length are padding: only the real ones are compared.
        for (b, input) in inputs.iter().enumerate() {
            let span = (b * l * d)..((b * l + input.len()) * d);
            let err = worst(&ours[span.clone()], &theirs[span]);
            assert!(err < TOLERANCE, "L={l} row {b}: max abs diff {err:.2e}");
        }
    }
    Ok(())
}

#[test]
fn section_6_13_the_decoder_with_and_without_its_caches_gives_hfs_tokens_and_logits_at_every_length() -> TestResult {
    let (r, model, lz) = (reference()?, Seq2SeqModel::load(&dir(), None)?, LayerZero::detected()?);
    for l in LENGTHS {
        let inputs = inputs(&r, l);
        let want = rows(&r[&format!("len{l}.batch.generated_ids")]);
        let n = want[0].len();
        for use_cache in [true, false] {
            // Each input alone (the padded batch is generated in the selection test below),
            // its every step's logits against the batch row HF computed.
            for (b, input) in inputs.iter().enumerate() {
                let alone = seq2seq::generate(&model, &lz, std::slice::from_ref(input), &greedy(n, true), use_cache)?;
                assert_eq!(alone.sequences[0].generated_ids, want[b], "L={l} row {b} alone, cache {use_cache}");
                for k in 0..n {
                    let hf = r[&format!("len{l}.batch.logits.{k}")].to_f64_vec();
                    let v = hf.len() / 2;
                    let ours = alone.dump.get(&format!("logits.{k}")).ok_or(format!("no logits.{k}"))?.to_f64_vec();
                    let err = worst(&ours, &hf[b * v..(b + 1) * v]);
                    assert!(err < TOLERANCE, "L={l} row {b} step {k}, cache {use_cache}: max abs diff {err:.2e}");
                }
            }
        }
    }
    Ok(())
}

/// Attention of BART-long's shapes, described: `q` `[b, sq, 2, 8]` over `k`, `v`
/// `[b, sk, 2, 8]`, with `mask` when given.
fn attention(b: usize, sq: usize, sk: usize, mask: Option<HostTensor>) -> TestResult<OpArgs> {
    let t = |s: usize| -> TestResult<HostTensor> {
        Ok(HostTensor::zeros(DType::F32, &[b, s, 2, 8])?.with_layout(Layout::Bshd))
    };
    Ok(OpArgs::Attention(AttentionArgs {
        q: t(sq)?,
        k: t(sk)?,
        v: t(sk)?,
        mask,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        attrs: AttentionAttrs::default(),
    }))
}

/// The selected kernel of `report` and the mask reasons of every candidate.
fn selected_and_mask_refusals(report: &SelectionReport) -> (Option<String>, Vec<(String, &'static str)>) {
    let refusals = report
        .candidates
        .iter()
        .flat_map(|c| c.reasons.iter().map(move |r| (c.kernel.clone(), r.code().as_str())))
        .filter(|(_, code)| code.starts_with("MASK_"))
        .collect();
    (report.selected.clone(), refusals)
}

#[test]
fn section_6_13_masked_encoder_and_cross_attention_select_kernels_that_handle_their_masks() -> TestResult {
    let (r, model, host) = (reference()?, Seq2SeqModel::load(&dir(), None)?, LayerZero::detected()?);
    let h100 = LayerZero::planning("h100")?;
    for l in LENGTHS {
        let inputs = inputs(&r, l);
        // The encoder's self-attention over the padded batch: a bool key mask per row.
        let keep: Vec<bool> = inputs.iter().flat_map(|x| (0..l).map(move |j| j < x.len())).collect();
        let mask = HostTensor::new(Storage::Bool(keep), &[2, 1, 1, l])?;
        let encoder = attention(2, l, l, Some(mask))?.describe();
        // A decoder step's cross-attention: one query over one input's own encoder rows (the
        // decoder never sees the padding, so it needs no mask).
        let cross = attention(1, 1, inputs[1].len(), None)?.describe();
        let out = seq2seq::generate(&model, &host, &inputs, &greedy(2, false), true)?;
        let want = rows(&r[&format!("len{l}.batch.generated_ids")]);
        for (b, seq) in out.sequences.iter().enumerate() {
            assert_eq!(seq.generated_ids, want[b][..2], "L={l} row {b} of the padded batch");
        }
        let ran = &out.stats.iter().find(|(op, _)| op.as_str() == "attention").ok_or("no attention ran")?.1.kernels;
        for (what, req) in [("masked encoder", &encoder), ("cross-attention", &cross)] {
            let explained = |lz: &LayerZero, req: &Request| selected_and_mask_refusals(&lz.explain(req));
            let (chosen, refused) = explained(&host, req);
            let chosen = chosen.ok_or(format!("L={l} {what}: nothing selected on this host"))?;
            assert!(ran.contains_key(&chosen), "L={l} {what}: {chosen} selected but not run; ran {ran:?}");
            assert!(refused.iter().all(|(k, _)| *k != chosen), "L={l} {what}: {chosen} refused a mask: {refused:?}");
            // Planned for an H100: what the GPU kernels make of the same requests.
            let (gpu, refused) = explained(&h100, req);
            let gpu = gpu.ok_or(format!("L={l} {what}: nothing selected on an H100"))?;
            assert!(refused.iter().all(|(k, _)| *k != gpu), "L={l} {what} on an H100: {gpu}: {refused:?}");
            if req.tensors.contains_key("mask") {
                assert!(!refused.is_empty(), "L={l}: some H100 kernel refuses a padding mask, and says so");
            } else {
                assert!(refused.is_empty(), "L={l} {what}: no mask, no mask refusal: {refused:?}");
            }
        }
    }
    Ok(())
}
