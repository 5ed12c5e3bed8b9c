//! The front door: one handle, shared across threads, built in one line; registering an
//! executor makes its backend selectable; a policy swapped on a shared handle is never
//! served stale; typed selection agrees with request selection; readiness comes from the
//! library.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use layerzero::NormArgs;
use layerzero::exec::args::Outputs;
use layerzero::plan::solve::{self, Provenance};
use layerzero::plan::workload::Workload;
use layerzero::prelude::*;
use layerzero_tests::TestResult;

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn the_handle_is_shared_across_threads() -> TestResult {
    assert_send_sync::<LayerZero>();
    assert_send_sync::<Dispatch<'static>>();
    assert_send_sync::<layerzero::Hit<'static>>();
    Ok(())
}

fn norm(rows: usize) -> TestResult<OpArgs> {
    let x = HostTensor::from_f32(&[rows, 64], (0..rows * 64).map(|i| (i % 7) as f32).collect())?;
    let weight = HostTensor::from_f32(&[64], vec![1.0; 64])?;
    Ok(OpArgs::RmsNorm(NormArgs { x, weight, bias: None, residual: None, attrs: Default::default() }))
}

fn empty(_: &OpArgs) -> Result<Outputs, KernelError> {
    let mut o = Outputs::new();
    o.insert("out", HostTensor::from_f32(&[1], vec![7.0]).map_err(|e| KernelError::Failed(e.to_string()))?);
    Ok(o)
}

#[test]
fn registering_an_undeclared_kernel_is_refused_with_its_name() -> TestResult {
    let lz = LayerZero::detected()?;
    let err = lz.register("no.such.kernel", Arc::new(empty)).err().ok_or("must refuse")?;
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("no.such.kernel"), "{err}");
    Ok(())
}

fn attention() -> TestResult<OpArgs> {
    layerzero_tests::tiny_attention()
}

const SDPA: &str = "torch_sdpa.attention.math_cpu";

fn only(kernel: &str) -> TestResult<Policy> {
    Ok(Policy::from_json(&format!(r#"{{"rules": [{{"action": "allow", "kernels": "{kernel}"}}]}}"#), "p.json")?)
}

#[test]
fn a_registered_executor_makes_its_backend_available_and_runs() -> TestResult {
    let lz = LayerZero::detected()?.with_policy(only(SDPA)?)?;
    let before = lz.explain(&attention()?.describe());
    let c = before.candidate(SDPA).ok_or("declared")?;
    assert_eq!(c.reasons.first().map(|r| r.code()), Some(ReasonCode::BACKEND_NOT_INSTALLED));
    let lz = lz.register(SDPA, Arc::new(empty))?;
    let after = lz.explain(&attention()?.describe());
    assert_eq!(after.selected.as_deref(), Some(SDPA), "{:?}", after.candidate(SDPA));
    let d = lz.dispatch(&attention()?)?;
    assert_eq!(d.selection().kernel, SDPA);
    assert_eq!(d.outputs["out"].to_f32_vec(), vec![7.0]);
    Ok(())
}

#[test]
fn typed_selection_agrees_with_request_selection_and_hits_after_the_first_call() -> TestResult {
    let lz = LayerZero::detected()?;
    for rows in [1, 2, 3, 5, 8, 100, 1000] {
        let args = norm(rows)?;
        let typed = lz.select_args(&args)?;
        let live = lz.selector().select(&args.describe())?;
        assert_eq!(typed.kernel, live.kernel, "{rows} rows");
    }
    let before = lz.counters();
    let again = lz.select_args(&norm(7)?)?;
    assert_eq!(again.source(), SelectionSource::Cache, "7 rows share the bucket of 5..8");
    assert_eq!(lz.counters().cache_hits, before.cache_hits + 1);
    Ok(())
}

#[test]
fn a_policy_swapped_on_a_shared_handle_is_never_served_stale() -> TestResult {
    let lz = Arc::new(LayerZero::detected()?);
    let first = lz.select_args(&norm(4)?)?.kernel.clone();
    let deny = Policy::from_json(&format!(r#"{{"rules": [{{"action": "deny", "kernels": "{first}"}}]}}"#), "p.json")?;
    let swapped = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| -> TestResult {
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (lz, swapped, first) = (lz.clone(), swapped.clone(), first.clone());
                s.spawn(move || -> Result<(), String> {
                    for _ in 0..20_000 {
                        // Read the flag before selecting: a selection that starts after the
                        // swap returned must see the new policy.
                        let after_swap = swapped.load(Ordering::Acquire);
                        let args = norm(4).map_err(|e| e.to_string())?;
                        let k = lz.select_args(&args).map_err(|e| e.to_string())?.kernel.clone();
                        assert!(!(after_swap && k == first), "served {k} after the policy denied it");
                    }
                    Ok(())
                })
            })
            .collect();
        lz.set_policy(deny)?;
        swapped.store(true, Ordering::Release);
        for r in readers {
            r.join().map_err(|_| "a selecting thread panicked")??;
        }
        Ok(())
    })?;
    assert_ne!(lz.select_args(&norm(4)?)?.kernel, first);
    Ok(())
}

#[test]
fn readiness_of_a_handle_names_the_plan_it_serves_from() -> TestResult {
    let w = Workload::from_json(
        r#"{"schema_version": 1, "name": "norms", "entries": [
            {"name": "norm", "request": {"op": "rms_norm", "tensors": {
                "x": {"dtype": "f32", "shape": [4, 64]}, "weight": {"dtype": "f32", "shape": [64]}}},
             "ranges": {"tokens": [1, 64]}}]}"#,
        "w.json",
    )?;
    let lz = LayerZero::detected()?;
    let without = lz.readiness(Some(&w), None);
    let coverage =
        without.iter().find(|c| c.name == "coverage").ok_or_else(|| format!("no coverage check in {without:?}"))?;
    assert!(!coverage.ok, "no table serves nothing: {coverage:?}");
    let prov = Provenance { perfdb_digest: None, created_at: String::new(), command: "test".into() };
    let table = solve::solve(&w, &lz.selector(), prov)?;
    let lz = lz.with_plan(&table, PlanMode::Strict)?;
    let with = lz.readiness(Some(&w), None);
    for name in ["table_matches_host", "kernels", "jit", "coverage"] {
        let c = with.iter().find(|c| c.name == name).ok_or_else(|| format!("{name}: {with:?}"))?;
        assert!(c.ok, "{c:?}");
    }
    let hit = lz.select_args(&norm(3)?)?;
    assert_eq!(hit.source(), SelectionSource::Plan);
    Ok(())
}

#[test]
fn every_eligible_kernel_failing_is_kernel_failed_not_no_kernel() -> TestResult {
    let policy = only(SDPA)?;
    let failing = |_: &OpArgs| -> Result<Outputs, KernelError> { Err(KernelError::Failed("device lost".into())) };
    let lz = LayerZero::detected()
        .and_then(|lz| lz.with_policy(policy))
        .and_then(|lz| lz.register(SDPA, Arc::new(failing)))?;
    let err = lz.dispatch(&attention()?).err().ok_or("must fail")?;
    assert_eq!(err.kind(), ErrorKind::KernelFailed, "{err}");
    assert!(err.reasons().iter().any(|r| r.code() == ReasonCode::KERNEL_FAILED), "{:?}", err.reasons());
    // With nothing eligible at all, the kind says so instead.
    let none = Policy::from_json(r#"{"rules": [{"action": "deny", "kernels": "*"}]}"#, "p.json")?;
    let lz = LayerZero::detected().and_then(|lz| lz.with_policy(none))?;
    assert_eq!(lz.dispatch(&norm(4)?).err().map(|e| e.kind()), Some(ErrorKind::NoKernel));
    Ok(())
}

#[test]
fn an_io_error_keeps_its_source() -> TestResult {
    let err = Policy::load(std::path::Path::new("/nonexistent/policy.json")).err().ok_or("fails")?;
    assert_eq!(err.kind(), ErrorKind::Io);
    let source = std::error::Error::source(&err).ok_or("no source")?;
    assert!(source.downcast_ref::<std::io::Error>().is_some());
    Ok(())
}

#[test]
fn typed_selection_still_says_why_a_table_was_refused() -> TestResult {
    let reason = Reason::new(ReasonCode::PLAN_SCHEMA_MISMATCH, "plan.json: not a table");
    let lz = LayerZero::detected().and_then(|lz| lz.with_plan_rejection(reason, PlanMode::Prefer))?;
    for _ in 0..3 {
        // Live, then cached: every answer carries the note.
        let hit = lz.select_args(&norm(4)?)?;
        assert_eq!(hit.notes().first().map(|r| r.code()), Some(ReasonCode::PLAN_SCHEMA_MISMATCH));
    }
    assert!(lz.counters().cache_hits >= 2);
    Ok(())
}
