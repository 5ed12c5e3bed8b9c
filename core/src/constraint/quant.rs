//! Quantization constraints: scale tensors must have the shape and memory order the scheme
//! implies (SCALE_LAYOUT_MISMATCH, never garbage computed quietly), and the kernel must
//! implement the scheme, target, block shape, scale layout and group size; a 4-bit weight's
//! scales must be its format's (block size, scale dtype, per-block not per-channel) in an
//! order the kernel reads (linear vs NVIDIA's swizzled 32_4_4).

use super::{Sink, list};
use crate::capabilities::spec::Constraints;
use crate::model::attrs::{Attrs, Int4Attrs, QuantAttrs, QuantScheme, ScaleLayout};
use crate::model::dtype::DType;
use crate::model::op::Op;
use crate::model::request::Request;
use crate::model::tensor::TensorDesc;
use crate::model::w4::{ActQuant, ScaleOrder, W4Format, group_shape_mismatch};
use crate::reason::ReasonCode;

pub(super) fn check(c: &Constraints, req: &Request, out: &mut impl Sink) {
    match (&req.attrs, req.op) {
        (Attrs::Quant(a), Op::Quantize | Op::Dequantize) => quant(c, req, a, out),
        (Attrs::W8a8(a), Op::LinearW8a8) => w8a8(c, req, a.group_size, out),
        (Attrs::Int4(a), Op::LinearInt4) => int4(c, req, a, out),
        _ => {}
    }
}

fn mismatch(out: &mut impl Sink, msg: impl FnOnce() -> String) {
    out.reject(ReasonCode::SCALE_LAYOUT_MISMATCH, msg);
}

/// The logical scale shape a scheme implies for x.
fn expected_scale_shape(a: &QuantAttrs, x: &TensorDesc) -> Option<Vec<u64>> {
    match a.scheme {
        QuantScheme::None | QuantScheme::PerTensor => Some(vec![1]),
        QuantScheme::PerChannel => x.shape.first().map(|&r| vec![r]),
        QuantScheme::PerBlock => {
            let [br, bc] = a.block?;
            let (r, cols) = (*x.shape.first()?, *x.shape.get(1)?);
            Some(vec![r.div_ceil(br.max(1)), cols.div_ceil(bc.max(1))])
        }
    }
}

/// The memory order of a 2-D scale tensor (`None` when it is ambiguous: a dim of 1).
fn scale_order(s: &TensorDesc) -> Option<ScaleLayout> {
    if s.rank() != 2 || s.shape.iter().any(|&d| d <= 1) {
        return None;
    }
    match s.strides.as_deref() {
        None => Some(ScaleLayout::RowMajor),
        Some([a, 1]) if *a == s.shape[1] => Some(ScaleLayout::RowMajor),
        Some([1, b]) if *b == s.shape[0] => Some(ScaleLayout::ColumnMajor),
        Some(_) => None,
    }
}

fn quant(c: &Constraints, req: &Request, a: &QuantAttrs, out: &mut impl Sink) {
    let layout = a.scale_layout.unwrap_or(ScaleLayout::RowMajor);
    if let Some(ok) = &c.quant_schemes
        && !ok.contains(&a.scheme)
    {
        out.reject(ReasonCode::ATTR_UNSUPPORTED, || format!("scheme {} not in [{}]", a.scheme.as_str(), names(ok)));
    }
    blocks(c, a, out);
    if let (Some(format), Op::Dequantize) = (a.format, req.op) {
        return dequant_w4(c, req, a, format, out);
    }
    let qdtype = match req.op {
        Op::Quantize => a.target.unwrap_or(DType::I8),
        _ => req.get("x").map_or(DType::I8, |x| x.dtype),
    };
    if let Some(ok) = &c.quant_targets
        && !ok.contains(&qdtype)
    {
        out.reject(ReasonCode::DTYPE_UNSUPPORTED, || format!("quantized dtype {qdtype} not in [{}]", list(ok)));
    }
    if a.scheme == QuantScheme::PerBlock
        && let Some(ok) = &c.scale_layouts
        && !ok.contains(&layout)
    {
        mismatch(out, || format!("scale_layout {} requested; the kernel reads {} scales", layout.as_str(), names2(ok)));
    }
    // A given scale tensor (dequantize) must match the scheme's shape and the stated layout.
    if let (Some(scale), Some(x)) = (req.get("scale"), req.get("x"))
        && let Some(want) = expected_scale_shape(a, x)
    {
        let numel: u64 = scale.shape.iter().product();
        let shape_ok = match a.scheme {
            QuantScheme::None | QuantScheme::PerTensor => numel == 1,
            _ => scale.shape == want,
        };
        if !shape_ok {
            mismatch(out, || {
                format!(
                    "scale shape {:?} does not match {} quantization of x {:?}: expected {want:?}",
                    scale.shape,
                    a.scheme.as_str(),
                    x.shape
                )
            });
        } else if let Some(order) = scale_order(scale)
            && a.scheme == QuantScheme::PerBlock
            && order != layout
        {
            mismatch(out, || {
                format!(
                    "scale strides {:?} are {}; attrs.scale_layout says {}",
                    scale.strides,
                    order.as_str(),
                    layout.as_str()
                )
            });
        }
    }
}

/// A per-block request's block must be one the kernel declares (a 4-bit dequantize's
/// `[1, group]` included).
fn blocks(c: &Constraints, a: &QuantAttrs, out: &mut impl Sink) {
    if let (QuantScheme::PerBlock, Some(block), Some(ok)) = (a.scheme, a.block, &c.quant_blocks)
        && !ok.contains(&block)
    {
        out.reject(ReasonCode::ATTR_UNSUPPORTED, || {
            let b: Vec<String> = ok.iter().map(|b| format!("{b:?}")).collect();
            format!("block {block:?} not in [{}]", b.join(", "))
        });
    }
}

/// `linear_w8a8`'s scales: per row (`[1]` or `[rows]`), or with a group size per block
/// (`[rows, K / g]`) stored in an order the kernel declares it reads (`scale_layouts`,
/// row-major when it declares none): seed 004's fallback wrote row-major block scales where
/// its GEMM read column-major ones, and every number it then computed was wrong.
fn w8a8(c: &Constraints, req: &Request, group: Option<u64>, out: &mut impl Sink) {
    let (Some(x), Some(w)) = (req.get("x"), req.get("weight")) else { return };
    let k = x.shape.get(1).copied();
    let reads = c.scale_layouts.as_deref().unwrap_or(&[ScaleLayout::RowMajor]);
    for (name, rows) in [("x_scale", x.shape.first()), ("w_scale", w.shape.first())] {
        let (Some(s), Some(&rows)) = (req.get(name), rows) else { continue };
        match (group, k) {
            (Some(g), Some(k)) if g > 0 => {
                let want = [rows, k / g];
                if s.shape.as_slice() != want {
                    mismatch(out, || {
                        format!(
                            "tensor `{name}` shape {:?} must be {want:?} (one scale per block of {g} along K)",
                            s.shape
                        )
                    });
                    continue;
                }
                let stored = if s.is_contiguous() { Some(ScaleLayout::RowMajor) } else { scale_order(s) };
                match stored {
                    // A dim of 1: both orders are one memory.
                    _ if s.shape.iter().any(|&d| d <= 1) => {}
                    Some(order) if !reads.contains(&order) => mismatch(out, || {
                        format!(
                            "tensor `{name}` {want:?} is stored {} (strides {:?}); the kernel reads {} scales",
                            order.as_str(),
                            s.strides.clone().unwrap_or_else(|| vec![want[1], 1]),
                            names2(reads)
                        )
                    }),
                    Some(_) => {}
                    None => mismatch(out, || {
                        format!(
                            "tensor `{name}` {want:?} has strides {:?}, neither row- nor column-major; the kernel reads {} scales",
                            s.strides,
                            names2(reads)
                        )
                    }),
                }
            }
            _ => {
                let n: u64 = s.shape.iter().product();
                if !(s.rank() == 1 && (n == 1 || n == rows)) {
                    mismatch(out, || {
                        format!("tensor `{name}` shape {:?} must be [1] or [{rows}] (one scale per row)", s.shape)
                    });
                }
            }
        }
    }
}

fn int4(c: &Constraints, req: &Request, a: &Int4Attrs, out: &mut impl Sink) {
    let k = req.get("x").and_then(|x| x.shape.last().copied());
    let n = req.get("weight").and_then(|w| w.shape.first().copied());
    w4(c, req, W4 { format: a.format, order: a.scale_order, group: a.group_size, n, k }, out);
    // Rounding x to int8 changes the result: a kernel that does not declare it would
    // compute a different product.
    let takes = c.int4_activations.as_deref().unwrap_or(&[ActQuant::F32]);
    if !takes.contains(&a.activations) {
        out.reject(ReasonCode::ATTR_UNSUPPORTED, || {
            let names: Vec<&str> = takes.iter().map(|t| t.as_str()).collect();
            format!("activations {} not in [{}]", a.activations.as_str(), names.join(", "))
        });
    }
}

/// A packed 4-bit weight as selection sees it: `[n, k]` when the request's shapes say.
struct W4 {
    format: W4Format,
    order: ScaleOrder,
    group: u64,
    n: Option<u64>,
    k: Option<u64>,
}

/// What `linear_int4` and a 4-bit `dequantize` share: the kernel's formats (ATTR_UNSUPPORTED)
/// and scale orders, the format's scales, a group dividing K and `[N, K / group]` scale and
/// zero shapes (SCALE_LAYOUT_MISMATCH). `scales` is the op's name for the block scales.
fn w4(c: &Constraints, req: &Request, w: W4, out: &mut impl Sink) {
    let (a, scales) = (&w, if req.op == Op::Dequantize { "scale" } else { "scales" });
    // A kernel that declares no formats reads int4 only (linear_int4's first kernels); a
    // dequantize kernel that declares none reads no 4-bit format.
    let none: &[W4Format] = if req.op == Op::Dequantize { &[] } else { &[W4Format::Int4] };
    let formats = c.weight_formats.as_deref().unwrap_or(none);
    if !formats.contains(&a.format) {
        out.reject(ReasonCode::ATTR_UNSUPPORTED, || {
            let names: Vec<&str> = formats.iter().map(|f| f.as_str()).collect();
            format!("weight format {} not in [{}]", a.format.as_str(), names.join(", "))
        });
    }
    let orders = c.scale_orders.as_deref().unwrap_or(&[ScaleOrder::Linear]);
    if !orders.contains(&a.order) {
        mismatch(out, || {
            let names: Vec<&str> = orders.iter().map(|o| o.as_str()).collect();
            format!("scale_order {} requested; the kernel reads {} scales", a.order.as_str(), names.join(" or "))
        });
    }
    let group = a.group;
    let (zeros, global) = (req.get("zeros").is_some(), req.get("global_scale").is_some());
    if let Some(s) = req.get(scales)
        && let Some(why) = a.format.scale_mismatch(group, s.dtype, zeros, global)
    {
        mismatch(out, || why);
    }
    let (Some(k), Some(n)) = (a.k, a.n) else { return };
    if group == 0 || k % group != 0 {
        mismatch(out, || format!("group_size {group} does not divide in_features {k}"));
        return;
    }
    for name in [scales, "zeros"] {
        if let Some(s) = req.get(name)
            && let Some(why) = group_shape_mismatch(name, &s.shape, n, k, group)
        {
            mismatch(out, || why);
        }
    }
}

/// A 4-bit `dequantize`: x is `[N, K/2]` packed bytes, the block `[1, group]` along K.
fn dequant_w4(c: &Constraints, req: &Request, a: &QuantAttrs, format: W4Format, out: &mut impl Sink) {
    // The problem validator refuses another scheme or block shape (an invalid request).
    let Some([1, group]) = a.block else { return };
    let x = req.get("x");
    let (n, k) = (x.and_then(|x| x.shape.first().copied()), x.and_then(|x| x.shape.get(1)).map(|h| h * 2));
    w4(c, req, W4 { format, order: a.scale_order, group, n, k }, out);
}

fn names(v: &[QuantScheme]) -> String {
    v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

fn names2(v: &[ScaleLayout]) -> String {
    v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" or ")
}
