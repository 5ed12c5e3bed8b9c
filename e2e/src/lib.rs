//! The E2E matrix as data: `e2e/scenarios/*.json` mirror the sections of the E2E test
//! specification. Each case runs selection through the public API on its named profile and
//! checks the verdict (see `layerzero_tests::cases`), then is dispatched for real on this
//! machine where it can be and held to the oracle ([`execute`]); each run executes a model
//! and holds it to its Hugging Face reference ([`runs`]). A scenario with a case that checks
//! nothing is refused. [`coverage`] reads the map of the specification in `e2e/README.md`.

pub mod coverage;
pub mod execute;
pub mod runs;

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
    /// The selection cases.
    #[serde(default)]
    pub cases: Vec<Case>,
    /// The executions.
    #[serde(default)]
    pub runs: Vec<runs::Run>,
}

/// Loads a scenario file; refuses one with a case that checks nothing.
pub fn load(path: &std::path::Path) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let s: Scenario = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if s.cases.is_empty() && s.runs.is_empty() {
        return Err(format!("{}: no cases and no runs", path.display()));
    }
    if let Some(c) = s.cases.iter().find(|c| c.expect.is_empty()) {
        return Err(format!("{}: case {:?} checks nothing", path.display(), c.name));
    }
    Ok(s)
}
