//! E2E spec §20 and §24 through `lz readiness-check`: a capabilities file of another schema
//! version is refused naming the version found and the one read, an invalid capabilities
//! file fails readiness closed with the check named, and a table or a policy lock needing a
//! kernel this host cannot run fails the `kernels` / `policy_kernels` check naming the kernel.

use std::path::Path;

use layerzero::capabilities::catalog::Catalog;
use layerzero::schema::{SchemaKind, violations};
use layerzero_tests::{TestResult, repo_root};

use crate::cli::run;
use crate::cli_plans::failed;

/// `lz readiness-check --json` with `args`: the exit code and the report, schema-checked.
fn readiness(args: &[&str]) -> TestResult<(i32, serde_json::Value)> {
    let mut all = vec!["readiness-check", "--json"];
    all.extend_from_slice(args);
    let (code, out, err) = run(&all)?;
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}{err}"))?;
    assert!(violations(SchemaKind::ReadinessReport, &v).unwrap_or_default().is_empty(), "{v}");
    Ok((code, v))
}

/// A folder holding the shipped `cpu_reference` capabilities and `file` as `extra.json`.
fn capabilities_with(dir: &Path, file: &str) -> TestResult<String> {
    let caps = dir.join("caps");
    std::fs::create_dir_all(&caps)?;
    std::fs::copy(repo_root().join("capabilities/cpu_reference.json"), caps.join("cpu_reference.json"))?;
    std::fs::write(caps.join("extra.json"), file)?;
    Ok(caps.display().to_string())
}

#[test]
fn section_20_a_capabilities_file_of_another_schema_version_is_refused_naming_both_versions() -> TestResult {
    // The fixture is a backend's file declaring schema version 0.
    let v0 = repo_root().join("tests/data/capabilities_v0");
    let e = Catalog::load_dir(&v0).err().ok_or("a version-0 capabilities file must be refused")?.to_string();
    assert!(e.contains("zendnn.json") && e.contains("capabilities schema version 0"), "{e}");
    assert!(e.contains("this build reads schema version 1"), "{e}");
    // A newer version is refused too, saying to upgrade rather than to rewrite.
    let mut newer: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(v0.join("zendnn.json"))?)?;
    newer["schema_version"] = serde_json::json!(2);
    let dir = tempfile::tempdir()?;
    let caps = capabilities_with(dir.path(), &newer.to_string())?;
    let (code, v) = readiness(&["--capabilities", &caps])?;
    assert_eq!((code, &v["ready"]), (1, &serde_json::json!(false)), "{v}");
    let detail = failed(&v, "capabilities")?["detail"].as_str().unwrap_or_default().to_owned();
    assert!(detail.contains("extra.json") && detail.contains("schema version 2"), "{detail}");
    assert!(detail.contains("upgrade layerzero") && detail.contains("reads schema version 1"), "{detail}");
    Ok(())
}

#[test]
fn section_20_readiness_fails_closed_on_an_invalid_capabilities_file() -> TestResult {
    let dir = tempfile::tempdir()?;
    let v0 = std::fs::read_to_string(repo_root().join("tests/data/capabilities_v0/zendnn.json"))?;
    let mut broken: serde_json::Value = serde_json::from_str(&v0)?;
    broken["schema_version"] = serde_json::json!(1);
    broken["kernels"][0]["constraints"]["dtypes"] = serde_json::json!("f32");
    for (file, says) in [("{ not json", "invalid JSON"), (broken.to_string().as_str(), "/kernels/0/constraints/dtypes")]
    {
        let caps = capabilities_with(&dir.path().join(says.replace('/', "_")), file)?;
        let (code, v) = readiness(&["--capabilities", &caps])?;
        assert_eq!(code, 1, "{v}");
        assert_eq!(v["ready"], false);
        let c = failed(&v, "capabilities")?;
        let detail = c["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("extra.json") && detail.contains(says), "{c}");
        assert!(c["fix"].as_str().is_some_and(|f| f.contains("lz validate")), "{c}");
        // The human report names the failed check too, and still exits 1.
        let (code, out, err) = run(&["readiness-check", "--capabilities", &caps])?;
        assert_eq!(code, 1, "{out}{err}");
        assert!(out.contains("capabilities") && out.contains("extra.json"), "{out}");
    }
    Ok(())
}

#[test]
fn section_24_a_table_needing_a_kernel_this_host_cannot_run_fails_the_kernels_check_naming_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = |n: &str| dir.path().join(n).display().to_string();
    std::fs::write(
        dir.path().join("w.json"),
        r#"{"schema_version": 1, "name": "gate", "entries": [{"name": "norm", "request": {"op": "rms_norm",
            "tensors": {"x": {"dtype": "f32", "shape": [4, 256]}, "weight": {"dtype": "f32", "shape": [256]}},
            "attrs": {"eps": 1e-6}}, "ranges": {"tokens": [1, 64]}}]}"#,
    )?;
    let (code, out, err) = run(&["solve", "--workload", &path("w.json"), "--no-perfdb", "--out", &path("t.json")])?;
    assert_eq!(code, 0, "{out}{err}");
    let (code, v) = readiness(&["--table", &path("t.json"), "--perfdb", &path("db.sqlite")])?;
    assert_eq!(code, 0, "the table as solved is ready: {v}");
    // The same table as a host with Liger (a CUDA backend) would have solved it: its first
    // bucket needs liger.rms_norm.triton, which this host cannot run.
    let mut table: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path("t.json"))?)?;
    table["entries"][0]["kernel"] = serde_json::json!("liger.rms_norm.triton");
    table["entries"][0]["backend"] = serde_json::json!("liger");
    std::fs::write(path("t.json"), table.to_string())?;
    let (code, v) = readiness(&["--table", &path("t.json"), "--perfdb", &path("db.sqlite")])?;
    assert_eq!((code, &v["ready"]), (1, &serde_json::json!(false)), "{v}");
    let c = failed(&v, "kernels")?;
    let detail = c["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("liger.rms_norm.triton") && detail.contains("DEVICE_KIND_MISMATCH"), "{c}");
    assert!(c["fix"].as_str().is_some_and(|f| f.contains("re-solve")), "{c}");
    let (code, out, err) = run(&["readiness-check", "--table", &path("t.json"), "--perfdb", &path("db.sqlite")])?;
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("kernels") && out.contains("liger.rms_norm.triton"), "{out}");
    Ok(())
}

#[test]
fn section_24_a_policy_locking_a_kernel_this_host_lacks_fails_readiness_naming_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let check = |name: &str, policy: &str| -> TestResult<(i32, serde_json::Value)> {
        let path = dir.path().join(name);
        std::fs::write(&path, policy)?;
        let db = dir.path().join("db.sqlite").display().to_string();
        readiness(&["--policy", &path.display().to_string(), "--perfdb", &db])
    };
    // ZenDNN's matmul is declared, but no ZenDNN library is in this process.
    let (code, v) = check("zendnn.json", r#"{"rules": [{"action": "lock", "kernels": "zendnn.linear.matmul"}]}"#)?;
    assert_eq!((code, &v["ready"]), (1, &serde_json::json!(false)), "{v}");
    let c = failed(&v, "policy_kernels")?;
    let detail = c["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("rules[0] locks zendnn.linear.matmul (BACKEND_NOT_INSTALLED"), "{c}");
    assert!(c["fix"].as_str().is_some_and(|f| f.contains("install the backend")), "{c}");
    // A lock this host can serve passes; one scoped to CUDA devices asks nothing of a CPU host.
    let (code, v) = check("cpu.json", r#"{"rules": [{"action": "lock", "kernels": "cpu.linear.fast"}]}"#)?;
    let passed = v["checks"].as_array().and_then(|cs| cs.iter().find(|c| c["name"] == "policy_kernels")).cloned();
    assert_eq!((code, passed.map(|c| c["ok"].clone())), (0, Some(serde_json::json!(true))), "{v}");
    let cuda_only =
        r#"{"rules": [{"action": "lock", "kernels": "liger.rms_norm.triton", "when": {"device": ["cuda"]}}]}"#;
    let on_gpu_host = layerzero::LayerZero::detected()?.hardware().devices.iter().any(|d| d.kind.as_str() == "cuda");
    if !on_gpu_host {
        let (code, v) = check("cuda.json", cuda_only)?;
        assert_eq!(code, 0, "{v}");
        assert!(v["checks"].as_array().is_some_and(|cs| cs.iter().all(|c| c["name"] != "policy_kernels")), "{v}");
    }
    Ok(())
}
