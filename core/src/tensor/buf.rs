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

/// A buffer of `T`: a `Vec`, or `len` elements at byte `off` of a shared read-only map.
///
/// Reading never copies. Borrowing a mapped buffer mutably copies it into an owned `Vec`
/// first (copy on write): the map is read-only and shared by every tensor of the file.
pub struct Buf<T> {
    /// The elements when owned (empty while mapped).
    vec: Vec<T>,
    /// `len` elements at byte `off` of a map, when mapped.
    map: Option<Mapped>,
}

#[derive(Clone)]
struct Mapped {
    map: Arc<Mmap>,
    off: usize,
    len: usize,
}

impl Mapped {
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
        in_place.then(|| Buf { vec: Vec::new(), map: Some(Mapped { map: Arc::clone(map), off, len }) })
    }

    /// True when the elements are read from a file mapping.
    pub fn is_mapped(&self) -> bool {
        self.map.is_some()
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
        v.copy_from_slice(src);
        Buf::from(v)
    }

    /// The elements as a `Vec` (a copy when mapped).
    pub fn into_vec(self) -> Vec<T> {
        match &self.map {
            Some(m) => m.slice().to_vec(),
            None => self.vec,
        }
    }

    /// The owned `Vec` (to grow or shrink in place), copying a mapped buffer into one first.
    pub fn vec_mut(&mut self) -> &mut Vec<T> {
        if let Some(m) = self.map.take() {
            self.vec = m.slice().to_vec();
        }
        &mut self.vec
    }
}

impl<T: Pod> Deref for Buf<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        match &self.map {
            Some(m) => m.slice(),
            None => &self.vec,
        }
    }
}

impl<T: Pod> DerefMut for Buf<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        self.vec_mut()
    }
}

impl<T> From<Vec<T>> for Buf<T> {
    fn from(vec: Vec<T>) -> Buf<T> {
        Buf { vec, map: None }
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

impl<T: Clone> Clone for Buf<T> {
    fn clone(&self) -> Buf<T> {
        Buf { vec: self.vec.clone(), map: self.map.clone() }
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
