//! The parity gate of selection (issue 33): a kernel whose last comparison against the
//! reference on this machine failed is refused (PARITY_FAILED) unless the policy allows it;
//! under `require_parity: strict` a kernel without a passing record is refused
//! (PARITY_UNVERIFIED); `warn` chooses it and says so; records of another machine or kernel
//! version do not count.

use std::sync::Arc;

use layerzero::ReasonCode;
use layerzero::capabilities::catalog::Catalog;
use layerzero::hardware::named;
use layerzero::model::request::Request;
use layerzero::plan::SelectionKey;
use layerzero::policy::{Policy, RequireParity};
use layerzero::select::{ParityBook, ParityFact, Selector, Verdict};
use layerzero_tests::TestResult;

const NORM: &str = r#"{"op": "rms_norm", "tensors": {"x": {"dtype": "f32", "shape": [2, 64]},
    "weight": {"dtype": "f32", "shape": [64]}}, "attrs": {"eps": 1e-6}}"#;

const FAST: &str = "cpu.rms_norm.fast";

fn selector(policy: Policy) -> TestResult<Selector> {
    Ok(Selector::planning(Catalog::builtin()?, Arc::new(named::load("spr")?), Arc::new(policy))?)
}

/// A record of `kernel` at the request's key and bucket on `fingerprint`.
fn fact(sel: &Selector, req: &Request, kernel: &str, passed: bool, fingerprint: &str) -> TestResult<ParityFact> {
    let key = SelectionKey::derive(req);
    let cat = sel.catalog();
    let (b, k) = cat.kernel(cat.find(kernel).ok_or_else(|| format!("{kernel} is not in the catalog"))?);
    Ok(ParityFact {
        kernel: kernel.into(),
        kernel_version: k.version.clone().unwrap_or_else(|| b.version.clone()),
        backend_version: b.version.clone(),
        fingerprint: fingerprint.into(),
        key: key.validity_hex(),
        bucket: key.buckets().map(|b| b.text(req.op)).unwrap_or_default(),
        passed,
        nmse: Some(if passed { 1e-12 } else { 0.98 }),
        max_abs: Some(if passed { 1e-6 } else { 3.5 }),
        cosine: Some(if passed { 1.0 } else { 0.006 }),
        detail: (!passed).then(|| "128 of 128 elements outside the tolerance".to_owned()),
        origin: "test".into(),
        created_at: 1_700_000_000,
    })
}

fn gated(sel: Selector, facts: Vec<ParityFact>) -> Selector {
    let book = ParityBook::build(facts, sel.catalog(), sel.hardware());
    sel.with_parity(Arc::new(book))
}

#[test]
fn a_kernel_that_failed_here_is_refused_with_its_figures_and_the_next_one_is_chosen() -> TestResult {
    let req = Request::from_json(NORM)?;
    let plain = selector(Policy::default())?;
    assert_eq!(plain.select(&req)?.kernel, FAST, "the fast kernel wins without records");
    let fp = plain.hardware().fingerprint.clone();
    let sel = gated(plain.clone(), vec![fact(&plain, &req, FAST, false, &fp)?]);
    let report = sel.explain(&req);
    let c = report.candidate(FAST).ok_or("the fast kernel is a candidate")?;
    assert_eq!(c.verdict, Verdict::Rejected);
    let r = c.reasons.iter().find(|r| r.code() == ReasonCode::PARITY_FAILED).ok_or("PARITY_FAILED")?;
    for figure in ["cosine 0.0060", "128 of 128 elements", "by test at 2023-11-14"] {
        assert!(r.message().contains(figure), "{figure} missing from: {}", r.message());
    }
    assert_eq!(c.parity, Some("failed"));
    let chosen = sel.select(&req)?.kernel;
    assert_ne!(chosen, FAST);
    // A dispatch-table entry is re-judged through `evaluate` when a table loads: refused too.
    let reasons = sel.evaluate(&req, FAST).err().ok_or("a table entry naming the failed kernel must be refused")?;
    assert!(reasons.iter().any(|r| r.code() == ReasonCode::PARITY_FAILED), "{reasons:?}");
    // The policy can let it run anyway, and the report says what it is running.
    let allow = Policy { allow_parity_failed: vec!["cpu.rms_norm.*".into()], ..Policy::default() };
    let sel = gated(selector(allow)?, vec![fact(&plain, &req, FAST, false, &fp)?]);
    assert_eq!(sel.select(&req)?.kernel, FAST);
    assert_eq!(sel.explain(&req).candidate(FAST).and_then(|c| c.parity), Some("failed, allowed"));
    Ok(())
}

#[test]
fn strict_refuses_the_unverified_warn_reports_them_and_the_reference_is_never_gated() -> TestResult {
    let req = Request::from_json(NORM)?;
    let strict = Policy { require_parity: RequireParity::Strict, ..Policy::default() };
    let sel = selector(strict.clone())?;
    let fp = sel.hardware().fingerprint.clone();
    // Nothing recorded: only the reference (right by definition) is left.
    let report = sel.explain(&req);
    for c in report.candidates.iter().filter(|c| c.backend != "cpu_reference") {
        assert!(c.reasons.iter().any(|r| r.code() == ReasonCode::PARITY_UNVERIFIED), "{}: {:?}", c.kernel, c.reasons);
        assert_eq!(c.parity, Some("unverified"));
    }
    assert_eq!(sel.select(&req)?.kernel, "cpu_reference.rms_norm.naive");
    // A passing record here makes the fast kernel eligible again.
    let sel = gated(selector(strict)?, vec![fact(&sel, &req, FAST, true, &fp)?]);
    assert_eq!(sel.select(&req)?.kernel, FAST);
    assert_eq!(sel.explain(&req).candidate(FAST).and_then(|c| c.parity), Some("passed"));
    // warn: chosen, reported unverified.
    let warn = Policy { require_parity: RequireParity::Warn, ..Policy::default() };
    let sel = selector(warn)?;
    assert_eq!(sel.select(&req)?.kernel, FAST);
    assert_eq!(sel.explain(&req).candidate(FAST).and_then(|c| c.parity), Some("unverified"));
    Ok(())
}

#[test]
fn records_of_another_machine_or_kernel_version_do_not_count() -> TestResult {
    let req = Request::from_json(NORM)?;
    let plain = selector(Policy::default())?;
    let fp = plain.hardware().fingerprint.clone();
    let elsewhere = fact(&plain, &req, FAST, false, "0123456789abcdef")?;
    let mut old = fact(&plain, &req, FAST, false, &fp)?;
    old.kernel_version = "0.0.1-old".into();
    let book = ParityBook::build(vec![elsewhere, old], plain.catalog(), plain.hardware());
    assert_eq!((book.passed(), book.failed(), book.ignored()), (0, 0, 2));
    let sel = plain.clone().with_parity(Arc::new(book));
    assert_eq!(sel.select(&req)?.kernel, FAST);
    // A failure stands against a pass of the same point from another source.
    let book = ParityBook::build(
        vec![fact(&plain, &req, FAST, false, &fp)?, fact(&plain, &req, FAST, true, &fp)?],
        plain.catalog(),
        plain.hardware(),
    );
    assert_eq!(book.failed(), 1);
    Ok(())
}

/// `lz explain` on this host reads the PerfDB's parity records: a failed record refuses the
/// kernel with its figures; `LAYERZERO_REQUIRE_PARITY=strict` refuses the unverified.
#[test]
fn lz_explain_refuses_a_kernel_that_failed_here_and_strict_refuses_the_unverified() -> TestResult {
    use layerzero::perfdb::{ParityRecord, ParityStatus, PerfDb};
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("db.sqlite");
    let req_path = dir.path().join("norm.json");
    std::fs::write(&req_path, NORM)?;
    let req = Request::from_json(NORM)?;
    let host = layerzero::host::detect::detect_host().profile;
    let sel = Selector::planning(Catalog::builtin()?, Arc::new(host.clone()), Arc::new(Policy::default()))?;
    let f = fact(&sel, &req, FAST, false, &host.fingerprint)?;
    let record = ParityRecord {
        kernel: f.kernel,
        kernel_version: f.kernel_version,
        backend: "cpu".into(),
        backend_version: f.backend_version,
        fingerprint: f.fingerprint,
        op: "rms_norm".into(),
        dtype: "f32".into(),
        key: f.key,
        bucket: f.bucket,
        case: "a planted failure".into(),
        status: ParityStatus::Fail,
        nmse: f.nmse,
        max_abs: f.max_abs,
        cosine: f.cosine,
        rtol: 1e-5,
        atol: 1e-6,
        detail: f.detail,
        origin: "test".into(),
        created_at: 1_700_000_000,
    };
    PerfDb::open(&db)?.db.insert_parity(&[record])?;
    let explain = |strict: bool| -> TestResult<(i32, String)> {
        let mut c = layerzero_tests::lz()?;
        c.env("LAYERZERO_PERFDB", &db).args(["explain", "--request", req_path.to_str().ok_or("utf-8")?]);
        if strict {
            c.env("LAYERZERO_REQUIRE_PARITY", "strict");
        }
        let o = c.output()?;
        Ok((o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned()))
    };
    let (code, out) = explain(false)?;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("PARITY_FAILED") && out.contains("cosine 0.0060"), "{out}");
    assert!(!out.contains(&format!("selected:  {FAST}")), "{out}");
    let (code, out) = explain(true)?;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("selected:  cpu_reference.rms_norm.naive") && out.contains("PARITY_UNVERIFIED"), "{out}");
    Ok(())
}

/// The drill of seed 004's silent bug: `LAYERZERO_FAULTS=cpu.rms_norm.fast=garbage` leaves
/// finite, plausible, wrong outputs; `lz parity --record` fails the kernel (a cosine far from
/// 1), and selection on this machine then refuses it with PARITY_FAILED.
#[test]
fn a_garbage_drill_fails_parity_and_the_kernel_is_refused_afterwards() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("db.sqlite");
    let db_arg = db.to_str().ok_or("utf-8")?;
    let o = layerzero_tests::lz()?
        .env("LAYERZERO_FAULTS", "cpu.rms_norm.fast=garbage")
        .args(["parity", "--op", "rms_norm", "--record", "--perfdb", db_arg, "--json"])
        .output()?;
    assert_eq!(o.status.code(), Some(1), "a failed parity row exits 1");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let rows = v["rows"].as_array().ok_or("rows")?;
    let fast: Vec<&serde_json::Value> = rows.iter().filter(|r| r["kernel"] == FAST).collect();
    assert!(!fast.is_empty());
    for r in &fast {
        assert_eq!(r["status"], "fail", "{r}");
        assert!(r["cosine"].as_f64().is_some_and(|c| c < 0.9), "{r}");
    }
    assert!(
        rows.iter().filter(|r| r["kernel"] != FAST).all(|r| r["status"] != "fail"),
        "only the drilled kernel fails"
    );
    // The request of one of the cases it failed (`rms_norm/1x64/f32`, default eps): refused
    // here from now on.
    let req_path = dir.path().join("norm.json");
    std::fs::write(
        &req_path,
        r#"{"op": "rms_norm", "tensors": {"x": {"dtype": "f32", "shape": [1, 64]},
            "weight": {"dtype": "f32", "shape": [64]}}}"#,
    )?;
    let o = layerzero_tests::lz()?
        .env("LAYERZERO_PERFDB", &db)
        .args(["explain", "--request", req_path.to_str().ok_or("utf-8")?, "--json"])
        .output()?;
    let report: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let c = report["candidates"].as_array().ok_or("candidates")?.iter().find(|c| c["kernel"] == FAST).ok_or("fast")?;
    assert_eq!(c["verdict"], "rejected", "{c}");
    assert!(c["reasons"].to_string().contains("PARITY_FAILED"), "{c}");
    assert_eq!(c["parity"], "failed");
    Ok(())
}
