//! Summary statistics of a timing series (pure): outliers rejected by MAD, then median,
//! percentiles, MAD and coefficient of variation of the samples kept.

use serde::{Deserialize, Serialize};

/// Scale that makes the MAD a consistent estimator of the standard deviation for normal data.
pub const MAD_SCALE: f64 = 1.4826;

/// A sample is an outlier when it lies more than this many scaled MADs from the median.
pub const OUTLIER_MADS: f64 = 3.0;

/// The summary of one timing series, over the samples kept after outlier rejection.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Samples kept.
    pub samples: u32,
    /// Samples rejected: outliers, and values that are not finite or are negative.
    pub rejected: u32,
    /// Median.
    pub median: f64,
    /// 10th percentile (linear interpolation between closest ranks).
    pub p10: f64,
    /// 90th percentile (linear interpolation between closest ranks).
    pub p90: f64,
    /// Median absolute deviation from the median (unscaled).
    pub mad: f64,
    /// Sample standard deviation (n - 1) over the mean; 0 for one sample or a zero mean.
    pub cv: f64,
}

/// Summarizes `samples_ns`: drops values that are not finite or are negative, rejects samples
/// with `|x - median| > 3 * 1.4826 * MAD` (none when the MAD is 0), and describes the rest.
/// `None` when no usable sample remains.
pub fn summarize(samples_ns: &[f64]) -> Option<Summary> {
    let mut valid: Vec<f64> = samples_ns.iter().copied().filter(|x| x.is_finite() && *x >= 0.0).collect();
    if valid.is_empty() {
        return None;
    }
    valid.sort_by(f64::total_cmp);
    let median = percentile_sorted(&valid, 0.5);
    let mad = mad_about(&valid, median);
    let kept: Vec<f64> = if mad > 0.0 {
        let limit = OUTLIER_MADS * MAD_SCALE * mad;
        valid.iter().copied().filter(|x| (x - median).abs() <= limit).collect()
    } else {
        valid
    };
    // The median itself is always within the limit, so `kept` is never empty.
    let n = kept.len();
    let median = percentile_sorted(&kept, 0.5);
    let mean = kept.iter().sum::<f64>() / n as f64;
    let cv = if n > 1 && mean > 0.0 {
        let var = kept.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
        var.sqrt() / mean
    } else {
        0.0
    };
    Some(Summary {
        samples: u32::try_from(n).unwrap_or(u32::MAX),
        rejected: u32::try_from(samples_ns.len() - n).unwrap_or(u32::MAX),
        median,
        p10: percentile_sorted(&kept, 0.1),
        p90: percentile_sorted(&kept, 0.9),
        mad: mad_about(&kept, median),
        cv,
    })
}

/// The `q` quantile (0..=1) of sorted, non-empty `xs`, interpolating linearly at `q * (n - 1)`.
fn percentile_sorted(xs: &[f64], q: f64) -> f64 {
    match xs.len() {
        0 => f64::NAN,
        1 => xs[0],
        n => {
            let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            let frac = pos - lo as f64;
            xs[lo] + (xs[hi] - xs[lo]) * frac
        }
    }
}

/// The median of `|x - center|`.
fn mad_about(xs: &[f64], center: f64) -> f64 {
    let mut dev: Vec<f64> = xs.iter().map(|x| (x - center).abs()).collect();
    dev.sort_by(f64::total_cmp);
    percentile_sorted(&dev, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn rejects_a_far_outlier() -> TestResult {
        // median 12; deviations 2,1,0,1,88 -> MAD 1; limit 4.4478: 100 goes.
        let s = summarize(&[13.0, 100.0, 10.0, 12.0, 11.0]);
        let s = s.ok_or("no summary")?;
        assert_eq!((s.samples, s.rejected), (4, 1));
        // Kept 10, 11, 12, 13.
        assert!(close(s.median, 11.5), "{s:?}");
        assert!(close(s.p10, 10.3), "{s:?}"); // position 0.3
        assert!(close(s.p90, 12.7), "{s:?}"); // position 2.7
        assert!(close(s.mad, 1.0), "{s:?}"); // deviations 1.5, 0.5, 0.5, 1.5
        // variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3
        assert!(close(s.cv, (5.0f64 / 3.0).sqrt() / 11.5), "{s:?}");
        Ok(())
    }

    #[test]
    fn keeps_a_sample_just_inside_the_limit() -> TestResult {
        // median 3.5; deviations 2.5, 1.5, 0.5, 0.5, 1.5, 3.9 -> MAD 1.5.
        let s = summarize(&[1.0, 2.0, 3.0, 4.0, 5.0, 7.4]).ok_or("no summary")?;
        // limit 3 * 1.4826 * 1.5 = 6.6717; |7.4 - 3.5| = 3.9 kept.
        assert_eq!((s.samples, s.rejected), (6, 0));
        assert!(close(s.median, 3.5));
        // 1..5 and 12: median 3.5, MAD 1.5, |12 - 3.5| = 8.5 > 6.6717: rejected.
        let s = summarize(&[1.0, 2.0, 3.0, 4.0, 5.0, 12.0]).ok_or("no summary")?;
        assert_eq!((s.samples, s.rejected), (5, 1));
        assert!(close(s.median, 3.0));
        Ok(())
    }

    #[test]
    fn zero_mad_keeps_everything() -> TestResult {
        // Most samples identical: MAD 0, so the 50 is kept, not rejected.
        let s = summarize(&[5.0, 5.0, 5.0, 50.0, 5.0]).ok_or("no summary")?;
        assert_eq!((s.samples, s.rejected), (5, 0));
        assert!(close(s.median, 5.0));
        assert!(close(s.mad, 0.0));
        assert!(close(s.p90, 5.0 + 0.6 * 45.0)); // position 3.6 between 5 and 50
        assert!(s.cv > 1.0);
        Ok(())
    }

    #[test]
    fn single_and_degenerate_inputs() -> TestResult {
        let s = summarize(&[7.0]).ok_or("no summary")?;
        assert_eq!((s.samples, s.rejected), (1, 0));
        assert!(close(s.median, 7.0) && close(s.p10, 7.0) && close(s.p90, 7.0) && s.cv == 0.0 && s.mad == 0.0);
        assert_eq!(summarize(&[]), None);
        assert_eq!(summarize(&[f64::NAN, f64::INFINITY, -1.0]), None);
        let s = summarize(&[2.0, f64::NAN, 4.0]).ok_or("no summary")?;
        assert_eq!((s.samples, s.rejected), (2, 1));
        assert!(close(s.median, 3.0));
        let s = summarize(&[0.0, 0.0]).ok_or("no summary")?;
        assert_eq!(s.cv, 0.0);
        Ok(())
    }
}
