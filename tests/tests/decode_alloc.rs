//! What a decode step allocates, watched by a counting global allocator: each op that
//! writes into the caller's buffers allocates nothing once warm, and neither does a whole
//! warm decode step of a committed tiny model, over a contiguous or a paged cache; and the
//! fragmentation stress (E2E §11.3): rounds over many sizes keep nothing and stay resident-flat.

use std::alloc::System;
use std::path::PathBuf;
use std::sync::Mutex;

use layerzero::LayerZero;
use layerzero::backend::cpu::scratch_bytes;
use layerzero::exec::args::{EmbeddingArgs, LinearArgs, MlpArgs, NormArgs, OpArgs, Outputs, RopeArgs};
use layerzero::model::attrs::{MlpAttrs, NoAttrs, NormAttrs, RopeAttrs};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::policy::Policy;
use layerzero::tensor::{HostTensor, Storage};
use layerzero_llm::Model;
use layerzero_llm::forward::{KvKind, Session};
use layerzero_tests::{TestResult, close, stress};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The counts are process-wide: one test measures at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn t(dtype: DType, shape: &[usize], seed: usize) -> TestResult<HostTensor> {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (((i + seed) * 7919 % 97) as f32 - 48.0) / 97.0).collect();
    Ok(HostTensor::from_f32_as(dtype, shape, &v)?)
}

fn ids(v: &[i64], shape: &[usize]) -> TestResult<HostTensor> {
    Ok(HostTensor::new(Storage::I64(v.to_vec().into()), shape)?)
}

/// The fewest allocations of five dispatches of `args` after twenty, each handed the last
/// one's outputs as its buffers, and the kernel that ran. The fewest, because a pool thread
/// that happens to nest deeper than before grows its scratch once; a kernel that allocates
/// per call allocates in all five.
fn warm_allocations(lz: &LayerZero, args: &OpArgs) -> TestResult<(u64, String)> {
    let mut buffers = Outputs::new();
    for _ in 0..20 {
        buffers = lz.dispatch_into(args, buffers)?.outputs;
    }
    let mut fewest = u64::MAX;
    let mut kernel = String::new();
    for _ in 0..5 {
        let region = Region::new(GLOBAL);
        let d = lz.dispatch_into(args, buffers)?;
        fewest = fewest.min(region.change().allocations as u64);
        kernel.clone_from(&d.selection().kernel);
        buffers = d.outputs;
    }
    Ok((fewest, kernel))
}

#[test]
fn a_warm_decode_op_handed_its_last_outputs_allocates_nothing() -> TestResult {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let lz = LayerZero::host()?;
    for dtype in [DType::F32, DType::BF16] {
        let (h, i, heads, kv, d) = (64, 160, 4, 2, 16);
        let cases = [
            OpArgs::Embedding(EmbeddingArgs {
                ids: ids(&[3], &[1])?,
                table: t(dtype, &[50, h], 1)?,
                attrs: NoAttrs {},
            }),
            OpArgs::RmsNorm(NormArgs {
                x: t(dtype, &[1, h], 2)?,
                weight: t(dtype, &[h], 3)?,
                bias: None,
                residual: Some(t(dtype, &[1, h], 4)?),
                attrs: NormAttrs { eps: Some(1e-5) },
            }),
            OpArgs::Linear(LinearArgs {
                x: t(dtype, &[1, h], 5)?,
                weight: t(dtype, &[heads * d, h], 6)?,
                bias: Some(t(dtype, &[heads * d], 7)?),
                attrs: NoAttrs {},
            }),
            OpArgs::Rope(RopeArgs {
                q: t(dtype, &[1, 1, heads, d], 8)?.with_layout(Layout::Bshd),
                k: Some(t(dtype, &[1, 1, kv, d], 9)?.with_layout(Layout::Bshd)),
                positions: Some(ids(&[17], &[1, 1])?),
                cos: None,
                sin: None,
                attrs: RopeAttrs::default(),
            }),
            OpArgs::Mlp(MlpArgs {
                x: t(dtype, &[1, h], 10)?,
                w_gate: t(dtype, &[i, h], 11)?,
                w_up: t(dtype, &[i, h], 12)?,
                w_down: t(dtype, &[h, i], 13)?,
                attrs: MlpAttrs::default(),
            }),
        ];
        for args in &cases {
            let (n, kernel) = warm_allocations(&lz, args)?;
            assert_eq!(n, 0, "{} in {dtype} ran {kernel} and allocated {n} times", args.op());
        }
    }
    Ok(())
}

fn model(name: &str) -> TestResult<Model> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models").join(name);
    Ok(Model::load(&dir, None).map_err(|e| format!("the committed model loads: {e}"))?)
}

/// The fewest allocations of five warm decode steps of `m` (after a prefill and twenty
/// steps), served by the kernels that serve (the reference oracle denied: on shapes this
/// tiny the cost model may pick it, and it never claims to be allocation-free).
fn warm_step_allocations(m: &Model, kv: KvKind) -> TestResult<u64> {
    let serving = Policy::from_json(r#"{"rules": [{"action": "deny", "kernels": "cpu_reference.*"}]}"#, "p")
        .and_then(|p| LayerZero::host()?.with_policy(p))?;
    let mut s = Session::with_cache(m, &serving, &[64], kv)?;
    s.forward(&[1, 2, 3, 4, 5], false)?;
    for t in 0..20 {
        s.forward(&[7 + t], false)?;
    }
    let mut fewest = u64::MAX;
    for t in 0..5 {
        let region = Region::new(GLOBAL);
        drop(s.forward(&[30 + t], false)?);
        fewest = fewest.min(region.change().allocations as u64);
    }
    Ok(fewest)
}

#[test]
fn a_warm_decode_step_allocates_nothing() -> TestResult {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for name in ["llama-gqa", "llama-gqa-bf16"] {
        for kv in [KvKind::Contiguous, KvKind::Paged { page_size: 4 }] {
            let fewest = warm_step_allocations(&model(name)?, kv)?;
            assert_eq!(fewest, 0, "{name} {kv:?}: a warm decode step allocated {fewest} times");
        }
    }
    Ok(())
}

#[test]
fn a_warm_decode_step_of_quantized_weights_allocates_nothing() -> TestResult {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models").join("llama-gqa");
    for quant in [
        layerzero_llm::WeightQuant::int4(32),
        layerzero_llm::WeightQuant::Int4 { group: 32, activations: layerzero::model::w4::ActQuant::F32 },
        layerzero_llm::WeightQuant::Int8 { group: 32 },
    ] {
        let m = Model::load_with(&dir, None, layerzero_llm::Residence::Resident, Some(quant))?;
        let fewest = warm_step_allocations(&m, KvKind::Contiguous)?;
        assert_eq!(fewest, 0, "a warm {quant} decode step allocated {fewest} times");
    }
    Ok(())
}

/// VmRSS of this process in KiB (Linux; `None` elsewhere).
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn section_11_3_shuffled_rounds_over_many_sizes_stay_correct_and_hold_no_more_memory_than_the_first() -> TestResult {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let cases = stress::cases()?;
    let lock = r#"{"rules": [{"action": "lock", "kernels": "cpu_reference.linear.naive"},
                             {"action": "lock", "kernels": "cpu_reference.rms_norm.naive"}]}"#;
    let oracle = LayerZero::host()?.with_policy(Policy::from_json(lock, "oracle")?)?;
    let want =
        cases.iter().map(|c| Ok(oracle.dispatch(c)?.outputs["out"].to_f64_vec())).collect::<TestResult<Vec<_>>>()?;
    drop(oracle);
    // The kernels that serve, not the oracle, are the ones under stress.
    let serving = Policy::from_json(r#"{"rules": [{"action": "deny", "kernels": "cpu_reference.*"}]}"#, "p")
        .and_then(|p| LayerZero::host()?.with_policy(p))?;
    let matches = |i: usize, d: &layerzero::Dispatch<'_>| -> TestResult {
        let got = d.outputs["out"].to_f64_vec();
        close::values(&d.selection().kernel, stress::category(&cases[i]), DType::F32, &want[i], &got)
    };
    // Two warm-up rounds: selections cached, pools and scratch at their working size.
    stress::round(&serving, &cases, 0, matches)?;
    stress::round(&serving, &cases, 1, |_, _| Ok(()))?;
    let warm_rss = rss_kib();
    const ROUNDS: u64 = 10;
    let mut held = Vec::new();
    for r in 2..ROUNDS {
        let region = Region::new(GLOBAL);
        let scratch = scratch_bytes();
        if r + 1 == ROUNDS {
            stress::round(&serving, &cases, r, matches)?;
        } else {
            stress::round(&serving, &cases, r, |_, _| Ok(()))?;
        }
        let c = region.change();
        assert!(
            c.allocations >= cases.len(),
            "round {r}: every case allocates its outputs ({} allocations)",
            c.allocations
        );
        // A kernel thread may meet a size of scratch for the first time late (which thread
        // runs which task depends on timing, more so on a loaded machine): that it keeps.
        let grown = (scratch_bytes() - scratch) as i64;
        held.push(c.bytes_allocated as i64 - c.bytes_deallocated as i64 - grown);
    }
    // Every output is freed: a round keeps nothing beyond a few small entries and scratch.
    assert!(held.iter().all(|&b| b <= 16 << 10), "bytes still allocated after each round: {held:?}");
    // Blocks of every size freed and reused in shuffled order do not pile up as resident memory.
    if let (Some(warm), Some(end)) = (warm_rss, rss_kib()) {
        assert!(end <= warm + 8 * 1024, "VmRSS {warm} KiB after warm-up, {end} KiB after {ROUNDS} rounds");
    }
    Ok(())
}
