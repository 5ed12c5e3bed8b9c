//! Soak mode (E2E §11.2): resident memory sampled over a run of `lz bench-select` or
//! `lz generate --seconds`, and the verdict on its growth.
//!
//! The first quarter of the run is its warm-up: caches fill, pools and arenas reach their
//! working size. Its peak is the baseline; growth is how far the peak after it rises above
//! that. A leak or an unbounded cache keeps rising; a steady working set does not, however
//! large it is, so the bound can be small.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::Outcome;
use super::args::GenerateCmd;
use layerzero::error::{Error, Result};
use layerzero_llm as llm;

/// The bound when `--max-rss-growth-mb` is not given: far above a steady run's noise (a few
/// pages), far below what a leak reaches in a long soak.
pub(super) const DEFAULT_MAX_GROWTH_MB: f64 = 64.0;
/// Longest soak one command runs (three days, the spec's longest soak).
const MAX_SECONDS: f64 = 72.0 * 3600.0;
/// Points of the series a report keeps (evenly spaced over the run).
const SERIES_POINTS: usize = 16;

/// One reading: milliseconds since sampling began, resident KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sample {
    pub ms: u64,
    pub kib: u64,
}

/// A run's readings, summarized as they come: the first and last, the peaks on either side
/// of the warm-up, and a series thinned to fit a buffer of fixed size, so that a soak of days
/// holds no more memory at its end than at its start.
#[derive(Debug, Clone)]
pub(super) struct Series {
    cut_ms: u64,
    count: usize,
    first: Option<Sample>,
    last: Option<Sample>,
    warmup_peak: Option<u64>,
    peak: Option<u64>,
    /// Every `stride`-th reading, never more than `KEEP`.
    kept: Vec<Sample>,
    stride: usize,
}

/// Readings a series keeps (then it keeps every other one, and half as many from then on).
const KEEP: usize = 1024;

impl Series {
    /// A series whose first `warmup` is the warm-up.
    pub(super) fn new(warmup: Duration) -> Series {
        Series {
            cut_ms: warmup.as_millis() as u64,
            count: 0,
            first: None,
            last: None,
            warmup_peak: None,
            peak: None,
            kept: Vec::with_capacity(KEEP),
            stride: 1,
        }
    }

    /// Adds the next reading (in time order).
    pub(super) fn push(&mut self, s: Sample) {
        let side = if s.ms <= self.cut_ms { &mut self.warmup_peak } else { &mut self.peak };
        *side = Some(side.map_or(s.kib, |p| p.max(s.kib)));
        self.first.get_or_insert(s);
        self.last = Some(s);
        if self.count.is_multiple_of(self.stride) {
            if self.kept.len() == KEEP {
                let mut i = 0;
                self.kept.retain(|_| {
                    i += 1;
                    i % 2 == 1
                });
                self.stride *= 2;
            }
            if self.count.is_multiple_of(self.stride) {
                self.kept.push(s);
            }
        }
        self.count += 1;
    }
}

/// A thread reading VmRSS every `period` until `finish`.
pub(super) struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Series>,
    period: Duration,
}

/// The sampling period for a run of `total`: about 200 readings, 10 to 200 ms apart.
pub(super) fn period_for(total: Duration) -> Duration {
    (total / 200).clamp(Duration::from_millis(10), Duration::from_millis(200))
}

impl Sampler {
    /// Starts reading; the first `warmup` of the run is its warm-up.
    pub(super) fn start(period: Duration, warmup: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let began = Instant::now();
            let mut series = Series::new(warmup);
            let read = |series: &mut Series| {
                if let Some(kib) = rss_kib() {
                    series.push(Sample { ms: began.elapsed().as_millis() as u64, kib });
                }
            };
            while !flag.load(Ordering::Relaxed) {
                read(&mut series);
                std::thread::sleep(period);
            }
            read(&mut series);
            series
        });
        Sampler { stop, thread, period }
    }

    /// Stops the thread; its readings (none where VmRSS cannot be read) and its period.
    pub(super) fn finish(self) -> (Series, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        (self.thread.join().unwrap_or_else(|_| Series::new(Duration::ZERO)), self.period)
    }
}

/// VmRSS of this process in KiB (Linux; `None` elsewhere).
pub(super) fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `--max-rss-growth-mb`, checked.
pub(super) fn bound_kib(mb: f64) -> Result<u64> {
    if !(mb.is_finite() && mb >= 0.0) {
        return Err(Error::invalid(format!("--max-rss-growth-mb {mb}: must be a finite number >= 0")));
    }
    Ok((mb * 1024.0).round() as u64)
}

/// The resident memory of a run, summarized, and whether its growth kept within the bound.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(super) struct RssReport {
    pub samples: usize,
    pub period_ms: u64,
    pub warmup_ms: u64,
    pub start_kib: Option<u64>,
    /// The peak during the warm-up: the baseline.
    pub warmup_peak_kib: Option<u64>,
    /// The peak after the warm-up.
    pub peak_kib: Option<u64>,
    pub end_kib: Option<u64>,
    /// `peak_kib - warmup_peak_kib` (negative when memory was given back); `None` without
    /// readings on both sides of the warm-up.
    pub growth_kib: Option<i64>,
    pub bound_kib: u64,
    /// False only when growth is known and above the bound.
    pub within_bound: bool,
    /// `[ms, kib]` pairs, evenly spaced over the run.
    pub series: Vec<[u64; 2]>,
}

/// Judges a run's readings against `bound_kib`.
pub(super) fn judge(series: &Series, period: Duration, bound_kib: u64) -> RssReport {
    let growth_kib = match (series.warmup_peak, series.peak) {
        (Some(w), Some(p)) => Some(p as i64 - w as i64),
        _ => None,
    };
    let step = series.kept.len().div_ceil(SERIES_POINTS).max(1);
    let mut points: Vec<[u64; 2]> = series.kept.iter().step_by(step).map(|s| [s.ms, s.kib]).collect();
    if let Some(last) = series.last
        && points.last() != Some(&[last.ms, last.kib])
    {
        points.push([last.ms, last.kib]);
    }
    RssReport {
        samples: series.count,
        period_ms: period.as_millis() as u64,
        warmup_ms: series.cut_ms,
        start_kib: series.first.map(|s| s.kib),
        warmup_peak_kib: series.warmup_peak,
        peak_kib: series.peak,
        end_kib: series.last.map(|s| s.kib),
        growth_kib,
        bound_kib,
        within_bound: growth_kib.is_none_or(|g| g <= bound_kib as i64),
        series: points,
    }
}

impl RssReport {
    /// The report as lines of text.
    pub(super) fn render(&self) -> String {
        let mib = |k: Option<u64>| k.map_or_else(|| "n/a".to_owned(), |k| format!("{:.1} MiB", k as f64 / 1024.0));
        let growth = self.growth_kib.map_or_else(|| "n/a".to_owned(), |g| format!("{:+.1} MiB", g as f64 / 1024.0));
        let verdict = if self.within_bound { "within bound" } else { "FAILED: above bound" };
        let series: Vec<String> = self
            .series
            .iter()
            .map(|[ms, kib]| format!("{:.1}s:{:.1}", *ms as f64 / 1e3, *kib as f64 / 1024.0))
            .collect();
        format!(
            "resident memory over time: {} samples every {} ms; warm-up {:.1} s peak {}, after it peak {}, end {}; \
             growth {growth} (bound {:.1} MiB): {verdict}\n  series (s:MiB): {}\n",
            self.samples,
            self.period_ms,
            self.warmup_ms as f64 / 1e3,
            mib(self.warmup_peak_kib),
            mib(self.peak_kib),
            mib(self.end_kib),
            self.bound_kib as f64 / 1024.0,
            series.join(" ")
        )
    }
}

/// A soak of `lz generate`: rounds run, their times, and the memory verdict.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Rounds {
    pub seconds: f64,
    pub rounds: usize,
    /// Milliseconds of the first round, the median round and the last round.
    pub round_ms: [f64; 3],
    /// Rounds whose tokens differ from the first round's (counted only when greedy).
    pub token_mismatch_rounds: usize,
    pub rss: RssReport,
}

impl Rounds {
    pub(super) fn passed(&self) -> bool {
        self.rss.within_bound && self.token_mismatch_rounds == 0
    }

    pub(super) fn render(&self) -> String {
        let [first, median, last] = self.round_ms;
        format!(
            "soak: {} rounds in {:.1} s; round {first:.1} ms first, {median:.1} ms median, {last:.1} ms last; \
             {} round(s) with other tokens than the first\n{}",
            self.rounds,
            self.seconds,
            self.token_mismatch_rounds,
            self.rss.render()
        )
    }
}

/// Runs `round` again and again for `seconds` (at least once) while sampling resident
/// memory; its last output, and the soak. `round` returns its output and its tokens; when
/// `greedy`, every round's tokens must equal the first's.
pub(super) fn repeat<T>(
    seconds: f64,
    max_growth_mb: f64,
    greedy: bool,
    mut round: impl FnMut() -> Result<(T, Vec<Vec<u32>>)>,
) -> Result<(T, Rounds)> {
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= MAX_SECONDS) {
        return Err(Error::invalid(format!("--seconds {seconds}: must be above 0 and at most {MAX_SECONDS}")));
    }
    let bound = bound_kib(max_growth_mb)?;
    let total = Duration::from_secs_f64(seconds);
    let sampler = Sampler::start(period_for(total), total / 4);
    let began = Instant::now();
    let (mut times, mut mismatches) = (Vec::new(), 0);
    let t = Instant::now();
    let (mut last, first_tokens) = round()?;
    times.push(t.elapsed().as_secs_f64() * 1e3);
    while began.elapsed() < total {
        let t = Instant::now();
        let (out, tokens) = round()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        mismatches += usize::from(greedy && tokens != first_tokens);
        last = out;
    }
    let elapsed = began.elapsed().as_secs_f64();
    let (series, period) = sampler.finish();
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let round_ms = [times[0], sorted[sorted.len() / 2], times[times.len() - 1]];
    let rss = judge(&series, period, bound);
    Ok((last, Rounds { seconds: elapsed, rounds: times.len(), round_ms, token_mismatch_rounds: mismatches, rss }))
}

/// One run, or with `--seconds` a soak of rounds (§11.2): the last round's output and the soak.
pub(super) fn rounds<T>(
    a: &GenerateCmd,
    ids: impl Fn(&T) -> Vec<Vec<u32>>,
    mut run: impl FnMut() -> Result<T>,
) -> Result<(T, Option<Rounds>)> {
    let Some(seconds) = a.seconds else { return Ok((run()?, None)) };
    let (out, r) = repeat(seconds, a.max_rss_growth_mb, a.temperature == 0.0, || {
        let out = run()?;
        let ids = ids(&out);
        Ok((out, ids))
    })?;
    Ok((out, Some(r)))
}

pub(super) fn ids_of(seqs: &[llm::Sequence]) -> Vec<Vec<u32>> {
    seqs.iter().map(|s| s.generated_ids.clone()).collect()
}

/// A report with its soak, when there was one.
pub(super) fn with_soak(mut report: serde_json::Value, soak: Option<&Rounds>) -> serde_json::Value {
    if let Some(s) = soak {
        report["soak"] = serde_json::to_value(s).unwrap_or_default();
    }
    report
}

pub(super) fn outcome(soak: Option<&Rounds>) -> Outcome {
    if soak.is_some_and(|s| !s.passed()) { Outcome::CheckFailed } else { Outcome::Ok }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A series of readings 100 ms apart whose first `warmup_ms` is the warm-up.
    fn series(warmup_ms: u64, kib: &[u64]) -> Series {
        let mut s = Series::new(Duration::from_millis(warmup_ms));
        for (i, &kib) in kib.iter().enumerate() {
            s.push(Sample { ms: i as u64 * 100, kib });
        }
        s
    }

    #[test]
    fn section_11_2_a_steady_working_set_is_within_any_bound_and_a_rising_one_is_not() {
        let period = Duration::from_millis(100);
        // The warm-up rises to its working set, then the run stays at or below it.
        let steady = judge(&series(300, &[100, 400, 900, 1000, 950, 1000, 980]), period, 0);
        assert_eq!((steady.warmup_peak_kib, steady.peak_kib, steady.growth_kib), (Some(1000), Some(1000), Some(0)));
        assert!(steady.within_bound, "{steady:?}");
        // A leak keeps rising after the warm-up: 1 MiB past a bound of 1023 KiB.
        let leak = judge(&series(300, &[100, 400, 900, 1000, 1300, 1700, 2024]), period, 1023);
        assert_eq!(leak.growth_kib, Some(1024));
        assert!(!leak.within_bound && leak.render().contains("FAILED"), "{leak:?}");
        assert_eq!(leak.series.last(), Some(&[600, 2024]), "the last reading ends the series");
    }

    #[test]
    fn section_11_2_no_reading_after_the_warm_up_gives_no_verdict_rather_than_a_pass_by_arithmetic() {
        let r = judge(&series(5000, &[100, 200]), Duration::from_millis(100), 0);
        assert_eq!((r.growth_kib, r.peak_kib, r.within_bound), (None, None, true));
        assert!(bound_kib(-1.0).is_err() && bound_kib(f64::NAN).is_err());
        assert_eq!(bound_kib(1.5).ok(), Some(1536));
    }

    #[test]
    fn section_11_2_a_days_long_series_keeps_a_bounded_buffer_and_every_peak() {
        // Three days of readings 200 ms apart, one spike in the middle.
        let n = 3 * 24 * 3600 * 5;
        let mut s = Series::new(Duration::from_secs(18 * 3600));
        for i in 0..n {
            s.push(Sample { ms: i as u64 * 200, kib: if i == n / 2 { 9000 } else { 1000 + (i % 7) as u64 } });
        }
        assert!(
            s.kept.len() <= KEEP && s.kept.capacity() == KEEP,
            "{} kept, capacity {}",
            s.kept.len(),
            s.kept.capacity()
        );
        let gaps: Vec<u64> = s.kept.windows(2).map(|w| w[1].ms - w[0].ms).collect();
        assert!(gaps.windows(2).all(|g| g[0] == g[1]), "evenly thinned");
        let r = judge(&s, Duration::from_millis(200), 8 << 10);
        assert_eq!((r.samples, r.warmup_peak_kib, r.peak_kib), (n, Some(1006), Some(9000)));
        assert_eq!(r.growth_kib, Some(7994));
    }

    #[test]
    fn section_11_2_the_sampler_reads_this_process_while_it_grows() {
        let sampler = Sampler::start(Duration::from_millis(5), Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(30));
        // 64 MiB touched page by page: resident, not just reserved.
        let big = vec![1u8; 64 << 20];
        std::thread::sleep(Duration::from_millis(30));
        let (series, period) = sampler.finish();
        assert_eq!(big.iter().map(|&b| b as usize).sum::<usize>(), 64 << 20);
        if rss_kib().is_none() {
            return; // Not Linux: nothing to read.
        }
        // Other tests of this binary allocate and free in the same process while it runs, so
        // the growth read is the 64 MiB give or take theirs: past the 32 MiB bound is the claim.
        let r = judge(&series, period, 32 << 10);
        assert!(r.growth_kib.is_some_and(|g| g > 32 << 10), "{r:?}");
        assert!(!r.within_bound, "{r:?}");
    }
}
