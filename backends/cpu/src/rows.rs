//! The element-wise/row driver of this backend: a float tensor of any strides read in
//! logical order (`View`), the output element types with their rounding stores (`Elem`,
//! picked by `by_dtype!`), and `fill`, which computes a new output in units of rows on rayon
//! tasks of about `TASK` elements (small outputs on the calling thread). The row kernels
//! (`norm`, `activation`, `embedding`, and the element-wise parts of others) are written on it.

use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;
use half::{bf16, f16};
use rayon::prelude::*;

use layerzero_core::exec::executor::KernelError;
use layerzero_core::tensor::{Buf, Dims, HostTensor, Storage};

use super::alloc::{self, with_scratch};
use super::pack::{invalid, read_f32};
use super::simd;
use super::split::worth_splitting;

/// Elements per rayon task (when the work is split: [`worth_splitting`]).
pub(super) const TASK: usize = 1 << 15;

/// A float tensor of any strides read in logical (row-major) order.
#[derive(Debug, Clone)]
pub(super) struct View<'a> {
    st: &'a Storage,
    off: usize,
    /// Shape (rank 0 is seen as [1]).
    shape: Dims,
    strides: Dims,
    /// Length of the last dim.
    n: usize,
    /// Stride of the last dim.
    last: usize,
    /// Storage distance between consecutive rows when the leading dims collapse to one.
    row_stride: Option<usize>,
}

impl<'a> View<'a> {
    /// The view of `t`.
    pub(super) fn new(t: &'a HostTensor) -> View<'a> {
        View::of(t, t.shape(), t.strides(), t.offset())
    }

    /// A view of `t`'s storage with another shape, strides and offset (the caller keeps
    /// them inside the tensor, e.g. one half of its last dim).
    pub(super) fn of(t: &'a HostTensor, shape: &[usize], strides: &[usize], off: usize) -> View<'a> {
        let (shape, strides) = if shape.is_empty() {
            (Dims::from_slice(&[1]), Dims::from_slice(&[1]))
        } else {
            (Dims::from_slice(shape), Dims::from_slice(strides))
        };
        let r = shape.len();
        let (n, last) = (shape[r - 1], strides[r - 1]);
        // Leading dims collapse when each stride is the next one times its size (size-1
        // dims do not matter).
        let mut row_stride = None;
        let mut ok = true;
        for d in (0..r - 1).rev() {
            if shape[d] <= 1 {
                continue;
            }
            match row_stride {
                None => row_stride = Some((strides[d], shape[d])),
                Some((s, span)) => {
                    if strides[d] != s * span {
                        ok = false;
                    }
                    row_stride = Some((s, span * shape[d]));
                }
            }
        }
        let row_stride = if ok { Some(row_stride.map_or(0, |(s, _)| s)) } else { None };
        View { st: t.storage(), off, shape, strides, n, last, row_stride }
    }

    /// Storage index of element 0 of row `r` (a row is one index of the leading dims).
    #[inline]
    pub(super) fn row_base(&self, r: usize) -> usize {
        if let Some(s) = self.row_stride {
            return self.off + r * s;
        }
        let mut rem = r;
        let mut base = self.off;
        for d in (0..self.shape.len() - 1).rev() {
            base += (rem % self.shape[d]) * self.strides[d];
            rem /= self.shape[d];
        }
        base
    }

    /// Logical elements [start, start + len) as a borrowed f32 slice, when they lie in one
    /// row of an f32 storage with unit stride.
    #[inline]
    pub(super) fn f32_slice(&self, start: usize, len: usize) -> Option<&'a [f32]> {
        self.typed::<f32>(start, len)
    }

    /// Logical elements [start, start + len) as a borrowed slice of `T`, when they lie in
    /// one row of a `T` storage with unit stride.
    #[inline]
    pub(super) fn typed<T: Elem>(&self, start: usize, len: usize) -> Option<&'a [T]> {
        let v = T::slice(self.st)?;
        if self.n == 0 {
            return None;
        }
        let (r, c) = (start / self.n, start % self.n);
        if c + len > self.n || (self.last != 1 && len > 1) {
            return None;
        }
        let b = self.row_base(r) + c * self.last;
        v.get(b..b + len)
    }

    /// Reads logical elements [start, start + out.len()) as f32.
    pub(super) fn read(&self, start: usize, out: &mut [f32]) {
        if self.n == 0 || out.is_empty() {
            return;
        }
        let (mut r, mut c) = (start / self.n, start % self.n);
        let mut pos = 0;
        while pos < out.len() {
            let run = (self.n - c).min(out.len() - pos);
            read_f32(self.st, self.row_base(r) + c * self.last, self.last, &mut out[pos..pos + run]);
            pos += run;
            r += 1;
            c = 0;
        }
    }

    /// Logical elements [start, start + len) as f32: borrowed when possible, else read
    /// into `buf`.
    #[inline]
    pub(super) fn get<'b>(&self, start: usize, buf: &'b mut [f32]) -> &'b [f32]
    where
        'a: 'b,
    {
        match self.f32_slice(start, buf.len()) {
            Some(s) => s,
            None => {
                self.read(start, buf);
                buf
            }
        }
    }
}

/// An element an output buffer holds (the float outputs, and i8 codes): what reusing the
/// caller's buffer (`alloc::Out`) needs.
pub(super) trait Slot: bytemuck::Pod + Send + Sync + 'static {
    /// Zero.
    const ZERO: Self;
    /// `n` zeros (calloc-backed: the pages are first touched by the kernel's writes; huge
    /// pages requested for large outputs, see `alloc`).
    fn zeros(n: usize) -> Vec<Self>;
    /// The storage of this buffer.
    fn storage_of(b: Buf<Self>) -> Storage;
    /// The buffer of `st`, when it holds this type.
    fn buf_mut(st: &mut Storage) -> Option<&mut Buf<Self>>;
}

/// An output element type (f32, f16, bf16).
pub(super) trait Elem: Slot {
    /// `dst[i] = src[i]` rounded to nearest even.
    fn store(src: &[f32], dst: &mut [Self]);
    /// Runs `f` on an f32 image of `dst` (zeros) and stores it, in parallel when it is
    /// large (in place for f32; through this thread's scratch otherwise).
    #[inline]
    fn produce_par<E>(dst: &mut [Self], f: impl FnOnce(&mut [f32]) -> Result<(), E>) -> Result<(), E> {
        with_scratch(dst.len(), |img| {
            img.fill(0.0);
            f(img)?;
            if !worth_splitting(dst.len() * (4 + std::mem::size_of::<Self>())) {
                Self::store(img, dst);
            } else {
                dst.par_chunks_mut(TASK).zip(img.par_chunks(TASK)).for_each(|(d, s)| Self::store(s, d));
            }
            Ok(())
        })
    }
    /// Runs `f` on an f32 image of `dst` and stores it (in place for f32).
    #[inline]
    fn produce(dst: &mut [Self], scratch: &mut Vec<f32>, f: impl FnOnce(&mut [f32])) {
        scratch.clear();
        scratch.resize(dst.len(), 0.0);
        f(scratch);
        Self::store(scratch, dst);
    }
    /// `dst[i] = ((x[i] - hi) - lo) * inv * w[i] (+ b[i])` with `(hi, lo, inv) = n`, rounded
    /// once; `finite` says that no input is NaN.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn store_norm(
        x: Src<'_>,
        n: simd::Norm,
        w: &[f32],
        b: Option<&[f32]>,
        finite: bool,
        dst: &mut [Self],
        scratch: &mut Vec<f32>,
    ) {
        let _ = finite;
        Self::produce(dst, scratch, |d| match x {
            Src::F32(x) => simd::affine_f32_f32(x, n, w, b, d),
            Src::Bf16(x) => simd::affine_bf16_f32(x, n, w, b, d),
        });
    }
    /// The storage of these values.
    fn storage(v: Vec<Self>) -> Storage {
        Self::storage_of(Buf::from(v))
    }
    /// The typed elements of `st`, when it holds this type.
    fn slice(st: &Storage) -> Option<&[Self]>;
}

impl Slot for f32 {
    const ZERO: f32 = 0.0;
    fn zeros(n: usize) -> Vec<f32> {
        alloc::huge(vec![0.0; n])
    }
    fn storage_of(b: Buf<f32>) -> Storage {
        Storage::F32(b)
    }
    fn buf_mut(st: &mut Storage) -> Option<&mut Buf<f32>> {
        if let Storage::F32(v) = st { Some(v) } else { None }
    }
}

impl Elem for f32 {
    #[inline]
    fn store(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline]
    fn produce(dst: &mut [f32], _scratch: &mut Vec<f32>, f: impl FnOnce(&mut [f32])) {
        f(dst);
    }
    #[inline]
    fn produce_par<E>(dst: &mut [f32], f: impl FnOnce(&mut [f32]) -> Result<(), E>) -> Result<(), E> {
        f(dst)
    }
    fn slice(st: &Storage) -> Option<&[f32]> {
        if let Storage::F32(v) = st { Some(v) } else { None }
    }
}

impl Slot for f16 {
    const ZERO: f16 = f16::ZERO;
    fn zeros(n: usize) -> Vec<f16> {
        alloc::huge(vec![0u16; n]).reinterpret_into()
    }
    fn storage_of(b: Buf<f16>) -> Storage {
        Storage::F16(b)
    }
    fn buf_mut(st: &mut Storage) -> Option<&mut Buf<f16>> {
        if let Storage::F16(v) = st { Some(v) } else { None }
    }
}

impl Elem for f16 {
    #[inline]
    fn store(src: &[f32], dst: &mut [f16]) {
        // half converts 8 at a time with F16C when the CPU has it (detected at run time).
        dst.convert_from_f32_slice(src);
    }
    fn slice(st: &Storage) -> Option<&[f16]> {
        if let Storage::F16(v) = st { Some(v) } else { None }
    }
}

impl Slot for bf16 {
    const ZERO: bf16 = bf16::ZERO;
    fn zeros(n: usize) -> Vec<bf16> {
        alloc::huge(vec![0u16; n]).reinterpret_into()
    }
    fn storage_of(b: Buf<bf16>) -> Storage {
        Storage::BF16(b)
    }
    fn buf_mut(st: &mut Storage) -> Option<&mut Buf<bf16>> {
        if let Storage::BF16(v) = st { Some(v) } else { None }
    }
}

impl Elem for bf16 {
    #[inline]
    fn store(src: &[f32], dst: &mut [bf16]) {
        simd::f32_to_bf16_bits(src, dst.reinterpret_cast_mut());
    }
    #[inline]
    fn store_norm(
        x: Src<'_>,
        n: simd::Norm,
        w: &[f32],
        b: Option<&[f32]>,
        finite: bool,
        dst: &mut [bf16],
        _: &mut Vec<f32>,
    ) {
        // Fused: one pass from the row to the bf16 output.
        match x {
            Src::F32(x) => simd::affine_f32_bf16(x, n, w, b, dst, finite),
            Src::Bf16(x) => simd::affine_bf16_bf16(x, n, w, b, dst, finite),
        }
    }
    fn slice(st: &Storage) -> Option<&[bf16]> {
        if let Storage::BF16(v) = st { Some(v) } else { None }
    }
}

impl Slot for i8 {
    const ZERO: i8 = 0;
    fn zeros(n: usize) -> Vec<i8> {
        vec![0; n]
    }
    fn storage_of(b: Buf<i8>) -> Storage {
        Storage::I8(b)
    }
    fn buf_mut(st: &mut Storage) -> Option<&mut Buf<i8>> {
        if let Storage::I8(v) = st { Some(v) } else { None }
    }
}

/// Runs `$body` with `$t` bound to the element type of `$dtype` (f32, f16, bf16); any other
/// dtype is `Unsupported` by `$kernel`.
macro_rules! by_dtype {
    ($dtype:expr, $kernel:expr, $t:ident => $body:expr) => {
        match $dtype {
            ::layerzero_core::model::dtype::DType::F32 => {
                type $t = f32;
                $body
            }
            ::layerzero_core::model::dtype::DType::F16 => {
                type $t = half::f16;
                $body
            }
            ::layerzero_core::model::dtype::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            other => Err(::layerzero_core::exec::executor::KernelError::Unsupported(format!(
                "{} computes f32, f16 and bf16; it was given {other}",
                $kernel
            ))),
        }
    };
}
pub(super) use by_dtype;

/// A new output of `total` elements: `f(start, dst, scratch)` computes the logical elements
/// [start, start + dst.len()) in f32 for units of `unit` elements (the last may be shorter),
/// on rayon tasks of about `TASK` elements when the output is large; `scratch` is a buffer
/// of the task that `f` may use as it likes.
pub(super) fn fill<T: Elem>(total: usize, unit: usize, f: impl Fn(usize, &mut [f32], &mut Vec<f32>) + Sync) -> Vec<T> {
    fill_typed::<T>(total, unit, |start, dst, conv, scratch| T::produce(dst, conv, |d| f(start, d, scratch)))
}

/// As `fill`, with `f(start, dst, scratch_a, scratch_b)` writing the output type itself.
pub(super) fn fill_typed<T: Elem>(
    total: usize,
    unit: usize,
    f: impl Fn(usize, &mut [T], &mut Vec<f32>, &mut Vec<f32>) + Sync,
) -> Vec<T> {
    let mut out = T::zeros(total);
    fill_into(&mut out, unit, f);
    out
}

/// As `fill_typed`, writing `out` (the caller's buffer).
pub(super) fn fill_into<T: Elem>(
    out: &mut [T],
    unit: usize,
    f: impl Fn(usize, &mut [T], &mut Vec<f32>, &mut Vec<f32>) + Sync,
) {
    let total = out.len();
    if total == 0 {
        return;
    }
    let unit = unit.max(1);
    let per_task = (TASK / unit).max(1) * unit;
    let work = |(ti, blk): (usize, &mut [T])| {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for (ui, dst) in blk.chunks_mut(unit).enumerate() {
            f(ti * per_task + ui * unit, dst, &mut a, &mut b);
        }
    };
    // Read and written: about as many elements of T each.
    if !worth_splitting(2 * total * std::mem::size_of::<T>()) {
        out.chunks_mut(per_task).enumerate().for_each(work);
    } else {
        out.par_chunks_mut(per_task).enumerate().for_each(work);
    }
}

/// A contiguous output tensor.
pub(super) fn tensor<T: Elem>(v: Vec<T>, shape: &[usize]) -> Result<HostTensor, KernelError> {
    HostTensor::new(T::storage(v), shape).map_err(|e| KernelError::Failed(format!("building the output: {e}")))
}

/// `t` must hold floats.
pub(super) fn expect_float(name: &str, t: &HostTensor) -> Result<(), KernelError> {
    if !t.dtype().is_float() {
        return Err(invalid(format!("tensor `{name}` has dtype {}; expected a float dtype", t.dtype())));
    }
    Ok(())
}

/// All elements of a (small) float tensor as f32.
pub(super) fn all_f32(t: &HostTensor) -> Vec<f32> {
    let v = View::new(t);
    let mut out = vec![0f32; t.numel()];
    v.read(0, &mut out);
    out
}

/// A row of `x` as the norms read it: borrowed f32 or bf16 elements, or (other dtypes and
/// strided rows) f32 values read into a buffer.
#[derive(Clone, Copy)]
pub(super) enum Src<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// bf16 values.
    Bf16(&'a [bf16]),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half() {
        let mut bits: Vec<u32> = (0..200_000u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        bits.extend([0, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 0x7f80_0001, 0xff80_0001, 0x7f7f_ffff]);
        bits.extend([0x3f80_8000, 0x3f81_8000, 0x0000_8000, 0x0001_8000, 0xff7f_ffff, 0x7f7f_8000]);
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let mut ours = vec![bf16::ZERO; src.len()];
        <bf16 as Elem>::store(&src, &mut ours);
        let mut f16s = vec![f16::ZERO; src.len()];
        <f16 as Elem>::store(&src, &mut f16s);
        for (i, &x) in src.iter().enumerate() {
            let want = bf16::from_f32(x);
            assert!(ours[i].to_bits() == want.to_bits() || (x.is_nan() && ours[i].is_nan()), "{:#x}", bits[i]);
            assert!(f16s[i].to_bits() == f16::from_f32(x).to_bits() || (x.is_nan() && f16s[i].is_nan()));
            if !x.is_nan() {
                assert_eq!(simd::bf16_bits_finite(x), want.to_bits(), "{:#x}", bits[i]);
            }
        }
    }
}
