//! Scenario runs that execute a model on this machine (not only select): each names a model
//! under `tests/models/` and what to compare it with, and passes only when every stage is
//! within the threshold of the Hugging Face reference and the tokens (or class) are the same.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use layerzero::LayerZero;
use layerzero::tensor::{HostTensor, io};
use layerzero_llm::{self as llm, Generation, Model, ModelScope};
use serde::Deserialize;

/// One execution of a scenario (unknown fields are refused by its kind).
#[derive(Debug, Deserialize)]
pub struct Run {
    /// What it shows.
    pub name: String,
    /// What runs, and what it is held to.
    #[serde(flatten)]
    pub kind: RunKind,
}

/// The kinds of execution.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum RunKind {
    /// A decoder generates the reference's tokens from its prompt; every stage is diffed.
    Generate {
        /// Model folder, relative to the repository root.
        model: String,
        /// Largest L2-relative error of any stage.
        threshold: f64,
    },
    /// Speculative decoding with `draft`: greedy, the reference's tokens exactly.
    Speculative {
        /// Target model folder.
        model: String,
        /// Draft model folder.
        draft: String,
        /// Tokens drafted per round.
        draft_tokens: usize,
    },
    /// An encoder-decoder generates the reference's tokens; every stage is diffed.
    Seq2seq {
        /// Model folder.
        model: String,
        /// Largest L2-relative error of any stage.
        threshold: f64,
    },
    /// An image classifier; every stage is diffed.
    Classify {
        /// Model folder.
        model: String,
        /// The image, relative to the model folder.
        image: String,
        /// Largest L2-relative error of any stage.
        threshold: f64,
    },
    /// Two models in scopes of one runtime, interleaved on threads: each generates the
    /// reference's tokens.
    Scopes {
        /// Model folders (each with a reference).
        models: Vec<String>,
        /// Threads.
        threads: usize,
    },
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

fn reference(dir: &Path) -> Result<BTreeMap<String, HostTensor>, String> {
    io::read(&dir.join("reference.safetensors")).map_err(|e| e.to_string())
}

fn ids(t: Option<&HostTensor>, what: &str) -> Result<Vec<u32>, String> {
    let t = t.ok_or_else(|| format!("the reference has no `{what}`"))?;
    Ok(t.to_f64_vec().iter().map(|&x| x as u32).collect())
}

fn diffed(
    ours: &BTreeMap<String, HostTensor>,
    r: &BTreeMap<String, HostTensor>,
    threshold: f64,
) -> Result<usize, String> {
    let report = llm::diff::diff(ours, r, threshold).map_err(|e| e.to_string())?;
    match (&report.first_divergence, report.token_mismatches.first()) {
        (Some(stage), _) => Err(format!("first divergence at {stage}")),
        (None, Some((i, o, r))) => Err(format!("token {i}: {o}, reference {r}")),
        (None, None) if report.stages.is_empty() => Err("no stage was compared".to_owned()),
        (None, None) => Ok(report.stages.len()),
    }
}

fn greedy(n: usize, dump: bool) -> Generation {
    Generation { max_new_tokens: n, stop_at_eos: false, dump, ..Generation::default() }
}

fn ids_tensor(v: &[u32]) -> Result<HostTensor, String> {
    HostTensor::from_f32(&[v.len()], v.iter().map(|&x| x as f32).collect()).map_err(|e| e.to_string())
}

/// Runs one execution; `Ok` says what was checked.
pub fn run(run: &Run) -> Result<String, String> {
    let lz = LayerZero::detected().map_err(|e| e.to_string())?;
    let e = |x: layerzero::Error| x.to_string();
    match &run.kind {
        RunKind::Generate { model, threshold } => {
            let dir = root().join(model);
            let r = reference(&dir)?;
            let m = Model::load(&dir, None).map_err(e)?;
            let want = ids(r.get("generated_ids"), "generated_ids")?;
            let prompt = ids(r.get("prompt_ids"), "prompt_ids")?;
            let out = llm::generate::generate(&m, &lz, &prompt, &greedy(want.len(), true), |_| {}).map_err(e)?;
            let mut dump = out.dump.clone();
            dump.insert("generated_ids".into(), ids_tensor(out.generated_ids())?);
            let n = diffed(&dump, &r, *threshold)?;
            Ok(format!("{n} stages within {threshold:e}, {} tokens", want.len()))
        }
        RunKind::Speculative { model, draft, draft_tokens } => {
            let dir = root().join(model);
            let r = reference(&dir)?;
            let (t, d) = (Model::load(&dir, None).map_err(e)?, Model::load(&root().join(draft), None).map_err(e)?);
            let want = ids(r.get("generated_ids"), "generated_ids")?;
            let prompt = ids(r.get("prompt_ids"), "prompt_ids")?;
            let out =
                llm::speculate(&t, &d, &lz, &prompt, &greedy(want.len(), false), *draft_tokens, |_| {}).map_err(e)?;
            if out.generated_ids != want {
                return Err(format!("tokens {:?}, reference {want:?}", out.generated_ids));
            }
            Ok(format!("{} tokens, acceptance {:.2}", want.len(), out.acceptance_rate()))
        }
        RunKind::Seq2seq { model, threshold } => {
            let dir = root().join(model);
            let r = reference(&dir)?;
            let m = llm::seq2seq::Seq2SeqModel::load(&dir, None).map_err(e)?;
            let want = ids(r.get("generated_ids"), "generated_ids")?;
            let input = ids(r.get("input_ids"), "input_ids")?;
            let out = llm::seq2seq::generate(&m, &lz, &[input], &greedy(want.len(), true), true).map_err(e)?;
            let mut dump = out.dump.clone();
            let got = out.sequences.first().map(|s| s.generated_ids.clone()).unwrap_or_default();
            dump.insert("generated_ids".into(), ids_tensor(&got)?);
            let n = diffed(&dump, &r, *threshold)?;
            Ok(format!("{n} stages within {threshold:e}, {} tokens", want.len()))
        }
        RunKind::Classify { model, image, threshold } => {
            let dir = root().join(model);
            let r = reference(&dir)?;
            let m = llm::vit::VitModel::load(&dir, None).map_err(e)?;
            let pre = llm::vit::Preprocess::load(&dir, m.config.channels).map_err(e)?;
            let x = llm::vit::read_image(&dir.join(image), &m, &pre).map_err(e)?;
            let out = llm::vit::classify(&m, &lz, &x, true).map_err(e)?;
            let n = diffed(&out.dump, &r, *threshold)?;
            Ok(format!("{n} stages within {threshold:e}"))
        }
        RunKind::Scopes { models, threads } => {
            let scopes = models
                .iter()
                .map(|m| ModelScope::open(&lz, m, &root().join(m), None).map_err(e))
                .collect::<Result<Vec<_>, _>>()?;
            let refs = models.iter().map(|m| reference(&root().join(m))).collect::<Result<Vec<_>, _>>()?;
            let wants = refs
                .iter()
                .map(|r| Ok((ids(r.get("prompt_ids"), "prompt_ids")?, ids(r.get("generated_ids"), "generated_ids")?)))
                .collect::<Result<Vec<_>, String>>()?;
            let failures: Vec<String> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..*threads)
                    .map(|t| {
                        let (scopes, wants) = (&scopes, &wants);
                        s.spawn(move || {
                            (0..scopes.len())
                                .filter_map(|k| {
                                    let i = (t + k) % scopes.len();
                                    let (prompt, want) = &wants[i];
                                    match scopes[i].generate(prompt, &greedy(want.len(), false)) {
                                        Ok(out) if out.generated_ids() == want.as_slice() => None,
                                        Ok(out) => Some(format!("{}: {:?}", scopes[i].id(), out.generated_ids())),
                                        Err(err) => Some(format!("{}: {err}", scopes[i].id())),
                                    }
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap_or_else(|_| vec!["a thread panicked".to_owned()]))
                    .collect()
            });
            if failures.is_empty() {
                Ok(format!("{} models on {threads} threads, each the reference's tokens", models.len()))
            } else {
                Err(failures.join("; "))
            }
        }
    }
}
