//! E2E §11.2, soak: `lz bench-select` and `lz generate --seconds` sample resident memory over
//! the run and fail when it grows past a bound after the warm-up. Here each runs briefly; the
//! long soak is the same command with a large `--seconds`.

use layerzero::schema::{SchemaKind, violations};
use layerzero_tests::{TestResult, lz, repo_root};
use serde_json::Value;

/// Exit code, the JSON report (null when stdout is not JSON), stderr.
fn run(args: &[&str], env: &[(&str, &str)]) -> TestResult<(i32, Value, String)> {
    let mut cmd = lz()?;
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output()?;
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    Ok((out.status.code().unwrap_or(-1), report, String::from_utf8_lossy(&out.stderr).into_owned()))
}

fn model(name: &str) -> String {
    repo_root().join("tests/models").join(name).display().to_string()
}

/// The memory part of a soak report reads as a series over the run whose verdict follows
/// from its numbers: growth is the peak after the warm-up less the warm-up's peak.
fn assert_a_consistent_series(rss: &Value, bound_kib: u64) -> TestResult {
    let n = |f: &str| rss[f].as_u64().ok_or_else(|| format!("{f} missing in {rss}"));
    assert!(n("samples")? >= 10, "a reading every period over the run: {rss}");
    assert_eq!(n("bound_kib")?, bound_kib);
    let growth = rss["growth_kib"].as_i64().ok_or_else(|| format!("growth_kib in {rss}"))?;
    assert_eq!(growth, n("peak_kib")? as i64 - n("warmup_peak_kib")? as i64, "{rss}");
    assert_eq!(rss["within_bound"], growth <= bound_kib as i64, "{rss}");
    let series = rss["series"].as_array().ok_or("series")?;
    let times: Vec<u64> = series.iter().filter_map(|p| p[0].as_u64()).collect();
    assert!(times.len() >= 2 && times.windows(2).all(|w| w[0] < w[1]), "in time order: {rss}");
    Ok(())
}

#[test]
fn section_11_2_bench_select_samples_resident_memory_and_random_shapes_keep_it_within_the_bound() -> TestResult {
    // A small cache, filled to its bound within the warm-up and churned after it: an
    // unbounded cache or a leaked entry would keep memory rising.
    let (code, report, stderr) = run(
        &[
            "bench-select",
            "--threads",
            "1,2",
            "--seconds",
            "1",
            "--random-shapes",
            "--max-rss-growth-mb",
            "16",
            "--json",
        ],
        &[("LAYERZERO_CACHE_CAPACITY", "64")],
    )?;
    assert_eq!(code, 0, "{stderr}\n{report}");
    assert_eq!(violations(SchemaKind::BenchSelectReport, &report)?, Vec::<String>::new());
    let rss = &report["rss_over_time"];
    assert_a_consistent_series(rss, 16 * 1024)?;
    assert_eq!(rss["within_bound"], true, "{rss}");
    assert_eq!(rss["warmup_ms"], 500, "the first quarter of two one-second rows");
    for row in report["rows"].as_array().ok_or("rows")? {
        assert_eq!(row["cache_entries"], 128, "the cache is full and no fuller: {row}");
    }
    Ok(())
}

#[test]
fn section_11_2_bench_select_prints_the_series_and_its_verdict() -> TestResult {
    let out = lz()?.args(["bench-select", "--threads", "1", "--seconds", "0.5"]).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("resident memory over time:") && text.contains("(bound 64.0 MiB): within bound"), "{text}");
    assert!(text.contains("series (s:MiB):"), "{text}");
    Ok(())
}

#[test]
fn section_11_2_generate_soak_repeats_the_prompt_with_the_same_greedy_tokens_and_flat_memory() -> TestResult {
    let m = model("llama-gqa");
    let once = ["generate", "--model", &m, "--prompt-ids", "1,2,3,4", "--max-new-tokens", "6", "--json"];
    let (code, single, stderr) = run(&once, &[])?;
    assert_eq!(code, 0, "{stderr}");
    let soak: Vec<&str> = once.iter().copied().chain(["--seconds", "2", "--max-rss-growth-mb", "8"]).collect();
    let (code, report, stderr) = run(&soak, &[])?;
    assert_eq!(code, 0, "{stderr}\n{report}");
    assert_eq!(violations(SchemaKind::GenerateReport, &report)?, Vec::<String>::new());
    assert_eq!(report["generated_ids"], single["generated_ids"], "the last round generates what one run does");
    let s = &report["soak"];
    assert!(s["rounds"].as_u64().is_some_and(|r| r > 1), "{s}");
    assert_eq!(s["token_mismatch_rounds"], 0, "{s}");
    assert!(s["seconds"].as_f64().is_some_and(|t| t >= 2.0), "{s}");
    assert_a_consistent_series(&s["rss"], 8 * 1024)?;
    assert_eq!(s["rss"]["within_bound"], true, "{s}");
    assert!(single.get("soak").is_none(), "a run without --seconds has no soak: {single}");
    Ok(())
}

#[test]
fn section_11_2_generate_soak_of_an_encoder_decoder_with_and_without_its_caches() -> TestResult {
    let m = model("bart");
    for extra in [&[][..], &["--no-kv-cache"][..]] {
        let args: Vec<&str> = ["generate", "--model", &m, "--prompt-ids", "0,31,42,7,2", "--max-new-tokens", "4"]
            .into_iter()
            .chain(extra.iter().copied())
            .chain(["--seconds", "1", "--json"])
            .collect();
        let (code, report, stderr) = run(&args, &[])?;
        assert_eq!(code, 0, "{extra:?}: {stderr}");
        assert_eq!(violations(SchemaKind::GenerateReport, &report)?, Vec::<String>::new());
        assert_eq!(report["soak"]["token_mismatch_rounds"], 0, "{report}");
        assert_a_consistent_series(&report["soak"]["rss"], 64 * 1024)?;
    }
    Ok(())
}

#[test]
fn section_11_2_a_bad_bound_or_duration_is_refused_naming_the_flag() -> TestResult {
    let m = model("llama-gqa");
    for (args, flag) in [
        (
            vec!["bench-select", "--threads", "1", "--seconds", "0.1", "--max-rss-growth-mb=-1"],
            "--max-rss-growth-mb -1",
        ),
        (
            vec!["bench-select", "--threads", "1", "--seconds", "0.1", "--max-rss-growth-mb", "NaN"],
            "--max-rss-growth-mb NaN",
        ),
        (vec!["generate", "--model", &m, "--prompt-ids", "1", "--seconds", "0"], "--seconds 0"),
        (
            vec!["generate", "--model", &m, "--prompt-ids", "1", "--seconds", "1", "--max-rss-growth-mb=-2"],
            "--max-rss-growth-mb -2",
        ),
        (vec!["generate", "--model", &m, "--prompt-ids", "1", "--max-rss-growth-mb", "8"], "--seconds"),
    ] {
        let (code, _, stderr) = run(&args, &[])?;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
    Ok(())
}
