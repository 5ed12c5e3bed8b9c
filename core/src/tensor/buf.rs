//! The elements behind a [`Storage`](super::Storage): owned, or read in place from a
//! memory-mapped file (a model's weights are not copied at load when their dtype is the
//! compute dtype).

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use bytemuck::Pod;
use memmap2::Mmap;

/// Where tensors read from a memory map are served from (a model's weights in the compute
/// dtype, `LAYERZERO_WEIGHTS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Residence {
    /// Copied once at load into memory that asks for transparent huge pages: the kernels
    /// stream weights with one TLB entry per 2 MiB (measured on a 125M f32 model against
    /// the mapped files: decode 3-10% faster, prefill 15-20%).
    #[default]
    Resident,
    /// Read in place from the mapped files: no copy, the page cache shared between processes.
    Mapped,
}

/// Memory another runtime owns and lends to a tensor for as long as the tensor lives (a torch
/// tensor's storage, seen from the Python package): the tensor reads it in place, and a
/// kernel writes an output into it in place when it is lent writable.
///
/// An implementation returns the same bytes (same address, same length) on every call; the
/// memory stays valid until the region is dropped.
pub trait Region: Send + Sync {
    /// The bytes lent.
    fn bytes(&self) -> &[u8];
    /// The bytes, writable; `None` when they are lent read-only (a kernel's input).
    fn bytes_mut(&mut self) -> Option<&mut [u8]>;
    /// The region itself, for the lender to recognize its own memory (and hand its own
    /// object back instead of a copy).
    fn as_any(&self) -> &dyn std::any::Any;
    /// Memory on a device that the host cannot read (a CUDA tensor's storage): the device and
    /// the region's size in bytes. `bytes` is then empty, a tensor over it has a shape but no
    /// host-readable elements, and only executors that take device memory run on it
    /// ([`Executor::takes_device_memory`](crate::exec::executor::Executor::takes_device_memory)).
    fn device(&self) -> Option<(crate::model::device::DeviceRef, usize)> {
        None
    }
}

/// A buffer of `T`: a `Vec`, `len` elements at byte `off` of a shared read-only map, or a
/// foreign [`Region`].
///
/// Reading never copies. Borrowing a mapped buffer, or a region lent read-only, mutably copies
/// it into an owned `Vec` first (copy on write): the map is shared by every tensor of the file,
/// and the lender's input must not change. A region lent writable is written in place.
pub struct Buf<T> {
    /// The elements when owned (empty while mapped or lent).
    vec: Vec<T>,
    /// `len` elements at byte `off` of a map, when mapped.
    map: Option<Mapped>,
    /// The lender's memory, when lent.
    lent: Option<Box<dyn Region>>,
}

#[derive(Clone)]
struct Mapped {
    map: Arc<Mmap>,
    off: usize,
    len: usize,
}

/// Bytes of a mapping copied before they are released (`Buf::resident`).
const RELEASE_CHUNK: usize = 8 << 20;

impl Mapped {
    /// Drops `len` bytes from byte `at` of this buffer out of the process's resident pages
    /// (`MADV_DONTNEED`), once they were copied. The file is not changed, so a later read of
    /// them (another tensor sharing a boundary page, a second copy) faults the same bytes in
    /// again: only memory is given back, never contents. Nothing is done where it fails.
    fn release(&self, at: usize, len: usize) {
        #[cfg(unix)]
        {
            #[allow(unsafe_code)]
            // SAFETY: the map is a read-only (private, never written) mapping of a file this
            // process never writes; MADV_DONTNEED on it drops the pages from the page tables,
            // and any later access reads the file's unchanged bytes again, so every `&[u8]`
            // into the map keeps seeing the same values. The range lies inside the map.
            let _ = unsafe { self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, self.off + at, len) };
        }
        #[cfg(not(unix))]
        let _ = (at, len);
    }

    fn slice<T: Pod>(&self) -> &[T] {
        // In range and aligned: checked when the buffer was made (`Buf::mapped`).
        bytemuck::cast_slice(&self.map[self.off..self.off + self.len * size_of::<T>()])
    }
}

impl<T: Pod> Buf<T> {
    /// `len` elements at byte `off` of `map`, or `None` when they do not lie inside the
    /// map or do not start on `T`'s alignment (the caller then copies).
    pub fn mapped(map: &Arc<Mmap>, off: usize, len: usize) -> Option<Buf<T>> {
        let bytes = len.checked_mul(size_of::<T>())?;
        let end = off.checked_add(bytes)?;
        let slice = map.get(off..end)?;
        // Little-endian files are read in place only where the host is little-endian too.
        let in_place = cfg!(target_endian = "little") && bytemuck::try_cast_slice::<u8, T>(slice).is_ok();
        in_place.then(|| Buf { vec: Vec::new(), map: Some(Mapped { map: Arc::clone(map), off, len }), lent: None })
    }

    /// The elements of a foreign region, read (and, when lent writable, written) in place; the
    /// region back when its bytes are not a whole number of `T` on `T`'s alignment.
    pub fn lent(region: Box<dyn Region>) -> Result<Buf<T>, Box<dyn Region>> {
        // Device memory has no host bytes to check (and its empty slice no alignment).
        if region.device().is_none() && bytemuck::try_cast_slice::<u8, T>(region.bytes()).is_err() {
            return Err(region);
        }
        Ok(Buf { vec: Vec::new(), map: None, lent: Some(region) })
    }

    /// True when the elements are read from a file mapping.
    pub fn is_mapped(&self) -> bool {
        self.map.is_some()
    }

    /// True when the elements are a foreign region's.
    pub fn is_lent(&self) -> bool {
        self.lent.is_some()
    }

    /// The foreign region, when the elements are one's.
    pub fn region(&self) -> Option<&dyn Region> {
        self.lent.as_deref()
    }

    /// The elements of a region lent writable, in place (`None` for any other buffer): where a
    /// kernel writes an output the caller handed in.
    pub fn lent_mut(&mut self) -> Option<&mut [T]> {
        let bytes = self.lent.as_mut()?.bytes_mut()?;
        bytemuck::try_cast_slice_mut(bytes).ok()
    }

    /// An owned copy whose memory asks Linux for transparent huge pages (`madvise`) before it
    /// is first written: kernels that stream a weight then take one TLB entry per 2 MiB, not
    /// per 4 KiB (measured on a 125M f32 model read from huge pages instead of the mapped
    /// file: decode 3-10% faster, prefill 15-20%).
    pub fn resident(&self) -> Buf<T> {
        let src: &[T] = self;
        // A zeroed allocation (calloc: fresh, untouched pages for a large buffer), so the
        // advice comes before the first write; `vec![x; n]` writes every element first for
        // element types it does not know to be zero (bf16).
        let Ok(mut v) = bytemuck::allocation::try_zeroed_vec::<T>(src.len()) else {
            return Buf::from(src.to_vec());
        };
        advise_huge(&v);
        // Piece by piece, each piece of a mapping released once copied: a model's load then
        // holds its weights once plus one piece, not the whole file twice (the 125M f32
        // model peaked at 982 MB against 516 MB once loaded when the map stayed resident).
        let per = (RELEASE_CHUNK / size_of::<T>().max(1)).max(1);
        for (i, (dst, piece)) in v.chunks_mut(per).zip(src.chunks(per)).enumerate() {
            dst.copy_from_slice(piece);
            if let Some(m) = &self.map {
                m.release(i * per * size_of::<T>(), size_of_val(piece));
            }
        }
        Buf::from(v)
    }

    /// Gives a mapped buffer's pages back (`MADV_DONTNEED`, see `Mapped::release`) once its
    /// values were read into another form (weights quantized at load): a later read faults
    /// the file's unchanged bytes in again. Nothing for owned or lent memory.
    pub fn release_mapped(&self) {
        if let Some(m) = &self.map {
            m.release(0, m.len * size_of::<T>());
        }
    }

    /// The elements as a `Vec` (a copy when mapped or lent).
    pub fn into_vec(self) -> Vec<T> {
        if self.map.is_some() || self.lent.is_some() {
            return self.to_vec();
        }
        self.vec
    }

    /// The owned `Vec` (to grow or shrink in place), copying a mapped or lent buffer into one
    /// first (the lender's memory is then no longer written).
    pub fn vec_mut(&mut self) -> &mut Vec<T> {
        if let Some(m) = self.map.take() {
            self.vec = m.slice().to_vec();
        }
        if let Some(r) = self.lent.take() {
            self.vec = lent_slice::<T>(r.as_ref()).to_vec();
        }
        &mut self.vec
    }
}

/// A region's bytes as `T` (checked whole and aligned when the buffer was made).
fn lent_slice<T: Pod>(region: &dyn Region) -> &[T] {
    // Whole and aligned, checked when the buffer was made; device memory reads as empty.
    bytemuck::try_cast_slice(region.bytes()).unwrap_or_default()
}

impl<T: Pod> Deref for Buf<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        match (&self.map, &self.lent) {
            (Some(m), _) => m.slice(),
            (None, Some(r)) => lent_slice(r.as_ref()),
            (None, None) => &self.vec,
        }
    }
}

impl<T: Pod> DerefMut for Buf<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        if self.lent.as_mut().is_some_and(|r| r.bytes_mut().is_some()) {
            // Whole and aligned: checked when the buffer was made.
            return self.lent_mut().unwrap_or_default();
        }
        self.vec_mut()
    }
}

impl<T> From<Vec<T>> for Buf<T> {
    fn from(vec: Vec<T>) -> Buf<T> {
        Buf { vec, map: None, lent: None }
    }
}

impl<T> Default for Buf<T> {
    fn default() -> Buf<T> {
        Buf { vec: Vec::new(), map: None, lent: None }
    }
}

impl<T> FromIterator<T> for Buf<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Buf<T> {
        Buf::from(iter.into_iter().collect::<Vec<T>>())
    }
}

impl<T: Send> rayon::iter::FromParallelIterator<T> for Buf<T> {
    fn from_par_iter<I: rayon::iter::IntoParallelIterator<Item = T>>(iter: I) -> Buf<T> {
        Buf::from(Vec::from_par_iter(iter))
    }
}

/// A clone of a lent buffer is an owned copy: the lender lent its memory to one tensor.
impl<T: Pod> Clone for Buf<T> {
    fn clone(&self) -> Buf<T> {
        match &self.lent {
            Some(r) => Buf::from(lent_slice::<T>(r.as_ref()).to_vec()),
            None => Buf { vec: self.vec.clone(), map: self.map.clone(), lent: None },
        }
    }
}

impl<T: Pod + PartialEq> PartialEq for Buf<T> {
    fn eq(&self, other: &Buf<T>) -> bool {
        self[..] == other[..]
    }
}

impl<T: Pod + fmt::Debug> fmt::Debug for Buf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self[..], f)
    }
}

/// Asks for transparent huge pages over the whole 4 KiB pages of `v`'s buffer (Linux, where
/// THP is in `madvise` mode; elsewhere, and for buffers under 4 MiB, nothing). Call it before
/// the buffer is first written: pages already touched stay as they are.
pub fn advise_huge<T>(v: &[T]) {
    const MIN_BYTES: usize = 4 << 20;
    let bytes = size_of_val(v);
    if bytes < MIN_BYTES {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        const MADV_HUGEPAGE: i32 = 14;
        #[allow(unsafe_code)]
        // SAFETY: the C library's `madvise` (std links it), declared with its signature.
        unsafe extern "C" {
            fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
        }
        let start = (v.as_ptr() as usize).next_multiple_of(PAGE);
        let end = (v.as_ptr() as usize + bytes) & !(PAGE - 1);
        if end > start {
            #[allow(unsafe_code)]
            // SAFETY: the range is whole pages inside `v`'s allocation, which this process
            // owns; MADV_HUGEPAGE only changes how the kernel backs those pages, never their
            // contents, and a failure (THP compiled out) leaves them as they were.
            unsafe {
                madvise(start as *mut std::ffi::c_void, end - start, MADV_HUGEPAGE);
            }
        }
    }
}
