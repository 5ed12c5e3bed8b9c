//! The dense-mask fallback of a block-sparse mask: a bool block layout (`attrs.mask_block`
//! = `[rows, cols]`) expanded into the dense bool mask it means, for a kernel that reads no
//! block layout. Entry `[.., i, j]` of the dense mask is entry `[.., i / rows, j / cols]` of
//! the layout (a block dim of 1 broadcasts); the leading dims are kept as they are.

use crate::error::{Error, Result};
use crate::exec::args::{OpArgs, layout_of};
use crate::model::layout::Layout;
use crate::model::request::Request;
use crate::tensor::{HostTensor, Storage};

/// The sequence length of an attention tensor (`seq` of BSHD or BHSD).
fn seq_of(shape: &[usize], layout: Layout) -> Option<usize> {
    shape.get(if layout == Layout::Bhsd { 2 } else { 1 }).copied()
}

/// The dense shape of a block layout of `shape` over `seq_q` x `seq_k`.
pub(super) fn dense_shape<T: Copy>(shape: &[T], seq_q: T, seq_k: T) -> Vec<T> {
    let lead = shape.len().saturating_sub(2);
    shape[..lead].iter().copied().chain([seq_q, seq_k]).collect()
}

/// The adapted request's `mask`: the dense shape, contiguous, and no block size.
pub(super) fn expand_desc(req: &mut Request) {
    let seq = |name: &str| {
        let t = req.tensors.get(name)?;
        seq_of(&t.shape.iter().map(|&d| d as usize).collect::<Vec<_>>(), t.layout.unwrap_or(Layout::Bshd))
    };
    let (Some(sq), Some(sk)) = (seq("q"), seq("k")) else { return };
    if let Some(m) = req.tensors.get_mut("mask") {
        m.shape = dense_shape(&m.shape, sq as u64, sk as u64);
        m.strides = None;
    }
    if let crate::model::attrs::Attrs::Attention(a) = &mut req.attrs {
        a.mask_block = None;
    }
}

/// `args` with its block-sparse mask expanded into a dense bool mask.
pub(super) fn expand(args: &OpArgs) -> Result<OpArgs> {
    let OpArgs::Attention(a) = args else {
        return Err(Error::invalid("expand_block_mask applies to attention only"));
    };
    let (Some(m), Some([rows, cols])) = (&a.mask, a.attrs.mask_block) else {
        return Err(Error::invalid("expand_block_mask needs `mask` and attrs.mask_block"));
    };
    let (rows, cols) = (rows as usize, cols as usize);
    let (Some(sq), Some(sk)) = (seq_of(a.q.shape(), layout_of(&a.q)), seq_of(a.k.shape(), layout_of(&a.k))) else {
        return Err(Error::invalid("q and k must have rank 4"));
    };
    let shape = m.shape();
    if shape.len() < 2 || rows == 0 || cols == 0 {
        return Err(Error::invalid(format!(
            "a block-sparse mask has rank >= 2 and blocks of at least 1x1; mask shape {shape:?}, attrs.mask_block {:?}",
            a.attrs.mask_block
        )));
    }
    let [nbq, nbk] = [shape[shape.len() - 2], shape[shape.len() - 1]];
    let want = [sq.div_ceil(rows), sk.div_ceil(cols)];
    if (nbq != want[0] && nbq != 1) || (nbk != want[1] && nbk != 1) {
        return Err(Error::invalid(format!(
            "mask has {nbq}x{nbk} blocks; {sq}x{sk} in blocks of {rows}x{cols} needs {}x{} (or 1 to broadcast)",
            want[0], want[1]
        )));
    }
    let keep = m.to_f32_vec();
    let planes = keep.len() / (nbq * nbk).max(1);
    let mut dense = Vec::with_capacity(planes * sq * sk);
    for p in 0..planes {
        let plane = &keep[p * nbq * nbk..(p + 1) * nbq * nbk];
        for i in 0..sq {
            let row = &plane[(i / rows).min(nbq - 1) * nbk..][..nbk];
            dense.extend((0..sk).map(|j| row[(j / cols).min(nbk - 1)] != 0.0));
        }
    }
    let mut out = a.clone();
    out.mask = Some(HostTensor::new(Storage::Bool(dense), &dense_shape(shape, sq, sk))?);
    out.attrs.mask_block = None;
    Ok(OpArgs::Attention(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::exec::args::AttentionArgs;
    use crate::model::attrs::AttentionAttrs;
    use crate::model::dtype::DType;

    fn call(mask: HostTensor, block: [u64; 2]) -> TestResult<OpArgs> {
        let t = |s: usize| HostTensor::zeros(DType::F32, &[1, s, 1, 2]);
        Ok(OpArgs::Attention(AttentionArgs {
            q: t(3)?,
            k: t(5)?,
            v: t(5)?,
            mask: Some(mask),
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            attrs: AttentionAttrs { mask_block: Some(block), ..AttentionAttrs::default() },
        }))
    }

    fn dense_of(args: &OpArgs) -> TestResult<(Vec<usize>, Vec<f32>)> {
        let OpArgs::Attention(a) = args else { return Err("not attention".into()) };
        let m = a.mask.as_ref().ok_or("no mask")?;
        assert_eq!(a.attrs.mask_block, None);
        Ok((m.shape().to_vec(), m.to_f32_vec()))
    }

    #[test]
    fn a_partial_last_block_and_a_broadcast_block_dim_expand_as_the_layout_means() -> TestResult {
        // 3 queries x 5 keys in blocks of 2 x 2: 2 x 3 blocks, the last of each partial.
        let layout = HostTensor::new(Storage::Bool(vec![true, false, true, false, true, false]), &[2, 3])?;
        let (shape, got) = dense_of(&expand(&call(layout, [2, 2])?)?)?;
        assert_eq!(shape, [3, 5]);
        #[rustfmt::skip]
        let want = [1., 1., 0., 0., 1., 1., 1., 0., 0., 1., 0., 0., 1., 1., 0.];
        assert_eq!(got, want);
        // One block column broadcast over every key block; one layout per head kept as [2, ..].
        let layout = HostTensor::new(Storage::Bool(vec![false, true, true, false]), &[2, 2, 1])?;
        let (shape, got) = dense_of(&expand(&call(layout, [2, 2])?)?)?;
        assert_eq!(shape, [2, 3, 5]);
        // Head 0 keeps only query block 1 (row 2), head 1 only query block 0 (rows 0 and 1).
        let rows = |keep: [f32; 3]| keep.into_iter().flat_map(|k| [k; 5]);
        let want: Vec<f32> = rows([0., 0., 1.]).chain(rows([1., 1., 0.])).collect();
        assert_eq!(got, want);
        Ok(())
    }

    #[test]
    fn a_layout_of_the_wrong_block_count_is_refused_naming_both() -> TestResult {
        let layout = HostTensor::new(Storage::Bool(vec![true; 4]), &[2, 2])?;
        let err = expand(&call(layout, [2, 2])?).err().ok_or("a 2x2 layout of 3x5 in 2x2 blocks was accepted")?;
        assert!(err.to_string().contains("needs 2x3"), "{err}");
        Ok(())
    }
}
