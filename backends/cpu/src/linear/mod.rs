//! `linear`, `linear_w8a8` and `linear_int4` of the `cpu` backend.
//!
//! - Prefill (M > `GEMV_MAX_M` rows), AVX-512: a cache-blocked GEMM (`packed`: B packed
//!   per KC x NC block into 32-column panels, A into 12-row panels, a 12 x 32 register tile
//!   from `simd::gemm_tile_packed`, rayon tasks over column blocks).
//! - Prefill elsewhere (and tiny K or N): `matrixmultiply::sgemm` (its "threading" feature,
//!   `MATMUL_NUM_THREADS` threads) with the views' strides passed as they are.
//!   f16/bf16 weights (and int4 weights, dequantized) are converted to f32 panels of up to
//!   `PANEL_ELEMS` elements, one panel at a time, for either GEMM.
//! - Prefill with bf16 x and weight on a CPU with AMX: the `amx` tile GEMM (the
//!   weight packed slab by slab into tile order, f32 sums, rounded once).
//! - Decode (M <= `GEMV_MAX_M`): a GEMV parallel over N (rayon) that reads every weight row
//!   once and dots it with the M activation rows, four rows per load of the weight (NT; f32
//!   and bf16 rows are read in place, bf16 widened in registers; others through one f32
//!   row), or sweeps the [K, N] weight once with axpy per column chunk (NN);
//!   bandwidth-bound on the weight bytes.
//! - `linear_w8a8`: exact i32 dot products (i64 across 64Ki-element chunks, so no K can
//!   overflow) parallel over weight-row chunks, then `(acc * xs) * ws + bias` in f32.
//!
//! Accumulation is f32 (the reference is f64); the output is rounded once to x's dtype.
//! `unsafe` here is the one `matrixmultiply::sgemm` call (preceded by the bounds checks that
//! make it sound) and calls of `#[target_feature]` kernels on CPUs that report the features.

mod amx;
mod gemm;
mod gemv;
mod packed;
mod pairs;
#[cfg(test)]
pub(super) mod tests;
mod view;
mod w8a8;
mod weights;

use std::sync::Arc;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

pub(super) use gemm::{gemm, sgemm};
use gemv::gemv;
pub(super) use gemv::{bf16_pair_columns, chunk_size, dots_mat_row};
pub use pairs::{PackedWeightStats, packed_weight_stats};
pub(super) use pairs::{PairPanels, gemm as pairs_gemm, panels as pair_panels};
pub(super) use view::{F32View, Mat, rows_view};
use w8a8::linear_w8a8;
use weights::Int4W;
pub(super) use weights::Weights;

use super::alloc::{Out, with_scratch};
use super::norm::{Elem, by_dtype};
use super::simd;
use super::wrong_op;
use layerzero_core::exec::args::{Int4Args, LinearArgs, OpArgs, Outputs};
use layerzero_core::exec::executor::{KernelError, Prepares, Registry};
use layerzero_core::model::dtype::DType;
use layerzero_core::model::layout::Layout;
use layerzero_core::tensor::{Dims, HostTensor, Storage};

/// Linear kernel id.
pub(super) const LINEAR: &str = "cpu.linear.fast";
/// W8A8 kernel id.
pub(super) const W8A8: &str = "cpu.linear_w8a8.fast";
/// Int4 kernel id.
pub(super) const INT4: &str = "cpu.linear_int4.fast";

/// Up to this many rows a linear runs as a weight-streaming GEMV (4096 x 4096 f32 on the
/// 2-core VM: 2.8 ms at 2 rows, 3.2 at 4, 6.7 at 8, where the GEMM took 4.5 ms at 16).
pub(super) const GEMV_MAX_M: usize = 4;

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
        Arc::new(|args: &OpArgs| match args {
            OpArgs::LinearW8a8(a) => linear_w8a8(a).map(out),
            other => Err(wrong_op(W8A8, other)),
        }),
    );
    registry.register(
        INT4,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::LinearInt4(a) => linear_int4(a).map(out),
            other => Err(wrong_op(INT4, other)),
        }),
    );
}

/// Packs the weight into pair panels where a prefill of these arguments runs on them.
fn prepare(args: &OpArgs) -> Result<(), KernelError> {
    let OpArgs::Linear(a) = args else { return Err(wrong_op(LINEAR, args)) };
    let mut holder = None;
    let x = rows_view(&a.x, &mut holder)?;
    let b = weight_b("weight", &a.weight, x.cols)?;
    if uses_pairs(&x) && !simd::amx_bf16() {
        pairs::panels(&a.weight, &b.t());
    }
    Ok(())
}

/// True when a prefill with these rows of x runs on bf16 pairs (bf16 x on a CPU whose
/// `vdpbf16ps` outruns its f32 FMAs, [`simd::bf16_pairs_fast`]), given bf16 weights; elsewhere
/// the bf16 operands widen to f32. The linear takes AMX first where it has it.
pub(super) fn uses_pairs(x: &Mat) -> bool {
    matches!(x.st, Storage::BF16(_)) && x.rows > GEMV_MAX_M && x.cs == 1 && simd::bf16_pairs_fast()
}

fn out(t: HostTensor) -> Outputs {
    Outputs::from([("out", t)])
}

pub(super) fn invalid(msg: impl Into<String>) -> KernelError {
    KernelError::InvalidInput(msg.into())
}

/// `x [M, K] . B + bias` in f32, as a contiguous [M, N] vector.
pub(super) fn linear_f32(x: &Mat, w: &Weights, bias: Option<&[f32]>) -> Result<Vec<f32>, KernelError> {
    let (m, n) = (x.rows, w.n());
    let len = m.checked_mul(n).ok_or_else(|| invalid(format!("the output [{m}, {n}] overflows")))?;
    let mut c = super::alloc::huge(vec![0f32; len]);
    linear_f32_into(x, w, bias, &mut c)?;
    Ok(c)
}

/// `x [M, K] . B + bias` in f32 into `c` (`[M, N]`, contiguous, zeros).
pub(super) fn linear_f32_into(x: &Mat, w: &Weights, bias: Option<&[f32]>, c: &mut [f32]) -> Result<(), KernelError> {
    let (m, k, n) = (x.rows, w.k(), w.n());
    if c.is_empty() {
        return Ok(());
    }
    if k == 0 {
        // Nothing to sum; bias below.
    } else if m <= GEMV_MAX_M {
        // bf16 rows of x, read in place, for the bf16 pair-product GEMV.
        let xb = match x.st {
            Storage::BF16(v) if x.cs == 1 && (x.rs == k || m == 1) => {
                v.get(x.off..x.off + m * k).map(|r| -> &[u16] { r.reinterpret_cast() })
            }
            _ => None,
        };
        match x.as_f32().filter(|v| v.is_dense()) {
            Some(v) => gemv(&v.data[v.off..v.off + m * k], xb, m, w, c),
            None => with_scratch(m * k, |xf| {
                x.read_into(xf);
                gemv(xf, xb, m, w, c);
            }),
        }
    } else {
        let owned;
        let xv = match x.as_f32() {
            Some(v) => v,
            None => {
                owned = x.to_f32();
                F32View::dense(&owned, m, k)
            }
        };
        let beta = match bias {
            Some(b) => {
                c.par_chunks_mut(n).for_each(|row| row.copy_from_slice(b));
                1.0
            }
            None => 0.0,
        };
        return gemm(xv, w, beta, c, n);
    }
    if let Some(b) = bias {
        c.par_chunks_mut(n).for_each(|row| row.iter_mut().zip(b).for_each(|(v, b)| *v += b));
    }
    Ok(())
}

/// An f32 result as a contiguous tensor of `dtype` (rounded once).
pub(super) fn to_tensor(dtype: DType, shape: &[usize], v: Vec<f32>) -> Result<HostTensor, KernelError> {
    let storage = match dtype {
        DType::F32 => Storage::F32(v.into()),
        DType::F16 => Storage::F16(v.par_iter().map(|&x| f16::from_f32(x)).collect()),
        DType::BF16 => Storage::BF16(v.par_iter().map(|&x| bf16::from_f32(x)).collect()),
        other => Storage::from_f32(other, &v),
    };
    HostTensor::new(storage, shape).map_err(|e| KernelError::Failed(format!("building the output: {e}")))
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

/// The weight of `linear` as B [K, N] (NT [N, K] transposed, NN as is), checked against K.
pub(super) fn weight_b<'a>(name: &str, w: &'a HostTensor, k: usize) -> Result<Mat<'a>, KernelError> {
    let nn = match w.layout() {
        None | Some(Layout::Nt) => false,
        Some(Layout::Nn) => true,
        Some(other) => {
            return Err(invalid(format!("tensor `{name}` has layout {other}; expected NT ([N, K]) or NN ([K, N])")));
        }
    };
    if w.rank() != 2 {
        let want = if nn { "NN expects rank 2 [K, N]" } else { "NT expects rank 2 [N, K]" };
        return Err(invalid(format!("tensor `{name}` has shape {:?} (rank {}); layout {want}", w.shape(), w.rank())));
    }
    let b = if nn { Mat::of(w) } else { Mat::of(w).t() };
    if b.rows != k {
        return Err(invalid(format!(
            "tensor `{name}` has shape {:?}; its in_features {} must equal x's last dim K = {k}",
            w.shape(),
            b.rows
        )));
    }
    Ok(b)
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
        let out = amx::linear_bf16(&x, &b, bias.as_deref());
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
            Storage::BF16(xv) if uses_pairs(&x) => pairs::panels(&a.weight, &b.t()).map(|p| (p, xv)),
            _ => None,
        };
        let w = Weights::Dense(b);
        by_dtype!(a.x.dtype(), LINEAR, T => {
            let mut out = Out::<T>::take(bufs, "out", len);
            T::produce_par(&mut out.v, |c| match &pairs {
                Some((p, xv)) => {
                    let xv: &[u16] = xv[x.off..].reinterpret_cast();
                    pairs::gemm(xv, x.rs, x.rows, x.cols, p, c);
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
pub(super) fn linear_int4(a: &Int4Args) -> Result<HostTensor, KernelError> {
    // What makes int4 arguments valid (packing, group size, scale shapes) is defined once,
    // by the oracle.
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
    };
    let c = linear_f32(&x, &Weights::Int4(w), bias.as_deref())?;
    to_tensor(a.x.dtype(), &out_shape(&a.x, n), c)
}
