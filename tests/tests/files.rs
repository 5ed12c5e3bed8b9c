//! Every shipped file validates; generated files are in sync with the code.

use layerzero::capabilities::catalog::Catalog;
use layerzero::hardware::named;
use layerzero::schema::{SchemaKind, violations};
use layerzero_tests::{TestResult, repo_root};

fn read_json(path: &std::path::Path) -> TestResult<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?)
}

fn json_files(dir: &str) -> TestResult<Vec<std::path::PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(repo_root().join(dir))
        .map_err(|e| format!("{dir}: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    Ok(files)
}

#[test]
fn every_schema_is_a_valid_draft_2020_12_schema() -> TestResult {
    for kind in SchemaKind::ALL {
        let schema: serde_json::Value = serde_json::from_str(kind.text()).map_err(|e| format!("{kind:?}: {e}"))?;
        assert!(jsonschema::draft202012::new(&schema).is_ok(), "{} does not compile", kind.file_name());
        assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema", "{}", kind.file_name());
    }
    Ok(())
}

#[test]
fn every_shipped_capability_file_validates_against_the_schema() -> TestResult {
    let files = json_files("capabilities")?;
    assert_eq!(files.len(), 10, "one file per backend: {files:?}");
    for f in &files {
        let errs = violations(SchemaKind::Capabilities, &read_json(f)?)?;
        assert!(errs.is_empty(), "{}: {errs:?}", f.display());
    }
    // The directory and the compiled-in catalog are the same files.
    let from_dir = Catalog::load_dir(&repo_root().join("capabilities"))?;
    let builtin = Catalog::builtin()?;
    assert_eq!(from_dir.hash(), builtin.hash());
    Ok(())
}

#[test]
fn every_shipped_hardware_profile_validates_and_loads_by_name() -> TestResult {
    let files = json_files("capabilities/hardware")?;
    let names = named::builtin_names();
    assert_eq!(files.len(), names.len(), "every profile file is compiled in");
    for required in [
        "t4", "a100", "a10", "l4", "rtx4090", "h100", "h200", "b200", "mi250x", "mi300x", "mi355x", "zen3", "icx",
        "zen4", "spr",
    ] {
        assert!(names.contains(&required), "missing profile {required}");
        let p = named::load(required).map_err(|e| format!("{required}: {e}"))?;
        assert_eq!(p.fingerprint.len(), 16);
    }
    for f in &files {
        let errs = violations(SchemaKind::Hardware, &read_json(f)?)?;
        assert!(errs.is_empty(), "{}: {errs:?}", f.display());
    }
    Ok(())
}

#[test]
fn shipped_profiles_have_distinct_stable_fingerprints() -> TestResult {
    let mut seen = std::collections::BTreeMap::new();
    for name in named::builtin_names() {
        let a = named::load(name)?;
        let b = named::load(name)?;
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_eq!(seen.insert(a.fingerprint.clone(), name), None, "{name} shares a fingerprint");
    }
    Ok(())
}

#[test]
fn example_requests_and_policies_validate() -> TestResult {
    for f in json_files("examples/requests")? {
        let errs = violations(SchemaKind::Request, &read_json(&f)?)?;
        assert!(errs.is_empty(), "{}: {errs:?}", f.display());
        let text = std::fs::read_to_string(&f)?;
        assert!(layerzero::model::request::Request::from_json(&text).is_ok(), "{}", f.display());
    }
    for f in json_files("examples/policies")? {
        let text = std::fs::read_to_string(&f)?;
        layerzero::policy::Policy::from_json(&text, &f.display().to_string())?;
    }
    Ok(())
}

#[test]
fn reason_codes_json_is_generated_from_the_enum() -> TestResult {
    let committed = read_json(&repo_root().join("schemas/reason_codes.json"))?;
    assert!(violations(SchemaKind::ReasonCodes, &committed).unwrap_or_default().is_empty());
    let generated = layerzero::reason::reason_codes_document();
    assert!(committed == generated, "schemas/reason_codes.json is stale: run tools/reason_codes.sh");
    Ok(())
}
