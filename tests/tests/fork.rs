//! E2E spec §16, forked workers after backend initialisation: a handle that dispatched a
//! parallel `cpu` kernel (rayon's workers started; with a deadline, a runner thread too) is
//! inherited by a forked child, which dispatches with it and gets the parent's output, in
//! time (before `layerzero_cpu::fork`, the child waited forever for the parent's workers);
//! and a model loaded before the fork generates Hugging Face's tokens in the child too.
//! The fork happens in the `fork_probe` binary (`tests/src/bin/fork_probe.rs`): a process
//! started by `Command` execs, and inherits no handle.

use layerzero_tests::TestResult;

fn probe(args: &[&str]) -> TestResult<serde_json::Value> {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_fork_probe")).args(args).output()?;
    let stdout = String::from_utf8_lossy(&o.stdout);
    let report = stdout.lines().last().ok_or_else(|| format!("no report: {stdout}"))?;
    let v: serde_json::Value = serde_json::from_str(report).map_err(|e| format!("{e}: {stdout}"))?;
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    Ok(v)
}

#[test]
fn section_16_a_forked_child_dispatches_with_the_inherited_handle_and_gets_the_parents_output() -> TestResult {
    for args in [&[][..], &["deadline"][..]] {
        let v = probe(args)?;
        assert_eq!(v["kernel"], "cpu.rms_norm.fast", "{v}");
        // The parent's output is the f64 oracle's, within f32 rounding.
        assert!(v["parent_vs_reference"].as_f64().is_some_and(|d| d < 1e-5), "{v}");
        // The child's two dispatches gave exactly the parent's output, without a hang.
        assert_eq!(v["child"], "same", "{v}");
        assert!(v["child_ms"].as_u64().is_some_and(|ms| ms < 30_000), "{v}");
    }
    Ok(())
}

#[test]
fn section_16_a_forked_child_generates_with_the_inherited_handle_and_model_as_hf_does() -> TestResult {
    let dir = layerzero_tests::repo_root().join("tests/models/llama-gqa");
    let v = probe(&["model", dir.to_str().unwrap_or_default()])?;
    // The parent's greedy tokens are Hugging Face transformers' (the fixture's reference).
    assert_eq!(v["parent_vs_reference"].as_f64(), Some(0.0), "{v}");
    // The child's two generations gave the same tokens, without a hang.
    assert_eq!(v["child"], "same", "{v}");
    assert!(v["child_ms"].as_u64().is_some_and(|ms| ms < 30_000), "{v}");
    Ok(())
}
