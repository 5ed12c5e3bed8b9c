//! Capability facts against the upstream libraries' own test suites (issue 34): every input a
//! FlashAttention, FlashInfer, xFormers or PyTorch SDPA test runs at the commit the capability
//! file cites is a case its kernel must accept on the hardware the test runs on, and every
//! input a test skips or expects to raise for a capability reason one it must refuse. The
//! cases are data (`tests/data/upstream_cases/*.json`, written by
//! `tools/upstream_cases/main.py` from the test files, each citing its line); inputs no
//! request can express are listed there with the field LayerZero lacks.
//!
//! `tests/data/upstream_cases/disagreements.json` lists the cases that still disagree, each
//! with the field LayerZero lacks and why (none at present); the test fails on any other disagreement, on a listed case that agrees now (the
//! list must shrink as facts are fixed), and on any wrong accept.

use std::collections::{BTreeMap, BTreeSet};

use layerzero::LayerZero;
use layerzero::model::request::Request;
use layerzero::select::Verdict;
use layerzero_tests::{TestResult, repo_root};
use serde_json::Value;

/// One case of a fixture, with the library it came from.
struct Case {
    library: String,
    name: String,
    source: String,
    kernel: String,
    hardware: String,
    accept: bool,
    request: Value,
}

fn cases() -> TestResult<(Vec<Case>, usize)> {
    let dir = repo_root().join("tests/data/upstream_cases");
    let mut out = Vec::new();
    let mut unexpressible = 0;
    let mut files: Vec<_> = std::fs::read_dir(&dir)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    for path in files {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        if !name.ends_with(".json") || name == "disagreements.json" {
            continue;
        }
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let library = v["library"].as_str().ok_or_else(|| format!("{name}: no library"))?.to_owned();
        unexpressible += v["unexpressible"].as_array().map_or(0, Vec::len);
        for c in v["cases"].as_array().ok_or_else(|| format!("{name}: no cases"))? {
            let text = |k: &str| c[k].as_str().map(str::to_owned).ok_or_else(|| format!("{name}: a case lacks {k}"));
            out.push(Case {
                library: library.clone(),
                name: text("name")?,
                source: text("source")?,
                kernel: text("kernel")?,
                hardware: text("hardware")?,
                accept: text("expect")? == "accept",
                request: c["request"].clone(),
            });
        }
    }
    Ok((out, unexpressible))
}

/// The listed disagreements: (kernel, hardware, case name) -> why.
fn listed() -> TestResult<BTreeMap<(String, String, String), String>> {
    let path = repo_root().join("tests/data/upstream_cases/disagreements.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut out = BTreeMap::new();
    for d in v["disagreements"].as_array().ok_or("disagreements.json has a `disagreements` list")? {
        let s = |k: &str| d[k].as_str().unwrap_or_default().to_owned();
        // A disagreement is kept only for a field LayerZero lacks, and says which.
        if s("missing").is_empty() || s("why").is_empty() {
            return Err(format!(
                "disagreements.json: {} on {} names no `missing` field or no `why`",
                s("name"),
                s("hardware")
            )
            .into());
        }
        out.insert((s("kernel"), s("hardware"), s("name")), s("why"));
    }
    Ok(out)
}

/// LayerZero's verdict on `case`: whether the kernel would run on the input as given, and the
/// reason codes (or the transforms that adapt the input first: then the kernel never sees
/// what the upstream test refuses, which agrees with a refusal).
fn verdict(handles: &mut BTreeMap<String, LayerZero>, case: &Case) -> TestResult<(Run, Vec<String>)> {
    if !handles.contains_key(&case.hardware) {
        handles.insert(case.hardware.clone(), LayerZero::planning(&case.hardware)?);
    }
    let lz = &handles[&case.hardware];
    let req = Request::from_value(case.request.clone()).map_err(|e| format!("{} ({}): {e}", case.name, case.source))?;
    let report = lz.explain(&req);
    if let Some(e) = report.request_errors.first() {
        return Ok((Run::Refused, vec![format!("invalid request: {e}")]));
    }
    let c = report.candidate(&case.kernel).ok_or_else(|| format!("{}: no candidate {}", case.name, case.kernel))?;
    if c.verdict == Verdict::Rejected {
        return Ok((Run::Refused, c.reasons.iter().map(|r| r.code().as_str().to_owned()).collect()));
    }
    if c.transforms.is_empty() {
        return Ok((Run::AsGiven, Vec::new()));
    }
    Ok((Run::Adapted, c.transforms.iter().map(|t| format!("{} {}", t.kind.as_str(), t.tensor)).collect()))
}

/// How LayerZero would run a kernel on an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    /// On the input as given.
    AsGiven,
    /// After transforms (a contiguous copy, a cast).
    Adapted,
    /// Not at all.
    Refused,
}

#[test]
fn every_upstream_test_input_gets_the_verdict_its_test_implies_or_is_listed() -> TestResult {
    let (cases, unexpressible) = cases()?;
    assert!(!cases.is_empty(), "no upstream cases");
    let listed = listed()?;
    let mut handles = BTreeMap::new();
    let mut per_library: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let (mut unlisted, mut wrong_accepts, mut seen) = (Vec::new(), Vec::new(), BTreeSet::new());
    for case in &cases {
        let (run, codes) = verdict(&mut handles, case)?;
        let accepted = run != Run::Refused;
        let agrees = if case.accept { accepted } else { run != Run::AsGiven };
        let tally = per_library.entry(case.library.clone()).or_default();
        tally.0 += usize::from(agrees);
        tally.1 += 1;
        let id = (case.kernel.clone(), case.hardware.clone(), case.name.clone());
        if agrees {
            if listed.contains_key(&id) {
                unlisted.push(format!("listed but agrees now (remove it): {} on {}: {}", id.0, id.1, id.2));
            }
            continue;
        }
        seen.insert(id.clone());
        let what = format!(
            "{} on {}: {} ({}): upstream {}, LayerZero {} {codes:?}",
            case.kernel,
            case.hardware,
            case.name,
            case.source,
            if case.accept { "runs it" } else { "refuses it" },
            match run {
                Run::AsGiven => "accepts",
                Run::Adapted => "adapts",
                Run::Refused => "refuses",
            }
        );
        if run == Run::AsGiven && !case.accept {
            wrong_accepts.push(what);
        } else if !listed.contains_key(&id) {
            // One line each, to paste into disagreements.json with a why.
            let entry = serde_json::json!({"library": case.library, "kernel": id.0, "hardware": id.1, "name": id.2,
                "source": case.source, "codes": codes, "missing": "", "why": ""});
            eprintln!("UNLISTED {entry}");
            unlisted.push(what);
        }
    }
    let stale: Vec<String> = listed
        .keys()
        .filter(|id| !cases.iter().any(|c| (&c.kernel, &c.hardware, &c.name) == (&id.0, &id.1, &id.2)))
        .map(|id| format!("listed but no such case (remove it): {} on {}: {}", id.0, id.1, id.2))
        .collect();
    unlisted.extend(stale);
    for (library, (agree, all)) in &per_library {
        eprintln!("{library}: {agree} of {all} cases agree ({:.1}%)", 100.0 * *agree as f64 / (*all).max(1) as f64);
    }
    eprintln!("{unexpressible} inputs listed as unexpressible (the field LayerZero lacks named in the fixtures)");
    assert!(
        wrong_accepts.is_empty() && unlisted.is_empty(),
        "wrong accepts (an upstream test refuses these):\n{}\nother disagreements:\n{}",
        wrong_accepts.join("\n"),
        unlisted.join("\n")
    );
    Ok(())
}

#[test]
fn flash_attention_2_pads_an_unaligned_head_dim_itself_and_the_pad_is_charged_not_performed() -> TestResult {
    use layerzero::transform::{TransformKind, apply_transforms};
    let lz = LayerZero::planning("a100")?;
    let req = Request::from_json(
        r#"{"op": "attention", "tensors": {
            "q": {"dtype": "f16", "shape": [2, 113, 6, 59], "layout": "BSHD"},
            "k": {"dtype": "f16", "shape": [2, 203, 6, 59], "layout": "BSHD"},
            "v": {"dtype": "f16", "shape": [2, 203, 6, 59], "layout": "BSHD"}}}"#,
    )?;
    let report = lz.explain(&req);
    let c = report.candidate("flash_attn_2.attention.fwd").ok_or("FA2 is a candidate")?;
    assert_ne!(c.verdict, Verdict::Rejected, "{:?}", c.reasons);
    let pads: Vec<_> = c.transforms.iter().filter(|t| t.kind == TransformKind::PadHeadDim).collect();
    assert_eq!(pads.iter().map(|t| t.tensor).collect::<Vec<_>>(), ["q", "k", "v"]);
    // q: 2 * 113 * 6 * 59 halves read, padded to 64 written.
    assert_eq!(pads[0].bytes, 2 * 113 * 6 * 2 * (59 + 64));
    assert!(pads.iter().all(|t| t.ns > 0.0 && t.to == "multiple of 8"));
    // The library pads: LayerZero hands the tensors over as they are.
    let args = layerzero::exec::synth::synthesize(&req, 1)?;
    let handed = apply_transforms(&args, &c.transforms)?;
    assert_eq!(handed.tensors()[0].1.shape(), &[2, 113, 6, 59]);
    // Beyond the kernel's largest head dim once padded, it stays refused.
    let big = Request::from_json(&serde_json::to_string(&req)?.replace("59]", "257]"))?;
    let c = lz.explain(&big).candidate("flash_attn_2.attention.fwd").cloned().ok_or("candidate")?;
    assert_eq!(c.verdict, Verdict::Rejected);
    Ok(())
}
