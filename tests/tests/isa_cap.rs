//! `LAYERZERO_CPU_ISA` (issue 14, item 2): one machine runs another's paths. Detection drops
//! the features above the cap, the `cpu` kernels and oneDNN (when the tests have it) take
//! the capped code paths, and every executable kernel still passes parity at every cap.

use layerzero_tests::{TestResult, lz};

/// `lz` with the cap, and oneDNN when the test environment names it.
fn capped(cap: &str) -> TestResult<assert_cmd::Command> {
    let mut c = lz()?;
    c.env("LAYERZERO_CPU_ISA", cap);
    if let Some(lib) = std::env::var_os("LAYERZERO_TEST_ONEDNN_LIB") {
        c.env("LAYERZERO_ONEDNN_LIB", lib);
    }
    Ok(c)
}

fn cpu_isa(cap: &str) -> TestResult<Vec<String>> {
    let o = capped(cap)?.args(["hardware", "--json"]).output()?;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let cpu = v["devices"].as_array().into_iter().flatten().find(|d| d["kind"] == "cpu").cloned().unwrap_or_default();
    Ok(cpu["isa"].as_array().into_iter().flatten().filter_map(|f| f.as_str().map(str::to_owned)).collect())
}

#[test]
fn detection_reports_no_feature_above_the_cap() -> TestResult {
    let native = cpu_isa("native")?;
    let has = |isa: &[String], f: &str| isa.iter().any(|x| x == f);
    let avx2 = cpu_isa("avx2")?;
    assert!(avx2.iter().all(|f| ["sse4_2", "avx", "avx2", "fma", "f16c"].contains(&f.as_str())), "{avx2:?}");
    let avx512 = cpu_isa("avx512")?;
    assert!(!has(&avx512, "avx512_bf16") && !has(&avx512, "amx_bf16"), "{avx512:?}");
    assert_eq!(has(&avx512, "avx512f"), has(&native, "avx512f"), "the cap removes, never adds: {avx512:?}");
    let bf16 = cpu_isa("avx512_bf16")?;
    assert!(!bf16.iter().any(|f| f.starts_with("amx")), "{bf16:?}");
    assert_eq!(has(&bf16, "avx512_bf16"), has(&native, "avx512_bf16"));
    Ok(())
}

#[test]
fn an_unknown_cap_is_reported_with_the_values_it_takes_and_caps_nothing() -> TestResult {
    let o = capped("avx-512")?.args(["doctor", "--json"]).output()?;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let knob = v["knobs"].as_array().into_iter().flatten().find(|k| k["name"] == "LAYERZERO_CPU_ISA").cloned();
    let error = knob.as_ref().map(|k| k["error"].to_string()).unwrap_or_default();
    assert!(error.contains("avx-512") && error.contains("avx512_bf16"), "{knob:?}");
    assert_eq!(v["ok"], false, "an invalid knob makes doctor fail");
    assert_eq!(cpu_isa("avx-512")?, cpu_isa("native")?);
    Ok(())
}

#[test]
fn every_executable_kernel_passes_parity_at_every_cap() -> TestResult {
    for cap in ["portable", "avx2", "avx512", "avx512_bf16"] {
        let o = capped(cap)?.args(["parity", "--json"]).output()?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).map_err(|e| format!("{cap}: {e}"))?;
        let failing: Vec<String> = v["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["status"] != "pass" && r["status"] != "skip")
            .map(|r| format!("{} {} {}", r["case"], r["kernel"], r["status"]))
            .collect();
        assert!(failing.is_empty(), "LAYERZERO_CPU_ISA={cap}:\n{}", failing.join("\n"));
        assert_eq!(o.status.code(), Some(0), "{cap}");
        let passed = v["rows"].as_array().into_iter().flatten().filter(|r| r["status"] == "pass").count();
        assert!(passed > 200, "LAYERZERO_CPU_ISA={cap}: only {passed} cases passed");
    }
    Ok(())
}
