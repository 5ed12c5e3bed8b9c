//! New output buffers. Every kernel of this backend returns new tensors, and a large new
//! buffer is faulted in page by page as the kernel first writes it. With 4 KiB pages those
//! faults, not the arithmetic, set the pace of the memory-bound kernels (measured on a
//! 2-core VM: a 64 MiB copy into a new buffer ran 2.5x slower on one thread and 6x slower
//! on two than into 2 MiB pages). So buffers of a few MiB and more ask Linux for
//! transparent huge pages (`madvise(MADV_HUGEPAGE)`, as numpy does for its large arrays),
//! which matters where THP is in `madvise` mode. Elsewhere this is a no-op.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::thread::LocalKey;

use super::rows::Slot;
use layerzero_core::exec::args::Outputs;
use layerzero_core::exec::executor::KernelError;
use layerzero_core::tensor::{Buf, HostTensor, Storage, advise_huge};

/// `v` (a new, untouched buffer such as `vec![0f32; n]`, which is a calloc) with huge
/// pages requested for it (buffers of 4 MiB and more; see [`advise_huge`]).
pub(super) fn huge<T>(v: Vec<T>) -> Vec<T> {
    advise_huge(&v);
    v
}

/// A buffer whose first element sits on a cache-line (64-byte) boundary: AMX tile loads
/// and stores whose 64-byte rows straddle two lines ran 3x slower (measured on the 2-core
/// VM), and `Vec`'s large allocations are 16-byte aligned. The window holds `len` elements
/// of a zeroed (calloc) allocation with room to align it.
#[derive(Default)]
pub(super) struct Aligned<T> {
    buf: Vec<T>,
    off: usize,
    len: usize,
}

impl<T> Aligned<T> {
    /// No elements, no allocation.
    pub(super) const fn empty() -> Self {
        Aligned { buf: Vec::new(), off: 0, len: 0 }
    }
}

impl<T: Copy + Default> Aligned<T> {
    /// `len` zeros (huge pages requested as by [`huge`]).
    pub(super) fn zeroed(len: usize) -> Self {
        let size = std::mem::size_of::<T>().max(1);
        let buf = huge(vec![T::default(); len + 64 / size]);
        let off = (buf.as_ptr() as usize).wrapping_neg() % 64 / size;
        Aligned { buf, off, len }
    }

    /// Elements the window can hold without a new allocation.
    pub(super) fn capacity(&self) -> usize {
        self.buf.len() - self.off
    }

    /// Makes the window `len` long: the same allocation when it has room (contents kept,
    /// old elements beyond the previous length unspecified), else new zeros.
    pub(super) fn set_len(&mut self, len: usize) {
        if self.off + len <= self.buf.len() {
            self.len = len;
        } else {
            *self = Self::zeroed(len);
        }
    }
}

impl<T> std::ops::Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.buf[self.off..self.off + self.len]
    }
}

impl<T> std::ops::DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.off..self.off + self.len]
    }
}

/// An output buffer of `T`: the one the caller handed in under the output's name, reused
/// in place when it holds `T`, has room and is shared with nothing (so a decode loop that
/// hands its outputs back allocates nothing), or a new one. A buffer lent by another runtime
/// (a torch tensor, [`Region`](layerzero_core::tensor::Region)) is written in place when it
/// is lent writable, whole and contiguous and holds exactly the output. The kernel writes
/// `v`; `finish` makes the tensor.
pub(super) struct Out<T: Slot> {
    /// The caller's storage, its buffer taken out for the kernel to write.
    shell: Option<Arc<Storage>>,
    /// The elements, all `n` of them (zeros until written).
    pub(super) v: Buf<T>,
}

impl<T: Slot> Out<T> {
    /// The buffer for output `name` of `n` elements.
    pub(super) fn take(buffers: &mut Outputs, name: &str, n: usize) -> Out<T> {
        if let Some(t) = buffers.remove(name) {
            let whole = t.is_contiguous() && t.offset() == 0 && t.numel() == n;
            let mut shell = t.into_shared();
            if let Some(b) = Arc::get_mut(&mut shell).and_then(T::buf_mut) {
                if b.is_lent() {
                    if let (true, Some(s)) = (whole, b.lent_mut().filter(|s| s.len() == n)) {
                        s.fill(T::ZERO);
                        let v = std::mem::take(b);
                        return Out { shell: Some(shell), v };
                    }
                } else if b.vec_mut().capacity() >= n {
                    let mut v = std::mem::take(b.vec_mut());
                    v.clear();
                    v.resize(n, T::ZERO);
                    return Out { shell: Some(shell), v: Buf::from(v) };
                }
            }
        }
        Out { shell: None, v: Buf::from(T::zeros(n)) }
    }

    /// The output tensor.
    pub(super) fn finish(self, shape: &[usize]) -> Result<HostTensor, KernelError> {
        let built = match self.shell {
            Some(mut shell) => match Arc::get_mut(&mut shell).and_then(T::buf_mut) {
                Some(slot) => {
                    *slot = self.v;
                    HostTensor::from_shared(shell, shape)
                }
                None => HostTensor::new(T::storage_of(self.v), shape),
            },
            None => HostTensor::new(T::storage_of(self.v), shape),
        };
        built.map_err(|e| KernelError::Failed(format!("building the output: {e}")))
    }
}

/// Bytes held at rest in the kernels' per-thread scratch (see [`scratch_bytes`]).
static HELD: AtomicI64 = AtomicI64::new(0);

fn held(bytes: usize, sign: i64) {
    HELD.fetch_add(sign * bytes as i64, Ordering::Relaxed);
}

/// Bytes the kernels' threads keep as scratch between calls, all threads together. Which
/// thread meets which size of temporaries first depends on timing, so a thread can grow
/// its scratch late, once per size; memory held beyond this is not the kernels' scratch.
pub fn scratch_bytes() -> u64 {
    HELD.load(Ordering::Relaxed).max(0) as u64
}

/// A thread's pool of scratch vectors, its bytes counted in [`scratch_bytes`] while they
/// rest in it (and no longer once its thread exits).
pub(super) struct Pool<T>(Vec<Vec<T>>);

impl<T> Pool<T> {
    const fn new() -> Self {
        Pool(Vec::new())
    }
    fn pop(&mut self) -> Option<Vec<T>> {
        let v = self.0.pop()?;
        held(v.capacity() * size_of::<T>(), -1);
        Some(v)
    }
    fn push(&mut self, v: Vec<T>) {
        held(v.capacity() * size_of::<T>(), 1);
        self.0.push(v);
    }
}

impl<T> Drop for Pool<T> {
    fn drop(&mut self) {
        held(self.0.iter().map(|v| v.capacity() * size_of::<T>()).sum(), -1);
    }
}

/// A thread's one kept aligned buffer (GEMM packing, AMX blocks): taken for a call and
/// returned after, the larger of two kept; counted in [`scratch_bytes`] while it rests.
pub(super) struct Kept<T>(Cell<Aligned<T>>);

impl<T: Copy + Default> Kept<T> {
    pub(super) const fn new() -> Self {
        Kept(Cell::new(Aligned::empty()))
    }
    /// The kept buffer with a window of `len` elements (contents unspecified; a nested
    /// call on the same thread finds none kept and gets a fresh one).
    pub(super) fn take(&self, len: usize) -> Aligned<T> {
        let mut v = self.0.take();
        held(v.capacity() * size_of::<T>(), -1);
        v.set_len(len);
        v
    }
    /// Keeps `v` unless a larger buffer is kept, or `v` exceeds `max` elements.
    pub(super) fn keep(&self, v: Aligned<T>, max: usize) {
        if v.capacity() > max {
            return;
        }
        let old = self.0.take();
        let kept = if old.capacity() > v.capacity() { old } else { v };
        held(kept.capacity() * size_of::<T>(), 1);
        self.0.set(kept);
    }
}

impl<T> Drop for Kept<T> {
    fn drop(&mut self) {
        let v = self.0.replace(Aligned::empty());
        held(v.buf.len().saturating_sub(v.off) * size_of::<T>(), -1);
    }
}

thread_local! {
    /// Per-thread scratch buffers (see [`with_scratch`]).
    static SCRATCH_F32: RefCell<Pool<f32>> = const { RefCell::new(Pool::new()) };
    static SCRATCH_F64: RefCell<Pool<f64>> = const { RefCell::new(Pool::new()) };
    static SCRATCH_I16: RefCell<Pool<i16>> = const { RefCell::new(Pool::new()) };
}

/// Runs `f` on `n` f32 of one of this thread's scratch buffers, written by `fill` and then
/// lent as a `Storage` (for code that reads through a `Mat`), kept between calls as
/// [`with_scratch`]'s are.
pub(super) fn with_scratch_storage<R>(n: usize, fill: impl FnOnce(&mut [f32]), f: impl FnOnce(&Storage) -> R) -> R {
    let mut v = SCRATCH_F32.with_borrow_mut(Pool::pop).unwrap_or_default();
    if v.len() < n {
        v.resize(n, 0.0);
    }
    fill(&mut v[..n]);
    let st = Storage::F32(Buf::from(v));
    let r = f(&st);
    if let Storage::F32(b) = st {
        SCRATCH_F32.with_borrow_mut(|s| s.push(b.into_vec()));
    }
    r
}

/// An element of scratch buffers: each type has its own per-thread pool.
pub(super) trait Scratch: Copy + Default + 'static {
    /// This thread's pool of buffers.
    fn pool() -> &'static LocalKey<RefCell<Pool<Self>>>;
}

impl Scratch for f32 {
    fn pool() -> &'static LocalKey<RefCell<Pool<f32>>> {
        &SCRATCH_F32
    }
}

impl Scratch for f64 {
    fn pool() -> &'static LocalKey<RefCell<Pool<f64>>> {
        &SCRATCH_F64
    }
}

impl Scratch for i16 {
    fn pool() -> &'static LocalKey<RefCell<Pool<i16>>> {
        &SCRATCH_I16
    }
}

/// Puts `count` buffers of `len` elements into this thread's pool of `T` scratch (a
/// thread that takes tasks of any size, as a decode team's helper does, then meets no
/// allocation below that size whichever tasks come its way first).
pub(super) fn reserve_scratch<T: Scratch>(count: usize, len: usize) {
    T::pool().with_borrow_mut(|p| (0..count).for_each(|_| p.push(vec![T::default(); len])));
}

/// Runs `f` on `n` elements of one of this thread's scratch buffers (contents
/// unspecified), kept between calls, so a kernel's temporaries cost no allocation once
/// warm. Nested calls get buffers of their own.
pub(super) fn with_scratch<T: Scratch, R>(n: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    let mut v = T::pool().with_borrow_mut(Pool::pop).unwrap_or_default();
    if v.len() < n {
        v.resize(n, T::default());
    }
    let r = f(&mut v[..n]);
    T::pool().with_borrow_mut(|s| s.push(v));
    r
}
