//! The map of the E2E specification in `e2e/README.md`: one table row per item (§6.1 …
//! §24), each with its status on this machine and the tests that check it. [`check`] holds
//! the map to the repository: every item has one row, every scenario file is named in the
//! row of its section, every named test exists.

use std::collections::BTreeMap;
use std::path::Path;

/// Every item of the specification, in its order: 59 rows (§13's eleven scenarios share one).
pub const ITEMS: [&str; 59] = [
    "6.1", "6.2", "6.3", "6.4", "6.5", "6.6", "6.7", "6.8", "6.9", "6.10", "6.11", "6.12", "6.13", "6.14", "6.15",
    "6.16", "6.17", "6.18", "6.19", "7.1", "7.2", "7.3", "7.4", "7.5", "7.6", "7.7", "7.8", "8.1", "8.2", "8.3", "8.4",
    "8.5", "9.1", "9.2", "9.3", "9.4", "10.1", "10.2", "10.3", "10.4", "10.5", "11.1", "11.2", "11.3", "11.4", "11.5",
    "12", "13", "14", "15", "16", "17", "18", "19", "20", "21", "22", "23", "24",
];

/// The scenarios of §13 (failure injection), each of which its row must name a test for.
pub const FAILURE_SCENARIOS: usize = 11;

/// How an item is checked on the machine the suite runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// Run on this CPU and held to a reference.
    Executed,
    /// Checked by selection (planning on named profiles) only.
    SelectedOnly,
    /// Its pass criteria need a GPU this machine does not have.
    NeedsGpu,
}

impl Status {
    /// The word of the table.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Executed => "executed",
            Status::SelectedOnly => "selected only",
            Status::NeedsGpu => "needs a GPU",
        }
    }

    fn parse(s: &str) -> Option<Status> {
        [Status::Executed, Status::SelectedOnly, Status::NeedsGpu].into_iter().find(|x| x.as_str() == s)
    }
}

/// One row of the map.
#[derive(Debug, Clone)]
pub struct Row {
    /// The item (`6.1`, `13`, ...).
    pub item: String,
    /// Its title.
    pub title: String,
    /// Its status.
    pub status: Status,
    /// What checks it: `path::function` for a test, a path for a scenario file or script.
    pub checks: Vec<String>,
}

/// The rows of the map: every table line whose first cell is an item number.
pub fn read(readme: &str) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for (n, line) in readme.lines().enumerate() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
        let Some(first) = cells.first() else { continue };
        let item = first.trim_start_matches('§');
        if !line.trim_start().starts_with('|')
            || item.is_empty()
            || !item.chars().all(|c| c.is_ascii_digit() || c == '.')
        {
            continue;
        }
        if cells.len() < 4 {
            return Err(format!("README line {}: a row needs 4 cells (item, title, status, checks)", n + 1));
        }
        let status = Status::parse(cells[2])
            .ok_or_else(|| format!("README line {}: status {:?} is none of the three words", n + 1, cells[2]))?;
        let checks = cells[3]
            .split('`')
            .enumerate()
            .filter(|(i, s)| i % 2 == 1 && !s.is_empty())
            .map(|(_, s)| s.to_owned())
            .collect();
        rows.push(Row { item: item.to_owned(), title: cells[1].to_owned(), status, checks });
    }
    Ok(rows)
}

/// Every way the map disagrees with the repository at `root` (empty when it holds).
pub fn check(rows: &[Row], root: &Path, scenario_sections: &BTreeMap<String, String>) -> Vec<String> {
    let mut errors = Vec::new();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for r in rows {
        *seen.entry(r.item.as_str()).or_default() += 1;
        if !ITEMS.contains(&r.item.as_str()) {
            errors.push(format!("§{} is not an item of the specification", r.item));
        }
        if r.checks.is_empty() {
            errors.push(format!("§{} names nothing that checks it", r.item));
        }
        for c in &r.checks {
            if let Err(e) = exists(root, c) {
                errors.push(format!("§{}: {e}", r.item));
            }
        }
    }
    for item in ITEMS {
        match seen.get(item) {
            None => errors.push(format!("§{item} has no row")),
            Some(&n) if n > 1 => errors.push(format!("§{item} has {n} rows")),
            Some(_) => {}
        }
    }
    for (file, section) in scenario_sections {
        let named = rows.iter().any(|r| &r.item == section && r.checks.iter().any(|c| c.ends_with(file.as_str())));
        if !named {
            errors.push(format!("scenario {file} (§{section}) is not named in the row of §{section}"));
        }
    }
    if let Some(r) = rows.iter().find(|r| r.item == "13") {
        let tests = r.checks.iter().filter(|c| c.contains("::")).count();
        if tests < FAILURE_SCENARIOS {
            errors.push(format!("§13 names {tests} tests for its {FAILURE_SCENARIOS} scenarios"));
        }
    }
    errors
}

/// A check exists: `path::function` is a file holding `fn function` (Rust) or `def function`
/// (a Python test), a path a file.
fn exists(root: &Path, check: &str) -> Result<(), String> {
    let (path, function) = match check.split_once("::") {
        Some((p, f)) => (p, Some(f)),
        None => (check, None),
    };
    let text = std::fs::read_to_string(root.join(path)).map_err(|e| format!("`{path}`: {e}"))?;
    match function {
        Some(f) if !text.contains(&format!("fn {f}(")) && !text.contains(&format!("def {f}(")) => {
            Err(format!("`{path}` has no function `{f}`"))
        }
        _ => Ok(()),
    }
}

/// Rows per status.
pub fn counts(rows: &[Row]) -> BTreeMap<Status, usize> {
    let mut c = BTreeMap::new();
    for r in rows {
        *c.entry(r.status).or_default() += 1;
    }
    c
}
