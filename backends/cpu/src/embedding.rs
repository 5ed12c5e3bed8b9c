//! `cpu.embedding.fast`: every id is checked against [0, V) first; then each output row is a
//! straight copy of its table row in the table's dtype (a `memcpy` when the table's rows
//! are contiguous, a strided gather otherwise), rows spread over rayon tasks.

use std::sync::Arc;

use rayon::prelude::*;
use smallvec::SmallVec;

use layerzero_core::exec::args::{EmbeddingArgs, OpArgs, Outputs};
use layerzero_core::exec::executor::{KernelError, Registry, WritesInto};
use layerzero_core::model::dtype::DType;
use layerzero_core::tensor::Dims;

use super::alloc::Out;
use super::pack::invalid;
use super::rows::{Elem, TASK, by_dtype, expect_float};
use super::split::worth_splitting;
use super::wrong_op;

/// Embedding kernel id.
pub const EMBEDDING: &str = "cpu.embedding.fast";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        EMBEDDING,
        Arc::new(WritesInto(|args: &OpArgs, bufs: &mut Outputs| match args {
            OpArgs::Embedding(a) => embedding_into(a, bufs),
            other => Err(wrong_op(EMBEDDING, other)),
        })),
    );
}

/// `embedding` into new buffers.
#[cfg(test)]
pub(crate) fn embedding(a: &EmbeddingArgs) -> Result<Outputs, KernelError> {
    embedding_into(a, &mut Outputs::new())
}

/// `embedding`: `out` [..ids shape, H] of the table's dtype, into the caller's buffer where
/// it fits.
pub(crate) fn embedding_into(a: &EmbeddingArgs, bufs: &mut Outputs) -> Result<Outputs, KernelError> {
    if !matches!(a.ids.dtype(), DType::I32 | DType::I64) {
        return Err(invalid(format!("tensor `ids` has dtype {}; expected i32 or i64", a.ids.dtype())));
    }
    let table = &a.table;
    expect_float("table", table)?;
    if table.rank() != 2 {
        return Err(invalid(format!("tensor `table` has shape {:?}; expected [V, H]", table.shape())));
    }
    let (v, h) = (table.shape()[0], table.shape()[1]);
    let mut rows: SmallVec<[usize; 16]> = SmallVec::with_capacity(a.ids.numel());
    let mut bad = None;
    a.ids.for_each_index(|at| {
        let id = a.ids.storage().get_i64(at);
        match usize::try_from(id) {
            Ok(r) if r < v => rows.push(r),
            _ => {
                bad.get_or_insert((rows.len(), id));
            }
        }
    });
    if let Some((n, id)) = bad {
        return Err(invalid(format!("ids (flat position {n}) = {id} is outside [0, {v}) (the table has {v} rows)")));
    }
    let mut shape = Dims::from_slice(a.ids.shape());
    shape.push(h);
    by_dtype!(table.dtype(), EMBEDDING, T => {
        let src = T::slice(table.storage())
            .ok_or_else(|| KernelError::Failed("the table's storage does not match its dtype".to_owned()))?;
        let mut out = Out::<T>::take(bufs, "out", rows.len() * h);
        gather::<T>(src, table.offset(), table.strides(), &rows, h, &mut out.v);
        Ok(Outputs::one("out", out.finish(&shape)?))
    })
}

/// `out[k, :] = src[off + rows[k] * s0 + c * s1]` for c < h.
fn gather<T: Elem>(src: &[T], off: usize, strides: &[usize], rows: &[usize], h: usize, out: &mut [T]) {
    let total = rows.len() * h;
    if total == 0 {
        return;
    }
    let (s0, s1) = (strides[0], strides[1]);
    let per_task = (TASK / h).max(1);
    let work = |(ti, blk): (usize, &mut [T])| {
        for (k, dst) in blk.chunks_mut(h).enumerate() {
            let base = off + rows[ti * per_task + k] * s0;
            if s1 == 1 || h == 1 {
                dst.copy_from_slice(&src[base..base + h]);
            } else {
                for (c, d) in dst.iter_mut().enumerate() {
                    *d = src[base + c * s1];
                }
            }
        }
    };
    if !worth_splitting(2 * total * std::mem::size_of::<T>()) {
        out.chunks_mut(per_task * h).enumerate().for_each(work);
    } else {
        out.par_chunks_mut(per_task * h).enumerate().for_each(work);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::testing::{check, invalid_message, registry, strided, t};
    use layerzero_core::compare::Category;
    use layerzero_core::model::attrs::NoAttrs;
    use layerzero_core::tensor::{HostTensor, Storage};

    const REF: &str = "cpu_reference.embedding.naive";

    fn ids(dtype: DType, shape: &[usize], v: &[i64]) -> TestResult<HostTensor> {
        let st = match dtype {
            DType::I32 => Storage::I32(v.iter().map(|&x| x as i32).collect()),
            _ => Storage::I64(v.to_vec().into()),
        };
        Ok(HostTensor::new(st, shape)?)
    }

    fn args(ids: HostTensor, table: HostTensor) -> OpArgs {
        OpArgs::Embedding(EmbeddingArgs { ids, table, attrs: NoAttrs {} })
    }

    #[test]
    fn copies_rows_exactly_for_every_dtype_ids_shape_and_table_view() -> TestResult {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for (v, h) in [(1usize, 1usize), (7, 5), (50, 4097), (33, 64)] {
                let table = t(&[v, h], (v * h) as u64, dtype, 1.0)?;
                let n = 2 * 9;
                let iv: Vec<i64> = (0..n).map(|k| ((k * 7 + 3) % v) as i64).collect();
                let mut tables = vec![table.clone()];
                tables.extend(strided(&table)?);
                for id_dtype in [DType::I32, DType::I64] {
                    for (k, tb) in tables.iter().enumerate() {
                        let what = format!("{v}x{h} {dtype} ids {id_dtype} table view {k}");
                        let a = args(ids(id_dtype, &[2, 9], &iv)?, tb.clone());
                        check(EMBEDDING, REF, &a, Category::Gemm, &what)?;
                        // Exact: the rows are copied, not recomputed.
                        let got = embedding(match &a {
                            OpArgs::Embedding(e) => e,
                            _ => unreachable!(),
                        })?;
                        let tv = table.to_f64_vec();
                        let want: Vec<f64> =
                            iv.iter().flat_map(|&r| tv[r as usize * h..(r as usize + 1) * h].to_vec()).collect();
                        assert_eq!(got["out"].to_f64_vec(), want, "{what}");
                    }
                }
            }
        }
        // Many ids (the parallel path), a scalar id, no ids.
        let table = t(&[1000, 96], 3, DType::BF16, 1.0)?;
        let iv: Vec<i64> = (0..777).map(|k| (k * 31 % 1000) as i64).collect();
        check(EMBEDDING, REF, &args(ids(DType::I64, &[777], &iv)?, table.clone()), Category::Gemm, "777 ids")?;
        let o =
            embedding(&EmbeddingArgs { ids: ids(DType::I32, &[], &[999])?, table: table.clone(), attrs: NoAttrs {} })?;
        assert_eq!(o["out"].shape(), &[96]);
        let o = embedding(&EmbeddingArgs { ids: ids(DType::I32, &[0, 3], &[])?, table, attrs: NoAttrs {} })?;
        assert_eq!(o["out"].shape(), &[0, 3, 96]);
        Ok(())
    }

    #[test]
    fn ids_outside_the_table_are_errors_naming_position_and_value() -> TestResult {
        let table = t(&[10, 4], 1, DType::F32, 1.0)?;
        for id_dtype in [DType::I32, DType::I64] {
            for (bad, pos) in [(-1i64, 3usize), (10, 0), (i64::from(i32::MAX), 5)] {
                let mut iv = vec![1i64, 2, 3, 4, 5, 6];
                iv[pos] = bad;
                let a = args(ids(id_dtype, &[2, 3], &iv)?, table.clone());
                for kernel in [EMBEDDING, REF] {
                    let m = invalid_message(kernel, &a)?;
                    assert!(m.contains(&format!("flat position {pos}")) && m.contains(&format!("= {bad}")), "{m}");
                    assert!(m.contains("[0, 10)"), "{m}");
                }
            }
        }
        let m = invalid_message(EMBEDDING, &args(t(&[2], 1, DType::F32, 1.0)?, table.clone()))?;
        assert!(m.contains("`ids`") && m.contains("i32 or i64"), "{m}");
        let m = invalid_message(EMBEDDING, &args(ids(DType::I32, &[1], &[0])?, t(&[10], 1, DType::F32, 1.0)?))?;
        assert!(m.contains("`table`") && m.contains("[10]"), "{m}");
        let r = registry();
        let wrong = OpArgs::Silu(layerzero_core::exec::args::SiluArgs { x: table, attrs: NoAttrs {} });
        assert!(matches!(
            r.get(EMBEDDING).ok_or("embedding is not registered")?.run(&wrong),
            Err(KernelError::Unsupported(_))
        ));
        Ok(())
    }
}
