//! Tiny Hugging Face models run through LayerZero and held against HF transformers layer
//! by layer (the parity pyramid's levels 2-4): every stage within tolerance, the same greedy
//! tokens, and bad model folders refused with the file, tensor or field named.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use layerzero::LayerZero;
use layerzero::backend::cpu::packed_weight_stats;
use layerzero::model::op::Op;
use layerzero::schema::{SchemaKind, violations};
use layerzero::tensor::{HostTensor, io};
use layerzero_llm::{self as llm, Generation, Model};
use layerzero_tests::{TestResult, lz, repo_root};

fn models() -> PathBuf {
    repo_root().join("tests/models")
}

fn ids(t: &HostTensor) -> Vec<u32> {
    t.to_f64_vec().iter().map(|&x| x as u32).collect()
}

/// Runs the reference's prompt for as many tokens as the reference generated, with a dump.
fn run(model: &Model, reference: &BTreeMap<String, HostTensor>) -> TestResult<llm::Generated> {
    let lz = LayerZero::detected()?;
    let prompt = ids(&reference["prompt_ids"]);
    let n = reference["generated_ids"].numel();
    let g = Generation { max_new_tokens: n, stop_at_eos: false, dump: true, ..Generation::default() };
    Ok(llm::generate::generate(model, &lz, &prompt, &g, |_| {}).map_err(|e| format!("{}: {e}", model.dir.display()))?)
}

fn reference(dir: &Path, file: &str) -> TestResult<BTreeMap<String, HostTensor>> {
    Ok(io::read(&dir.join(file))?)
}

#[test]
fn every_f32_model_matches_hf_transformers_stage_by_stage_and_token_by_token() -> TestResult {
    let names = [
        "llama-gqa",
        "llama-tied-llama3",
        "llama-deep-linear",
        "llama-yarn",
        "llama-dynamic",
        "qwen2",
        "qwen3",
        "mistral-swa",
        "mixtral",
        "qwen2-moe",
    ];
    let mut failures = Vec::new();
    for name in names {
        let dir = models().join(name);
        let model = Model::load(&dir, None).map_err(|e| format!("{name}: {e}"))?;
        let r = reference(&dir, "reference.safetensors")?;
        let out = run(&model, &r)?;
        let report = llm::diff::diff(&out.dump, &r, 1e-4).map_err(|e| format!("{name}: {e}"))?;
        let layers = model.config.layers;
        assert!(report.stages.len() >= layers * 9 + layers + 1 + 32, "{name}: every stage is compared");
        if let Some(stage) = &report.first_divergence {
            failures.push(format!("{name}: first divergence at {stage}"));
        }
        // A mixture of experts is routed and run by its own ops, its router compared too.
        if model.config.moe.is_some() {
            for op in [Op::MoeRoute, Op::MoeExperts] {
                if !out.stats.contains_key(&op) {
                    failures.push(format!("{name}: no {op} was dispatched"));
                }
            }
            if !report.stages.iter().any(|s| s.name == "layer.0.router_logits") {
                failures.push(format!("{name}: the router logits were not compared"));
            }
        }
        let worst_logit =
            report.stages.iter().filter(|s| s.name.starts_with("logits.")).map(|s| s.max_abs).fold(0.0, f64::max);
        if worst_logit > 1e-4 {
            failures.push(format!("{name}: logits differ by {worst_logit:.2e} max-abs"));
        }
        if out.generated_ids() != ids(&r["generated_ids"]) {
            failures.push(format!(
                "{name}: greedy tokens {:?} vs HF {:?}",
                out.generated_ids(),
                ids(&r["generated_ids"])
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    Ok(())
}

#[test]
fn weights_are_served_from_the_mapped_files_or_copied_once_into_resident_memory() -> TestResult {
    let dir = models().join("llama-gqa-bf16");
    let mapped = Model::load_as(&dir, None, llm::Residence::Mapped)?;
    let w = &mapped.weights;
    let q_of = |m: &Model| m.weights.layers[0].q.dense().cloned().ok_or("q was quantized");
    let (q, o) = (q_of(&mapped)?, w.layers[0].o.dense().ok_or("o was quantized")?);
    let every = [&w.embed, &w.norm, &w.lm_head, &q, o, &w.layers[0].attn_norm];
    assert!(every.iter().all(|t| t.storage().is_mapped()), "mapped: bf16 weights served as bf16 are not copied");
    let resident = Model::load_as(&dir, None, llm::Residence::Resident)?;
    assert!(!q_of(&resident)?.storage().is_mapped(), "resident: copied out of the map");
    assert_eq!(q_of(&resident)?.to_f32_vec(), q.to_f32_vec());
    let cast = Model::load_as(&dir, Some(layerzero::DType::F32), llm::Residence::Mapped)?;
    assert!(!q_of(&cast)?.storage().is_mapped(), "weights cast to f32 are owned copies");
    assert_eq!(q_of(&cast)?.to_f32_vec(), q.to_f32_vec(), "bf16 widens exactly");
    // Both serve the same tokens.
    let prompt: Vec<u32> = (1..=6).collect();
    let g = Generation { max_new_tokens: 4, stop_at_eos: false, ..Generation::default() };
    let lz = LayerZero::detected()?;
    let run = |m: &Model| llm::generate::generate(m, &lz, &prompt, &g, |_| {}).map(|o| o.generated_ids().to_vec());
    assert_eq!(run(&mapped)?, run(&resident)?);
    Ok(())
}

#[test]
fn a_profiled_generation_says_where_each_phase_and_op_spent_its_time() -> TestResult {
    let home = tempfile::tempdir()?;
    let out = lz()?
        .env("LAYERZERO_HOME", home.path())
        .args(["generate", "--model"])
        .arg(models().join("llama-gqa"))
        .args(["--prompt-ids", "1,2,3,4,5", "--max-new-tokens", "4", "--ignore-eos", "--profile", "--json"])
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let bad = violations(SchemaKind::GenerateReport, &v)?;
    assert!(bad.is_empty(), "{bad:?}");
    let p = &v["profile"];
    assert!(p["copy_gbps"].as_f64().is_some_and(|g| g > 0.0), "the machine was measured: {p}");
    let phases = p["phases"].as_array().ok_or("no phases")?;
    assert_eq!(phases.iter().map(|ph| ph["phase"].as_str()).collect::<Vec<_>>(), [Some("prefill"), Some("decode")]);
    let decode = &phases[1];
    assert_eq!(decode["steps"], 3, "four tokens: the first chosen by the prefill, three decode steps");
    let ops = decode["ops"].as_array().ok_or("no ops")?;
    let linear = ops.iter().find(|o| o["op"] == "linear").ok_or("no linear in the decode")?;
    let f = |o: &serde_json::Value, k: &str| o[k].as_f64().unwrap_or(-1.0);
    // Selection and the kernels are each timed, inside the dispatch's own wall time.
    for o in ops {
        let (select, run, all) = (f(o, "select_us_per_step"), f(o, "run_us_per_step"), f(o, "us_per_step"));
        assert!(select > 0.0 && run > 0.0, "{o}");
        assert!(select + run <= all * (1.0 + 1e-9), "{o}");
    }
    assert!(f(linear, "mb_per_step") > 0.0 && f(linear, "gb_per_s") > 0.0, "{linear}");
    // A decode step projects q, k and v in one pass (the stacked weight) and o: two linears
    // per layer, and the head.
    let layers = serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(
        models().join("llama-gqa/config.json"),
    )?)?["num_hidden_layers"]
        .as_f64()
        .ok_or("no layer count")?;
    assert_eq!(f(linear, "calls_per_step"), 2.0 * layers + 1.0, "{linear}");
    assert!(f(decode, "dispatches_per_step") >= f(linear, "calls_per_step"));
    // The same generation without --profile times nothing.
    let plain = lz()?
        .env("LAYERZERO_HOME", home.path())
        .args(["generate", "--model"])
        .arg(models().join("llama-gqa"))
        .args(["--prompt-ids", "1,2,3,4,5", "--max-new-tokens", "4", "--ignore-eos", "--json"])
        .output()?;
    let plain: serde_json::Value = serde_json::from_slice(&plain.stdout)?;
    assert!(plain["profile"].is_null() && plain["ops"]["linear"].get("run_ns").is_none());
    assert_eq!(plain["generated_ids"], v["generated_ids"]);
    Ok(())
}

#[test]
fn a_bf16_model_is_packed_at_load_and_its_prefill_reuses_the_packs() -> TestResult {
    let model = Model::load(&models().join("llama-gqa-bf16"), None)?;
    let lz = LayerZero::detected()?;
    let before = packed_weight_stats();
    let mut session = llm::forward::Session::with_cache(&model, &lz, &[32], llm::KvKind::Contiguous)?;
    let loaded = packed_weight_stats();
    if loaded.packs == before.packs {
        // This CPU's bf16 prefill takes no packed layout (no AVX512_BF16, or AMX first).
        return Ok(());
    }
    // Other tests pack their own weights meanwhile, hence the lower bounds. Per layer at
    // least the MLP's three weights (q, k, v, o and the LM head too where AMX does not take
    // the linear's prefill first).
    let per_layer = 3 * model.config.layers as u64;
    assert!(loaded.packs >= before.packs + per_layer, "every layer's MLP weights: {before:?} -> {loaded:?}");
    let prompt: Vec<u32> = (1..=12).collect();
    session.forward(&prompt, false)?;
    let after = packed_weight_stats();
    assert!(after.hits >= loaded.hits + per_layer, "a 12-row prefill reuses every layer's packs: {after:?}");
    Ok(())
}

#[test]
fn the_bf16_model_stays_within_bf16_tolerance_of_the_float64_truth_at_every_layer() -> TestResult {
    let dir = models().join("llama-gqa-bf16");
    let model = Model::load(&dir, None)?;
    assert_eq!(model.dtype, layerzero::DType::BF16, "computes in the weights' dtype");
    // The same bf16 weights run by HF transformers in float64.
    let truth = reference(&dir, "reference_f64.safetensors")?;
    let out = run(&model, &truth)?;
    let expected = ids(&truth["generated_ids"]);
    // Logits after a token that differs answer another question: compare up to it, and
    // only accept a different pick where the reference's top two were within bf16 noise.
    let same = out.generated_ids().iter().zip(&expected).take_while(|(a, b)| a == b).count();
    if same < expected.len() {
        let margin = truth["greedy_margin"].to_f64_vec()[same];
        assert!(margin < 0.05, "token {same} differs though the reference's margin is {margin}");
    }
    let keep: BTreeMap<String, HostTensor> = truth
        .iter()
        .filter(|(n, _)| n.strip_prefix("logits.").and_then(|k| k.parse::<usize>().ok()).is_none_or(|k| k <= same))
        .map(|(n, t)| (n.clone(), t.clone()))
        .collect();
    let report = llm::diff::diff(&out.dump, &keep, 1e-2)?;
    assert_eq!(report.first_divergence, None, "{:#?}", report.stages.iter().filter(|s| !s.ok).collect::<Vec<_>>());
    Ok(())
}

/// `lz generate --json --dump OUT` of the reference's prompt and length: the report, checked
/// against its schema.
fn generate_with_dump(dir: &Path, r: &BTreeMap<String, HostTensor>, out: &Path) -> TestResult<serde_json::Value> {
    let prompt: Vec<String> = ids(&r["prompt_ids"]).iter().map(u32::to_string).collect();
    let n = r["generated_ids"].numel().to_string();
    let run = lz()?
        .args(["generate", "--model"])
        .arg(dir)
        .args(["--prompt-ids", &prompt.join(","), "--max-new-tokens", &n, "--ignore-eos", "--json", "--dump"])
        .arg(out)
        .output()?;
    assert!(run.status.success(), "{}: {}", dir.display(), String::from_utf8_lossy(&run.stderr));
    let json: serde_json::Value = serde_json::from_slice(&run.stdout)?;
    let bad = violations(SchemaKind::GenerateReport, &json)?;
    assert!(bad.is_empty(), "{}: {bad:?}", dir.display());
    Ok(json)
}

#[test]
fn lz_generate_and_lz_diff_agree_with_the_reference_from_the_command_line() -> TestResult {
    let dir = models().join("qwen3");
    let out = tempfile::tempdir()?;
    let r = reference(&dir, "reference.safetensors")?;
    let json = generate_with_dump(&dir, &r, out.path())?;
    let generated: Vec<u32> = json["generated_ids"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32).collect())
        .unwrap_or_default();
    assert_eq!(generated, ids(&r["generated_ids"]));
    for op in ["embedding", "rms_norm", "linear", "rope", "attention", "mlp", "sample"] {
        let kernels = &json["ops"][op]["kernels"];
        assert!(kernels.as_object().is_some_and(|k| !k.is_empty()), "{op} ran: {}", json["ops"]);
    }
    let diff = lz()?
        .args(["diff"])
        .arg(out.path())
        .arg(dir.join("reference.safetensors"))
        .args(["--threshold", "1e-4", "--json"])
        .output()?;
    let report: serde_json::Value = serde_json::from_slice(&diff.stdout)?;
    assert_eq!(diff.status.code(), Some(0), "{report}");
    let bad = violations(SchemaKind::DiffReport, &report)?;
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(report["first_divergence"], serde_json::Value::Null);
    // A threshold no float computation meets names the very first stage that moves.
    let strict = lz()?
        .args(["diff"])
        .arg(out.path())
        .arg(dir.join("reference.safetensors"))
        .args(["--threshold", "1e-12", "--json"])
        .output()?;
    assert_eq!(strict.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&strict.stdout)?;
    assert!(report["first_divergence"].as_str().is_some_and(|s| s.starts_with("layer.0.")), "{report}");
    Ok(())
}

/// A copy of a model folder to break.
fn copy_of(name: &str) -> TestResult<tempfile::TempDir> {
    let tmp = tempfile::tempdir()?;
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(models().join(name).join(f), tmp.path().join(f))?;
    }
    Ok(tmp)
}

fn refused(dir: &Path, prompt_ids: &str) -> TestResult<String> {
    let out = lz()?
        .args(["generate", "--model"])
        .arg(dir)
        .args(["--prompt-ids", prompt_ids, "--max-new-tokens", "2"])
        .output()?;
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.starts_with("lz: error: ") && !err.contains("panicked"), "{err}");
    Ok(err)
}

#[test]
fn bad_model_folders_and_prompts_are_refused_naming_the_file_tensor_or_field() -> TestResult {
    // A truncated shard.
    let t = copy_of("llama-gqa")?;
    let st = t.path().join("model.safetensors");
    let bytes = std::fs::read(&st)?;
    std::fs::write(&st, &bytes[..bytes.len() / 2])?;
    assert!(refused(t.path(), "1,2,3")?.contains("model.safetensors"));
    // A missing shard.
    std::fs::remove_file(&st)?;
    assert!(refused(t.path(), "1,2,3")?.contains("model.safetensors"));
    // A config that contradicts its weights.
    let t = copy_of("llama-gqa")?;
    let cfg = t.path().join("config.json");
    let text = std::fs::read_to_string(&cfg)?;
    std::fs::write(&cfg, text.replace("\"intermediate_size\": 128", "\"intermediate_size\": 96"))?;
    let err = refused(t.path(), "1,2,3")?;
    assert!(err.contains("gate_proj.weight") && err.contains("[96, 64]"), "{err}");
    // An unsupported activation, by field and value.
    std::fs::write(&cfg, text.replace("\"silu\"", "\"gelu_new\""))?;
    assert!(refused(t.path(), "1,2,3")?.contains("field `hidden_act` is \"gelu_new\""));
    // A tokenizer that does not parse, when a text prompt needs it.
    let t = copy_of("llama-gqa")?;
    std::fs::write(t.path().join("tokenizer.json"), "{\"model\": 7}")?;
    let out = lz()?
        .args(["generate", "--model"])
        .arg(t.path())
        .args(["--prompt", "the kernel", "--max-new-tokens", "2"])
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tokenizer.json"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Ids outside the vocabulary, and a prompt longer than the context.
    let dir = models().join("llama-gqa");
    assert!(refused(&dir, "1,9999")?.contains("outside the model's vocabulary"));
    let long: Vec<String> = (0..300).map(|i| (i % 200).to_string()).collect();
    assert!(refused(&dir, &long.join(","))?.contains("max_position_embeddings"));
    Ok(())
}

#[test]
fn the_tokenizer_encodes_as_hf_does_and_streams_what_it_decodes() -> TestResult {
    let dir = models().join("llama-gqa");
    let tk = llm::Tokenizer::load(&dir.join("tokenizer.json"))?;
    let r = reference(&dir, "reference_text.safetensors")?;
    let enc = tk.encode("the kernel selector picks the fastest kernel", true)?;
    assert_eq!(enc.ids, ids(&r["prompt_ids"]), "ids as HF's tokenizer made them, BOS included");
    assert_eq!(enc.offsets.len(), enc.ids.len());
    // The text prompt runs end to end and gives HF's tokens.
    let model = Model::load(&dir, None)?;
    let out = run(&model, &r)?;
    assert_eq!(out.generated_ids(), ids(&r["generated_ids"]));
    // Streaming yields, piece by piece, exactly the full decode.
    let mut stream = tk.stream(true);
    let streamed: String = out.generated_ids().iter().map(|&t| stream.step(t)).collect::<Result<_, _>>()?;
    assert_eq!(streamed, tk.decode(out.generated_ids(), true)?);
    // The identity hash moves with anything that changes how text becomes ids.
    let text = std::fs::read_to_string(dir.join("tokenizer.json"))?;
    let same = llm::Tokenizer::parse(&text, "t.json")?;
    assert_eq!(same.hash(), tk.hash());
    let other = text.replacen("\"<s>\"", "\"<bos>\"", 1);
    let other = llm::Tokenizer::parse(&other, "t.json")?;
    assert_ne!(other.hash(), tk.hash());
    let broken = llm::Tokenizer::parse("{\"model\": 7}", "bad/tokenizer.json").err().ok_or("parses")?;
    assert!(broken.to_string().starts_with("bad/tokenizer.json: "), "{broken}");
    Ok(())
}

fn greedy(max_new_tokens: usize, kv: llm::KvKind) -> Generation {
    Generation { max_new_tokens, stop_at_eos: false, kv, ..Generation::default() }
}

#[test]
fn a_paged_cache_and_a_batch_give_each_prompt_what_it_gets_alone() -> TestResult {
    let lz = LayerZero::detected()?;
    let paged = llm::KvKind::Paged { page_size: 3 };
    let prompts: Vec<Vec<u32>> =
        vec![vec![1, 17, 42, 99, 3, 250, 7, 128, 64, 5], vec![9, 8], vec![5, 6, 7, 8, 9, 10, 11]];
    for name in ["llama-gqa", "qwen3", "mistral-swa", "llama-dynamic"] {
        let model = Model::load(&models().join(name), None)?;
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| -> TestResult<_> {
                let out = llm::generate::generate(&model, &lz, p, &greedy(12, llm::KvKind::Contiguous), |_| {});
                Ok(out.map_err(|e| format!("{name}: {e}"))?.generated_ids().to_vec())
            })
            .collect::<TestResult<_>>()?;
        for p in 0..prompts.len() {
            let out = llm::generate::generate(&model, &lz, &prompts[p], &greedy(12, paged), |_| {});
            assert_eq!(out?.generated_ids(), alone[p], "{name}: paged, prompt {p}");
        }
        let batch = llm::generate::generate_batch(&model, &lz, &prompts, &greedy(12, paged), |_, _| {})
            .map_err(|e| format!("{name}: {e}"))?;
        for (p, s) in batch.sequences.iter().enumerate() {
            assert_eq!(s.generated_ids, alone[p], "{name}: batched, prompt {p}");
        }
        assert_eq!(batch.decode_steps, 11, "every decode step serves the whole batch");
    }
    Ok(())
}

#[test]
fn sampling_is_reproducible_and_independent_of_the_batch() -> TestResult {
    let lz = LayerZero::detected()?;
    let model = Model::load(&models().join("llama-gqa"), None)?;
    let g = |seed| Generation {
        max_new_tokens: 16,
        temperature: 1.0,
        top_k: Some(50),
        seed,
        stop_at_eos: false,
        kv: llm::KvKind::Paged { page_size: 4 },
        ..Generation::default()
    };
    let prompts = vec![vec![1, 2, 3, 4], vec![1, 2, 3, 4]];
    let both = llm::generate::generate_batch(&model, &lz, &prompts, &g(7), |_, _| {})?;
    let again = llm::generate::generate_batch(&model, &lz, &prompts, &g(7), |_, _| {})?;
    assert_eq!(both.sequences, again.sequences, "the same seed gives the same tokens");
    assert_ne!(both.sequences[0].generated_ids, both.sequences[1].generated_ids, "each sequence has its own stream");
    let other = llm::generate::generate_batch(&model, &lz, &prompts, &g(8), |_, _| {})?;
    assert_ne!(both.sequences, other.sequences, "another seed, other tokens");
    Ok(())
}

#[test]
fn several_prompts_from_a_file_generate_together_over_a_paged_cache() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let file = tmp.path().join("prompts.json");
    std::fs::write(&file, r#"["the kernel selector", [1, 17, 42], "picks the fastest kernel"]"#)?;
    let out = lz()?
        .args(["generate", "--model"])
        .arg(models().join("llama-gqa"))
        .arg("--prompts")
        .arg(&file)
        .args(["--max-new-tokens", "5", "--ignore-eos", "--page-size", "4", "--json"])
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert!(violations(SchemaKind::GenerateReport, &json)?.is_empty(), "{json}");
    assert_eq!(json["kv"], "paged");
    let generated = json["generated_ids"].as_array().ok_or_else(|| format!("no generated_ids in {json}"))?;
    assert_eq!(generated.len(), 3, "a list per prompt");
    assert!(generated.iter().all(|g| g.as_array().is_some_and(|a| a.len() == 5)));
    assert_eq!(json["prompt_ids"][1], serde_json::json!([1, 17, 42]));
    assert_eq!(json["text"].as_array().map(Vec::len), Some(3));
    // The middle prompt, alone, gets the same tokens.
    let alone = lz()?
        .args(["generate", "--model"])
        .arg(models().join("llama-gqa"))
        .args(["--prompt-ids", "1,17,42", "--max-new-tokens", "5", "--ignore-eos", "--json"])
        .output()?;
    let one: serde_json::Value = serde_json::from_slice(&alone.stdout)?;
    assert_eq!(one["kv"], "contiguous");
    assert_eq!(one["generated_ids"], generated[1]);
    Ok(())
}

#[test]
fn a_model_workload_solved_into_a_table_serves_generation_from_plan_hits() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let (w, t) = (tmp.path().join("w.json"), tmp.path().join("t.json"));
    let model = models().join("mistral-swa");
    let ok = |args: &[&std::ffi::OsStr]| -> TestResult<Vec<u8>> {
        let out = lz()?.args(args).env("LAYERZERO_HOME", tmp.path()).output()?;
        assert!(out.status.success(), "{:?}: {}", args, String::from_utf8_lossy(&out.stderr));
        Ok(out.stdout)
    };
    ok(&[
        "workload".as_ref(),
        "--model".as_ref(),
        model.as_os_str(),
        "--max-batch".as_ref(),
        "4".as_ref(),
        "--max-seq".as_ref(),
        "64".as_ref(),
        "--out".as_ref(),
        w.as_os_str(),
    ])?;
    let workload = layerzero::plan::workload::Workload::load(&w)?;
    let ops: std::collections::BTreeSet<String> =
        workload.entries.iter().map(|e| e.name.split('.').next().unwrap_or_default().to_owned()).collect();
    for op in ["embedding", "rms_norm", "linear", "rope", "attention", "paged_attention", "mlp", "sample"] {
        assert!(ops.contains(op), "{op} in {ops:?}");
    }
    ok(&["solve".as_ref(), "--workload".as_ref(), w.as_os_str(), "--out".as_ref(), t.as_os_str()])?;
    let ready = lz()?
        .args(["readiness-check", "--table"])
        .arg(&t)
        .arg("--workload")
        .arg(&w)
        .env("LAYERZERO_HOME", tmp.path())
        .output()?;
    assert!(ready.status.success(), "{}", String::from_utf8_lossy(&ready.stdout));
    let json = ok(&[
        "generate".as_ref(),
        "--model".as_ref(),
        model.as_os_str(),
        "--prompt-ids".as_ref(),
        "1,17,42,99,3,250,7,128,64,5".as_ref(),
        "--max-new-tokens".as_ref(),
        "20".as_ref(),
        "--ignore-eos".as_ref(),
        "--table".as_ref(),
        t.as_os_str(),
        "--json".as_ref(),
    ])?;
    let r: serde_json::Value = serde_json::from_slice(&json)?;
    for (op, s) in r["ops"].as_object().ok_or_else(|| format!("no ops in {r}"))? {
        // RoPE keys are exact: only the prompt's own length is outside the table, selected
        // once live and then cached.
        let allowed = if op == "rope" { 1 } else { 0 };
        assert!(s["live"].as_u64() <= Some(allowed), "{op}: {s}");
        assert!(s["plan_hits"].as_u64() > Some(0), "{op}: {s}");
    }
    Ok(())
}

/// The per-expert tensors of `src` (the hub's layout) rewritten as transformers 5 keeps
/// them: per layer `mlp.experts.gate_up_proj` `[E, 2I, H]` and `mlp.experts.down_proj`
/// `[E, H, I]`, Mixtral's `block_sparse_moe` renamed `mlp`.
fn fused_experts_copy(src: &Path, experts: usize, layers: usize) -> TestResult<tempfile::TempDir> {
    let tmp = tempfile::tempdir()?;
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json"))?;
    let mut t = io::read(&src.join("model.safetensors"))?;
    for l in 0..layers {
        let (block, [g, u, d]) = if t.contains_key(&format!("model.layers.{l}.block_sparse_moe.gate.weight")) {
            ("block_sparse_moe", ["w1", "w3", "w2"])
        } else {
            ("mlp", ["gate_proj", "up_proj", "down_proj"])
        };
        let name = |s: &str| format!("model.layers.{l}.{block}.{s}");
        let router = t.remove(&name("gate.weight")).ok_or_else(|| format!("layer {l} has no router"))?;
        t.insert(format!("model.layers.{l}.mlp.gate.weight"), router);
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        let mut shapes = (0, 0);
        for e in 0..experts {
            let mut take = |p: &str| {
                t.remove(&name(&format!("experts.{e}.{p}.weight")))
                    .ok_or_else(|| format!("layer {l} expert {e} has no {p}"))
            };
            let (gt, ut, dt) = (take(g)?, take(u)?, take(d)?);
            shapes = (gt.shape()[0], gt.shape()[1]);
            gate_up.extend(gt.to_f32_vec());
            gate_up.extend(ut.to_f32_vec());
            down.extend(dt.to_f32_vec());
        }
        let (i, h) = shapes;
        let f32s = |shape: &[usize], v: Vec<f32>| HostTensor::from_f32(shape, v);
        t.insert(format!("model.layers.{l}.mlp.experts.gate_up_proj"), f32s(&[experts, 2 * i, h], gate_up)?);
        t.insert(format!("model.layers.{l}.mlp.experts.down_proj"), f32s(&[experts, h, i], down)?);
        for key in t.keys().filter(|k| k.contains(&format!("layers.{l}.{block}."))).cloned().collect::<Vec<_>>() {
            if let Some(x) = t.remove(&key) {
                t.insert(key.replace(&format!(".{block}."), ".mlp."), x);
            }
        }
    }
    io::write(&tmp.path().join("model.safetensors"), &t)?;
    Ok(tmp)
}

#[test]
fn moe_checkpoints_load_from_the_hubs_per_expert_layout_and_from_transformers_5s_fused_one() -> TestResult {
    for name in ["mixtral", "qwen2-moe"] {
        let dir = models().join(name);
        let model = Model::load(&dir, None).map_err(|e| format!("{name}: {e}"))?;
        let moe = model.config.moe.clone().ok_or_else(|| format!("{name} has experts"))?;
        let fused = fused_experts_copy(&dir, moe.experts, model.config.layers)?;
        let other = Model::load(fused.path(), None).map_err(|e| format!("{name} fused: {e}"))?;
        let lz = LayerZero::detected()?;
        let logits = |m: &Model| -> TestResult<Vec<f32>> {
            let mut s = llm::Session::new(m, &lz, 8)?;
            Ok(s.forward(&[1, 17, 42, 99], true)?.to_f32_vec())
        };
        assert_eq!(logits(&model)?, logits(&other)?, "{name}");
    }
    Ok(())
}

#[test]
fn moe_configs_that_cannot_run_are_refused_naming_the_field() -> TestResult {
    let dir = models().join("qwen2-moe");
    let text = std::fs::read_to_string(dir.join("config.json"))?;
    let cases = [
        (r#""num_experts_per_tok": 2"#, r#""num_experts_per_tok": 5"#, "num_experts_per_tok"),
        (
            r#""shared_expert_intermediate_size": 64"#,
            r#""shared_expert_intermediate_size": 48"#,
            "shared_expert_intermediate_size",
        ),
        (r#""num_experts": 4"#, r#""num_experts": 3"#, "mlp.gate.weight"),
    ];
    for (from, to, field) in cases {
        assert!(text.contains(from), "the fixture's config has {from}");
        let t = copy_of("qwen2-moe")?;
        std::fs::write(t.path().join("config.json"), text.replace(from, to))?;
        let err = refused(t.path(), "1,2,3")?;
        assert!(err.contains(field), "{field}: {err}");
    }
    Ok(())
}

#[test]
fn lz_diff_holds_both_moe_models_to_hf_router_logits_included() -> TestResult {
    for name in ["mixtral", "qwen2-moe"] {
        let dir = models().join(name);
        let out = tempfile::tempdir()?;
        let r = reference(&dir, "reference.safetensors")?;
        generate_with_dump(&dir, &r, out.path())?;
        let diff = lz()?.arg("diff").arg(out.path()).arg(&dir).args(["--threshold", "1e-4", "--json"]).output()?;
        let report: serde_json::Value = serde_json::from_slice(&diff.stdout)?;
        assert_eq!(diff.status.code(), Some(0), "{name}: {report}");
        let stages: Vec<&str> =
            report["stages"].as_array().map_or(Vec::new(), |s| s.iter().filter_map(|s| s["name"].as_str()).collect());
        assert!(stages.contains(&"layer.1.router_logits"), "{name}: {stages:?}");
        assert_eq!(stages.contains(&"layer.0.shared_out"), name == "qwen2-moe", "{name}");
    }
    Ok(())
}

#[test]
fn a_tensor_parallel_workload_holds_what_one_rank_runs() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let model = models().join("llama-gqa");
    let config = layerzero_llm::ModelConfig::load(&model)?;
    let w = tmp.path().join("tp2.json");
    let out = lz()?
        .args(["workload", "--model"])
        .arg(&model)
        .args(["--max-seq", "32", "--tp", "2", "--out"])
        .arg(&w)
        .env("LAYERZERO_HOME", tmp.path())
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let workload = layerzero::plan::workload::Workload::load(&w)?;
    assert!(workload.name.ends_with(".tp2"), "{}", workload.name);
    let attention = workload.entries.iter().find(|e| e.name.starts_with("attention.")).ok_or("no attention entry")?;
    let heads = |t: &str| attention.request["tensors"][t]["shape"][2].as_u64();
    assert_eq!(heads("q"), Some((config.heads / 2) as u64), "{}", attention.request);
    assert_eq!(heads("k"), Some((config.kv_heads / 2).max(1) as u64), "{}", attention.request);
    let bad = lz()?.args(["workload", "--model"]).arg(&model).args(["--tp", "3"]).output()?;
    assert_eq!(bad.status.code(), Some(2), "an uneven split is a usage error");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--tp 3"));
    Ok(())
}
