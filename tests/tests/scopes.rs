//! Several models in one runtime (E2E §6.10, §13.8): each model is a scope with its own
//! tokenizer, plan, selection caches and counters; interleaved on threads, each gets exactly
//! what it gets alone; a plan or cache made for another tokenizer is never served.

use std::path::{Path, PathBuf};

use layerzero::LayerZero;
use layerzero::reason::ReasonCode;
use layerzero::runtime::{PlanMode, SelectionSource};
use layerzero::tensor::{HostTensor, io};
use layerzero_llm::{Generation, Model, ModelScope, Tokenizer};
use layerzero_tests::{TestResult, lz, repo_root};

fn models() -> PathBuf {
    repo_root().join("tests/models")
}

fn host() -> TestResult<LayerZero> {
    Ok(LayerZero::detected()?)
}

/// A second model with another vocabulary and tokenizer: the qwen2 fixture's table grown to
/// the 446 ids of the WordPiece fixture tokenizer (tied head, so the head grows with it).
fn wordpiece_qwen2() -> TestResult<tempfile::TempDir> {
    let tmp = tempfile::tempdir()?;
    let src = models().join("qwen2");
    let mut t = io::read(&src.join("model.safetensors"))?;
    let embed = t["model.embed_tokens.weight"].to_f32_vec();
    let (v, h) = (446, 64);
    let grown: Vec<f32> =
        (0..v * h).map(|i| if i < embed.len() { embed[i] } else { embed[i % embed.len()] * -0.5 }).collect();
    t.insert("model.embed_tokens.weight".into(), HostTensor::from_f32(&[v, h], grown)?);
    io::write(&tmp.path().join("model.safetensors"), &t)?;
    let config = std::fs::read_to_string(src.join("config.json"))?;
    assert!(config.contains("\"vocab_size\": 256"));
    std::fs::write(tmp.path().join("config.json"), config.replace("\"vocab_size\": 256", "\"vocab_size\": 446"))?;
    std::fs::copy(repo_root().join("tests/fixtures/tokenizers/wordpiece.json"), tmp.path().join("tokenizer.json"))?;
    Ok(tmp)
}

const TEXTS: [&str; 3] = ["the kernel selector picks", "tokens of other models", "a cache per model"];

fn greedy() -> Generation {
    Generation { max_new_tokens: 6, stop_at_eos: false, ..Generation::default() }
}

/// A text's ids and the tokens generated from them.
type Run = (Vec<u32>, Vec<u32>);

/// Each text through a scope. The error is text: threads hand it back, and `Box<dyn Error>`
/// is not `Send`.
fn run_all(scope: &ModelScope) -> Result<Vec<Run>, String> {
    TEXTS
        .iter()
        .map(|text| {
            let ids = scope.encode(text).map_err(|e| format!("{}: {e}", scope.id()))?;
            let out = scope.generate(&ids, &greedy()).map_err(|e| format!("{}: {e}", scope.id()))?;
            Ok((ids, out.generated_ids().to_vec()))
        })
        .collect()
}

#[test]
fn two_models_interleaved_on_threads_each_get_what_they_get_alone() -> TestResult {
    let second = wordpiece_qwen2()?;
    let open = |lz: &LayerZero, which: usize| match which {
        0 => ModelScope::open(lz, "llama-gqa", &models().join("llama-gqa"), None),
        _ => ModelScope::open(lz, "qwen2-wordpiece", second.path(), None),
    };
    // Alone: each model in a runtime of its own.
    let mut alone = Vec::new();
    for m in 0..2 {
        alone.push(run_all(&open(&host()?, m)?)?);
    }
    // The tokenizers differ, so the same text is other ids.
    assert_ne!(alone[0][0].0, alone[1][0].0);

    // Together: one runtime, one scope each, requests interleaved on four threads.
    let shared = host()?;
    let scopes = [open(&shared, 0)?, open(&shared, 1)?];
    assert_ne!(scopes[0].model().config.vocab, scopes[1].model().config.vocab);
    let before = shared.counters();
    std::thread::scope(|s| -> TestResult {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let scopes = &scopes;
                s.spawn(move || (0..3).map(|round| run_all(&scopes[(t + round) % 2])).collect::<Result<Vec<_>, _>>())
            })
            .collect();
        for (t, h) in handles.into_iter().enumerate() {
            let results = h.join().map_err(|_| format!("thread {t} panicked"))??;
            for (round, got) in results.iter().enumerate() {
                assert_eq!(got, &alone[(t + round) % 2], "thread {t}, round {round}");
            }
        }
        Ok(())
    })?;
    // Each scope selected for itself and counted its own; the parent dispatched nothing.
    for scope in &scopes {
        let c = scope.runtime().counters();
        assert!(c.live > 0 && c.cache_hits > 0, "{}: {c:?}", scope.id());
    }
    let after = shared.counters();
    assert_eq!((after.live, after.cache_hits), (before.live, before.cache_hits));
    Ok(())
}

#[test]
fn a_scope_does_not_serve_another_models_cached_selection_of_the_same_request() -> TestResult {
    let shared = host()?;
    let dir = models().join("llama-gqa");
    let a = ModelScope::open(&shared, "a", &dir, None)?;
    let b = ModelScope::open(&shared, "b", &dir, None)?;
    let args = layerzero_tests::tiny_attention()?;
    let source = |scope: &ModelScope| scope.runtime().dispatch(&args).map(|d| d.source());
    assert_eq!(source(&a)?, SelectionSource::Live);
    assert_eq!(source(&a)?, SelectionSource::Cache);
    // The same request in the other model's scope selects for that model.
    assert_eq!(source(&b)?, SelectionSource::Live);
    assert_eq!(source(&b)?, SelectionSource::Cache);
    // And the runtime's own cache holds neither.
    assert_eq!(shared.dispatch(&args)?.source(), SelectionSource::Live);
    Ok(())
}

/// The llama-gqa tokenizer with one more added token: another identity hash.
fn changed_tokenizer(dir: &Path) -> TestResult<Tokenizer> {
    let text = std::fs::read_to_string(models().join("llama-gqa/tokenizer.json"))?;
    let mut v: serde_json::Value = serde_json::from_str(&text)?;
    let added = v["added_tokens"].as_array_mut().ok_or("added_tokens")?;
    let id = 193;
    added.push(serde_json::json!({"id": id, "content": "<|new|>", "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": true}));
    let file = dir.join("tokenizer.json");
    std::fs::write(&file, v.to_string())?;
    Ok(Tokenizer::load(&file)?)
}

#[test]
fn a_plan_or_cache_made_for_another_tokenizer_is_invalidated_with_a_reason_never_served() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let (w, t) = (tmp.path().join("w.json"), tmp.path().join("t.json"));
    let dir = models().join("llama-gqa");
    for args in [
        vec!["workload".as_ref(), "--model".as_ref(), dir.as_os_str(), "--max-batch".as_ref(), "2".as_ref()],
        vec!["solve".as_ref(), "--workload".as_ref(), w.as_os_str(), "--out".as_ref(), t.as_os_str()],
    ] {
        let mut args: Vec<&std::ffi::OsStr> = args;
        if args[0] == "workload" {
            args.extend(["--max-seq".as_ref(), "64".as_ref(), "--out".as_ref(), w.as_os_str()]);
        }
        let out = lz()?.args(&args).env("LAYERZERO_HOME", tmp.path()).output()?;
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let own = Tokenizer::load(&dir.join("tokenizer.json"))?;
    let table: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&t)?)?;
    assert_eq!(table["header"]["tokenizer_hash"], own.hash(), "the table carries the workload's tokenizer");

    let shared = host()?;
    let prompt = [1, 17, 42, 99, 3];
    // The model's own tokenizer: the plan serves.
    let mut scope =
        ModelScope::open(&shared, "llama-gqa", &dir, None).and_then(|s| s.with_plan_file(&t, PlanMode::Prefer))?;
    let first = scope.generate(&prompt, &greedy())?;
    assert!(scope.runtime().counters().plan_hits > 0 && scope.runtime().plan_rejection().is_none());
    let tokens = first.generated_ids().to_vec();

    // The tokenizer changes under the scope: the reason says so, the plan stops serving,
    // and nothing cached for the old tokenizer is served (the first selections are live).
    let reason = scope.set_tokenizer(Some(changed_tokenizer(tmp.path())?))?.ok_or("a changed tokenizer invalidates")?;
    assert_eq!(reason.code(), ReasonCode::TOKENIZER_HASH_MISMATCH);
    let rejection = scope.runtime().plan_rejection().ok_or("the plan is refused")?;
    assert_eq!(rejection.code(), ReasonCode::TOKENIZER_HASH_MISMATCH);
    let (plan_before, live_before) = (scope.runtime().counters().plan_hits, scope.runtime().counters().live);
    let again = scope.generate(&prompt, &greedy())?;
    let c = scope.runtime().counters();
    assert_eq!(c.plan_hits, plan_before, "no plan hit after the tokenizer changed");
    assert!(c.live > live_before, "selections are made again");
    assert_eq!(again.generated_ids(), tokens, "the same weights give the same tokens");

    // Strict mode: a scope with another tokenizer refuses the table at load...
    let model = Model::load(&dir, None)?;
    let err = ModelScope::new(&shared, "llama-gqa", model, Some(changed_tokenizer(tmp.path())?))
        .and_then(|s| s.with_plan_file(&t, PlanMode::Strict))
        .err()
        .ok_or("strict mode refuses the table")?;
    assert!(err.reasons().iter().any(|r| r.code() == ReasonCode::TOKENIZER_HASH_MISMATCH), "{err}");
    // ...and a strict scope refuses a tokenizer change, keeping its tokenizer and plan.
    let mut strict =
        ModelScope::open(&shared, "llama-gqa", &dir, None).and_then(|s| s.with_plan_file(&t, PlanMode::Strict))?;
    let err = strict.set_tokenizer(Some(changed_tokenizer(tmp.path())?)).err().ok_or("refused")?;
    assert!(err.reasons().iter().any(|r| r.code() == ReasonCode::TOKENIZER_HASH_MISMATCH), "{err}");
    assert_eq!(strict.tokenizer().map(Tokenizer::hash), Some(own.hash()), "the tokenizer is kept");
    assert!(strict.runtime().plan().is_some() && strict.runtime().plan_rejection().is_none(), "the plan is kept");
    Ok(())
}
