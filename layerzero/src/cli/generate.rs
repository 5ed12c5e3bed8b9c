//! `lz generate` and `lz diff`: a model served through LayerZero, and its dumps compared
//! stage by stage with a reference.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use super::args::{ClassifyCmd, DiffCmd, GenerateCmd, WorkloadCmd};
use super::{Outcome, print_json};
use crate::error::{Error, ErrorKind, Result};
use crate::llm::{self, Generation, KvKind, Model, Tokenizer};
use crate::model::dtype::DType;
use crate::runtime::LayerZero;
use crate::tensor::{HostTensor, Storage, io};

fn parse_dtype(d: Option<&str>) -> Result<Option<DType>> {
    match d {
        None => Ok(None),
        Some("f32") => Ok(Some(DType::F32)),
        Some("bf16") => Ok(Some(DType::BF16)),
        Some(other) => Err(Error::invalid(format!("--dtype {other:?} is not one of f32, bf16"))),
    }
}

pub(super) fn workload(a: WorkloadCmd) -> Result<Outcome> {
    let config = llm::ModelConfig::load(&a.model)?;
    let dtype = parse_dtype(a.dtype.as_deref())?.or(config.dtype).unwrap_or(DType::F32);
    let serving = llm::workload::Serving {
        max_batch: a.max_batch,
        max_seq: a.max_seq.unwrap_or(config.max_positions),
        page_size: a.page_size,
    };
    let name = a.model.file_name().map_or_else(|| "model".to_owned(), |n| n.to_string_lossy().into_owned());
    let lz = LayerZero::host()?;
    let tokenizer_file = a.model.join("tokenizer.json");
    let tokenizer = if tokenizer_file.exists() { Some(Tokenizer::load(&tokenizer_file)?) } else { None };
    let w = llm::workload::workload(&lz, &name, &config, dtype, serving, tokenizer.as_ref().map(Tokenizer::hash))?;
    let json =
        serde_json::to_string_pretty(&w).map_err(|e| Error::invalid(format!("cannot write the workload: {e}")))?;
    match &a.out {
        Some(file) => crate::files::write(file, (json + "\n").as_bytes(), &[])?,
        None => println!("{json}"),
    }
    Ok(Outcome::Ok)
}

pub(super) fn generate(a: GenerateCmd) -> Result<Outcome> {
    let dtype = parse_dtype(a.dtype.as_deref())?;
    if !(a.temperature >= 0.0 && a.temperature.is_finite()) {
        return Err(Error::invalid(format!("--temperature {} must be a finite number >= 0", a.temperature)));
    }
    match llm::seq2seq::model_type(&a.model)?.as_str() {
        "bart" => return seq2seq(a, dtype),
        "vit" => {
            return Err(Error::invalid(format!(
                "{} is a ViT, an image model: classify images with `lz classify --model {0} --image FILE`",
                a.model.display()
            )));
        }
        _ => {}
    }
    if a.no_kv_cache {
        return Err(Error::invalid(
            "--no-kv-cache applies to encoder-decoder models; decoders are checked against a cache-free pass by `lz diff`"
                .to_owned(),
        ));
    }
    let model = Model::load(&a.model, dtype)?;
    let tokenizer_file = a.model.join("tokenizer.json");
    let tokenizer = if tokenizer_file.exists() { Some(Tokenizer::load(&tokenizer_file)?) } else { None };
    if let Some(pinned) = &a.tokenizer_hash {
        match &tokenizer {
            Some(t) => t.expect(pinned, &tokenizer_file.display().to_string())?,
            None => {
                return Err(Error::invalid(format!(
                    "--tokenizer-hash pins a tokenizer, but {} does not exist",
                    tokenizer_file.display()
                )));
            }
        }
    }
    let encode = |text: &str| -> Result<Vec<u32>> {
        match &tokenizer {
            Some(t) => Ok(t.encode(text, true)?.ids),
            None => Err(Error::invalid(format!(
                "a text prompt needs {}; without a tokenizer give token ids",
                tokenizer_file.display()
            ))),
        }
    };
    let prompts: Vec<Vec<u32>> = match (&a.prompt_ids, &a.prompt, &a.prompts) {
        (Some(ids), _, _) => vec![ids.clone()],
        (None, Some(text), _) => vec![encode(text)?],
        (None, None, Some(file)) => read_prompts(file, &encode)?,
        (None, None, None) => return Err(Error::invalid("give --prompt, --prompt-ids or --prompts".to_owned())),
    };
    let kv = match (a.kv.as_deref(), prompts.len()) {
        (None | Some("contiguous"), 1) => KvKind::Contiguous,
        (Some("contiguous"), n) => {
            return Err(Error::invalid(format!("--kv contiguous holds one sequence; {n} prompts need --kv paged")));
        }
        (None | Some("paged"), _) => KvKind::Paged { page_size: a.page_size },
        (Some(other), _) => return Err(Error::invalid(format!("--kv {other:?} is not one of contiguous, paged"))),
    };
    let mut lz = LayerZero::host()?;
    if let Some(table) = &a.table {
        lz = lz.with_plan_file(table, crate::knobs::plan_mode()?)?;
    }
    let g = Generation {
        max_new_tokens: a.max_new_tokens,
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
        stop_at_eos: !a.ignore_eos,
        dump: a.dump.is_some(),
        kv,
    };
    if let Some(dir) = &a.draft {
        let [prompt] = &prompts[..] else {
            return Err(Error::invalid(format!("--draft generates for one prompt; {} were given", prompts.len())));
        };
        return speculative(&a, dir, &model, tokenizer.as_ref(), &lz, prompt, &g);
    }
    // One prompt streams to a terminal as it is generated.
    let stream = !a.json && prompts.len() == 1 && std::io::stdout().is_terminal();
    let mut text_stream = tokenizer.as_ref().map(|t| t.stream(true));
    let out = llm::generate::generate_batch(&model, &lz, &prompts, &g, |_, t| {
        if stream {
            match &mut text_stream {
                Some(s) => print!("{}", s.step(t).unwrap_or_default()),
                None => print!("{t} "),
            }
            let _ = std::io::stdout().flush();
        }
    })?;
    let texts: Option<Vec<String>> = match &tokenizer {
        Some(t) => Some(out.sequences.iter().map(|s| t.decode(&s.generated_ids, true)).collect::<Result<_>>()?),
        None => None,
    };
    if let Some(dir) = &a.dump {
        write_dump(dir, &out)?;
    }
    let prompt_tokens: usize = out.sequences.iter().map(|s| s.prompt_ids.len()).sum();
    let decoded: usize = out.sequences.iter().map(|s| s.generated_ids.len().saturating_sub(1)).sum();
    let prefill_ms = out.prefill_ns as f64 / 1e6;
    let decode_ms = out.decode_ns as f64 / 1e6;
    let per_step = if out.decode_steps > 0 { decode_ms / out.decode_steps as f64 } else { 0.0 };
    if a.json {
        let ops: serde_json::Map<String, serde_json::Value> = out
            .stats
            .iter()
            .map(|(op, s)| (op.as_str().to_owned(), serde_json::to_value(s).unwrap_or_default()))
            .collect();
        // One prompt: flat lists; several: a list per prompt.
        let many = out.sequences.len() > 1;
        let list = |f: &dyn Fn(&llm::Sequence) -> &Vec<u32>| -> serde_json::Value {
            if many {
                serde_json::json!(out.sequences.iter().map(f).collect::<Vec<_>>())
            } else {
                serde_json::json!(out.sequences.first().map(f))
            }
        };
        let text = match &texts {
            Some(t) if many => serde_json::json!(t),
            Some(t) => serde_json::json!(t.first()),
            None => serde_json::Value::Null,
        };
        print_json(&serde_json::json!({
            "model": a.model.display().to_string(),
            "arch": model.config.arch.as_str(),
            "dtype": model.dtype,
            "kv": match kv { KvKind::Contiguous => "contiguous", KvKind::Paged { .. } => "paged" },
            "prompt_ids": list(&|s| &s.prompt_ids),
            "generated_ids": list(&|s| &s.generated_ids),
            "text": text,
            "tokenizer": tokenizer.as_ref().map(|t| serde_json::json!({"hash": t.hash(), "vocab": t.vocab_size()})),
            "timing": {
                "prefill_ms": prefill_ms,
                "prefill_tokens_per_s": if prefill_ms > 0.0 { prompt_tokens as f64 / prefill_ms * 1e3 } else { 0.0 },
                "decode_ms_per_token": per_step,
                "decode_tokens_per_s": if decode_ms > 0.0 { decoded as f64 / decode_ms * 1e3 } else { 0.0 },
            },
            "ops": ops,
            "counters": lz.counters(),
            "dump": a.dump.as_ref().map(|d| d.join("dump.safetensors").display().to_string()),
        }));
    } else {
        if stream {
            println!();
        } else {
            for (i, s) in out.sequences.iter().enumerate() {
                match &texts {
                    Some(t) => println!("{}", t[i]),
                    None => {
                        let ids: Vec<String> = s.generated_ids.iter().map(u32::to_string).collect();
                        println!("{}", ids.join(" "));
                    }
                }
            }
        }
        eprintln!(
            "prefill {prompt_tokens} tokens in {prefill_ms:.2} ms; decode {decoded} tokens in {} steps at {per_step:.2} ms/step",
            out.decode_steps
        );
    }
    Ok(Outcome::Ok)
}

/// `lz generate` of an encoder-decoder: each prompt is an encoder input; the decoder
/// generates greedily from the decoder start token.
fn seq2seq(a: GenerateCmd, dtype: Option<DType>) -> Result<Outcome> {
    let model = llm::seq2seq::Seq2SeqModel::load(&a.model, dtype)?;
    if a.draft.is_some() {
        return Err(Error::invalid("--draft: speculative decoding runs decoder-only models".to_owned()));
    }
    let tokenizer_file = a.model.join("tokenizer.json");
    let tokenizer = if tokenizer_file.exists() { Some(Tokenizer::load(&tokenizer_file)?) } else { None };
    let encode = |text: &str| -> Result<Vec<u32>> {
        match &tokenizer {
            Some(t) => Ok(t.encode(text, true)?.ids),
            None => Err(Error::invalid(format!(
                "a text prompt needs {}; without a tokenizer give token ids",
                tokenizer_file.display()
            ))),
        }
    };
    let inputs: Vec<Vec<u32>> = match (&a.prompt_ids, &a.prompt, &a.prompts) {
        (Some(ids), _, _) => vec![ids.clone()],
        (None, Some(text), _) => vec![encode(text)?],
        (None, None, Some(file)) => read_prompts(file, &encode)?,
        (None, None, None) => return Err(Error::invalid("give --prompt, --prompt-ids or --prompts".to_owned())),
    };
    let mut lz = LayerZero::host()?;
    if let Some(table) = &a.table {
        lz = lz.with_plan_file(table, crate::knobs::plan_mode()?)?;
    }
    let g = Generation {
        max_new_tokens: a.max_new_tokens,
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
        stop_at_eos: !a.ignore_eos,
        dump: a.dump.is_some(),
        kv: KvKind::Contiguous,
    };
    let out = llm::seq2seq::generate(&model, &lz, &inputs, &g, !a.no_kv_cache)?;
    if let Some(dir) = &a.dump {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot create {}: {e}", dir.display())).with_source(e))?;
        let mut tensors = out.dump.clone();
        if let Some(s) = out.sequences.first() {
            tensors.insert("input_ids".into(), ids_tensor(&s.prompt_ids)?);
            tensors.insert("generated_ids".into(), ids_tensor(&s.generated_ids)?);
        }
        io::write(&dir.join("dump.safetensors"), &tensors)?;
    }
    let texts: Option<Vec<String>> = match &tokenizer {
        Some(t) => Some(out.sequences.iter().map(|s| t.decode(&s.generated_ids, true)).collect::<Result<_>>()?),
        None => None,
    };
    if a.json {
        let ops: serde_json::Map<String, serde_json::Value> = out
            .stats
            .iter()
            .map(|(op, s)| (op.as_str().to_owned(), serde_json::to_value(s).unwrap_or_default()))
            .collect();
        let many = out.sequences.len() > 1;
        let list = |f: &dyn Fn(&llm::Sequence) -> &Vec<u32>| -> serde_json::Value {
            if many {
                serde_json::json!(out.sequences.iter().map(f).collect::<Vec<_>>())
            } else {
                serde_json::json!(out.sequences.first().map(f))
            }
        };
        let text = match &texts {
            Some(t) if many => serde_json::json!(t),
            Some(t) => serde_json::json!(t.first()),
            None => serde_json::Value::Null,
        };
        let input_tokens = out.sequences.iter().map(|s| s.prompt_ids.len()).sum();
        print_json(&serde_json::json!({
            "model": a.model.display().to_string(),
            "arch": "bart",
            "dtype": model.dtype,
            "kv": if a.no_kv_cache { "none" } else { "contiguous" },
            "prompt_ids": list(&|s| &s.prompt_ids),
            "generated_ids": list(&|s| &s.generated_ids),
            "text": text,
            "tokenizer": tokenizer.as_ref().map(|t| serde_json::json!({"hash": t.hash(), "vocab": t.vocab_size()})),
            "timing": timing(out.encode_ns, input_tokens, out.decode_ns, out.decode_steps),
            "ops": ops,
            "counters": lz.counters(),
            "dump": a.dump.as_ref().map(|d| d.join("dump.safetensors").display().to_string()),
        }));
    } else {
        for (i, s) in out.sequences.iter().enumerate() {
            match &texts {
                Some(t) => println!("{}", t[i]),
                None => {
                    let ids: Vec<String> = s.generated_ids.iter().map(u32::to_string).collect();
                    println!("{}", ids.join(" "));
                }
            }
        }
        eprintln!(
            "encoded {} inputs in {:.2} ms; decoded {} steps in {:.2} ms",
            out.sequences.len(),
            out.encode_ns as f64 / 1e6,
            out.decode_steps,
            out.decode_ns as f64 / 1e6
        );
    }
    Ok(Outcome::Ok)
}

/// The `timing` object of a report: prefill (or encoder) time and rate, and decode time per
/// token and rate.
fn timing(prefill_ns: u64, prefill_tokens: usize, decode_ns: u64, decoded: usize) -> serde_json::Value {
    let (p, d) = (prefill_ns as f64 / 1e6, decode_ns as f64 / 1e6);
    let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 / ms * 1e3 } else { 0.0 };
    serde_json::json!({
        "prefill_ms": p,
        "prefill_tokens_per_s": rate(prefill_tokens, p),
        "decode_ms_per_token": if decoded > 0 { d / decoded as f64 } else { 0.0 },
        "decode_tokens_per_s": rate(decoded, d),
    })
}

/// `lz generate --draft`: the target alone, then with the draft, both timed in this process.
fn speculative(
    a: &GenerateCmd,
    dir: &Path,
    model: &Model,
    tokenizer: Option<&Tokenizer>,
    lz: &LayerZero,
    prompt: &[u32],
    g: &Generation,
) -> Result<Outcome> {
    let draft = Model::load(dir, Some(model.dtype))?;
    let draft_tokenizer_file = dir.join("tokenizer.json");
    if let (Some(t), true) = (tokenizer, draft_tokenizer_file.exists()) {
        Tokenizer::load(&draft_tokenizer_file)?
            .expect(t.hash(), &draft_tokenizer_file.display().to_string())
            .map_err(|e| Error::invalid(format!("a draft must share the target's tokenizer: {}", e.message())))?;
    }
    llm::speculative::check_draft(model, &draft)?;
    let alone = llm::generate::generate(model, lz, prompt, g, |_| {})?;
    let alone_ns = alone.prefill_ns + alone.decode_ns;
    let stream = !a.json && std::io::stdout().is_terminal();
    let mut text_stream = tokenizer.map(|t| t.stream(true));
    let out = llm::speculate(model, &draft, lz, prompt, g, a.draft_tokens, |t| {
        if stream {
            match &mut text_stream {
                Some(s) => print!("{}", s.step(t).unwrap_or_default()),
                None => print!("{t} "),
            }
            let _ = std::io::stdout().flush();
        }
    })?;
    let text = match tokenizer {
        Some(t) => Some(t.decode(&out.generated_ids, true)?),
        None => None,
    };
    let ms = out.ns as f64 / 1e6;
    let alone_ms = alone_ns as f64 / 1e6;
    let speedup = if out.ns > 0 { alone_ns as f64 / out.ns as f64 } else { 0.0 };
    // Greedy: the target's tokens, exactly; sampling: other draws of the same distribution.
    let same = (g.temperature <= 0.0).then(|| out.generated_ids == alone.generated_ids());
    if a.json {
        let ops = |stats: &BTreeMap<crate::model::op::Op, llm::OpStats>| -> serde_json::Value {
            stats.iter().map(|(op, s)| (op.as_str().to_owned(), serde_json::to_value(s).unwrap_or_default())).collect()
        };
        print_json(&serde_json::json!({
            "model": a.model.display().to_string(),
            "arch": model.config.arch.as_str(),
            "dtype": model.dtype,
            "kv": "contiguous",
            "prompt_ids": prompt,
            "generated_ids": out.generated_ids,
            "text": text,
            "tokenizer": tokenizer.map(|t| serde_json::json!({"hash": t.hash(), "vocab": t.vocab_size()})),
            "timing": timing(
                out.prefill_ns,
                prompt.len().saturating_sub(1),
                out.ns.saturating_sub(out.prefill_ns),
                out.generated_ids.len(),
            ),
            "speculative": {
                "draft": dir.display().to_string(),
                "draft_arch": draft.config.arch.as_str(),
                "draft_tokens": a.draft_tokens,
                "rounds": out.rounds,
                "drafted": out.drafted,
                "accepted": out.accepted,
                "acceptance_rate": out.acceptance_rate(),
                "tokens_per_round": if out.rounds > 0 { out.generated_ids.len() as f64 / out.rounds as f64 } else { 0.0 },
                "ms": ms,
                "target_only_ms": alone_ms,
                "speedup": speedup,
                "target_only_ids": alone.generated_ids(),
                "matches_target_only": same,
            },
            "ops": ops(&out.target_stats),
            "draft_ops": ops(&out.draft_stats),
            "counters": lz.counters(),
            "dump": null,
        }));
    } else {
        if stream {
            println!();
        } else {
            match &text {
                Some(t) => println!("{t}"),
                None => {
                    let ids: Vec<String> = out.generated_ids.iter().map(u32::to_string).collect();
                    println!("{}", ids.join(" "));
                }
            }
        }
        eprintln!(
            "speculative: {} tokens in {} rounds, {} of {} drafts accepted ({:.0}%); {ms:.2} ms against {alone_ms:.2} ms for the target alone ({speedup:.2}x)",
            out.generated_ids.len(),
            out.rounds,
            out.accepted,
            out.drafted,
            out.acceptance_rate() * 100.0
        );
    }
    Ok(Outcome::Ok)
}

/// `lz classify`: an image through a ViT.
pub(super) fn classify(a: ClassifyCmd) -> Result<Outcome> {
    let dtype = parse_dtype(a.dtype.as_deref())?;
    let model = llm::vit::VitModel::load(&a.model, dtype)?;
    let pre = llm::vit::Preprocess::load(&a.model, model.config.channels)?;
    let image = llm::vit::read_image(&a.image, &model, &pre)?;
    let lz = LayerZero::host()?;
    let out = llm::vit::classify(&model, &lz, &image, a.dump.is_some())?;
    if let Some(dir) = &a.dump {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot create {}: {e}", dir.display())).with_source(e))?;
        io::write(&dir.join("dump.safetensors"), &out.dump)?;
    }
    let logits = out.logits.clone().ok_or_else(|| {
        Error::invalid(format!(
            "{}: the model has no classifier (a bare ViTModel); nothing to classify",
            a.model.display()
        ))
    })?;
    // Softmax in f64 for the printed probabilities.
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = logits.iter().map(|&l| f64::from(l - m).exp()).collect();
    let z: f64 = e.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&i, &j| logits[j].total_cmp(&logits[i]).then(i.cmp(&j)));
    let label = |i: usize| model.config.labels.get(i).cloned().unwrap_or_else(|| format!("{i}"));
    let top: Vec<serde_json::Value> = order
        .iter()
        .take(a.top.max(1))
        .map(|&i| serde_json::json!({"index": i, "label": label(i), "logit": logits[i], "probability": e[i] / z}))
        .collect();
    let layout = image.layout().map_or("NCHW", |l| l.as_str());
    if a.json {
        let ops: serde_json::Map<String, serde_json::Value> = out
            .stats
            .iter()
            .map(|(op, s)| (op.as_str().to_owned(), serde_json::to_value(s).unwrap_or_default()))
            .collect();
        print_json(&serde_json::json!({
            "model": a.model.display().to_string(),
            "arch": "vit",
            "dtype": model.dtype,
            "image": a.image.display().to_string(),
            "image_layout": layout,
            "patch_embed": out.patch_embed.as_ref().map(|(kernel, transforms)| serde_json::json!({
                "kernel": kernel,
                "transforms": transforms,
            })),
            "top": top,
            "logits": logits,
            "timing": {"ms": out.ns as f64 / 1e6},
            "ops": ops,
            "counters": lz.counters(),
            "dump": a.dump.as_ref().map(|d| d.join("dump.safetensors").display().to_string()),
        }));
    } else {
        for t in &top {
            println!("{:>8.4}  {}", t["probability"].as_f64().unwrap_or(0.0), t["label"].as_str().unwrap_or_default());
        }
        let how = match &out.patch_embed {
            Some((kernel, t)) if !t.is_empty() => {
                let moved: u64 = t.iter().map(|t| t.bytes).sum();
                format!("; patch_embed ran {kernel} after relaying out the image ({moved} bytes moved)")
            }
            Some((kernel, _)) => format!("; patch_embed ran {kernel} on the image as given"),
            None => String::new(),
        };
        eprintln!("classified a {layout} image in {:.2} ms{how}", out.ns as f64 / 1e6);
    }
    Ok(Outcome::Ok)
}

/// `--prompts FILE`: a JSON array of text (strings) and token ids (arrays of integers).
fn read_prompts(file: &Path, encode: &dyn Fn(&str) -> Result<Vec<u32>>) -> Result<Vec<Vec<u32>>> {
    let origin = file.display().to_string();
    let text = crate::files::read_to_string(file)?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
    let items = v.as_array().ok_or_else(|| Error::invalid(format!("{origin}: expected a JSON array of prompts")))?;
    if items.is_empty() {
        return Err(Error::invalid(format!("{origin}: the array holds no prompt")));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            serde_json::Value::String(t) => {
                encode(t).map_err(|e| Error::invalid(format!("{origin}: item {i}: {}", e.message())))
            }
            serde_json::Value::Array(ids) => ids
                .iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| Error::invalid(format!("{origin}: item {i} holds {x}, not a token id")))
                })
                .collect(),
            other => Err(Error::invalid(format!("{origin}: item {i} is {other}; expected text or an array of ids"))),
        })
        .collect()
}

fn ids_tensor(ids: &[u32]) -> Result<HostTensor> {
    HostTensor::new(Storage::I64(ids.iter().map(|&i| i64::from(i)).collect()), &[ids.len()])
}

fn write_dump(dir: &Path, out: &llm::Generated) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::new(ErrorKind::Io, format!("cannot create {}: {e}", dir.display())).with_source(e))?;
    let mut tensors: BTreeMap<String, HostTensor> = out.dump.clone();
    tensors.insert("prompt_ids".into(), ids_tensor(out.prompt_ids())?);
    tensors.insert("generated_ids".into(), ids_tensor(out.generated_ids())?);
    io::write(&dir.join("dump.safetensors"), &tensors)
}

/// A dump file, or a folder holding `dump.safetensors` (or `reference.safetensors`).
fn dump_file(p: &Path) -> PathBuf {
    if p.is_dir() {
        let ours = p.join("dump.safetensors");
        if ours.exists() { ours } else { p.join("reference.safetensors") }
    } else {
        p.to_path_buf()
    }
}

pub(super) fn diff(a: DiffCmd) -> Result<Outcome> {
    if !(a.threshold > 0.0 && a.threshold.is_finite()) {
        return Err(Error::invalid(format!("--threshold {} must be a positive number", a.threshold)));
    }
    let ours = io::read(&dump_file(&a.ours))?;
    let reference = io::read(&dump_file(&a.reference))?;
    let report = llm::diff::diff(&ours, &reference, a.threshold)?;
    if a.json {
        print_json(&serde_json::json!({
            "ok": report.ok(),
            "threshold": report.threshold,
            "first_divergence": report.first_divergence,
            "token_mismatches": report.token_mismatches,
            "stages": report.stages,
        }));
    } else {
        println!("{:<30} {:>10} {:>12} {:>12}", "stage", "cosine", "l2_rel", "max_abs");
        for s in &report.stages {
            let mark = if s.ok { "" } else { "  <-- over the threshold" };
            println!("{:<30} {:>10.6} {:>12.3e} {:>12.3e}{mark}", s.name, s.cosine, s.l2_rel, s.max_abs);
        }
        match &report.first_divergence {
            Some(name) => println!("first divergence: {name} (l2_rel > {:.1e})", report.threshold),
            None => println!("every stage within l2_rel {:.1e}", report.threshold),
        }
        for (i, o, r) in &report.token_mismatches {
            println!("token {i}: ours {o}, reference {r}");
        }
    }
    Ok(if report.ok() { Outcome::Ok } else { Outcome::CheckFailed })
}
