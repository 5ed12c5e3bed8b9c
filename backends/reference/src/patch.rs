//! `patch_embed` of the `cpu_reference` backend: the patch embedding of a Vision
//! Transformer (Hugging Face `ViTPatchEmbeddings`, a Conv2d with kernel = stride = P),
//! every output an f64 sum over (c, u, v) in that order, rounded once to the image's dtype.
//! The image is read through its shape and strides in either layout: NCHW (the default) or
//! NHWC.

use std::sync::Arc;

use layerzero_core::exec::args::{OpArgs, Outputs, PatchEmbedArgs};
use layerzero_core::exec::executor::{KernelError, Registry};
use layerzero_core::model::op::Op;
use layerzero_core::tensor::HostTensor;

use super::{from_f64_as, wrong_op};

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

/// `patch_embed` in f64, rounded once to the image's dtype.
pub fn patch_embed(a: &PatchEmbedArgs) -> Result<HostTensor, KernelError> {
    let g = a.patches()?;
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
    use crate::TestResult;
    use layerzero_core::model::attrs::PatchEmbedAttrs;
    use layerzero_core::model::dtype::DType;
    use layerzero_core::model::layout::Layout;

    fn args(image: HostTensor, weight: HostTensor, bias: Option<HostTensor>, patch: u64) -> PatchEmbedArgs {
        PatchEmbedArgs { image, weight, bias, attrs: PatchEmbedAttrs { patch } }
    }

    #[test]
    fn a_hand_computed_two_by_two_patch_embedding() -> TestResult {
        // One channel, a 2x4 image, P = 2: two patches, D = 2 (sum, and top-left minus
        // bottom-right, plus bias).
        let image = HostTensor::from_f32(&[1, 1, 2, 4], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])?;
        let weight = HostTensor::from_f32(&[2, 1, 2, 2], vec![1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, -1.0])?;
        let bias = HostTensor::from_f32(&[2], vec![0.5, -0.5])?;
        let out = patch_embed(&args(image.clone(), weight.clone(), Some(bias), 2))?;
        assert_eq!(out.shape(), &[1, 2, 2]);
        // Patch 0 holds 1, 2, 5, 6; patch 1 holds 3, 4, 7, 8.
        assert_eq!(out.to_f32_vec(), vec![14.5, -5.5, 22.5, -5.5]);
        // The same image channels-last gives the same result.
        let nhwc = image.permute(&[0, 2, 3, 1])?.with_layout(Layout::Nhwc);
        let out = patch_embed(&args(nhwc, weight, None, 2))?;
        assert_eq!(out.to_f32_vec(), vec![14.0, -5.0, 22.0, -5.0]);
        Ok(())
    }

    #[test]
    fn bad_geometry_is_refused_naming_the_tensor_and_the_values() -> TestResult {
        let w = |c: usize, p: usize| -> TestResult<_> { Ok(HostTensor::zeros(DType::F32, &[4, c, p, p])?) };
        let image = HostTensor::zeros(DType::F32, &[1, 3, 30, 32])?;
        let err = |a: PatchEmbedArgs| match patch_embed(&a) {
            Err(KernelError::InvalidInput(m)) => m,
            other => panic!("expected an invalid input, got {other:?}"),
        };
        let m = err(args(image.clone(), w(3, 8)?, None, 8));
        assert!(m.contains("tensor `image` has height 30, not a multiple of attrs.patch 8"), "{m}");
        let m = err(args(image.clone(), w(1, 2)?, None, 2));
        assert!(m.contains("1 input channels") && m.contains("has 3"), "{m}");
        assert!(err(args(image.clone(), w(3, 2)?, None, 0)).contains("attrs.patch is 0"));
        assert!(err(args(image.clone(), w(3, 4)?, None, 2)).contains("a 4x4 kernel; attrs.patch is 2"));
        let bias = HostTensor::zeros(DType::F32, &[5])?;
        assert!(err(args(image, w(3, 2)?, Some(bias), 2)).contains("tensor `bias`"));
        let flat = HostTensor::zeros(DType::F32, &[3, 32, 32])?;
        assert!(err(args(flat, w(3, 2)?, None, 2)).contains("tensor `image` has shape [3, 32, 32] (rank 3)"));
        Ok(())
    }
}
