//! E2E spec §6.1, LLM prefill + decode (causal, 32 query heads over 8 KV heads, head dim
//! 128): executed at 512 tokens here against the float64 oracle; 8192 tokens executes in the
//! release-mode binary `long_context` (`tests/tests/long_context.rs`); 32768 tokens is
//! selected here on this host and on the named profiles, and executed by the benchmark
//! `cargo run --release -p layerzero-tests --example long_context`.

use layerzero::LayerZero;
use layerzero::model::dtype::DType;
use layerzero::model::op::Op;
use layerzero::model::request::Request;
use layerzero::select::{SelectionReport, Verdict};
use layerzero_tests::gqa::{self, Gqa, HEAD_DIM, HEADS_KV, HEADS_Q};
use layerzero_tests::{TestResult, attention, causal, planner, with_attrs};

/// Executes the 512-token prefill and the decode step over its cache in `dtype`; checks 16
/// sampled prefill rows and the decode output against the oracle. (f16 and 8192 tokens run
/// in the release binary `long_context`: the kernels are unoptimized here.)
fn prefill_and_decode_at_512_match(dtype: DType, seed: u64) -> TestResult {
    let (lz, oracle) = (LayerZero::detected()?, gqa::oracle()?);
    let g = Gqa::new(dtype, 512, seed)?;
    let prefill = lz.dispatch(&g.prefill()?)?;
    gqa::served_first_try(&prefill)?;
    gqa::prefill_rows_match(&g, &prefill.outputs["out"], &gqa::sample_rows(g.seq, 16, seed), &oracle)?;
    let decode = lz.dispatch(&g.decode()?)?;
    gqa::served_first_try(&decode)?;
    gqa::decode_matches(&g, &decode.outputs["out"], &oracle)
}

#[test]
fn section_6_1_gqa_32_8_prefill_and_decode_at_512_tokens_match_the_f64_reference_in_f32() -> TestResult {
    prefill_and_decode_at_512_match(DType::F32, 51)
}

#[test]
fn section_6_1_gqa_32_8_prefill_and_decode_at_512_tokens_match_the_f64_reference_in_bf16() -> TestResult {
    prefill_and_decode_at_512_match(DType::BF16, 52)
}

/// The §6.1 prefill (`seq_q` = `seq_k`) or decode (`seq_q` = 1) request, causal.
fn request(dtype: DType, seq_q: u64, seq_k: u64) -> Request {
    let (hq, hkv, d) = (HEADS_Q as u64, HEADS_KV as u64, HEAD_DIM as u64);
    with_attrs(attention(dtype, 1, seq_q, seq_k, hq, hkv, d), causal())
}

/// Every attention kernel of the catalog is in `report`: the selected one is the report's
/// choice, an eligible one has a score and no reason, a rejected one names its reasons.
fn every_kernel_accounted_for(report: &SelectionReport, kernels: &[String], what: &str) -> TestResult {
    let selected = report.selected.as_deref().ok_or_else(|| format!("{what}: nothing selected"))?;
    for id in kernels {
        let c = report.candidate(id).ok_or_else(|| format!("{what}: {id} is not in the report"))?;
        let ok = match c.verdict {
            Verdict::Selected => id == selected,
            Verdict::Eligible => c.reasons.is_empty() && c.score.is_some(),
            Verdict::Rejected => !c.reasons.is_empty(),
        };
        if !ok {
            return Err(format!("{what}: {id} is {} with reasons {:?}", c.verdict.as_str(), c.reasons).into());
        }
    }
    Ok(())
}

#[test]
fn section_6_1_gqa_32_8_at_32768_tokens_is_selected_on_this_host_and_every_profile_with_every_reason() -> TestResult {
    let lz = LayerZero::detected()?;
    let kernels: Vec<String> =
        lz.catalog().candidates(Op::Attention).iter().map(|&i| lz.catalog().kernel(i).1.id.clone()).collect();
    let seq = 32768;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (phase, seq_q) in [("prefill", seq), ("decode", 1)] {
            let report = lz.explain(&request(dtype, seq_q, seq));
            every_kernel_accounted_for(&report, &kernels, &format!("this host, {dtype} {phase}"))?;
            let backend = report.selected.as_deref().and_then(|s| s.split('.').next()).unwrap_or_default();
            assert!(["cpu", "onednn"].contains(&backend), "this host {dtype} {phase} selected {:?}", report.selected);
        }
    }
    // The GPU profiles of the spec's half dtypes: a GPU kernel serves, never a host one.
    for hw in ["h100", "h200", "a100", "b200", "l4", "a10", "rtx4090", "mi300x", "mi250x"] {
        for dtype in [DType::F16, DType::BF16] {
            for (phase, seq_q) in [("prefill", seq), ("decode", 1)] {
                let report = planner(hw)?.explain(&request(dtype, seq_q, seq));
                every_kernel_accounted_for(&report, &kernels, &format!("{hw}, {dtype} {phase}"))?;
                let chosen = report.selected.as_deref().unwrap_or_default();
                let on_host = ["cpu.", "cpu_reference.", "onednn.", "zendnn."].iter().any(|p| chosen.starts_with(p))
                    || chosen.ends_with("_cpu");
                assert!(!on_host, "{hw} {dtype} {phase} selected the host kernel {chosen}");
            }
        }
    }
    Ok(())
}

/// The rejected kernels of `report` with their codes, in report order.
fn rejected(report: &SelectionReport) -> Vec<(String, Vec<&'static str>)> {
    let rejected = report.candidates.iter().filter(|c| c.verdict == Verdict::Rejected);
    rejected.map(|c| (c.kernel.clone(), c.reasons.iter().map(|r| r.code().as_str()).collect())).collect()
}

#[test]
fn section_6_1_gqa_32_8_at_32768_tokens_on_h100_refuses_exactly_these_kernels_for_these_reasons() -> TestResult {
    let off_device = ["DEVICE_KIND_MISMATCH"];
    let gqa_off_device = ["DEVICE_KIND_MISMATCH", "GQA_UNSUPPORTED"];
    let common: Vec<(&str, &[&str])> = vec![
        ("cpu.attention.flash", &off_device),
        ("cpu_reference.attention.naive", &off_device),
        ("flash_attn_2.attention.fwd_ck", &off_device),
        ("onednn.attention.sdpa_graph", &gqa_off_device),
        ("torch_sdpa.attention.efficient_rocm", &gqa_off_device),
        ("torch_sdpa.attention.flash_cpu", &off_device),
        ("torch_sdpa.attention.flash_rocm", &off_device),
        ("torch_sdpa.attention.math_cpu", &off_device),
        ("torch_sdpa.attention.math_rocm", &off_device),
        ("zendnn.attention.flash_sdpa", &gqa_off_device),
    ];
    for dtype in [DType::F16, DType::BF16] {
        for (phase, seq_q) in [("prefill", 32768), ("decode", 1)] {
            let report = planner("h100")?.explain(&request(dtype, seq_q, 32768));
            let mut want = common.clone();
            if seq_q > 1 {
                // FlashInfer's decode kernel takes one query per sequence.
                want.insert(3, ("flashinfer.attention.decode", &["SEQ_LEN_Q_UNSUPPORTED"]));
            }
            let want: Vec<(String, Vec<&str>)> = want.iter().map(|(k, c)| (k.to_string(), c.to_vec())).collect();
            assert_eq!(rejected(&report), want, "h100 {dtype} {phase}");
            let chosen = report.selected.as_deref().unwrap_or_default();
            let preferred = ["flash_attn_3.", "flashinfer.", "flash_attn_2."].iter().any(|p| chosen.starts_with(p));
            assert!(preferred, "h100 {dtype} {phase} selected {chosen}, not a FlashAttention or FlashInfer kernel");
        }
    }
    Ok(())
}
