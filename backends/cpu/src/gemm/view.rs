//! Strided 2-D views of tensors (any float storage, or f32 data).

use rayon::prelude::*;

use crate::pack::{invalid, read_f32};
use layerzero_core::exec::executor::KernelError;
use layerzero_core::tensor::{HostTensor, Storage};

/// A 2-D view of a storage: element (r, c) at `off + r * rs + c * cs`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mat<'a> {
    pub st: &'a Storage,
    pub off: usize,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A rank-2 tensor as a matrix.
    pub(crate) fn of(t: &'a HostTensor) -> Mat<'a> {
        let (sh, st) = (t.shape(), t.strides());
        Mat { st: t.storage(), off: t.offset(), rows: sh[0], cols: sh[1], rs: st[0], cs: st[1] }
    }

    /// Storage index of (r, c).
    #[inline]
    pub(crate) fn at(&self, r: usize, c: usize) -> usize {
        self.off + r * self.rs + c * self.cs
    }

    /// The transposed view.
    pub(crate) fn t(&self) -> Mat<'a> {
        Mat { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs, ..*self }
    }

    /// Columns `c0..c0 + n`.
    pub(crate) fn cols(&self, c0: usize, n: usize) -> Mat<'a> {
        Mat { off: self.off + c0 * self.cs, cols: n, ..*self }
    }

    /// Rows `r0..r0 + n`.
    pub(crate) fn rows(&self, r0: usize, n: usize) -> Mat<'a> {
        Mat { off: self.off + r0 * self.rs, rows: n, ..*self }
    }

    /// Reads row `r` as f32 (`out.len()` == cols).
    #[inline]
    pub(crate) fn read_row(&self, r: usize, out: &mut [f32]) {
        read_f32(self.st, self.at(r, 0), self.cs, out);
    }

    /// Reads column `c` as f32 (`out.len()` == rows).
    #[inline]
    pub(crate) fn read_col(&self, c: usize, out: &mut [f32]) {
        read_f32(self.st, self.at(0, c), self.rs, out);
    }

    /// Row `r` in place when it is stored as contiguous f32.
    #[inline]
    pub(crate) fn f32_row(&self, r: usize) -> Option<&'a [f32]> {
        match self.st {
            Storage::F32(v) if self.cs == 1 || self.cols <= 1 => v.get(self.at(r, 0)..self.at(r, 0) + self.cols),
            _ => None,
        }
    }

    /// The f32 view when the storage is f32.
    pub(crate) fn as_f32(&self) -> Option<F32View<'a>> {
        match self.st {
            Storage::F32(v) => {
                Some(F32View { data: v, off: self.off, rows: self.rows, cols: self.cols, rs: self.rs, cs: self.cs })
            }
            _ => None,
        }
    }

    /// A contiguous row-major f32 copy (parallel over rows).
    pub(crate) fn to_f32(self) -> Vec<f32> {
        let mut v = vec![0f32; self.rows * self.cols];
        self.read_into(&mut v);
        v
    }

    /// The same, into `out` (`rows * cols` long).
    pub(crate) fn read_into(&self, out: &mut [f32]) {
        if self.cols > 0 {
            out.par_chunks_mut(self.cols).enumerate().for_each(|(r, row)| self.read_row(r, row));
        }
    }
}

/// A 2-D view of f32 data (element (r, c) at `off + r * rs + c * cs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct F32View<'a> {
    pub data: &'a [f32],
    pub off: usize,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> F32View<'a> {
    /// A contiguous row-major [rows, cols] matrix.
    pub(crate) fn dense(data: &'a [f32], rows: usize, cols: usize) -> F32View<'a> {
        F32View { data, off: 0, rows, cols, rs: cols, cs: 1 }
    }

    /// True when the rows are stored one after another, unit stride.
    pub(crate) fn is_dense(&self) -> bool {
        (self.cs == 1 || self.cols <= 1) && (self.rs == self.cols || self.rows <= 1) && self.in_bounds()
    }

    /// Rows `r0..r0 + n`.
    pub(crate) fn rows(&self, r0: usize, n: usize) -> F32View<'a> {
        F32View { off: self.off + r0 * self.rs, rows: n, ..*self }
    }

    /// The last storage index the view reaches (None when it overflows); views with a zero
    /// dim reach nothing.
    fn last(&self) -> Option<usize> {
        if self.rows == 0 || self.cols == 0 {
            return Some(0);
        }
        (self.rows - 1)
            .checked_mul(self.rs)
            .and_then(|a| (self.cols - 1).checked_mul(self.cs).and_then(|b| a.checked_add(b)))
            .and_then(|a| a.checked_add(self.off))
    }

    pub(super) fn in_bounds(&self) -> bool {
        self.rows == 0 || self.cols == 0 || self.last().is_some_and(|l| l < self.data.len())
    }
}

/// The rows of x [..., K] as a matrix [M, K] (leading dims collapsed). A view whose
/// leading dims do not collapse to one stride is copied to a contiguous tensor first
/// (`holder` keeps the copy alive).
pub(crate) fn rows_view<'a>(x: &'a HostTensor, holder: &'a mut Option<HostTensor>) -> Result<Mat<'a>, KernelError> {
    let Some((&k, lead)) = x.shape().split_last() else {
        return Err(invalid(format!("tensor `x` has shape {:?}; expected at least one dim [..., K]", x.shape())));
    };
    let m = lead
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| invalid(format!("tensor `x` shape {:?} overflows", x.shape())))?;
    let st = x.strides();
    // The stride of the collapsed leading dims, when they collapse.
    let mut rs = None;
    let mut expect = None;
    let mut ok = true;
    for d in (0..lead.len()).rev() {
        if lead[d] == 1 {
            continue;
        }
        match expect {
            None => rs = Some(st[d]),
            Some(e) if e == st[d] => {}
            Some(_) => ok = false,
        }
        expect = st[d].checked_mul(lead[d]);
        if expect.is_none() {
            ok = false;
        }
    }
    let cs = st.last().copied().unwrap_or(1);
    if ok {
        return Ok(Mat { st: x.storage(), off: x.offset(), rows: m, cols: k, rs: rs.unwrap_or(k), cs });
    }
    let c = holder.insert(x.contiguous());
    Ok(Mat { st: c.storage(), off: c.offset(), rows: m, cols: k, rs: k, cs: 1 })
}
