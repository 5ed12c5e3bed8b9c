//! The core is deterministic: the same inputs give a byte-identical report.

use layerzero::hardware::named;
use layerzero::model::request::Request;
use layerzero_tests::{TestResult, planner, repo_root};

fn example_requests() -> TestResult<Vec<(String, Request)>> {
    let dir = repo_root().join("examples/requests");
    let mut out: Vec<(String, Request)> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .map(|p| -> TestResult<_> {
            let text = std::fs::read_to_string(&p)?;
            let req = Request::from_json(&text).map_err(|e| format!("{}: {e}", p.display()))?;
            Ok((p.display().to_string(), req))
        })
        .collect::<TestResult<_>>()?;
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

#[test]
fn identical_inputs_give_byte_identical_reports_on_every_profile() -> TestResult {
    for hw in named::builtin_names() {
        let a = planner(hw)?;
        let b = planner(hw)?;
        for (name, req) in example_requests()? {
            let ra = serde_json::to_string(&a.explain(&req).to_json()).unwrap_or_default();
            let rb = serde_json::to_string(&b.explain(&req).to_json()).unwrap_or_default();
            let again = serde_json::to_string(&a.explain(&req).to_json()).unwrap_or_default();
            assert_eq!(ra, rb, "{hw} {name}: two selectors disagree");
            assert_eq!(ra, again, "{hw} {name}: one selector disagrees with itself");
        }
    }
    Ok(())
}

#[test]
fn every_report_validates_against_its_schema() -> TestResult {
    for hw in named::builtin_names() {
        let sel = planner(hw)?;
        for (name, req) in example_requests()? {
            let json = sel.explain(&req).to_json();
            let errs = layerzero::schema::violations(layerzero::schema::SchemaKind::SelectionReport, &json)?;
            assert!(errs.is_empty(), "{hw} {name}: {errs:?}");
        }
    }
    Ok(())
}

#[test]
fn the_selected_kernel_has_the_lowest_total_among_eligible_candidates() -> TestResult {
    for hw in named::builtin_names() {
        let sel = planner(hw)?;
        for (name, req) in example_requests()? {
            let r = sel.explain(&req);
            let best = r.candidates.iter().filter_map(|c| c.score.as_ref().map(|s| (s.total_ns, &c.kernel))).fold(
                None::<(f64, &String)>,
                |a, b| match a {
                    Some(a) if a.0 <= b.0 => Some(a),
                    _ => Some(b),
                },
            );
            assert_eq!(r.selected.as_ref(), best.map(|b| b.1), "{hw} {name}");
            for c in &r.candidates {
                assert_eq!(
                    c.reasons.is_empty(),
                    c.score.is_some(),
                    "{hw} {name} {}: a rejection always has a reason",
                    c.kernel
                );
            }
        }
    }
    Ok(())
}
