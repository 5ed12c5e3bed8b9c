//! Encoder-decoder models (E2E §6.13): a tiny BART against HF transformers stage by stage,
//! a padded batch of inputs of different lengths, and the decoder with and without its
//! caches giving the same tokens.

use std::collections::BTreeMap;
use std::path::PathBuf;

use layerzero::LayerZero;
use layerzero::schema::{SchemaKind, violations};
use layerzero::tensor::{HostTensor, io};
use layerzero_llm::Generation;
use layerzero_llm::seq2seq::{self, Seq2SeqModel};
use layerzero_tests::{TestResult, lz, repo_root};

fn dir() -> PathBuf {
    repo_root().join("tests/models/bart")
}

fn reference() -> TestResult<BTreeMap<String, HostTensor>> {
    Ok(io::read(&dir().join("reference.safetensors"))?)
}

fn ids(t: &HostTensor) -> Vec<u32> {
    t.to_f64_vec().iter().map(|&x| x as u32).collect()
}

fn rows(t: &HostTensor) -> Vec<Vec<u32>> {
    let n = t.shape()[1];
    ids(t).chunks(n).map(<[u32]>::to_vec).collect()
}

fn greedy(n: usize, dump: bool) -> Generation {
    Generation { max_new_tokens: n, stop_at_eos: false, dump, ..Generation::default() }
}

#[test]
fn bart_matches_hf_at_every_encoder_and_decoder_stage_and_token() -> TestResult {
    let r = reference()?;
    let model = Seq2SeqModel::load(&dir(), None)?;
    let lz = LayerZero::detected()?;
    let input = ids(&r["input_ids"]);
    let n = r["generated_ids"].numel();
    let out = seq2seq::generate(&model, &lz, &[input], &greedy(n, true), true)?;
    let mut ours = out.dump.clone();
    ours.insert(
        "generated_ids".into(),
        HostTensor::from_f32(&[n], out.sequences[0].generated_ids.iter().map(|&t| t as f32).collect())?,
    );
    let report = layerzero_llm::diff::diff(&ours, &r, 1e-5)?;
    let (enc, dec) = (model.config.encoder_layers, model.config.decoder_layers);
    // Per encoder layer 4 stages and its output, per decoder layer 6 and its output, the two
    // embeddings and every step's logits.
    assert_eq!(
        report.stages.len(),
        enc * 5 + dec * 7 + 2 + n,
        "{:?}",
        report.stages.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    assert!(report.ok(), "first divergence {:?}, tokens {:?}", report.first_divergence, report.token_mismatches);
    for op in ["layer_norm", "attention", "gelu", "linear", "embedding"] {
        assert!(out.stats.keys().any(|o| o.as_str() == op), "{op} was dispatched");
    }
    Ok(())
}

#[test]
fn a_padded_batch_of_different_lengths_gives_each_input_what_it_gets_alone() -> TestResult {
    let r = reference()?;
    let model = Seq2SeqModel::load(&dir(), None)?;
    let lz = LayerZero::detected()?;
    let mask = rows(&r["batch.attention_mask"]);
    let inputs: Vec<Vec<u32>> = rows(&r["batch.input_ids"])
        .into_iter()
        .zip(&mask)
        .map(|(row, m)| row.into_iter().zip(m).filter(|(_, keep)| **keep == 1).map(|(t, _)| t).collect())
        .collect();
    assert_ne!(inputs[0].len(), inputs[1].len(), "the reference batch is ragged");
    let want = rows(&r["batch.generated_ids"]);
    let n = want[0].len();
    // The encoder over the padded batch: every unpadded row as HF computed it.
    let enc = seq2seq::encode(&model, &lz, &inputs)?;
    let hf = &r[&format!("batch.enc.hidden.{}", model.config.encoder_layers)];
    let (ours, theirs) = (enc.to_f64_vec(), hf.to_f64_vec());
    let (s, d) = (enc.shape()[1], enc.shape()[2]);
    assert_eq!(hf.shape(), enc.shape());
    for (b, input) in inputs.iter().enumerate() {
        for j in 0..input.len() {
            for k in 0..d {
                let i = (b * s + j) * d + k;
                assert!((ours[i] - theirs[i]).abs() < 1e-5, "row {b} position {j}: {} vs {}", ours[i], theirs[i]);
            }
        }
    }
    // Generation over the batch, and each input alone.
    let both = seq2seq::generate(&model, &lz, &inputs, &greedy(n, false), true)?;
    for (b, seq) in both.sequences.iter().enumerate() {
        assert_eq!(seq.generated_ids, want[b], "row {b}");
        let alone = seq2seq::generate(&model, &lz, &inputs[b..=b], &greedy(n, false), true)?;
        assert_eq!(alone.sequences[0].generated_ids, want[b], "row {b} alone");
    }
    assert_ne!(want[0], want[1], "the two inputs generate differently");
    Ok(())
}

#[test]
fn the_decoder_with_and_without_its_caches_gives_the_same_tokens_through_lz() -> TestResult {
    let r = reference()?;
    let input: Vec<String> = ids(&r["input_ids"]).iter().map(u32::to_string).collect();
    let run = |extra: &[&str]| -> TestResult<serde_json::Value> {
        let out = lz()?
            .args(["generate", "--model"])
            .arg(dir())
            .args(["--prompt-ids", &input.join(","), "--max-new-tokens", "16", "--ignore-eos", "--json"])
            .args(extra)
            .output()?;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let bad = violations(SchemaKind::GenerateReport, &v)?;
        assert!(bad.is_empty(), "{bad:?}");
        Ok(v)
    };
    let cached = run(&[])?;
    let fresh = run(&["--no-kv-cache"])?;
    assert_eq!(cached["generated_ids"], fresh["generated_ids"]);
    assert_eq!(cached["kv"], "contiguous");
    assert_eq!(fresh["kv"], "none");
    let want: Vec<u32> = ids(&r["generated_ids"]);
    assert_eq!(cached["generated_ids"], serde_json::json!(want));
    // Without the caches the decoder runs over every token each step: more attention rows.
    let calls = |v: &serde_json::Value| {
        v["ops"]["linear"]["kernels"]
            .as_object()
            .map_or(0, |k| k.values().filter_map(serde_json::Value::as_u64).sum::<u64>())
    };
    assert!(calls(&fresh) > calls(&cached), "the cache-free run recomputes the cross-attention keys");

    // lz diff against the reference from a dump.
    let tmp = tempfile::tempdir()?;
    run(&["--dump", tmp.path().to_str().unwrap_or_default()])?;
    let out = lz()?.arg("diff").arg(tmp.path()).arg(dir()).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("dec.layer.1.cross_attn_out"), "{text}");
    Ok(())
}

#[test]
fn bad_inputs_are_refused_naming_the_field() -> TestResult {
    let model = Seq2SeqModel::load(&dir(), None)?;
    let lz = LayerZero::detected()?;
    let err = |inputs: &[Vec<u32>], g: &Generation| -> TestResult<String> {
        Ok(seq2seq::generate(&model, &lz, inputs, g, true).err().ok_or("refused")?.to_string())
    };
    assert!(err(&[vec![0, 300]], &greedy(2, false))?.contains("outside the model's vocabulary"));
    assert!(err(&[vec![0; 65]], &greedy(2, false))?.contains("max_position_embeddings"));
    assert!(err(&[vec![]], &greedy(2, false))?.contains("empty"));
    let sampled = Generation { temperature: 0.7, ..greedy(2, false) };
    assert!(err(&[vec![0, 2]], &sampled)?.contains("greedy only"));
    // Options of decoders only, and a pinned tokenizer the folder lacks, are refused by lz.
    for (extra, want) in
        [(vec!["--kv", "paged"], "--kv paged"), (vec!["--tokenizer-hash", "0123456789abcdef"], "--tokenizer-hash")]
    {
        let out = layerzero_tests::lz()?
            .args(["generate", "--model"])
            .arg(dir())
            .args(["--prompt-ids", "0,17,2", "--max-new-tokens", "2"])
            .args(&extra)
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(want), "{extra:?}: {stderr}");
    }
    Ok(())
}
