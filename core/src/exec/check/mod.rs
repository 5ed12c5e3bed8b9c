//! The argument checks every kernel of an op shares, beside the typed arguments: what the
//! request checks cannot see (values, strides, one tensor against another), answered with
//! `KernelError::InvalidInput` naming the tensor or attribute and the values. The reference
//! oracle and the fast kernels call the same checks, so neither backend depends on the other.

mod activation;
mod attention;
mod linear;
mod mlp;
mod moe;
mod norm;
mod patch;
mod w4;

pub use activation::check_gated;
pub use linear::{WeightLayout, check_bias, check_row_scale, out_dtype, out_shape, rows_of, weight_dims};
pub use moe::MoeDims;
pub use norm::{LAYER_EPS, RMS_EPS};
pub use patch::Patches;
pub use w4::{W4Scales, packed_dims};

use crate::exec::executor::KernelError;
use crate::model::dtype::DType;
use crate::tensor::HostTensor;

/// An `InvalidInput` error with `message`.
pub fn invalid(message: impl Into<String>) -> KernelError {
    KernelError::InvalidInput(message.into())
}

/// `t` must have rank `rank`.
pub fn expect_rank(name: &str, t: &HostTensor, rank: usize, what: &str) -> Result<(), KernelError> {
    if t.rank() != rank {
        return Err(invalid(format!("tensor `{name}` has shape {:?} (rank {}); expected {what}", t.shape(), t.rank())));
    }
    Ok(())
}

/// `t` must hold floating-point values.
pub fn expect_float(name: &str, t: &HostTensor) -> Result<(), KernelError> {
    if !t.dtype().is_float() {
        return Err(invalid(format!("tensor `{name}` has dtype {}; expected a float dtype", t.dtype())));
    }
    Ok(())
}

/// `t` must be f32, f16 or bf16 (the dtypes these kernels declare).
pub fn expect_dense_float(name: &str, t: &HostTensor) -> Result<(), KernelError> {
    match t.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        d if d.is_float() => Err(KernelError::Unsupported(format!(
            "tensor `{name}` has dtype {d}; this kernel computes f32, f16 or bf16"
        ))),
        d => Err(invalid(format!("tensor `{name}` has dtype {d}; expected f32, f16 or bf16"))),
    }
}
