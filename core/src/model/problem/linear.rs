//! The matrix ops: `linear`, the quantized linears, `mlp` / `moe_experts`, and
//! `quantize` / `dequantize`.

use super::validator::Validator;
use super::{Dims, Problem};
use crate::model::attrs::{Attrs, QuantScheme};
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::op::Op;

impl Problem {
    pub(super) fn linear(v: &mut Validator<'_>) -> (DType, Dims) {
        let x = v.tensor("x");
        let w = v.ranked("weight", 2);
        let dtype = x.map(|t| t.dtype).unwrap_or(DType::F32);
        let (Some(x), Some(w)) = (x, w) else { return (dtype, Dims::None) };
        if x.rank() < 2 {
            v.err(format!("tensor `x` has rank {}; linear needs [..., in_features]", x.rank()));
            return (dtype, Dims::None);
        }
        let k = x.shape[x.rank() - 1];
        let m = x.shape[..x.rank() - 1].iter().fold(1u64, |a, &d| a.saturating_mul(d));
        let (n, wk) = match w.layout {
            Some(Layout::Nn) => (w.shape[1], w.shape[0]),
            Some(Layout::Nt) | None => (w.shape[0], w.shape[1]),
            Some(other) => {
                v.err(format!("tensor `weight` has layout {other}; linear accepts NT ([out, in]) or NN ([in, out])"));
                return (dtype, Dims::None);
            }
        };
        v.eq("weight in_features must equal x's last dim", wk, k);
        if let Some(b) = v.tensor("bias")
            && (b.rank() != 1 || b.shape[0] != n)
        {
            v.err(format!("tensor `bias` shape {:?} must be [{n}]", b.shape));
        }
        (dtype, Dims::Gemm { m, n, k })
    }

    pub(super) fn quantized_linear(v: &mut Validator<'_>) -> (DType, Dims) {
        let op = v.req.op;
        let x = v.ranked("x", 2);
        let w = v.ranked("weight", 2);
        let dtype = x.map(|t| t.dtype).unwrap_or(DType::F32);
        let (Some(x), Some(w)) = (x, w) else { return (dtype, Dims::None) };
        let (m, k) = (x.shape[0], x.shape[1]);
        let n = w.shape[0];
        if op == Op::LinearW8a8 {
            v.dtype_in("x", x, &[DType::I8]);
            v.dtype_in("weight", w, &[DType::I8]);
            v.eq("weight in_features must equal x's last dim", w.shape[1], k);
            for name in ["x_scale", "w_scale"] {
                if let Some(s) = v.tensor(name) {
                    v.dtype_in(name, s, &[DType::F32]);
                }
            }
            if let crate::model::attrs::Attrs::W8a8(a) = &v.req.attrs
                && let Some(o) = a.out_dtype
                && !matches!(o, DType::F32 | DType::F16 | DType::BF16)
            {
                v.err(format!("attrs.out_dtype is {o}; linear_w8a8 produces f32, f16 or bf16"));
            }
        } else {
            v.dtype_in("x", x, &[DType::F32, DType::F16, DType::BF16]);
            v.dtype_in("weight", w, &[DType::I8]);
            if k % 2 != 0 {
                v.err(format!("linear_int4 packs two input features per byte; x's last dim {k} is odd"));
            }
            v.eq("packed weight columns must be in_features / 2", w.shape[1], k / 2);
            // Which scale dtype a format takes is judged by the constraints
            // (SCALE_LAYOUT_MISMATCH names the format); any 4-bit format's is one of these.
            let scale_dtypes = [DType::F32, DType::F16, DType::BF16, DType::Fp8E4M3, DType::I8];
            if let Some(s) = v.tensor("scales") {
                v.dtype_in("scales", s, &scale_dtypes);
            }
            if let Some(s) = v.tensor("zeros") {
                v.dtype_in("zeros", s, &[DType::F32, DType::F16, DType::BF16]);
            }
            if let Some(s) = v.tensor("global_scale") {
                v.dtype_in("global_scale", s, &[DType::F32]);
                if s.shape != [1] {
                    v.err(format!("tensor `global_scale` shape {:?} must be [1] (one per tensor)", s.shape));
                }
            }
        }
        if let Some(b) = v.tensor("bias")
            && (b.rank() != 1 || b.shape[0] != n)
        {
            v.err(format!("tensor `bias` shape {:?} must be [{n}]", b.shape));
        }
        (dtype, Dims::Gemm { m, n, k })
    }

    pub(super) fn mlp(v: &mut Validator<'_>) -> (DType, Dims) {
        let moe = v.req.op == Op::MoeExperts;
        let lead = usize::from(moe);
        let x = v.tensor("x");
        let (wg, wu, wd) = (v.ranked("w_gate", 2 + lead), v.ranked("w_up", 2 + lead), v.ranked("w_down", 2 + lead));
        let dtype = x.map(|t| t.dtype).unwrap_or(DType::F32);
        let (Some(x), Some(wg), Some(wu), Some(wd)) = (x, wg, wu, wd) else { return (dtype, Dims::None) };
        if x.rank() < 2 || (moe && x.rank() != 2) {
            v.err(format!("tensor `x` has rank {}; {} needs [tokens, hidden]", x.rank(), v.req.op));
            return (dtype, Dims::None);
        }
        let hidden = x.shape[x.rank() - 1];
        let tokens = x.shape[..x.rank() - 1].iter().fold(1u64, |a, &d| a.saturating_mul(d));
        let experts = if moe { wg.shape[0] } else { 1 };
        let inter = wg.shape[lead];
        let e_shape = |rest: [u64; 2]| if moe { vec![experts, rest[0], rest[1]] } else { rest.to_vec() };
        for (name, t, want) in [
            ("w_gate", wg, e_shape([inter, hidden])),
            ("w_up", wu, e_shape([inter, hidden])),
            ("w_down", wd, e_shape([hidden, inter])),
        ] {
            if t.shape != want {
                v.err(format!("tensor `{name}` shape {:?} must be {want:?}", t.shape));
            }
        }
        let mut top_k = 1;
        if moe {
            let ids = v.ranked("experts", 2);
            let w = v.ranked("weights", 2);
            if let (Some(ids), Some(w)) = (ids, w) {
                v.dtype_in("experts", ids, &[DType::I32, DType::I64]);
                v.dtype_in("weights", w, &[DType::F32, DType::F16, DType::BF16]);
                v.eq("experts rows must equal tokens", ids.shape[0], tokens);
                if w.shape != ids.shape {
                    v.err(format!("tensor `weights` shape {:?} must equal `experts` shape {:?}", w.shape, ids.shape));
                }
                top_k = ids.shape[1];
            }
        }
        (dtype, Dims::Mlp { tokens, hidden, intermediate: inter, experts, top_k })
    }

    pub(super) fn quant(v: &mut Validator<'_>) -> (DType, Dims) {
        let Some(x) = v.tensor("x") else { return (DType::F32, Dims::None) };
        let Attrs::Quant(a) = &v.req.attrs else { return (x.dtype, Dims::None) };
        let quantized = [DType::I8, DType::Fp8E4M3, DType::Fp8E5M2];
        if v.req.op == Op::Quantize {
            v.dtype_in("x", x, &[DType::F32, DType::F16, DType::BF16]);
            let target = a.target.unwrap_or(DType::I8);
            if !quantized.contains(&target) {
                v.err(format!("attrs.target is {target}; quantize targets i8, fp8_e4m3 or fp8_e5m2"));
            }
            if a.scheme == QuantScheme::None && target == DType::I8 {
                v.err("attrs.scheme none is a plain cast; it needs an fp8 target".to_owned());
            }
            if a.format.is_some() || !a.scale_order.is_linear() || v.tensor("global_scale").is_some() {
                v.err("attrs.format, attrs.scale_order and `global_scale` belong to a 4-bit dequantize".to_owned());
            }
        } else if let Some(f) = a.format {
            // Packed 4-bit codes: the scales' dtype is the format's, judged by selection
            // (SCALE_LAYOUT_MISMATCH), as for linear_int4.
            v.dtype_in("x", x, &[DType::I8]);
            if !(a.scheme == QuantScheme::PerBlock && matches!(a.block, Some([1, g]) if g > 0)) {
                v.err(format!(
                    "attrs.scheme {} with block {:?}: a {} weight is dequantized per_block with block [1, group]",
                    a.scheme.as_str(),
                    a.block,
                    f.as_str()
                ));
            }
        } else {
            v.dtype_in("x", x, &quantized);
            if let Some(s) = v.tensor("scale") {
                v.dtype_in("scale", s, &[DType::F32]);
            }
            if !a.scale_order.is_linear() || v.tensor("global_scale").is_some() {
                v.err("attrs.scale_order and `global_scale` need attrs.format (a 4-bit dequantize)".to_owned());
            }
        }
        if v.req.op == Op::Dequantize
            && let Some(o) = a.out_dtype
            && !matches!(o, DType::F32 | DType::F16 | DType::BF16)
        {
            v.err(format!("attrs.out_dtype is {o}; dequantize produces f32, f16 or bf16"));
        }
        match a.scheme {
            QuantScheme::PerChannel | QuantScheme::PerBlock if x.rank() != 2 => {
                v.err(format!(
                    "{} quantization needs a 2-D x [rows, cols]; x has rank {}",
                    a.scheme.as_str(),
                    x.rank()
                ));
            }
            QuantScheme::PerBlock => match a.block {
                Some([r, c]) if r > 0 && c > 0 => {}
                other => v.err(format!("attrs.block is {other:?}; per_block needs [rows, cols] >= 1")),
            },
            _ => {}
        }
        // A packed byte holds two 4-bit values.
        let per_byte = if a.format.is_some() && v.req.op == Op::Dequantize { 2 } else { 1 };
        let hidden = x.shape.last().copied().unwrap_or(1).saturating_mul(per_byte);
        let rows = x.shape[..x.rank().saturating_sub(1)].iter().fold(1u64, |acc, &d| acc.saturating_mul(d));
        (x.dtype, Dims::Rows { rows, hidden })
    }
}
