//! The E2E matrix as data: `e2e/scenarios/*.json` mirror the sections of the E2E test
//! specification. Each case runs selection through the public API and checks the verdict
//! (see `layerzero_tests::cases`). A scenario with a case that checks nothing is refused.

use layerzero_tests::cases::Case;
use serde::Deserialize;

/// A scenario file: one section of the specification.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Section of the E2E specification (`6.1`, `7.3`, ...).
    pub section: String,
    /// Its title.
    pub title: String,
    /// The cases.
    pub cases: Vec<Case>,
}

/// Loads a scenario file; refuses one with a case that checks nothing.
pub fn load(path: &std::path::Path) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let s: Scenario = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if s.cases.is_empty() {
        return Err(format!("{}: no cases", path.display()));
    }
    if let Some(c) = s.cases.iter().find(|c| c.expect.is_empty()) {
        return Err(format!("{}: case {:?} checks nothing", path.display(), c.name));
    }
    Ok(s)
}
