//! The shipped dispatch tables are current: re-solving each from its workload and profile
//! gives the same table apart from `created_at`, and each loads into a plan for its profile
//! with no entry dropped.

use std::sync::Arc;

use layerzero::capabilities::catalog::Catalog;
use layerzero::hardware::named;
use layerzero::plan::solve::{self, Provenance};
use layerzero::plan::table::{DispatchTable, Plan};
use layerzero::plan::workload::Workload;
use layerzero::policy::Policy;
use layerzero::select::Selector;
use layerzero_tests::{TestResult, repo_root};

#[test]
fn every_shipped_profile_has_a_current_llama_table() -> TestResult {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join("workloads/llama-3-8b.json"))?;
    let workload = Workload::from_json(&text, "workloads/llama-3-8b.json")?;
    let catalog = Catalog::builtin()?;
    for name in named::builtin_names() {
        let path = root.join(format!("dispatch_tables/{name}-llama-3-8b.json"));
        let shipped = DispatchTable::read(&path).map_err(|r| format!("{}", r.error))?;
        let sel = Selector::planning(catalog.clone(), Arc::new(named::load(name)?), Arc::new(Policy::default()))?;
        let fresh = solve::solve(
            &workload,
            &sel,
            Provenance {
                perfdb_digest: None,
                created_at: shipped.header.created_at.clone(),
                command: shipped.header.command.clone(),
            },
        )?;
        assert!(
            fresh.to_json() == std::fs::read_to_string(&path)?,
            "{} is stale: regenerate it with the command in dispatch_tables/README.md",
            path.display()
        );
        assert!(shipped.header.command.contains(&format!("--hardware {name} ")), "{}", shipped.header.command);
        let plan = Plan::new(&shipped, &sel).map_err(|r| format!("{name}: {r}"))?;
        assert!(plan.dropped().is_empty(), "{name}: {:?}", plan.dropped());
        assert_eq!(plan.len(), shipped.entries.len());
    }
    Ok(())
}
