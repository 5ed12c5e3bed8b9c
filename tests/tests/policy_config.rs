//! E2E spec §19, policy and configuration: environment overrides, runtime changes
//! (prefer/avoid/lock) on a serving handle, strict and plan mode toggles, per-request
//! overrides, time-boxed rules, a watched policy file. Pass criteria: a policy change
//! invalidates cached choices, selection follows the new policy deterministically, strict
//! mode rejects implicit transforms.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::model::request::Request;
use layerzero::policy::{Overrides, Policy};
use layerzero::{LayerZero, ReasonCode};
use layerzero_tests::{TestResult, causal, lz, policy, with_attrs};

fn prefill() -> Request {
    with_attrs(layerzero_tests::attention(DType::F32, 1, 64, 64, 8, 2, 64), causal())
}

fn host(p: Policy) -> TestResult<LayerZero> {
    Ok(LayerZero::detected()?.with_policy(p)?)
}

/// The host's eligible kernels for `req`, best first.
fn ranked(req: &Request) -> TestResult<Vec<String>> {
    let lz = host(Policy::default())?;
    Ok(lz.selector().ranked(req)?.into_iter().map(|s| s.kernel).collect())
}

fn selected(lz: &LayerZero, req: &Request) -> TestResult<String> {
    Ok(lz.select(req)?.kernel.clone())
}

fn deny(kernel: &str) -> TestResult<Policy> {
    policy(&format!(r#"{{"rules": [{{"action": "deny", "kernels": "{kernel}"}}]}}"#))
}

#[test]
fn environment_variable_overrides_map_onto_the_policy_and_doctor_lists_their_source() -> TestResult {
    let req = prefill();
    let best = ranked(&req)?[0].clone();
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("req.json");
    std::fs::write(&file, req.to_value().to_string())?;
    let explained = lz()?
        .env("LAYERZERO_DENY", &best)
        .args(["explain", "--request", file.to_str().unwrap_or_default(), "--json"])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&explained.stdout)?;
    assert_ne!(v["selected"], best.as_str(), "{v}");
    let c = v["candidates"].as_array().into_iter().flatten().find(|c| c["kernel"] == best.as_str());
    assert!(c.is_some_and(|c| c["reasons"].to_string().contains("POLICY_DENIED")), "{c:?}");
    let doctor = lz()?
        .env("LAYERZERO_DENY", &best)
        .env("LAYERZERO_STRICT_MODE", "1")
        .env("LAYERZERO_FAILURE_THRESHOLD", "7")
        .env("LAYERZERO_PLAN_MODE", "off")
        .args(["doctor", "--json"])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&doctor.stdout)?;
    let overrides: Vec<(String, String)> = v["policy"]["overrides"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (o["knob"].as_str().unwrap_or_default().to_owned(), o["field"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    for (knob, field) in [
        ("LAYERZERO_DENY", "rules"),
        ("LAYERZERO_STRICT_MODE", "strict_mode"),
        ("LAYERZERO_FAILURE_THRESHOLD", "health.failure_threshold"),
        ("LAYERZERO_PLAN_MODE", "plan_mode"),
    ] {
        assert!(overrides.contains(&(knob.to_owned(), field.to_owned())), "{knob}: {overrides:?}");
    }
    assert_eq!(v["policy"]["health"]["failure_threshold"], 7);
    // A knob naming no kernel fails loudly, naming the knob.
    let bad = lz()?
        .env("LAYERZERO_DENY", "no_such_backend.*")
        .args(["explain", "--request", file.to_str().unwrap_or_default()])
        .output()?;
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(err.contains("LAYERZERO_DENY") && err.contains("no_such_backend.*"), "{err}");
    Ok(())
}

#[test]
fn runtime_config_changes_prefer_avoid_and_lock_take_effect_on_a_serving_handle() -> TestResult {
    let req = prefill();
    let order = ranked(&req)?;
    assert!(order.len() >= 2, "{order:?}");
    let (a, b) = (order[0].clone(), order[1].clone());
    let lz = host(Policy::default())?;
    assert_eq!(selected(&lz, &req)?, a);
    assert_eq!(selected(&lz, &req)?, a, "cached");
    let swaps = lz.policy_swaps();
    lz.set_policy(policy(&format!(r#"{{"rules": [{{"action": "avoid", "kernels": "{a}", "factor": 1000000}}]}}"#))?)?;
    assert_eq!(selected(&lz, &req)?, b, "the cached choice is not served after the swap");
    lz.set_policy(policy(&format!(r#"{{"rules": [{{"action": "prefer", "kernels": "{a}", "factor": 0.000001}}]}}"#))?)?;
    assert_eq!(selected(&lz, &req)?, a);
    lz.set_policy(policy(&format!(r#"{{"rules": [{{"action": "lock", "kernels": "{b}"}}]}}"#))?)?;
    assert_eq!(selected(&lz, &req)?, b);
    assert_eq!(lz.policy_swaps(), swaps + 3);
    // An invalid policy is refused, reported, and the one in force stays.
    let err = lz.set_policy(deny("nothing.matches.*")?).err().ok_or("must be refused")?;
    assert!(err.to_string().contains("nothing.matches.*"), "{err}");
    assert!(lz.policy_error().is_some_and(|e| e.contains("nothing.matches.*")));
    assert_eq!(selected(&lz, &req)?, b, "the lock is still in force");
    Ok(())
}

#[test]
fn policy_changes_invalidate_caches_under_concurrent_load() -> TestResult {
    let req = prefill();
    let order = ranked(&req)?;
    let (a, b) = (order[0].clone(), order[1].clone());
    let lz = Arc::new(host(Policy::default())?);
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (lz, stop, req, a, b) = (lz.clone(), stop.clone(), req.clone(), a.clone(), b.clone());
            std::thread::spawn(move || -> Result<u64, String> {
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let k = selected(&lz, &req).map_err(|e| e.to_string())?;
                    assert!(k == a || k == b, "{k} is the answer of neither policy");
                    n += 1;
                }
                Ok(n)
            })
        })
        .collect();
    for i in 0..200 {
        let p = if i % 2 == 0 { deny(&a)? } else { Policy::default() };
        let want = if i % 2 == 0 { &b } else { &a };
        lz.set_policy(p)?;
        // Once the swap has returned, no thread may be served the old policy's choice.
        for _ in 0..20 {
            assert_eq!(&selected(&lz, &req)?, want, "swap {i}");
        }
    }
    stop.store(true, Ordering::Release);
    let mut total = 0;
    for w in workers {
        total += w.join().map_err(|_| "a worker panicked")??;
    }
    assert!(total > 0);
    Ok(())
}

#[test]
fn selection_follows_the_updated_policy_deterministically() -> TestResult {
    let req = prefill();
    let order = ranked(&req)?;
    let lz = host(Policy::default())?;
    for p in [deny(&order[0])?, Policy::default(), deny(&order[0])?] {
        lz.set_policy(p.clone())?;
        let fresh = selected(&host(p)?, &req)?;
        for _ in 0..500 {
            assert_eq!(selected(&lz, &req)?, fresh, "every answer equals a fresh handle's");
        }
    }
    Ok(())
}

#[test]
fn strict_mode_toggled_on_a_serving_handle_rejects_implicit_transforms() -> TestResult {
    // Values whose last dimension is strided: FlashAttention needs a contiguous copy first.
    let v = layerzero::TensorDesc::new(DType::BF16, [2, 2048, 8, 128])
        .with_layout(Layout::Bshd)
        .with_strides([8388608, 4096, 512, 4]);
    let req = with_attrs(layerzero_tests::attention(DType::BF16, 2, 2048, 2048, 32, 8, 128), causal()).tensor("v", v);
    let lz = LayerZero::planning("h100")?;
    let fa3 = "flash_attn_3.attention.fwd";
    let planned = lz.explain(&req);
    assert!(planned.candidate(fa3).is_some_and(|c| c.reasons.is_empty() && c.transforms.len() == 1));
    lz.set_policy(policy(r#"{"strict_mode": true}"#)?)?;
    assert_eq!(layerzero_tests::codes(&lz.explain(&req), fa3)?, vec!["TRANSFORM_REJECTED_STRICT"]);
    let strict = lz.select(&req)?;
    assert!(strict.transforms.is_empty(), "{} needs {:?}", strict.kernel, strict.transforms);
    lz.set_policy(Policy::default())?;
    assert!(layerzero_tests::codes(&lz.explain(&req), fa3)?.is_empty(), "lenient again");
    Ok(())
}

#[test]
fn plan_mode_toggles_between_serving_the_table_ignoring_it_and_refusing_misses() -> TestResult {
    let lz = host(Policy::default())?;
    let w = layerzero::plan::workload::Workload::from_json(
        r#"{"schema_version": 1, "name": "w", "entries": [{"name": "attn", "request": {"op": "attention",
            "tensors": {"q": {"dtype": "f32", "shape": [1, 64, 8, 64], "layout": "BSHD"},
                        "k": {"dtype": "f32", "shape": [1, 64, 2, 64], "layout": "BSHD"},
                        "v": {"dtype": "f32", "shape": [1, 64, 2, 64], "layout": "BSHD"}}, "attrs": {"causal": true}},
            "ranges": {"seq_q": [32, 128], "seq_k": "seq_q"}}]}"#,
        "w.json",
    )?;
    let prov = layerzero::plan::solve::Provenance {
        perfdb_digest: None,
        created_at: "2026-11-25T00:00:00Z".into(),
        command: "test".into(),
    };
    let table = layerzero::plan::solve::solve(&w, &lz.selector(), prov)?;
    let miss = with_attrs(layerzero_tests::attention(DType::F32, 1, 4096, 4096, 8, 2, 64), causal());
    let source = |mode: layerzero::PlanMode, req: &Request| {
        let h = LayerZero::detected().and_then(|l| l.with_plan(&table, mode))?;
        h.select(req).map(|hit| hit.source())
    };
    use layerzero::{PlanMode, SelectionSource};
    assert_eq!(source(PlanMode::Prefer, &prefill()).ok(), Some(SelectionSource::Plan));
    assert_eq!(source(PlanMode::Off, &prefill()).ok(), Some(SelectionSource::Live));
    assert_eq!(source(PlanMode::Prefer, &miss).ok(), Some(SelectionSource::Live));
    let err = source(PlanMode::Strict, &miss).err().ok_or("strict refuses a miss")?;
    assert_eq!(err.reasons().first().map(|r| r.code()), Some(ReasonCode::PLAN_BUCKET_MISS));
    Ok(())
}

#[test]
fn per_request_overrides_apply_to_that_request_only() -> TestResult {
    let req = prefill();
    let order = ranked(&req)?;
    let (a, b) = (order[0].clone(), order[1].clone());
    let lz = host(policy(&format!(r#"{{"rules": [{{"action": "lock", "kernels": "{a}"}}]}}"#))?)?;
    let denied = lz.select_with(&req, &Overrides::new().lock(&b))?;
    assert_eq!(denied.kernel, b, "a per-request lock wins over the policy's");
    assert_eq!(selected(&lz, &req)?, a, "the handle's policy is unchanged");
    let open = host(Policy::default())?;
    assert_eq!(open.select_with(&req, &Overrides::new().deny(&a)).map(|s| s.kernel).ok(), Some(b.clone()));
    let report = open.explain_with(&req, &Overrides::new().deny(&a))?;
    assert_eq!(layerzero_tests::codes(&report, &a)?, vec!["POLICY_DENIED"]);
    let err = open.select_with(&req, &Overrides::new().deny("no.such.kernel")).err();
    assert!(err.is_some_and(|e| e.to_string().contains("per-request deny")), "the override is named");
    Ok(())
}

#[test]
fn a_time_boxed_rule_applies_until_it_expires_and_then_stops_by_itself() -> TestResult {
    let req = prefill();
    let order = ranked(&req)?;
    let (a, b) = (order[0].clone(), order[1].clone());
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs())?;
    let stamp = |s: u64| layerzero::time::format_utc(i64::try_from(s).unwrap_or(i64::MAX));
    let timed = |until: u64| {
        policy(&format!(r#"{{"rules": [{{"action": "deny", "kernels": "{a}", "expires_at": "{}"}}]}}"#, stamp(until)))
    };
    // Already expired when set: not applied at all.
    let lz = host(timed(secs - 60)?)?;
    assert_eq!(selected(&lz, &req)?, a);
    // Expires in two seconds: applies now, and no longer once the time has passed.
    lz.set_policy(timed(secs + 2)?)?;
    assert_eq!(selected(&lz, &req)?, b);
    let start = Instant::now();
    while selected(&lz, &req)? != a {
        assert!(start.elapsed() < Duration::from_secs(6), "the rule never expired");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(lz.declared_policy().rules.len(), 1, "the declared policy keeps the rule");
    assert!(lz.selector().policy().rules.is_empty(), "the policy in force has dropped it");
    let bad =
        Policy::from_json(r#"{"rules": [{"action": "deny", "kernels": "cpu.*", "expires_at": "tomorrow"}]}"#, "p.json");
    assert!(bad.err().is_some_and(|e| e.to_string().contains("expires_at")));
    Ok(())
}

#[test]
fn a_watched_policy_file_is_reloaded_on_change_and_an_invalid_one_keeps_the_old() -> TestResult {
    let req = prefill();
    let order = ranked(&req)?;
    let (a, b) = (order[0].clone(), order[1].clone());
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("policy.json");
    std::fs::write(&file, "{}")?;
    let lz = Arc::new(host(Policy::default())?);
    let _watch = lz.watch_policy(&file)?;
    let wait_for = |what: &str, done: &dyn Fn() -> TestResult<bool>| -> TestResult {
        let start = Instant::now();
        while !done()? {
            assert!(start.elapsed() < Duration::from_secs(10), "{what} never happened");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    };
    std::fs::write(&file, format!(r#"{{"rules": [{{"action": "deny", "kernels": "{a}"}}]}}"#))?;
    wait_for("the reload", &|| Ok(selected(&lz, &req)? == b))?;
    std::fs::write(&file, r#"{"rules": [{"action": "explode""#)?;
    wait_for("the refusal", &|| Ok(lz.policy_error().is_some()))?;
    assert!(lz.policy_error().is_some_and(|e| e.contains("policy.json")), "{:?}", lz.policy_error());
    assert_eq!(selected(&lz, &req)?, b, "the last valid policy stays in force");
    std::fs::write(&file, "{}")?;
    wait_for("the recovery", &|| Ok(selected(&lz, &req)? == a))?;
    assert!(lz.policy_error().is_none());
    Ok(())
}
