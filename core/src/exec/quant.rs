//! Quantization semantics shared by every quantize/dequantize kernel: the quantized
//! formats, the scale grid a scheme lays over x, and the scale checks (shape and memory
//! order) that must fail loudly (SCALE_LAYOUT_MISMATCH) instead of computing garbage.

use crate::exec::executor::KernelError;
use crate::model::attrs::{QuantAttrs, QuantScheme, ScaleLayout};
use crate::model::dtype::DType;
use crate::tensor::HostTensor;
use crate::tensor::fp8::Fp8;

fn invalid(message: impl Into<String>) -> KernelError {
    KernelError::InvalidInput(message.into())
}

/// A quantized format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Symmetric int8.
    I8,
    /// An fp8 format.
    Fp8(Fp8),
}

impl Target {
    /// The target of a quantized dtype; another dtype is invalid input (`what` names it).
    pub fn of(d: DType, what: &str) -> Result<Target, KernelError> {
        match d {
            DType::I8 => Ok(Target::I8),
            DType::Fp8E4M3 => Ok(Target::Fp8(Fp8::E4M3)),
            DType::Fp8E5M2 => Ok(Target::Fp8(Fp8::E5M2)),
            d => Err(invalid(format!("{what} is {d}; expected i8, fp8_e4m3 or fp8_e5m2"))),
        }
    }

    /// The largest representable magnitude.
    pub fn qmax(self) -> f32 {
        match self {
            Target::I8 => 127.0,
            Target::Fp8(f) => f.max(),
        }
    }
}

/// Where each element's scale lives: the scale grid of a scheme over x.
#[derive(Debug, Clone, PartialEq)]
pub struct Grid {
    /// The scheme.
    pub scheme: QuantScheme,
    /// Rows and cols of a 2-D x (per-channel and per-block); (1, numel) otherwise.
    pub rows: usize,
    /// See `rows`.
    pub cols: usize,
    /// Block shape (per-block; (1, cols) per channel; (rows, cols) per tensor).
    pub br: usize,
    /// See `br`.
    pub bc: usize,
    /// Scale grid dims.
    pub gr: usize,
    /// See `gr`.
    pub gc: usize,
}

impl Grid {
    /// The grid of `a`'s scheme over `x`; invalid input when x's shape does not fit it.
    pub fn new(a: &QuantAttrs, x: &HostTensor) -> Result<Grid, KernelError> {
        let two_d = |what: &str| -> Result<(usize, usize), KernelError> {
            match x.shape() {
                &[r, c] => Ok((r, c)),
                s => Err(invalid(format!("tensor `x` has shape {s:?}; {what} quantization needs a 2-D x [R, C]"))),
            }
        };
        match a.scheme {
            QuantScheme::None | QuantScheme::PerTensor => {
                let n = x.numel();
                Ok(Grid { scheme: a.scheme, rows: 1, cols: n, br: 1, bc: n.max(1), gr: 1, gc: 1 })
            }
            QuantScheme::PerChannel => {
                let (r, c) = two_d("per_channel")?;
                Ok(Grid { scheme: a.scheme, rows: r, cols: c, br: 1, bc: c.max(1), gr: r, gc: 1 })
            }
            QuantScheme::PerBlock => {
                let (r, c) = two_d("per_block")?;
                let Some([br, bc]) = a.block else {
                    return Err(invalid("attrs.block is missing; per_block quantization needs a block [rows, cols]"));
                };
                let (br, bc) = (usize::try_from(br).unwrap_or(0), usize::try_from(bc).unwrap_or(0));
                if br == 0 || bc == 0 {
                    return Err(invalid(format!("attrs.block is {:?}; both sides must be positive", a.block)));
                }
                Ok(Grid { scheme: a.scheme, rows: r, cols: c, br, bc, gr: r.div_ceil(br), gc: c.div_ceil(bc) })
            }
        }
    }

    /// The logical shape of the scale tensor (inline: a decode step's quantize allocates
    /// nothing for it).
    pub fn shape(&self) -> crate::tensor::Dims {
        match self.scheme {
            QuantScheme::None | QuantScheme::PerTensor => smallvec::smallvec![1],
            QuantScheme::PerChannel => smallvec::smallvec![self.gr],
            QuantScheme::PerBlock => smallvec::smallvec![self.gr, self.gc],
        }
    }

    /// True for per-channel and per-block grids (scales vary by row).
    pub fn banded(&self) -> bool {
        matches!(self.scheme, QuantScheme::PerChannel | QuantScheme::PerBlock)
    }

    /// The row-major scale index of logical element `i` of x.
    pub fn group(&self, i: usize) -> usize {
        match self.scheme {
            QuantScheme::None | QuantScheme::PerTensor => 0,
            _ => {
                let (r, c) = (i / self.cols, i % self.cols);
                (r / self.br) * self.gc + c / self.bc
            }
        }
    }
}

/// The memory order of a 2-D view: `Some(true)` row-major (unit stride along columns),
/// `Some(false)` column-major, `None` neither. A dim of 1 may have any stride.
pub fn memory_order(t: &HostTensor) -> Option<bool> {
    let (sh, st) = (t.shape(), t.strides());
    let (r, c) = (sh[0], sh[1]);
    let row = (c <= 1 || st[1] == 1) && (r <= 1 || st[0] >= c);
    let col = (r <= 1 || st[0] == 1) && (c <= 1 || st[1] >= r);
    if row {
        Some(true)
    } else if col {
        Some(false)
    } else {
        None
    }
}

/// Checks a given scale against the scheme: f32, the scheme's shape and, per block, the
/// stated memory order. Errors are SCALE_LAYOUT_MISMATCH naming tensor, shape and strides.
pub fn check_scale(a: &QuantAttrs, x: &HostTensor, s: &HostTensor, grid: &Grid) -> Result<(), KernelError> {
    if s.dtype() != DType::F32 {
        return Err(invalid(format!("tensor `scale` has dtype {}; expected f32", s.dtype())));
    }
    let want = grid.shape();
    let what = match a.scheme {
        QuantScheme::PerBlock => format!("per_block {:?}", a.block.unwrap_or_default()),
        other => other.as_str().to_owned(),
    };
    let shape_ok = match a.scheme {
        QuantScheme::None | QuantScheme::PerTensor => s.numel() == 1,
        _ => s.shape() == &want[..],
    };
    if !shape_ok {
        return Err(invalid(format!(
            "SCALE_LAYOUT_MISMATCH: tensor `scale` has shape {:?} strides {:?}; {what} quantization of x {:?} \
             expects scale shape {want:?}",
            s.shape(),
            s.strides(),
            x.shape()
        )));
    }
    if a.scheme == QuantScheme::PerBlock {
        let layout = a.scale_layout.unwrap_or(ScaleLayout::RowMajor);
        let (gr, gc) = (grid.gr, grid.gc);
        let ok = match (memory_order(s), layout) {
            // A scale with a dim of 1 is both row- and column-major.
            _ if gr <= 1 || gc <= 1 => true,
            (Some(true), ScaleLayout::RowMajor) | (Some(false), ScaleLayout::ColumnMajor) => true,
            _ => false,
        };
        if !ok {
            let found = match memory_order(s) {
                Some(true) => "row-major",
                Some(false) => "column-major",
                None => "neither row- nor column-major",
            };
            let expected = match layout {
                ScaleLayout::RowMajor => format!("[{gc}, 1]"),
                ScaleLayout::ColumnMajor => format!("[1, {gr}]"),
            };
            return Err(invalid(format!(
                "SCALE_LAYOUT_MISMATCH: tensor `scale` has shape {:?} strides {:?} ({found}); attrs.scale_layout \
                 is {}, so {what} scales of x {:?} must have strides {expected}",
                s.shape(),
                s.strides(),
                layout.as_str(),
                x.shape()
            )));
        }
    }
    Ok(())
}
