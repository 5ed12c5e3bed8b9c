//! E2E spec §6.1 at 8192 tokens: the 32/8-head GQA prefill and a decode step over its cache,
//! executed on this CPU and held to the float64 oracle on sampled query rows. A binary of its
//! own, so its three tests (about a minute of CPU on 2 cores) run beside the integration
//! binary; the kernels and the oracle are optimised in the test profile (workspace
//! `Cargo.toml`), which makes this size take seconds rather than minutes.

use layerzero::LayerZero;
use layerzero::model::dtype::DType;
use layerzero_tests::TestResult;
use layerzero_tests::gqa::{self, Gqa};

/// Executes the prefill and the decode step of `seq` tokens in `dtype` and checks 16
/// sampled prefill rows and the decode output against the oracle.
fn prefill_and_decode_match(dtype: DType, seq: usize, seed: u64) -> TestResult {
    let (lz, oracle) = (LayerZero::detected()?, gqa::oracle()?);
    let g = Gqa::new(dtype, seq, seed)?;
    let prefill = lz.dispatch(&g.prefill()?)?;
    gqa::served_first_try(&prefill)?;
    gqa::prefill_rows_match(&g, &prefill.outputs["out"], &gqa::sample_rows(seq, 16, seed), &oracle)?;
    let decode = lz.dispatch(&g.decode()?)?;
    gqa::served_first_try(&decode)?;
    gqa::decode_matches(&g, &decode.outputs["out"], &oracle)
}

#[test]
fn section_6_1_gqa_32_8_prefill_and_decode_at_8192_tokens_match_the_f64_reference_in_f32() -> TestResult {
    prefill_and_decode_match(DType::F32, 8192, 81)
}

#[test]
fn section_6_1_gqa_32_8_prefill_and_decode_at_8192_tokens_match_the_f64_reference_in_bf16() -> TestResult {
    prefill_and_decode_match(DType::BF16, 8192, 82)
}

#[test]
fn section_6_1_gqa_32_8_prefill_and_decode_at_8192_tokens_match_the_f64_reference_in_f16() -> TestResult {
    prefill_and_decode_match(DType::F16, 8192, 83)
}
