//! A team of helper threads that spin between calls, for the decode step's chain of small
//! parallel ops. A rayon fork-join from outside its pool sleeps the caller on a latch and
//! wakes sleeping workers: 21-27 us on the 2-vCPU VM (`lz hardware --measure`), against a
//! GEMV of 30-100 us, and a decode step of the 125M model makes dozens of them. The team's
//! helpers wait for the next call by spinning (yielding to whatever else wants the CPU) for
//! [`SPIN`] after each call, then sleep; the caller runs its share of the tasks itself and
//! waits for the last one by spinning, so a call that follows another within [`SPIN`]
//! costs a few atomic operations rather than two wake-ups. On the 2-vCPU Xeon the 125M
//! model's decode step went 16.0 -> 15.4 ms in f32, 8.29 -> 7.62 in int8 and 6.87 -> 6.27
//! in int4 (medians of 3-4 interleaved runs).
//!
//! One caller at a time: a call finding the team busy (another thread, or a task calling
//! in), or in a forked process (the helpers were not forked with it), runs on rayon as
//! before. A panicking task is caught where it ran and resumed in the caller once every
//! task is done.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rayon::prelude::*;

/// How long a helper waits for the next call by spinning before it sleeps.
const SPIN: Duration = Duration::from_micros(200);
/// Most tasks in one call (the ticket's 16-bit field).
const MAX_TASKS: usize = u16::MAX as usize;

/// A task body: called with each task's index.
type Job<'a> = &'a (dyn Fn(usize) + Sync);

/// What the caller and the helpers share.
struct Shared {
    /// `epoch << 32 | tasks << 16`: the call and its task count in one word.
    ticket: AtomicU64,
    /// The call's job, a `*const Job` on the caller's stack, valid while it waits.
    job: AtomicPtr<()>,
    /// `epoch << 32 | index`: the next task of the current call to claim.
    next: AtomicU64,
    /// Tasks of the current call not finished yet.
    left: AtomicUsize,
    /// Set while a caller holds the team.
    busy: AtomicBool,
    /// A panic of a task, resumed by the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Helpers asleep, and where they sleep.
    sleepers: AtomicUsize,
    bed: Mutex<()>,
    wake: Condvar,
}

struct Team {
    shared: Arc<Shared>,
    /// The fork generation the helpers were started in.
    generation: u64,
}

fn epoch(t: u64) -> u64 {
    t >> 32
}

/// Runs tasks of call `t` until none is left to claim: each thread takes the next
/// unclaimed task, so a thread the hypervisor slowed takes fewer (a fixed share left the
/// caller spinning for the slower thread's last tasks, 3-5% of a decode step). A claim
/// carries the call's epoch, so a helper that saw the call late claims nothing of the next;
/// the job is read only after a claim, while the caller must still wait for that task.
fn work(s: &Shared, t: u64) {
    let tasks = (t >> 16) & 0xFFFF;
    let e = epoch(t);
    let mut next = s.next.load(Ordering::Acquire);
    while next >> 32 == e && next & 0xFFFF_FFFF < tasks {
        if let Err(now) = s.next.compare_exchange_weak(next, next + 1, Ordering::AcqRel, Ordering::Acquire) {
            next = now;
            continue;
        }
        // SAFETY: this thread claimed task `next` of call `e` (the caller stored the job
        // before it published `next` for the call, with Release, and the claim read it with
        // Acquire); the task is not finished, so the caller still waits (`left` > 0) with
        // the job alive on its stack, and publishes no other job before.
        #[allow(unsafe_code)]
        let job: Job<'_> = unsafe { *s.job.load(Ordering::Relaxed).cast::<Job<'_>>() };
        let i = (next & 0xFFFF_FFFF) as usize;
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(i))) {
            s.panic.lock().get_or_insert(p);
        }
        s.left.fetch_sub(1, Ordering::Release);
        next = s.next.load(Ordering::Acquire);
    }
}

/// Scratch each helper holds from its start: which thread runs which chunk depends on
/// timing, so a helper meeting a task's scratch size for the first time late would allocate
/// in the middle of serving (and a warm decode step allocates nothing). Buffers of 64 Ki
/// elements, three of f32 (tasks nest scratch), one each of i16 and f64.
const RESERVE: usize = 1 << 16;

fn helper(s: Arc<Shared>) {
    crate::alloc::reserve_scratch::<f32>(3, RESERVE);
    crate::alloc::reserve_scratch::<i16>(1, RESERVE);
    crate::alloc::reserve_scratch::<f64>(1, RESERVE);
    // Sleeping once now sets up this thread's parking state (parking_lot allocates it on a
    // thread's first wait), which would otherwise be allocated at the first idle gap.
    s.wake.wait_for(&mut s.bed.lock(), Duration::from_micros(1));
    // Calls count from 1: a call published before this thread first looks is still its.
    let mut seen = 0;
    loop {
        let idle = Instant::now();
        let mut spins = 0u32;
        let t = loop {
            let t = s.ticket.load(Ordering::Acquire);
            if epoch(t) != seen {
                break t;
            }
            if idle.elapsed() < SPIN {
                spins += 1;
                // A few pauses, then give the CPU to whatever else is runnable.
                if spins < 64 {
                    std::hint::spin_loop()
                } else {
                    std::thread::yield_now()
                }
                continue;
            }
            let mut bed = s.bed.lock();
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            while epoch(s.ticket.load(Ordering::SeqCst)) == seen {
                s.wake.wait(&mut bed);
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        };
        seen = epoch(t);
        work(&s, t);
    }
}

fn team() -> Option<&'static Team> {
    static TEAM: OnceLock<Option<Team>> = OnceLock::new();
    TEAM.get_or_init(|| {
        let helpers = rayon::current_num_threads().saturating_sub(1);
        if helpers == 0 {
            return None;
        }
        let shared = Arc::new(Shared {
            ticket: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            next: AtomicU64::new(0),
            left: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            bed: Mutex::new(()),
            wake: Condvar::new(),
        });
        for h in 1..=helpers {
            let s = shared.clone();
            std::thread::Builder::new().name(format!("lz-team-{h}")).spawn(move || helper(s)).ok()?;
        }
        Some(Team { shared, generation: crate::fork::generation() })
    })
    .as_ref()
    .filter(|t| t.generation == crate::fork::generation())
}

/// `job(i)` for every `i < tasks`, on the team when it is free, else on rayon.
pub(crate) fn for_each(tasks: usize, job: impl Fn(usize) + Sync) {
    if tasks <= 1 {
        (0..tasks).for_each(job);
        return;
    }
    let Some(team) = team().filter(|_| tasks <= MAX_TASKS) else {
        return (0..tasks).into_par_iter().for_each(&job);
    };
    let s = &*team.shared;
    if s.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        return (0..tasks).into_par_iter().for_each(&job);
    }
    let job: Job<'_> = &job;
    let e = (epoch(s.ticket.load(Ordering::Relaxed)).wrapping_add(1) & 0xFFFF_FFFF).max(1);
    s.left.store(tasks, Ordering::Relaxed);
    s.job.store((&job as *const Job<'_>).cast_mut().cast(), Ordering::Relaxed);
    s.next.store(e << 32, Ordering::Release);
    let t = e << 32 | (tasks as u64) << 16;
    s.ticket.store(t, Ordering::SeqCst);
    if s.sleepers.load(Ordering::SeqCst) > 0 {
        let _bed = s.bed.lock();
        s.wake.notify_all();
    }
    work(s, t);
    while s.left.load(Ordering::Acquire) > 0 {
        std::hint::spin_loop();
    }
    let panic = s.panic.lock().take();
    s.busy.store(false, Ordering::Release);
    if let Some(p) = panic {
        std::panic::resume_unwind(p);
    }
}

/// A `*mut T` that may cross threads: the chunks handed out through it are disjoint.
#[derive(Clone, Copy)]
struct Base<T>(*mut T);
// SAFETY: `Base` only hands out disjoint chunks of one `&mut [T]` (see `chunks_mut`), so
// sharing it is sharing `&mut` to distinct parts, which `T: Send` allows.
#[allow(unsafe_code)]
unsafe impl<T: Send> Sync for Base<T> {}

/// `f(c, chunk)` for each chunk `c` of `size` elements of `dst` (the last may be shorter),
/// in parallel as [`for_each`] runs it.
pub(crate) fn chunks_mut<T: Send>(dst: &mut [T], size: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let (len, size) = (dst.len(), size.max(1));
    let base = Base(dst.as_mut_ptr());
    let base = &base;
    for_each(len.div_ceil(size), |c| {
        let start = c * size;
        let n = size.min(len - start);
        // SAFETY: chunk `c` is `start..start + n` of `dst`, within it, and each task index
        // runs once, so the chunks handed out are disjoint; `dst` is borrowed mutably for
        // this whole call, which returns only once every task has finished.
        #[allow(unsafe_code)]
        let chunk = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), n) };
        f(c, chunk);
    });
}

/// [`chunks_mut`] over two slices chunked alike (`a` and `b` of equal length).
pub(crate) fn chunks2_mut<T: Send>(
    a: &mut [T],
    b: &mut [T],
    size: usize,
    f: impl Fn(usize, &mut [T], &mut [T]) + Sync,
) {
    let (len, size) = (a.len().min(b.len()), size.max(1));
    let (pa, pb) = (Base(a.as_mut_ptr()), Base(b.as_mut_ptr()));
    let (pa, pb) = (&pa, &pb);
    for_each(len.div_ceil(size), |c| {
        let start = c * size;
        let n = size.min(len - start);
        // SAFETY: as in `chunks_mut`, for each of the two slices.
        #[allow(unsafe_code)]
        let (ca, cb) = unsafe {
            (std::slice::from_raw_parts_mut(pa.0.add(start), n), std::slice::from_raw_parts_mut(pb.0.add(start), n))
        };
        f(c, ca, cb);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_written_once_over_many_calls() {
        let mut v = vec![0u32; 1000];
        for round in 1..=300u32 {
            chunks_mut(&mut v, 37, |c, part| {
                for (j, x) in part.iter_mut().enumerate() {
                    *x += (c * 37 + j) as u32 + round;
                }
            });
        }
        let want: Vec<u32> = (0..1000u32).map(|i| 300 * i + (1..=300).sum::<u32>()).collect();
        assert_eq!(v, want);
    }

    #[test]
    fn calls_from_several_threads_and_nested_calls_all_complete() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..200 {
                        for_each(4, |_| for_each(3, |_| _ = total.fetch_add(1, Ordering::Relaxed)));
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 200 * 12);
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_after_the_others_finish() {
        let done = AtomicUsize::new(0);
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for_each(8, |i| {
                if i == 3 {
                    panic!("task three");
                }
                done.fetch_add(1, Ordering::Relaxed);
            })
        }));
        std::panic::set_hook(prev);
        assert!(r.is_err());
        assert_eq!(done.load(Ordering::Relaxed), 7);
        // The team is free again.
        let after = AtomicUsize::new(0);
        for_each(5, |_| _ = after.fetch_add(1, Ordering::Relaxed));
        assert_eq!(after.load(Ordering::Relaxed), 5);
    }
}
