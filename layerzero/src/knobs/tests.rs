use crate::TestResult;
use std::collections::{BTreeMap, BTreeSet};

use super::*;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let map: BTreeMap<String, OsString> = pairs.iter().map(|(k, v)| ((*k).to_owned(), OsString::from(v))).collect();
    move |name| map.get(name).cloned()
}

#[test]
fn names_are_unique_prefixed_documented_and_found() {
    let names: BTreeSet<&str> = all().iter().map(|k| k.name()).collect();
    assert_eq!(names.len(), all().len());
    assert!(all().iter().all(|k| k.name().starts_with("LAYERZERO_") && !k.doc().is_empty()));
    assert!(all().iter().all(|k| !k.default_text().is_empty() && !k.doc().starts_with(' ')));
    assert_eq!(find("LAYERZERO_PERFDB").map(|k| k.name()), Some("LAYERZERO_PERFDB"));
    assert!(find("LAYERZERO_TEST_NOPE").is_none());
}

#[test]
fn types_and_defaults_read_as_doctor_shows_them() {
    assert_eq!(PLAN_MODE.type_name(), "enum(off|prefer|strict)");
    assert_eq!((CACHE_CAPACITY.type_name(), CACHE_CAPACITY.default_text()), ("u64".to_owned(), "4096".to_owned()));
    assert_eq!(HOME.type_name(), "path");
    assert_eq!((E2E.type_name(), E2E.default_text()), ("string".to_owned(), "all sections".to_owned()));
    assert_eq!(VALIDATE_OUTPUTS.type_name(), "bool");
    assert_eq!(CPU_ISA.type_name(), "enum(portable|avx2|avx512|avx512_bf16|amx|native)");
    assert_eq!((POLICY_POLL_MS.default_text(), DISPATCH_TABLE.default_text()), ("1000".to_owned(), "none".to_owned()));
}

#[test]
fn paths_resolve_from_home_and_the_platform_cache_folder() -> TestResult {
    if cfg!(unix) && !cfg!(target_os = "macos") {
        let s = Settings::from_lookup(&env(&[("HOME", "/home/u")]))?;
        assert_eq!(s.perfdb_path(), PathBuf::from("/home/u/.cache/layerzero/perfdb.sqlite"));
        let s = Settings::from_lookup(&env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg")]))?;
        assert_eq!(s.perfdb_path(), PathBuf::from("/xdg/layerzero/perfdb.sqlite"));
        // A relative XDG_CACHE_HOME is invalid per the spec and ignored.
        let s = Settings::from_lookup(&env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "rel")]))?;
        assert_eq!(s.home(), PathBuf::from("/home/u/.cache/layerzero"));
    }
    let s = Settings::from_lookup(&env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg"), ("LAYERZERO_HOME", "/lz")]))?;
    assert_eq!(
        (s.perfdb_path(), s.calibration_path()),
        (PathBuf::from("/lz/perfdb.sqlite"), "/lz/calibration.json".into())
    );
    let s = Settings::from_lookup(&env(&[("LAYERZERO_HOME", "/lz"), ("LAYERZERO_PERFDB", "/db/x.sqlite")]))?;
    assert_eq!(s.perfdb_path(), PathBuf::from("/db/x.sqlite"));
    // Empty counts as unset.
    let s = Settings::from_lookup(&env(&[("LAYERZERO_HOME", "/lz"), ("LAYERZERO_PERFDB", "")]))?;
    assert_eq!(s.perfdb_path(), PathBuf::from("/lz/perfdb.sqlite"));
    Ok(())
}

#[test]
fn values_are_typed_and_errors_name_the_variable_and_value() -> TestResult {
    let s = Settings::from_lookup(&env(&[]))?;
    assert_eq!(s, Settings::default());
    assert_eq!((s.plan_mode, s.cache_capacity, &s.dispatch_table, &s.policy), (PlanMode::Prefer, 4096, &None, &None));
    assert!(s.e2e_sections.items.is_empty());

    let s = Settings::from_lookup(&env(&[
        ("LAYERZERO_PLAN_MODE", "Strict"),
        ("LAYERZERO_CACHE_CAPACITY", "17"),
        ("LAYERZERO_POLICY", "/p.json"),
        ("LAYERZERO_DISPATCH_TABLE", "/t.json"),
        ("LAYERZERO_E2E", "6.1, 7.3"),
        ("LAYERZERO_CPU_ISA", "avx2"),
    ]))?;
    assert_eq!((s.plan_mode, s.cache_capacity, s.cpu_isa), (PlanMode::Strict, 17, IsaCap::Avx2));
    assert_eq!((s.policy, s.dispatch_table), (Some("/p.json".into()), Some("/t.json".into())));
    assert_eq!(s.e2e_sections.items, vec!["6.1".to_owned(), "7.3".to_owned()]);

    let bad = env(&[("LAYERZERO_PLAN_MODE", "sometimes"), ("LAYERZERO_CACHE_CAPACITY", "-3")]);
    let err = Settings::from_lookup(&bad).err().ok_or("bad knob values must be refused")?.to_string();
    assert!(err.contains("LAYERZERO_PLAN_MODE") && err.contains("sometimes") && err.contains("strict"), "{err}");
    let (lenient, errors) = Settings::lenient(&bad);
    assert_eq!((lenient.plan_mode, lenient.cache_capacity, errors.len()), (PlanMode::Prefer, 4096, 2));
    assert!(errors[1].to_string().contains("LAYERZERO_CACHE_CAPACITY=\"-3\""), "{}", errors[1]);
    let report = report_in(&bad);
    assert_eq!(report.len(), all().len());
    let pm = report.iter().find(|r| r.name == "LAYERZERO_PLAN_MODE");
    assert!(pm.is_some_and(|r| r.current.as_deref() == Some("sometimes") && r.error.is_some()));
    let table = report.iter().find(|r| r.name == "LAYERZERO_DISPATCH_TABLE");
    assert!(table.is_some_and(|r| r.current.is_none() && r.error.is_none()));
    Ok(())
}

#[test]
fn booleans_periods_and_counts_parse_with_their_bounds() {
    for (t, v) in [("1", true), ("Yes", true), ("on", true), ("0", false), ("FALSE", false), ("off", false)] {
        assert_eq!(VALIDATE_OUTPUTS.value_in(&env(&[("LAYERZERO_VALIDATE_OUTPUTS", t)])).ok(), Some(Some(v)), "{t}");
    }
    let err = VALIDATE_OUTPUTS.value_in(&env(&[("LAYERZERO_VALIDATE_OUTPUTS", "maybe")])).err();
    assert!(err.is_some_and(|e| e.to_string().contains("LAYERZERO_VALIDATE_OUTPUTS=\"maybe\"")));
    let err = POLICY_POLL_MS.value_in(&env(&[("LAYERZERO_POLICY_POLL_MS", "5")])).err();
    assert!(err.is_some_and(|e| e.to_string().contains("LAYERZERO_POLICY_POLL_MS=5: expected at least 10")));
    let err = FAILURE_THRESHOLD.value_in(&env(&[("LAYERZERO_FAILURE_THRESHOLD", "0")])).err();
    assert!(err.is_some_and(|e| e.to_string().contains("LAYERZERO_FAILURE_THRESHOLD=0")));
    let err = MAX_ABANDONED.value_in(&env(&[("LAYERZERO_MAX_ABANDONED", "4294967296")])).err();
    assert!(err.is_some_and(|e| e.to_string().contains("expected at most 4294967295")));
    let err = DENY.value_in(&env(&[("LAYERZERO_DENY", "a, b c")])).err();
    assert!(err.is_some_and(|e| e.to_string().contains("\"b c\" is not a kernel id or glob")));
}

#[test]
fn knobs_become_policy_fields_in_order() -> TestResult {
    let s = Settings::from_lookup(&env(&[
        ("LAYERZERO_FAILURE_THRESHOLD", "5"),
        ("LAYERZERO_KERNEL_TIMEOUT_MS", "40"),
        ("LAYERZERO_DENY", "cpu_reference.*, onednn.*"),
    ]))?;
    let mut p = crate::policy::Policy::default();
    let applied = p.apply_overrides(&s.policy_overrides());
    assert_eq!((p.health.failure_threshold, p.kernel_timeout_ms, p.rules.len()), (5, Some(40), 2));
    let fields: Vec<_> = applied.iter().map(|o| (o.knob, o.field)).collect();
    assert_eq!(
        fields,
        vec![
            ("LAYERZERO_FAILURE_THRESHOLD", "health.failure_threshold"),
            ("LAYERZERO_KERNEL_TIMEOUT_MS", "kernel_timeout_ms"),
            ("LAYERZERO_DENY", "rules"),
            ("LAYERZERO_DENY", "rules"),
        ]
    );
    assert_eq!(applied[3].value, "rules[1] = deny onednn.*");
    Ok(())
}

/// Every `LAYERZERO_*` name used anywhere in the repository is declared here.
#[test]
fn every_variable_in_the_repository_is_declared() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut used = BTreeSet::new();
    // Every crate, the tools and the documents; not build outputs, fixtures or git's objects.
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            let skip = ["target", "fixtures", "data", ".git", "models", ".venv"];
            if p.file_name().is_some_and(|n| skip.iter().any(|s| n == *s)) {
                continue;
            }
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.filter_map(|e| e.ok().map(|e| e.path())));
            }
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&p) else { continue };
        let mut rest = text.as_str();
        while let Some(i) = rest.find("LAYERZERO_") {
            let tail = &rest[i..];
            let end = tail.find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'));
            let name = &tail[..end.unwrap_or(tail.len())];
            // `LAYERZERO_TEST_*` names are test-local; a bare prefix is a mention, not a variable.
            if name.len() > "LAYERZERO_".len() && !name.starts_with("LAYERZERO_TEST_") && !name.ends_with('_') {
                used.insert((name.to_owned(), p.display().to_string()));
            }
            rest = &tail["LAYERZERO_".len()..];
        }
    }
    let missing: Vec<_> = used.iter().filter(|(n, _)| find(n).is_none()).collect();
    assert!(missing.is_empty(), "undeclared LAYERZERO_* variables (declare them in knobs/mod.rs): {missing:?}");
}
