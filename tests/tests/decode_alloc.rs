//! What a decode step allocates, watched by a counting global allocator: each op that
//! writes into the caller's buffers allocates nothing once warm, and neither does a whole
//! warm decode step of a committed tiny model, over a contiguous or a paged cache.

use std::alloc::System;
use std::path::PathBuf;
use std::sync::Mutex;

use layerzero::LayerZero;
use layerzero::exec::args::{EmbeddingArgs, LinearArgs, MlpArgs, NormArgs, OpArgs, Outputs, RopeArgs};
use layerzero::model::attrs::{MlpAttrs, NoAttrs, NormAttrs, RopeAttrs};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::policy::Policy;
use layerzero::tensor::{HostTensor, Storage};
use layerzero_llm::Model;
use layerzero_llm::forward::{KvKind, Session};
use layerzero_tests::TestResult;
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

#[test]
fn a_warm_decode_step_allocates_nothing() -> TestResult {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for name in ["llama-gqa", "llama-gqa-bf16"] {
        for kv in [KvKind::Contiguous, KvKind::Paged { page_size: 4 }] {
            let m = model(name)?;
            // On shapes this tiny the cost model may pick the reference oracle (f64, never
            // meant to serve); the step's claim is about the kernels that serve.
            let serving = Policy::from_json(r#"{"rules": [{"action": "deny", "kernels": "cpu_reference.*"}]}"#, "p")
                .and_then(|p| LayerZero::host()?.with_policy(p))?;
            let mut s = Session::with_cache(&m, &serving, &[64], kv)?;
            s.forward(&[1, 2, 3, 4, 5], false)?;
            for t in 0..20 {
                s.forward(&[7 + t], false)?;
            }
            let mut fewest = u64::MAX;
            for t in 0..5 {
                let region = Region::new(GLOBAL);
                let logits = s.forward(&[30 + t], false)?;
                drop(logits);
                fewest = fewest.min(region.change().allocations as u64);
            }
            assert_eq!(fewest, 0, "{name} {kv:?}: a warm decode step allocated {fewest} times");
        }
    }
    Ok(())
}
