//! Selection with PerfDB measurements: a confident row beats the model and the report says
//! so with its samples and variance; a noisy row is blended in with less weight; rows from
//! another machine or kernel version are ignored with a reason.

use std::sync::Arc;

use layerzero::ReasonCode;
use layerzero::capabilities::catalog::Catalog;
use layerzero::hardware::named;
use layerzero::model::request::Request;
use layerzero::plan::SelectionKey;
use layerzero::policy::Policy;
use layerzero::schema::{SchemaKind, violations};
use layerzero::score::measured::{Measured, Measurements};
use layerzero::select::{ScoreSource, Selector};
use layerzero_tests::TestResult;

const NORM: &str = r#"{"op": "rms_norm", "tensors": {"x": {"dtype": "f32", "shape": [2, 64]},
    "weight": {"dtype": "f32", "shape": [64]}}, "attrs": {"eps": 1e-6}}"#;

fn selector() -> TestResult<Selector> {
    Ok(Selector::planning(Catalog::builtin()?, Arc::new(named::load("spr")?), Arc::new(Policy::default()))?)
}

/// A row for `kernel` at the request's key and bucket, measured on `fingerprint`.
fn row(
    sel: &Selector,
    req: &Request,
    kernel: &str,
    median_ns: f64,
    cv: f64,
    fingerprint: &str,
) -> TestResult<Measured> {
    let key = SelectionKey::derive(req);
    let cat = sel.catalog();
    let (b, k) = cat.kernel(cat.find(kernel).ok_or_else(|| format!("{kernel} is not in the catalog"))?);
    Ok(Measured {
        kernel: kernel.into(),
        kernel_version: k.version.clone().unwrap_or_else(|| b.version.clone()),
        backend_version: b.version.clone(),
        fingerprint: fingerprint.into(),
        key: key.validity_hex(),
        bucket: key.buckets().map(|b| b.text(req.op)).unwrap_or_default(),
        samples: 30,
        median_ns,
        p10_ns: median_ns * 0.95,
        p90_ns: median_ns * 1.05,
        cv,
    })
}

fn with(sel: Selector, rows: Vec<Measured>) -> Selector {
    let m = Measurements::build(rows, sel.catalog(), sel.hardware());
    sel.with_measurements(Arc::new(m))
}

#[test]
fn a_confident_measurement_beats_the_model_and_the_report_shows_it() -> TestResult {
    let req = Request::from_json(NORM)?;
    let base = selector()?;
    assert_eq!(base.select(&req)?.kernel, "cpu.rms_norm.fast");
    let fp = base.hardware().fingerprint.clone();
    // Measured: the oracle is faster at this tiny size (no thread start-up).
    let rows = vec![
        row(&base, &req, "cpu.rms_norm.fast", 9000.0, 0.02, &fp)?,
        row(&base, &req, "cpu_reference.rms_norm.naive", 800.0, 0.03, &fp)?,
    ];
    let sel = with(base, rows);
    let s = sel.select(&req)?;
    assert_eq!(s.kernel, "cpu_reference.rms_norm.naive");
    assert_eq!(s.score.source, ScoreSource::Perfdb);
    assert_eq!(s.score.estimated_ns, 800.0);
    let report = sel.explain(&req).to_json();
    assert!(violations(SchemaKind::SelectionReport, &report).unwrap_or_default().is_empty(), "{report}");
    let c = report["candidates"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["kernel"] == "cpu_reference.rms_norm.naive"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(c["score"]["source"], "perfdb");
    assert_eq!(c["score"]["measurement"]["samples"], 30);
    assert_eq!(c["score"]["measurement"]["cv"], 0.03);
    Ok(())
}

#[test]
fn a_noisy_measurement_is_blended_with_less_weight_than_a_steady_one() -> TestResult {
    let req = Request::from_json(NORM)?;
    let base = selector()?;
    let fp = base.hardware().fingerprint.clone();
    let fast = |sel: &Selector| {
        sel.explain(&req).candidate("cpu.rms_norm.fast").and_then(|c| c.score.clone()).ok_or("ineligible")
    };
    let model = fast(&base)?.estimated_ns;
    let estimate = |cv: f64, samples: u32| -> TestResult<_> {
        let mut r = row(&base, &req, "cpu.rms_norm.fast", model * 10.0, cv, &fp)?;
        r.samples = samples;
        let s = fast(&with(selector()?, vec![r]))?;
        Ok((s.source, s.estimated_ns))
    };
    let (steady_src, steady) = estimate(0.05, 10)?;
    let (noisy_src, noisy) = estimate(0.30, 6)?;
    let (wild_src, wild) = estimate(0.80, 30)?;
    assert_eq!(steady_src, ScoreSource::Perfdb);
    assert_eq!(noisy_src, ScoreSource::Blended);
    assert_eq!(wild_src, ScoreSource::Model);
    assert!(steady > noisy && noisy > wild, "{steady} > {noisy} > {wild}");
    assert!((wild - model).abs() < 1e-9);
    Ok(())
}

#[test]
fn a_noisy_series_of_many_samples_pins_its_median_and_is_trusted() -> TestResult {
    // What the weight follows is the median's standard error, not the spread alone: cv 0.3
    // over 30 samples leaves the median within about +-13% (95%), far closer than a model.
    let req = Request::from_json(NORM)?;
    let base = selector()?;
    let fp = base.hardware().fingerprint.clone();
    let model = base.explain(&req).candidate("cpu.rms_norm.fast").and_then(|c| c.score.clone()).ok_or("ineligible")?;
    let measured = model.estimated_ns * 10.0;
    let mut r = row(&base, &req, "cpu.rms_norm.fast", measured, 0.30, &fp)?;
    r.samples = 30;
    let sel = with(selector()?, vec![r]);
    let s = sel.explain(&req).candidate("cpu.rms_norm.fast").and_then(|c| c.score.clone()).ok_or("ineligible")?;
    assert_eq!(s.source, ScoreSource::Perfdb);
    assert!((s.estimated_ns - measured).abs() < 1e-6 * measured, "{} vs {measured}", s.estimated_ns);
    Ok(())
}

#[test]
fn rows_from_another_machine_or_version_are_ignored_with_a_reason_in_the_report() -> TestResult {
    let req = Request::from_json(NORM)?;
    let base = selector()?;
    let mut old = row(&base, &req, "cpu.rms_norm.fast", 1.0, 0.01, &base.hardware().fingerprint.clone())?;
    old.kernel_version = "0.0.0-old".into();
    let elsewhere = row(&base, &req, "cpu_reference.rms_norm.naive", 1.0, 0.01, "another-machine")?;
    let sel = with(base, vec![old, elsewhere]);
    let report = sel.explain(&req);
    let notes = |k: &str| -> Vec<ReasonCode> {
        report
            .candidate(k)
            .and_then(|c| c.score.as_ref())
            .map(|s| s.notes.iter().map(|r| r.code()).collect())
            .unwrap_or_default()
    };
    assert_eq!(notes("cpu.rms_norm.fast"), vec![ReasonCode::PERFDB_VERSION_MISMATCH]);
    assert_eq!(notes("cpu_reference.rms_norm.naive"), vec![ReasonCode::PERFDB_HARDWARE_MISMATCH]);
    assert_eq!(report.selected.as_deref(), Some("cpu.rms_norm.fast"), "the model decides");
    Ok(())
}
