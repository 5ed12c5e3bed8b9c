//! E2E spec §13, failure injection: one test per scenario, each through `LAYERZERO_FAULTS`
//! (`LayerZero::with_faults`), an executor that fails the way a real one does, or a real bad
//! file. Each asserts what must happen: the backend disabled safely, the fallback kernel and
//! its reason codes, outputs that still match the reference, invalid inputs rejected with
//! explicit codes, readiness failing fast.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use layerzero::capabilities::catalog::Catalog;
use layerzero::compare::Category;
use layerzero::exec::args::{LinearArgs, OpArgs, Outputs};
use layerzero::exec::executor::{Executor, KernelError};
use layerzero::model::attrs::NoAttrs;
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::policy::Policy;
use layerzero::tensor::HostTensor;
use layerzero::{ErrorKind, LayerZero, PlanMode, ReasonCode, SelectionSource};
use layerzero_tests::catalog::{Backend, Kernel};
use layerzero_tests::{TestResult, close, lz, policy, repo_root};

fn linear(rows: usize) -> TestResult<OpArgs> {
    let t = |shape: &[usize], scale: f32| {
        let n: usize = shape.iter().product();
        HostTensor::from_f32(shape, (0..n).map(|i| ((i % 7) as f32 - 3.0) * scale).collect())
    };
    Ok(OpArgs::Linear(LinearArgs {
        x: t(&[rows, 64], 0.5)?,
        weight: t(&[48, 64], 0.1)?,
        bias: None,
        attrs: NoAttrs {},
    }))
}

/// The float64 oracle's answer for `args`.
fn reference(args: &OpArgs) -> TestResult<Vec<f64>> {
    let locked = policy(r#"{"rules": [{"action": "lock", "kernels": "cpu_reference.linear.naive"}]}"#)?;
    let oracle = LayerZero::detected()?.with_policy(locked)?;
    Ok(oracle.dispatch(args)?.outputs["out"].to_f64_vec())
}

/// The output of `d` is the oracle's within the parity table's f32 GEMM tolerance.
fn matches_reference(d: &layerzero::Dispatch<'_>, args: &OpArgs) -> TestResult {
    let (got, want) = (d.outputs["out"].to_f64_vec(), reference(args)?);
    close::values(&d.selection().kernel, Category::Gemm, DType::F32, &want, &got)
}

fn codes(d: &layerzero::Dispatch<'_>) -> Vec<ReasonCode> {
    d.failed().iter().filter_map(|a| a.reason.as_ref().map(|r| r.code())).collect()
}

/// The kernel a healthy handle runs for `args`, and its backend.
fn healthy(args: &OpArgs) -> TestResult<(String, String)> {
    let lz = LayerZero::detected()?;
    let d = lz.dispatch(args)?;
    Ok((d.selection().kernel.clone(), d.selection().backend.clone()))
}

/// A handle whose `kernel` runs `exec` instead of its builtin executor.
fn replaced(kernel: &str, policy: Policy, exec: Arc<dyn Executor>) -> TestResult<LayerZero> {
    Ok(LayerZero::detected()?.with_policy(policy)?.register(kernel, exec)?)
}

/// The builtin executor of `kernel`.
fn builtin(kernel: &str) -> TestResult<Arc<dyn Executor>> {
    Ok(layerzero::builtin_registry().get(kernel).cloned().ok_or_else(|| format!("no executor for {kernel}"))?)
}

#[test]
fn backend_import_failure_leaves_the_backend_not_installed_with_the_loader_error_and_others_serve() -> TestResult {
    // A copy of the shipped capabilities whose oneDNN backend points at a file that exists
    // but is not a shared library.
    let dir = tempfile::tempdir()?;
    let broken = dir.path().join("libdnnl.so.3");
    std::fs::write(&broken, b"not an ELF file")?;
    let files = std::fs::read_dir(repo_root().join("capabilities"))?.flatten();
    for entry in files.filter(|e| e.path().extension().is_some_and(|x| x == "json")) {
        let mut text = std::fs::read_to_string(entry.path())?;
        if entry.file_name() == "onednn.json" {
            let mut v: serde_json::Value = serde_json::from_str(&text)?;
            v["probe"]["libraries"] = serde_json::json!([broken.display().to_string()]);
            v["$schema"] =
                serde_json::Value::String(repo_root().join("schemas/capabilities.schema.json").display().to_string());
            text = v.to_string();
        }
        let caps = dir.path().join("caps");
        std::fs::create_dir_all(&caps)?;
        std::fs::write(caps.join(entry.file_name()), text)?;
    }
    let catalog = Arc::new(Catalog::load_dir(&dir.path().join("caps"))?);
    let lz = LayerZero::detected_with(catalog)?;
    let args = linear(8)?;
    let report = lz.explain(&args.describe());
    let onednn = report.candidate("onednn.linear.matmul").ok_or("no oneDNN candidate")?;
    let why = &onednn.reasons[0];
    assert_eq!(why.code(), ReasonCode::BACKEND_NOT_INSTALLED);
    assert!(why.message().contains(&broken.display().to_string()), "{why}");
    let d = lz.dispatch(&args)?;
    assert_ne!(d.selection().backend, "onednn");
    matches_reference(&d, &args)?;
    Ok(())
}

#[test]
fn cuda_illegal_memory_access_disables_the_whole_backend_and_another_backend_serves() -> TestResult {
    let args = linear(8)?;
    let (kernel, backend) = healthy(&args)?;
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let faulting: Arc<dyn Executor> = Arc::new(move |_: &OpArgs| -> Result<Outputs, KernelError> {
        c.fetch_add(1, Ordering::SeqCst);
        Err(KernelError::DeviceLost("an illegal memory access was encountered".to_owned()))
    });
    let lz = replaced(&kernel, Policy::default(), faulting)?;
    let d = lz.dispatch(&args)?;
    assert_ne!(d.selection().backend, backend, "no kernel of the faulting backend runs");
    assert_eq!(codes(&d)[0], ReasonCode::DEVICE_LOST);
    assert!(codes(&d)[1..].iter().all(|c| *c == ReasonCode::BACKEND_UNHEALTHY), "{:?}", codes(&d));
    matches_reference(&d, &args)?;
    // Disabled safely: the next calls do not touch the backend at all.
    let again = lz.dispatch(&args)?;
    assert_eq!(codes(&again)[0], ReasonCode::BACKEND_UNHEALTHY);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(lz.health_report().backends.iter().any(|b| b.name == backend && b.state == "open"));
    Ok(())
}

#[test]
fn invalid_capabilities_or_dispatch_table_fail_readiness_fast_naming_the_file_and_field() -> TestResult {
    let dir = tempfile::tempdir()?;
    // A capability file with a constraint of the wrong type.
    let caps = dir.path().join("caps");
    std::fs::create_dir_all(&caps)?;
    let cpu = std::fs::read_to_string(repo_root().join("capabilities/cpu.json"))?;
    let mut v: serde_json::Value = serde_json::from_str(&cpu)?;
    v["kernels"][0]["properties"]["workspace_bytes"] = serde_json::json!("lots");
    std::fs::write(caps.join("cpu.json"), v.to_string())?;
    let err = Catalog::load_dir(&caps).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("cpu.json") && err.contains("workspace_bytes"), "{err}");
    // A dispatch table that is not JSON: refused in strict mode, live (with the reason) in
    // prefer mode, and readiness fails at once.
    let table = dir.path().join("table.json");
    std::fs::write(&table, "{ not json")?;
    let strict = LayerZero::detected().and_then(|lz| lz.with_plan_file(&table, PlanMode::Strict));
    assert!(strict.as_ref().err().is_some_and(|e| e.to_string().contains("table.json")), "{:?}", strict.err());
    let prefer = LayerZero::detected().and_then(|lz| lz.with_plan_file(&table, PlanMode::Prefer));
    let prefer = prefer?;
    assert!(prefer.plan_rejection().is_some());
    let args = linear(8)?;
    let d = prefer.dispatch(&args)?;
    assert_eq!(d.source(), SelectionSource::Live);
    matches_reference(&d, &args)?;
    let out = lz()?
        .args(["readiness-check", "--table", table.to_str().unwrap_or_default()])
        .timeout(Duration::from_secs(60))
        .output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("table.json"), "{text}");
    Ok(())
}

#[test]
fn attn_mask_with_is_causal_is_rejected_where_a_kernel_cannot_combine_them_and_runs_where_it_can() -> TestResult {
    let mut args = layerzero_tests::tiny_attention()?;
    if let OpArgs::Attention(a) = &mut args {
        let mask: Vec<f32> = (0..32).map(|i| if i % 5 == 0 { -1e4 } else { 0.0 }).collect();
        a.mask = Some(HostTensor::from_f32(&[1, 2, 4, 4], mask)?);
        a.q = HostTensor::from_f32(&[1, 4, 2, 8], (0..64).map(|i| (i % 9) as f32 * 0.1).collect())?
            .with_layout(Layout::Bshd);
        a.attrs.causal = true;
    }
    // Kernels built like PyTorch SDPA (an explicit mask or is_causal, never both) are
    // rejected with the code; the selection is one that applies both.
    let planning = LayerZero::planning("h100")?;
    let mut req = args.describe();
    for t in req.tensors.values_mut() {
        t.dtype = DType::BF16;
    }
    let report = planning.explain(&req);
    let conflicts: Vec<&str> = report
        .candidates
        .iter()
        .filter(|c| c.reasons.iter().any(|r| r.code() == ReasonCode::MASK_CAUSAL_CONFLICT))
        .map(|c| c.kernel.as_str())
        .collect();
    assert!(conflicts.iter().any(|k| k.starts_with("torch_sdpa.")), "{conflicts:?}");
    assert!(report.selected.as_deref().is_none_or(|k| !conflicts.contains(&k)), "{:?}", report.selected);
    assert!(conflicts.len() < report.candidates.len(), "some kernels declare that they combine a mask with causal");
    // On this host the CPU kernels combine them, and agree with the oracle.
    let lz = LayerZero::detected()?;
    let got = lz.dispatch(&args)?;
    let locked = policy(r#"{"rules": [{"action": "lock", "kernels": "cpu_reference.attention.naive"}]}"#)?;
    let want = LayerZero::detected()?.with_policy(locked)?.dispatch(&args)?.outputs["out"].to_f64_vec();
    let got_out = got.outputs["out"].to_f64_vec();
    close::values(&got.selection().kernel, Category::Attention, DType::F32, &want, &got_out)?;
    Ok(())
}

#[test]
fn graph_unsafe_kernel_is_never_selected_under_graph_strict_mode() -> TestResult {
    let lz = LayerZero::planning("h100")?.with_policy(policy(r#"{"graph_strict_mode": true}"#)?)?;
    let req = layerzero_tests::with_attrs(
        layerzero_tests::attention(DType::BF16, 1, 1024, 1024, 32, 8, 128),
        layerzero_tests::causal(),
    );
    let report = lz.explain(&req);
    let unsafe_ones: Vec<&str> = report
        .candidates
        .iter()
        .filter(|c| c.reasons.iter().any(|r| r.code() == ReasonCode::GRAPH_UNSAFE))
        .map(|c| c.kernel.as_str())
        .collect();
    assert!(!unsafe_ones.is_empty(), "some attention kernels are not graph-safe");
    match lz.select(&req) {
        Ok(s) => assert!(!unsafe_ones.contains(&s.kernel.as_str()), "{} is graph-unsafe", s.kernel),
        Err(e) => assert!(e.reasons().iter().any(|r| r.code() == ReasonCode::GRAPH_UNSAFE), "{e}"),
    }
    Ok(())
}

#[test]
fn plan_bucket_miss_on_an_unseen_shape_selects_live_with_the_reason_and_strict_mode_refuses() -> TestResult {
    let lz = LayerZero::detected()?;
    let table = layerzero_tests::small_linear_table(&lz.selector())?;
    let served = LayerZero::detected().and_then(|l| l.with_plan(&table, PlanMode::Prefer))?;
    let inside = linear(8)?;
    assert_eq!(served.dispatch(&inside).map(|d| d.source()).ok(), Some(SelectionSource::Plan));
    let unseen = linear(512)?;
    let d = served.dispatch(&unseen)?;
    assert_eq!(d.source(), SelectionSource::Live);
    assert_eq!(d.notes().first().map(|r| r.code()), Some(ReasonCode::PLAN_BUCKET_MISS));
    matches_reference(&d, &unseen)?;
    let strict = LayerZero::detected().and_then(|l| l.with_plan(&table, PlanMode::Strict))?;
    let err = strict.dispatch(&unseen).err().ok_or("strict mode must refuse a miss")?;
    assert_eq!(err.reasons().first().map(|r| r.code()), Some(ReasonCode::PLAN_BUCKET_MISS));
    Ok(())
}

#[test]
fn kv_cache_metadata_dtype_or_layout_mismatch_is_rejected_naming_both_tensors() -> TestResult {
    let lz = LayerZero::detected()?;
    let cache =
        |req: &mut layerzero::model::request::Request, name: &str, dtype: DType, layout: Layout, shape: [u64; 4]| {
            if let Some(t) = req.tensors.get_mut(name) {
                t.dtype = dtype;
                t.layout = Some(layout);
                t.shape = shape.to_vec();
            }
        };
    let base = layerzero_tests::paged(DType::F32, DType::F32, 2, 1, 8, 2, 64, 16, Layout::Nhd, DType::I32);
    let mut dtype = base.clone();
    cache(&mut dtype, "v_cache", DType::F16, Layout::Nhd, [64, 16, 2, 64]);
    let mut layout = base.clone();
    cache(&mut layout, "v_cache", DType::F32, Layout::Hnd, [64, 2, 16, 64]);
    for (what, req, says) in
        [("dtype", dtype, "dtype f32 != v_cache dtype f16"), ("layout", layout, "layout NHD != v_cache layout HND")]
    {
        let err = lz.select(&req).err().ok_or_else(|| format!("a {what} mismatch must be refused"))?;
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{what}: {err}");
        assert!(
            err.reasons().iter().any(|r| r.code() == ReasonCode::INVALID_REQUEST && r.message().contains(says)),
            "{what}: {err}"
        );
    }
    assert!(lz.select(&base).is_ok(), "the consistent cache is served");
    Ok(())
}

#[test]
fn tokenizer_hash_mismatch_in_vocab_merges_or_special_tokens_is_refused() -> TestResult {
    let model = repo_root().join("tests/models/llama-gqa");
    let original = std::fs::read_to_string(model.join("tokenizer.json"))?;
    let pinned = layerzero_llm::Tokenizer::parse(&original, "tokenizer.json").map(|t| t.hash().to_owned())?;
    let v: serde_json::Value = serde_json::from_str(&original)?;
    let mut changes: Vec<(&str, serde_json::Value)> = Vec::new();
    let mut vocab = v.clone();
    if let Some(map) = vocab["model"]["vocab"].as_object_mut() {
        let first = map.keys().next().cloned().unwrap_or_default();
        let id = map.remove(&first).unwrap_or_default();
        map.insert(format!("{first}x"), id);
    }
    changes.push(("vocab", vocab));
    let mut merges = v.clone();
    if let Some(list) = merges["model"]["merges"].as_array_mut() {
        list.reverse();
    }
    changes.push(("merges", merges));
    let mut special = v.clone();
    if let Some(list) = special["added_tokens"].as_array_mut()
        && let Some(first) = list.first_mut()
    {
        first["content"] = serde_json::json!("<|not-the-same|>");
    }
    changes.push(("special tokens", special));
    for (what, changed) in changes {
        let dir = tempfile::tempdir()?;
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(model.join(f), dir.path().join(f))?;
        }
        std::fs::write(dir.path().join("tokenizer.json"), changed.to_string())?;
        let out = lz()?
            .args(["generate", "--model", dir.path().to_str().unwrap_or_default(), "--prompt-ids", "1,2,3"])
            .args(["--max-new-tokens", "2", "--tokenizer-hash", &pinned])
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        assert!(err.contains("TOKENIZER_MISMATCH") && err.contains("tokenizer.json"), "{what}: {err}");
    }
    // The pinned tokenizer itself runs.
    let ok = lz()?
        .args(["generate", "--model", model.to_str().unwrap_or_default(), "--prompt-ids", "1,2,3"])
        .args(["--max-new-tokens", "2", "--tokenizer-hash", &pinned[..16]])
        .output()?;
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    Ok(())
}

#[test]
fn perfdb_corruption_is_moved_aside_and_missing_entries_fall_back_to_the_cost_model() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("perfdb.sqlite");
    std::fs::write(&db, b"SQLite format 3\0 but then garbage, not a database")?;
    let lz = LayerZero::detected().and_then(|l| l.with_perfdb(&db))?;
    let aside: Vec<String> = std::fs::read_dir(dir.path())?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "the damaged file is kept, moved aside");
    let args = linear(8)?;
    let d = lz.dispatch(&args)?;
    // The fresh database has no rows for this machine: every score is the model's.
    assert_eq!(d.selection().score.source.as_str(), "model");
    matches_reference(&d, &args)?;
    Ok(())
}

#[test]
fn backend_hang_times_out_falls_back_and_the_kernel_recovers_after_the_cooldown() -> TestResult {
    let args = linear(8)?;
    let (kernel, _) = healthy(&args)?;
    let real = builtin(&kernel)?;
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let (r, c) = (release.clone(), calls.clone());
    // The first call hangs until released; later calls are the real kernel.
    let hangs_once: Arc<dyn Executor> = Arc::new(move |a: &OpArgs| {
        if c.fetch_add(1, Ordering::SeqCst) == 0 {
            while !r.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        real.run(a)
    });
    let lz = replaced(&kernel, policy(r#"{"kernel_timeout_ms": 200, "health": {"cooldown_ms": 1000}}"#)?, hangs_once)?;
    let d = lz.dispatch(&args)?;
    assert_ne!(d.selection().kernel, kernel);
    assert_eq!(codes(&d), vec![ReasonCode::KERNEL_TIMEOUT]);
    matches_reference(&d, &args)?;
    let quarantined = lz.dispatch(&args)?;
    assert_eq!(codes(&quarantined), vec![ReasonCode::KERNEL_QUARANTINED]);
    release.store(true, Ordering::Release);
    std::thread::sleep(Duration::from_millis(1100));
    let recovered = lz.dispatch(&args)?;
    assert_eq!((recovered.selection().kernel.as_str(), codes(&recovered)), (kernel.as_str(), vec![]));
    matches_reference(&recovered, &args)?;
    assert_eq!(lz.health_report().abandoned_running, 0);
    Ok(())
}

#[test]
fn device_lost_or_reset_during_execution_disables_the_backend_until_the_probe_finds_it_back() -> TestResult {
    let args = linear(8)?;
    let (kernel, backend) = healthy(&args)?;
    let real = builtin(&kernel)?;
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    // Lost on the first call; reset and working from then on.
    let resets: Arc<dyn Executor> = Arc::new(move |a: &OpArgs| {
        if c.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(KernelError::DeviceLost("device reset during execution".to_owned()));
        }
        real.run(a)
    });
    let lz = replaced(&kernel, policy(r#"{"health": {"cooldown_ms": 500}}"#)?, resets)?;
    let d = lz.dispatch(&args)?;
    assert_ne!(d.selection().backend, backend);
    assert_eq!(codes(&d)[0], ReasonCode::DEVICE_LOST);
    matches_reference(&d, &args)?;
    std::thread::sleep(Duration::from_millis(600));
    let back = lz.dispatch(&args)?;
    assert_eq!((back.selection().kernel.as_str(), codes(&back)), (kernel.as_str(), vec![]));
    matches_reference(&back, &args)?;
    assert!(lz.health_report().backends.iter().all(|b| b.state == "closed"));
    Ok(())
}

#[test]
fn every_fault_mode_through_the_library_falls_back_to_a_correct_answer() -> TestResult {
    let args = linear(8)?;
    let (kernel, _) = healthy(&args)?;
    for mode in ["error", "panic", "hang", "nan", "oom", "device_lost", "fail_first:1"] {
        let checked = policy(r#"{"kernel_timeout_ms": 100, "validate_outputs": true}"#)?;
        let lz = LayerZero::detected()
            .and_then(|l| l.with_policy(checked))
            .and_then(|l| l.with_faults(&format!("{kernel}={mode}")))
            .map_err(|e| format!("{mode}: {e}"))?;
        let d = lz.dispatch(&args).map_err(|e| format!("{mode}: {e}"))?;
        assert!(d.fell_back(), "{mode}");
        matches_reference(&d, &args)?;
    }
    Ok(())
}

#[test]
fn a_drill_under_lz_generate_still_generates_the_healthy_tokens() -> TestResult {
    let model = repo_root().join("tests/models/llama-gqa");
    let generate = |faults: Option<&str>| -> TestResult<serde_json::Value> {
        let mut cmd = lz()?;
        if let Some(f) = faults {
            cmd.env("LAYERZERO_FAULTS", f);
        }
        let o = cmd
            .args(["generate", "--model", model.to_str().unwrap_or_default(), "--prompt-ids", "1,2,3"])
            .args(["--max-new-tokens", "4", "--json"])
            .output()?;
        assert_eq!(o.status.code(), Some(0), "{faults:?}: {}", String::from_utf8_lossy(&o.stderr));
        Ok(serde_json::from_slice(&o.stdout)?)
    };
    let healthy = generate(None)?["generated_ids"].clone();
    for mode in ["nan", "device_lost"] {
        let v = generate(Some(&format!("cpu.linear.fast={mode}")))?;
        assert_eq!(v["generated_ids"], healthy, "{mode}");
        assert!(v["counters"]["fallbacks"].as_u64().is_some_and(|n| n > 0), "{mode}: {}", v["counters"]);
    }
    Ok(())
}

#[test]
fn requests_a_kernel_would_refuse_at_run_time_are_refused_at_selection_naming_the_field() -> TestResult {
    let lz = LayerZero::detected()?;
    let t = |dtype: &str, shape: &[u64]| serde_json::json!({"dtype": dtype, "shape": shape});
    let bshd = |b: u64| serde_json::json!({"dtype": "f32", "shape": [b, 12, 4, 32], "layout": "BSHD"});
    let ragged = |k_batch: u64, cu_k: u64| {
        serde_json::json!({"op": "attention", "tensors": {
            "q": bshd(1), "k": bshd(k_batch), "v": bshd(k_batch),
            "cu_seqlens_q": t("i32", &[3]), "cu_seqlens_k": t("i32", &[cu_k])}})
    };
    for (what, req, says) in [
        (
            "sample over rank-3 logits",
            serde_json::json!({"op": "sample", "tensors": {"logits": t("f32", &[2, 3, 64])}, "attrs": {}}),
            "tensor `logits` has rank 3",
        ),
        (
            "top_k above the experts",
            serde_json::json!({"op": "moe_route", "tensors": {"logits": t("f32", &[4, 8])}, "attrs": {"top_k": 9}}),
            "attrs.top_k is 9",
        ),
        (
            "top_k of 0",
            serde_json::json!({"op": "moe_route", "tensors": {"logits": t("f32", &[4, 8])}, "attrs": {"top_k": 0}}),
            "attrs.top_k is 0",
        ),
        (
            "an odd rotary_dim",
            serde_json::json!({"op": "rope", "tensors": {"q": t("f32", &[1, 4, 2, 64])}, "attrs": {"rotary_dim": 33}}),
            "attrs.rotary_dim is 33",
        ),
        (
            "a rotary_dim above head_dim",
            serde_json::json!({"op": "rope", "tensors": {"q": t("f32", &[1, 4, 2, 64])}, "attrs": {"rotary_dim": 128}}),
            "attrs.rotary_dim is 128",
        ),
        (
            "an i8 output of linear_w8a8",
            serde_json::json!({"op": "linear_w8a8", "tensors": {"x": t("i8", &[4, 64]), "weight": t("i8", &[32, 64])},
                "attrs": {"out_dtype": "i8"}}),
            "attrs.out_dtype is i8",
        ),
        ("ragged k with a batch of 2", ragged(2, 3), "k batch is 2"),
        ("cu_seqlens of different lengths", ragged(1, 4), "tensor `cu_seqlens_k` has shape [4]"),
    ] {
        let req =
            layerzero::model::request::Request::from_json(&req.to_string()).map_err(|e| format!("{what}: {e}"))?;
        let err = lz.select(&req).err().ok_or_else(|| format!("{what} must be refused"))?;
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{what}: {err}");
        assert!(
            err.reasons().iter().any(|r| r.code() == ReasonCode::INVALID_REQUEST && r.message().contains(says)),
            "{what}: expected {says:?} in {err}"
        );
    }
    let fine =
        serde_json::json!({"op": "rope", "tensors": {"q": t("f32", &[1, 4, 2, 64])}, "attrs": {"rotary_dim": 32}});
    let fine = layerzero::model::request::Request::from_json(&fine.to_string())?;
    assert!(lz.select(&fine).is_ok(), "a partial even rotary_dim is served");
    Ok(())
}

#[test]
fn a_kernel_of_a_loaded_backend_without_an_executor_is_refused_on_the_host_until_one_is_registered() -> TestResult {
    // A builtin backend of one kernel LayerZero has no executor for (`execution: external`),
    // as the oneDNN Graph SDPA kernel is.
    let kernel =
        Kernel::shipped("cpu", "cpu.linear.fast")?.with("id", "mine.linear.fast").with("execution", "external");
    let catalog = Backend::new("mine", "cpu").kernel(kernel).catalog()?;
    let args = linear(8)?;
    let lz = LayerZero::detected_with(catalog)?;
    let report = lz.explain(&args.describe());
    let mine = report.candidate("mine.linear.fast").ok_or("no candidate")?;
    assert_eq!(mine.reasons.first().map(|r| r.code()), Some(ReasonCode::EXECUTOR_NOT_REGISTERED), "{:?}", mine.reasons);
    assert!(lz.dispatch(&args).is_err(), "nothing else in this catalog can run it");
    let lz = lz.register("mine.linear.fast", builtin("cpu.linear.fast")?)?;
    let d = lz.dispatch(&args).map_err(|e| format!("registered, it runs: {e}"))?;
    assert_eq!(d.selection().kernel, "mine.linear.fast");
    matches_reference(&d, &args)?;
    Ok(())
}
