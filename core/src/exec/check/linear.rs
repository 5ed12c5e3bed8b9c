//! Linear layers: rows of `x`, the weight's layout, bias and scales, quantized operands.

use super::w4::{W4Scales, packed_dims};
use super::{expect_dense_float, invalid};
use crate::exec::args::{Int4Args, W8a8Args};
use crate::exec::executor::KernelError;
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::tensor::HostTensor;

/// The activations [..., K] of a linear-like op: (leading shape, M, K).
/// The output shape: the leading dims of x then `n`.
pub fn out_shape(lead: &[usize], n: usize) -> Vec<usize> {
    let mut s = lead.to_vec();
    s.push(n);
    s
}

/// The rows of `x` read as `[..., K]`: the leading dims, the row count M and K.
pub fn rows_of(name: &str, x: &HostTensor) -> Result<(crate::tensor::Dims, usize, usize), KernelError> {
    let Some((&k, lead)) = x.shape().split_last() else {
        return Err(invalid(format!("tensor `{name}` has shape {:?}; expected at least one dim [..., K]", x.shape())));
    };
    let m = lead
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| invalid(format!("tensor `{name}` shape {:?} overflows", x.shape())))?;
    Ok((crate::tensor::Dims::from_slice(lead), m, k))
}

/// Which way a dense linear weight is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightLayout {
    /// [N, K] (`x @ W^T`), the default.
    Nt,
    /// [K, N] (`x @ W`).
    Nn,
}

/// Checks a dense linear weight against K and returns (layout, N).
pub fn weight_dims(name: &str, w: &HostTensor, k: usize) -> Result<(WeightLayout, usize), KernelError> {
    let layout = match w.layout() {
        None | Some(Layout::Nt) => WeightLayout::Nt,
        Some(Layout::Nn) => WeightLayout::Nn,
        Some(other) => {
            return Err(invalid(format!("tensor `{name}` has layout {other}; expected NT ([N, K]) or NN ([K, N])")));
        }
    };
    let s = w.shape();
    let (n, wk) = match (layout, s) {
        (WeightLayout::Nt, &[n, wk]) => (n, wk),
        (WeightLayout::Nn, &[wk, n]) => (n, wk),
        _ => {
            let want = if layout == WeightLayout::Nt { "[N, K]" } else { "[K, N]" };
            return Err(invalid(format!(
                "tensor `{name}` has shape {s:?} (rank {}); layout {} expects rank 2 {want}",
                s.len(),
                if layout == WeightLayout::Nt { "NT" } else { "NN" }
            )));
        }
    };
    if wk != k {
        return Err(invalid(format!(
            "tensor `{name}` has shape {s:?}; its in_features {wk} must equal x's last dim K = {k}"
        )));
    }
    Ok((layout, n))
}

/// Checks an optional bias [N] (any float dtype).
pub fn check_bias(bias: Option<&HostTensor>, n: usize) -> Result<(), KernelError> {
    if let Some(b) = bias {
        if !b.dtype().is_float() {
            return Err(invalid(format!("tensor `bias` has dtype {}; expected a float dtype", b.dtype())));
        }
        if b.shape() != [n] {
            return Err(invalid(format!("tensor `bias` has shape {:?}; expected [N] = [{n}]", b.shape())));
        }
    }
    Ok(())
}

/// The dtype an attribute names for a float output (f32 when absent).
pub fn out_dtype(attr: &str, d: Option<DType>) -> Result<DType, KernelError> {
    match d.unwrap_or(DType::F32) {
        d @ (DType::F32 | DType::F16 | DType::BF16) => Ok(d),
        d => Err(invalid(format!("attrs.{attr} is {d}; expected f32, f16 or bf16"))),
    }
}

/// Checks a per-row scale of `linear_w8a8`: f32, [1] or [rows].
pub fn check_row_scale(name: &str, s: &HostTensor, rows: usize, of: &str) -> Result<(), KernelError> {
    if s.dtype() != DType::F32 {
        return Err(invalid(format!("tensor `{name}` has dtype {}; expected f32", s.dtype())));
    }
    if s.shape() != [1] && s.shape() != [rows] {
        return Err(invalid(format!(
            "SCALE_LAYOUT_MISMATCH: tensor `{name}` has shape {:?} strides {:?}; expected [1] (per tensor) or \
             [{rows}] (one scale per row of {of})",
            s.shape(),
            s.strides()
        )));
    }
    Ok(())
}

/// Checks a block scale of `linear_w8a8`: f32 `[rows, blocks]`, in any memory order.
pub fn check_block_scale(name: &str, s: &HostTensor, rows: usize, blocks: usize, of: &str) -> Result<(), KernelError> {
    if s.dtype() != DType::F32 {
        return Err(invalid(format!("tensor `{name}` has dtype {}; expected f32", s.dtype())));
    }
    // Any memory order: the kernels read the scales by logical index (a strided one copied).
    if s.shape() != [rows, blocks] {
        return Err(invalid(format!(
            "SCALE_LAYOUT_MISMATCH: tensor `{name}` has shape {:?} strides {:?}; expected [{rows}, {blocks}] \
             (one scale per block of attrs.group_size features of each row of {of})",
            s.shape(),
            s.strides()
        )));
    }
    Ok(())
}

impl W8a8Args {
    /// The checked dims (M, K, N) of a `linear_w8a8` call.
    pub fn dims(&self) -> Result<(usize, usize, usize), KernelError> {
        let a = self;
        for (name, t) in [("x", &a.x), ("weight", &a.weight)] {
            if t.dtype() != DType::I8 {
                return Err(invalid(format!("tensor `{name}` has dtype {}; linear_w8a8 expects i8", t.dtype())));
            }
            if t.rank() != 2 {
                return Err(invalid(format!("tensor `{name}` has shape {:?}; expected rank 2", t.shape())));
            }
        }
        if matches!(a.weight.layout(), Some(l) if l != Layout::Nt) {
            return Err(invalid(format!(
                "tensor `weight` has layout {:?}; linear_w8a8 takes [N, K] (NT) weights",
                a.weight.layout()
            )));
        }
        let (m, k, n) = (a.x.shape()[0], a.x.shape()[1], a.weight.shape()[0]);
        if a.weight.shape()[1] != k {
            return Err(invalid(format!(
                "tensor `weight` has shape {:?}; expected [N, K] with K = {k} from x {:?}",
                a.weight.shape(),
                a.x.shape()
            )));
        }
        match a.attrs.group_size {
            None => {
                check_row_scale("x_scale", &a.x_scale, m, "x")?;
                check_row_scale("w_scale", &a.w_scale, n, "weight")?;
            }
            Some(g) => {
                let g = usize::try_from(g).unwrap_or(usize::MAX);
                if g == 0 || !k.is_multiple_of(g) || g > 1 << 16 {
                    return Err(invalid(format!(
                        "attrs.group_size is {g}; it must divide K = {k} (and be at most 65536)"
                    )));
                }
                check_block_scale("x_scale", &a.x_scale, m, k / g, "x")?;
                check_block_scale("w_scale", &a.w_scale, n, k / g, "weight")?;
            }
        }
        check_bias(a.bias.as_ref(), n)?;
        out_dtype("out_dtype", a.attrs.out_dtype)?;
        m.checked_mul(n).ok_or_else(|| invalid(format!("the output shape [{m}, {n}] overflows")))?;
        Ok((m, k, n))
    }
}

impl Int4Args {
    /// The weight's scales (with int4's zero points and nvfp4's global scale).
    pub fn w4_scales(&self) -> W4Scales<'_> {
        W4Scales {
            format: self.attrs.format,
            order: self.attrs.scale_order,
            group: self.attrs.group_size,
            scales: &self.scales,
            name: "scales",
            zeros: self.zeros.as_ref(),
            global: self.global_scale.as_ref(),
        }
    }

    /// The checked problem of a `linear_int4` call: (leading shape, M, K, N, group size).
    /// Scales that are not the format's (dtype, block size, zeros, a global scale), in
    /// another order than linear, or of another shape are SCALE_LAYOUT_MISMATCH.
    pub fn dims(&self) -> Result<(crate::tensor::Dims, usize, usize, usize, usize), KernelError> {
        let a = self;
        expect_dense_float("x", &a.x)?;
        let (lead, m, k) = rows_of("x", &a.x)?;
        let (n, wk) = packed_dims("weight", "linear_int4", &a.weight)?;
        if k % 2 != 0 || wk != k {
            return Err(invalid(format!(
                "tensor `weight` has shape {:?}; expected [N, K/2] = [{n}, K/2] with K = {k} from x {:?} (K even)",
                a.weight.shape(),
                a.x.shape()
            )));
        }
        let g = a.w4_scales().check(n, k)?;
        check_bias(a.bias.as_ref(), n)?;
        m.checked_mul(n).ok_or_else(|| invalid(format!("the output shape {:?} overflows", out_shape(&lead, n))))?;
        Ok((lead, m, k, n, g))
    }
}
