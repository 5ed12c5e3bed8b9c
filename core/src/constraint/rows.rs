//! Constraints of the row-wise and GEMM ops: hidden size and op-attribute forms.

use super::Sink;
use super::list;
use crate::capabilities::spec::{Constraints, SwigluForm};
use crate::model::attrs::Attrs;
use crate::model::layout::Layout;
use crate::model::problem::{Dims, Problem};
use crate::model::request::Request;
use crate::reason::ReasonCode;

pub(super) fn check(c: &Constraints, req: &Request, problem: &Problem, out: &mut impl Sink) {
    if let (Some(range), Dims::Rows { hidden, .. }) = (&c.hidden_size, problem.dims)
        && !range.contains(hidden)
    {
        out.reject(ReasonCode::HIDDEN_SIZE_UNSUPPORTED, || {
            format!(
                "hidden size {hidden} outside [{}, {}]",
                range.min.map_or("-".to_owned(), |v| v.to_string()),
                range.max.map_or("-".to_owned(), |v| v.to_string())
            )
        });
    }
    match &req.attrs {
        Attrs::Norm(_) if req.get("residual").is_some() && !c.fused_residual => {
            out.reject(ReasonCode::ATTR_UNSUPPORTED, || {
                "a fused residual add was requested; the kernel has none".to_owned()
            });
        }
        Attrs::Rope(r) => {
            if let Some(styles) = &c.rope_styles
                && !styles.contains(&r.style)
            {
                out.reject(ReasonCode::ATTR_UNSUPPORTED, || {
                    format!("rope style {} is not one the kernel implements", r.style.as_str())
                });
            }
            if r.scaling.is_some() && !c.rope_scaling {
                out.reject(ReasonCode::ATTR_UNSUPPORTED, || {
                    "rope frequency scaling requested; the kernel has none".to_owned()
                });
            }
        }
        Attrs::Gelu(g) => {
            if let Some(ok) = &c.gelu_approximations
                && !ok.contains(&g.approximate)
            {
                out.reject(ReasonCode::ATTR_UNSUPPORTED, || {
                    format!("gelu approximation {} is not one the kernel implements", g.approximate.as_str())
                });
            }
        }
        Attrs::Swiglu(s) => glu_form(c, s.split, out),
        Attrs::Geglu(g) => {
            glu_form(c, g.split, out);
            if let Some(ok) = &c.gelu_approximations
                && !ok.contains(&g.approximate)
            {
                out.reject(ReasonCode::ATTR_UNSUPPORTED, || {
                    format!("gelu approximation {} is not one the kernel implements", g.approximate.as_str())
                });
            }
        }
        Attrs::Mlp(m) => {
            if let Some(acts) = &c.activations
                && !acts.contains(&m.activation)
            {
                out.reject(ReasonCode::ATTR_UNSUPPORTED, || {
                    format!("activation {} is not one the kernel implements", m.activation.as_str())
                });
            }
        }
        // Block scales are opt-in: a kernel that does not list the size takes per-row scales.
        Attrs::W8a8(a) => {
            if let Some(g) = a.group_size {
                match &c.group_sizes {
                    Some(sizes) if sizes.contains(&g) => {}
                    Some(sizes) => {
                        out.reject(ReasonCode::ATTR_UNSUPPORTED, || format!("group_size {g} not in [{}]", list(sizes)))
                    }
                    None => out.reject(ReasonCode::ATTR_UNSUPPORTED, || {
                        format!("group_size {g}: the kernel takes one scale per row (x_scale [M], w_scale [N])")
                    }),
                }
            }
        }
        Attrs::Int4(a) => {
            if let Some(g) = &c.group_sizes
                && !g.contains(&a.group_size)
            {
                out.reject(ReasonCode::ATTR_UNSUPPORTED, || {
                    format!("group_size {} not in [{}]", a.group_size, list(g))
                });
            }
        }
        _ => {}
    }
    super::quant::check(c, req, out);
    if let (Some(layouts), Some(w)) =
        (&c.weight_layouts, req.get("weight").filter(|_| req.op == crate::model::op::Op::Linear))
    {
        let l = w.layout.unwrap_or(Layout::Nt);
        if !layouts.contains(&l) {
            out.reject(ReasonCode::LAYOUT_UNSUPPORTED, || format!("weight layout {l} not in [{}]", list(layouts)));
        }
    }
}

fn glu_form(c: &Constraints, split: bool, out: &mut impl Sink) {
    let form = if split { SwigluForm::Split } else { SwigluForm::Separate };
    if let Some(forms) = &c.glu_forms
        && !forms.contains(&form)
    {
        out.reject(ReasonCode::ATTR_UNSUPPORTED, || {
            format!("gated form {} is not one the kernel takes", form.as_str())
        });
    }
}
