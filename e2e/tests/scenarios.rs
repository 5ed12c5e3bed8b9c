//! Runs every scenario in `e2e/scenarios/` and prints `N passed, M failed`.
//! `LAYERZERO_E2E=6.1,7.3` runs only those sections.

use std::process::ExitCode;

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
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "json")).collect()
        })
        .unwrap_or_default();
    files.sort();
    let (mut passed, mut failed) = (0, 0);
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
        for run in &scenario.runs {
            match layerzero_e2e::runs::run(run) {
                Ok(what) => {
                    passed += 1;
                    println!("ok    §{} {}: {} (ran: {what})", scenario.section, scenario.title, run.name);
                }
                Err(e) => {
                    failed += 1;
                    println!("FAIL  §{} {}: {}", scenario.section, scenario.title, run.name);
                    println!("        {e}");
                }
            }
        }
        for case in &scenario.cases {
            match layerzero_tests::cases::run_case(&catalog, case) {
                Ok(()) => {
                    passed += 1;
                    println!("ok    §{} {}: {}", scenario.section, scenario.title, case.name);
                }
                Err(errs) => {
                    failed += 1;
                    println!("FAIL  §{} {}: {}", scenario.section, scenario.title, case.name);
                    for e in errs {
                        println!("        {e}");
                    }
                }
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed == 0 && passed > 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
