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

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn the_handle_is_shared_across_threads() {
    assert_send_sync::<LayerZero>();
    assert_send_sync::<Dispatch<'static>>();
    assert_send_sync::<layerzero::Hit<'static>>();
}

fn norm(rows: usize) -> OpArgs {
    let x = HostTensor::from_f32(&[rows, 64], (0..rows * 64).map(|i| (i % 7) as f32).collect())
        .unwrap_or_else(|e| panic!("{e}"));
    let weight = HostTensor::from_f32(&[64], vec![1.0; 64]).unwrap_or_else(|e| panic!("{e}"));
    OpArgs::RmsNorm(NormArgs { x, weight, bias: None, residual: None, attrs: Default::default() })
}

fn empty(_: &OpArgs) -> Result<Outputs, KernelError> {
    let mut o = Outputs::new();
    o.insert("out", HostTensor::from_f32(&[1], vec![7.0]).unwrap_or_else(|e| panic!("{e}")));
    Ok(o)
}

#[test]
fn registering_an_undeclared_kernel_is_refused_with_its_name() {
    let lz = LayerZero::detected().unwrap_or_else(|e| panic!("{e}"));
    let err = lz.register("no.such.kernel", Arc::new(empty)).err().unwrap_or_else(|| panic!("must refuse"));
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("no.such.kernel"), "{err}");
}

fn attention() -> OpArgs {
    layerzero_tests::tiny_attention()
}

const SDPA: &str = "torch_sdpa.attention.math_cpu";

fn only(kernel: &str) -> Policy {
    Policy::from_json(&format!(r#"{{"rules": [{{"action": "allow", "kernels": "{kernel}"}}]}}"#), "p.json")
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_registered_executor_makes_its_backend_available_and_runs() {
    let lz = LayerZero::detected().and_then(|lz| lz.with_policy(only(SDPA))).unwrap_or_else(|e| panic!("{e}"));
    let before = lz.explain(&attention().describe());
    let c = before.candidate(SDPA).unwrap_or_else(|| panic!("declared"));
    assert_eq!(c.reasons.first().map(|r| r.code()), Some(ReasonCode::BACKEND_NOT_INSTALLED));
    let lz = lz.register(SDPA, Arc::new(empty)).unwrap_or_else(|e| panic!("{e}"));
    let after = lz.explain(&attention().describe());
    assert_eq!(after.selected.as_deref(), Some(SDPA), "{:?}", after.candidate(SDPA));
    let d = lz.dispatch(&attention()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.selection().kernel, SDPA);
    assert_eq!(d.outputs["out"].to_f32_vec(), vec![7.0]);
}

#[test]
fn typed_selection_agrees_with_request_selection_and_hits_after_the_first_call() {
    let lz = LayerZero::detected().unwrap_or_else(|e| panic!("{e}"));
    for rows in [1, 2, 3, 5, 8, 100, 1000] {
        let args = norm(rows);
        let typed = lz.select_args(&args).unwrap_or_else(|e| panic!("{e}"));
        let live = lz.selector().select(&args.describe()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(typed.kernel, live.kernel, "{rows} rows");
    }
    let before = lz.counters();
    let again = lz.select_args(&norm(7)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.source(), SelectionSource::Cache, "7 rows share the bucket of 5..8");
    assert_eq!(lz.counters().cache_hits, before.cache_hits + 1);
}

#[test]
fn a_policy_swapped_on_a_shared_handle_is_never_served_stale() {
    let lz = Arc::new(LayerZero::detected().unwrap_or_else(|e| panic!("{e}")));
    let first = lz.select_args(&norm(4)).unwrap_or_else(|e| panic!("{e}")).kernel.clone();
    let deny = Policy::from_json(&format!(r#"{{"rules": [{{"action": "deny", "kernels": "{first}"}}]}}"#), "p.json")
        .unwrap_or_else(|e| panic!("{e}"));
    let swapped = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        for _ in 0..2 {
            let (lz, swapped, first) = (lz.clone(), swapped.clone(), first.clone());
            s.spawn(move || {
                for _ in 0..20_000 {
                    // Read the flag before selecting: a selection that starts after the swap
                    // returned must see the new policy.
                    let after_swap = swapped.load(Ordering::Acquire);
                    let k = lz.select_args(&norm(4)).unwrap_or_else(|e| panic!("{e}")).kernel.clone();
                    assert!(!(after_swap && k == first), "served {k} after the policy denied it");
                }
            });
        }
        lz.set_policy(deny).unwrap_or_else(|e| panic!("{e}"));
        swapped.store(true, Ordering::Release);
    });
    assert_ne!(lz.select_args(&norm(4)).unwrap_or_else(|e| panic!("{e}")).kernel, first);
}

#[test]
fn readiness_of_a_handle_names_the_plan_it_serves_from() {
    let w = Workload::from_json(
        r#"{"schema_version": 1, "name": "norms", "entries": [
            {"name": "norm", "request": {"op": "rms_norm", "tensors": {
                "x": {"dtype": "f32", "shape": [4, 64]}, "weight": {"dtype": "f32", "shape": [64]}}},
             "ranges": {"tokens": [1, 64]}}]}"#,
        "w.json",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let lz = LayerZero::detected().unwrap_or_else(|e| panic!("{e}"));
    let without = lz.readiness(Some(&w), None);
    let coverage = without.iter().find(|c| c.name == "coverage").unwrap_or_else(|| panic!("{without:?}"));
    assert!(!coverage.ok, "no table serves nothing: {coverage:?}");
    let prov = Provenance { perfdb_digest: None, created_at: String::new(), command: "test".into() };
    let table = solve::solve(&w, &lz.selector(), prov).unwrap_or_else(|e| panic!("{e}"));
    let lz = lz.with_plan(&table, PlanMode::Strict).unwrap_or_else(|e| panic!("{e}"));
    let with = lz.readiness(Some(&w), None);
    for name in ["table_matches_host", "kernels", "jit", "coverage"] {
        let c = with.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("{name}: {with:?}"));
        assert!(c.ok, "{c:?}");
    }
    let hit = lz.select_args(&norm(3)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(hit.source(), SelectionSource::Plan);
}

#[test]
fn every_eligible_kernel_failing_is_kernel_failed_not_no_kernel() {
    let policy = only(SDPA);
    let failing = |_: &OpArgs| -> Result<Outputs, KernelError> { Err(KernelError::Failed("device lost".into())) };
    let lz = LayerZero::detected()
        .and_then(|lz| lz.with_policy(policy))
        .and_then(|lz| lz.register(SDPA, Arc::new(failing)))
        .unwrap_or_else(|e| panic!("{e}"));
    let err = lz.dispatch(&attention()).err().unwrap_or_else(|| panic!("must fail"));
    assert_eq!(err.kind(), ErrorKind::KernelFailed, "{err}");
    assert!(err.reasons().iter().any(|r| r.code() == ReasonCode::KERNEL_FAILED), "{:?}", err.reasons());
    // With nothing eligible at all, the kind says so instead.
    let none = Policy::from_json(r#"{"rules": [{"action": "deny", "kernels": "*"}]}"#, "p.json")
        .unwrap_or_else(|e| panic!("{e}"));
    let lz = LayerZero::detected().and_then(|lz| lz.with_policy(none)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lz.dispatch(&norm(4)).err().map(|e| e.kind()), Some(ErrorKind::NoKernel));
}

#[test]
fn an_io_error_keeps_its_source() {
    let err = Policy::load(std::path::Path::new("/nonexistent/policy.json")).err().unwrap_or_else(|| panic!("fails"));
    assert_eq!(err.kind(), ErrorKind::Io);
    let source = std::error::Error::source(&err).unwrap_or_else(|| panic!("no source"));
    assert!(source.downcast_ref::<std::io::Error>().is_some());
}

#[test]
fn typed_selection_still_says_why_a_table_was_refused() {
    let reason = Reason::new(ReasonCode::PLAN_SCHEMA_MISMATCH, "plan.json: not a table");
    let lz = LayerZero::detected()
        .and_then(|lz| lz.with_plan_rejection(reason, PlanMode::Prefer))
        .unwrap_or_else(|e| panic!("{e}"));
    for _ in 0..3 {
        // Live, then cached: every answer carries the note.
        let hit = lz.select_args(&norm(4)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(hit.notes().first().map(|r| r.code()), Some(ReasonCode::PLAN_SCHEMA_MISMATCH));
    }
    assert!(lz.counters().cache_hits >= 2);
}
