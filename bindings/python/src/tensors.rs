//! torch tensors as LayerZero tensors and back, without copying: a CPU tensor's memory is lent
//! to the runtime as a [`Region`] (read-only for an input, writable for an output buffer),
//! kept alive by a reference to the tensor; a result that is a view of lent memory goes back
//! as a view of the lender's tensor (`as_strided`), and only memory Rust allocated is copied
//! into a new torch tensor.
//!
//! This is the package's FFI edge: reading a tensor's memory by its address is `unsafe`, each
//! block with its reason.
#![allow(unsafe_code)]

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};

use layerzero::model::device::DeviceRef;
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::tensor::{HostTensor, Region, Storage};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};

use crate::errors::invalid;

/// A tensor's memory lent to the runtime, with the tensor kept alive while it is: a CPU
/// tensor's bytes, or a CUDA tensor's memory, which the host never reads (only executors
/// that take device memory, Python's, get it: as the torch tensor itself).
pub struct Lent {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    /// The tensor whose memory this is (and the element offset of `ptr` in its storage).
    owner: Py<PyAny>,
    /// The device of a GPU tensor's memory; `None` for host memory.
    device: Option<DeviceRef>,
}

// SAFETY: the bytes are a CPU tensor's, which torch lets any thread read (and, for an output
// buffer the caller handed in, write); `owner` keeps the tensor, hence its storage, alive for
// as long as this region exists, and `Py` may be sent and shared across threads.
unsafe impl Send for Lent {}
// SAFETY: as for `Send`: shared access only reads through `bytes`; writing needs `&mut self`.
unsafe impl Sync for Lent {}

impl Lent {
    /// True when this is `t`'s memory lent whole (the buffer a caller handed in).
    pub fn owned_by(&self, t: &Bound<'_, PyAny>) -> bool {
        self.owner.bind(t.py()).is(t)
    }
}

impl Region for Lent {
    fn bytes(&self) -> &[u8] {
        if self.len == 0 || self.device.is_some() {
            return &[];
        }
        // SAFETY: `ptr..ptr + len` is the span of a live CPU tensor's view (computed from its
        // shape and strides by `lend`), kept alive by `owner`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        if !self.writable || self.len == 0 || self.device.is_some() {
            return None;
        }
        // SAFETY: as in `bytes`; the caller handed this tensor in as an output buffer, and the
        // region is borrowed mutably, so no other reference of ours reads it meanwhile.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn device(&self) -> Option<(DeviceRef, usize)> {
        self.device.map(|d| (d, self.len))
    }
}

/// The names outputs go by (`Outputs` keys are static).
const OUTPUT_NAMES: [&str; 7] = ["out", "out_k", "residual_out", "tokens", "scale", "experts", "weights"];

/// The static name of an output, when it is one.
pub fn output_name(name: &str) -> Option<&'static str> {
    OUTPUT_NAMES.iter().copied().find(|n| *n == name)
}

/// LayerZero's dtype of a torch dtype, by its name (`torch.float32`).
pub fn dtype_of(torch: &str) -> Option<DType> {
    Some(match torch.strip_prefix("torch.").unwrap_or(torch) {
        "float32" | "float" => DType::F32,
        "float16" | "half" => DType::F16,
        "bfloat16" => DType::BF16,
        "float8_e4m3fn" => DType::Fp8E4M3,
        "float8_e5m2" => DType::Fp8E5M2,
        "int8" => DType::I8,
        "int32" | "int" => DType::I32,
        "int64" | "long" => DType::I64,
        "bool" => DType::Bool,
        _ => return None,
    })
}

/// torch's name of a LayerZero dtype.
pub fn torch_dtype(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::Fp8E4M3 => "float8_e4m3fn",
        DType::Fp8E5M2 => "float8_e5m2",
        DType::I8 => "int8",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::Bool => "bool",
    }
}

/// The torch dtype objects seen so far, by LayerZero dtype (their addresses): torch's dtypes
/// are singletons that live as long as the interpreter, so a dtype is recognized by address
/// without formatting its name on every call.
static DTYPE_OBJECTS: [AtomicUsize; DType::ALL.len()] = [const { AtomicUsize::new(0) }; DType::ALL.len()];

fn known_dtype(d: &Bound<'_, PyAny>) -> Option<DType> {
    let p = d.as_ptr() as usize;
    DTYPE_OBJECTS.iter().position(|s| s.load(Ordering::Relaxed) == p).map(|i| DType::ALL[i])
}

/// Remembers `d`'s address when it is a `torch.dtype` (immortal; another object with a
/// `dtype` attribute may be freed and its address reused, so it is never remembered).
fn remember_dtype(d: &Bound<'_, PyAny>, dtype: DType) {
    let is_torch = d.get_type().fully_qualified_name().is_ok_and(|n| n == "torch.dtype");
    if let (true, Some(i)) = (is_torch, DType::ALL.iter().position(|x| *x == dtype)) {
        DTYPE_OBJECTS[i].store(d.as_ptr() as usize, Ordering::Relaxed);
    }
}

/// What `lend` reads of a tensor: its dtype, sizes, strides, and whether it is on the CPU.
pub struct Meta {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub cpu: bool,
    pub device: String,
}

/// A tensor's metadata; an error names the argument and what is wrong with it.
pub fn meta(name: &str, t: &Bound<'_, PyAny>) -> PyResult<Meta> {
    let not_tensor = || {
        let ty = t.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        invalid(format!("argument `{name}`: expected a torch.Tensor, got a {ty} (reason INVALID_REQUEST)"))
    };
    let Ok(dtype) = t.getattr(pyo3::intern!(t.py(), "dtype")) else { return Err(not_tensor()) };
    let dtype = match known_dtype(&dtype) {
        Some(d) => d,
        None => {
            let dtype_name = dtype.str()?.to_string();
            let d = dtype_of(&dtype_name).ok_or_else(|| {
                invalid(format!(
                    "argument `{name}`: dtype {dtype_name} is not one LayerZero runs (float32, float16, bfloat16, \
                     float8_e4m3fn, float8_e5m2, int8, int32, int64, bool) (reason DTYPE_UNSUPPORTED)"
                ))
            })?;
            remember_dtype(&dtype, d);
            d
        }
    };
    let shape: Vec<usize> =
        t.getattr(pyo3::intern!(t.py(), "shape")).and_then(|s| s.extract()).map_err(|_| not_tensor())?;
    // A contiguous tensor's strides are row-major (torch leaves size-1 dims' strides free, and
    // they address nothing): asking `is_contiguous()` makes no tuple, `stride()` does.
    let contiguous: bool =
        t.call_method0(pyo3::intern!(t.py(), "is_contiguous")).and_then(|c| c.extract()).unwrap_or(false);
    let strides: Vec<isize> = if contiguous {
        layerzero::tensor::row_major_strides(&shape).iter().map(|&s| s as isize).collect()
    } else {
        t.call_method0(pyo3::intern!(t.py(), "stride")).and_then(|s| s.extract()).map_err(|_| not_tensor())?
    };
    if strides.iter().any(|&s| s < 0) {
        return Err(invalid(format!("argument `{name}`: negative strides {strides:?} (reason STRIDE_UNSUPPORTED)")));
    }
    let cpu: bool = t.getattr(pyo3::intern!(t.py(), "is_cpu")).and_then(|c| c.extract()).unwrap_or(false);
    let device = if cpu { "cpu".to_owned() } else { t.getattr(pyo3::intern!(t.py(), "device"))?.str()?.to_string() };
    Ok(Meta { dtype, shape, strides: strides.into_iter().map(|s| s as usize).collect(), cpu, device })
}

/// The elements a view addresses, from its first to its last (0 when it is empty).
/// (`None` when it overflows: no tensor in memory addresses that much).
fn span(shape: &[usize], strides: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().zip(strides).try_fold(1usize, |a, (&d, &s)| (d - 1).checked_mul(s).and_then(|x| a.checked_add(x)))
}

/// True when `t` is a `torch.Tensor`: its memory is read by the address it reports, which
/// nothing else with a `data_ptr()` can be trusted for.
fn is_torch_tensor(t: &Bound<'_, PyAny>) -> PyResult<bool> {
    static TENSOR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let tensor = TENSOR.import(t.py(), "torch", "Tensor")?;
    t.is_instance(tensor)
}

/// A tensor's memory as a LayerZero tensor with its shape and strides (and `layout`'s tag),
/// lent in place: writable when it is an output buffer. A CPU tensor's bytes are read in place;
/// a CUDA tensor's memory is lent as device memory (never read here; the Python executors get
/// the tensor itself). CPU bool tensors (masks) are copied: LayerZero holds them as `bool`s,
/// which torch's bytes are not guaranteed to be.
pub fn lend(
    name: &str,
    t: &Bound<'_, PyAny>,
    m: &Meta,
    writable: bool,
    layout: Option<Layout>,
) -> PyResult<HostTensor> {
    let device = if m.cpu {
        None
    } else {
        let d: DeviceRef = m.device.parse().map_err(|e| invalid(format!("argument `{name}`: {e}")))?;
        if m.dtype == DType::Bool {
            return Err(invalid(format!(
                "argument `{name}`: a bool tensor on {} is not lent (its values are read on the host); \
                 pass an additive float mask instead",
                m.device
            )));
        }
        Some(d)
    };
    if !is_torch_tensor(t)? {
        let ty = t.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        return Err(invalid(format!(
            "argument `{name}`: a {ty} is described like a tensor, but only a torch.Tensor's memory is read"
        )));
    }
    let ptr: usize = t.call_method0(pyo3::intern!(t.py(), "data_ptr"))?.extract()?;
    let bytes = span(&m.shape, &m.strides).and_then(|n| n.checked_mul(m.dtype.size_bytes() as usize));
    let Some(bytes) = bytes else {
        return Err(invalid(format!("argument `{name}`: shape {:?} with strides {:?} overflows", m.shape, m.strides)));
    };
    let n = bytes / m.dtype.size_bytes().max(1) as usize;
    let tensor = if m.dtype == DType::Bool {
        let owned = if n == 0 {
            Vec::new()
        } else {
            // SAFETY: the `n` bytes from `ptr` are the span of a live CPU bool tensor (one
            // byte per element), read while `t` is borrowed, hence alive.
            let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, n) };
            bytes.iter().map(|&b| b != 0).collect()
        };
        HostTensor::strided(Storage::Bool(owned), &m.shape, &m.strides, 0)
    } else {
        let region = Lent { ptr: ptr as *mut u8, len: bytes, writable, owner: t.clone().unbind(), device };
        Storage::lent(m.dtype, Box::new(region)).and_then(|s| HostTensor::strided(s, &m.shape, &m.strides, 0))
    }
    .map_err(|e| invalid(format!("argument `{name}`: {e}")))?;
    Ok(match layout {
        Some(l) => tensor.with_layout(l),
        None => tensor,
    })
}

/// The torch tensor of `t`: the lender's own tensor (or a view of it) when `t` is lent memory,
/// a new tensor holding a copy when Rust allocated it.
pub fn to_torch<'py>(py: Python<'py>, t: &HostTensor) -> PyResult<Bound<'py, PyAny>> {
    if let Some(lent) = t.storage().region().and_then(|r| r.as_any().downcast_ref::<Lent>()) {
        let owner = lent.owner.bind(py);
        let own_shape: Vec<usize> = owner.getattr("shape")?.extract()?;
        let own_strides: Vec<usize> = owner.call_method0("stride")?.extract()?;
        if t.offset() == 0 && t.shape() == own_shape.as_slice() && t.strides() == own_strides.as_slice() {
            return Ok(owner.clone());
        }
        // A view of the lent memory (a permutation the transforms made): the same view of the
        // lender's tensor, whose offset is counted from its storage.
        let base: usize = owner.call_method0("storage_offset")?.extract()?;
        let args = (PyTuple::new(py, t.shape())?, PyTuple::new(py, t.strides())?, base + t.offset());
        return owner.call_method1("as_strided", args);
    }
    copy_to_torch(py, t)
}

/// A new contiguous torch tensor holding `t`'s values.
fn copy_to_torch<'py>(py: Python<'py>, t: &HostTensor) -> PyResult<Bound<'py, PyAny>> {
    let torch = py.import("torch")?;
    let dtype = torch.getattr(torch_dtype(t.dtype()))?;
    let dense = t.contiguous();
    let bytes = dense.storage().bytes();
    let shape = PyTuple::new(py, t.shape())?;
    if bytes.is_empty() {
        let kw = pyo3::types::PyDict::new(py);
        kw.set_item("dtype", dtype)?;
        return torch.call_method("empty", (shape,), Some(&kw));
    }
    let buffer = pyo3::types::PyByteArray::new(py, &bytes);
    let kw = pyo3::types::PyDict::new(py);
    kw.set_item("dtype", dtype)?;
    torch.call_method("frombuffer", (buffer,), Some(&kw))?.call_method1("reshape", (shape,))
}
