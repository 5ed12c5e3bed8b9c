//! Reading strided tensors of any float dtype into contiguous f32 rows: the one place where
//! layouts, strides and dtypes are resolved, so the kernels only see packed f32.

use std::borrow::Cow;
use std::sync::OnceLock;

use layerzero_core::exec::executor::KernelError;
use layerzero_core::model::dtype::DType;
use layerzero_core::model::layout::Layout;
use layerzero_core::tensor::fp8::Fp8;
use layerzero_core::tensor::{HostTensor, Storage};

use super::simd;

/// `KernelError::InvalidInput` from a message.
pub(crate) fn invalid(msg: impl Into<String>) -> KernelError {
    KernelError::InvalidInput(msg.into())
}

fn fp8_table(format: Fp8) -> &'static [f32; 256] {
    static E4M3: OnceLock<[f32; 256]> = OnceLock::new();
    static E5M2: OnceLock<[f32; 256]> = OnceLock::new();
    let cell = match format {
        Fp8::E4M3 => &E4M3,
        Fp8::E5M2 => &E5M2,
    };
    cell.get_or_init(|| std::array::from_fn(|c| format.decode(c as u8)))
}

/// Reads `out.len()` elements at storage indices `base + i * stride` as f32 (fp8 decoded).
/// The caller guarantees the indices exist (they come from a validated view).
pub(crate) fn read_f32(st: &Storage, base: usize, stride: usize, out: &mut [f32]) {
    let n = out.len();
    if n == 0 {
        return;
    }
    if stride == 1 {
        let r = base..base + n;
        match st {
            Storage::F32(v) => out.copy_from_slice(&v[r]),
            Storage::BF16(v) => simd::bf16_to_f32(&v[r], out),
            Storage::F16(v) => simd::f16_to_f32(&v[r], out),
            Storage::Fp8E4M3(v) => lut(&v[r], fp8_table(Fp8::E4M3), out),
            Storage::Fp8E5M2(v) => lut(&v[r], fp8_table(Fp8::E5M2), out),
            other => out.iter_mut().enumerate().for_each(|(i, o)| *o = other.get_f32(base + i)),
        }
        return;
    }
    match st {
        Storage::F32(v) => out.iter_mut().enumerate().for_each(|(i, o)| *o = v[base + i * stride]),
        Storage::BF16(v) => out.iter_mut().enumerate().for_each(|(i, o)| *o = v[base + i * stride].to_f32()),
        Storage::F16(v) => out.iter_mut().enumerate().for_each(|(i, o)| *o = v[base + i * stride].to_f32()),
        Storage::Fp8E4M3(v) => {
            let t = fp8_table(Fp8::E4M3);
            out.iter_mut().enumerate().for_each(|(i, o)| *o = t[usize::from(v[base + i * stride])]);
        }
        Storage::Fp8E5M2(v) => {
            let t = fp8_table(Fp8::E5M2);
            out.iter_mut().enumerate().for_each(|(i, o)| *o = t[usize::from(v[base + i * stride])]);
        }
        other => out.iter_mut().enumerate().for_each(|(i, o)| *o = other.get_f32(base + i * stride)),
    }
}

/// Reads `out.len()` elements at `base + i * stride` as bf16 bits (exact for bf16 storage,
/// rounded to nearest even otherwise).
pub(crate) fn read_bf16_bits(st: &Storage, base: usize, stride: usize, out: &mut [u16]) {
    if let Storage::BF16(v) = st {
        if stride == 1 {
            let n = out.len();
            for (o, x) in out.iter_mut().zip(&v[base..base + n]) {
                *o = x.to_bits();
            }
        } else {
            for (i, o) in out.iter_mut().enumerate() {
                *o = v[base + i * stride].to_bits();
            }
        }
        return;
    }
    let mut tmp = vec![0f32; out.len()];
    read_f32(st, base, stride, &mut tmp);
    simd::f32_to_bf16_bits(&tmp, out);
}

fn lut(src: &[u8], table: &[f32; 256], out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(src) {
        *o = table[usize::from(c)];
    }
}

/// A contiguous f32 slice of the storage when the row needs no conversion.
pub(crate) fn f32_row(st: &Storage, base: usize, stride: usize, n: usize) -> Option<&[f32]> {
    match st {
        Storage::F32(v) if stride == 1 || n <= 1 => v.get(base..base + n),
        _ => None,
    }
}

/// A rank-4 attention tensor seen in canonical [B, S, H, D] order (BHSD views permuted).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bshd<'a> {
    /// Storage.
    pub st: &'a Storage,
    /// Offset of element 0.
    pub off: usize,
    /// Sizes (b, s, h, d).
    pub n: [usize; 4],
    /// Strides (b, s, h, d).
    pub s: [usize; 4],
}

impl<'a> Bshd<'a> {
    /// The canonical view of `t` (rank 4, BSHD or BHSD; `name` is used in errors).
    pub(crate) fn new(t: &'a HostTensor, name: &str) -> Result<Bshd<'a>, KernelError> {
        if t.rank() != 4 {
            return Err(invalid(format!("`{name}` must have rank 4 (BSHD or BHSD); its shape is {:?}", t.shape())));
        }
        if !t.dtype().is_float() {
            return Err(invalid(format!("tensor `{name}` has dtype {}; expected a float dtype", t.dtype())));
        }
        let (sh, st) = (t.shape(), t.strides());
        let perm = match t.layout().unwrap_or(Layout::Bshd) {
            Layout::Bshd => [0, 1, 2, 3],
            Layout::Bhsd => [0, 2, 1, 3],
            other => return Err(invalid(format!("`{name}` has layout {other}; expected BSHD or BHSD"))),
        };
        Ok(Bshd { st: t.storage(), off: t.offset(), n: perm.map(|d| sh[d]), s: perm.map(|d| st[d]) })
    }

    /// Storage index of element (b, s, h, 0).
    #[inline]
    pub(crate) fn row(&self, b: usize, s: usize, h: usize) -> usize {
        self.off + b * self.s[0] + s * self.s[1] + h * self.s[2]
    }

    /// Reads row (b, s, h) as f32 into `out` (length D).
    #[inline]
    pub(crate) fn read(&self, b: usize, s: usize, h: usize, out: &mut [f32]) {
        read_f32(self.st, self.row(b, s, h), self.s[3], out);
    }
}

/// The output of a BSHD/BHSD kernel: `storage` holding a contiguous tensor of canonical
/// size `canonical` in `layout`.
pub(crate) fn output(storage: Storage, canonical: [usize; 4], layout: Layout) -> Result<HostTensor, KernelError> {
    let [b, s, h, d] = canonical;
    let shape = match layout {
        Layout::Bhsd => [b, h, s, d],
        _ => [b, s, h, d],
    };
    HostTensor::new(storage, &shape)
        .map(|t| t.with_layout(layout))
        .map_err(|e| KernelError::Failed(format!("building the output: {e}")))
}

/// Index of (b, s, h, 0) in a contiguous output of canonical size `n` and `layout`.
#[inline]
pub(crate) fn out_index(n: [usize; 4], layout: Layout, b: usize, s: usize, h: usize) -> usize {
    let [_, ns, nh, d] = n;
    match layout {
        Layout::Bhsd => ((b * nh + h) * ns + s) * d,
        _ => ((b * ns + s) * nh + h) * d,
    }
}

/// Integer elements of a rank-1 (or any-rank) index tensor, in logical order.
pub(crate) fn ints(t: &HostTensor, name: &str) -> Result<Vec<i64>, KernelError> {
    if !matches!(t.dtype(), DType::I32 | DType::I64) {
        return Err(invalid(format!("`{name}` has dtype {}; expected i32 or i64", t.dtype())));
    }
    Ok(t.to_i64_vec())
}

/// An integer index tensor's elements in logical order, read in place.
#[derive(Debug, Clone, Copy)]
pub(crate) enum IntSlice<'a> {
    /// i32 elements.
    I32(&'a [i32]),
    /// i64 elements.
    I64(&'a [i64]),
}

impl<'a> IntSlice<'a> {
    /// Element `i`.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> i64 {
        match self {
            IntSlice::I32(v) => i64::from(v[i]),
            IntSlice::I64(v) => v[i],
        }
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        match self {
            IntSlice::I32(v) => v.len(),
            IntSlice::I64(v) => v.len(),
        }
    }

    /// Elements `a..b`.
    pub(crate) fn slice(&self, a: usize, b: usize) -> IntSlice<'a> {
        match self {
            IntSlice::I32(v) => IntSlice::I32(&v[a..b]),
            IntSlice::I64(v) => IntSlice::I64(&v[a..b]),
        }
    }
}

/// The elements of an i32 or i64 index tensor in place when it is contiguous (the decode
/// loop's block tables and lengths: read, never copied), else `None` (the caller copies
/// them with [`ints`]).
pub(crate) fn int_slice<'a>(t: &'a HostTensor, name: &str) -> Result<Option<IntSlice<'a>>, KernelError> {
    if !matches!(t.dtype(), DType::I32 | DType::I64) {
        return Err(invalid(format!("`{name}` has dtype {}; expected i32 or i64", t.dtype())));
    }
    let (off, n) = (t.offset(), t.numel());
    Ok(match t.storage() {
        _ if !t.is_contiguous() => None,
        Storage::I32(v) => v.get(off..off + n).map(IntSlice::I32),
        Storage::I64(v) => v.get(off..off + n).map(IntSlice::I64),
        _ => None,
    })
}

/// Float elements of a small tensor as f32, in logical order.
pub(crate) fn floats(t: &HostTensor, name: &str) -> Result<Vec<f32>, KernelError> {
    if !t.dtype().is_float() {
        return Err(invalid(format!("`{name}` has dtype {}; expected a float dtype", t.dtype())));
    }
    Ok(t.to_f32_vec())
}

/// A float tensor's elements in logical order as f32: borrowed when it is a contiguous f32
/// tensor, else read into `buf` (at least as long as the tensor).
pub(crate) fn as_f32<'a>(t: &'a HostTensor, buf: &'a mut [f32]) -> &'a [f32] {
    let n = t.numel();
    if let (Storage::F32(v), true) = (t.storage(), t.is_contiguous())
        && let Some(w) = v.get(t.offset()..t.offset() + n)
    {
        return w;
    }
    match t.strides() {
        // A vector (norm weights, biases): one strided read, widened by the SIMD paths.
        [stride] => read_f32(t.storage(), t.offset(), *stride, &mut buf[..n]),
        _ => {
            let mut i = 0;
            t.for_each_index(|at| {
                buf[i] = t.storage().get_f32(at);
                i += 1;
            });
        }
    }
    &buf[..n]
}

/// The elements of `t` in logical order as f32: borrowed when `t` is contiguous f32.
pub(crate) fn f32_cow(t: &HostTensor) -> Cow<'_, [f32]> {
    let n = t.numel();
    if n == 0 {
        return Cow::Owned(Vec::new());
    }
    if let (Storage::F32(v), true) = (t.storage(), t.is_contiguous())
        && let Some(s) = v.get(t.offset()..t.offset() + n)
    {
        return Cow::Borrowed(s);
    }
    Cow::Owned(t.to_f32_vec())
}
