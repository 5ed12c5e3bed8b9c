//! The selection table: `tests/data/selection_cases.json`, requests across the shipped
//! profiles with the expected kernel or the exact reason codes per kernel, each case a fact
//! read from upstream (see `capabilities/*.json` sources).

use layerzero_tests::cases::{load_cases, run_case};
use layerzero_tests::{TestResult, catalog, repo_root};

#[test]
fn every_selection_case_holds() -> TestResult {
    let cases = load_cases(&repo_root().join("tests/data/selection_cases.json"))?;
    assert!(cases.len() >= 60, "only {} cases", cases.len());
    let catalog = catalog()?;
    let mut profiles = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for c in &cases {
        profiles.insert(c.hardware.clone());
        if let Err(errs) = run_case(&catalog, c) {
            failures.push(format!("{} [{}]:\n    {}", c.name, c.hardware, errs.join("\n    ")));
        }
    }
    assert!(profiles.len() >= 12, "cases cover only {profiles:?}");
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
    Ok(())
}
