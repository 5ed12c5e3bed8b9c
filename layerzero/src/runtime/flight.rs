//! Single flight for cache misses. When threads miss the cache on the same (key, context) at
//! once (a cold start, a policy swap), one of them, the leader, selects live and the others
//! wait for its answer instead of each repeating the selection. Waiting is bounded: a waiter
//! not answered within [`WAIT`] (its leader descheduled or slow) selects live itself, and a
//! leader that fails or unwinds releases its waiters at once. Hits never come here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::plan::Resolved;
use crate::plan::cache;
use crate::plan::table::PlanKey;

/// The longest a miss waits for another thread's selection of its key. A live selection
/// takes microseconds; a leader not done after this was preempted, and the waiter's core is
/// better spent selecting than sleeping. Below a scheduler time slice.
pub(crate) const WAIT: Duration = Duration::from_millis(2);

/// Independent lists of selections in flight, so misses on different keys rarely meet.
const SHARDS: usize = 64;

/// The selections in flight, by (key, context).
#[derive(Debug)]
pub(crate) struct Flights {
    shards: Box<[Mutex<Vec<Arc<Flight>>>]>,
}

impl Default for Flights {
    fn default() -> Flights {
        Flights { shards: (0..SHARDS).map(|_| Mutex::new(Vec::new())).collect() }
    }
}

/// One selection in flight and its answer, once there is one.
#[derive(Debug)]
pub(crate) struct Flight {
    key: PlanKey,
    context: u64,
    answer: Mutex<Answer>,
    ready: Condvar,
}

#[derive(Debug)]
enum Answer {
    Pending,
    Done(Resolved),
    /// The leader failed (an error is the caller's to report; the waiter gets its own).
    Abandoned,
}

/// What joining a flight made of the caller.
#[derive(Debug)]
pub(crate) enum Role<'a> {
    /// Select live, then [`Lead::finish`]; dropping the lead unfinished releases the waiters.
    Leader(Lead<'a>),
    /// Another thread is selecting this key: [`Flight::wait`] for it.
    Waiter(Arc<Flight>),
}

/// What a waiter got.
#[derive(Debug)]
pub(crate) enum Waited {
    Answer(Resolved),
    /// The leader failed: select live.
    Abandoned,
    /// [`WAIT`] passed: select live.
    TimedOut,
}

/// The leader's duty to answer its waiters and leave the list.
#[derive(Debug)]
pub(crate) struct Lead<'a> {
    flights: &'a Flights,
    flight: Arc<Flight>,
}

impl Flights {
    fn shard(&self, key: &PlanKey, context: u64) -> Option<&Mutex<Vec<Arc<Flight>>>> {
        self.shards.get(cache::spread(key, context) as usize % SHARDS)
    }

    /// Leads the selection of (key, context), or waits on the thread already leading it.
    pub(crate) fn join(&self, key: PlanKey, context: u64) -> Role<'_> {
        let new = || Arc::new(Flight { key, context, answer: Mutex::new(Answer::Pending), ready: Condvar::new() });
        let Some(shard) = self.shard(&key, context) else {
            return Role::Leader(Lead { flights: self, flight: new() });
        };
        let mut list = shard.lock();
        if let Some(f) = list.iter().find(|f| f.key == key && f.context == context) {
            return Role::Waiter(f.clone());
        }
        let flight = new();
        list.push(flight.clone());
        Role::Leader(Lead { flights: self, flight })
    }

    /// Selections in flight now (tests).
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

impl Flight {
    /// The leader's answer; gives up after [`WAIT`].
    pub(crate) fn wait(&self) -> Waited {
        let deadline = Instant::now() + WAIT;
        let mut answer = self.answer.lock();
        loop {
            match &*answer {
                Answer::Done(r) => return Waited::Answer(r.clone()),
                Answer::Abandoned => return Waited::Abandoned,
                Answer::Pending => {}
            }
            // Spurious wake-ups loop; the deadline stays fixed, so the wait stays bounded.
            if self.ready.wait_until(&mut answer, deadline).timed_out() {
                return match &*answer {
                    Answer::Done(r) => Waited::Answer(r.clone()),
                    Answer::Abandoned => Waited::Abandoned,
                    Answer::Pending => Waited::TimedOut,
                };
            }
        }
    }
}

impl Lead<'_> {
    /// Hands `resolved` to every waiter and leaves the list.
    pub(crate) fn finish(self, resolved: &Resolved) {
        *self.flight.answer.lock() = Answer::Done(resolved.clone());
        // Drop removes the flight and wakes the waiters.
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        if let Some(shard) = self.flights.shard(&self.flight.key, self.flight.context) {
            shard.lock().retain(|f| !Arc::ptr_eq(f, &self.flight));
        }
        let mut answer = self.flight.answer.lock();
        if matches!(*answer, Answer::Pending) {
            *answer = Answer::Abandoned;
        }
        drop(answer);
        self.flight.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::key::Buckets;
    use crate::score::Estimate;
    use crate::select::{Score, ScoreSource, Selection};

    fn resolved(kernel: &str) -> Resolved {
        let model = Estimate { estimated_ns: 1.0, ..Estimate::default() };
        let score = Score {
            estimated_ns: 1.0,
            source: ScoreSource::Model,
            transform_ns: 0.0,
            policy_factor: 1.0,
            total_ns: 1.0,
            model,
            measurement: None,
            notes: Vec::new(),
        };
        let selection = Selection {
            kernel: kernel.into(),
            index: 0,
            backend: "cpu".into(),
            transforms: Vec::new(),
            score,
            candidates: 1,
            rejected: 0,
        };
        Resolved { selection: Arc::new(selection), executor: None }
    }

    const KEY: PlanKey = PlanKey { validity: 7, buckets: Buckets([1, 0, 0]) };

    #[test]
    fn a_second_miss_on_the_same_key_waits_for_the_first_and_gets_its_answer() -> TestResult {
        let flights = Flights::default();
        let Role::Leader(lead) = flights.join(KEY, 1) else { return Err("the first miss leads".into()) };
        let Role::Waiter(flight) = flights.join(KEY, 1) else { return Err("the second miss waits".into()) };
        std::thread::scope(|s| {
            let waiter = s.spawn(move || flight.wait());
            lead.finish(&resolved("a"));
            match waiter.join() {
                Ok(Waited::Answer(r)) => assert_eq!(r.selection.kernel, "a"),
                other => panic!("expected the leader's answer, got {other:?}"),
            }
        });
        assert_eq!(flights.in_flight(), 0, "a finished flight leaves the list");
        Ok(())
    }

    #[test]
    fn misses_under_another_context_or_key_do_not_wait() {
        let flights = Flights::default();
        let _lead = flights.join(KEY, 1);
        assert!(matches!(flights.join(KEY, 2), Role::Leader(_)), "another policy selects for itself");
        let other = PlanKey { validity: 8, ..KEY };
        assert!(matches!(flights.join(other, 1), Role::Leader(_)));
    }

    #[test]
    fn a_leader_that_fails_releases_its_waiters_at_once() -> TestResult {
        let flights = Flights::default();
        let lead = flights.join(KEY, 1);
        let Role::Waiter(flight) = flights.join(KEY, 1) else { return Err("the second miss waits".into()) };
        drop(lead);
        let started = Instant::now();
        assert!(matches!(flight.wait(), Waited::Abandoned));
        assert!(started.elapsed() < WAIT, "no wait for a leader that is gone");
        assert_eq!(flights.in_flight(), 0);
        Ok(())
    }

    #[test]
    fn a_waiter_whose_leader_never_answers_gives_up_after_the_bound() -> TestResult {
        let flights = Flights::default();
        let _stuck = flights.join(KEY, 1);
        let Role::Waiter(flight) = flights.join(KEY, 1) else { return Err("the second miss waits".into()) };
        let started = Instant::now();
        assert!(matches!(flight.wait(), Waited::TimedOut));
        assert!(started.elapsed() >= WAIT);
        Ok(())
    }
}
