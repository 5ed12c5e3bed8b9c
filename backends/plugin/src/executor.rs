//! A plugin kernel as an executor: LayerZero's tensors handed over as raw descriptors, the
//! outputs allocated by the host when the kernel asks, the status and message carried back.

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
fn dtype_of(c: u32) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| code(d) == c)
}

/// The names outputs may have (`Outputs` keys are static).
const OUTPUT_NAMES: [&str; 7] = ["out", "residual_out", "out_k", "scale", "tokens", "experts", "weights"];

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
fn buffer_ptr(s: &mut Storage) -> *mut c_void {
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

/// What the host keeps for one call: the outputs the kernel asked for (with the shape and
/// stride arrays their descriptors point into), and the first allocation error.
#[derive(Default)]
struct Call {
    outputs: Vec<(&'static str, HostTensor)>,
    dims: Vec<Box<[i64]>>,
    error: Option<String>,
}

impl Call {
    fn alloc(&mut self, name: &str, dtype: u32, shape: &[i64]) -> Result<abi::Tensor, String> {
        let name = OUTPUT_NAMES
            .iter()
            .find(|n| **n == name)
            .ok_or_else(|| format!("asked for an output named {name:?}; outputs are named one of {OUTPUT_NAMES:?}"))?;
        if self.outputs.iter().any(|(n, _)| n == name) {
            return Err(format!("asked for output {name:?} twice"));
        }
        let dtype = dtype_of(dtype).ok_or_else(|| format!("output {name:?}: dtype code {dtype} is not in the ABI"))?;
        let dims: Vec<usize> = shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("output {name:?}: negative size in {shape:?}")))
            .collect::<Result<_, _>>()?;
        let n = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .filter(|&n| n.checked_mul(elem_bytes(dtype)).is_some_and(|b| b <= MAX_OUTPUT_BYTES))
            .ok_or_else(|| format!("output {name:?} of shape {shape:?} is larger than {MAX_OUTPUT_BYTES} bytes"))?;
        let mut storage = Storage::zeros(dtype, n);
        let data = buffer_ptr(&mut storage);
        let tensor = HostTensor::new(storage, &dims).map_err(|e| e.to_string())?;
        let strides: Box<[i64]> = tensor.strides().iter().map(|&s| s as i64).collect();
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
        self.outputs.push((name, tensor));
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
        // SAFETY: `host` is the `Call` that `run` passed to this kernel call and outlives it;
        // the kernel calls back on the calling thread (the ABI), so nothing else borrows it.
        let call = unsafe { &mut *host.cast::<Call>() };
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

impl Executor for PluginExecutor {
    #[allow(unsafe_code)]
    fn run(&self, args: &OpArgs) -> Result<Outputs, KernelError> {
        let tensors = args.tensors();
        let names: Vec<CString> = tensors
            .iter()
            .map(|(n, _)| CString::new(*n).map_err(|e| KernelError::InvalidInput(e.to_string())))
            .collect::<Result<_, _>>()?;
        let dims: Vec<(Vec<i64>, Vec<i64>)> = tensors
            .iter()
            .map(|(_, t)| {
                (t.shape().iter().map(|&d| d as i64).collect(), t.strides().iter().map(|&s| s as i64).collect())
            })
            .collect();
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
        let attrs = serde_json::to_string(&args.attrs()).map_err(|e| KernelError::InvalidInput(e.to_string()))?;
        let attrs = CString::new(attrs).map_err(|e| KernelError::InvalidInput(e.to_string()))?;
        let mut call = Call::default();
        let mut error = vec![0u8; 1024];
        // SAFETY: the entry point has the ABI's `lz_kernel_fn` signature (the plugin declared
        // it through `lz_plugin_kernel`, and its library is kept loaded by `self.plugin`).
        // Every pointer handed over (names, shapes, strides, tensor data, attrs, the `Call`,
        // the error buffer of `error.len()` bytes) lives until the call returns; inputs are
        // read-only by the ABI; the kernel writes only buffers `host_alloc` gave it.
        let status = unsafe {
            (self.entry)(
                inputs.as_ptr(),
                inputs.len(),
                attrs.as_ptr(),
                (&raw mut call).cast(),
                host_alloc,
                error.as_mut_ptr().cast(),
                error.len(),
            )
        };
        let _ = &self.plugin.library;
        // The kernel's message, cut at the buffer's end if it wrote no NUL.
        let last = error.len() - 1;
        error[last] = 0;
        let message = || {
            let text =
                CStr::from_bytes_until_nul(&error).map_or_else(|_| String::new(), |c| c.to_string_lossy().into_owned());
            let text = if text.is_empty() { call.error.clone().unwrap_or_default() } else { text };
            format!("{} returned status {status}: {text}", self.id)
        };
        match status {
            abi::status::OK => {
                let mut out = Outputs::new();
                for (name, t) in call.outputs.drain(..) {
                    out.insert(name, t);
                }
                Ok(out)
            }
            abi::status::INVALID_INPUT => Err(KernelError::InvalidInput(message())),
            _ => Err(KernelError::Failed(message())),
        }
    }
}

fn elem_bytes(d: DType) -> usize {
    usize::try_from(d.size_bytes()).unwrap_or(1).max(1)
}
