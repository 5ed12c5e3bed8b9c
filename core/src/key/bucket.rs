//! Bucket anchor functions: how a perf field's value maps to a bucket.
//!
//! Every perf axis uses powers of two with bounds: bucket `i` holds the values in
//! `(2^(i-1), 2^i]`, bucket 0 holds exactly 1. So `1`, `2`, `3..=4`, `5..=8`, ... A value
//! above the axis's bound (or 0) has no bucket: it is never cached or planned, it is
//! always selected live. Bucket 0 being the single value 1 matters: checks that read
//! "seq_q == 1" (decode kernels) can never straddle a bucket.

use serde::Serialize;

/// The anchor of one perf axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Anchor {
    /// Largest value with a bucket (a power of two).
    pub max: u64,
}

impl Anchor {
    /// Powers of two up to `max` (rounded up to a power of two).
    pub const fn pow2(max: u64) -> Anchor {
        Anchor { max: max.next_power_of_two() }
    }

    /// The bucket of `value`, or `None` outside `[1, max]`.
    #[inline]
    pub fn bucket(self, value: u64) -> Option<u8> {
        if value == 0 || value > self.max {
            return None;
        }
        // ceil(log2(value)): 1 -> 0, 2 -> 1, 3..=4 -> 2, 5..=8 -> 3.
        Some((u64::BITS - (value - 1).leading_zeros()) as u8)
    }

    /// The inclusive value range of bucket `i`.
    pub fn range(self, i: u8) -> (u64, u64) {
        let hi = 1u64 << i;
        let lo = if i == 0 { 1 } else { (hi >> 1) + 1 };
        (lo, hi)
    }

    /// Number of buckets.
    pub fn buckets(self) -> u8 {
        self.bucket(self.max).unwrap_or(0) + 1
    }

    /// The buckets that intersect the inclusive range `[lo, hi]`, clipped to the bounds.
    pub fn covering(self, lo: u64, hi: u64) -> Vec<u8> {
        let lo = lo.max(1);
        let hi = hi.min(self.max);
        if lo > hi {
            return Vec::new();
        }
        match (self.bucket(lo), self.bucket(hi)) {
            (Some(a), Some(b)) => (a..=b).collect(),
            _ => Vec::new(),
        }
    }
}

/// `1`, `2`, `3..4`: how a bucket is written in tables, PerfDB rows and reports.
pub fn range_text(lo: u64, hi: u64) -> String {
    if lo == hi { lo.to_string() } else { format!("{lo}..{hi}") }
}

#[cfg(test)]
mod tests {
    use super::Anchor;
    use crate::TestResult;

    #[test]
    fn buckets_are_powers_of_two_with_one_alone() {
        let a = Anchor::pow2(1024);
        let got: Vec<Option<u8>> = [0, 1, 2, 3, 4, 5, 8, 9, 1024, 1025].iter().map(|&v| a.bucket(v)).collect();
        assert_eq!(got, [None, Some(0), Some(1), Some(2), Some(2), Some(3), Some(3), Some(4), Some(10), None]);
    }

    #[test]
    fn every_value_lies_in_the_range_of_its_bucket() -> TestResult {
        let a = Anchor::pow2(4096);
        for v in 1..=4096 {
            let b = a.bucket(v).ok_or_else(|| format!("{v} has no bucket"))?;
            let (lo, hi) = a.range(b);
            assert!(lo <= v && v <= hi, "{v} in bucket {b} = {lo}..{hi}");
        }
        assert_eq!(a.buckets(), 13);
        Ok(())
    }

    #[test]
    fn covering_lists_the_buckets_a_range_touches() {
        let a = Anchor::pow2(1024);
        assert_eq!(a.covering(16, 100), vec![4, 5, 6, 7]);
        assert_eq!(a.covering(1, 1), vec![0]);
        assert_eq!(a.covering(2000, 3000), Vec::<u8>::new());
    }
}
