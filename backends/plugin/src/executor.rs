//! A plugin kernel as an executor: LayerZero's tensors handed over as raw descriptors, the
//! outputs allocated by the host when the kernel asks, the status and message carried back.
//! [`invoke`] is the call itself, shared with the worker process (`crate::worker`), which
//! places outputs in shared memory instead of the heap.

use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::Arc;

use layerzero_core::exec::args::OpArgs;
use layerzero_core::exec::executor::{Executor, KernelError};
use layerzero_core::exec::outputs::Outputs;
use layerzero_core::model::dtype::DType;
use layerzero_core::tensor::{HostTensor, Storage};
use layerzero_plugin_abi as abi;

use crate::Plugin;

/// One kernel of a plugin.
pub struct PluginExecutor {
    plugin: Arc<Plugin>,
    id: String,
    entry: abi::KernelFn,
}

impl PluginExecutor {
    /// The kernel `id` (namespaced) of `plugin`, entered at `entry`.
    pub(crate) fn new(plugin: Arc<Plugin>, id: String, entry: abi::KernelFn) -> PluginExecutor {
        PluginExecutor { plugin, id, entry }
    }
}

/// The ABI's code of a dtype.
pub(crate) fn code(d: DType) -> u32 {
    match d {
        DType::F32 => abi::dtype::F32,
        DType::F16 => abi::dtype::F16,
        DType::BF16 => abi::dtype::BF16,
        DType::Fp8E4M3 => abi::dtype::FP8_E4M3,
        DType::Fp8E5M2 => abi::dtype::FP8_E5M2,
        DType::I8 => abi::dtype::I8,
        DType::I32 => abi::dtype::I32,
        DType::I64 => abi::dtype::I64,
        DType::Bool => abi::dtype::BOOL,
    }
}

/// The dtype of an ABI code.
pub(crate) fn dtype_of(c: u32) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| code(d) == c)
}

/// The names outputs may have (`Outputs` keys are static).
pub(crate) const OUTPUT_NAMES: [&str; 7] = ["out", "residual_out", "out_k", "scale", "tokens", "experts", "weights"];

/// The element at `t`'s offset, as the kernel reads it.
fn data_ptr(t: &HostTensor) -> *mut c_void {
    let at = t.offset();
    match t.storage() {
        Storage::F32(b) => b[at..].as_ptr().cast_mut().cast(),
        Storage::F16(b) => b[at..].as_ptr().cast_mut().cast(),
        Storage::BF16(b) => b[at..].as_ptr().cast_mut().cast(),
        Storage::Fp8E4M3(b) | Storage::Fp8E5M2(b) => b[at..].as_ptr().cast_mut().cast(),
        Storage::I8(b) => b[at..].as_ptr().cast_mut().cast(),
        Storage::I32(b) => b[at..].as_ptr().cast_mut().cast(),
        Storage::I64(b) => b[at..].as_ptr().cast_mut().cast(),
        Storage::Bool(b) => b[at..].as_ptr().cast_mut().cast(),
    }
}

/// A fresh buffer's first element (the storage is the caller's until it is wrapped).
pub(crate) fn buffer_ptr(s: &mut Storage) -> *mut c_void {
    match s {
        Storage::F32(b) => b.as_mut_ptr().cast(),
        Storage::F16(b) => b.as_mut_ptr().cast(),
        Storage::BF16(b) => b.as_mut_ptr().cast(),
        Storage::Fp8E4M3(b) | Storage::Fp8E5M2(b) => b.as_mut_ptr().cast(),
        Storage::I8(b) => b.as_mut_ptr().cast(),
        Storage::I32(b) => b.as_mut_ptr().cast(),
        Storage::I64(b) => b.as_mut_ptr().cast(),
        Storage::Bool(b) => b.as_mut_ptr().cast(),
    }
}

/// Where the outputs a kernel asks for are placed.
pub(crate) trait Sink {
    /// A zeroed, writable, contiguous buffer of `bytes` bytes for output `name` (`dtype`,
    /// `dims`), valid until the call returns; or why there is none.
    fn alloc(&mut self, name: &'static str, dtype: DType, dims: &[usize], bytes: usize) -> Result<*mut c_void, String>;
}

/// Outputs on the heap, as [`HostTensor`]s.
#[derive(Default)]
struct Heap {
    outputs: Vec<(&'static str, HostTensor)>,
}

impl Sink for Heap {
    fn alloc(&mut self, name: &'static str, dtype: DType, dims: &[usize], _: usize) -> Result<*mut c_void, String> {
        let n = dims.iter().product();
        let mut storage = Storage::zeros(dtype, n);
        let data = buffer_ptr(&mut storage);
        let tensor = HostTensor::new(storage, dims).map_err(|e| e.to_string())?;
        self.outputs.push((name, tensor));
        Ok(data)
    }
}

/// What the host keeps for one call: the sink, the shape and stride arrays the outputs'
/// descriptors point into, the names given out, and the first allocation error.
struct Call<'a> {
    sink: &'a mut dyn Sink,
    dims: Vec<Box<[i64]>>,
    taken: Vec<&'static str>,
    error: Option<String>,
}

impl Call<'_> {
    fn alloc(&mut self, name: &str, dtype: u32, shape: &[i64]) -> Result<abi::Tensor, String> {
        let name = OUTPUT_NAMES
            .iter()
            .find(|n| **n == name)
            .ok_or_else(|| format!("asked for an output named {name:?}; outputs are named one of {OUTPUT_NAMES:?}"))?;
        if self.taken.contains(name) {
            return Err(format!("asked for output {name:?} twice"));
        }
        let dtype = dtype_of(dtype).ok_or_else(|| format!("output {name:?}: dtype code {dtype} is not in the ABI"))?;
        let dims: Vec<usize> = shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("output {name:?}: negative size in {shape:?}")))
            .collect::<Result<_, _>>()?;
        let bytes = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(elem_bytes(dtype)))
            .filter(|&b| b <= MAX_OUTPUT_BYTES)
            .ok_or_else(|| format!("output {name:?} of shape {shape:?} is larger than {MAX_OUTPUT_BYTES} bytes"))?;
        let data = self.sink.alloc(name, dtype, &dims, bytes)?;
        let strides: Box<[i64]> = layerzero_core::tensor::row_major_strides(&dims).iter().map(|&s| s as i64).collect();
        let shape: Box<[i64]> = shape.into();
        let out = abi::Tensor {
            data,
            dtype: code(dtype),
            device: abi::device::CPU,
            device_index: 0,
            ndim: dims.len() as u32,
            shape: shape.as_ptr(),
            strides: strides.as_ptr(),
        };
        self.dims.push(shape);
        self.dims.push(strides);
        self.taken.push(name);
        Ok(out)
    }
}

/// No single output may exceed this (a kernel asking for more has a bug).
const MAX_OUTPUT_BYTES: usize = 1 << 40;

/// The host's allocator, as the kernel calls it.
#[allow(unsafe_code)]
unsafe extern "C" fn host_alloc(
    host: *mut c_void,
    name: *const c_char,
    dtype: u32,
    ndim: u32,
    shape: *const i64,
    out: *mut abi::Tensor,
) -> i32 {
    // No panic may unwind into the plugin's frames.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if host.is_null() || name.is_null() || out.is_null() || (shape.is_null() && ndim > 0) {
            return abi::status::INVALID_INPUT;
        }
        // SAFETY: `host` is the `Call` that `invoke` passed to this kernel call and outlives
        // it; the kernel calls back on the calling thread (the ABI), so nothing else borrows it.
        let call = unsafe { &mut *host.cast::<Call<'_>>() };
        // SAFETY: the ABI makes `name` NUL-terminated and `shape` `ndim` sizes long.
        let (name, shape) = unsafe {
            let dims = if ndim == 0 { &[][..] } else { std::slice::from_raw_parts(shape, ndim as usize) };
            (CStr::from_ptr(name).to_string_lossy().into_owned(), dims)
        };
        match call.alloc(&name, dtype, shape) {
            Ok(t) => {
                // SAFETY: `out` is the kernel's writable descriptor (checked non-NULL).
                unsafe { out.write(t) };
                abi::status::OK
            }
            Err(e) => {
                call.error.get_or_insert(e);
                abi::status::INVALID_INPUT
            }
        }
    }));
    result.unwrap_or(abi::status::FAILED)
}

/// Calls `entry` on `inputs` with `attrs` (JSON), outputs placed by `sink`. Returns the
/// kernel's status and message (the host's allocation error when the kernel wrote none).
///
/// # Safety
/// `entry` is a kernel of a library that stays loaded during the call, and every
/// descriptor of `inputs` points at live memory of its dtype, shape and strides.
#[allow(unsafe_code)]
pub(crate) unsafe fn invoke(
    entry: abi::KernelFn,
    inputs: &[abi::Arg],
    attrs: &CStr,
    sink: &mut dyn Sink,
) -> (i32, String) {
    let mut call = Call { sink, dims: Vec::new(), taken: Vec::new(), error: None };
    let mut error = vec![0u8; 1024];
    // SAFETY: the caller's contract covers `entry` and the inputs; every other pointer (the
    // attrs, the `Call`, the error buffer of `error.len()` bytes) lives until the call
    // returns, and the kernel writes only buffers `host_alloc` gave it.
    let status = unsafe {
        entry(
            inputs.as_ptr(),
            inputs.len(),
            attrs.as_ptr(),
            (&raw mut call).cast(),
            host_alloc,
            error.as_mut_ptr().cast(),
            error.len(),
        )
    };
    // The kernel's message, cut at the buffer's end if it wrote no NUL.
    let last = error.len() - 1;
    error[last] = 0;
    let text = CStr::from_bytes_until_nul(&error).map_or_else(|_| String::new(), |c| c.to_string_lossy().into_owned());
    let text = if text.is_empty() { call.error.unwrap_or_default() } else { text };
    (status, text)
}

/// `status` and `text` of kernel `id` as the runtime's error (`None`: it succeeded).
pub(crate) fn kernel_error(id: &str, status: i32, text: &str) -> Option<KernelError> {
    let message = || format!("{id} returned status {status}: {text}");
    match status {
        abi::status::OK => None,
        abi::status::INVALID_INPUT => Some(KernelError::InvalidInput(message())),
        _ => Some(KernelError::Failed(message())),
    }
}

/// The attributes of `args` as the NUL-terminated JSON the ABI hands over.
pub(crate) fn attrs_json(args: &OpArgs) -> Result<CString, KernelError> {
    let attrs = serde_json::to_string(&args.attrs()).map_err(|e| KernelError::InvalidInput(e.to_string()))?;
    CString::new(attrs).map_err(|e| KernelError::InvalidInput(e.to_string()))
}

/// Each tensor's name as a C string, and its shape and strides as the ABI's `i64`s.
pub(crate) type Described = (Vec<CString>, Vec<(Vec<i64>, Vec<i64>)>);

/// The names, shapes and strides of `tensors`, which the descriptors point into.
pub(crate) fn describe(tensors: &[(&str, &HostTensor)]) -> Result<Described, KernelError> {
    let names = tensors
        .iter()
        .map(|(n, _)| CString::new(*n).map_err(|e| KernelError::InvalidInput(e.to_string())))
        .collect::<Result<_, _>>()?;
    let dims = tensors
        .iter()
        .map(|(_, t)| (t.shape().iter().map(|&d| d as i64).collect(), t.strides().iter().map(|&s| s as i64).collect()))
        .collect();
    Ok((names, dims))
}

impl Executor for PluginExecutor {
    #[allow(unsafe_code)]
    fn run(&self, args: &OpArgs) -> Result<Outputs, KernelError> {
        let tensors = args.tensors();
        let (names, dims) = describe(&tensors)?;
        let inputs: Vec<abi::Arg> = tensors
            .iter()
            .zip(&names)
            .zip(&dims)
            .map(|(((_, t), name), (shape, strides))| abi::Arg {
                name: name.as_ptr(),
                tensor: abi::Tensor {
                    data: data_ptr(t),
                    dtype: code(t.dtype()),
                    device: abi::device::CPU,
                    device_index: 0,
                    ndim: t.rank() as u32,
                    shape: shape.as_ptr(),
                    strides: strides.as_ptr(),
                },
            })
            .collect();
        let attrs = attrs_json(args)?;
        let mut heap = Heap::default();
        // SAFETY: the entry point has the ABI's `lz_kernel_fn` signature (the plugin declared
        // it through `lz_plugin_kernel`) and its library is kept loaded by `self.plugin`; the
        // descriptors point into `args`' tensors, `names` and `dims`, all alive until it returns.
        let (status, text) = unsafe { invoke(self.entry, &inputs, &attrs, &mut heap) };
        let _ = self.plugin.library();
        if let Some(e) = kernel_error(&self.id, status, &text) {
            return Err(e);
        }
        let mut out = Outputs::new();
        for (name, t) in heap.outputs {
            out.insert(name, t);
        }
        Ok(out)
    }
}

pub(crate) fn elem_bytes(d: DType) -> usize {
    usize::try_from(d.size_bytes()).unwrap_or(1).max(1)
}
