//! The elements behind a [`Storage`](super::Storage): owned, or read in place from a
//! memory-mapped file (a model's weights are not copied at load when their dtype is the
//! compute dtype).

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use bytemuck::Pod;
use memmap2::Mmap;

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
