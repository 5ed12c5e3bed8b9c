//! Subprocess isolation (issue 29): an isolated plugin is opened and run in a worker process;
//! its results match the same plugin in-process; a worker that aborts, faults or hangs is
//! killed, the call falls back with `KERNEL_WORKER_LOST` and the next call runs in a new
//! worker; plugins whose runtimes conflict load side by side when one is isolated.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use layerzero::backend::plugin::Plugin;
use layerzero::backend::plugin::worker::WorkerOptions;
use layerzero::capabilities::catalog::Catalog;
use layerzero::prelude::*;
use layerzero::reason::ReasonCode;
use layerzero_tests::{TestResult, repo_root};

use super::plugins::{c_plugin, example_plugin, fused_norm, lock_on, max_diff, plain_norm, refused_with};

/// Builds the worker program and returns it.
fn worker() -> TestResult<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(repo_root())
        .args(["build", "-q", "-p", "layerzero-plugin", "--bin", "layerzero-plugin-worker"])
        .output()?;
    assert!(out.status.success(), "building the worker: {}", String::from_utf8_lossy(&out.stderr));
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo_root().join("target"), PathBuf::from);
    Ok(target.join("debug").join(format!("layerzero-plugin-worker{}", std::env::consts::EXE_SUFFIX)))
}

fn options(deadline_ms: u64) -> TestResult<WorkerOptions> {
    Ok(WorkerOptions { program: worker()?, deadline: Duration::from_millis(deadline_ms) })
}

fn isolated(path: &std::path::Path, deadline_ms: u64) -> TestResult<Arc<Plugin>> {
    let hash = blake3_of(path)?;
    Ok(Arc::new(Plugin::open_isolated(path, &hash, options(deadline_ms)?)?))
}

fn blake3_of(path: &std::path::Path) -> TestResult<String> {
    Ok(layerzero::backend::plugin::Plugin::open(path)?.library_hash.clone())
}

#[test]
fn an_isolated_plugin_runs_in_its_worker_and_matches_the_same_plugin_in_process() -> TestResult {
    let lib = example_plugin()?;
    let remote = isolated(&lib, 10_000)?;
    assert!(remote.is_isolated());
    let pid = remote.worker().and_then(|w| w.pid()).ok_or("no worker is running")?;
    assert_ne!(pid, std::process::id(), "the kernels run in another process");
    let local = Arc::new(Plugin::open(&lib)?);
    assert_eq!(remote.capabilities_hash, local.capabilities_hash, "the worker reports the same capabilities");
    let kernel = "fusedops@0.1.0.rms_norm.add_fused";
    let args = fused_norm(5, 200)?;
    let run = |p: Arc<Plugin>| -> TestResult<Vec<Vec<f64>>> {
        let lz = LayerZero::detected_with_plugins(Catalog::builtin()?, &[p])?.with_policy(lock_on(kernel)?)?;
        let ran = lz.dispatch(&args)?;
        assert_eq!(ran.selection().kernel, kernel);
        ["out", "residual_out"].iter().map(|n| Ok(ran.outputs.get(n).ok_or(format!("no {n}"))?.to_f64_vec())).collect()
    };
    let (there, here) = (run(remote)?, run(local)?);
    for (a, b) in there.iter().zip(&here) {
        assert_eq!(max_diff(a, b), 0.0, "the same code on the same bytes gives the same bits");
    }
    Ok(())
}

#[test]
fn a_worker_that_aborts_faults_or_hangs_is_killed_and_the_call_falls_back() -> TestResult {
    let dir = tempfile::tempdir()?;
    let plugin = isolated(&c_plugin(dir.path(), "ctraps", &["-DCPLUG_TRAPS"])?, 1_500)?;
    let lz = LayerZero::detected_with_plugins(Catalog::builtin()?, std::slice::from_ref(&plugin))?;
    lz.set_policy(Policy::from_json(
        r#"{"rules": [{"action": "prefer", "kernels": "cplug@0.1.0.*", "factor": 0.000001}],
            "health": {"failure_threshold": 100}}"#,
        "prefer.json",
    )?)?;
    let kernel = "cplug@0.1.0.rms_norm.c";
    let with_first = |first: f32| -> TestResult<OpArgs> {
        let OpArgs::RmsNorm(mut a) = plain_norm()? else { return Err("not a norm".into()) };
        let mut x = a.x.to_f32_vec();
        x[0] = first;
        x[1] = 0.0;
        a.x = HostTensor::from_f32(a.x.shape(), x)?;
        Ok(OpArgs::RmsNorm(a))
    };
    // It prints to its stdout on every call; the protocol is on other descriptors.
    let ran = lz.dispatch(&with_first(0.5)?)?;
    assert_eq!(ran.selection().kernel, kernel);
    assert!(!ran.fell_back());
    for (first, says) in [(-1.0, "SIGABRT"), (-2.0, "SIGSEGV"), (-3.0, "within its deadline of 1500 ms")] {
        let ran = lz.dispatch(&with_first(first)?)?;
        assert!(ran.fell_back(), "x[0] = {first}: the call falls back");
        assert_ne!(ran.selection().kernel, kernel);
        let attempt = ran.attempts().into_iter().find(|a| a.kernel == kernel).ok_or("the plugin was not tried")?;
        let reason = attempt.reason.ok_or("no reason")?;
        assert_eq!(reason.code(), ReasonCode::KERNEL_WORKER_LOST, "{}", reason.message());
        assert!(reason.message().contains(says), "x[0] = {first}: {}", reason.message());
        // The next call runs in a new worker.
        let again = lz.dispatch(&with_first(0.5)?)?;
        assert_eq!(again.selection().kernel, kernel, "after x[0] = {first}");
        assert!(!again.fell_back());
    }
    let worker = plugin.worker().ok_or("not isolated")?;
    assert_eq!((worker.lost(), worker.starts()), (3, 4), "three workers lost, three restarted");
    Ok(())
}

#[test]
fn plugins_whose_runtimes_conflict_run_side_by_side_when_one_is_isolated() -> TestResult {
    let dir = tempfile::tempdir()?;
    let flags = |name: &str, cuda: &str| {
        vec![
            format!(r#"-DCPLUG_NAME="{name}""#),
            format!(r#"-DCPLUG_EXTRA="\"requires\": {{\"cuda\": \"{cuda}\"}}, ""#),
        ]
    };
    let build = |file: &str, name: &str, cuda: &str| -> TestResult<PathBuf> {
        let f = flags(name, cuda);
        c_plugin(dir.path(), file, &f.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let (a, b) = (build("a", "cpluga", "12")?, build("b", "cplugb", "11")?);
    let both_here = [Arc::new(Plugin::open(&a)?), Arc::new(Plugin::open(&b)?)];
    let err = LayerZero::detected_with_plugins(Catalog::builtin()?, &both_here).err().ok_or("both loaded here")?;
    assert!(refused_with(&err, ReasonCode::PLUGIN_REQUIREMENTS_CONFLICT), "{err}");
    let lz =
        LayerZero::detected_with_plugins(Catalog::builtin()?, &[Arc::new(Plugin::open(&a)?), isolated(&b, 10_000)?])?;
    let args = plain_norm()?;
    let mut outs = Vec::new();
    for kernel in ["cpluga@0.1.0.rms_norm.c", "cplugb@0.1.0.rms_norm.c"] {
        lz.set_policy(lock_on(kernel)?)?;
        let ran = lz.dispatch(&args)?;
        assert_eq!(ran.selection().kernel, kernel);
        outs.push(ran.outputs.get("out").ok_or("no out")?.to_f64_vec());
    }
    assert_eq!(max_diff(&outs[0], &outs[1]), 0.0);
    Ok(())
}

#[test]
fn an_isolated_plugin_is_still_checked_by_hash_and_a_missing_worker_is_named() -> TestResult {
    let lib = example_plugin()?;
    let wrong = "0".repeat(64);
    let err = Plugin::open_isolated(&lib, &wrong, options(10_000)?).err().ok_or("a wrong hash opened")?;
    assert!(refused_with(&err, ReasonCode::PLUGIN_HASH_MISMATCH), "{err}");
    let missing = WorkerOptions {
        program: PathBuf::from("/nonexistent/layerzero-plugin-worker"),
        deadline: Duration::from_secs(1),
    };
    let err = Plugin::open_isolated(&lib, &blake3_of(&lib)?, missing).err().ok_or("no worker, yet it opened")?;
    assert!(refused_with(&err, ReasonCode::PLUGIN_WORKER_FAILED), "{err}");
    assert!(err.to_string().contains("/nonexistent/layerzero-plugin-worker"), "{err}");
    Ok(())
}

#[test]
fn the_host_isolates_the_plugins_the_knob_names_and_doctor_says_so() -> TestResult {
    let dir = tempfile::tempdir()?;
    let lib = super::plugins::plugin_copy(dir.path())?;
    let lock = super::plugins::lock_file(dir.path(), &lib)?;
    worker()?;
    let settings = super::plugins::settings_of(&[
        ("LAYERZERO_LOCK", lock.as_os_str()),
        ("LAYERZERO_HOME", dir.path().as_os_str()),
        ("LAYERZERO_ISOLATE", "fusedops@*".as_ref()),
    ])?;
    let lz = LayerZero::host_with(settings)?.with_policy(lock_on("fusedops@0.1.0.rms_norm.add_fused")?)?;
    let ran = lz.dispatch(&fused_norm(2, 64)?)?;
    assert_eq!(ran.selection().kernel, "fusedops@0.1.0.rms_norm.add_fused");
    // The worker is found beside the program (cargo's target folder) without a knob.
    let doctor = layerzero_tests::lz()?
        .args(["doctor", "--json"])
        .env("LAYERZERO_LOCK", &lock)
        .env("LAYERZERO_ISOLATE", "fusedops@*")
        .env("LAYERZERO_PLUGIN_WORKER", worker()?)
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&doctor.stdout)?;
    let state = &v["plugins"]["locked"][0];
    assert_eq!(state["isolated"], true, "{state}");
    assert!(state["error"].is_null(), "{state}");
    Ok(())
}

#[test]
fn isolating_a_builtin_backend_is_refused_rather_than_ignored() -> TestResult {
    let policy = Policy::from_json(r#"{"isolation": {"cpu": "subprocess"}}"#, "isolate.json")?;
    let err = LayerZero::detected()?.with_policy(policy).err().ok_or("a builtin backend was 'isolated'")?;
    assert!(err.to_string().contains("\"cpu\" is a builtin backend"), "{err}");
    Ok(())
}
