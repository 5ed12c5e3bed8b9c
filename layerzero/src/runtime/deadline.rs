//! Runner threads for kernels with a deadline. The caller waits for the result up to the
//! deadline; a call that is late is abandoned where it runs (a thread cannot be stopped
//! safely) and its result is dropped if it ever arrives. Runners are reused: a call claims an
//! idle runner or starts a new one, so no call waits behind another, and a runner stuck in an
//! abandoned call is simply never idle again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use parking_lot::Mutex;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Idle runners kept beyond this many exit.
const MAX_IDLE: usize = 8;

#[derive(Debug)]
struct Shared {
    jobs: Mutex<Receiver<Job>>,
    idle: AtomicUsize,
}

/// The runner threads of one handle (they exit when it is dropped).
pub(crate) struct Runners {
    /// The runners of this process. A forked child inherits none of the parent's threads
    /// (and perhaps their queue's lock, held): it starts runners of its own.
    current: Mutex<Arc<Pool>>,
}

/// Runners started in one process (fork generation).
struct Pool {
    generation: u64,
    queue: Sender<Job>,
    shared: Arc<Shared>,
}

impl Pool {
    fn new(generation: u64) -> Pool {
        let (queue, jobs) = mpsc::channel();
        Pool { generation, queue, shared: Arc::new(Shared { jobs: Mutex::new(jobs), idle: AtomicUsize::new(0) }) }
    }
}

impl std::fmt::Debug for Runners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runners").field("idle", &self.current.lock().shared.idle.load(Ordering::Relaxed)).finish()
    }
}

/// How a call under a deadline ended.
pub(crate) enum Ended<T> {
    /// It returned in time.
    Done(T),
    /// It was abandoned; `on_return` runs when it does return.
    Late,
}

const RUNNING: u8 = 0;
const DONE: u8 = 1;
const ABANDONED: u8 = 2;

impl Runners {
    pub(crate) fn new() -> Runners {
        Runners { current: Mutex::new(Arc::new(Pool::new(layerzero_cpu::fork::generation()))) }
    }

    /// The runners of this process: after a fork, a new set (the inherited one is forgotten,
    /// never joined: its threads, and whatever lock they held, stayed in the parent).
    fn pool(&self) -> Arc<Pool> {
        let generation = layerzero_cpu::fork::generation();
        let mut current = self.current.lock();
        if current.generation != generation {
            std::mem::forget(std::mem::replace(&mut *current, Arc::new(Pool::new(generation))));
        }
        current.clone()
    }

    /// Runs `call` on a runner and waits for it at most `deadline`. A late call keeps
    /// running; `on_return` runs on its thread when it returns (to count it back).
    pub(crate) fn call<T: Send + 'static>(
        &self,
        deadline: Duration,
        call: impl FnOnce() -> T + Send + 'static,
        on_return: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Ended<T>> {
        let (tx, rx) = mpsc::sync_channel(1);
        let state = Arc::new(AtomicU8::new(RUNNING));
        let theirs = state.clone();
        let job: Job = Box::new(move || {
            let out = call();
            if theirs.compare_exchange(RUNNING, DONE, Ordering::AcqRel, Ordering::Acquire).is_err() {
                on_return();
            }
            let _ = tx.send(out);
        });
        self.start(job)?;
        match rx.recv_timeout(deadline) {
            Ok(out) => Ok(Ended::Done(out)),
            Err(RecvTimeoutError::Timeout) => {
                if state.compare_exchange(RUNNING, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    return Ok(Ended::Late);
                }
                // It finished as the deadline passed: its result is on the way.
                rx.recv().map(Ended::Done).map_err(|_| std::io::Error::other("a kernel runner ended without a result"))
            }
            Err(RecvTimeoutError::Disconnected) => Err(std::io::Error::other("a kernel runner ended without a result")),
        }
    }

    fn start(&self, job: Job) -> std::io::Result<()> {
        let pool = self.pool();
        let claimed = pool.shared.idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok();
        if claimed {
            return pool.queue.send(job).map_err(|_| std::io::Error::other("kernel runners are gone"));
        }
        let shared = pool.shared.clone();
        std::thread::Builder::new().name("lz-kernel-runner".to_owned()).spawn(move || runner(&shared, job))?;
        Ok(())
    }
}

fn runner(shared: &Shared, first: Job) {
    first();
    loop {
        if shared.idle.fetch_add(1, Ordering::AcqRel) >= MAX_IDLE {
            shared.idle.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        // The caller that queued a job already took this runner off the idle count.
        let job = shared.jobs.lock().recv();
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn a_call_in_time_returns_its_value_and_a_late_one_is_abandoned_and_counted_back() {
        let runners = Runners::new();
        let fast = runners.call(Duration::from_secs(5), || 7, || {});
        assert!(matches!(fast, Ok(Ended::Done(7))));
        let (release, returned) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (r, back) = (release.clone(), returned.clone());
        let slow = runners.call(
            Duration::from_millis(20),
            move || {
                while !r.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                1
            },
            move || back.store(true, Ordering::Release),
        );
        assert!(matches!(slow, Ok(Ended::Late)));
        // A stuck runner does not delay the next call: it gets another runner.
        assert!(matches!(runners.call(Duration::from_secs(5), || 8, || {}), Ok(Ended::Done(8))));
        release.store(true, Ordering::Release);
        for _ in 0..1000 {
            if returned.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("the abandoned call's return was never counted");
    }
}
