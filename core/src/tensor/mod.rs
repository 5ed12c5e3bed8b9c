//! Host tensors: an owned buffer with a dtype, a shape and strides, plus views (permuted
//! and strided) that share the buffer. This is what executors read and write.

mod buf;
pub mod fp8;
pub mod io;
pub mod rng;

pub use buf::{Buf, Region, Residence, advise_huge};

use std::sync::Arc;

use half::{bf16, f16};
use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::tensor::TensorDesc;
use fp8::Fp8;

/// The elements of a tensor, in memory order.
#[derive(Debug, Clone, PartialEq)]
pub enum Storage {
    /// f32.
    F32(Buf<f32>),
    /// f16.
    F16(Buf<f16>),
    /// bf16.
    BF16(Buf<bf16>),
    /// FP8 E4M3 codes.
    Fp8E4M3(Buf<u8>),
    /// FP8 E5M2 codes.
    Fp8E5M2(Buf<u8>),
    /// i8.
    I8(Buf<i8>),
    /// i32.
    I32(Buf<i32>),
    /// i64.
    I64(Buf<i64>),
    /// bool.
    Bool(Vec<bool>),
}

impl Storage {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Storage::F32(v) => v.len(),
            Storage::F16(v) => v.len(),
            Storage::BF16(v) => v.len(),
            Storage::Fp8E4M3(v) | Storage::Fp8E5M2(v) => v.len(),
            Storage::I8(v) => v.len(),
            Storage::I32(v) => v.len(),
            Storage::I64(v) => v.len(),
            Storage::Bool(v) => v.len(),
        }
    }

    /// Elements a view may address: [`len`](Storage::len), or for device memory the
    /// region's size in elements (none of which the host can read).
    pub fn extent(&self) -> usize {
        match self.region().and_then(|r| r.device()) {
            Some((_, bytes)) => bytes / (self.dtype().size_bytes() as usize).max(1),
            None => self.len(),
        }
    }

    /// The device the elements live on, for memory the host cannot read; `None` for host
    /// memory.
    pub fn device(&self) -> Option<crate::model::device::DeviceRef> {
        self.region().and_then(|r| r.device()).map(|(d, _)| d)
    }

    /// True when the elements are read in place from a memory-mapped file.
    pub fn is_mapped(&self) -> bool {
        match self {
            Storage::F32(v) => v.is_mapped(),
            Storage::F16(v) => v.is_mapped(),
            Storage::BF16(v) => v.is_mapped(),
            Storage::Fp8E4M3(v) | Storage::Fp8E5M2(v) => v.is_mapped(),
            Storage::I8(v) => v.is_mapped(),
            Storage::I32(v) => v.is_mapped(),
            Storage::I64(v) => v.is_mapped(),
            Storage::Bool(_) => false,
        }
    }

    /// The elements of a foreign region read (and written, when lent writable) in place, as
    /// `dtype`; an error when the region is not a whole number of aligned elements of `dtype`,
    /// or `dtype` is bool (held as `Vec<bool>`, which no foreign memory is).
    pub fn lent(dtype: DType, region: Box<dyn Region>) -> Result<Storage> {
        fn wrap<T: bytemuck::Pod>(r: Box<dyn Region>, f: impl FnOnce(Buf<T>) -> Storage) -> Result<Storage> {
            let n = r.bytes().len();
            Buf::lent(r).map(f).map_err(|_| {
                Error::invalid(format!("{n} bytes are not a whole number of aligned {}-byte elements", size_of::<T>()))
            })
        }
        match dtype {
            DType::F32 => wrap(region, Storage::F32),
            DType::F16 => wrap(region, Storage::F16),
            DType::BF16 => wrap(region, Storage::BF16),
            DType::Fp8E4M3 => wrap(region, Storage::Fp8E4M3),
            DType::Fp8E5M2 => wrap(region, Storage::Fp8E5M2),
            DType::I8 => wrap(region, Storage::I8),
            DType::I32 => wrap(region, Storage::I32),
            DType::I64 => wrap(region, Storage::I64),
            DType::Bool => Err(Error::invalid("bool tensors are copied, not lent")),
        }
    }

    /// The foreign region the elements are, when they are one's ([`Storage::lent`]).
    pub fn region(&self) -> Option<&dyn Region> {
        match self {
            Storage::F32(v) => v.region(),
            Storage::F16(v) => v.region(),
            Storage::BF16(v) => v.region(),
            Storage::Fp8E4M3(v) | Storage::Fp8E5M2(v) => v.region(),
            Storage::I8(v) => v.region(),
            Storage::I32(v) => v.region(),
            Storage::I64(v) => v.region(),
            Storage::Bool(_) => None,
        }
    }

    /// The elements' bytes in memory order (little-endian hosts: the order torch and
    /// safetensors use); bool as one byte 0 or 1.
    pub fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        use std::borrow::Cow;
        match self {
            Storage::F32(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            Storage::F16(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            Storage::BF16(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            Storage::Fp8E4M3(v) | Storage::Fp8E5M2(v) => Cow::Borrowed(v),
            Storage::I8(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            Storage::I32(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            Storage::I64(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            Storage::Bool(v) => Cow::Owned(v.iter().map(|&b| u8::from(b)).collect()),
        }
    }

    /// True when the elements are a foreign region's ([`Storage::lent`]).
    pub fn is_lent(&self) -> bool {
        match self {
            Storage::F32(v) => v.is_lent(),
            Storage::F16(v) => v.is_lent(),
            Storage::BF16(v) => v.is_lent(),
            Storage::Fp8E4M3(v) | Storage::Fp8E5M2(v) => v.is_lent(),
            Storage::I8(v) => v.is_lent(),
            Storage::I32(v) => v.is_lent(),
            Storage::I64(v) => v.is_lent(),
            Storage::Bool(_) => false,
        }
    }

    /// The same elements, owned, in memory that asks for transparent huge pages (see
    /// [`Buf::resident`]); bool storage is cloned.
    pub fn resident(&self) -> Storage {
        match self {
            Storage::F32(v) => Storage::F32(v.resident()),
            Storage::F16(v) => Storage::F16(v.resident()),
            Storage::BF16(v) => Storage::BF16(v.resident()),
            Storage::Fp8E4M3(v) => Storage::Fp8E4M3(v.resident()),
            Storage::Fp8E5M2(v) => Storage::Fp8E5M2(v.resident()),
            Storage::I8(v) => Storage::I8(v.resident()),
            Storage::I32(v) => Storage::I32(v.resident()),
            Storage::I64(v) => Storage::I64(v.resident()),
            Storage::Bool(v) => Storage::Bool(v.clone()),
        }
    }

    /// A mapped storage's pages given back (see [`Buf::release_mapped`]).
    pub fn release_mapped(&self) {
        match self {
            Storage::F32(v) => v.release_mapped(),
            Storage::F16(v) => v.release_mapped(),
            Storage::BF16(v) => v.release_mapped(),
            Storage::Fp8E4M3(v) => v.release_mapped(),
            Storage::Fp8E5M2(v) => v.release_mapped(),
            Storage::I8(v) => v.release_mapped(),
            Storage::I32(v) => v.release_mapped(),
            Storage::I64(v) => v.release_mapped(),
            Storage::Bool(_) => {}
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::F32(_) => DType::F32,
            Storage::F16(_) => DType::F16,
            Storage::BF16(_) => DType::BF16,
            Storage::Fp8E4M3(_) => DType::Fp8E4M3,
            Storage::Fp8E5M2(_) => DType::Fp8E5M2,
            Storage::I8(_) => DType::I8,
            Storage::I32(_) => DType::I32,
            Storage::I64(_) => DType::I64,
            Storage::Bool(_) => DType::Bool,
        }
    }

    /// Element `i` as f64 (fp8 decoded without scale, bool as 0/1).
    #[inline]
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Storage::F32(v) => f64::from(v[i]),
            Storage::F16(v) => f64::from(v[i].to_f32()),
            Storage::BF16(v) => f64::from(v[i].to_f32()),
            Storage::Fp8E4M3(v) => f64::from(Fp8::E4M3.decode(v[i])),
            Storage::Fp8E5M2(v) => f64::from(Fp8::E5M2.decode(v[i])),
            Storage::I8(v) => f64::from(v[i]),
            Storage::I32(v) => f64::from(v[i]),
            Storage::I64(v) => v[i] as f64,
            Storage::Bool(v) => f64::from(u8::from(v[i])),
        }
    }

    /// Element `i` as f32.
    #[inline]
    pub fn get_f32(&self, i: usize) -> f32 {
        match self {
            Storage::F32(v) => v[i],
            Storage::F16(v) => v[i].to_f32(),
            Storage::BF16(v) => v[i].to_f32(),
            Storage::Fp8E4M3(v) => Fp8::E4M3.decode(v[i]),
            Storage::Fp8E5M2(v) => Fp8::E5M2.decode(v[i]),
            _ => self.get_f64(i) as f32,
        }
    }

    /// Element `i` as i64 (integers; floats truncate, bool 0/1).
    #[inline]
    pub fn get_i64(&self, i: usize) -> i64 {
        match self {
            Storage::I8(v) => i64::from(v[i]),
            Storage::I32(v) => i64::from(v[i]),
            Storage::I64(v) => v[i],
            Storage::Bool(v) => i64::from(v[i]),
            _ => self.get_f64(i) as i64,
        }
    }

    /// `n` zeros of `dtype`.
    pub fn zeros(dtype: DType, n: usize) -> Storage {
        match dtype {
            DType::F32 => Storage::F32(vec![0.0; n].into()),
            DType::F16 => Storage::F16(vec![f16::ZERO; n].into()),
            DType::BF16 => Storage::BF16(vec![bf16::ZERO; n].into()),
            DType::Fp8E4M3 => Storage::Fp8E4M3(vec![0; n].into()),
            DType::Fp8E5M2 => Storage::Fp8E5M2(vec![0; n].into()),
            DType::I8 => Storage::I8(vec![0; n].into()),
            DType::I32 => Storage::I32(vec![0; n].into()),
            DType::I64 => Storage::I64(vec![0; n].into()),
            DType::Bool => Storage::Bool(vec![false; n]),
        }
    }

    /// f32 values converted to `dtype` (round to nearest even; fp8 saturates; ints truncate).
    pub fn from_f32(dtype: DType, values: &[f32]) -> Storage {
        match dtype {
            DType::F32 => Storage::F32(values.to_vec().into()),
            DType::F16 => Storage::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::BF16 => Storage::BF16(values.iter().map(|&x| bf16::from_f32(x)).collect()),
            DType::Fp8E4M3 => Storage::Fp8E4M3(values.iter().map(|&x| Fp8::E4M3.encode(x)).collect()),
            DType::Fp8E5M2 => Storage::Fp8E5M2(values.iter().map(|&x| Fp8::E5M2.encode(x)).collect()),
            DType::I8 => Storage::I8(values.iter().map(|&x| x as i8).collect()),
            DType::I32 => Storage::I32(values.iter().map(|&x| x as i32).collect()),
            DType::I64 => Storage::I64(values.iter().map(|&x| x as i64).collect()),
            DType::Bool => Storage::Bool(values.iter().map(|&x| x != 0.0).collect()),
        }
    }
}

/// Sizes or strides: up to four dims inline, so making a view or cloning a tensor of rank
/// four or less allocates nothing (the decode step makes many).
pub type Dims = SmallVec<[usize; 4]>;

/// A tensor in host memory: shared storage seen through a shape, strides and an offset.
#[derive(Debug, Clone)]
pub struct HostTensor {
    data: Arc<Storage>,
    shape: Dims,
    strides: Dims,
    offset: usize,
    layout: Option<Layout>,
    /// Row-major contiguous (size-1 dims ignored), decided once when the view is made.
    contiguous: bool,
    /// The storage's dtype, read once (the hot path reads it per call).
    dtype: DType,
    /// The device of memory the host cannot read (a CUDA tensor lent by torch); `None` for
    /// host memory. Read once, as the dtype.
    device: Option<crate::model::device::DeviceRef>,
}

/// Row-major strides of `shape`.
pub fn row_major_strides(shape: &[usize]) -> Dims {
    let mut s: Dims = smallvec::smallvec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    s
}

fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

impl HostTensor {
    /// The one constructor every view goes through: contiguity is decided here.
    fn make(data: Arc<Storage>, shape: Dims, strides: Dims, offset: usize, layout: Option<Layout>) -> HostTensor {
        let expected = row_major_strides(&shape);
        let contiguous = strides.len() == shape.len()
            && strides.iter().zip(&expected).zip(&shape).all(|((s, e), &d)| d <= 1 || s == e);
        let dtype = data.dtype();
        let device = data.device();
        HostTensor { data, shape, strides, offset, layout, contiguous, dtype, device }
    }

    /// A contiguous tensor over `storage`; its length must match the shape.
    pub fn new(storage: Storage, shape: &[usize]) -> Result<HostTensor> {
        let n = numel(shape).ok_or_else(|| Error::invalid(format!("shape {shape:?} overflows")))?;
        if n != storage.len() {
            return Err(Error::invalid(format!(
                "shape {shape:?} holds {n} elements but the data has {}",
                storage.len()
            )));
        }
        Ok(HostTensor::make(Arc::new(storage), Dims::from_slice(shape), row_major_strides(shape), 0, None))
    }

    /// A contiguous tensor over shared storage (a buffer handed back to be written again);
    /// its length must match the shape.
    pub fn from_shared(storage: Arc<Storage>, shape: &[usize]) -> Result<HostTensor> {
        let n = numel(shape).ok_or_else(|| Error::invalid(format!("shape {shape:?} overflows")))?;
        if n != storage.len() {
            return Err(Error::invalid(format!(
                "shape {shape:?} holds {n} elements but the data has {}",
                storage.len()
            )));
        }
        Ok(HostTensor::make(storage, Dims::from_slice(shape), row_major_strides(shape), 0, None))
    }

    /// A strided view over `storage` (every element it addresses must exist): how a foreign
    /// tensor's memory, lent as a region, is seen with its own shape and strides.
    pub fn strided(storage: Storage, shape: &[usize], strides: &[usize], offset: usize) -> Result<HostTensor> {
        if storage.device().is_some() {
            let n = storage.extent();
            let whole = HostTensor::make(Arc::new(storage), Dims::from_slice(&[n]), Dims::from_slice(&[1]), 0, None);
            return whole.view(shape, strides, offset);
        }
        let n = storage.len();
        HostTensor::new(storage, &[n])?.view(shape, strides, offset)
    }

    /// The device this tensor's memory is on when the host cannot read it (a CUDA tensor lent
    /// by torch); `None` for host memory, which every kernel reads.
    #[inline]
    pub fn device(&self) -> Option<crate::model::device::DeviceRef> {
        self.device
    }

    /// The shared storage itself: its address is this tensor's identity (caches of derived
    /// forms, such as packed weights, key on it and hold a `Weak`).
    pub fn storage_arc(&self) -> &Arc<Storage> {
        &self.data
    }

    /// The storage, shared (every view of it keeps it alive).
    pub fn into_shared(self) -> Arc<Storage> {
        self.data
    }

    /// A contiguous f32 tensor.
    pub fn from_f32(shape: &[usize], values: Vec<f32>) -> Result<HostTensor> {
        HostTensor::new(Storage::F32(values.into()), shape)
    }

    /// A contiguous tensor of `dtype` from f32 values (converted).
    pub fn from_f32_as(dtype: DType, shape: &[usize], values: &[f32]) -> Result<HostTensor> {
        HostTensor::new(Storage::from_f32(dtype, values), shape)
    }

    /// Zeros.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Result<HostTensor> {
        let n = numel(shape).ok_or_else(|| Error::invalid(format!("shape {shape:?} overflows")))?;
        HostTensor::new(Storage::zeros(dtype, n), shape)
    }

    /// The same tensor with a layout tag.
    pub fn with_layout(mut self, layout: Layout) -> HostTensor {
        self.layout = Some(layout);
        self
    }

    /// Element type.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Sizes.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Offset of element [0, ..., 0] in the storage.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Layout tag.
    pub fn layout(&self) -> Option<Layout> {
        self.layout
    }

    /// The storage (shared with every view).
    pub fn storage(&self) -> &Storage {
        &self.data
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// True when the view is row-major contiguous (size-1 dims ignored).
    #[inline]
    pub fn is_contiguous(&self) -> bool {
        self.contiguous
    }

    /// Storage index of a multi-index (no bounds check beyond debug asserts).
    #[inline]
    pub fn index_of(&self, idx: &[usize]) -> usize {
        debug_assert_eq!(idx.len(), self.shape.len());
        self.offset + idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum::<usize>()
    }

    /// Element at a multi-index as f64.
    #[inline]
    pub fn at(&self, idx: &[usize]) -> f64 {
        self.data.get_f64(self.index_of(idx))
    }

    /// A permuted view: dimension `i` of the result is dimension `dims[i]` of `self`.
    pub fn permute(&self, dims: &[usize]) -> Result<HostTensor> {
        let mut seen = vec![false; self.rank()];
        if dims.len() != self.rank() || dims.iter().any(|&d| d >= self.rank() || std::mem::replace(&mut seen[d], true))
        {
            return Err(Error::invalid(format!("permutation {dims:?} is not one of the {} dims", self.rank())));
        }
        Ok(HostTensor::make(
            self.data.clone(),
            dims.iter().map(|&d| self.shape[d]).collect(),
            dims.iter().map(|&d| self.strides[d]).collect(),
            self.offset,
            None,
        ))
    }

    /// A strided view over the same storage; every element it can address must exist.
    pub fn view(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<HostTensor> {
        if shape.len() != strides.len() {
            return Err(Error::invalid(format!("view shape {shape:?} and strides {strides:?} differ in rank")));
        }
        if shape.contains(&0) {
            return Ok(HostTensor::make(
                self.data.clone(),
                Dims::from_slice(shape),
                Dims::from_slice(strides),
                offset,
                None,
            ));
        }
        let last = shape
            .iter()
            .zip(strides)
            .try_fold(offset, |a, (&d, &s)| (d - 1).checked_mul(s).and_then(|x| a.checked_add(x)));
        match last {
            Some(l) if l < self.data.extent() => Ok(HostTensor::make(
                self.data.clone(),
                Dims::from_slice(shape),
                Dims::from_slice(strides),
                offset,
                None,
            )),
            _ => Err(Error::invalid(format!(
                "view shape {shape:?} strides {strides:?} offset {offset} reaches past the {} stored elements",
                self.data.extent()
            ))),
        }
    }

    /// Visits every element's storage index in row-major logical order.
    pub fn for_each_index(&self, mut f: impl FnMut(usize)) {
        let n = self.numel();
        if n == 0 {
            return;
        }
        let rank = self.rank();
        let mut idx: Dims = smallvec::smallvec![0usize; rank];
        let mut pos = self.offset;
        for _ in 0..n {
            f(pos);
            for d in (0..rank).rev() {
                idx[d] += 1;
                pos += self.strides[d];
                if idx[d] < self.shape[d] {
                    break;
                }
                pos -= self.strides[d] * self.shape[d];
                idx[d] = 0;
            }
        }
    }

    /// Writes `src`'s elements (in logical order) into this tensor's storage from element
    /// `at` on: the in-place write of a buffer the caller owns, such as a KV cache. This
    /// tensor must be a contiguous view at offset 0 whose storage no other tensor shares
    /// (views made for a call must be dropped first), and `src` must have its dtype.
    pub fn write_at(&mut self, at: usize, src: &HostTensor) -> Result<()> {
        let n = src.numel();
        if self.offset != 0 || !self.is_contiguous() {
            return Err(Error::invalid("write_at: the destination must be a contiguous tensor at offset 0".to_owned()));
        }
        if src.dtype() != self.dtype() {
            return Err(Error::invalid(format!(
                "write_at: source dtype {} differs from {}",
                src.dtype(),
                self.dtype()
            )));
        }
        if at.checked_add(n).is_none_or(|end| end > self.numel()) {
            return Err(Error::invalid(format!(
                "write_at: {n} elements at {at} do not fit in {} elements",
                self.numel()
            )));
        }
        let Some(dst) = Arc::get_mut(&mut self.data) else {
            return Err(Error::invalid("write_at: the destination's storage is shared with a live view".to_owned()));
        };
        let mut idx = Vec::with_capacity(if src.is_contiguous() { 0 } else { n });
        if !src.is_contiguous() {
            src.for_each_index(|i| idx.push(i));
        }
        macro_rules! copy {
            ($($v:ident),*) => {
                match (dst, &*src.data) {
                    $( (Storage::$v(d), Storage::$v(s)) => {
                        let d = &mut d[at..at + n];
                        if idx.is_empty() {
                            d.copy_from_slice(&s[src.offset..src.offset + n]);
                        } else {
                            d.iter_mut().zip(&idx).for_each(|(o, &i)| *o = s[i]);
                        }
                    } )*
                    _ => return Err(Error::invalid("write_at: storage and dtype disagree".to_owned())),
                }
            };
        }
        copy!(F32, F16, BF16, Fp8E4M3, Fp8E5M2, I8, I32, I64, Bool);
        Ok(())
    }

    /// The elements in logical order as f32 (fp8 decoded without scale).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        if let (Storage::F32(v), true) = (&*self.data, self.is_contiguous()) {
            return v[self.offset..self.offset + self.numel()].to_vec();
        }
        let mut out = Vec::with_capacity(self.numel());
        self.for_each_index(|i| out.push(self.data.get_f32(i)));
        out
    }

    /// The elements in logical order as f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.numel());
        self.for_each_index(|i| out.push(self.data.get_f64(i)));
        out
    }

    /// The elements in logical order as i64 (index tensors).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.numel());
        self.for_each_index(|i| out.push(self.data.get_i64(i)));
        out
    }

    /// A contiguous copy (same dtype).
    pub fn contiguous(&self) -> HostTensor {
        if self.is_contiguous() && self.offset == 0 && self.data.len() == self.numel() {
            return self.clone();
        }
        let mut idx = Vec::with_capacity(self.numel());
        self.for_each_index(|i| idx.push(i));
        let storage = match &*self.data {
            Storage::F32(v) => Storage::F32(idx.iter().map(|&i| v[i]).collect()),
            Storage::F16(v) => Storage::F16(idx.iter().map(|&i| v[i]).collect()),
            Storage::BF16(v) => Storage::BF16(idx.iter().map(|&i| v[i]).collect()),
            Storage::Fp8E4M3(v) => Storage::Fp8E4M3(idx.iter().map(|&i| v[i]).collect()),
            Storage::Fp8E5M2(v) => Storage::Fp8E5M2(idx.iter().map(|&i| v[i]).collect()),
            Storage::I8(v) => Storage::I8(idx.iter().map(|&i| v[i]).collect()),
            Storage::I32(v) => Storage::I32(idx.iter().map(|&i| v[i]).collect()),
            Storage::I64(v) => Storage::I64(idx.iter().map(|&i| v[i]).collect()),
            Storage::Bool(v) => Storage::Bool(idx.iter().map(|&i| v[i]).collect()),
        };
        HostTensor::make(Arc::new(storage), self.shape.clone(), row_major_strides(&self.shape), 0, self.layout)
    }

    /// The selection-facing description of this tensor (strides only when not contiguous).
    pub fn desc(&self) -> TensorDesc {
        TensorDesc {
            dtype: self.dtype(),
            shape: self.shape.iter().map(|&d| d as u64).collect(),
            layout: self.layout,
            strides: if self.is_contiguous() { None } else { Some(self.strides.iter().map(|&s| s as u64).collect()) },
            device: self.device,
        }
    }

    /// Counts of NaN and infinite elements (floats only).
    pub fn non_finite(&self) -> (usize, usize) {
        if !self.dtype().is_float() {
            return (0, 0);
        }
        let (mut nan, mut inf) = (0, 0);
        self.for_each_index(|i| {
            let v = self.data.get_f32(i);
            if v.is_nan() {
                nan += 1;
            } else if v.is_infinite() {
                inf += 1;
            }
        });
        (nan, inf)
    }
}
