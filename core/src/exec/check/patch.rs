//! Patch embeddings: the image, the weight and the patch size.

use super::{check_bias, expect_dense_float, expect_rank, invalid};
use crate::exec::args::PatchEmbedArgs;
use crate::exec::executor::KernelError;
use crate::model::layout::Layout;
use crate::tensor::HostTensor;

/// The checked geometry of a patch embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patches {
    /// The image is channels-last ([B, H, W, C]); otherwise [B, C, H, W].
    pub nhwc: bool,
    /// Batch.
    pub b: usize,
    /// Channels.
    pub c: usize,
    /// Height.
    pub h: usize,
    /// Width.
    pub w: usize,
    /// Patch side.
    pub p: usize,
    /// Embedding width (the weight's out channels).
    pub d: usize,
}

impl Patches {
    /// Patches per image row (W / P).
    pub fn across(&self) -> usize {
        self.w / self.p
    }

    /// Patches per image, N = (H / P) * (W / P).
    pub fn n(&self) -> usize {
        (self.h / self.p) * self.across()
    }

    /// The output shape [B, N, D].
    pub fn out_shape(&self) -> [usize; 3] {
        [self.b, self.n(), self.d]
    }

    /// The image's strides as (b, c, h, w), whatever its layout.
    pub fn bchw_strides(&self, image: &HostTensor) -> [usize; 4] {
        let s = image.strides();
        if self.nhwc { [s[0], s[3], s[1], s[2]] } else { [s[0], s[1], s[2], s[3]] }
    }
}

impl PatchEmbedArgs {
    /// Checks a patch embedding's tensors and attributes (the rules every kernel of the op
    /// shares): returns its geometry, or an error naming the tensor or attribute and the values.
    pub fn patches(&self) -> Result<Patches, KernelError> {
        let a = self;
        expect_dense_float("image", &a.image)?;
        expect_dense_float("weight", &a.weight)?;
        let nhwc = match a.image.layout() {
            None | Some(Layout::Nchw) => false,
            Some(Layout::Nhwc) => true,
            Some(other) => {
                return Err(invalid(format!(
                    "tensor `image` has layout {other}; expected NCHW ([B, C, H, W], the default) or NHWC ([B, H, W, C])"
                )));
            }
        };
        let what = if nhwc { "rank 4 [B, H, W, C] (NHWC)" } else { "rank 4 [B, C, H, W] (NCHW)" };
        expect_rank("image", &a.image, 4, what)?;
        expect_rank("weight", &a.weight, 4, "rank 4 [D, C, P, P]")?;
        let s = a.image.shape();
        let (b, c, h, w) = if nhwc { (s[0], s[3], s[1], s[2]) } else { (s[0], s[1], s[2], s[3]) };
        let p = usize::try_from(a.attrs.patch).unwrap_or(usize::MAX);
        if p == 0 {
            return Err(invalid("attrs.patch is 0; it must be at least 1"));
        }
        let &[d, wc, kh, kw] = a.weight.shape() else {
            return Err(invalid(format!("tensor `weight` has shape {:?}; expected [D, C, P, P]", a.weight.shape())));
        };
        if wc != c {
            return Err(invalid(format!(
                "tensor `weight` has shape {:?}: {wc} input channels; tensor `image` has {c} ({} shape {s:?})",
                a.weight.shape(),
                if nhwc { "NHWC" } else { "NCHW" }
            )));
        }
        if (kh, kw) != (p, p) {
            return Err(invalid(format!(
                "tensor `weight` has shape {:?}: a {kh}x{kw} kernel; attrs.patch is {p}",
                a.weight.shape()
            )));
        }
        for (name, n) in [("height", h), ("width", w)] {
            if n % p != 0 {
                return Err(invalid(format!("tensor `image` has {name} {n}, not a multiple of attrs.patch {p}")));
            }
        }
        check_bias(a.bias.as_ref(), d)?;
        let g = Patches { nhwc, b, c, h, w, p, d };
        let rows = (h / p).checked_mul(w / p).and_then(|n| n.checked_mul(b));
        let k = c.checked_mul(p).and_then(|x| x.checked_mul(p));
        match (rows.and_then(|m| m.checked_mul(d)), rows.zip(k).and_then(|(m, k)| m.checked_mul(k))) {
            (Some(_), Some(_)) => Ok(g),
            _ => Err(invalid(format!("tensor `image` {s:?} with attrs.patch {p} and D = {d} overflows"))),
        }
    }
}
