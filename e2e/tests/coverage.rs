//! The map of the specification in `e2e/README.md` holds: one row per item, every scenario
//! file named in its section's row, every named test present.

use std::collections::BTreeMap;
use std::path::Path;

use layerzero_e2e::coverage::{self, ITEMS, Status};

type TestResult = Result<(), String>;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Each scenario file's name and section.
fn scenario_sections() -> Result<BTreeMap<String, String>, String> {
    let dir = root().join("e2e/scenarios");
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = e.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|x| x == "json") {
            let s = layerzero_e2e::load(&path)?;
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            out.insert(name, s.section);
        }
    }
    Ok(out)
}

#[test]
fn every_item_and_every_scenario_has_a_row_naming_checks_that_exist() -> TestResult {
    let readme = std::fs::read_to_string(root().join("e2e/README.md")).map_err(|e| e.to_string())?;
    let rows = coverage::read(&readme)?;
    let errors = coverage::check(&rows, root(), &scenario_sections()?);
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    let counts = coverage::counts(&rows);
    let n = |s| counts.get(&s).copied().unwrap_or(0);
    println!(
        "{} items: {} executed, {} selected only, {} need a GPU",
        rows.len(),
        n(Status::Executed),
        n(Status::SelectedOnly),
        n(Status::NeedsGpu)
    );
    if rows.len() != ITEMS.len() { Err(format!("{} rows for {} items", rows.len(), ITEMS.len())) } else { Ok(()) }
}

#[test]
fn a_map_missing_an_item_or_naming_a_missing_test_is_refused() -> TestResult {
    let readme = "| § | item | status | checks |\n|---|---|---|---|\n\
        | 6.1 | prefill | executed | `e2e/README.md`, `e2e/tests/coverage.rs::no_such_test` |\n\
        | 6.1 | again | needs a GPU | `e2e/README.md` |\n";
    let rows = coverage::read(readme)?;
    let errors = coverage::check(&rows, root(), &BTreeMap::from([("6_2_x.json".to_owned(), "6.2".to_owned())]));
    let has = |s: &str| errors.iter().any(|e| e.contains(s));
    for want in ["no function `no_such_test`", "§6.1 has 2 rows", "§6.2 has no row", "6_2_x.json (§6.2) is not named"]
    {
        if !has(want) {
            return Err(format!("no error saying {want:?} in {errors:?}"));
        }
    }
    match coverage::read("| 7.1 | plan | partly | `x` |") {
        Err(e) if e.contains("\"partly\"") => Ok(()),
        other => Err(format!("a status outside the three words was read: {other:?}")),
    }
}
