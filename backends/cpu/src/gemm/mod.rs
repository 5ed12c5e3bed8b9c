//! The GEMM driver of this backend: `x [M, K] . B [K, N]` in f32 for any weight B (f32,
//! f16 or bf16 of any strides, or int4 dequantized on the fly), and the strided 2-D views
//! it reads. The linear, MLP, quantization and patch-embedding kernels are written on it.
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
//! - Prefill with bf16 x and weight elsewhere, where `vdpbf16ps` outruns f32 FMAs: the
//!   `pairs` GEMM (the weight packed once into bf16 pair panels, kept in a cache).
//! - Prefill of int4 weights with x rounded to int8 (`attrs.activations = int8`) with
//!   AVX-512 VNNI or AVX2: the integer GEMM of `w4a8` (x's codes and the weight's codes packed
//!   once per call, `vpdpbusd` tiles, block scales in f32).
//! - Decode (M <= `GEMV_MAX_M`): a GEMV parallel over N (rayon) that reads every weight row
//!   once and dots it with the M activation rows, four rows per load of the weight (NT; f32
//!   and bf16 rows are read in place, bf16 widened in registers; others through one f32
//!   row), or sweeps the [K, N] weight once with axpy per column chunk (NN);
//!   bandwidth-bound on the weight bytes.
//!
//! Accumulation is f32. `unsafe` here is the one `matrixmultiply::sgemm` call (preceded by
//! the bounds checks that make it sound) and calls of `#[target_feature]` kernels on CPUs
//! that report the features.

mod amx;
mod gemv;
mod gemv_int4;
mod packed;
mod pairs;
mod prefill;
mod small;
mod view;
mod w4a8;
mod weights;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

pub(super) use amx::linear_bf16 as amx_linear_bf16;
use gemv::gemv;
pub(super) use gemv::{bf16_pair_columns, chunk_size, chunks, dots_mat_row};
pub(super) use gemv_int4::{QuantX, serves_i8};
#[cfg(test)] // the packed GEMM itself, held to f64 sums by the linear tests
pub(super) use packed::{BSrc, gemm as packed_gemm};
pub use pairs::{PackedWeightStats, packed_weight_stats};
pub(super) use pairs::{PairPanels, gemm as pairs_gemm, panels as pair_panels};
pub(super) use prefill::{gemm, sgemm};
pub(super) use small::{small_m, small_m_applies, small_m_max};
pub(super) use view::{F32View, Mat, rows_view};
pub(super) use w4a8::{W4A8_FROM_M, gemm as gemm_w4a8, serves as w4a8_serves, with_codes as w4a8_codes};
pub(super) use weights::{Int4W, Weights};

use super::alloc::with_scratch;
use super::pack::invalid;
use super::simd;
use layerzero_core::exec::executor::KernelError;
use layerzero_core::model::dtype::DType;
use layerzero_core::model::layout::Layout;
use layerzero_core::tensor::{HostTensor, Storage};

/// Up to this many rows a linear runs as a weight-streaming GEMV (4096 x 4096 f32 on the
/// 2-core VM: 2.8 ms at 2 rows, 3.2 at 4, 6.7 at 8, where the GEMM took 4.5 ms at 16).
pub(super) const GEMV_MAX_M: usize = 4;

/// True when a prefill with these rows of x runs on bf16 pairs (bf16 x on a CPU whose
/// `vdpbf16ps` outruns its f32 FMAs, [`simd::bf16_pairs_fast`]), given bf16 weights; elsewhere
/// the bf16 operands widen to f32. The linear takes AMX first where it has it.
pub(super) fn uses_pairs(x: &Mat) -> bool {
    matches!(x.st, Storage::BF16(_)) && x.rows > GEMV_MAX_M && x.cs == 1 && simd::bf16_pairs_fast()
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
    let small = (2..=small_m_max()).contains(&m) && small_m_applies(w);
    // bf16 rows against a bf16 weight on AVX512_BF16: the GEMV's pair products are faster.
    let pairs = matches!(x.st, Storage::BF16(_))
        && matches!(w, Weights::Dense(b) if matches!(b.st, Storage::BF16(_)))
        && simd::avx512_bf16();
    if k == 0 {
        // Nothing to sum; bias below.
    } else if small && !(pairs && m <= GEMV_MAX_M) {
        // A few rows: the weight read in place, once, by register tiles (no per-call packing).
        let done = match x.as_f32().filter(|v| v.is_dense()) {
            Some(v) => small_m(&v.data[v.off..v.off + m * k], m, w, c),
            None => with_scratch(m * k, |xf| {
                x.read_into(xf);
                small_m(xf, m, w, c)
            }),
        };
        if !done {
            return linear_f32_gemm(x, w, bias, c);
        }
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
        return linear_f32_gemm(x, w, bias, c);
    }
    if let Some(b) = bias {
        c.par_chunks_mut(n).for_each(|row| row.iter_mut().zip(b).for_each(|(v, b)| *v += b));
    }
    Ok(())
}

/// [`linear_f32_into`] through the GEMM (bias first, into `c`).
fn linear_f32_gemm(x: &Mat, w: &Weights, bias: Option<&[f32]>, c: &mut [f32]) -> Result<(), KernelError> {
    let (m, k, n) = (x.rows, w.k(), w.n());
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
    gemm(xv, w, beta, c, n)
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
