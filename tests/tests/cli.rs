//! The `lz` CLI: exit codes 0/1/2, schema-valid --json, one-line errors, never a panic.

use layerzero::schema::{SchemaKind, violations};
use layerzero_tests::{TestResult, repo_root};

pub(crate) use layerzero_tests::lz;

fn example(name: &str) -> String {
    repo_root().join("examples/requests").join(name).display().to_string()
}

pub(crate) fn run(args: &[&str]) -> TestResult<(i32, String, String)> {
    Ok(finished(lz()?.args(args).output()?))
}

fn run_stdin(args: &[&str], input: &str) -> TestResult<(i32, String, String)> {
    Ok(finished(lz()?.args(args).write_stdin(input).output()?))
}

/// Exit code (-1 when killed), stdout and stderr.
fn finished(out: std::process::Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_clean_line(stderr: &str) {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {stderr}");
    assert!(lines[0].starts_with("lz: error: "), "{stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{stderr}");
}

#[test]
fn explain_json_for_a_named_profile_is_schema_valid_and_selects() -> TestResult {
    let (code, out, err) =
        run(&["explain", "--request", &example("llama_prefill_gqa.json"), "--hardware", "h100", "--json"])?;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    assert!(violations(SchemaKind::SelectionReport, &v).unwrap_or_default().is_empty());
    assert_eq!(v["hardware"]["name"], "h100");
    assert_eq!(v["mode"], "planning");
    assert!(v["selected"].is_string());
    Ok(())
}

#[test]
fn explain_for_people_puts_the_winner_first_then_every_candidate() -> TestResult {
    let (code, out, _) = run(&["explain", "--request", &example("llama_prefill_gqa.json"), "--hardware", "h100"])?;
    assert_eq!(code, 0);
    let selected = out.lines().find(|l| l.starts_with("selected:")).unwrap_or_default();
    assert!(selected.len() > "selected:  ".len(), "{out}");
    assert!(out.contains("candidates (") && out.contains("VERDICT") && out.contains("rejected"), "{out}");
    Ok(())
}

#[test]
fn which_prints_only_the_kernel_id() -> TestResult {
    let (code, out, _) = run(&["which", "--request", &example("paged_decode.json"), "--hardware", "a100"])?;
    assert_eq!(code, 0);
    let id = out.trim();
    assert_eq!(id.split('.').count(), 3, "{out}");
    assert!(id.contains(".paged_attention."), "{out}");
    Ok(())
}

#[test]
fn which_exits_1_when_no_kernel_qualifies() -> TestResult {
    // Dropout together with soft-capping: no kernel on a T4 does both.
    let req = r#"{"op": "attention", "tensors": {"q": {"dtype": "f16", "shape": [1, 16, 8, 64], "layout": "BSHD"},
        "k": {"dtype": "f16", "shape": [1, 16, 8, 64], "layout": "BSHD"}, "v": {"dtype": "f16", "shape": [1, 16, 8, 64], "layout": "BSHD"}},
        "attrs": {"dropout_p": 0.1, "softcap": 30.0}}"#;
    let (code, out, err) = run_stdin(&["which", "--request", "-", "--hardware", "t4"], req)?;
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("no kernel qualifies"), "{err}");
    Ok(())
}

#[test]
fn malformed_json_is_one_line_and_exit_2() -> TestResult {
    let (code, _, err) = run_stdin(&["explain", "--request", "-", "--hardware", "h100"], "{\"op\": \"attention\", ")?;
    assert_eq!(code, 2);
    assert_one_clean_line(&err);
    assert!(err.contains("invalid JSON"), "{err}");
    Ok(())
}

#[test]
fn an_unknown_op_dtype_or_layout_names_the_field_and_value() -> TestResult {
    for (req, field, value) in [
        (r#"{"op": "attentoin", "tensors": {}}"#, "/op", "attentoin"),
        (r#"{"op": "attention", "tensors": {"q": {"dtype": "f64", "shape": [1]}}}"#, "/tensors/q/dtype", "f64"),
        (
            r#"{"op": "attention", "tensors": {"q": {"dtype": "f16", "shape": [1], "layout": "SBHD"}}}"#,
            "/tensors/q/layout",
            "SBHD",
        ),
        (r#"{"op": "attention", "tensors": {"q": {"dtype": "f16", "shape": [1, -4]}}}"#, "/tensors/q/shape/1", "-4"),
        (r#"{"op": "attention", "tensors": {}, "attrs": {"casual": true}}"#, "/attrs", "casual"),
    ] {
        let (code, _, err) = run_stdin(&["explain", "--request", "-", "--hardware", "h100"], req)?;
        assert_eq!(code, 2, "{req}: {err}");
        assert_one_clean_line(&err);
        assert!(err.contains(field) && err.contains(value), "{req}: {err}");
    }
    Ok(())
}

#[test]
fn an_inconsistent_request_is_an_input_error_with_invalid_request_reasons() -> TestResult {
    let req = r#"{"op": "attention", "tensors": {"q": {"dtype": "f16", "shape": [1, 16, 12, 64], "layout": "BSHD"},
        "k": {"dtype": "f16", "shape": [1, 16, 5, 64], "layout": "BSHD"}, "v": {"dtype": "f16", "shape": [1, 16, 5, 64], "layout": "BSHD"}}}"#;
    let (code, out, _) = run_stdin(&["explain", "--request", "-", "--hardware", "h100", "--json"], req)?;
    assert_eq!(code, 2);
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    assert_eq!(v["request_errors"][0]["code"], "INVALID_REQUEST");
    assert!(
        v["request_errors"][0]["message"].as_str().unwrap_or_default().contains("12 are not divisible by kv heads 5")
    );
    let (code, _, err) = run_stdin(&["explain", "--request", "-", "--hardware", "h100"], req)?;
    assert_eq!(code, 2);
    assert_one_clean_line(&err);
    Ok(())
}

#[test]
fn an_unknown_hardware_name_lists_the_shipped_profiles() -> TestResult {
    let (code, _, err) = run(&["explain", "--request", &example("rms_norm.json"), "--hardware", "h900"])?;
    assert_eq!(code, 2);
    assert_one_clean_line(&err);
    assert!(err.contains("h900") && err.contains("h100") && err.contains("zen4"), "{err}");
    Ok(())
}

#[test]
fn validate_checks_every_shipped_file_and_names_the_broken_field() -> TestResult {
    let (code, out, _) = run(&["validate"])?;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("0 invalid"), "{out}");

    let dir = tempfile::tempdir()?;
    let bad = dir.path().join("bad_caps.json");
    let mut caps: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("capabilities/flash_attn_2.json")).unwrap_or_default(),
    )
    .unwrap_or_default();
    caps["kernels"][0]["constraints"]["head_dim"]["max"] = serde_json::json!("256");
    std::fs::write(&bad, caps.to_string())?;
    let (code, out, _) = run(&["validate", bad.to_str().unwrap_or_default(), "--json"])?;
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let msg = v["files"][0]["errors"][0].as_str().unwrap_or_default();
    assert!(msg.contains("bad_caps.json") && msg.contains("/kernels/0/constraints/head_dim/max"), "{msg}");
    Ok(())
}

#[test]
fn doctor_json_is_schema_valid_and_selects_on_this_host() -> TestResult {
    let (code, out, err) = run(&["doctor", "--json"])?;
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out)?;
    assert!(violations(SchemaKind::Doctor, &v).unwrap_or_default().is_empty());
    assert_eq!(v["ok"], true);
    assert!(v["sample_selection"]["selected"].as_str().is_some_and(|k| k.starts_with("cpu.")), "{out}");
    let fa2 = v["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["backend"] == "flash_attn_2"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(fa2["status"], "not_installed");
    assert!(fa2["reason"].as_str().is_some_and(|r| !r.is_empty()));
    Ok(())
}

#[test]
fn list_kernels_filters_by_op_and_backend() -> TestResult {
    let (code, out, _) = run(&["list-kernels", "--op", "attention", "--backend", "torch_sdpa", "--json"])?;
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let ids: Vec<&str> =
        v["kernels"].as_array().map(|a| a.iter().filter_map(|k| k["kernel"].as_str()).collect()).unwrap_or_default();
    for variant in ["flash", "efficient", "cudnn", "math"] {
        assert!(ids.contains(&format!("torch_sdpa.attention.{variant}").as_str()), "{ids:?}");
    }
    assert!(ids.iter().all(|i| i.starts_with("torch_sdpa.attention.")));
    let (code, _, err) = run(&["list-kernels", "--op", "attn"])?;
    assert_eq!(code, 2);
    assert!(err.contains("attn"));
    Ok(())
}

#[test]
fn hardware_shows_a_named_profile_and_the_detected_host() -> TestResult {
    let (code, out, _) = run(&["hardware", "--hardware", "spr", "--json"])?;
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let isa = v["devices"][0]["isa"].as_array().cloned().unwrap_or_default();
    for f in ["avx512_bf16", "amx_bf16", "amx_int8"] {
        assert!(isa.contains(&serde_json::json!(f)), "{isa:?}");
    }
    let (code, out, _) = run(&["hardware", "--json"])?;
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(v["name"], "host");
    assert!(v["devices"].as_array().is_some_and(|d| d.iter().any(|d| d["kind"] == "cpu")));
    Ok(())
}

#[test]
fn every_json_output_validates_against_its_schema() -> TestResult {
    let req = example("llama_prefill_gqa.json");
    for (args, kind) in [
        (vec!["list-kernels", "--json"], SchemaKind::ListKernels),
        (vec!["which", "--request", req.as_str(), "--hardware", "h100", "--json"], SchemaKind::Which),
        (vec!["validate", "--json"], SchemaKind::Validate),
        (vec!["hardware", "--json"], SchemaKind::HardwareReport),
        (vec!["hardware", "--hardware", "mi300x", "--json"], SchemaKind::HardwareReport),
        (vec!["reason-codes", "--json"], SchemaKind::ReasonCodes),
    ] {
        let (code, out, err) = run(&args)?;
        assert_eq!(code, 0, "{args:?}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{args:?}: {e}"))?;
        let errs = violations(kind, &v)?;
        assert!(errs.is_empty(), "{args:?}: {errs:?}");
    }
    Ok(())
}

#[test]
fn usage_errors_exit_2() -> TestResult {
    let (code, _, _) = run(&["explain"])?;
    assert_eq!(code, 2);
    let (code, _, _) = run(&["frobnicate"])?;
    assert_eq!(code, 2);
    Ok(())
}

mod run {
    use super::*;
    use layerzero::compare::Category;
    use layerzero::model::dtype::DType;
    use layerzero::tensor::HostTensor;
    use layerzero_tests::close;
    use std::collections::BTreeMap;

    fn write_inputs(dir: &std::path::Path, tensors: &[(&str, HostTensor)]) -> TestResult<String> {
        let path = dir.join("in.safetensors");
        let map: BTreeMap<String, HostTensor> = tensors.iter().map(|(n, t)| ((*n).to_owned(), t.clone())).collect();
        layerzero::tensor::io::write(&path, &map)?;
        Ok(path.display().to_string())
    }

    fn seeded(shape: &[usize], seed: u64) -> TestResult<HostTensor> {
        let mut rng = layerzero::tensor::rng::Rng::new(seed);
        let n: usize = shape.iter().product();
        Ok(HostTensor::from_f32(shape, rng.normals(n))?)
    }

    const REQ: &str = r#"{"op": "attention",
        "tensors": {"q": {"dtype": "f32", "shape": [1, 37, 4, 64], "layout": "BSHD"},
                    "k": {"dtype": "f32", "shape": [1, 37, 2, 64], "layout": "BSHD"},
                    "v": {"dtype": "f32", "shape": [1, 37, 2, 64], "layout": "BSHD", "strides": [9472, 256, 128, 2]}},
        "attrs": {"causal": true}}"#;

    fn setup() -> TestResult<(tempfile::TempDir, String, String)> {
        let dir = tempfile::tempdir()?;
        let req = dir.path().join("req.json");
        std::fs::write(&req, REQ)?;
        let inputs = write_inputs(
            dir.path(),
            &[
                ("q", seeded(&[1, 37, 4, 64], 1)?),
                ("k", seeded(&[1, 37, 2, 64], 2)?),
                ("v", seeded(&[1, 37, 2, 64], 3)?),
            ],
        )?;
        Ok((dir, req.display().to_string(), inputs))
    }

    fn out_of(path: &std::path::Path) -> TestResult<Vec<f64>> {
        Ok(layerzero::tensor::io::read(path)?["out"].to_f64_vec())
    }

    /// The request of `setup` forced onto the oracle: its output.
    fn oracle(dir: &tempfile::TempDir, req: &str, inputs: &str) -> TestResult<Vec<f64>> {
        let oracle = dir.path().join("oracle.safetensors");
        let out = oracle.to_str().unwrap_or_default();
        let (code, _, err) = run(&[
            "run",
            "--request",
            req,
            "--inputs",
            inputs,
            "--out",
            out,
            "--kernel",
            "cpu_reference.attention.naive",
        ])?;
        assert_eq!(code, 0, "{err}");
        out_of(&oracle)
    }

    #[test]
    fn a_fault_drill_through_lz_run_repeat_20_falls_back_and_still_computes_the_answer() -> TestResult {
        let (dir, req, inputs) = setup()?;
        let want = oracle(&dir, &req, &inputs)?;
        let flash = "cpu.attention.flash";
        // Per mode: the first attempt's code and message, and what the 20 repeats see: a
        // kernel breaker opens after 3 failures (then KERNEL_QUARANTINED), a timeout opens it
        // at once, a lost device disables the whole `cpu` backend (BACKEND_UNHEALTHY).
        for (mode, code, says, repeats_see) in [
            ("error", "KERNEL_FAILED", "LAYERZERO_FAULTS", "KERNEL_QUARANTINED"),
            ("panic", "KERNEL_FAILED", "panicked", "KERNEL_QUARANTINED"),
            ("hang", "KERNEL_TIMEOUT", "deadline of 1000 ms", "KERNEL_QUARANTINED"),
            ("nan", "KERNEL_OUTPUT_INVALID", "NaN", "KERNEL_QUARANTINED"),
            ("oom", "KERNEL_OUT_OF_MEMORY", "out of memory", "KERNEL_QUARANTINED"),
            ("device_lost", "DEVICE_LOST", "device lost", "BACKEND_UNHEALTHY"),
            ("fail_first:2", "KERNEL_FAILED", "call 1 of the first 2", ""),
            ("slow:1", "", "", ""),
        ] {
            let out = dir.path().join(format!("{}.safetensors", mode.replace(':', "_")));
            let o = lz()?
                .env("LAYERZERO_FAULTS", format!("{flash}={mode}"))
                .args(["run", "--request", &req, "--inputs", &inputs, "--out", out.to_str().unwrap_or_default()])
                .args(["--repeat", "20", "--json"])
                .output()?;
            let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            assert_eq!(o.status.code(), Some(0), "{mode}: {stdout}{stderr}");
            let v: serde_json::Value = serde_json::from_str(&stdout).map_err(|e| format!("{e}: {stdout}"))?;
            assert!(violations(SchemaKind::RunReport, &v).unwrap_or_default().is_empty(), "{mode}");
            let reasons = &v["repeats"]["reasons"];
            if code.is_empty() {
                assert_eq!(v["kernel"], flash, "{mode}: a slow kernel still runs");
                assert_eq!(v["repeats"]["kernels"][flash], 20, "{mode}: {stdout}");
            } else {
                assert_eq!(v["fell_back"], true, "{mode}: {stdout}");
                assert_eq!(v["attempts"][0]["reason"]["code"], code, "{mode}: {stdout}");
                let why = v["attempts"][0]["reason"]["message"].as_str().unwrap_or_default();
                assert!(why.contains(says), "{mode}: {why}");
            }
            if repeats_see.is_empty() {
                assert!(reasons.get("KERNEL_QUARANTINED").is_none(), "{mode}: {stdout}");
            } else {
                assert_eq!(v["repeats"]["fell_back"], 20, "{mode}: every repeat falls back: {stdout}");
                assert!(reasons[repeats_see].as_u64().is_some_and(|n| n >= 17), "{mode}: {reasons}");
                assert!(v["repeats"]["kernels"].get(flash).is_none(), "{mode}: {stdout}");
                let open = v["health"]["kernels"].as_array().into_iter().chain(v["health"]["backends"].as_array());
                assert!(open.flatten().any(|b| b["state"] == "open"), "{mode}: {stdout}");
            }
            if mode == "fail_first:2" {
                assert_eq!(v["repeats"]["kernels"][flash], 19, "{mode}: works after its second call: {stdout}");
            }
            close::values(mode, Category::Attention, DType::F32, &want, &out_of(&out)?)?;
        }
        Ok(())
    }

    #[test]
    fn run_selects_the_fast_kernel_writes_out_and_times_it() -> TestResult {
        let (dir, req, inputs) = setup()?;
        let out = dir.path().join("out.safetensors");
        let (code, stdout, stderr) = run(&[
            "run",
            "--request",
            &req,
            "--inputs",
            &inputs,
            "--out",
            out.to_str().unwrap_or_default(),
            "--repeat",
            "3",
            "--json",
        ])?;
        assert_eq!(code, 0, "{stdout}{stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).map_err(|e| format!("{e}: {stdout}"))?;
        assert!(violations(SchemaKind::RunReport, &v).unwrap_or_default().is_empty());
        assert_eq!(v["kernel"], "cpu.attention.flash");
        assert!(v["timing"]["median_ns"].as_f64().is_some_and(|t| t > 0.0));
        assert_eq!(v["outputs"]["out"]["shape"], serde_json::json!([1, 37, 4, 64]));
        // The same request forced onto the oracle agrees within the f32 tolerance.
        let (a, b) = (out_of(&out)?, oracle(&dir, &req, &inputs)?);
        assert_eq!(a.len(), b.len());
        close::values("lz run against the oracle", Category::Attention, DType::F32, &b, &a)?;
        Ok(())
    }

    #[test]
    fn a_forced_kernel_that_cannot_take_the_request_is_refused_with_its_reasons() -> TestResult {
        let (dir, req, inputs) = setup()?;
        let out = dir.path().join("out.safetensors");
        let (code, _, err) = run(&[
            "run",
            "--request",
            &req,
            "--inputs",
            &inputs,
            "--out",
            out.to_str().unwrap_or_default(),
            "--kernel",
            "flash_attn_2.attention.fwd",
        ])?;
        assert_eq!(code, 2);
        assert_one_clean_line(&err);
        assert!(err.contains("flash_attn_2.attention.fwd") && err.contains("DEVICE_KIND_MISMATCH"), "{err}");
        assert!(!out.exists(), "nothing is written on failure");
        Ok(())
    }

    #[test]
    fn inputs_that_disagree_with_the_request_name_the_tensor() -> TestResult {
        let (dir, req, _) = setup()?;
        let out = dir.path().join("out.safetensors");
        for (tensors, expect) in [
            (
                vec![("q", seeded(&[1, 37, 4, 64], 1)?), ("k", seeded(&[1, 37, 2, 64], 2)?)],
                "input tensor `v` is missing",
            ),
            (
                vec![
                    ("q", seeded(&[1, 36, 4, 64], 1)?),
                    ("k", seeded(&[1, 37, 2, 64], 2)?),
                    ("v", seeded(&[1, 37, 2, 64], 3)?),
                ],
                "input tensor `q` has shape [1, 36, 4, 64]",
            ),
        ] {
            let inputs = write_inputs(dir.path(), &tensors)?;
            let (code, _, err) =
                run(&["run", "--request", &req, "--inputs", &inputs, "--out", out.to_str().unwrap_or_default()])?;
            assert_eq!(code, 2, "{err}");
            assert_one_clean_line(&err);
            assert!(err.contains(expect), "{err}");
        }
        let garbage = dir.path().join("garbage.safetensors");
        std::fs::write(&garbage, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")?;
        let (code, _, err) = run(&[
            "run",
            "--request",
            &req,
            "--inputs",
            garbage.to_str().unwrap_or_default(),
            "--out",
            out.to_str().unwrap_or_default(),
        ])?;
        assert_eq!(code, 2);
        assert_one_clean_line(&err);
        assert!(err.contains("not a safetensors file"), "{err}");
        Ok(())
    }

    #[test]
    fn a_block_table_entry_outside_the_cache_is_an_error_not_a_read() -> TestResult {
        let dir = tempfile::tempdir()?;
        let req = dir.path().join("req.json");
        std::fs::write(
            &req,
            r#"{"op": "paged_attention", "tensors": {"q": {"dtype": "f32", "shape": [2, 1, 4, 32], "layout": "BSHD"},
                "k_cache": {"dtype": "f32", "shape": [4, 16, 2, 32], "layout": "NHD"}, "v_cache": {"dtype": "f32", "shape": [4, 16, 2, 32], "layout": "NHD"},
                "block_table": {"dtype": "i32", "shape": [2, 2]}, "context_lens": {"dtype": "i32", "shape": [2]}}, "attrs": {"causal": true}}"#,
        )?;
        let table = HostTensor::from_f32_as(layerzero::model::dtype::DType::I32, &[2, 2], &[0.0, 1.0, 2.0, 9.0])?;
        let lens = HostTensor::from_f32_as(layerzero::model::dtype::DType::I32, &[2], &[20.0, 30.0])?;
        let inputs = write_inputs(
            dir.path(),
            &[
                ("q", seeded(&[2, 1, 4, 32], 1)?),
                ("k_cache", seeded(&[4, 16, 2, 32], 2)?),
                ("v_cache", seeded(&[4, 16, 2, 32], 3)?),
                ("block_table", table),
                ("context_lens", lens),
            ],
        )?;
        let out = dir.path().join("out.safetensors");
        let (code, _, err) = run(&[
            "run",
            "--request",
            &req.display().to_string(),
            "--inputs",
            &inputs,
            "--out",
            out.to_str().unwrap_or_default(),
        ])?;
        assert_eq!(code, 2, "{err}");
        assert_one_clean_line(&err);
        assert!(err.contains("9"), "{err}");
        Ok(())
    }

    #[test]
    fn parity_passes_for_every_executable_kernel() -> TestResult {
        let (code, out, err) = run(&["parity", "--json"])?;
        let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}{err}"))?;
        assert!(violations(SchemaKind::ParityReport, &v).unwrap_or_default().is_empty());
        let failing: Vec<String> = v["rows"]
            .as_array()
            .map(|rows| {
                rows.iter().filter(|r| r["status"] != "pass" && r["status"] != "skip").map(|r| r.to_string()).collect()
            })
            .unwrap_or_default();
        assert!(failing.is_empty(), "{}", failing.join("\n"));
        assert_eq!(code, 0);
        for kernel in ["cpu.attention.flash", "cpu.paged_attention.split_kv", "cpu.rope.fast"] {
            let ran = v["rows"]
                .as_array()
                .map(|r| r.iter().filter(|r| r["kernel"] == kernel && r["status"] == "pass").count())
                .unwrap_or(0);
            assert!(ran >= 9, "{kernel} passed only {ran} cases");
        }
        Ok(())
    }

    #[test]
    fn parity_record_stores_this_machines_results_and_doctor_names_a_failed_one() -> TestResult {
        use layerzero::perfdb::{ParityStatus, PerfDb};
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("db.sqlite");
        let db_arg = db.to_str().ok_or("a UTF-8 temp path")?;
        let out = lz()?.args(["parity", "--op", "rms_norm", "--record", "--perfdb", db_arg, "--json"]).output()?;
        let (code, out, err) = finished(out);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}{err}"))?;
        assert!(violations(SchemaKind::ParityReport, &v).unwrap_or_default().is_empty());
        let fingerprint = v["recorded"]["fingerprint"].as_str().ok_or("the fingerprint recorded under")?.to_owned();
        let passed = v["passed"].as_u64().ok_or("a count of passed rows")?;
        assert!(passed > 0);
        // Every compared row is a record of this machine, with its figures.
        let opened = PerfDb::open(&db)?;
        let records = opened.db.parity_for(&fingerprint)?;
        assert_eq!(records.len() as u64, v["recorded"]["records"].as_u64().ok_or("a record count")?);
        assert_eq!(records.len() as u64, passed);
        for r in &records {
            assert_eq!(r.status, ParityStatus::Pass);
            assert!(r.cosine.is_some_and(|c| c > 0.9999) && r.nmse.is_some() && r.op == "rms_norm", "{r:?}");
            assert!(!r.bucket.is_empty() && !r.key.is_empty() && r.origin == "lz parity");
        }
        // A failed record (as a shadow check would write) makes doctor name it and fail.
        let mut failed = records[0].clone();
        failed.status = ParityStatus::Fail;
        failed.cosine = Some(0.006);
        failed.detail = Some("64 of 64 elements outside the tolerance".to_owned());
        opened.db.insert_parity(&[failed.clone()])?;
        drop(opened);
        let out = lz()?.args(["doctor", "--perfdb", db_arg, "--json"]).output()?;
        let (code, out, err) = finished(out);
        let d: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}{err}"))?;
        assert!(
            violations(SchemaKind::Doctor, &d).unwrap_or_default().is_empty(),
            "{:?}",
            violations(SchemaKind::Doctor, &d)
        );
        assert_eq!(d["perfdb"]["parity_failed"], 1);
        let named = d["perfdb"]["parity_failing_here"].to_string();
        assert!(named.contains(&failed.kernel) && named.contains("cosine 0.0060"), "{named}");
        assert_eq!(code, 1, "doctor fails while a kernel's parity record here failed");
        Ok(())
    }
}
