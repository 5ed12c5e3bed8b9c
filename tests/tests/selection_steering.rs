//! E2E spec §7.1, §7.6, §7.8 and §23 through the public API: a transform's cost takes the
//! win from the kernel with the best kernel time, live selection after a plan's bucket miss
//! obeys strict mode and deny rules (the selection log names each passed-over kernel's
//! codes), a table solved under another GPU driver is refused naming both drivers, and an
//! attention tensor without a layout tag is refused with a reason code.

use std::sync::Arc;

use layerzero::capabilities::catalog::Catalog;
use layerzero::exec::executor::Registry;
use layerzero::hardware::named;
use layerzero::hardware::profile::HardwareProfile;
use layerzero::model::attrs::{AttentionAttrs, Attrs};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::model::request::Request;
use layerzero::model::tensor::TensorDesc;
use layerzero::plan::solve::{self, Provenance};
use layerzero::plan::table::DispatchTable;
use layerzero::plan::workload::Workload;
use layerzero::policy::Policy;
use layerzero::select::Selector;
use layerzero::{ErrorKind, LayerZero, PlanMode, ReasonCode, SelectionSource};
use layerzero_tests::TestResult;

/// A bf16 BSHD attention of 32 query heads over 8 KV heads of 128; k and v strided (every
/// element 2 apart, so stride(-1) = 2) when `strided`.
fn attention(seq_q: u64, seq_k: u64, strided: bool) -> Request {
    let t = |s: u64, h: u64| TensorDesc::new(DType::BF16, [1, s, h, 128]).with_layout(Layout::Bshd);
    let kv = || if strided { t(seq_k, 8).with_strides([seq_k * 8 * 256, 8 * 256, 256, 2]) } else { t(seq_k, 8) };
    let mut r =
        Request::new(layerzero::model::op::Op::Attention).tensor("q", t(seq_q, 32)).tensor("k", kv()).tensor("v", kv());
    r.attrs = Attrs::Attention(AttentionAttrs { causal: seq_q == seq_k, ..Default::default() });
    r
}

fn h100(policy: &Policy) -> TestResult<Selector> {
    Ok(Selector::planning(Catalog::builtin()?, Arc::new(named::load("h100")?), Arc::new(policy.clone()))?)
}

fn planning(hw: &Arc<HardwareProfile>) -> TestResult<Selector> {
    Ok(Selector::planning(Catalog::builtin()?, hw.clone(), Arc::new(Policy::default()))?)
}

#[test]
fn section_7_1_a_layout_copy_costs_the_fastest_kernel_the_win() -> TestResult {
    // One decode step over 4096 strided keys: FlashAttention 3 has the best kernel time, but
    // it needs k and v made contiguous first; the math kernel takes any strides.
    let strided = h100(&Policy::default())?.explain(&attention(1, 4096, true));
    let fa3 = strided.candidate("flash_attn_3.attention.fwd").ok_or("fa3 is a candidate")?;
    let math = strided.candidate("torch_sdpa.attention.math").ok_or("math is a candidate")?;
    let (fa3_score, math_score) =
        (fa3.score.as_ref().ok_or("fa3 eligible")?, math.score.as_ref().ok_or("math eligible")?);
    assert_eq!(fa3.transforms.iter().map(|t| t.tensor.to_string()).collect::<Vec<_>>(), ["k", "v"]);
    assert!(math.transforms.is_empty() && math_score.transform_ns == 0.0);
    // Kernel time alone would pick FlashAttention 3; the copy makes its total the worse one.
    assert!(fa3_score.estimated_ns < math_score.estimated_ns, "{fa3_score:?} vs {math_score:?}");
    assert!(fa3_score.transform_ns > 0.0);
    assert_eq!(fa3_score.total_ns, fa3_score.estimated_ns + fa3_score.transform_ns);
    assert!(fa3_score.total_ns > math_score.total_ns, "{fa3_score:?} vs {math_score:?}");
    assert_eq!(strided.selected.as_deref(), Some("torch_sdpa.attention.math"));
    assert_eq!(strided.transform_cost_total, 0.0);
    // The same call with contiguous keys needs no copy, and FlashAttention 3 wins it.
    let contiguous = h100(&Policy::default())?.explain(&attention(1, 4096, false));
    assert_eq!(contiguous.selected.as_deref(), Some("flash_attn_3.attention.fwd"));
    Ok(())
}

/// Prefill attention, sequence 64..2048.
fn prefill_workload() -> TestResult<Workload> {
    Ok(Workload::from_json(
        r#"{"schema_version": 1, "name": "miss", "entries": [{"name": "attn", "request": {"op": "attention",
            "tensors": {"q": {"dtype": "bf16", "shape": [1, 64, 32, 128], "layout": "BSHD"},
                        "k": {"dtype": "bf16", "shape": [1, 64, 8, 128], "layout": "BSHD"},
                        "v": {"dtype": "bf16", "shape": [1, 64, 8, 128], "layout": "BSHD"}},
            "attrs": {"causal": true}}, "ranges": {"seq_q": [64, 2048], "seq_k": "seq_q"}}]}"#,
        "w.json",
    )?)
}

fn provenance() -> Provenance {
    Provenance { perfdb_digest: None, created_at: "2026-11-27T00:00:00Z".into(), command: "test".into() }
}

/// A handle on the H100 profile under `policy`, with the prefill table solved under it.
fn runtime_with_table(policy: &Policy) -> TestResult<LayerZero> {
    let table = solve::solve(&prefill_workload()?, &h100(policy)?, provenance())?;
    Ok(LayerZero::new(h100(policy)?, Registry::new())?.with_plan(&table, PlanMode::Prefer)?)
}

/// The codes the handle's last logged live selection gives `kernel`.
fn logged_codes(lz: &LayerZero, kernel: &str) -> TestResult<Vec<&'static str>> {
    let record = lz.recent_decisions().pop().ok_or("a live selection is logged")?;
    let r =
        record.rejections.iter().find(|r| r.kernel == kernel).ok_or_else(|| format!("{kernel} not in {record:?}"))?;
    Ok(r.reasons.clone())
}

#[test]
fn section_7_6_live_selection_after_a_bucket_miss_obeys_strict_mode_and_deny_rules() -> TestResult {
    // Without a policy, FlashAttention 3 wins a long prefill, copying strided keys if need be.
    let open = runtime_with_table(&Policy::default())?;
    assert_eq!(open.select(&attention(8192, 8192, false))?.kernel, "flash_attn_3.attention.fwd");
    let copied = open.select(&attention(8192, 8192, true))?;
    assert_eq!((copied.kernel.as_str(), copied.transforms.len()), ("flash_attn_3.attention.fwd", 2));

    let policy = Policy::from_json(
        r#"{"strict_mode": true, "rules": [{"action": "deny", "kernels": "flash_attn_3.*"}]}"#,
        "policy.json",
    )?;
    let lz = runtime_with_table(&policy)?;
    assert!(lz.plan().is_some(), "the table solved under this policy is loaded");
    // Sequence 8192 is past every bucket of the table: selected live, and the deny rule holds.
    let denied = lz.select(&attention(8192, 8192, false))?;
    assert_eq!(denied.source(), SelectionSource::Live);
    assert_eq!(denied.notes().first().map(|r| r.code()), Some(ReasonCode::PLAN_BUCKET_MISS));
    assert!(!denied.kernel.starts_with("flash_attn_3."), "{}", denied.kernel);
    assert_eq!(logged_codes(&lz, "flash_attn_3.attention.fwd")?, ["POLICY_DENIED"]);
    // Strided keys: strict mode refuses every kernel that would copy them.
    let strict = lz.select(&attention(8192, 8192, true))?;
    assert_eq!(strict.source(), SelectionSource::Live);
    assert_eq!(strict.notes().first().map(|r| r.code()), Some(ReasonCode::PLAN_BUCKET_MISS));
    assert_eq!(strict.kernel, "torch_sdpa.attention.math");
    assert!(strict.transforms.is_empty());
    assert_eq!(logged_codes(&lz, "flash_attn_2.attention.fwd")?, ["TRANSFORM_REJECTED_STRICT"]);
    let fa3 = logged_codes(&lz, "flash_attn_3.attention.fwd")?;
    assert!(fa3.contains(&"POLICY_DENIED"), "{fa3:?}");
    Ok(())
}

#[test]
fn section_7_8_a_table_solved_under_another_gpu_driver_is_refused_naming_both_drivers() -> TestResult {
    // The H100 profile as the CUDA probe would read it under a given driver.
    let under = |driver: Option<&str>| -> TestResult<Arc<HardwareProfile>> {
        let h = named::load("h100")?;
        let mut devices = h.devices.clone();
        devices[0].driver = driver.map(str::to_owned);
        Ok(Arc::new(HardwareProfile::new(h.name.clone(), h.description.clone(), devices)))
    };
    // Naming no driver leaves the fingerprint as it was: shipped tables still load.
    assert_eq!(under(None)?.fingerprint, named::load("h100")?.fingerprint);
    let (old, new) = (under(Some("cuda 12.4"))?, under(Some("cuda 12.8"))?);
    assert_ne!(old.fingerprint, new.fingerprint);
    // The driver survives the profile file.
    let reread = HardwareProfile::from_json(&old.to_file_json().to_string(), "h100.json")?;
    assert_eq!((reread.primary().driver.as_deref(), &reread.fingerprint), (Some("cuda 12.4"), &old.fingerprint));

    let table = solve::solve(&prefill_workload()?, &planning(&old)?, provenance())?;
    assert_eq!(table.header.hardware.driver.as_deref(), Some("cuda 12.4"));
    let table = DispatchTable::parse(&table.to_json(), "t.json").map_err(|r| r.error)?;
    let same = LayerZero::new(planning(&old)?, Registry::new())?.with_plan(&table, PlanMode::Strict)?;
    assert_eq!(same.select(&attention(512, 512, false))?.source(), SelectionSource::Plan);
    // The driver changed: the table is another machine's, refused with both drivers named.
    let e = LayerZero::new(planning(&new)?, Registry::new())?
        .with_plan(&table, PlanMode::Strict)
        .err()
        .ok_or("a table solved under another driver must be refused")?;
    let reason = e.reasons().first().ok_or("the refusal carries a reason")?;
    assert_eq!(reason.code(), ReasonCode::PLAN_HARDWARE_MISMATCH);
    assert!(reason.to_string().contains("(driver cuda 12.4 then, cuda 12.8 here)"), "{reason}");
    // In prefer mode the handle selects live, every selection saying why.
    let live = LayerZero::new(planning(&new)?, Registry::new())?.with_plan(&table, PlanMode::Prefer)?;
    let hit = live.select(&attention(512, 512, false))?;
    assert_eq!(hit.source(), SelectionSource::Live);
    assert_eq!(hit.notes().first().map(|r| r.code()), Some(ReasonCode::PLAN_HARDWARE_MISMATCH));
    Ok(())
}

#[test]
fn section_23_an_attention_tensor_without_a_layout_tag_is_refused_with_a_reason_code() -> TestResult {
    // [1, 8, 8, 64]: S == H, so BSHD and BHSD read the same shape differently.
    let untagged = TensorDesc::new(DType::F32, [1, 8, 8, 64]);
    let req = attention(8, 8, false).tensor("q", untagged);
    let lz = LayerZero::detected()?;
    let e = lz.select(&req).err().ok_or("an untagged q must be refused")?;
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    let reason = e.reasons().first().ok_or("the refusal carries a reason")?;
    assert_eq!(reason.code(), ReasonCode::INVALID_REQUEST);
    assert!(reason.to_string().contains("tensor `q` needs an explicit layout (BSHD or BHSD)"), "{reason}");
    // The typed path refuses the same call before any kernel runs.
    let t = layerzero::HostTensor::zeros(DType::F32, &[1, 8, 8, 64])?;
    let args = layerzero::OpArgs::Attention(layerzero::AttentionArgs {
        q: t.clone(),
        k: t.clone().with_layout(Layout::Bshd),
        v: t.with_layout(Layout::Bshd),
        mask: None,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        attrs: AttentionAttrs::default(),
    });
    let e = lz.dispatch(&args).err().ok_or("an untagged q must be refused at dispatch")?;
    assert_eq!(e.reasons().first().map(|r| r.code()), Some(ReasonCode::INVALID_REQUEST), "{e}");
    assert!(e.to_string().contains("`q` needs an explicit layout"), "{e}");
    Ok(())
}
