//! The structure `ARCHITECTURE.md` draws, held by tests: the crates form a ladder whose
//! dependencies point down (Cargo refuses a cycle between crates; these tests refuse a rung
//! skipped or a dependency pointing up), no crate's top-level modules import each other in
//! a cycle, the core reads neither the environment nor the clock, and an engine that only
//! selects builds without SQLite, tokenizers, png, clap or indicatif.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use layerzero_tests::{TestResult, repo_root};

/// The workspace's library crates, bottom up, with their source folders and the crates of the
/// workspace each may depend on (normal dependencies).
const LADDER: [(&str, &str, &[&str]); 12] = [
    ("layerzero-core", "core/src", &[]),
    ("layerzero-dylib", "backends/dylib/src", &[]),
    ("layerzero-reference", "backends/reference/src", &["layerzero-core"]),
    ("layerzero-cpu", "backends/cpu/src", &["layerzero-core"]),
    ("layerzero-onednn", "backends/onednn/src", &["layerzero-core", "layerzero-dylib"]),
    ("layerzero-gpu", "backends/gpu/src", &["layerzero-core"]),
    ("layerzero-plugin-abi", "plugins/abi/src", &[]),
    ("layerzero-plugin", "backends/plugin/src", &["layerzero-core", "layerzero-dylib", "layerzero-plugin-abi"]),
    (
        "layerzero",
        "layerzero/src",
        &[
            "layerzero-core",
            "layerzero-dylib",
            "layerzero-reference",
            "layerzero-cpu",
            "layerzero-onednn",
            "layerzero-gpu",
            "layerzero-plugin",
        ],
    ),
    ("layerzero-llm", "llm/src", &["layerzero"]),
    ("layerzero-cli", "cli/src", &["layerzero", "layerzero-llm"]),
    ("layerzero-python", "bindings/python/src", &["layerzero", "layerzero-llm"]),
];

/// Runs cargo (the one running these tests) in the repository root and returns its output.
fn cargo(args: &[&str]) -> TestResult<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo).args(args).current_dir(repo_root()).output()?;
    if !out.status.success() {
        return Err(format!("cargo {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8(out.stdout)?)
}

#[test]
fn the_crates_depend_only_on_the_rungs_below_them() -> TestResult {
    let metadata: serde_json::Value =
        serde_json::from_str(&cargo(&["metadata", "--format-version", "1", "--no-deps"])?)?;
    let packages = metadata["packages"].as_array().ok_or("cargo metadata lists no packages")?;
    for (name, _, allowed) in LADDER {
        let package = packages.iter().find(|p| p["name"] == name).ok_or(format!("no crate {name} in the workspace"))?;
        let deps = package["dependencies"].as_array().ok_or("a package without dependencies")?;
        let ours: BTreeSet<&str> = deps
            .iter()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str())
            .filter(|d| d.starts_with("layerzero"))
            .collect();
        let above: Vec<&&str> = ours.iter().filter(|d| !allowed.contains(d)).collect();
        assert!(above.is_empty(), "{name} depends on {above:?}; it may take only {allowed:?}");
    }
    Ok(())
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> TestResult<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(out)
}

/// `text` without its `//` comments (a doc line may name any module).
fn code(text: &str) -> String {
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The top-level modules a piece of code takes items from: `crate::name` paths and the
/// names of `use crate::{..}` groups.
fn imports(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let body = group.split('}').next().unwrap_or("");
            out.extend(body.split(',').map(|item| ident(item.trim())).filter(|n| !n.is_empty()));
        } else {
            out.insert(ident(rest));
        }
    }
    out
}

/// Strongly connected groups of more than one module in `graph`.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(m) = stack.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> = graph.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for (m, r) in &reached {
        let group: BTreeSet<String> =
            r.iter().filter(|o| reached.get(o).is_some_and(|back| back.contains(*m))).cloned().collect();
        if group.len() > 1 && !out.contains(&group) {
            out.push(group);
        }
    }
    out
}

#[test]
fn no_crate_has_top_level_modules_that_import_each_other_in_a_cycle() -> TestResult {
    let root = repo_root();
    for (name, src, _) in LADDER {
        let dir = root.join(src);
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in sources(&dir)? {
            let rel = file.strip_prefix(&dir)?;
            let first = rel.components().next().ok_or("an empty path")?.as_os_str().to_string_lossy();
            let module = first.trim_end_matches(".rs").to_owned();
            if module == "lib" || module == "main" {
                continue;
            }
            let mut uses = imports(&code(&std::fs::read_to_string(&file)?));
            uses.remove(&module);
            graph.entry(module).or_default().extend(uses);
        }
        let modules: BTreeSet<String> = graph.keys().cloned().collect();
        graph.values_mut().for_each(|to| to.retain(|m| modules.contains(m)));
        // Single-file crates: the shared-library probe and the plugin ABI.
        assert!(
            graph.len() > 1 || ["layerzero-dylib", "layerzero-plugin-abi"].contains(&name),
            "{name}: no modules found under {src}"
        );
        let found = cycles(&graph);
        assert!(found.is_empty(), "{name}: top-level modules importing each other in a cycle: {found:?}");
    }
    Ok(())
}

#[test]
fn the_core_reads_no_environment_and_reads_the_clock_only_in_its_time_module() -> TestResult {
    let dir = repo_root().join("core/src");
    for file in sources(&dir)? {
        let rel = file.strip_prefix(&dir)?.to_string_lossy().into_owned();
        let text = code(&std::fs::read_to_string(&file)?);
        // Tests may make temporary folders; the code they test may not read the environment.
        let main = text.split("#[cfg(test)]").next().unwrap_or("");
        assert!(!main.contains("std::env::"), "{rel} reads the environment");
        let clock = main.contains("SystemTime::now") || main.contains("Instant::now");
        assert!(!clock || rel == "time.rs", "{rel} reads the clock");
    }
    Ok(())
}

#[test]
fn an_engine_that_only_selects_builds_without_sqlite_tokenizers_png_or_clap() -> TestResult {
    // `examples/selection-only` depends on `layerzero` with `default-features = false`.
    let tree = cargo(&["tree", "-p", "layerzero-example-selection", "-e", "normal", "--prefix", "none"])?;
    let crates: BTreeSet<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    for heavy in ["rusqlite", "libsqlite3-sys", "tokenizers", "png", "clap", "indicatif"] {
        assert!(!crates.contains(heavy), "a selection-only engine compiles {heavy}");
    }
    assert!(crates.contains("layerzero-core") && crates.contains("layerzero-cpu"), "{crates:?}");
    Ok(())
}
