//! One circuit breaker, as atomics: closed (counting consecutive failures) -> open (calls
//! refused until the cooldown passes) -> half-open (a limited number of trial calls go
//! through; a success closes it, a failure opens it again).
//!
//! A healthy call reads two words and writes nothing, so threads running healthy kernels
//! never contend on a breaker's cache line.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

/// What a breaker lets one call do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Closed: run.
    Pass,
    /// Half-open: run as one of the limited trial calls.
    Trial,
    /// Open: do not run; the cooldown ends in this long (zero: it ended, and every trial
    /// call is already under way).
    Refuse(Duration),
}

/// Thresholds, as the breaker reads them on each transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub threshold: u32,
    pub cooldown: Duration,
    pub trials: u32,
}

#[derive(Debug, Default)]
pub(crate) struct Breaker {
    /// Consecutive failures while closed.
    failures: AtomicU32,
    /// Nanoseconds since the health table's epoch at which it opened, plus one; 0 = closed.
    opened_at: AtomicU64,
    /// Trial calls admitted since the cooldown passed.
    trials: AtomicU32,
    /// How many times it opened.
    opens: AtomicU64,
    /// Why it last failed (written only on failures).
    last: Mutex<Option<String>>,
}

impl Breaker {
    /// Closed: calls run without reading the clock.
    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.opened_at.load(Ordering::Acquire) == 0
    }

    #[inline]
    pub(crate) fn admit(&self, now: u64, limits: Limits) -> Admit {
        let opened = self.opened_at.load(Ordering::Acquire);
        if opened == 0 {
            return Admit::Pass;
        }
        let elapsed = Duration::from_nanos(now.saturating_sub(opened - 1));
        if elapsed < limits.cooldown {
            return Admit::Refuse(limits.cooldown - elapsed);
        }
        if self.trials.fetch_add(1, Ordering::AcqRel) < limits.trials.max(1) {
            Admit::Trial
        } else {
            Admit::Refuse(Duration::ZERO)
        }
    }

    /// Gives back a trial slot taken by a call that did not run after all.
    pub(crate) fn untrial(&self) {
        let _ = self.trials.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// A call succeeded: the breaker closes (whether or not it was a trial).
    #[inline]
    pub(crate) fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.opened_at.load(Ordering::Relaxed) != 0 {
            self.opened_at.store(0, Ordering::Release);
            self.trials.store(0, Ordering::Release);
        }
    }

    /// A call failed. `at_once` opens the breaker whatever the count (a timeout, a lost
    /// device); a failure while open or half-open restarts the cooldown. True when this
    /// failure opened it.
    pub(crate) fn failed(&self, now: u64, limits: Limits, at_once: bool, why: &str) -> bool {
        *self.last.lock() = Some(why.to_owned());
        let open = self.opened_at.load(Ordering::Acquire) != 0;
        let failures = self.failures.fetch_add(1, Ordering::AcqRel).saturating_add(1);
        if open || at_once || failures >= limits.threshold.max(1) {
            self.trials.store(0, Ordering::Release);
            self.opened_at.store(now.saturating_add(1), Ordering::Release);
            if !open {
                self.opens.fetch_add(1, Ordering::Relaxed);
            }
            return !open;
        }
        false
    }

    /// The state now, for reports.
    pub(crate) fn state(&self, now: u64, limits: Limits) -> State {
        let opened = self.opened_at.load(Ordering::Acquire);
        if opened == 0 {
            return State::Closed { failures: self.failures.load(Ordering::Relaxed) };
        }
        let elapsed = Duration::from_nanos(now.saturating_sub(opened - 1));
        if elapsed < limits.cooldown {
            State::Open { left: limits.cooldown - elapsed }
        } else {
            let used = self.trials.load(Ordering::Acquire).min(limits.trials.max(1));
            State::HalfOpen { trials_left: limits.trials.max(1) - used }
        }
    }

    pub(crate) fn opens(&self) -> u64 {
        self.opens.load(Ordering::Relaxed)
    }

    pub(crate) fn last_failure(&self) -> Option<String> {
        self.last.lock().clone()
    }
}

/// A breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Calls run; this many consecutive failures so far.
    Closed {
        /// Consecutive failures.
        failures: u32,
    },
    /// Calls are refused for this long more.
    Open {
        /// Time left in the cooldown.
        left: Duration,
    },
    /// The cooldown passed; this many trial calls may still go through.
    HalfOpen {
        /// Trial calls left.
        trials_left: u32,
    },
}

impl State {
    /// `closed`, `open` or `half_open`.
    pub fn as_str(&self) -> &'static str {
        match self {
            State::Closed { .. } => "closed",
            State::Open { .. } => "open",
            State::HalfOpen { .. } => "half_open",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits { threshold: 3, cooldown: Duration::from_secs(10), trials: 2 };
    const SEC: u64 = 1_000_000_000;

    #[test]
    fn a_breaker_opens_at_the_threshold_and_refuses_until_the_cooldown_passes() {
        let b = Breaker::default();
        assert!(!b.failed(0, L, false, "a"));
        assert!(!b.failed(0, L, false, "b"));
        assert_eq!(b.admit(0, L), Admit::Pass, "below the threshold calls still run");
        assert!(b.failed(SEC, L, false, "c"), "the third failure opens it");
        assert_eq!(b.admit(3 * SEC, L), Admit::Refuse(Duration::from_secs(8)));
        assert_eq!(b.state(3 * SEC, L), State::Open { left: Duration::from_secs(8) });
        assert_eq!(b.last_failure().as_deref(), Some("c"));
        assert_eq!(b.opens(), 1);
    }

    #[test]
    fn half_open_admits_a_limited_number_of_trials_and_a_success_closes_it() {
        let b = Breaker::default();
        b.failed(0, L, true, "lost");
        let later = 11 * SEC;
        assert_eq!(b.state(later, L), State::HalfOpen { trials_left: 2 });
        assert_eq!(b.admit(later, L), Admit::Trial);
        assert_eq!(b.admit(later, L), Admit::Trial);
        assert_eq!(b.admit(later, L), Admit::Refuse(Duration::ZERO), "only two trials at once");
        b.succeeded();
        assert_eq!(b.admit(later, L), Admit::Pass);
        assert_eq!(b.state(later, L), State::Closed { failures: 0 });
    }

    #[test]
    fn a_failed_trial_opens_the_breaker_for_a_whole_new_cooldown() {
        let b = Breaker::default();
        b.failed(0, L, true, "first");
        assert_eq!(b.admit(10 * SEC, L), Admit::Trial);
        assert!(!b.failed(10 * SEC, L, false, "trial failed"), "it was already open: not a new opening");
        assert_eq!(b.admit(15 * SEC, L), Admit::Refuse(Duration::from_secs(5)));
        assert_eq!(b.opens(), 1);
    }
}
