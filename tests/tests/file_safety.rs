//! Files the way a database treats them (issue 12, item 8): special files are refused, never
//! read forever nor replaced; an output that is an input is refused; inputs have a size limit.

use std::path::Path;
use std::time::Duration;

use layerzero_tests::{TestResult, lz, repo_root};

fn example() -> String {
    repo_root().join("examples/requests/llama_prefill_gqa.json").display().to_string()
}

fn outcome(cmd: &mut assert_cmd::Command) -> TestResult<(i32, String)> {
    let out = cmd.timeout(Duration::from_secs(60)).output()?;
    Ok((out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned()))
}

#[cfg(unix)]
#[test]
fn a_fifo_or_a_device_as_the_request_is_refused_at_once_not_read_forever() -> TestResult {
    let dir = tempfile::tempdir()?;
    let fifo = dir.path().join("request.json");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success());
    assert!(made, "mkfifo is available on the test machine");
    let (code, err) = outcome(lz()?.args(["explain", "--request", &fifo.display().to_string()]))?;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is a FIFO") && err.contains("reads only regular files"), "{err}");
    if Path::new("/dev/zero").exists() {
        let (code, err) = outcome(lz()?.args(["explain", "--request", "/dev/zero"]))?;
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("character device"), "{err}");
    }
    Ok(())
}

#[cfg(unix)]
#[test]
fn an_output_naming_a_device_is_refused_and_the_device_left_alone() -> TestResult {
    use std::os::unix::fs::FileTypeExt;
    if !Path::new("/dev/full").exists() {
        return Ok(());
    }
    let model = repo_root().join("tests/models/llama-gqa").display().to_string();
    let (code, err) = outcome(lz()?.args(["workload", "--model", &model, "--max-seq", "16", "--out", "/dev/full"]))?;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("character device") && err.contains("writes only regular files"), "{err}");
    let still = std::fs::metadata("/dev/full").map(|m| m.file_type().is_char_device()).unwrap_or(false);
    assert!(still, "/dev/full is still the device");
    Ok(())
}

#[test]
fn solve_refuses_to_write_its_table_over_its_own_workload() -> TestResult {
    let dir = tempfile::tempdir()?;
    let workload = dir.path().join("w.json");
    std::fs::copy(repo_root().join("workloads/regret-cpu.json"), &workload)?;
    let before = std::fs::read(&workload).unwrap_or_default();
    let w = workload.display().to_string();
    let (code, err) =
        outcome(lz()?.args(["solve", "--workload", &w, "--hardware", "zen4", "--no-perfdb", "--out", &w]))?;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is also an input"), "{err}");
    assert_eq!(std::fs::read(&workload).unwrap_or_default(), before, "the workload is untouched");
    let temps = std::fs::read_dir(dir.path())
        .map(|d| d.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().ends_with(".tmp")).count())
        .unwrap_or(usize::MAX);
    assert_eq!(temps, 0, "no temporary is left behind");
    Ok(())
}

#[test]
fn an_input_over_the_read_limit_is_refused_naming_the_knob() -> TestResult {
    let (code, err) = outcome(lz()?.env("LAYERZERO_MAX_READ_BYTES", "64").args(["explain", "--request", &example()]))?;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("LAYERZERO_MAX_READ_BYTES") && err.contains("llama_prefill_gqa.json"), "{err}");
    let (code, err) =
        outcome(lz()?.env("LAYERZERO_MAX_READ_BYTES", "lots").args(["explain", "--request", &example()]))?;
    assert_eq!(code, 2, "a bad limit is a usage error naming the variable: {err}");
    assert!(err.contains("LAYERZERO_MAX_READ_BYTES=\"lots\""), "{err}");
    Ok(())
}

/// Malformed inputs found by fuzzing `lz`: each error names the file, the field and the value.
#[test]
fn every_input_error_names_the_field_at_fault() -> TestResult {
    let dir = tempfile::tempdir()?;
    let write = |name: &str, text: &[u8]| -> TestResult<String> {
        let p = dir.path().join(name);
        std::fs::write(&p, text)?;
        Ok(p.display().to_string())
    };
    let linear = write(
        "linear.json",
        br#"{"op":"linear","tensors":{"x":{"dtype":"f32","shape":[8,64]},"weight":{"dtype":"f32","shape":[48,64]}}}"#,
    )?;
    let attrs = write(
        "attrs.json",
        br#"{"op":"attention","tensors":{"q":{"dtype":"f32","shape":[1,2,3,4],"layout":"BSHD"},"k":{"dtype":"f32","shape":[1,2,3,4],"layout":"BSHD"},"v":{"dtype":"f32","shape":[1,2,3,4],"layout":"BSHD"}},"attrs":{"causal":"yes"}}"#,
    )?;
    let bounds =
        write("bounds.json", br#"{"rules":[{"action":"deny","kernels":"cpu.*","when":{"batch":{"min":5,"max":2}}}]}"#)?;
    let ranges = write(
        "ranges.json",
        br#"{"schema_version":1,"name":"w","entries":[{"name":"proj","request":{"op":"linear","tensors":{"x":{"dtype":"f32","shape":[8,64]},"weight":{"dtype":"f32","shape":[48,64]}}},"ranges":{"m":[0,5]}}]}"#,
    )?;
    let entry = write(
        "entry.json",
        br#"{"schema_version":1,"name":"w","entries":[{"name":"proj","request":{"op":"linear"},"ranges":{}}]}"#,
    )?;
    let header = br#"{"x":{"dtype":"F32","shape":[8,64],"data_offsets":[0,2048]},"weight":{"dtype":"F32","shape":[48,64],"data_offsets":[2048,4000]}}"#;
    let mut st = (header.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(header);
    st.extend(std::iter::repeat_n(0u8, 4000));
    let inputs = write("in.safetensors", &st)?;
    let out = dir.path().join("out.safetensors").display().to_string();
    let table = dir.path().join("t.json").display().to_string();
    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        (vec!["explain", "--request", &attrs], &["/attrs/causal", "\"yes\"", "boolean"]),
        (vec!["explain", "--request", &linear, "--policy", &bounds], &["rules[0].when.batch", "min 5 > max 2"]),
        (vec!["solve", "--workload", &ranges, "--out", &table], &["/entries/0/ranges/m/0", "minimum of 1"]),
        (vec!["solve", "--workload", &entry, "--out", &table], &["entry `proj`", "`tensors`"]),
        (
            vec!["run", "--request", &linear, "--inputs", &inputs, "--out", &out],
            &["tensor `weight`", "data_offsets", "[2048, 4000]"],
        ),
    ];
    for (args, needles) in cases {
        let (code, err) = outcome(lz()?.args(&args))?;
        assert_eq!(code, 2, "{args:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: {n:?} missing from {err}");
        }
    }
    Ok(())
}
