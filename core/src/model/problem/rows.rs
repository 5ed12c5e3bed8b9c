//! Row-wise ops: norms, activations, RoPE, sampling and routing, as rows x hidden.

use super::validator::{INDEX, Validator};
use super::{Dims, Problem};
use crate::model::attrs::Attrs;
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::op::Op;

impl Problem {
    pub(super) fn rows(v: &mut Validator<'_>) -> (DType, Dims) {
        let op = v.req.op;
        let primary = match op {
            Op::Rope => "q",
            Op::Embedding => "table",
            Op::Sample | Op::MoeRoute => "logits",
            Op::Swiglu | Op::Geglu => {
                if v.tensor("x").is_some() {
                    "x"
                } else {
                    "gate"
                }
            }
            _ => "x",
        };
        let Some(t) = v.tensor(primary) else {
            if matches!(op, Op::Swiglu | Op::Geglu) {
                v.err(format!("{op} needs either `x` (with attrs.split = true) or both `gate` and `up`"));
            }
            return (DType::F32, Dims::None);
        };
        if t.rank() == 0 {
            v.err(format!("tensor `{primary}` is a scalar; {op} needs at least one dimension"));
            return (t.dtype, Dims::None);
        }
        let hidden = t.shape[t.rank() - 1];
        let rows = t.shape[..t.rank() - 1].iter().fold(1u64, |a, &d| a.saturating_mul(d));
        match op {
            Op::RmsNorm | Op::LayerNorm => {
                for name in ["weight", "bias"] {
                    if let Some(w) = v.tensor(name)
                        && w.shape != [hidden]
                    {
                        v.err(format!("tensor `{name}` shape {:?} must be [{hidden}] (x's last dim)", w.shape));
                    }
                }
                if let Some(r) = v.tensor("residual")
                    && r.shape != t.shape
                {
                    v.err(format!("tensor `residual` shape {:?} must equal x's shape {:?}", r.shape, t.shape));
                }
            }
            Op::Swiglu | Op::Geglu => {
                let split = matches!(&v.req.attrs, Attrs::Swiglu(a) if a.split)
                    || matches!(&v.req.attrs, Attrs::Geglu(a) if a.split);
                match (v.tensor("x").is_some(), v.tensor("gate"), v.tensor("up")) {
                    (true, None, None) if split => {
                        if hidden % 2 != 0 {
                            v.err(format!("{op} with split = true needs an even last dim; x's is {hidden}"));
                        }
                        return (t.dtype, Dims::Rows { rows, hidden: hidden / 2 });
                    }
                    (true, None, None) => v.err(format!("{op} with `x` needs attrs.split = true")),
                    (false, Some(_), Some(u)) => {
                        if u.shape != t.shape {
                            v.err(format!("tensor `up` shape {:?} must equal `gate` shape {:?}", u.shape, t.shape));
                        }
                    }
                    _ => v.err(format!("{op} takes either `x` alone (split) or `gate` and `up`")),
                }
            }
            Op::Embedding => {
                if let Some(ids) = v.tensor("ids") {
                    v.dtype_in("ids", ids, INDEX);
                }
                if t.rank() != 2 {
                    v.err(format!("tensor `table` has rank {}; embedding needs [vocab, hidden]", t.rank()));
                }
                let tokens = v.tensor("ids").map(|i| i.numel()).unwrap_or(0);
                return (t.dtype, Dims::Rows { rows: tokens, hidden });
            }
            Op::Sample | Op::MoeRoute if t.rank() != 2 => {
                v.err(format!(
                    "tensor `logits` has rank {}; {op} needs [rows, {}]",
                    t.rank(),
                    if op == Op::Sample { "vocab" } else { "experts" }
                ));
            }
            Op::MoeRoute => {
                if let Attrs::MoeRoute(a) = &v.req.attrs
                    && !(1..=hidden).contains(&a.top_k)
                {
                    v.err(format!("attrs.top_k is {}; it must be in [1, {hidden}] (the number of experts)", a.top_k));
                }
            }
            Op::Rope => {
                if let Attrs::Rope(a) = &v.req.attrs
                    && let Some(r) = a.rotary_dim
                    && (r % 2 != 0 || r > hidden)
                {
                    v.err(format!("attrs.rotary_dim is {r}; it must be even and at most head_dim {hidden}"));
                }
                if let Some(l) = t.layout
                    && !matches!(l, Layout::Bshd | Layout::Bhsd)
                {
                    v.err(format!("tensor `q` has layout {l}; rope accepts BSHD or BHSD"));
                }
                if let Some(p) = v.tensor("positions") {
                    v.dtype_in("positions", p, INDEX);
                }
            }
            _ => {}
        }
        (t.dtype, Dims::Rows { rows, hidden })
    }
}
