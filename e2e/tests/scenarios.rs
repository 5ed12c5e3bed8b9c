//! Runs every scenario in `e2e/scenarios/`: each case's verdict on its named profile, then the
//! same request dispatched on this machine and held to the oracle where the machine can run
//! it; each run's model against its reference. Prints per section what was executed, what
//! was selected only and why, and `N passed, M failed`. `LAYERZERO_E2E=6.1,7.3` runs only
//! those sections.

use std::collections::BTreeMap;
use std::process::ExitCode;

use layerzero::LayerZero;
use layerzero_e2e::execute::{HostRun, execute};

/// What one section did.
#[derive(Default)]
struct Tally {
    title: String,
    executed: usize,
    refused: usize,
    selected_only: Vec<String>,
    runs: usize,
    failed: usize,
}

fn main() -> ExitCode {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let filter = match layerzero::knobs::E2E.value_in(&layerzero::knobs::process_env) {
        Ok(sections) => sections.items,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let catalog = match layerzero::capabilities::catalog::Catalog::builtin() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot load the shipped capabilities: {e}");
            return ExitCode::FAILURE;
        }
    };
    let gflop = match layerzero::knobs::E2E_GFLOP.value_in(&layerzero::knobs::process_env) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = LayerZero::detected() {
        eprintln!("cannot open this machine: {e}");
        return ExitCode::FAILURE;
    }
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "json")).collect()
        })
        .unwrap_or_default();
    files.sort();
    let (mut passed, mut failed) = (0, 0);
    let mut sections: BTreeMap<String, Tally> = BTreeMap::new();
    for f in files {
        let scenario = match layerzero_e2e::load(&f) {
            Ok(s) => s,
            Err(e) => {
                println!("FAIL  {e}");
                failed += 1;
                continue;
            }
        };
        if !filter.is_empty() && !filter.contains(&scenario.section) {
            continue;
        }
        let s = scenario.section.clone();
        let tally = sections.entry(s.clone()).or_default();
        tally.title = scenario.title.clone();
        for run in &scenario.runs {
            tally.runs += 1;
            match layerzero_e2e::runs::run(run) {
                Ok(what) => {
                    passed += 1;
                    println!("ok    §{s} {}: {} (ran: {what})", scenario.title, run.name);
                }
                Err(e) => {
                    failed += 1;
                    tally.failed += 1;
                    println!("FAIL  §{s} {}: {}\n        {e}", scenario.title, run.name);
                }
            }
        }
        for case in &scenario.cases {
            let mut errs = layerzero_tests::cases::run_case(&catalog, case).err().unwrap_or_default();
            let here = match LayerZero::detected() {
                Ok(host) => execute(host, case, gflop),
                Err(e) => Err(vec![e.to_string()]),
            };
            let line = match here {
                Ok(HostRun::Executed { kernel, detail }) => {
                    tally.executed += 1;
                    format!("executed here: {kernel}, {detail}")
                }
                Ok(HostRun::Refused { codes }) => {
                    tally.refused += 1;
                    format!("refused here by dispatch: {}", codes.join(" "))
                }
                Ok(HostRun::SelectedOnly { why }) => {
                    tally.selected_only.push(why.clone());
                    format!("selected only: {why}")
                }
                Err(e) => {
                    errs.extend(e.into_iter().map(|x| format!("on this machine: {x}")));
                    String::new()
                }
            };
            if errs.is_empty() {
                passed += 1;
                println!("ok    §{s} {}: {} [as expected on {}; {line}]", scenario.title, case.name, case.hardware);
            } else {
                failed += 1;
                tally.failed += 1;
                println!("FAIL  §{s} {}: {}", scenario.title, case.name);
                for e in errs {
                    println!("        {e}");
                }
            }
        }
    }
    summary(&sections);
    println!("{passed} passed, {failed} failed");
    if failed == 0 && passed > 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Per section: executed, refused by dispatch, selected only (with each reason once).
fn summary(sections: &BTreeMap<String, Tally>) {
    println!("\nper section (cases executed on this machine / refused here / selected only; model runs):");
    for (s, t) in sections {
        let mut why: Vec<&String> = t.selected_only.iter().collect();
        why.sort();
        why.dedup();
        let why = if why.is_empty() {
            String::new()
        } else {
            format!(" — selected only: {}", why.iter().map(|w| w.as_str()).collect::<Vec<_>>().join(" | "))
        };
        println!(
            "  §{s} {}: {} executed, {} refused, {} selected only; {} runs; {} failed{why}",
            t.title,
            t.executed,
            t.refused,
            t.selected_only.len(),
            t.runs,
            t.failed
        );
    }
}
