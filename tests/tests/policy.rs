//! Policy: deny removes, allow restricts, prefer/avoid only reorder eligible kernels, a lock
//! never bypasses checks, strict_mode rejects transforms, and the policy hash tracks content.

use layerzero::ErrorKind;
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::model::tensor::TensorDesc;
use layerzero_tests::{TestResult, attention, catalog, causal, codes, planner, planner_with, policy, with_attrs};

fn prefill() -> layerzero::model::request::Request {
    with_attrs(attention(DType::BF16, 2, 2048, 2048, 32, 8, 128), causal())
}

#[test]
fn deny_removes_the_kernel_that_would_have_won() -> TestResult {
    let free = planner("h100")?.explain(&prefill());
    let winner = free.selected.clone().ok_or("nothing selected on h100")?;
    let denied = planner_with(
        catalog()?,
        "h100",
        policy(&format!(r#"{{"rules": [{{"action": "deny", "kernels": "{winner}"}}]}}"#))?,
    )?
    .explain(&prefill());
    assert_ne!(denied.selected.as_deref(), Some(winner.as_str()));
    assert_eq!(codes(&denied, &winner)?, ["POLICY_DENIED"]);
    assert!(denied.selected.is_some(), "another kernel takes over");
    Ok(())
}

#[test]
fn an_allow_list_rejects_every_kernel_it_does_not_name() -> TestResult {
    let r =
        planner_with(catalog()?, "h100", policy(r#"{"rules": [{"action": "allow", "kernels": "torch_sdpa.*"}]}"#)?)?
            .explain(&prefill());
    let sel = r.selected.clone().unwrap_or_default();
    assert!(sel.starts_with("torch_sdpa."), "selected {sel}");
    for c in &r.candidates {
        let not_allowed = c.reasons.iter().any(|x| x.code().as_str() == "POLICY_NOT_ALLOWED");
        assert_eq!(not_allowed, !c.kernel.starts_with("torch_sdpa."), "{}", c.kernel);
    }
    Ok(())
}

#[test]
fn prefer_reorders_eligible_kernels_and_never_revives_a_rejected_one() -> TestResult {
    let free = planner("h100")?.explain(&prefill());
    let eligible: Vec<&str> = free.candidates.iter().filter(|c| c.score.is_some()).map(|c| c.kernel.as_str()).collect();
    let rejected: Vec<&str> = free.candidates.iter().filter(|c| c.score.is_none()).map(|c| c.kernel.as_str()).collect();
    assert!(eligible.len() >= 2 && !rejected.is_empty());
    // Preferring a rejected kernel, however strongly, changes nothing.
    for k in &rejected {
        let r = planner_with(
            catalog()?,
            "h100",
            policy(&format!(r#"{{"rules": [{{"action": "prefer", "kernels": "{k}", "factor": 0.000001}}]}}"#))?,
        )?
        .explain(&prefill());
        assert_eq!(r.selected, free.selected, "preferring rejected {k}");
    }
    // Preferring the slowest eligible kernel strongly enough makes it win.
    let slowest = free
        .candidates
        .iter()
        .filter_map(|c| c.score.as_ref().map(|s| (s.total_ns, c.kernel.as_str())))
        .fold((0.0, ""), |a, b| if b.0 > a.0 { b } else { a })
        .1;
    let r = planner_with(
        catalog()?,
        "h100",
        policy(&format!(r#"{{"rules": [{{"action": "prefer", "kernels": "{slowest}", "factor": 0.000001}}]}}"#))?,
    )?
    .explain(&prefill());
    assert_eq!(r.selected.as_deref(), Some(slowest));
    let s = r.selected_candidate().and_then(|c| c.score.clone()).ok_or("no score")?;
    assert!(
        (s.policy_factor - 1e-6).abs() < 1e-12
            && (s.total_ns - (s.estimated_ns + s.transform_ns) * s.policy_factor).abs() < 1e-6
    );
    Ok(())
}

#[test]
fn avoid_multiplies_the_score_and_can_hand_the_win_to_the_runner_up() -> TestResult {
    let free = planner("h100")?.explain(&prefill());
    let winner = free.selected.clone().unwrap_or_default();
    let r = planner_with(
        catalog()?,
        "h100",
        policy(&format!(r#"{{"rules": [{{"action": "avoid", "kernels": "{winner}", "factor": 1000}}]}}"#))?,
    )?
    .explain(&prefill());
    assert_ne!(r.selected.as_deref(), Some(winner.as_str()));
    let c = r.candidate(&winner).ok_or("candidate")?;
    assert_eq!(c.score.as_ref().map(|s| s.policy_factor), Some(1000.0));
    Ok(())
}

#[test]
fn a_lock_on_an_eligible_kernel_wins_over_faster_ones() -> TestResult {
    let free = planner("h100")?.explain(&prefill());
    let slow = free
        .candidates
        .iter()
        .filter(|c| c.score.is_some() && Some(&c.kernel) != free.selected.as_ref())
        .map(|c| c.kernel.clone())
        .next()
        .ok_or("need two eligible kernels")?;
    let sel = planner_with(
        catalog()?,
        "h100",
        policy(&format!(r#"{{"rules": [{{"action": "lock", "kernels": "{slow}"}}]}}"#))?,
    )?;
    let s = sel.select(&prefill())?;
    assert_eq!(s.kernel, slow);
    let winner = free.selected.unwrap_or_default();
    assert_eq!(codes(&sel.explain(&prefill()), &winner)?, ["POLICY_LOCKED_OTHER"]);
    Ok(())
}

#[test]
fn a_lock_on_an_ineligible_kernel_is_an_error_listing_why() -> TestResult {
    // FlashAttention-2 has no fp32 and no dropout: both reasons must be listed.
    let req = with_attrs(
        attention(DType::F32, 1, 128, 128, 8, 8, 64),
        layerzero::model::attrs::AttentionAttrs { dropout_p: 0.1, ..Default::default() },
    );
    let sel = planner_with(
        catalog()?,
        "h100",
        policy(
            r#"{"allow_adaptation": false, "rules": [{"action": "lock", "kernels": "flash_attn_2.attention.fwd"}]}"#,
        )?,
    )?;
    let err = sel.select(&req).err().ok_or("a lock on an ineligible kernel must fail")?;
    assert_eq!(err.kind(), ErrorKind::LockViolation);
    let codes: Vec<&str> = err.reasons().iter().map(|r| r.code().as_str()).collect();
    assert!(codes.contains(&"DTYPE_UNSUPPORTED"), "{codes:?}");
    assert!(err.to_string().contains("flash_attn_2.attention.fwd"), "{err}");
    Ok(())
}

#[test]
fn a_rule_naming_no_kernel_fails_at_load() -> TestResult {
    let p = policy(r#"{"rules": [{"action": "deny", "kernels": "flash_atn_2.*"}]}"#)?;
    let hw = std::sync::Arc::new(layerzero::hardware::named::load("h100")?);
    let err = layerzero::select::Selector::planning(catalog()?, hw, std::sync::Arc::new(p)).err();
    let msg = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains("flash_atn_2.*") && msg.contains("rules[0]"), "{msg}");
    Ok(())
}

#[test]
fn a_lock_with_a_glob_is_rejected_when_the_policy_loads() -> TestResult {
    let err =
        layerzero::policy::Policy::from_json(r#"{"rules": [{"action": "lock", "kernels": "flash_attn_*"}]}"#, "p.json");
    assert!(err.is_err_and(|e| e.to_string().contains("rules[0].kernels")));
    Ok(())
}

#[test]
fn strict_mode_rejects_kernels_that_need_a_transform_and_lenient_mode_plans_it() -> TestResult {
    // stride(-1) != 1 on v: FlashAttention needs a make-contiguous copy first.
    let req = prefill().tensor(
        "v",
        TensorDesc::new(DType::BF16, [2, 2048, 8, 128]).with_layout(Layout::Bshd).with_strides([8388608, 4096, 512, 4]),
    );
    let lenient = planner("h100")?.explain(&req);
    let fa = lenient.candidate("flash_attn_3.attention.fwd").ok_or("fa3 candidate")?;
    assert!(fa.reasons.is_empty(), "{:?}", fa.reasons);
    assert_eq!(fa.transforms.len(), 1);
    assert_eq!(fa.transforms[0].tensor, "v");
    assert!(fa.score.as_ref().is_some_and(|s| s.transform_ns > 0.0));

    let strict = planner_with(catalog()?, "h100", policy(r#"{"strict_mode": true}"#)?)?.explain(&req);
    assert_eq!(codes(&strict, "flash_attn_3.attention.fwd")?, ["TRANSFORM_REJECTED_STRICT"]);
    // A kernel that takes any strides needs no transform and stays eligible.
    assert!(
        strict.candidate("torch_sdpa.attention.math").is_some_and(|c| c.reasons.is_empty() && c.transforms.is_empty())
    );

    let off = planner_with(catalog()?, "h100", policy(r#"{"allow_adaptation": false}"#)?)?.explain(&req);
    assert_eq!(codes(&off, "flash_attn_3.attention.fwd")?, ["LAST_DIM_NOT_CONTIGUOUS"]);
    Ok(())
}

#[test]
fn the_policy_hash_changes_with_any_setting_and_ignores_formatting() -> TestResult {
    let a = policy(r#"{"rules": [{"action": "deny", "kernels": "xformers.*"}]}"#)?;
    let b = policy("{ \"rules\" : [ { \"kernels\": \"xformers.*\", \"action\": \"deny\" } ] }")?;
    let c = policy(r#"{"rules": [{"action": "deny", "kernels": "xformers.*"}], "strict_mode": true}"#)?;
    assert_eq!(a.hash(), b.hash());
    assert_ne!(a.hash(), c.hash());
    assert_ne!(a.hash(), layerzero::policy::Policy::default().hash());
    Ok(())
}

#[test]
fn rule_conditions_scope_a_rule_to_the_requests_they_describe() -> TestResult {
    let deny_short = policy(
        r#"{"rules": [{"action": "deny", "kernels": "flash_attn_3.*",
            "when": {"op": ["attention"], "dtype": ["bf16"], "hardware": ["h1*"], "device": ["cuda"], "batch": {"max": 4},
                     "seq_len_q": {"max": 1024}, "seq_len_k": {"min": 1}, "head_dim": {"min": 64, "max": 128}}}]}"#,
    )?;
    let short = with_attrs(attention(DType::BF16, 2, 512, 512, 32, 8, 128), causal());
    let long = with_attrs(attention(DType::BF16, 2, 4096, 4096, 32, 8, 128), causal());
    let f16 = with_attrs(attention(DType::F16, 2, 512, 512, 32, 8, 128), causal());
    let big_batch = with_attrs(attention(DType::BF16, 8, 512, 512, 32, 8, 128), causal());
    let denied = |hw: &str, req: &layerzero::model::request::Request| -> TestResult<bool> {
        let report = planner_with(catalog()?, hw, deny_short.clone())?.explain(req);
        Ok(codes(&report, "flash_attn_3.attention.fwd")?.contains(&"POLICY_DENIED"))
    };
    assert!(denied("h100", &short)?);
    assert!(!denied("h200", &short)?, "hardware glob h1* does not match h200");
    assert!(!denied("h100", &long)?, "seq_len_q above the bound");
    assert!(!denied("h100", &f16)?, "another dtype");
    assert!(!denied("h100", &big_batch)?, "batch above the bound");
    // A shape condition on an op without that dimension never holds.
    let norm_rule =
        policy(r#"{"rules": [{"action": "deny", "kernels": "liger.*", "when": {"seq_len_q": {"max": 1000000}}}]}"#)?;
    let rms = layerzero::model::request::Request::new(layerzero::model::op::Op::RmsNorm)
        .tensor("x", TensorDesc::new(DType::BF16, [8, 4096]))
        .tensor("weight", TensorDesc::new(DType::BF16, [4096]));
    let r = planner_with(catalog()?, "h100", norm_rule)?.explain(&rms);
    assert!(codes(&r, "liger.rms_norm.triton")?.is_empty());
    Ok(())
}
