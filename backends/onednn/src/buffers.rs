//! Tensors as the raw buffers oneDNN reads and writes.

use std::ffi::c_void;

use half::{bf16, f16};

use layerzero_core::exec::executor::KernelError;
use layerzero_core::model::dtype::DType;
use layerzero_core::tensor::{HostTensor, Storage};

/// The first element of a contiguous tensor as a raw pointer; oneDNN only reads inputs.
pub(super) fn input(name: &str, t: &HostTensor) -> Result<*mut c_void, KernelError> {
    if !t.is_contiguous() {
        return Err(KernelError::Unsupported(format!(
            "tensor `{name}` has strides {:?}; oneDNN kernels here take contiguous tensors",
            t.strides()
        )));
    }
    let off = t.offset();
    let p = match t.storage() {
        Storage::F32(v) => v.get(off..).map(|s| s.as_ptr().cast::<c_void>()),
        Storage::BF16(v) => v.get(off..).map(|s| s.as_ptr().cast::<c_void>()),
        Storage::F16(v) => v.get(off..).map(|s| s.as_ptr().cast::<c_void>()),
        Storage::I8(v) => v.get(off..).map(|s| s.as_ptr().cast::<c_void>()),
        _ => None,
    };
    let need = t.numel();
    let have = t.storage().len().saturating_sub(off);
    match p {
        Some(p) if have >= need => Ok(p.cast_mut()),
        _ => Err(KernelError::Unsupported(format!(
            "tensor `{name}` is {} with {have} elements from its offset ({need} needed); oneDNN kernels here take \
             f32, bf16, f16 or i8",
            t.dtype()
        ))),
    }
}

/// A new output of `n` elements of `dtype` and the pointer oneDNN writes through.
pub(super) struct Output {
    storage: Storage,
}

impl Output {
    pub(super) fn new(dtype: DType, n: usize) -> Result<Output, KernelError> {
        let storage = match dtype {
            DType::F32 => Storage::F32(vec![0.0f32; n].into()),
            DType::BF16 => Storage::BF16(vec![bf16::ZERO; n].into()),
            DType::F16 => Storage::F16(vec![f16::ZERO; n].into()),
            d => return Err(KernelError::Unsupported(format!("oneDNN kernels here write f32, bf16 or f16, not {d}"))),
        };
        Ok(Output { storage })
    }

    /// The buffer's first element; valid while `self` lives and is not moved out of.
    pub(super) fn ptr(&mut self) -> *mut c_void {
        match &mut self.storage {
            Storage::F32(v) => v.vec_mut().as_mut_ptr().cast(),
            Storage::BF16(v) => v.vec_mut().as_mut_ptr().cast(),
            Storage::F16(v) => v.vec_mut().as_mut_ptr().cast(),
            _ => std::ptr::null_mut(),
        }
    }

    /// The elements, when they are f32.
    pub(super) fn into_f32(self) -> Option<Vec<f32>> {
        match self.storage {
            Storage::F32(v) => Some(v.into_vec()),
            _ => None,
        }
    }

    pub(super) fn into_tensor(self, shape: &[usize]) -> Result<HostTensor, KernelError> {
        HostTensor::new(self.storage, shape).map_err(|e| KernelError::Failed(e.to_string()))
    }
}

/// A float tensor's values as f32 (scales, shifts, biases oneDNN takes in f32).
pub(super) fn f32_values(name: &str, t: &HostTensor) -> Result<Vec<f32>, KernelError> {
    if !t.dtype().is_float() {
        return Err(KernelError::InvalidInput(format!(
            "tensor `{name}` has dtype {}; expected a float dtype",
            t.dtype()
        )));
    }
    Ok(t.to_f32_vec())
}
