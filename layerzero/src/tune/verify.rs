//! Verification: re-time every eligible kernel at every point in a fresh series on fresh
//! inputs (not the series the PerfDB rows came from) and compare, per bucket, each
//! selector's pick with the fastest.
//!
//! Where several kernels compete, the point is timed in two windows, the second after every
//! point's first (another stretch of time, other fresh inputs), and a kernel's verified time
//! is the mean of its two windows' medians. On the 2-vCPU VM the same pair's time ratio
//! moved by 17-36% between windows minutes apart (swiglu f32 at 257..512 tokens: `cpu`
//! 1.09x oneDNN's time in one, 0.83x in the next); one window measured which regime it fell
//! in more than which kernel is faster. Both windows' medians are in the report.

use std::time::Instant;

use super::report::{BucketRegret, Phase, Pick, RegretSummary, Skipped, VerifiedTime, VerifyReport};
use super::{Event, Host, Planned, TuneOptions, timing};
use crate::select::{ScoreSource, Selection, Selector};

/// The selectors compared with the model-only ranking.
#[derive(Clone, Copy)]
pub(super) struct Selectors<'a> {
    /// PerfDB-backed.
    pub with_db: &'a Selector,
    /// Model-only with a calibration, if one is in use.
    pub calibrated: Option<&'a Selector>,
}

/// Verifies every planned point with the model-only ranking and `with_db`'s (PerfDB-backed)
/// one. Points the budget leaves no time for are listed in `skipped`; the flag says whether
/// that happened.
pub(super) fn run(
    host: &Host,
    opts: &TuneOptions,
    plans: &[Planned<'_>],
    selectors: Selectors<'_>,
    deadline: Option<Instant>,
    skipped: &mut Vec<Skipped>,
    on_event: &mut dyn FnMut(Event<'_>),
) -> (VerifyReport, bool) {
    let Selectors { with_db, calibrated } = selectors;
    let spent = || timing::spent(deadline);
    let mut budget_exhausted = false;
    let mut firsts: Vec<Option<Vec<VerifiedTime>>> = Vec::with_capacity(plans.len());
    let mut unverified = 0usize;
    for (pi, plan) in plans.iter().enumerate() {
        let entry = plan.point.entry.as_str();
        if spent() {
            budget_exhausted = true;
            unverified += 1;
            for sel in &plan.ranked {
                skipped.push(Skipped {
                    entry: entry.to_owned(),
                    bucket: plan.bucket.clone(),
                    kernel: sel.kernel.clone(),
                    phase: Phase::Verify,
                    reason: "budget",
                });
                on_event(Event::Finished);
            }
            firsts.push(None);
            continue;
        }
        // Fresh inputs (another seed) and fresh series, not the ones the rows came from.
        firsts.push(Some(window(host, opts, plan, pi as u64 ^ 0x5645_5249_4659_0000, on_event)));
    }
    let mut buckets = Vec::new();
    for (pi, (plan, first)) in plans.iter().zip(firsts).enumerate() {
        let Some(mut times) = first else { continue };
        let contested = times.iter().filter(|t| t.median_ns.is_some()).count() >= 2;
        if contested && !spent() {
            let second = window(host, opts, plan, pi as u64 ^ 0x5645_5249_4659_0002, on_event);
            for (t, w) in times.iter_mut().zip(second) {
                t.join(w);
            }
        } else if plan.ranked.len() >= 2 {
            budget_exhausted |= contested;
            for _ in &plan.ranked {
                on_event(Event::Finished);
            }
        }
        let ranked_by = |sel: &Selector| -> Vec<Selection> {
            sel.ranked(&plan.point.request)
                .map(|r| r.into_iter().filter(|s| host.registry.contains(&s.kernel)).collect())
                .unwrap_or_default()
        };
        let perf_ranked = ranked_by(with_db);
        let cal_ranked = calibrated.map(ranked_by);
        match regret(plan, &plan.ranked, &perf_ranked, cal_ranked.as_deref(), times) {
            Some(b) => buckets.push(b),
            None => unverified += 1,
        }
    }
    let summary = |f: fn(&BucketRegret) -> f64| {
        let n = buckets.len();
        if n == 0 {
            return RegretSummary::default();
        }
        let v: Vec<f64> = buckets.iter().map(f).collect();
        RegretSummary {
            mean: v.iter().sum::<f64>() / n as f64,
            worst: v.iter().copied().fold(0.0, f64::max),
            misses: v.iter().filter(|&&r| r > 0.0).count(),
        }
    };
    let mut wins_by_backend = std::collections::BTreeMap::new();
    for b in &buckets {
        let backend = b.fastest.split('.').next().unwrap_or_default().to_owned();
        *wins_by_backend.entry(backend).or_insert(0) += 1;
    }
    let report = VerifyReport {
        verified: buckets.len(),
        unverified,
        model: summary(|b| b.model.regret),
        perfdb: summary(|b| b.perfdb.regret),
        calibrated: calibrated.map(|_| summary(|b| b.calibrated.as_ref().map_or(b.model.regret, |p| p.regret))),
        contested: buckets.iter().filter(|b| b.competitive > 1).count(),
        wins_by_backend,
        buckets,
    };
    (report, budget_exhausted)
}

/// One window: every kernel of `plan` timed together, interleaved, on inputs from `seed`.
fn window(
    host: &Host,
    opts: &TuneOptions,
    plan: &Planned<'_>,
    seed: u64,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Vec<VerifiedTime> {
    let all: Vec<&Selection> = plan.ranked.iter().collect();
    let kernels = all.iter().map(|s| s.kernel.as_str()).collect::<Vec<_>>().join(", ");
    on_event(Event::Started { phase: Phase::Verify, entry: &plan.point.entry, bucket: &plan.bucket, kernel: &kernels });
    let outcomes = timing::time_group(host, &plan.point.request, &all, opts, seed, None);
    for _ in &all {
        on_event(Event::Finished);
    }
    all.iter()
        .zip(outcomes)
        .map(|(sel, t)| match t {
            Ok(m) => VerifiedTime {
                kernel: sel.kernel.clone(),
                median_ns: Some(m.summary.median),
                windows_ns: vec![m.summary.median],
                cv: Some(m.summary.cv),
                samples: m.summary.samples,
                error: None,
            },
            Err(e) => VerifiedTime {
                kernel: sel.kernel.clone(),
                median_ns: None,
                windows_ns: Vec::new(),
                cv: None,
                samples: 0,
                error: Some(e),
            },
        })
        .collect()
}

impl VerifiedTime {
    /// Adds a second window of the same kernel: the verified time is the mean of the
    /// windows' medians; a kernel that failed in either window failed.
    fn join(&mut self, other: VerifiedTime) {
        match (self.median_ns, other.median_ns) {
            (Some(_), Some(_)) => {
                self.windows_ns.extend(other.windows_ns);
                self.median_ns = Some(self.windows_ns.iter().sum::<f64>() / self.windows_ns.len() as f64);
                self.cv = match (self.cv, other.cv) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
                self.samples += other.samples;
            }
            (Some(_), None) => {
                self.median_ns = None;
                self.windows_ns.clear();
                self.cv = None;
                self.error = other.error;
            }
            _ => {}
        }
    }
}

/// The regret of both selectors at one bucket, from fresh times; `None` when no kernel ran.
/// A pick that failed here is replaced by the next in its ranking, as dispatch falls back.
fn regret(
    plan: &Planned<'_>,
    model_ranked: &[Selection],
    perf_ranked: &[Selection],
    cal_ranked: Option<&[Selection]>,
    times: Vec<VerifiedTime>,
) -> Option<BucketRegret> {
    let time_of = |k: &str| times.iter().find(|t| t.kernel == k).and_then(|t| t.median_ns);
    let (fastest, fastest_ns) = times
        .iter()
        .filter_map(|t| t.median_ns.map(|m| (t.kernel.clone(), m)))
        .min_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)))?;
    let pick = |ranked: &[Selection]| -> Option<Pick> {
        ranked.iter().find_map(|s| {
            time_of(&s.kernel).map(|t| Pick {
                kernel: s.kernel.clone(),
                median_ns: t,
                regret: if fastest_ns > 0.0 { (t / fastest_ns - 1.0).max(0.0) } else { 0.0 },
                source: source_name(s.score.source),
            })
        })
    };
    let model = pick(model_ranked)?;
    let perfdb = pick(perf_ranked).unwrap_or_else(|| model.clone());
    let calibrated = cal_ranked.map(|r| pick(r).unwrap_or_else(|| model.clone()));
    let competitive = times.iter().filter(|t| t.median_ns.is_some_and(|m| m <= 2.0 * fastest_ns)).count();
    Some(BucketRegret {
        entry: plan.point.entry.clone(),
        bucket: plan.bucket.clone(),
        fastest,
        fastest_ns,
        model,
        perfdb,
        calibrated,
        competitive,
        times,
    })
}

fn source_name(s: ScoreSource) -> &'static str {
    s.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timed(kernel: &str, median: Option<f64>) -> VerifiedTime {
        VerifiedTime {
            kernel: kernel.to_owned(),
            median_ns: median,
            windows_ns: median.into_iter().collect(),
            cv: median.map(|_| 0.1),
            samples: if median.is_some() { 20 } else { 0 },
            error: median.is_none().then(|| "failed".to_owned()),
        }
    }

    #[test]
    fn two_windows_score_a_kernel_by_the_mean_of_their_medians() {
        let mut t = timed("cpu.linear.fast", Some(100.0));
        t.join(VerifiedTime { cv: Some(0.3), ..timed("cpu.linear.fast", Some(140.0)) });
        assert_eq!(
            (t.median_ns, t.windows_ns.as_slice(), t.cv, t.samples),
            (Some(120.0), &[100.0, 140.0][..], Some(0.3), 40)
        );
    }

    #[test]
    fn a_kernel_that_fails_in_either_window_has_no_verified_time() {
        let mut t = timed("onednn.linear", Some(100.0));
        t.join(timed("onednn.linear", None));
        assert_eq!((t.median_ns, t.error.as_deref()), (None, Some("failed")));
        let mut t = timed("onednn.linear", None);
        t.join(timed("onednn.linear", Some(90.0)));
        assert_eq!(t.median_ns, None);
    }
}
