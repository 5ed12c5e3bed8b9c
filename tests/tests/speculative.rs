//! Speculative decoding (E2E §6.17): greedy drafts give exactly the target's greedy tokens,
//! however often the draft agrees; sampled drafts give tokens distributed as the target's
//! (a chi-square test over many seeds, which a sampler that kept the draft's tokens fails);
//! draft and target in a model scope each select apart and still give the target's tokens.

use std::path::PathBuf;

use layerzero::LayerZero;
use layerzero::runtime::SelectionSource;
use layerzero::schema::{SchemaKind, violations};
use layerzero::tensor::io;
use layerzero_llm::{self as llm, Generation, Model, ModelScope, Session};
use layerzero_tests::{TestResult, lz, repo_root};

fn models() -> PathBuf {
    repo_root().join("tests/models")
}

fn load(name: &str) -> TestResult<Model> {
    Ok(Model::load(&models().join(name), None).map_err(|e| format!("{name}: {e}"))?)
}

fn host() -> TestResult<LayerZero> {
    Ok(LayerZero::detected()?)
}

const PROMPT: [u32; 10] = [1, 17, 42, 99, 3, 250, 7, 128, 64, 5];

/// The reference's greedy tokens for `PROMPT`.
fn hf_greedy(name: &str) -> TestResult<Vec<u32>> {
    let r = io::read(&models().join(name).join("reference.safetensors"))?;
    Ok(r["generated_ids"].to_f64_vec().iter().map(|&x| x as u32).collect())
}

fn greedy(n: usize) -> Generation {
    Generation { max_new_tokens: n, stop_at_eos: false, ..Generation::default() }
}

#[test]
fn greedy_speculation_gives_the_targets_tokens_whether_the_draft_agrees_always_or_almost_never() -> TestResult {
    let target = load("llama-gqa")?;
    let lz = host()?;
    let expected = hf_greedy("llama-gqa")?;
    // The target as its own draft agrees always; another model's random weights almost never.
    for (draft, k, lowest, highest) in [("llama-gqa", 4, 1.0, 1.0), ("llama-deep-linear", 3, 0.0, 0.2)] {
        let d = load(draft)?;
        let mut streamed = Vec::new();
        let out = llm::speculate(&target, &d, &lz, &PROMPT, &greedy(expected.len()), k, |t| streamed.push(t))
            .map_err(|e| format!("{draft}: {e}"))?;
        assert_eq!(out.generated_ids, expected, "draft {draft}");
        assert_eq!(streamed, expected, "draft {draft}: streamed tokens");
        let rate = out.acceptance_rate();
        assert!((lowest..=highest).contains(&rate), "draft {draft}: acceptance {rate}");
        // Every round yields its accepted drafts and one token of the target's.
        assert_eq!(out.accepted + out.rounds, expected.len(), "draft {draft}");
    }
    Ok(())
}

#[test]
fn every_draft_length_and_budget_ends_exactly_at_max_new_tokens() -> TestResult {
    let (target, draft, lz) = (load("llama-gqa")?, load("llama-deep-linear")?, host()?);
    let expected = hf_greedy("llama-gqa")?;
    for k in [1, 2, 5, 8, usize::MAX] {
        for n in [1, 2, 3, 7] {
            let out = llm::speculate(&target, &draft, &lz, &PROMPT, &greedy(n), k, |_| {})
                .map_err(|e| format!("k {k}, n {n}: {e}"))?;
            assert_eq!(out.generated_ids, expected[..n], "k {k}, n {n}");
        }
    }
    // A one-token prompt has nothing to prefill: the first round starts from it.
    let alone = llm::generate::generate(&target, &lz, &[1], &greedy(6), |_| {})?;
    let out = llm::speculate(&target, &target, &lz, &[1], &greedy(6), 3, |_| {})?;
    assert_eq!(out.generated_ids, alone.generated_ids());
    Ok(())
}

/// The target's next-token distribution after `ids` at temperature 1 with top-k: the
/// softmax of the k largest logits, computed here in f64 from the model's logits.
fn top_k_softmax(model: &Model, lz: &LayerZero, ids: &[u32], k: usize) -> TestResult<Vec<f64>> {
    let mut s = Session::new(model, lz, ids.len())?;
    let logits = s.forward(ids, false)?.to_f64_vec();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let m = logits[order[0]];
    let mut p = vec![0.0; logits.len()];
    for &i in &order[..k] {
        p[i] = (logits[i] - m).exp();
    }
    let z: f64 = p.iter().sum();
    Ok(p.iter().map(|x| x / z).collect())
}

/// Pearson's chi-square of `counts` against `p`; infinite when a token of probability 0 was
/// drawn. Returns the statistic and the degrees of freedom.
fn chi_square(counts: &[usize], p: &[f64]) -> (f64, usize) {
    let n: usize = counts.iter().sum();
    let mut stat = 0.0;
    let mut cells = 0;
    for (&c, &pi) in counts.iter().zip(p) {
        if pi == 0.0 {
            if c > 0 {
                return (f64::INFINITY, 0);
            }
            continue;
        }
        let e = pi * n as f64;
        assert!(e >= 5.0, "an expected count of {e:.1} is too small for the chi-square test");
        stat += (c as f64 - e).powi(2) / e;
        cells += 1;
    }
    (stat, cells - 1)
}

/// The 0.999 quantiles of chi-square with 1..=7 degrees of freedom.
const CHI2_999: [f64; 7] = [10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322];

#[test]
fn sampled_speculation_draws_each_token_from_the_targets_distribution_over_many_seeds() -> TestResult {
    const SEEDS: u64 = 1200;
    const TOP_K: usize = 4;
    let (target, lz) = (load("llama-gqa")?, host()?);
    let p1 = top_k_softmax(&target, &lz, &PROMPT, TOP_K)?;
    for name in ["llama-deep-linear", "llama-gqa-draft"] {
        let draft = load(name)?;
        let q1 = top_k_softmax(&draft, &lz, &PROMPT, TOP_K)?;
        let g = |seed| Generation {
            max_new_tokens: 2,
            temperature: 1.0,
            top_k: Some(TOP_K as u64),
            seed,
            stop_at_eos: false,
            ..Generation::default()
        };
        let mut first = vec![0usize; target.config.vocab];
        let mut pairs = Vec::new();
        let (mut drafted, mut accepted) = (0, 0);
        for seed in 0..SEEDS {
            let out = llm::speculate(&target, &draft, &lz, &PROMPT, &g(seed), 2, |_| {})
                .map_err(|e| format!("{name}, seed {seed}: {e}"))?;
            first[out.generated_ids[0] as usize] += 1;
            pairs.push((out.generated_ids[0], out.generated_ids[1]));
            drafted += out.drafted;
            accepted += out.accepted;
        }
        // The first token: always drafted, then accepted or replaced from the residual.
        let (stat, df) = chi_square(&first, &p1);
        assert!(stat < CHI2_999[df - 1], "{name}: first token chi-square {stat:.1} over {df} dof");
        // A sampler that kept the draft's token would be caught: the draws do not fit q.
        if q1 != p1 {
            let (wrong, wdf) = chi_square(&first, &q1);
            assert!(wdf == 0 || wrong > CHI2_999[wdf - 1], "{name}: the test cannot tell q from p ({wrong:.1})");
        }
        // The second token, given the most frequent first one: drawn after an accepted draft
        // (the target's bonus token) or in a round of its own.
        let mode = (0..first.len()).max_by_key(|&t| first[t]).unwrap_or(0) as u32;
        let mut ids = PROMPT.to_vec();
        ids.push(mode);
        let p2 = top_k_softmax(&target, &lz, &ids, TOP_K)?;
        let mut second = vec![0usize; target.config.vocab];
        for &(a, b) in &pairs {
            if a == mode {
                second[b as usize] += 1;
            }
        }
        let (stat, df) = chi_square(&second, &p2);
        assert!(stat < CHI2_999[df - 1], "{name}: second token chi-square {stat:.1} over {df} dof");
        assert!(drafted > 0 && accepted <= drafted, "{name}");
        println!("{name}: acceptance {:.3}", accepted as f64 / drafted as f64);
    }
    Ok(())
}

#[test]
fn lz_generate_with_a_draft_reports_acceptance_and_speedup_and_refuses_a_foreign_tokenizer() -> TestResult {
    let out = lz()?
        .args(["generate", "--model", "tests/models/llama-gqa", "--draft", "tests/models/llama-gqa-draft"])
        .args(["--prompt-ids", "1,17,42,99,3,250,7,128,64,5", "--max-new-tokens", "32", "--ignore-eos"])
        .args(["--draft-tokens", "3", "--json"])
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let bad = violations(SchemaKind::GenerateReport, &v)?;
    assert!(bad.is_empty(), "{bad:?}");
    let s = &v["speculative"];
    let ids: Vec<u32> = serde_json::from_value(v["generated_ids"].clone())?;
    assert_eq!(ids, hf_greedy("llama-gqa")?);
    assert_eq!(s["matches_target_only"], true);
    assert_eq!(s["draft_tokens"], 3);
    let (drafted, accepted, rounds) =
        (s["drafted"].as_u64().unwrap_or(0), s["accepted"].as_u64().unwrap_or(0), s["rounds"].as_u64().unwrap_or(0));
    assert_eq!(accepted + rounds, 32);
    let rate = s["acceptance_rate"].as_f64().unwrap_or(-1.0);
    assert!((rate - accepted as f64 / drafted as f64).abs() < 1e-12 && rate > 0.3, "{s}");
    let speedup = s["speedup"].as_f64().unwrap_or(0.0);
    let ratio = s["target_only_ms"].as_f64().unwrap_or(0.0) / s["ms"].as_f64().unwrap_or(f64::INFINITY);
    assert!(speedup > 0.0 && (speedup - ratio).abs() < 1e-9 * speedup.max(1.0), "{s}");
    assert!(v["draft_ops"]["linear"]["kernels"].is_object(), "{}", v["draft_ops"]);

    // A draft whose tokenizer is another one is refused before anything runs.
    let tmp = tempfile::tempdir()?;
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(models().join("llama-gqa-draft").join(f), tmp.path().join(f))?;
    }
    std::fs::copy(repo_root().join("tests/fixtures/tokenizers/bytelevel.json"), tmp.path().join("tokenizer.json"))?;
    let out = lz()?
        .args(["generate", "--model", "tests/models/llama-gqa", "--draft"])
        .arg(tmp.path())
        .args(["--prompt-ids", "1,17,42", "--max-new-tokens", "4"])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("share the target's tokenizer") && err.contains("TOKENIZER"), "{err}");
    // A paged cache does not combine with a draft.
    let out = lz()?
        .args(["generate", "--model", "tests/models/llama-gqa", "--draft", "tests/models/llama-gqa-draft"])
        .args(["--prompt-ids", "1,2", "--kv", "paged"])
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kv paged"));
    // --draft-tokens without a draft, and a draft with several prompts, are usage errors.
    let out = lz()?
        .args(["generate", "--model", "tests/models/llama-gqa", "--prompt-ids", "1,2", "--draft-tokens", "2"])
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    Ok(())
}

/// What a handle's counters say about how it selected: hits, misses, live choices.
fn selected(lz: &LayerZero) -> [u64; 3] {
    let c = lz.counters();
    [c.cache_hits, c.cache_misses, c.live]
}

#[test]
fn section_6_17_draft_and_target_in_their_own_scopes_select_apart_and_give_the_targets_tokens() -> TestResult {
    let expected = hf_greedy("llama-gqa")?;
    let g = greedy(expected.len());
    let (target, draft) = (load("llama-gqa")?, load("llama-gqa-draft")?);
    assert_eq!(target.config.hidden, draft.config.hidden, "same widths: many requests of one are the other's too");

    // One handle for both: a request the target selected is served to the draft from the cache.
    let shared = host()?;
    let together = llm::speculate(&target, &draft, &shared, &PROMPT, &g, 3, |_| {})?;
    assert_eq!(together.generated_ids, expected);
    let both = shared.counters();

    // A scope each in one runtime.
    let runtime = host()?;
    let t = ModelScope::open(&runtime, "target", &models().join("llama-gqa"), None)?;
    let d = ModelScope::open(&runtime, "draft", &models().join("llama-gqa-draft"), None)?;
    let before = runtime.counters();
    let out = t.speculate(&d, &PROMPT, &g, 3, |_| {})?;
    assert_eq!(out.generated_ids, expected, "the target's greedy tokens, as Hugging Face generates them");
    assert_eq!((out.rounds, out.accepted), (together.rounds, together.accepted), "the same drafts were accepted");

    // Each scope selected exactly as a runtime of the model's own would, and the parent not at all.
    let (alone_t, alone_d) = (host()?, host()?);
    let apart = llm::speculate_scoped((&target, &alone_t), (&draft, &alone_d), &PROMPT, &g, 3, |_| {})?;
    assert_eq!(apart.generated_ids, expected);
    assert_eq!(selected(t.runtime()), selected(&alone_t), "target");
    assert_eq!(selected(d.runtime()), selected(&alone_d), "draft");
    let after = runtime.counters();
    assert_eq!(
        (after.live, after.cache_hits, after.cache_misses),
        (before.live, before.cache_hits, before.cache_misses)
    );

    // Neither cache served the other: a request both models make is selected live in each
    // scope, where the shared handle selected it once and served it from its cache after.
    let [_, _, target_live] = selected(t.runtime());
    let [_, _, draft_live] = selected(d.runtime());
    assert!(
        target_live + draft_live > both.live,
        "scoped {target_live} + {draft_live} live, shared {} live",
        both.live
    );
    Ok(())
}

#[test]
fn section_6_17_a_draft_scope_does_not_serve_a_request_the_target_scope_cached() -> TestResult {
    let runtime = host()?;
    let t = ModelScope::open(&runtime, "target", &models().join("llama-gqa"), None)?;
    let d = ModelScope::open(&runtime, "draft", &models().join("llama-gqa-draft"), None)?;
    // The target verifies one round: its scope now holds that step's selections.
    let out = t.speculate(&d, &PROMPT, &greedy(2), 1, |_| {})?;
    assert_eq!(out.generated_ids, hf_greedy("llama-gqa")?[..2]);
    let args = layerzero_tests::tiny_attention()?;
    let source = |s: &ModelScope| s.runtime().dispatch(&args).map(|d| d.source());
    assert_eq!(source(&t)?, SelectionSource::Live);
    assert_eq!(source(&t)?, SelectionSource::Cache);
    assert_eq!(source(&d)?, SelectionSource::Live, "the target's cached choice is not the draft's");
    assert_eq!(source(&d)?, SelectionSource::Cache);
    Ok(())
}

#[test]
fn section_6_17_lz_generate_with_the_target_as_its_own_draft_selects_in_two_scopes() -> TestResult {
    // The same model in both roles makes the same requests: one handle would serve the
    // draft the target's cached selections; a scope each selects them again.
    let out = lz()?
        .args(["generate", "--model", "tests/models/llama-gqa", "--draft", "tests/models/llama-gqa"])
        .args(["--prompt-ids", "1,17,42,99,3,250,7,128,64,5", "--max-new-tokens", "8", "--ignore-eos", "--json"])
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(violations(SchemaKind::GenerateReport, &v)?, Vec::<String>::new());
    let s = &v["speculative"];
    assert_eq!((&s["matches_target_only"], &s["acceptance_rate"]), (&serde_json::json!(true), &serde_json::json!(1.0)));
    let live = |c: &serde_json::Value| c["live"].as_u64().ok_or_else(|| format!("live in {c}"));
    let (target, draft) = (live(&v["counters"])?, live(&s["draft_counters"])?);
    assert!(target > 0 && draft > 0, "each scope selected live for itself: target {target}, draft {draft}");
    assert!(s["draft_counters"]["cache_hits"].as_u64().is_some_and(|h| h > 0), "{s}");
    Ok(())
}
