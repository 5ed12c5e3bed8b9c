//! `embedding` of the `cpu_reference` backend: `out[..., :] = table[ids[...], :]`, every id
//! checked against [0, V) before any row is read.

use std::sync::Arc;

use layerzero_core::exec::args::{EmbeddingArgs, OpArgs};
use layerzero_core::exec::executor::{KernelError, Registry};
use layerzero_core::model::op::Op;
use layerzero_core::tensor::HostTensor;

use super::{from_f64_as, index_values, out, wrong_op};
use layerzero_core::exec::check::{expect_float, expect_rank, invalid};

/// Embedding kernel id.
pub const EMBEDDING: &str = "cpu_reference.embedding.naive";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        EMBEDDING,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Embedding(a) => embedding(a).map(out),
            other => Err(wrong_op(EMBEDDING, Op::Embedding, other)),
        }),
    );
}

/// The first id outside [0, v) as an error naming its flat position and value.
pub(crate) fn check_ids(ids: &[i64], v: usize) -> Result<(), KernelError> {
    match ids.iter().enumerate().find(|(_, id)| !usize::try_from(**id).is_ok_and(|i| i < v)) {
        Some((n, id)) => {
            Err(invalid(format!("ids (flat position {n}) = {id} is outside [0, {v}) (the table has {v} rows)")))
        }
        None => Ok(()),
    }
}

/// `embedding`: a [..., H] tensor of the table's dtype.
pub(crate) fn embedding(a: &EmbeddingArgs) -> Result<HostTensor, KernelError> {
    let ids = index_values("ids", &a.ids)?;
    let table = &a.table;
    expect_float("table", table)?;
    expect_rank("table", table, 2, "[V, H]")?;
    let (v, h) = (table.shape()[0], table.shape()[1]);
    check_ids(&ids, v)?;
    let mut shape = a.ids.shape().to_vec();
    shape.push(h);
    let mut values = Vec::with_capacity(ids.len().saturating_mul(h));
    for &id in &ids {
        let row = usize::try_from(id).unwrap_or_default();
        values.extend((0..h).map(|c| table.at(&[row, c])));
    }
    from_f64_as(table.dtype(), &shape, &values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use layerzero_core::model::attrs::NoAttrs;
    use layerzero_core::model::dtype::DType;
    use layerzero_core::tensor::Storage;

    fn table(dtype: DType) -> TestResult<HostTensor> {
        let v: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 1.0).collect();
        Ok(HostTensor::from_f32_as(dtype, &[4, 3], &v)?)
    }

    fn ids32(shape: &[usize], v: &[i32]) -> TestResult<HostTensor> {
        Ok(HostTensor::new(Storage::I32(v.to_vec().into()), shape)?)
    }

    #[test]
    fn looks_up_rows_for_any_ids_shape() -> TestResult {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let t = table(dtype)?;
            let a = EmbeddingArgs { ids: ids32(&[2, 2], &[3, 0, 0, 2])?, table: t.clone(), attrs: NoAttrs {} };
            let o = embedding(&a)?;
            assert_eq!((o.shape(), o.dtype()), (&[2usize, 2, 3][..], dtype));
            let tv = t.to_f64_vec();
            let want: Vec<f64> = [3, 0, 0, 2].iter().flat_map(|&r| tv[r * 3..r * 3 + 3].to_vec()).collect();
            assert_eq!(o.to_f64_vec(), want);
        }
        // i64 ids, a scalar id, and a transposed (strided) table.
        let ids = HostTensor::new(Storage::I64(vec![1].into()), &[])?;
        let tt = HostTensor::from_f32(&[3, 4], (0..12).map(|i| i as f32).collect())?.permute(&[1, 0])?;
        let o = embedding(&EmbeddingArgs { ids, table: tt, attrs: NoAttrs {} })?;
        assert_eq!(o.shape(), &[3]);
        assert_eq!(o.to_f64_vec(), vec![1.0, 5.0, 9.0]);
        Ok(())
    }

    #[test]
    fn out_of_range_ids_name_position_and_value() -> TestResult {
        for (bad, pos) in [(-1, 2), (4, 1)] {
            let ids = ids32(&[3], &[0, if pos == 1 { bad } else { 1 }, if pos == 2 { bad } else { 2 }])?;
            match embedding(&EmbeddingArgs { ids, table: table(DType::F32)?, attrs: NoAttrs {} }) {
                Err(KernelError::InvalidInput(m)) => {
                    assert!(m.contains(&format!("flat position {pos}")) && m.contains(&format!("= {bad}")), "{m}")
                }
                other => panic!("expected invalid input, got {other:?}"),
            }
        }
        let floats = HostTensor::from_f32(&[1], vec![0.0])?;
        let r = embedding(&EmbeddingArgs { ids: floats, table: table(DType::F32)?, attrs: NoAttrs {} });
        assert!(matches!(r, Err(KernelError::InvalidInput(m)) if m.contains("`ids`")));
        let flat = HostTensor::from_f32(&[3], vec![0.0; 3])?;
        let r = embedding(&EmbeddingArgs { ids: ids32(&[1], &[0])?, table: flat, attrs: NoAttrs {} });
        assert!(matches!(r, Err(KernelError::InvalidInput(m)) if m.contains("`table`")));
        Ok(())
    }
}
