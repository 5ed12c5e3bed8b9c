//! `patch_embed`: an image in NCHW or NHWC cut into P x P patches, each projected to D.

use super::validator::Validator;
use super::{Dims, Problem, layout_of};
use crate::model::attrs::Attrs;
use crate::model::dtype::DType;
use crate::model::layout::Layout;

impl Problem {
    pub(super) fn patch_embed(v: &mut Validator<'_>) -> (DType, Dims) {
        let image = v.ranked("image", 4);
        let weight = v.ranked("weight", 4);
        let dtype = image.map(|t| t.dtype).unwrap_or(DType::F32);
        let (Some(image), Some(weight), Attrs::PatchEmbed(a)) = (image, weight, &v.req.attrs) else {
            return (dtype, Dims::None);
        };
        let s = &image.shape;
        let layout = layout_of(v.req.op, "image", image).unwrap_or(Layout::Nchw);
        let [b, c, h, w] = match layout {
            Layout::Nhwc => [s[0], s[3], s[1], s[2]],
            Layout::Nchw => [s[0], s[1], s[2], s[3]],
            other => {
                v.err(format!("tensor `image` has layout {other}; patch_embed accepts NCHW (the default) or NHWC"));
                return (dtype, Dims::None);
            }
        };
        let floats = [DType::F32, DType::F16, DType::BF16];
        if !(v.dtype_in("image", image, &floats) & v.dtype_in("weight", weight, &floats)) {
            return (dtype, Dims::None);
        }
        for name in ["weight", "bias"] {
            if let Some(l) = v.tensor(name).and_then(|t| t.layout) {
                v.err(format!("tensor `{name}` has layout {l}; patch_embed's {name} takes no layout tag"));
            }
        }
        for (what, n) in [("image channels", c), ("image height", h), ("image width", w)] {
            v.positive(what, n);
        }
        let p = a.patch;
        let [d, wc, kh, kw] = [weight.shape[0], weight.shape[1], weight.shape[2], weight.shape[3]];
        v.positive("weight out channels", d);
        if wc != c {
            v.err(format!(
                "tensor `weight` has {wc} input channels (shape {:?}); tensor `image` has {c} ({layout} shape {s:?})",
                weight.shape
            ));
        }
        if (kh, kw) != (p, p) {
            v.err(format!("tensor `weight` has a {kh}x{kw} kernel (shape {:?}); attrs.patch is {p}", weight.shape));
        }
        if p > 0 {
            for (what, n) in [("height", h), ("width", w)] {
                if n % p != 0 {
                    v.err(format!("tensor `image` has {what} {n}, not a multiple of attrs.patch {p}"));
                }
            }
        }
        if let Some(bias) = v.tensor("bias")
            && bias.shape != [d]
        {
            v.err(format!("tensor `bias` shape {:?} must be [{d}] (weight's out channels)", bias.shape));
        }
        let patches = h.checked_div(p).zip(w.checked_div(p)).map_or(0, |(rows, cols)| rows.saturating_mul(cols));
        let m = b.saturating_mul(patches);
        let k = c.saturating_mul(p).saturating_mul(p);
        (dtype, Dims::Gemm { m, n: d, k })
    }
}
