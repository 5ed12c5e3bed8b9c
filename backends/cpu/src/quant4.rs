//! `cpu.dequantize.fast` of packed 4-bit weights (`attrs.format`): each `[N, K/2]` byte row
//! decoded by the same row decoder `linear_int4` streams its weight through (one 16-entry
//! table per scale block, `gemm::Int4W::row`), rows in parallel, in f32, rounded once to
//! `attrs.out_dtype`. Its arguments are checked as the reference checks them
//! (`DequantizeArgs::w4_dims`: the format's scales, or SCALE_LAYOUT_MISMATCH).

use rayon::prelude::*;

use super::gemm::{Int4W, Mat, to_tensor};
use super::pack::invalid;
use layerzero_core::exec::args::DequantizeArgs;
use layerzero_core::exec::executor::KernelError;
use layerzero_core::model::dtype::DType;
use layerzero_core::tensor::{HostTensor, Storage};

/// The `[N, K]` weight of a 4-bit `dequantize` in `out_dtype`.
pub(super) fn dequantize_w4(a: &DequantizeArgs, out_dtype: DType) -> Result<HostTensor, KernelError> {
    let (format, n, k, g) = a.w4_dims()?;
    // A block is unpacked a byte (two values) at a time: an odd one would start mid-byte.
    if !g.is_multiple_of(2) {
        return Err(invalid(format!("block [1, {g}]: this kernel unpacks blocks of an even size")));
    }
    let Storage::I8(bytes) = a.x.storage() else {
        return Err(invalid(format!("tensor `x` has dtype {}; expected i8", a.x.dtype())));
    };
    let w = Int4W {
        packed: Mat::of(&a.x),
        bytes,
        scales: Mat::of(&a.scale),
        zeros: None,
        k,
        g,
        format,
        global: a.global_scale.as_ref().map_or(1.0, |t| t.to_f32_vec()[0]),
        xq: None,
    };
    let mut out = vec![0f32; n * k];
    if k > 0 {
        out.par_chunks_mut(k).enumerate().for_each(|(r, row)| w.row(r, row));
    }
    to_tensor(out_dtype, &[n, k], out)
}
