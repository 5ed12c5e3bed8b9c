//! `patch_embed` of the `cpu_reference` backend: the patch embedding of a Vision
//! Transformer (Hugging Face `ViTPatchEmbeddings`, a Conv2d with kernel = stride = P),
//! every output an f64 sum over (c, u, v) in that order, rounded once to the image's dtype.
//! The image is read through its shape and strides in either layout: NCHW (the default) or
//! NHWC.

use std::sync::Arc;

use crate::exec::args::{OpArgs, Outputs, PatchEmbedArgs};
use crate::exec::executor::{KernelError, Registry};
use crate::model::layout::Layout;
use crate::model::op::Op;
use crate::tensor::HostTensor;

use super::linear::{check_bias, expect_dense_float};
use super::{expect_rank, from_f64_as, invalid, wrong_op};

/// Patch embedding kernel id.
pub const PATCH_EMBED: &str = "cpu_reference.patch_embed.naive";

/// Binds this kernel.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        PATCH_EMBED,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::PatchEmbed(a) => patch_embed(a).map(|t| Outputs::from([("out", t)])),
            other => Err(wrong_op(PATCH_EMBED, Op::PatchEmbed, other)),
        }),
    );
}

/// The checked geometry of a patch embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Patches {
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
    pub(crate) fn across(&self) -> usize {
        self.w / self.p
    }

    /// Patches per image, N = (H / P) * (W / P).
    pub(crate) fn n(&self) -> usize {
        (self.h / self.p) * self.across()
    }

    /// The output shape [B, N, D].
    pub(crate) fn out_shape(&self) -> [usize; 3] {
        [self.b, self.n(), self.d]
    }

    /// The image's strides as (b, c, h, w), whatever its layout.
    pub(crate) fn bchw_strides(&self, image: &HostTensor) -> [usize; 4] {
        let s = image.strides();
        if self.nhwc { [s[0], s[3], s[1], s[2]] } else { [s[0], s[1], s[2], s[3]] }
    }
}

/// Checks a patch embedding's tensors and attributes (the rules every kernel of the op
/// shares): returns its geometry, or an error naming the tensor or attribute and the values.
pub(crate) fn patch_dims(a: &PatchEmbedArgs) -> Result<Patches, KernelError> {
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

/// `patch_embed` in f64, rounded once to the image's dtype.
pub fn patch_embed(a: &PatchEmbedArgs) -> Result<HostTensor, KernelError> {
    let g = patch_dims(a)?;
    let (c, h, w, p, d) = (g.c, g.h, g.w, g.p, g.d);
    let img = a.image.to_f64_vec();
    let wt = a.weight.to_f64_vec();
    let bias = a.bias.as_ref().map(HostTensor::to_f64_vec);
    // Logical (row-major) index of pixel (b, ch, y, x) in either layout.
    let pixel = |b: usize, ch: usize, y: usize, x: usize| {
        if g.nhwc { img[((b * h + y) * w + x) * c + ch] } else { img[((b * c + ch) * h + y) * w + x] }
    };
    let (n, across) = (g.n(), g.across());
    let mut out = vec![0.0f64; g.b * n * d];
    for b in 0..g.b {
        for patch in 0..n {
            let (i, j) = (patch / across, patch % across);
            for (o, row) in out[(b * n + patch) * d..][..d].iter_mut().enumerate() {
                let mut acc = 0.0f64;
                for ch in 0..c {
                    for u in 0..p {
                        for v in 0..p {
                            acc += wt[((o * c + ch) * p + u) * p + v] * pixel(b, ch, i * p + u, j * p + v);
                        }
                    }
                }
                *row = acc + bias.as_ref().map_or(0.0, |bv| bv[o]);
            }
        }
    }
    from_f64_as(a.image.dtype(), &g.out_shape(), &out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attrs::PatchEmbedAttrs;
    use crate::model::dtype::DType;

    fn args(image: HostTensor, weight: HostTensor, bias: Option<HostTensor>, patch: u64) -> PatchEmbedArgs {
        PatchEmbedArgs { image, weight, bias, attrs: PatchEmbedAttrs { patch } }
    }

    #[test]
    fn a_hand_computed_two_by_two_patch_embedding() {
        // One channel, a 2x4 image, P = 2: two patches, D = 2 (sum, and top-left minus
        // bottom-right, plus bias).
        let image = HostTensor::from_f32(&[1, 1, 2, 4], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]).unwrap();
        let weight = HostTensor::from_f32(&[2, 1, 2, 2], vec![1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, -1.0]).unwrap();
        let bias = HostTensor::from_f32(&[2], vec![0.5, -0.5]).unwrap();
        let out = patch_embed(&args(image.clone(), weight.clone(), Some(bias), 2)).unwrap();
        assert_eq!(out.shape(), &[1, 2, 2]);
        // Patch 0 holds 1, 2, 5, 6; patch 1 holds 3, 4, 7, 8.
        assert_eq!(out.to_f32_vec(), vec![14.5, -5.5, 22.5, -5.5]);
        // The same image channels-last gives the same result.
        let nhwc = image.permute(&[0, 2, 3, 1]).unwrap().with_layout(Layout::Nhwc);
        let out = patch_embed(&args(nhwc, weight, None, 2)).unwrap();
        assert_eq!(out.to_f32_vec(), vec![14.0, -5.0, 22.0, -5.0]);
    }

    #[test]
    fn bad_geometry_is_refused_naming_the_tensor_and_the_values() {
        let w = |c: usize, p: usize| HostTensor::zeros(DType::F32, &[4, c, p, p]).unwrap();
        let image = HostTensor::zeros(DType::F32, &[1, 3, 30, 32]).unwrap();
        let err = |a: PatchEmbedArgs| match patch_embed(&a) {
            Err(KernelError::InvalidInput(m)) => m,
            other => panic!("expected an invalid input, got {other:?}"),
        };
        let m = err(args(image.clone(), w(3, 8), None, 8));
        assert!(m.contains("tensor `image` has height 30, not a multiple of attrs.patch 8"), "{m}");
        let m = err(args(image.clone(), w(1, 2), None, 2));
        assert!(m.contains("1 input channels") && m.contains("has 3"), "{m}");
        assert!(err(args(image.clone(), w(3, 2), None, 0)).contains("attrs.patch is 0"));
        assert!(err(args(image.clone(), w(3, 4), None, 2)).contains("a 4x4 kernel; attrs.patch is 2"));
        let bias = HostTensor::zeros(DType::F32, &[5]).unwrap();
        assert!(err(args(image, w(3, 2), Some(bias), 2)).contains("tensor `bias`"));
        let flat = HostTensor::zeros(DType::F32, &[3, 32, 32]).unwrap();
        assert!(err(args(flat, w(3, 2), None, 2)).contains("tensor `image` has shape [3, 32, 32] (rank 3)"));
    }
}
