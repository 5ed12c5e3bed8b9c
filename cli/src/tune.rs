//! `lz tune`: measure a workload's kernels on this machine into the PerfDB; `--verify`
//! reports the regret of model-only and PerfDB-backed selection.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::{CatalogArg, Outcome, load_catalog, print_json, render};
use layerzero::error::{Error, Result};
use layerzero::plan::workload::Workload;
use layerzero::tune::{
    self, BucketRegret, CalibrationReport, Event, Host, KernelResult, Skipped, Status, TuneOptions, TuneReport,
    VerifyReport,
};

#[derive(Args, Debug)]
pub(crate) struct TuneArgs {
    /// Workload file (`schemas/workload.schema.json`).
    #[arg(long, value_name = "FILE")]
    workload: PathBuf,
    /// Stop starting new measurements after this many seconds; what is left is listed as skipped.
    #[arg(long, value_name = "SECONDS")]
    budget: Option<f64>,
    /// PerfDB file (default: $LAYERZERO_PERFDB, else $LAYERZERO_HOME/perfdb.sqlite).
    #[arg(long, value_name = "PATH")]
    perfdb: Option<PathBuf>,
    /// Then re-time every eligible kernel and report the regret of model-only and PerfDB-backed selection.
    #[arg(long)]
    verify: bool,
    /// Measure again pairs that already have a usable PerfDB row (by default they are kept).
    #[arg(long)]
    refresh: bool,
    /// Fit the cost model's coefficients per kernel and dtype to this run's times and write
    /// them (default $LAYERZERO_CALIBRATION, else $LAYERZERO_HOME/calibration.json); the
    /// selectors of this machine then model with them. With --verify, the regret of
    /// model-only selection is reported before and after.
    #[arg(long, value_name = "PATH", num_args = 0..=1)]
    calibrate: Option<Option<PathBuf>>,
    /// Per-kernel time cap in seconds (sampling stops there once 5 samples exist).
    #[arg(long, value_name = "SECONDS")]
    time_cap: Option<f64>,
    #[command(flatten)]
    catalog: CatalogArg,
    /// Machine-readable output (`schemas/tune_report.schema.json`).
    #[arg(long)]
    json: bool,
}

fn seconds(flag: &str, v: f64) -> Result<Duration> {
    if !v.is_finite() || v < 0.0 {
        return Err(Error::invalid(format!("{flag} {v} is not a number of seconds >= 0")));
    }
    Ok(Duration::from_secs_f64(v))
}

pub(crate) fn run(a: TuneArgs) -> Result<Outcome> {
    let budget = a.budget.map(|b| seconds("--budget", b)).transpose()?;
    let time_cap = a.time_cap.map(|c| seconds("--time-cap", c)).transpose()?;
    let workload = Workload::load(&a.workload)?;
    let perfdb = match a.perfdb {
        Some(p) => p,
        None => crate::knobs().perfdb_path(),
    };
    let mut opts = TuneOptions::new(workload, &a.workload.display().to_string(), perfdb);
    opts.budget = budget;
    opts.verify = a.verify;
    opts.refresh = a.refresh;
    opts.calibrate = a.calibrate.map(|p| p.unwrap_or_else(|| crate::knobs().calibration_path()));
    if let Some(cap) = time_cap {
        opts.protocol.time_cap = cap;
        opts.protocol.hard_cap = opts.protocol.hard_cap.max(cap);
    }
    // The cost model's roofline from this machine's measured figures, not nominal ones.
    if let Some(m) = layerzero::host::measure::ensure(&layerzero::host::measure::path())?
        && !a.json
    {
        eprintln!(
            "measured this host first (lz hardware --measure): copy {} GB/s, peak TFLOP/s {}",
            m.copy_gbps,
            m.peak_tflops.iter().map(|(d, v)| format!("{d} {v}")).collect::<Vec<_>>().join(", ")
        );
    }
    let host = Host::detect(load_catalog(&a.catalog)?)?;
    let bar = if a.json || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(0);
        if let Ok(style) = ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {wide_msg}") {
            b.set_style(style.progress_chars("=> "));
        }
        b
    };
    let report = tune::tune_with(&host, &opts, &mut |e| match e {
        Event::Planned { total } => bar.set_length(total as u64),
        Event::Started { phase, entry, bucket, kernel } => {
            bar.set_message(format!("{} {entry} {bucket} {kernel}", phase.as_str()));
        }
        Event::Finished => bar.inc(1),
    });
    bar.finish_and_clear();
    let report = report?;
    if a.json {
        print_json(&report.to_json());
    } else {
        print!("{}", text(&report));
    }
    Ok(Outcome::Ok)
}

/// Left-aligned columns separated by two spaces.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(c);
                s.push_str(&" ".repeat(w - c.chars().count() + 2));
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.iter().map(|h| (*h).to_owned()).collect());
    for r in rows {
        out.push_str(&line(r.clone()));
    }
    out
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// The report as text: each section in turn, an empty one left out.
fn text(r: &TuneReport) -> String {
    let mut out = summary(r);
    out.push_str(&results_table(&r.results));
    out.push_str(&skipped_table(&r.skipped));
    out.push_str(&notes(r));
    if let Some(c) = &r.calibration {
        out.push_str(&calibration_table(c));
    }
    if let Some(v) = &r.verify {
        out.push_str(&verify_table(v));
        out.push_str(&regret_table(v));
    }
    out
}

/// What was tuned where, the results by status, and the PerfDB written.
fn summary(r: &TuneReport) -> String {
    let count = |s: Status| r.results.iter().filter(|x| x.status == s).count();
    let mut out = format!(
        "tuned `{}` ({}) on {} [{}]: {} points; {} measured, {} kept from the PerfDB, {} failed, {} skipped; {:.1} s\n",
        r.workload,
        r.workload_file,
        r.hardware,
        r.fingerprint.get(..16).unwrap_or(&r.fingerprint),
        r.points,
        count(Status::Measured),
        count(Status::Cached),
        count(Status::Failed),
        r.skipped.len(),
        r.elapsed_s
    );
    out.push_str(&format!("perfdb: {} ({} rows written)\n", r.perfdb, r.rows_written));
    out.push_str(&format!(
        "parity: {} lead-in calls compared with the reference and recorded, {} failed\n",
        r.parity.records,
        r.parity.failed.len()
    ));
    for f in &r.parity.failed {
        out.push_str(&format!("  FAILED {f}\n"));
    }
    if let Some(rec) = &r.perfdb_recovered {
        out.push_str(&format!("perfdb: a damaged file was moved to {} ({})\n", rec.moved_to.display(), rec.why));
    }
    out
}

/// Every (point, kernel): its time, the selectors that pick it, and whether it was measured.
fn results_table(results: &[KernelResult]) -> String {
    if results.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = results.iter().map(result_row).collect();
    let header = ["ENTRY", "BUCKET", "KERNEL", "MEDIAN", "CV", "SAMPLES", "PICKED BY", "STATUS"];
    format!("\n{}", table(&header, &rows))
}

fn result_row(x: &KernelResult) -> Vec<String> {
    let pick = match (x.model_choice, x.perfdb_choice) {
        (true, true) => "model+perfdb",
        (true, false) => "model",
        (false, true) => "perfdb",
        (false, false) => "",
    };
    let (median, cv, samples) = match x.status {
        Status::Failed => ("-".to_owned(), "-".to_owned(), "-".to_owned()),
        _ => (render::duration(x.median_ns), pct(x.cv), x.samples.to_string()),
    };
    let status = match (x.status, &x.error) {
        (Status::Failed, Some(e)) => format!("failed: {e}"),
        (Status::Measured, _) => "measured".to_owned(),
        (Status::Cached, _) => "stored".to_owned(),
        (Status::Failed, None) => "failed".to_owned(),
    };
    vec![x.entry.clone(), x.bucket.clone(), x.kernel.clone(), median, cv, samples, pick.to_owned(), status]
}

/// The pairs not measured, and why.
fn skipped_table(skipped: &[Skipped]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = skipped
        .iter()
        .map(|s| {
            let why = match s.reason {
                "budget" => "budget spent",
                "no_executor" => "no executor registered here",
                other => other,
            };
            vec![s.entry.clone(), s.bucket.clone(), s.kernel.clone(), s.phase.as_str().to_owned(), why.to_owned()]
        })
        .collect();
    format!("\nskipped ({}):\n{}", skipped.len(), table(&["ENTRY", "BUCKET", "KERNEL", "PHASE", "WHY"], &rows))
}

/// The points no kernel serves, and how time grows with bucket size per backend.
fn notes(r: &TuneReport) -> String {
    let mut out = String::new();
    for u in &r.unselectable {
        out.push_str(&format!("no kernel: {} {}: {}\n", u.entry, u.bucket, u.error));
    }
    for g in &r.growth {
        out.push_str(&format!(
            "growth {}: {} neighbouring bucket pairs, {} steps down (a smaller bucket >10% slower); worst time(smaller) / time(larger) {:.2}: {} {} at {} vs {}\n",
            g.backend, g.pairs, g.steps_down, g.worst_ratio, g.entry, g.kernel, g.smaller, g.larger
        ));
    }
    out
}

/// The coefficients fitted per (kernel, dtype), and the model's error before and after.
fn calibration_table(c: &CalibrationReport) -> String {
    let rows: Vec<Vec<String>> = c
        .fits
        .iter()
        .map(|f| {
            vec![
                f.kernel.clone(),
                f.dtype.to_string(),
                f.points.to_string(),
                format!("{:.3}", f.eff_compute),
                format!("{:.3}", f.eff_mem),
                render::duration(f.launch_ns),
                pct(f.error_before),
                pct(f.error_after),
            ]
        })
        .collect();
    let header = ["KERNEL", "DTYPE", "POINTS", "EFF_COMPUTE", "EFF_MEM", "LAUNCH", "ERROR BEFORE", "AFTER"];
    format!("\ncalibration {} (mean |model / measured - 1|):\n{}", c.path, table(&header, &rows))
}

/// Per bucket, the fastest kernel and each selector's pick with its regret; then which
/// backends were fastest and how many buckets were contested.
fn verify_table(v: &VerifyReport) -> String {
    let rows: Vec<Vec<String>> = v.buckets.iter().map(bucket_row).collect();
    let mut header = vec!["ENTRY", "BUCKET", "FASTEST", "WITHIN 2X", "MODEL PICK", "REGRET"];
    if v.calibrated.is_some() {
        header.extend(["CALIBRATED PICK", "REGRET"]);
    }
    header.extend(["PERFDB PICK", "REGRET"]);
    let mut out = "\nverify (fresh timings; regret = time(picked) / time(fastest) - 1):\n".to_owned();
    out.push_str(&table(&header, &rows));
    let wins: Vec<String> = v.wins_by_backend.iter().map(|(b, n)| format!("{b} {n}")).collect();
    out.push_str(&format!(
        "\nfastest backend per bucket: {}; {} of {} buckets had more than one kernel within 2x of the fastest\n",
        wins.join(", "),
        v.contested,
        v.verified
    ));
    out
}

fn bucket_row(b: &BucketRegret) -> Vec<String> {
    let mut row = vec![
        b.entry.clone(),
        b.bucket.clone(),
        format!("{} {}", b.fastest, render::duration(b.fastest_ns)),
        b.competitive.to_string(),
        b.model.kernel.clone(),
        pct(b.model.regret),
    ];
    if let Some(c) = &b.calibrated {
        row.extend([c.kernel.clone(), pct(c.regret)]);
    }
    row.extend([b.perfdb.kernel.clone(), pct(b.perfdb.regret)]);
    row
}

/// The mean and worst regret, and the misses, of each selector over the verified buckets.
fn regret_table(v: &VerifyReport) -> String {
    let unverified = if v.unverified > 0 { format!(" ({} not verified)", v.unverified) } else { String::new() };
    let mut rows =
        vec![vec!["model-only".to_owned(), pct(v.model.mean), pct(v.model.worst), v.model.misses.to_string()]];
    if let Some(c) = &v.calibrated {
        rows.push(vec!["model-only, calibrated".to_owned(), pct(c.mean), pct(c.worst), c.misses.to_string()]);
    }
    rows.push(vec!["perfdb-backed".to_owned(), pct(v.perfdb.mean), pct(v.perfdb.worst), v.perfdb.misses.to_string()]);
    format!(
        "\nregret over {} buckets{unverified}:\n{}",
        v.verified,
        table(&["SELECTION", "MEAN", "WORST", "MISSES"], &rows)
    )
}
