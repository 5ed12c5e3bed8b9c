//! `linear`, `linear_w8a8` and `linear_int4` of the `cpu` backend.
//!
//! - `linear`: `x . W^T` (NT) or `x . W` (NN) on the GEMM driver (`gemm`: prefill GEMM,
//!   decode GEMV, AMX tiles, bf16 pair panels packed once per weight).
//! - `linear_int4`: the same driver, the packed weight (int4, nf4, mxfp4 or nvfp4) dequantized
//!   per row (GEMV) or per panel (GEMM) through a 16-entry table per scale block.
//! - `linear_w8a8`: exact i32 dot products (i64 across 64Ki-element chunks, so no K can
//!   overflow) parallel over weight-row chunks, then `(acc * xs) * ws + bias` in f32.
//!
//! Accumulation is f32 (the reference is f64); the output is rounded once to x's dtype.
//! `unsafe` here is `linear_w8a8`'s calls of `#[target_feature]` kernels on CPUs that report
//! the features.

#[cfg(test)]
pub(super) mod tests;
mod w8a8;

use std::sync::Arc;

use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

#[cfg(test)]
use w8a8::linear_w8a8;
use w8a8::linear_w8a8_into;

use super::alloc::{Out, with_scratch, with_scratch_storage};
use super::gemm::{
    GEMV_MAX_M, Int4W, Mat, QuantX, W4A8_FROM_M, Weights, amx_linear_bf16, gemm_w4a8, linear_f32_into, pair_panels,
    pairs_gemm, rows_view, serves_i8, uses_pairs, w4a8_codes, w4a8_serves, weight_b,
};
use super::pack::read_f32;
use super::rows::{Elem, by_dtype};
use super::simd;
use super::wrong_op;
use layerzero_core::exec::args::{Int4Args, LinearArgs, OpArgs, Outputs};
use layerzero_core::exec::executor::{KernelError, Prepares, Registry, WritesInto};
use layerzero_core::model::dtype::DType;
use layerzero_core::model::w4::ActQuant;
use layerzero_core::tensor::{Dims, HostTensor, Storage};

/// Linear kernel id.
pub(super) const LINEAR: &str = "cpu.linear.fast";
/// W8A8 kernel id.
pub(super) const W8A8: &str = "cpu.linear_w8a8.fast";
/// Int4 kernel id.
pub(super) const INT4: &str = "cpu.linear_int4.fast";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        LINEAR,
        Arc::new(Prepares(
            |args: &OpArgs, bufs: &mut Outputs| match args {
                OpArgs::Linear(a) => linear_into(a, bufs),
                other => Err(wrong_op(LINEAR, other)),
            },
            prepare,
        )),
    );
    registry.register(
        W8A8,
        Arc::new(WritesInto(|args: &OpArgs, bufs: &mut Outputs| match args {
            OpArgs::LinearW8a8(a) => linear_w8a8_into(a, bufs),
            other => Err(wrong_op(W8A8, other)),
        })),
    );
    registry.register(
        INT4,
        Arc::new(WritesInto(|args: &OpArgs, bufs: &mut Outputs| match args {
            OpArgs::LinearInt4(a) => linear_int4_into(a, bufs),
            other => Err(wrong_op(INT4, other)),
        })),
    );
}

/// Packs the weight into pair panels where a prefill of these arguments runs on them.
fn prepare(args: &OpArgs) -> Result<(), KernelError> {
    let OpArgs::Linear(a) = args else { return Err(wrong_op(LINEAR, args)) };
    let mut holder = None;
    let x = rows_view(&a.x, &mut holder)?;
    let b = weight_b("weight", &a.weight, x.cols)?;
    if uses_pairs(&x) && !simd::amx_bf16() {
        pair_panels(&a.weight, &b.t());
    }
    Ok(())
}

pub(super) fn invalid(msg: impl Into<String>) -> KernelError {
    KernelError::InvalidInput(msg.into())
}

// ---------------------------------------------------------------------------------------
// Checks (the same rules as the reference backend's).

/// f32, f16 or bf16; other floats are outside what these kernels declare.
pub(super) fn expect_dense_float(name: &str, t: &HostTensor) -> Result<(), KernelError> {
    match t.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        d if d.is_float() => Err(KernelError::Unsupported(format!(
            "tensor `{name}` has dtype {d}; this kernel computes f32, f16 or bf16"
        ))),
        d => Err(invalid(format!("tensor `{name}` has dtype {d}; expected f32, f16 or bf16"))),
    }
}

fn check_bias(bias: Option<&HostTensor>, n: usize) -> Result<Option<Vec<f32>>, KernelError> {
    let Some(b) = bias else { return Ok(None) };
    check_bias_shape(b, n)?;
    Ok(Some(b.to_f32_vec()))
}

fn check_bias_shape(b: &HostTensor, n: usize) -> Result<(), KernelError> {
    if !b.dtype().is_float() {
        return Err(invalid(format!("tensor `bias` has dtype {}; expected a float dtype", b.dtype())));
    }
    if b.shape() != [n] {
        return Err(invalid(format!("tensor `bias` has shape {:?}; expected [N] = [{n}]", b.shape())));
    }
    Ok(())
}

fn out_shape(x: &HostTensor, n: usize) -> Dims {
    let mut s = Dims::from_slice(&x.shape()[..x.rank() - 1]);
    s.push(n);
    s
}

// ---------------------------------------------------------------------------------------
// Kernels.

/// `linear` into new buffers.
#[cfg(test)]
pub(super) fn linear(a: &LinearArgs) -> Result<HostTensor, KernelError> {
    linear_into(a, &mut Outputs::new())?
        .remove("out")
        .ok_or_else(|| KernelError::Failed("linear produced no output".to_owned()))
}

/// `linear`: `out = x @ W^T + bias` (NT) or `x @ W + bias` (NN), into the caller's `out`
/// where it fits.
pub(super) fn linear_into(a: &LinearArgs, bufs: &mut Outputs) -> Result<Outputs, KernelError> {
    expect_dense_float("x", &a.x)?;
    expect_dense_float("weight", &a.weight)?;
    let mut holder = None;
    let x = rows_view(&a.x, &mut holder)?;
    let b = weight_b("weight", &a.weight, x.cols)?;
    if let Some(bias) = &a.bias {
        check_bias_shape(bias, b.cols)?;
    }
    let shape = out_shape(&a.x, b.cols);
    if x.rows > GEMV_MAX_M
        && x.cols > 0
        && b.cols > 0
        && matches!((x.st, b.st), (Storage::BF16(_), Storage::BF16(_)))
        && simd::amx_bf16()
    {
        let bias = check_bias(a.bias.as_ref(), b.cols)?;
        let out = amx_linear_bf16(&x, &b, bias.as_deref());
        let t = HostTensor::new(Storage::BF16(out.into()), &shape)
            .map_err(|e| KernelError::Failed(format!("building the output: {e}")))?;
        return Ok(Outputs::one("out", t));
    }
    let len = x.rows.checked_mul(b.cols).ok_or_else(|| invalid(format!("the output {shape:?} overflows")))?;
    let n = b.cols;
    with_scratch(if a.bias.is_some() { n } else { 0 }, |bbuf| {
        let bias = a.bias.as_ref().map(|t| super::pack::as_f32(t, bbuf));
        // Prefill of a bf16 model where AMX did not take it (above): bf16 pairs against the
        // weight packed once.
        let pairs = match x.st {
            Storage::BF16(xv) if uses_pairs(&x) => pair_panels(&a.weight, &b.t()).map(|p| (p, xv)),
            _ => None,
        };
        let w = Weights::Dense(b);
        by_dtype!(a.x.dtype(), LINEAR, T => {
            let mut out = Out::<T>::take(bufs, "out", len);
            T::produce_par(&mut out.v, |c| match &pairs {
                Some((p, xv)) => {
                    let xv: &[u16] = xv[x.off..].reinterpret_cast();
                    pairs_gemm(xv, x.rs, x.rows, x.cols, p, c);
                    if let Some(bias) = bias {
                        c.par_chunks_mut(n).for_each(|row| row.iter_mut().zip(bias).for_each(|(v, b)| *v += b));
                    }
                    Ok(())
                }
                None => linear_f32_into(&x, &w, bias, c),
            })?;
            Ok(Outputs::one("out", out.finish(&shape)?))
        })
    })
}

/// `linear_int4`: the packed weight is dequantized per row (GEMV) or per panel (sgemm).
#[cfg(test)]
pub(super) fn linear_int4(a: &Int4Args) -> Result<HostTensor, KernelError> {
    let mut o = linear_int4_into(a, &mut Outputs::new())?;
    o.remove("out").ok_or_else(|| KernelError::Failed("linear_int4 wrote no `out`".to_owned()))
}

/// [`linear_int4`] into the buffers of the previous call where they fit (a decode step's
/// projections allocate nothing once warm).
pub(super) fn linear_int4_into(a: &Int4Args, bufs: &mut Outputs) -> Result<Outputs, KernelError> {
    // What makes int4 arguments valid (packing, group size, scale shapes) is defined once,
    // in the core (`Int4Args::dims`).
    let (_, _, k, n, g) = a.dims()?;
    // A group is unpacked a byte (two values) at a time from byte `group * g / 2`: an odd
    // group would start mid-byte and read its neighbour's values.
    if g % 2 != 0 {
        return Err(invalid(format!("attrs.group_size is {g}; this kernel unpacks groups of an even size")));
    }
    let mut holder = None;
    let x = rows_view(&a.x, &mut holder)?;
    let Storage::I8(bytes) = a.weight.storage() else {
        return Err(invalid(format!("tensor `weight` has dtype {}; expected i8", a.weight.dtype())));
    };
    let bias = check_bias(a.bias.as_ref(), n)?;
    let w = Int4W {
        packed: Mat::of(&a.weight),
        bytes,
        scales: Mat::of(&a.scales),
        zeros: a.zeros.as_ref().map(Mat::of),
        k,
        g,
        format: a.attrs.format,
        global: a.global_scale.as_ref().map_or(1.0, |t| t.to_f32_vec()[0]),
        xq: None,
    };
    let shape = out_shape(&a.x, n);
    let len = x.rows.checked_mul(n).ok_or_else(|| invalid(format!("the output {shape:?} overflows")))?;
    // The output in x's dtype, filled in f32 by one of the paths below.
    let emit = |bufs: &mut Outputs, fill: &dyn Fn(&mut [f32]) -> Result<(), KernelError>| {
        by_dtype!(a.x.dtype(), INT4, T => {
            let mut out = Out::<T>::take(bufs, "out", len);
            T::produce_par(&mut out.v, fill)?;
            Ok(Outputs::one("out", out.finish(&shape)?))
        })
    };
    // From W4A8_FROM_M rows, with AVX-512 VNNI or AVX2: the integer GEMM on x's codes (x
    // rounded on the way); fewer rows take the integer GEMV below.
    if a.attrs.activations == ActQuant::Int8 && x.rows >= W4A8_FROM_M && w4a8_serves(&w) {
        let done = w4a8_codes(&x, g, |xq| {
            emit(bufs, &|c| match gemm_w4a8(xq, &w, bias.as_deref(), c) {
                true => Ok(()),
                false => Err(KernelError::Failed("the int8 x int4 GEMM refused shapes it was chosen for".to_owned())),
            })
        });
        if let Some(r) = done {
            return r;
        }
    }
    let mut run = |x: &Mat, w: Int4W| emit(bufs, &|c| linear_f32_into(x, &Weights::Int4(w), bias.as_deref(), c));
    if a.attrs.activations == ActQuant::F32 {
        return run(&x, w);
    }
    // x rounded to int8 once, here, whatever path the product takes; a decode GEMV also gets
    // the codes back once per call and dots them in integers (the other paths run the f32
    // kernels on the rounded values).
    let rows = x.rows;
    with_scratch_storage(
        rows * k,
        |v| round_rows_int8(&x, g, v),
        |st| {
            let rounded = Mat { st, off: 0, rows, cols: k, rs: k, cs: 1 };
            match st {
                Storage::F32(v) if rows <= GEMV_MAX_M && serves_i8(&w) => {
                    with_scratch(QuantX::words(rows, k, g), |buf: &mut [f32]| {
                        let xq = QuantX::fill(&v[..rows * k], k, g, buf);
                        run(&rounded, Int4W { xq, ..w })
                    })
                }
                _ => run(&rounded, w),
            }
        },
    )
}

/// The rows of x into `out` (`[rows, K]`), each rounded to int8 in blocks of `g` and scaled
/// back (`attrs.activations = int8`; `simd::round_int8`), rows in parallel for a prefill.
fn round_rows_int8(x: &Mat, g: usize, out: &mut [f32]) {
    let k = x.cols;
    if k == 0 || g == 0 {
        return;
    }
    let row = |(r, row): (usize, &mut [f32])| {
        read_f32(x.st, x.at(r, 0), x.cs, row);
        simd::round_int8(row, g);
    };
    if x.rows >= 16 {
        out.par_chunks_mut(k).enumerate().for_each(row);
    } else {
        out.chunks_mut(k).enumerate().for_each(row);
    }
}
