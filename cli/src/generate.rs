//! `lz generate` and `lz workload`: a model served through LayerZero (decoders, speculative
//! decoding with a draft, encoder-decoders), and the workload it dispatches.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use super::args::{GenerateCmd, WorkloadCmd};
use super::{Outcome, print_json, soak};
use layerzero::error::{Error, ErrorKind, Result};
use layerzero::model::dtype::DType;
use layerzero::runtime::{LayerZero, Scope};
use layerzero::tensor::{HostTensor, Storage, io};
use layerzero_llm::{self as llm, Generation, KvKind, Model, Tokenizer};

pub(super) fn parse_dtype(d: Option<&str>) -> Result<Option<DType>> {
    match d {
        None => Ok(None),
        Some("f32") => Ok(Some(DType::F32)),
        Some("bf16") => Ok(Some(DType::BF16)),
        Some(other) => Err(Error::invalid(format!("--dtype {other:?} is not one of f32, bf16"))),
    }
}

pub(super) fn workload(a: WorkloadCmd) -> Result<Outcome> {
    let dtype = parse_dtype(a.dtype.as_deref())?;
    let lz = LayerZero::host()?;
    let w = llm::workload::for_folder(&lz, &a.model, a.tp, dtype, a.max_batch, a.max_seq, a.page_size)?;
    let json =
        serde_json::to_string_pretty(&w).map_err(|e| Error::invalid(format!("cannot write the workload: {e}")))?;
    match &a.out {
        Some(file) => layerzero::files::write(file, (json + "\n").as_bytes(), &[])?,
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
    let quant =
        a.weights.as_deref().map(|w| llm::WeightQuant::parse(w, a.group_size, a.activations.as_deref())).transpose()?;
    let residence = layerzero::knobs::WEIGHTS.value_in(&layerzero::knobs::process_env)?;
    let model = Model::load_with(&a.model, dtype, residence, quant)?;
    let (tokenizer, tokenizer_file) = tokenizer_of(&a)?;
    let prompts = prompts_of(&a, tokenizer.as_ref(), &tokenizer_file)?;
    let kv = match (a.kv.as_deref(), prompts.len()) {
        (None | Some("contiguous"), 1) => KvKind::Contiguous,
        (Some("contiguous"), n) => {
            return Err(Error::invalid(format!("--kv contiguous holds one sequence; {n} prompts need --kv paged")));
        }
        (None | Some("paged"), _) => KvKind::Paged { page_size: a.page_size },
        (Some(other), _) => return Err(Error::invalid(format!("--kv {other:?} is not one of contiguous, paged"))),
    };
    let lz = handle(&a)?;
    lz.set_dispatch_timing(a.profile);
    let g = generation(&a, kv);
    if let Some(dir) = &a.draft {
        if a.verify_every.is_some() {
            return Err(Error::invalid("--verify-every: give it without --draft (one model's layers)".to_owned()));
        }
        if a.kv.as_deref() == Some("paged") {
            return Err(Error::invalid("--kv paged: speculative decoding keeps contiguous caches".to_owned()));
        }
        let [prompt] = &prompts[..] else {
            return Err(Error::invalid(format!("--draft generates for one prompt; {} were given", prompts.len())));
        };
        return speculative(&a, dir, &model, tokenizer.as_ref(), &lz, prompt, &g);
    }
    // One prompt streams to a terminal as it is generated.
    let stream = !a.json && prompts.len() == 1 && std::io::stdout().is_terminal() && a.seconds.is_none();
    let mut print = printer(tokenizer.as_ref(), stream);
    let (out, soak) = soak::rounds(
        &a,
        |o: &llm::Generated| soak::ids_of(&o.sequences),
        || llm::generate::generate_batch(&model, &lz, &prompts, &g, |_, t| print(t)),
    )?;
    let texts = texts_of(tokenizer.as_ref(), &out.sequences)?;
    if let Some(dir) = &a.dump {
        write_dump(dir, &out)?;
    }
    let prompt_tokens: usize = out.sequences.iter().map(|s| s.prompt_ids.len()).sum();
    let decoded: usize = out.sequences.iter().map(|s| s.generated_ids.len().saturating_sub(1)).sum();
    let prefill_ms = out.prefill_ns as f64 / 1e6;
    let decode_ms = out.decode_ns as f64 / 1e6;
    let per_step = if out.decode_steps > 0 { decode_ms / out.decode_steps as f64 } else { 0.0 };
    let profile = if a.profile { Some(super::profile::report(&out, prompt_tokens)?) } else { None };
    let verify = verify_json(&a, &lz, &out);
    let diverged = out.checks.iter().any(|c| !c.diverged.is_empty());
    if a.json {
        let [prompt_ids, generated_ids, text] = sequences_json(&out.sequences, texts.as_deref());
        print_json(&soak::with_soak(
            serde_json::json!({
                "model": a.model.display().to_string(),
                "arch": model.config.arch.as_str(),
                "dtype": model.dtype,
                "weights": quant.map_or_else(|| model.dtype.to_string(), |q| q.to_string()),
                "kv": match kv { KvKind::Contiguous => "contiguous", KvKind::Paged { .. } => "paged" },
                "prompt_ids": prompt_ids,
                "generated_ids": generated_ids,
                "text": text,
                "tokenizer": tokenizer.as_ref().map(|t| serde_json::json!({"hash": t.hash(), "vocab": t.vocab_size()})),
                "timing": {
                    "prefill_ms": prefill_ms,
                    "prefill_tokens_per_s": if prefill_ms > 0.0 { prompt_tokens as f64 / prefill_ms * 1e3 } else { 0.0 },
                    "decode_ms_per_token": per_step,
                    "decode_tokens_per_s": if decode_ms > 0.0 { decoded as f64 / decode_ms * 1e3 } else { 0.0 },
                },
                "ops": ops_json(&out.stats),
                "counters": lz.counters(),
                "dump": a.dump.as_ref().map(|d| d.join("dump.safetensors").display().to_string()),
                "profile": profile,
                "verify": verify,
            }),
            soak.as_ref(),
        ));
    } else {
        if stream {
            println!();
        } else {
            print_sequences(&out.sequences, texts.as_deref());
        }
        eprintln!(
            "prefill {prompt_tokens} tokens in {prefill_ms:.2} ms; decode {decoded} tokens in {} steps at {per_step:.2} ms/step",
            out.decode_steps
        );
        print!("{}", soak.as_ref().map(soak::Rounds::render).unwrap_or_default());
        if let Some(p) = &profile {
            eprint!("{}", super::profile::render(p));
        }
        if let Some(v) = &verify {
            eprint!("{}", render_verify(v, &out));
        }
    }
    if diverged {
        return Ok(Outcome::CheckFailed);
    }
    Ok(soak::outcome(soak.as_ref()))
}

/// `lz generate` of an encoder-decoder: each prompt is an encoder input; the decoder
/// generates greedily from the decoder start token.
fn seq2seq(a: GenerateCmd, dtype: Option<DType>) -> Result<Outcome> {
    let model = llm::seq2seq::Seq2SeqModel::load(&a.model, dtype)?;
    if a.draft.is_some() {
        return Err(Error::invalid("--draft: speculative decoding runs decoder-only models".to_owned()));
    }
    if a.verify_every.is_some() {
        return Err(Error::invalid("--verify-every reports per decoder layer: it runs decoder-only models".to_owned()));
    }
    if let Some(w) = &a.weights {
        return Err(Error::invalid(format!("--weights {w}: quantized projections are served for decoder-only models")));
    }
    if let Some(kv) = &a.kv {
        return Err(Error::invalid(format!(
            "--kv {kv}: an encoder-decoder keeps a contiguous self-attention cache per input (or none, with --no-kv-cache)"
        )));
    }
    let (tokenizer, tokenizer_file) = tokenizer_of(&a)?;
    let inputs = prompts_of(&a, tokenizer.as_ref(), &tokenizer_file)?;
    let lz = handle(&a)?;
    let g = generation(&a, KvKind::Contiguous);
    let (out, soak) = soak::rounds(
        &a,
        |o: &llm::seq2seq::Seq2SeqGenerated| soak::ids_of(&o.sequences),
        || llm::seq2seq::generate(&model, &lz, &inputs, &g, !a.no_kv_cache),
    )?;
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
    let texts = texts_of(tokenizer.as_ref(), &out.sequences)?;
    if a.json {
        let [prompt_ids, generated_ids, text] = sequences_json(&out.sequences, texts.as_deref());
        let input_tokens = out.sequences.iter().map(|s| s.prompt_ids.len()).sum();
        print_json(&soak::with_soak(
            serde_json::json!({
                "model": a.model.display().to_string(),
                "arch": "bart",
                "dtype": model.dtype,
                "kv": if a.no_kv_cache { "none" } else { "contiguous" },
                "prompt_ids": prompt_ids,
                "generated_ids": generated_ids,
                "text": text,
                "tokenizer": tokenizer.as_ref().map(|t| serde_json::json!({"hash": t.hash(), "vocab": t.vocab_size()})),
                "timing": timing(out.encode_ns, input_tokens, out.decode_ns, out.decode_steps),
                "ops": ops_json(&out.stats),
                "counters": lz.counters(),
                "dump": a.dump.as_ref().map(|d| d.join("dump.safetensors").display().to_string()),
            }),
            soak.as_ref(),
        ));
    } else {
        print_sequences(&out.sequences, texts.as_deref());
        eprintln!(
            "encoded {} inputs in {:.2} ms; decoded {} steps in {:.2} ms",
            out.sequences.len(),
            out.encode_ns as f64 / 1e6,
            out.decode_steps,
            out.decode_ns as f64 / 1e6
        );
        print!("{}", soak.as_ref().map(soak::Rounds::render).unwrap_or_default());
    }
    Ok(soak::outcome(soak.as_ref()))
}

/// Prints each token as it is chosen when `on` (one prompt to a terminal): its text through
/// the tokenizer's streaming decoder, or its id.
fn printer(tokenizer: Option<&Tokenizer>, on: bool) -> impl FnMut(u32) + '_ {
    let mut text = tokenizer.map(|t| t.stream(true));
    move |t| {
        if on {
            match &mut text {
                Some(s) => print!("{}", s.step(t).unwrap_or_default()),
                None => print!("{t} "),
            }
            let _ = std::io::stdout().flush();
        }
    }
}

/// The model folder's `tokenizer.json`, when it has one, and its path; refused when
/// `--tokenizer-hash` pins another one (or one the folder lacks).
fn tokenizer_of(a: &GenerateCmd) -> Result<(Option<Tokenizer>, PathBuf)> {
    let file = a.model.join("tokenizer.json");
    let t = if file.exists() { Some(Tokenizer::load(&file)?) } else { None };
    if let Some(pinned) = &a.tokenizer_hash {
        match &t {
            Some(t) => t.expect(pinned, &file.display().to_string())?,
            None => {
                return Err(Error::invalid(format!(
                    "--tokenizer-hash pins a tokenizer, but {} does not exist",
                    file.display()
                )));
            }
        }
    }
    Ok((t, file))
}

/// The prompts `a` gives: ids, a text through the tokenizer, or a file of either.
fn prompts_of(a: &GenerateCmd, tokenizer: Option<&Tokenizer>, file: &Path) -> Result<Vec<Vec<u32>>> {
    let encode = |text: &str| -> Result<Vec<u32>> {
        match tokenizer {
            Some(t) => Ok(t.encode(text, true)?.ids),
            None => Err(Error::invalid(format!(
                "a text prompt needs {}; without a tokenizer give token ids",
                file.display()
            ))),
        }
    };
    match (&a.prompt_ids, &a.prompt, &a.prompts) {
        (Some(ids), _, _) => Ok(vec![ids.clone()]),
        (None, Some(text), _) => Ok(vec![encode(text)?]),
        (None, None, Some(prompts)) => read_prompts(prompts, &encode),
        (None, None, None) => Err(Error::invalid("give --prompt, --prompt-ids or --prompts".to_owned())),
    }
}

/// This machine's handle, serving `--table` when given, shadow-checking with
/// `--verify-every`.
fn handle(a: &GenerateCmd) -> Result<LayerZero> {
    let lz = LayerZero::host()?;
    let lz = match &a.table {
        Some(table) => lz.with_plan_file(table, super::knobs().plan_mode)?,
        None => lz,
    };
    if let Some(every) = a.verify_every {
        let check = layerzero::policy::ShadowCheck { every, rows: a.verify_rows };
        let policy = layerzero::policy::Policy { shadow_check: Some(check), ..(*lz.declared_policy()).clone() };
        lz.set_policy(policy)?;
    }
    Ok(lz)
}

/// `--verify-every`: the shadow checks' report (`verify` of the JSON), or `None` without it.
fn verify_json(a: &GenerateCmd, lz: &LayerZero, out: &llm::Generated) -> Option<serde_json::Value> {
    a.verify_every?;
    let s = lz.shadow_stats();
    Some(serde_json::json!({
        "every": s.every,
        "rows": s.rows,
        "checks": s.checks,
        "diverged": s.diverged,
        "skipped": s.skipped,
        "added_ms": s.checked_ns as f64 / 1e6,
        "added_us_per_check": s.added_us_per_check(),
        "stages": out.checks,
    }))
}

/// The shadow checks' report as text: one line per stage, the diverged checks named.
fn render_verify(v: &serde_json::Value, out: &llm::Generated) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "shadow checks: every {} calls of each kernel, {} rows: {} checked, {} diverged, {} skipped; {:.2} ms added ({:.1} us per check)",
        v["every"],
        v["rows"],
        v["checks"],
        v["diverged"],
        v["skipped"],
        v["added_ms"].as_f64().unwrap_or(0.0),
        v["added_us_per_check"].as_f64().unwrap_or(0.0)
    );
    let _ = writeln!(
        s,
        "{:<10} {:>6}  {:>10}  {:<12} {:>10}  DIVERGED",
        "STAGE", "CHECKS", "MIN_COSINE", "WORST_OP", "MAX_NMSE"
    );
    for c in &out.checks {
        let diverged = if c.diverged.is_empty() { "-".to_owned() } else { c.diverged.join("; ") };
        let _ = writeln!(
            s,
            "{:<10} {:>6}  {:>10.6}  {:<12} {:>10.3e}  {diverged}",
            c.stage, c.checks, c.min_cosine, c.worst_op, c.max_nmse
        );
    }
    s
}

/// The generation options `a` gives.
fn generation(a: &GenerateCmd, kv: KvKind) -> Generation {
    Generation {
        max_new_tokens: a.max_new_tokens,
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
        stop_at_eos: !a.ignore_eos,
        dump: a.dump.is_some(),
        kv,
    }
}

/// Per op, what ran: the `ops` object of a report.
pub(super) fn ops_json(stats: &BTreeMap<layerzero::model::op::Op, llm::OpStats>) -> serde_json::Value {
    stats.iter().map(|(op, s)| (op.as_str().to_owned(), serde_json::to_value(s).unwrap_or_default())).collect()
}

/// The generated text of each sequence, with a tokenizer.
fn texts_of(tokenizer: Option<&Tokenizer>, seqs: &[llm::Sequence]) -> Result<Option<Vec<String>>> {
    tokenizer.map(|t| seqs.iter().map(|s| t.decode(&s.generated_ids, true)).collect()).transpose()
}

/// `prompt_ids`, `generated_ids` and `text` of a report: flat for one sequence, a list per
/// sequence for several.
fn sequences_json(seqs: &[llm::Sequence], texts: Option<&[String]>) -> [serde_json::Value; 3] {
    let many = seqs.len() > 1;
    let list = |f: &dyn Fn(&llm::Sequence) -> &Vec<u32>| -> serde_json::Value {
        if many {
            serde_json::json!(seqs.iter().map(f).collect::<Vec<_>>())
        } else {
            serde_json::json!(seqs.first().map(f))
        }
    };
    let text = match texts {
        Some(t) if many => serde_json::json!(t),
        Some(t) => serde_json::json!(t.first()),
        None => serde_json::Value::Null,
    };
    [list(&|s| &s.prompt_ids), list(&|s| &s.generated_ids), text]
}

/// Each sequence's text, or its ids without a tokenizer, one line each.
fn print_sequences(seqs: &[llm::Sequence], texts: Option<&[String]>) {
    for (i, s) in seqs.iter().enumerate() {
        match texts.and_then(|t| t.get(i)) {
            Some(t) => println!("{t}"),
            None => {
                let ids: Vec<String> = s.generated_ids.iter().map(u32::to_string).collect();
                println!("{}", ids.join(" "));
            }
        }
    }
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
    // A model scope each (§6.17): neither model's plan or cached selections serve the other.
    let hash = tokenizer.map(Tokenizer::hash);
    let mut target_lz = lz.scoped(Scope::new(format!("target:{}", a.model.display()), hash)?)?;
    if let Some(table) = &a.table {
        target_lz = target_lz.with_plan_file(table, super::knobs().plan_mode)?;
    }
    let draft_lz = lz.scoped(Scope::new(format!("draft:{}", dir.display()), hash)?)?;
    let (target, draft_of) = ((model, &target_lz), (&draft, &draft_lz));
    // Short untimed runs of both paths first, so that neither timing pays for first
    // selections and caches the other already warmed.
    let warm = Generation { max_new_tokens: g.max_new_tokens.min(2), dump: false, ..g.clone() };
    llm::generate::generate(model, &target_lz, prompt, &warm, |_| {})?;
    llm::speculate_scoped(target, draft_of, prompt, &warm, a.draft_tokens, |_| {})?;
    let alone = llm::generate::generate(model, &target_lz, prompt, g, |_| {})?;
    let alone_ns = alone.prefill_ns + alone.decode_ns;
    let stream = !a.json && std::io::stdout().is_terminal();
    let out = llm::speculate_scoped(target, draft_of, prompt, g, a.draft_tokens, printer(tokenizer, stream))?;
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
                "draft_counters": draft_lz.counters(),
            },
            "ops": ops_json(&out.target_stats),
            "draft_ops": ops_json(&out.draft_stats),
            "counters": target_lz.counters(),
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

/// `--prompts FILE`: a JSON array of text (strings) and token ids (arrays of integers).
fn read_prompts(file: &Path, encode: &dyn Fn(&str) -> Result<Vec<u32>>) -> Result<Vec<Vec<u32>>> {
    let origin = file.display().to_string();
    let text = layerzero::files::read_to_string(file)?;
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
