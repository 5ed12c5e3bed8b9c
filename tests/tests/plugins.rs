//! Plugins (issue 29): the example plugin (`plugins/example`, a fused residual add + RMSNorm
//! over the C ABI) is built, opened and run through selection, and matches the reference;
//! files that are not plugins, and a namespace loaded twice, are refused with reason codes.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use layerzero::NormArgs;
use layerzero::backend::plugin::Plugin;
use layerzero::capabilities::catalog::Catalog;
use layerzero::prelude::*;
use layerzero::reason::ReasonCode;
use layerzero_tests::{TestResult, repo_root};

/// Builds the example plugin (cargo is quick when it is up to date) and returns its library.
pub(super) fn example_plugin() -> TestResult<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(repo_root())
        .args(["build", "-q", "-p", "layerzero-plugin-example"])
        .output()?;
    assert!(out.status.success(), "building the example plugin: {}", String::from_utf8_lossy(&out.stderr));
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo_root().join("target"), PathBuf::from);
    let lib = target.join("debug").join(format!(
        "{}layerzero_plugin_example{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    assert!(lib.exists(), "{} was not built", lib.display());
    Ok(lib)
}

pub(super) fn fused_norm(rows: usize, h: usize) -> TestResult<OpArgs> {
    let x = HostTensor::from_f32(&[rows, h], (0..rows * h).map(|i| ((i % 13) as f32 - 6.0) / 3.0).collect())?;
    let residual = HostTensor::from_f32(&[rows, h], (0..rows * h).map(|i| ((i % 5) as f32 - 2.0) / 7.0).collect())?;
    let weight = HostTensor::from_f32(&[h], (0..h).map(|i| 0.5 + (i % 3) as f32 / 4.0).collect())?;
    Ok(OpArgs::RmsNorm(NormArgs { x, weight, bias: None, residual: Some(residual), attrs: Default::default() }))
}

/// The largest elementwise difference of two outputs of one length.
pub(super) fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// A lockfile at `dir/layerzero.lock` pinning the plugin library `lib`.
pub(super) fn lock_file(dir: &std::path::Path, lib: &std::path::Path) -> TestResult<PathBuf> {
    let lock = dir.join("layerzero.lock");
    let mut file = layerzero::plugins::Lockfile::default();
    file.upsert(layerzero::plugins::LockEntry::of(&Plugin::open(lib)?, "a test".into()));
    file.write(&lock)?;
    Ok(lock)
}

/// Settings with the knobs `vars` set (by path or text) and no other.
pub(super) fn settings_of(vars: &[(&str, &std::ffi::OsStr)]) -> TestResult<layerzero::knobs::Settings> {
    let vars: Vec<(String, std::ffi::OsString)> =
        vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    Ok(layerzero::knobs::Settings::from_lookup(&move |k: &str| {
        vars.iter().find(|(name, _)| name == k).map(|(_, v)| v.clone())
    })?)
}

pub(super) fn refused_with(err: &layerzero::error::Error, code: ReasonCode) -> bool {
    err.reasons().iter().any(|r| r.code() == code) && err.to_string().contains(code.as_str())
}

#[test]
fn the_example_plugin_runs_in_its_namespace_and_matches_the_reference() -> TestResult {
    let plugin = Arc::new(Plugin::open(&example_plugin()?)?);
    assert_eq!(plugin.namespace(), "fusedops@0.1.0");
    assert_eq!(plugin.library_hash.len(), 64);
    let lz = LayerZero::detected_with_plugins(Catalog::builtin()?, &[plugin])?;
    let lock = Policy::from_json(
        r#"{"rules": [{"action": "lock", "kernels": "fusedops@0.1.0.rms_norm.add_fused"}]}"#,
        "lock.json",
    )?;
    let lz = lz.with_policy(lock)?;
    let args = fused_norm(3, 96)?;
    let ran = lz.dispatch(&args)?;
    assert_eq!(ran.selection().kernel, "fusedops@0.1.0.rms_norm.add_fused");
    let reference = LayerZero::detected()?.with_policy(Policy::from_json(
        r#"{"rules": [{"action": "allow", "kernels": "cpu_reference.*"}]}"#,
        "oracle.json",
    )?)?;
    let expected = reference.dispatch(&args)?;
    for name in ["out", "residual_out"] {
        let got = ran.outputs.get(name).ok_or(format!("no {name}"))?.to_f64_vec();
        let want = expected.outputs.get(name).ok_or(format!("reference has no {name}"))?.to_f64_vec();
        let worst = max_diff(&got, &want);
        assert!(worst < 1e-5, "{name}: max |diff| {worst}");
    }
    Ok(())
}

#[test]
fn files_that_are_not_plugins_are_refused_naming_why() -> TestResult {
    let dir = tempfile::tempdir()?;
    // A truncated library.
    let good = std::fs::read(example_plugin()?)?;
    let truncated = dir.path().join("libtruncated.so");
    std::fs::write(&truncated, &good[..good.len().min(4096)])?;
    let err = Plugin::open(&truncated).err().ok_or("a truncated library opened")?;
    assert!(refused_with(&err, ReasonCode::PLUGIN_NOT_LOADABLE), "{err}");
    // Not a library at all.
    let text = dir.path().join("notes.so");
    std::fs::write(&text, "not an ELF file")?;
    let err = Plugin::open(&text).err().ok_or("a text file opened")?;
    assert!(refused_with(&err, ReasonCode::PLUGIN_NOT_LOADABLE), "{err}");
    // A real shared library without the plugin symbols (the C library itself).
    if let Some(libc) = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    {
        let err = Plugin::open(&libc).err().ok_or("libc opened as a plugin")?;
        assert!(refused_with(&err, ReasonCode::PLUGIN_NOT_LOADABLE), "{err}");
        assert!(err.to_string().contains("lz_plugin_abi_version"), "{err}");
    }
    Ok(())
}

#[test]
fn one_namespace_loaded_twice_is_refused() -> TestResult {
    let path = example_plugin()?;
    let (a, b) = (Arc::new(Plugin::open(&path)?), Arc::new(Plugin::open(&path)?));
    let err = LayerZero::detected_with_plugins(Catalog::builtin()?, &[a, b]).err().ok_or("loaded twice")?;
    assert!(refused_with(&err, ReasonCode::PLUGIN_NAMESPACE_CLASH), "{err}");
    Ok(())
}

/// A copy of the example plugin in `dir` (so a test may tamper with it).
pub(super) fn plugin_copy(dir: &std::path::Path) -> TestResult<PathBuf> {
    let copy = dir.join("libfusedops.so");
    std::fs::copy(example_plugin()?, &copy)?;
    Ok(copy)
}

#[test]
fn lz_lock_pins_a_plugin_list_shows_it_and_verify_names_a_tampered_file() -> TestResult {
    let dir = tempfile::tempdir()?;
    let lib = plugin_copy(dir.path())?;
    let lock = dir.path().join("layerzero.lock");
    let out = layerzero_tests::lz()?.arg("lock").arg("--plugin").arg(&lib).arg("--lock").arg(&lock).output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("locked fusedops@0.1.0"), "{:?}", out);
    let listed = layerzero_tests::lz()?.args(["plugin", "list", "--json", "--lock"]).arg(&lock).output()?;
    let v: serde_json::Value = serde_json::from_slice(&listed.stdout)?;
    assert_eq!(v["plugins"][0]["name"], "fusedops");
    assert_eq!(v["plugins"][0]["library_blake3"].as_str().map(str::len), Some(64));
    let ok = layerzero_tests::lz()?.args(["plugin", "verify", "--lock"]).arg(&lock).output()?;
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stdout));
    // One byte appended: the file is no longer the one locked.
    let mut bytes = std::fs::read(&lib)?;
    bytes.push(0);
    std::fs::write(&lib, bytes)?;
    let bad = layerzero_tests::lz()?.args(["plugin", "verify", "--lock"]).arg(&lock).output()?;
    let text = String::from_utf8_lossy(&bad.stdout);
    assert_eq!(bad.status.code(), Some(1), "{text}");
    assert!(text.contains("FAIL fusedops@0.1.0") && text.contains("PLUGIN_HASH_MISMATCH"), "{text}");
    Ok(())
}

#[test]
fn the_host_loads_the_locked_plugins_and_refuses_a_tampered_one_before_opening_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let lib = plugin_copy(dir.path())?;
    let lock = lock_file(dir.path(), &lib)?;
    let settings = |lock: &std::path::Path| {
        settings_of(&[("LAYERZERO_LOCK", lock.as_os_str()), ("LAYERZERO_HOME", dir.path().as_os_str())])
    };
    let lz = LayerZero::host_with(settings(&lock)?)?;
    assert!(lz.catalog().find("fusedops@0.1.0.rms_norm.add_fused").is_some());
    assert!(lz.registry().contains("fusedops@0.1.0.rms_norm.add_fused"));
    let mut bytes = std::fs::read(&lib)?;
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&lib, bytes)?;
    let err = LayerZero::host_with(settings(&lock)?).err().ok_or("a tampered plugin loaded")?;
    assert!(refused_with(&err, ReasonCode::PLUGIN_HASH_MISMATCH), "{err}");
    assert!(err.to_string().contains("not loaded"), "{err}");
    Ok(())
}

/// `tests/plugins/cplug.c` compiled with `flags` into `dir` (the C compiler CI installs).
pub(super) fn c_plugin(dir: &std::path::Path, name: &str, flags: &[&str]) -> TestResult<PathBuf> {
    let out = dir.join(format!("lib{name}.so"));
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-I"])
        .arg(repo_root().join("plugins/abi"))
        .arg("-o")
        .arg(&out)
        .arg(repo_root().join("tests/plugins/cplug.c"))
        .args(flags)
        .arg("-lm")
        .output()?;
    assert!(status.status.success(), "cc {flags:?}: {}", String::from_utf8_lossy(&status.stderr));
    Ok(out)
}

#[test]
fn every_plugin_that_breaks_a_rule_is_refused_with_its_reason_code() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cases: [(&str, &[&str], ReasonCode, &str); 3] = [
        ("abi2", &["-DCPLUG_ABI=2"], ReasonCode::PLUGIN_ABI_UNSUPPORTED, "ABI 2"),
        ("liar", &["-DCPLUG_LIE"], ReasonCode::PLUGIN_KERNEL_MISSING, "cplug.rms_norm.phantom"),
        ("badjson", &["-DCPLUG_BAD_JSON"], ReasonCode::PLUGIN_CAPABILITIES_INVALID, "capabilities"),
    ];
    for (name, flags, code, says) in cases {
        let err = Plugin::open(&c_plugin(dir.path(), name, flags)?).err().ok_or(format!("{name} opened"))?;
        assert!(refused_with(&err, code), "{name}: {err}");
        assert!(err.to_string().contains(says), "{name}: {err}");
    }
    // A plugin named after a builtin backend opens, but cannot join the catalog.
    let cpu = Arc::new(Plugin::open(&c_plugin(dir.path(), "cpu", &[r#"-DCPLUG_NAME="cpu""#])?)?);
    let err = LayerZero::detected_with_plugins(Catalog::builtin()?, &[cpu]).err().ok_or("a plugin named cpu loaded")?;
    assert!(refused_with(&err, ReasonCode::PLUGIN_NAMESPACE_CLASH), "{err}");
    Ok(())
}

pub(super) fn plain_norm() -> TestResult<OpArgs> {
    let x = HostTensor::from_f32(&[2, 32], (0..64).map(|i| (i as f32 - 30.0) / 9.0).collect())?;
    let weight = HostTensor::from_f32(&[32], (0..32).map(|i| 1.0 + i as f32 / 64.0).collect())?;
    Ok(OpArgs::RmsNorm(NormArgs { x, weight, bias: None, residual: None, attrs: Default::default() }))
}

pub(super) fn lock_on(kernel: &str) -> TestResult<Policy> {
    Ok(Policy::from_json(&format!(r#"{{"rules": [{{"action": "lock", "kernels": "{kernel}"}}]}}"#), "lock.json")?)
}

#[test]
fn two_versions_of_a_plugin_load_side_by_side_and_policy_picks_either() -> TestResult {
    let dir = tempfile::tempdir()?;
    let v1 = Arc::new(Plugin::open(&c_plugin(dir.path(), "cplug1", &[])?)?);
    let v2 = Arc::new(Plugin::open(&c_plugin(dir.path(), "cplug2", &[r#"-DCPLUG_VERSION="0.2.0""#])?)?);
    let lz = LayerZero::detected_with_plugins(Catalog::builtin()?, &[v1, v2])?;
    let args = plain_norm()?;
    let oracle = LayerZero::detected()?.with_policy(lock_on("cpu_reference.rms_norm.naive")?)?;
    let want = oracle.dispatch(&args)?.outputs.get("out").ok_or("no reference output")?.to_f64_vec();
    for kernel in ["cplug@0.1.0.rms_norm.c", "cplug@0.2.0.rms_norm.c"] {
        lz.set_policy(lock_on(kernel)?)?;
        let ran = lz.dispatch(&args)?;
        assert_eq!(ran.selection().kernel, kernel);
        let got = ran.outputs.get("out").ok_or("no out")?.to_f64_vec();
        let worst = max_diff(&got, &want);
        assert!(worst < 1e-5, "{kernel}: max |diff| {worst}");
    }
    Ok(())
}

#[test]
fn a_plugin_kernel_that_fails_is_contained_with_its_message_and_falls_back() -> TestResult {
    let dir = tempfile::tempdir()?;
    let failing = Arc::new(Plugin::open(&c_plugin(dir.path(), "cfail", &["-DCPLUG_FAIL"])?)?);
    let lz = LayerZero::detected_with_plugins(Catalog::builtin()?, &[failing])?;
    let args = plain_norm()?;
    lz.set_policy(lock_on("cplug@0.1.0.rms_norm.c")?)?;
    let err = lz.dispatch(&args).err().ok_or("a failing kernel succeeded")?;
    assert_eq!(err.kind(), ErrorKind::KernelFailed);
    assert!(err.to_string().contains("cplug refuses on purpose"), "{err}");
    lz.set_policy(Policy::from_json(
        r#"{"rules": [{"action": "prefer", "kernels": "cplug@0.1.0.*", "factor": 0.000001}]}"#,
        "prefer.json",
    )?)?;
    let ran = lz.dispatch(&args)?;
    assert!(ran.fell_back(), "the plugin's failure falls back to the next kernel");
    assert_ne!(ran.selection().kernel, "cplug@0.1.0.rms_norm.c");
    Ok(())
}

#[test]
fn a_locked_plugin_the_policy_does_not_allow_is_refused_before_it_is_opened() -> TestResult {
    let dir = tempfile::tempdir()?;
    let lib = c_plugin(dir.path(), "cplug", &[])?;
    let lock = lock_file(dir.path(), &lib)?;
    let policy = dir.path().join("policy.json");
    let settings = |allow: &str| -> TestResult<layerzero::knobs::Settings> {
        std::fs::write(&policy, format!(r#"{{"allow_plugins": ["{allow}"]}}"#))?;
        settings_of(&[
            ("LAYERZERO_LOCK", lock.as_os_str()),
            ("LAYERZERO_POLICY", policy.as_os_str()),
            ("LAYERZERO_HOME", dir.path().as_os_str()),
        ])
    };
    let lz = LayerZero::host_with(settings("cplug@0.1.*")?)?;
    assert!(lz.catalog().find("cplug@0.1.0.rms_norm.c").is_some());
    let err = LayerZero::host_with(settings("fusedops@*")?).err().ok_or("a plugin outside the allowlist loaded")?;
    assert!(refused_with(&err, ReasonCode::PLUGIN_NOT_ALLOWED), "{err}");
    assert!(err.to_string().contains("cplug@0.1.0"), "{err}");
    Ok(())
}

#[test]
fn doctor_and_readiness_show_each_locked_plugins_state() -> TestResult {
    let dir = tempfile::tempdir()?;
    let lib = c_plugin(dir.path(), "cplug", &[])?;
    let lock = dir.path().join("layerzero.lock");
    let out = layerzero_tests::lz()?.arg("lock").arg("--plugin").arg(&lib).arg("--lock").arg(&lock).output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doctor = layerzero_tests::lz()?.args(["doctor", "--json"]).env("LAYERZERO_LOCK", &lock).output()?;
    let v: serde_json::Value = serde_json::from_slice(&doctor.stdout)?;
    assert_eq!(v["plugins"]["locked"][0]["namespace"], "cplug@0.1.0", "{v}");
    assert!(v["plugins"]["locked"][0]["error"].is_null(), "{v}");
    std::fs::write(&lib, b"replaced")?;
    let ready = layerzero_tests::lz()?.arg("readiness-check").env("LAYERZERO_LOCK", &lock).output()?;
    let text = String::from_utf8_lossy(&ready.stdout);
    assert!(
        text.contains("FAIL plugins") && text.contains("cplug@0.1.0") && text.contains("PLUGIN_HASH_MISMATCH"),
        "{text}"
    );
    let doctor = layerzero_tests::lz()?.args(["doctor", "--json"]).env("LAYERZERO_LOCK", &lock).output()?;
    let v: serde_json::Value = serde_json::from_slice(&doctor.stdout)?;
    assert_eq!(v["ok"], false);
    assert!(v["plugins"]["locked"][0]["error"].as_str().is_some_and(|e| e.contains("PLUGIN_HASH_MISMATCH")), "{v}");
    Ok(())
}

/// A hub repository in `dir` with the variants a real hub may hold: the one for this host,
/// another ABI, another architecture, a Python package, and one whose metadata points out of
/// its folder.
fn hub_repo(dir: &std::path::Path) -> TestResult<PathBuf> {
    let repo = dir.join("hub").join("fusedops");
    let variant = |name: &str, meta: serde_json::Value, lib: Option<&std::path::Path>| -> TestResult<()> {
        let v = repo.join("build").join(name);
        std::fs::create_dir_all(&v)?;
        std::fs::write(v.join("metadata.json"), meta.to_string())?;
        if let Some(lib) = lib {
            std::fs::copy(lib, v.join("libfusedops.so"))?;
        }
        Ok(())
    };
    let lib = example_plugin()?;
    let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
    let meta = |kind: &str, abi: u32, arch: &str, library: &str| serde_json::json!({"kind": kind, "abi": abi, "os": os, "arch": arch, "library": library});
    variant("a-escape", meta("c_abi", 1, arch, "../../../../../etc/passwd"), None)?;
    variant("a-symlink", meta("c_abi", 1, arch, "libfusedops.so"), None)?;
    std::os::unix::fs::symlink(&lib, repo.join("build/a-symlink/libfusedops.so"))?;
    variant("b-python", meta("python", 1, arch, "fusedops/__init__.py"), None)?;
    variant("c-lz2", meta("c_abi", 2, arch, "libfusedops.so"), Some(&lib))?;
    variant("d-other-arch", meta("c_abi", 1, "riscv64", "libfusedops.so"), Some(&lib))?;
    variant("e-lz1", meta("c_abi", 1, arch, "libfusedops.so"), Some(&lib))?;
    let huge = repo.join("build/f-huge");
    std::fs::create_dir_all(&huge)?;
    std::fs::write(huge.join("metadata.json"), " ".repeat(100 << 10))?;
    // What an HTTP hub serves in place of a folder listing (a symlink is the server's own
    // business over HTTP: it serves the file it points to).
    let names = ["a-escape", "b-python", "c-lz2", "d-other-arch", "e-lz1", "f-huge"];
    std::fs::write(repo.join("build/index.json"), serde_json::to_string(&names)?)?;
    Ok(repo)
}

/// A real HTTP server (Python's http.server) on 127.0.0.1 serving `dir`, stopped on drop.
struct Server {
    child: std::process::Child,
    port: u16,
}

impl Server {
    fn serve(dir: &std::path::Path) -> TestResult<Server> {
        use std::io::BufRead;
        let mut child = Command::new("python3")
            .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory"])
            .arg(dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let mut line = String::new();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
        let port = line.split("port ").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|p| p.parse().ok());
        match port {
            Some(port) => Ok(Server { child, port }),
            None => {
                let _ = child.kill();
                Err(format!("http.server said {line:?}").into())
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn lz_plugin_add_downloads_the_variant_from_an_http_hub_bounded_and_pinned() -> TestResult {
    let dir = tempfile::tempdir()?;
    let repo = hub_repo(dir.path())?;
    let server = Server::serve(&dir.path().join("hub"))?;
    let url = format!("http://127.0.0.1:{}/{}", server.port, repo.file_name().ok_or("no name")?.to_string_lossy());
    let lock = dir.path().join("layerzero.lock");
    let home = dir.path().join("home");
    let out = layerzero_tests::lz()?
        .args(["plugin", "add", &url, "--lock"])
        .arg(&lock)
        .env("LAYERZERO_HOME", &home)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for line in [
        "rejected a-escape: library \"../../../../../etc/passwd\" leaves the variant's folder",
        "rejected c-lz2: plugin ABI 2",
        "rejected f-huge:",
        "chose    e-lz1",
        "locked fusedops@0.1.0",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    assert!(text.contains("at most 65536"), "the oversized metadata is refused by its size: {text}");
    let file = layerzero::plugins::Lockfile::read(&lock)?;
    let installed = &file.plugins[0];
    assert_eq!(std::fs::read(&installed.path)?, std::fs::read(example_plugin()?)?, "the download is the hub's file");
    assert!(installed.source.contains(&url));
    drop(server);
    Ok(())
}

#[test]
fn lz_plugin_add_picks_the_variant_for_this_host_explains_the_others_and_locks_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let repo = hub_repo(dir.path())?;
    let lock = dir.path().join("layerzero.lock");
    let home = dir.path().join("home");
    let add = |extra: &[&str]| -> TestResult<std::process::Output> {
        Ok(layerzero_tests::lz()?
            .args(["plugin", "add"])
            .arg(&repo)
            .arg("--lock")
            .arg(&lock)
            // No Python environment here: the Python variant is judged without one.
            .args(["--python", "/nonexistent/python3"])
            .args(extra)
            .env("LAYERZERO_HOME", &home)
            .output()?)
    };
    let wrong = add(&["--expect-hash", &"0".repeat(64)])?;
    assert_eq!(wrong.status.code(), Some(2), "{}", String::from_utf8_lossy(&wrong.stdout));
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("PLUGIN_HASH_MISMATCH"));
    assert!(!lock.exists(), "nothing is locked after a refused add");
    let out = add(&[])?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for line in [
        "rejected a-escape: library \"../../../../../etc/passwd\" leaves the variant's folder",
        "rejected a-symlink: library \"libfusedops.so\" resolves to",
        "rejected b-python: a Python package, and cannot run /nonexistent/python3",
        "rejected c-lz2: plugin ABI 2",
        "rejected d-other-arch: built for riscv64",
        "chose    e-lz1",
        "locked fusedops@0.1.0",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    let file = layerzero::plugins::Lockfile::read(&lock)?;
    assert_eq!(file.plugins[0].variant.as_deref(), Some("e-lz1"));
    assert!(file.plugins[0].path.starts_with(&home), "installed under LAYERZERO_HOME: {:?}", file.plugins[0].path);
    let hash = file.plugins[0].library_blake3.clone();
    assert_eq!(add(&["--expect-hash", &hash])?.status.code(), Some(0), "the pinned hash adds again");
    // The hub now serves another file under the same name: the lock disagrees, the add is refused.
    std::fs::write(
        repo.join("build/e-lz1/libfusedops.so"),
        std::fs::read(c_plugin(dir.path(), "x", &[r#"-DCPLUG_NAME="fusedops""#])?)?,
    )?;
    let changed = add(&[])?;
    assert_eq!(changed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&changed.stderr).contains("PLUGIN_HASH_MISMATCH"));
    let verify = layerzero_tests::lz()?.args(["plugin", "verify", "--lock"]).arg(&lock).output()?;
    assert_eq!(
        verify.status.code(),
        Some(0),
        "the locked install is untouched: {}",
        String::from_utf8_lossy(&verify.stdout)
    );
    Ok(())
}

#[test]
fn plugins_needing_different_majors_of_one_runtime_are_refused_naming_both() -> TestResult {
    let dir = tempfile::tempdir()?;
    let build = |file: &str, name: &str, cuda: &str| -> TestResult<Arc<Plugin>> {
        let flags = [
            format!(r#"-DCPLUG_NAME="{name}""#),
            format!(r#"-DCPLUG_EXTRA="\"requires\": {{\"cuda\": \"{cuda}\"}}, ""#),
        ];
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Ok(Arc::new(Plugin::open(&c_plugin(dir.path(), file, &flags)?)?))
    };
    let (a, b, c) = (build("a", "cpluga", "12")?, build("b", "cplugb", "11")?, build("c", "cplugc", "12")?);
    let lz = LayerZero::detected_with_plugins(Catalog::builtin()?, &[a.clone(), c])?;
    assert!(lz.catalog().find("cplugc@0.1.0.rms_norm.c").is_some(), "the same major shares a process");
    let err =
        LayerZero::detected_with_plugins(Catalog::builtin()?, &[a, b]).err().ok_or("cuda 11 and 12 in one process")?;
    assert!(refused_with(&err, ReasonCode::PLUGIN_REQUIREMENTS_CONFLICT), "{err}");
    let m = err.to_string();
    assert!(m.contains("cplugb@0.1.0 needs cuda 11") && m.contains("cpluga@0.1.0 (loaded) needs cuda 12"), "{m}");
    Ok(())
}

#[test]
fn a_plugin_kernel_that_panics_is_contained_as_a_failure_naming_the_panic() -> TestResult {
    let plugin = Arc::new(Plugin::open(&example_plugin()?)?);
    let (_, exec) = plugin.executors().into_iter().next().ok_or("no kernel")?;
    // The runtime refuses a negative eps before any kernel runs, so the executor is called
    // directly: the plugin's own assertion panics inside it.
    let OpArgs::RmsNorm(mut args) = fused_norm(2, 32)? else { return Err("not a norm".into()) };
    args.attrs.eps = Some(-1.0);
    let err = exec.run(&OpArgs::RmsNorm(args)).err().ok_or("a negative eps ran")?;
    let m = err.to_string();
    assert!(matches!(err, layerzero::exec::executor::KernelError::Failed(_)), "{m}");
    assert!(m.contains("returned status 3") && m.contains("panicked: eps must be finite and non-negative"), "{m}");
    // The process and the plugin go on.
    assert!(exec.run(&fused_norm(2, 32)?).is_ok());
    Ok(())
}
