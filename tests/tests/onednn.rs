//! oneDNN loaded at run time (issue 13, item 1): found through LAYERZERO_ONEDNN_LIB, the
//! loader's paths or the Python environment; absent, it says every path it tried; present,
//! its version gates the kernels whose facts were checked against other versions.
//!
//! `.ci/run` installs the `onednn-cpu-gomp` wheel and names the library in
//! `LAYERZERO_TEST_ONEDNN_LIB`, so the tests that need it run in CI.

use std::sync::Arc;

use layerzero::ReasonCode;
use layerzero::capabilities::catalog::Catalog;
use layerzero::hardware::named;
use layerzero::model::op::Op;
use layerzero::policy::Policy;
use layerzero::select::{Availability, LoadedLibrary, Selector};
use layerzero_tests::catalog::{Backend, Kernel};
use layerzero_tests::{TestResult, lz};
use serde_json::json;

fn linear_request(dir: &std::path::Path) -> TestResult<String> {
    let p = dir.join("linear.json");
    std::fs::write(
        &p,
        r#"{"op":"linear","tensors":{"x":{"dtype":"f32","shape":[8,64]},"weight":{"dtype":"f32","shape":[48,64]}}}"#,
    )?;
    Ok(p.display().to_string())
}

fn onednn_candidate(out: &[u8]) -> TestResult<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(out)?;
    Ok(v["candidates"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["kernel"] == "onednn.linear.matmul")
        .cloned()
        .unwrap_or_default())
}

#[test]
fn a_library_that_is_not_there_is_reported_with_every_path_tried() -> TestResult {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("nowhere/libdnnl.so.3").display().to_string();
    let venv = dir.path().join("venv").display().to_string();
    let o = lz()?
        .env("LAYERZERO_ONEDNN_LIB", &missing)
        .env("VIRTUAL_ENV", &venv)
        .env_remove("CONDA_PREFIX")
        .args(["explain", "--request", &linear_request(dir.path())?, "--json"])
        .output()?;
    let c = onednn_candidate(&o.stdout)?;
    let reasons = c["reasons"].to_string();
    if !reasons.contains("BACKEND_NOT_INSTALLED") {
        eprintln!("oneDNN is on this machine's loader path: the not-installed report cannot be shown here");
        return Ok(());
    }
    for path in [missing.as_str(), "libdnnl.so.3", "libdnnl.so.2", &format!("{venv}/lib/libdnnl.so.3")] {
        assert!(reasons.contains(path), "{path} is not among the paths tried: {reasons}");
    }
    Ok(())
}

#[test]
fn the_loaded_version_is_shown_by_doctor_and_gates_kernels_checked_against_others() -> TestResult {
    let Some(lib) = std::env::var_os("LAYERZERO_TEST_ONEDNN_LIB") else {
        eprintln!("LAYERZERO_TEST_ONEDNN_LIB is not set: oneDNN is not installed here (.ci/run installs it)");
        return Ok(());
    };
    let o = lz()?.env("LAYERZERO_ONEDNN_LIB", &lib).args(["doctor", "--json"]).output()?;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let b =
        v["backends"].as_array().into_iter().flatten().find(|b| b["backend"] == "onednn").cloned().unwrap_or_default();
    assert_eq!(b["status"], "available", "{b}");
    let version = b["library"]["version"].as_str().unwrap_or_default().to_owned();
    assert!(version.starts_with("3."), "{b}");
    assert_eq!(b["library"]["path"], lib.to_string_lossy().as_ref());
    assert!(b["library"]["isa"].is_string(), "the JIT's instruction set is shown: {b}");
    let dir = tempfile::tempdir()?;
    let o = lz()?
        .env("LAYERZERO_ONEDNN_LIB", &lib)
        .args(["explain", "--request", &linear_request(dir.path())?, "--json"])
        .output()?;
    let c = onednn_candidate(&o.stdout)?;
    assert!(!c["reasons"].to_string().contains("BACKEND_NOT_INSTALLED"), "{c}");
    Ok(())
}

/// A backend loaded at run time whose two kernels were checked against 3.2–4 and 3.14–4.
fn versioned() -> TestResult<Arc<Catalog>> {
    let k = |id: &str, min: &str| {
        let versions = json!({"min": min, "below": "4.0.0"});
        Kernel::new(id, Op::Linear).with("library_versions", versions).constraints(json!({"dtypes": ["f32"]}))
    };
    let dnn = Backend::new("dnn", "cpu").with("version", "3").with("execution", "dynamic_library");
    let dnn = dnn.with("probe", json!({"libraries": ["libdnnl.so.3"], "loader": "onednn"}));
    dnn.kernel(k("dnn.linear.old", "3.2.0").property("needs_jit", true))
        .kernel(k("dnn.linear.new", "3.14.0").property("needs_jit", true))
        .catalog()
}

#[test]
fn a_loaded_version_outside_a_kernels_range_rejects_it_naming_both() -> TestResult {
    let catalog = versioned()?;
    let hw = Arc::new(named::load("zen4")?);
    let req = layerzero::Request::from_json(
        r#"{"op":"linear","tensors":{"x":{"dtype":"f32","shape":[8,64]},"weight":{"dtype":"f32","shape":[48,64]}}}"#,
    )?;
    for (loaded, old_ok, new_ok) in [("3.2.0", true, false), ("3.14.1", true, true), ("4.0.0", false, false)] {
        let mut a = Availability::planning(&catalog);
        a.set_library("dnn", LoadedLibrary { path: "/lib/libdnnl.so.3".into(), version: loaded.into(), isa: None });
        let sel = Selector::new(catalog.clone(), hw.clone(), Arc::new(Policy::default()), Arc::new(a))?;
        let report = sel.explain(&req);
        for (kernel, ok) in [("dnn.linear.old", old_ok), ("dnn.linear.new", new_ok)] {
            let c = report.candidate(kernel).ok_or_else(|| format!("{kernel} is not a candidate"))?;
            let why = c.reasons.iter().find(|r| r.code() == ReasonCode::BACKEND_VERSION_UNSUPPORTED);
            assert_eq!(why.is_none(), ok, "{loaded} {kernel}: {:?}", c.reasons);
            if let Some(r) = why {
                assert!(r.message().contains(loaded) && r.message().contains(kernel), "{r}");
            }
        }
    }
    let upside_down = json!({"min": "4.0.0", "below": "3.0.0"});
    let bad = Backend::new("dnn", "cpu")
        .with("version", "3")
        .kernel(Kernel::new("dnn.linear.x", Op::Linear).with("library_versions", upside_down));
    let err = bad.catalog().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("library_versions"), "{err}");
    Ok(())
}

#[test]
fn with_the_library_the_matmul_runs_and_passes_parity_against_the_oracle() -> TestResult {
    let Some(lib) = std::env::var_os("LAYERZERO_TEST_ONEDNN_LIB") else {
        eprintln!("LAYERZERO_TEST_ONEDNN_LIB is not set: oneDNN is not installed here (.ci/run installs it)");
        return Ok(());
    };
    let o = lz()?
        .env("LAYERZERO_ONEDNN_LIB", &lib)
        .args(["parity", "--kernel", "onednn.linear.matmul", "--json"])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(o.status.code(), Some(0), "{v}");
    let rows: Vec<&serde_json::Value> = v["rows"].as_array().into_iter().flatten().collect();
    assert!(rows.iter().all(|r| r["status"] == "pass" || r["status"] == "skip"), "{v}");
    let isa = host_isa()?;
    for want in ["_nt/f32", "_nn/f32", "_nt/bf16", "_nn/bf16"] {
        ran_where_it_can("onednn.linear.matmul", &rows, want, &isa);
    }
    Ok(())
}

/// The ISA features this host's CPU reports (`lz hardware --json`).
fn host_isa() -> TestResult<Vec<String>> {
    let o = lz()?.args(["hardware", "--json"]).output()?;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let cpu = v["devices"].as_array().into_iter().flatten().find(|d| d["kind"] == "cpu").ok_or("no cpu device")?;
    Ok(cpu["isa"].as_array().into_iter().flatten().filter_map(|f| f.as_str().map(str::to_owned)).collect())
}

/// Whether oneDNN computes `dtype` on a CPU with `isa`: its gate, as `capabilities/onednn.json`
/// declares it (`platform::has_data_type_support`): bf16 needs avx512_core (AVX-512 F, BW, VL,
/// DQ), f16 avx512_core_fp16.
fn dtype_runs_on(dtype: &str, isa: &[String]) -> bool {
    let has = |f: &str| isa.iter().any(|x| x == f);
    let avx512_core = ["avx512f", "avx512bw", "avx512vl", "avx512dq"].iter().all(|f| has(f));
    match dtype {
        "bf16" => avx512_core,
        "f16" => avx512_core && has("avx512_fp16"),
        _ => true,
    }
}

/// Asserts that a case named like `want` passed where this CPU runs its dtype, and that the
/// cases of a dtype it does not run were refused for the hardware, not skipped for another
/// reason.
fn ran_where_it_can(kernel: &str, rows: &[&serde_json::Value], want: &str, isa: &[String]) {
    let named: Vec<&&serde_json::Value> =
        rows.iter().filter(|r| r["case"].as_str().is_some_and(|c| c.contains(want))).collect();
    // A quantized case computes in the dtype its name ends with (`..._per_tensor_bf16`).
    let case = named.first().and_then(|r| r["case"].as_str()).unwrap_or_default();
    let dtype = ["bf16", "f16"].into_iter().find(|d| case.ends_with(d)).unwrap_or("f32");
    if dtype_runs_on(dtype, isa) {
        let passed = named.iter().any(|r| r["status"] == "pass");
        assert!(passed, "{kernel}: {want} did not pass: {named:?}");
    } else {
        let refused = |r: &&&serde_json::Value| {
            r["status"] == "skip" && r["detail"].as_str().is_some_and(|d| d.contains("DTYPE_UNSUPPORTED_ON_HARDWARE"))
        };
        assert!(!named.is_empty() && named.iter().all(refused), "{kernel}: {want} on {isa:?}: {named:?}");
    }
}

#[test]
fn every_onednn_kernel_with_an_executor_passes_parity_against_the_oracle() -> TestResult {
    let Some(lib) = std::env::var_os("LAYERZERO_TEST_ONEDNN_LIB") else {
        eprintln!("LAYERZERO_TEST_ONEDNN_LIB is not set: oneDNN is not installed here (.ci/run installs it)");
        return Ok(());
    };
    let isa = host_isa()?;
    for (kernel, must_pass) in [
        ("onednn.linear_w8a8.matmul", &["17x256x33", "per_tensor_bf16"][..]),
        ("onednn.layer_norm.lnorm", &["_bias/f32", "_bias/bf16", "/f16"]),
        ("onednn.gelu.eltwise", &["erf/f32", "tanh/f32", "erf/bf16"]),
        ("onednn.silu.eltwise", &["silu/f32", "silu/bf16"]),
        ("onednn.swiglu.eltwise_mul", &["separate/f32", "separate/bf16"]),
        ("onednn.geglu.eltwise_mul", &["separate/f16", "separate/bf16"]),
    ] {
        let o = lz()?.env("LAYERZERO_ONEDNN_LIB", &lib).args(["parity", "--kernel", kernel, "--json"]).output()?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).map_err(|e| format!("{kernel}: {e}"))?;
        assert_eq!(o.status.code(), Some(0), "{kernel}: {v}");
        let rows: Vec<&serde_json::Value> = v["rows"].as_array().into_iter().flatten().collect();
        for want in must_pass {
            ran_where_it_can(kernel, &rows, want, &isa);
        }
    }
    Ok(())
}

/// A workload whose buckets oneDNN serves (the other CPU backends denied).
fn onednn_workload(dir: &std::path::Path) -> TestResult<String> {
    let p = dir.join("warm.json");
    let w = json!({"schema_version": 1, "name": "warm", "entries": [
        {"name": "linear", "request": {"op": "linear", "tensors": {
            "x": {"dtype": "f32", "shape": [1, 96]}, "weight": {"dtype": "f32", "shape": [40, 96], "layout": "NT"}}},
         "ranges": {"m": [1, 40]}},
        {"name": "layer_norm", "request": {"op": "layer_norm", "tensors": {
            "x": {"dtype": "f32", "shape": [1, 128]}, "weight": {"dtype": "f32", "shape": [128]},
            "bias": {"dtype": "f32", "shape": [128]}}}, "ranges": {"tokens": [1, 40]}},
        {"name": "silu", "request": {"op": "silu", "tensors": {"x": {"dtype": "f32", "shape": [1, 64]}}},
         "ranges": {"tokens": [1, 20]}}
    ]});
    std::fs::write(&p, w.to_string())?;
    Ok(p.display().to_string())
}

#[test]
fn warm_up_compiles_every_bucket_so_another_size_of_it_compiles_nothing() -> TestResult {
    let Some(lib) = std::env::var_os("LAYERZERO_TEST_ONEDNN_LIB") else {
        eprintln!("LAYERZERO_TEST_ONEDNN_LIB is not set: oneDNN is not installed here (.ci/run installs it)");
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let o = lz()?
        .env("LAYERZERO_ONEDNN_LIB", &lib)
        .env("LAYERZERO_DENY", "cpu*")
        .args(["warmup", "--workload", &onednn_workload(dir.path())?, "--verify", "--json"])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(o.status.code(), Some(0), "{v}");
    let items: Vec<&serde_json::Value> = v["warmup"]["items"].as_array().into_iter().flatten().collect();
    assert_eq!(items.len(), 7 + 7 + 6, "one item per bucket: {v}");
    assert!(items.iter().all(|i| i["kernel"].as_str().is_some_and(|k| k.starts_with("onednn."))), "{v}");
    // The matmul's m is a runtime dim: one compilation serves its seven buckets; the row-wise
    // kernels compile one power-of-two chunk per size up to each bucket's bound.
    let compiled = |entry: &str| -> u64 {
        items.iter().filter(|i| i["entry"] == entry).filter_map(|i| i["compiled"].as_u64()).sum()
    };
    assert_eq!(compiled("linear"), 1, "{v}");
    assert_eq!(compiled("layer_norm"), 6, "chunks 1..=32 for rows up to 40: {v}");
    assert_eq!(compiled("silu"), 5, "chunks 1..=16 for rows up to 20: {v}");
    assert_eq!(v["verify"]["requests"], 20, "{v}");
    assert_eq!(v["verify"]["compiled"], 0, "no compilation on the first request within a bucket: {v}");
    assert_eq!(v["cold"].as_array().map(Vec::len), Some(0), "{v}");
    Ok(())
}

#[test]
fn readiness_can_require_every_jit_bucket_of_the_table_to_be_warm() -> TestResult {
    let Some(lib) = std::env::var_os("LAYERZERO_TEST_ONEDNN_LIB") else {
        eprintln!("LAYERZERO_TEST_ONEDNN_LIB is not set: oneDNN is not installed here (.ci/run installs it)");
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let table = dir.path().join("table.json").display().to_string();
    let cmd = || -> TestResult<assert_cmd::Command> {
        let mut c = lz()?;
        c.env("LAYERZERO_ONEDNN_LIB", &lib).env("LAYERZERO_DENY", "cpu*");
        Ok(c)
    };
    let solved =
        cmd()?.args(["solve", "--workload", &onednn_workload(dir.path())?, "--out", &table, "--no-perfdb"]).output()?;
    assert_eq!(solved.status.code(), Some(0), "{}", String::from_utf8_lossy(&solved.stderr));
    let jit = |extra: &[&str]| -> TestResult<(Option<i32>, serde_json::Value)> {
        let o = cmd()?.args(["readiness-check", "--table", &table, "--json"]).args(extra).output()?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
        let check = v["checks"].as_array().into_iter().flatten().find(|c| c["name"] == "jit").cloned();
        Ok((o.status.code(), check.unwrap_or_default()))
    };
    let (code, check) = jit(&[])?;
    assert_eq!((code, &check["ok"]), (Some(0), &json!(true)), "warmth is not required by default: {check}");
    let (code, check) = jit(&["--require-warm"])?;
    assert_eq!((code, &check["ok"]), (Some(1), &json!(false)), "{check}");
    assert!(check["detail"].as_str().is_some_and(|d| d.contains("layer_norm") && d.contains("onednn.")), "{check}");
    let (code, check) = jit(&["--require-warm", "--warmup"])?;
    assert_eq!((code, &check["ok"]), (Some(0), &json!(true)), "{check}");
    Ok(())
}

#[test]
fn list_kernels_says_which_onednn_kernels_run_in_this_process() -> TestResult {
    let dir = tempfile::tempdir()?;
    let lib = std::env::var_os("LAYERZERO_TEST_ONEDNN_LIB")
        .unwrap_or_else(|| dir.path().join("absent/libdnnl.so.3").into_os_string());
    let o = lz()?.env("LAYERZERO_ONEDNN_LIB", &lib).args(["list-kernels", "--backend", "onednn", "--json"]).output()?;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let runs = |id: &str| {
        v["kernels"].as_array().into_iter().flatten().find(|k| k["kernel"] == id).map(|k| k["executable"].clone())
    };
    // Without the test library the answer depends on what the machine's loader finds.
    if std::env::var_os("LAYERZERO_TEST_ONEDNN_LIB").is_some() {
        for id in [
            "onednn.linear.matmul",
            "onednn.linear_w8a8.matmul",
            "onednn.layer_norm.lnorm",
            "onednn.swiglu.eltwise_mul",
        ] {
            assert_eq!(runs(id), Some(json!(true)), "{id}: {v}");
        }
    }
    assert_eq!(runs("onednn.attention.sdpa_graph"), Some(json!(false)), "the SDPA pattern has no executor: {v}");
    Ok(())
}

/// In-process tests: they need oneDNN loaded by this test process (`.ci/run` runs
/// `in_process` and the fixtures again with LAYERZERO_ONEDNN_LIB set, one test at a time).
fn in_process_matmul() -> TestResult<Option<Arc<dyn layerzero::exec::executor::Executor>>> {
    if std::env::var_os("LAYERZERO_ONEDNN_LIB").is_none() {
        eprintln!("LAYERZERO_ONEDNN_LIB is not set in this process: .ci/run runs this test with it");
        return Ok(None);
    }
    let r = layerzero::builtin_registry();
    Ok(Some(r.get("onednn.linear.matmul").cloned().ok_or("oneDNN did not load in-process")?))
}

#[test]
fn in_process_a_weight_is_packed_once_and_a_shape_compiled_once_however_many_calls() -> TestResult {
    use layerzero::backend::onednn::{jit_stats, packed_stats};
    use layerzero::exec::args::{LinearArgs, OpArgs};
    use layerzero::model::attrs::NoAttrs;
    use layerzero::model::dtype::DType;
    use layerzero::tensor::HostTensor;
    let Some(exec) = in_process_matmul()? else { return Ok(()) };
    let t = |shape: &[usize], seed: f32| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| ((i as f32 * 0.37 + seed).sin()) * 0.1).collect();
        HostTensor::from_f32_as(DType::BF16, shape, &v)
    };
    let weight = t(&[96, 160], 1.0)?;
    let (jit0, packed0) = (jit_stats(), packed_stats());
    for m in [1usize, 7, 33, 7, 1] {
        let args =
            OpArgs::Linear(LinearArgs { x: t(&[m, 160], 2.0)?, weight: weight.clone(), bias: None, attrs: NoAttrs {} });
        let out = exec.run(&args).map_err(|e| format!("m = {m}: {e}"))?;
        assert_eq!(out.get("out").map(|o| o.shape().to_vec()), Some(vec![m, 96]));
    }
    let (jit1, packed1) = (jit_stats(), packed_stats());
    assert_eq!(jit1.compiled - jit0.compiled, 1, "m is a runtime dim: one primitive for every m");
    assert_eq!(packed1.packs - packed0.packs, 1, "the weight is packed on the first call only");
    drop(weight);
    // A weight that is gone is let go when the next one is packed.
    let other = OpArgs::Linear(LinearArgs {
        x: t(&[2, 160], 3.0)?,
        weight: t(&[96, 160], 4.0)?,
        bias: None,
        attrs: NoAttrs {},
    });
    exec.run(&other)?;
    assert_eq!(
        packed_stats().entries,
        packed1.entries,
        "the dropped weight's packing was released: {:?}",
        packed_stats()
    );
    Ok(())
}

#[test]
fn in_process_the_kernels_bound_when_the_library_loads_are_the_ones_listed_without_it() -> TestResult {
    if in_process_matmul()?.is_none() {
        return Ok(());
    }
    let r = layerzero::builtin_registry();
    let mut bound: Vec<&str> = r.kernels().filter(|k| k.starts_with("onednn.")).collect();
    let mut listed: Vec<&str> = layerzero::backend::onednn::kernels().collect();
    bound.sort_unstable();
    listed.sort_unstable();
    assert_eq!(bound, listed);
    Ok(())
}
