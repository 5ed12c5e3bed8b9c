//! `patch_embed` of the `cpu` backend: im2col and one GEMM.
//!
//! Channels-last images only (NHWC; its capability file says so, and selection copies an
//! NCHW image to NHWC first, as a planned transform): a patch's row u is then P * C
//! contiguous values, so gathering the patches into a `[B * N, P * P * C]` matrix in
//! (u, v, c) order is P contiguous copies per patch (widened to f32 for f16/bf16). The
//! weight `[D, C, P, P]` is reordered once per call into `[D, P * P * C]` in the same order,
//! and the crate's GEMM driver (`gemm::sgemm`: the cache-blocked packed GEMM on AVX2 and
//! AVX-512, `matrixmultiply` elsewhere) writes `[B * N, D]`, which is the output `[B, N, D]`,
//! over the bias. f32 accumulation, rounded once to the image's dtype.

use std::sync::Arc;

use rayon::prelude::*;

use super::alloc::{Out, with_scratch};
use super::gemm::{F32View, sgemm};
use super::pack::{f32_cow, read_f32};
use super::rows::{Elem, by_dtype};
use super::split::worth_splitting;
use super::wrong_op;
use layerzero_core::exec::args::{OpArgs, Outputs, PatchEmbedArgs};
use layerzero_core::exec::check::Patches;
use layerzero_core::exec::executor::{KernelError, Registry, WritesInto};

/// Patch embedding kernel id.
pub(super) const PATCH_EMBED: &str = "cpu.patch_embed.im2col";

/// Binds this kernel.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        PATCH_EMBED,
        Arc::new(WritesInto(|args: &OpArgs, bufs: &mut Outputs| match args {
            OpArgs::PatchEmbed(a) => patch_embed_into(a, bufs),
            other => Err(wrong_op(PATCH_EMBED, other)),
        })),
    );
}

/// `patch_embed` into the caller's `out` where it fits.
pub(super) fn patch_embed_into(a: &PatchEmbedArgs, bufs: &mut Outputs) -> Result<Outputs, KernelError> {
    // What makes the arguments valid is defined once, in the core (`PatchEmbedArgs::patches`).
    let g = a.patches()?;
    if !g.nhwc {
        return Err(KernelError::Unsupported(format!(
            "{PATCH_EMBED} takes channels-last (NHWC) images; tensor `image` is NCHW {:?} (selection plans the \
             copy to NHWC)",
            a.image.shape()
        )));
    }
    let (m, k, d) = (g.b * g.n(), g.p * g.p * g.c, g.d);
    let weight = f32_cow(&a.weight);
    with_scratch(m * k + d * k + if a.bias.is_some() { d } else { 0 }, |scratch: &mut [f32]| {
        let (patches, rest) = scratch.split_at_mut(m * k);
        let (w, bbuf) = rest.split_at_mut(d * k);
        gather(a, &g, patches);
        reorder(&weight, &g, w);
        let bias = a.bias.as_ref().map(|t| super::pack::as_f32(t, bbuf));
        // B = the reordered weight transposed: [K, D], element (r, c) at c * K + r.
        let b = F32View { data: w, off: 0, rows: k, cols: d, rs: 1, cs: k };
        let x = F32View::dense(patches, m, k);
        by_dtype!(a.image.dtype(), PATCH_EMBED, T => {
            let mut out = Out::<T>::take(bufs, "out", m * d);
            T::produce_par(&mut out.v, |c| {
                let beta = match bias {
                    Some(bias) if d > 0 => {
                        c.chunks_mut(d).for_each(|row| row.copy_from_slice(bias));
                        1.0
                    }
                    _ => 0.0,
                };
                sgemm(x, b, beta, c, d)
            })?;
            Ok(Outputs::one("out", out.finish(&g.out_shape())?))
        })
    })
}

/// Gathers the patches of an NHWC image into `dst` (`[B * N, P * P * C]`, (u, v, c) order),
/// on rayon tasks when the copy is worth splitting.
fn gather(a: &PatchEmbedArgs, g: &Patches, dst: &mut [f32]) {
    let (p, c, n, across) = (g.p, g.c, g.n(), g.across());
    let k = p * p * c;
    if k == 0 {
        return;
    }
    let [sb, sc, sh, sw] = g.bchw_strides(&a.image);
    let (st, off) = (a.image.storage(), a.image.offset());
    // A patch row (P pixels of C channels) is one run when channels and pixels are packed.
    let packed = (sc == 1 || c <= 1) && (sw == c || p <= 1);
    let row = |r: usize, out: &mut [f32]| {
        let (b, patch) = (r / n, r % n);
        let (i, j) = (patch / across, patch % across);
        for u in 0..p {
            let base = off + b * sb + (i * p + u) * sh + j * p * sw;
            let line = &mut out[u * p * c..(u + 1) * p * c];
            if packed {
                read_f32(st, base, 1, line);
            } else {
                for (v, px) in line.chunks_mut(c).enumerate() {
                    read_f32(st, base + v * sw, sc, px);
                }
            }
        }
    };
    let elem = a.image.dtype().size_bytes() as usize;
    if worth_splitting(dst.len() * (4 + elem)) {
        dst.par_chunks_mut(k).enumerate().for_each(|(r, out)| row(r, out));
    } else {
        dst.chunks_mut(k).enumerate().for_each(|(r, out)| row(r, out));
    }
}

/// The weight `[D, C, P, P]` (logical order, f32) as `[D, P * P * C]` in (u, v, c) order.
fn reorder(w: &[f32], g: &Patches, dst: &mut [f32]) {
    let (c, p) = (g.c, g.p);
    let k = p * p * c;
    if k == 0 {
        return;
    }
    for (o, row) in dst.chunks_mut(k).enumerate() {
        let src = &w[o * k..(o + 1) * k];
        for ch in 0..c {
            for uv in 0..p * p {
                row[uv * c + ch] = src[ch * p * p + uv];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use layerzero_core::compare::{Category, check_tensors};
    use layerzero_core::model::attrs::PatchEmbedAttrs;
    use layerzero_core::model::dtype::DType;
    use layerzero_core::model::layout::Layout;
    use layerzero_core::tensor::HostTensor;
    use layerzero_core::tensor::rng::Rng;
    use layerzero_reference::patch::patch_embed;

    fn normal(rng: &mut Rng, dtype: DType, shape: &[usize], std: f64) -> TestResult<HostTensor> {
        let v: Vec<f32> = (0..shape.iter().product()).map(|_| (rng.normal() * std) as f32).collect();
        Ok(HostTensor::from_f32_as(dtype, shape, &v)?)
    }

    /// NHWC arguments (a channels-last copy of an NCHW image) and the same image in NCHW.
    fn case(dtype: DType, [b, c, h, w, p, d]: [usize; 6], bias: bool) -> TestResult<[PatchEmbedArgs; 2]> {
        let mut rng = Rng::new((b * 1000 + c * 100 + p * 10 + d) as u64);
        let nchw = normal(&mut rng, dtype, &[b, c, h, w], 1.0)?;
        let weight = normal(&mut rng, dtype, &[d, c, p, p], 0.5 / ((c * p * p) as f64).sqrt())?;
        let bias = bias.then(|| normal(&mut rng, dtype, &[d], 0.5)).transpose()?;
        let nhwc = nchw.permute(&[0, 2, 3, 1])?.contiguous().with_layout(Layout::Nhwc);
        let attrs = PatchEmbedAttrs { patch: p as u64 };
        Ok([
            PatchEmbedArgs { image: nhwc, weight: weight.clone(), bias: bias.clone(), attrs: attrs.clone() },
            PatchEmbedArgs { image: nchw, weight, bias, attrs },
        ])
    }

    #[test]
    fn the_im2col_kernel_equals_the_oracle_for_every_shape_and_dtype() -> TestResult {
        // The table's GEMM tolerance; a 16-bit output may be one step from the oracle's (each
        // is rounded once, from f32 and from f64 sums), which the table allows.
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (b, c, h, w, p, d, bias) in [
                (1, 3, 8, 12, 4, 16, true),
                (2, 3, 8, 12, 4, 20, false),
                (2, 1, 8, 12, 4, 7, true),
                (2, 3, 8, 12, 1, 5, true),
                (1, 1, 8, 12, 1, 3, false),
                (2, 4, 32, 32, 16, 24, true),
            ] {
                let [nhwc, nchw] = case(dtype, [b, c, h, w, p, d], bias)?;
                let what = format!("{dtype} [{b}, {c}, {h}, {w}] P={p} D={d} bias={bias}");
                let want = patch_embed(&nchw)?;
                assert_eq!(want.shape(), &[b, (h / p) * (w / p), d], "{what}");
                let got = patch_embed_into(&nhwc, &mut Outputs::new())?.remove("out").ok_or("no out")?;
                check_tensors(&what, Category::Gemm, &want, &got)?;
            }
        }
        Ok(())
    }

    #[test]
    fn a_strided_channels_last_view_is_gathered_pixel_by_pixel() -> TestResult {
        // Channels-last values viewed from an NCHW buffer: pixels are not packed.
        let [_, nchw] = case(DType::F32, [2, 3, 8, 12, 4, 6], true)?;
        let view =
            PatchEmbedArgs { image: nchw.image.permute(&[0, 2, 3, 1])?.with_layout(Layout::Nhwc), ..nchw.clone() };
        assert!(!view.image.is_contiguous());
        let got = patch_embed_into(&view, &mut Outputs::new())?.remove("out").ok_or("no out")?;
        check_tensors("strided NHWC view", Category::Gemm, &patch_embed(&nchw)?, &got)?;
        Ok(())
    }

    #[test]
    fn an_nchw_image_is_unsupported_here_and_a_caller_buffer_is_reused() -> TestResult {
        let [nhwc, nchw] = case(DType::BF16, [1, 3, 8, 8, 4, 8], false)?;
        assert!(matches!(
            patch_embed_into(&nchw, &mut Outputs::new()),
            Err(KernelError::Unsupported(m)) if m.contains("NHWC")
        ));
        let mut bufs = patch_embed_into(&nhwc, &mut Outputs::new())?;
        let (values, storage) = (bufs["out"].to_f32_vec(), Arc::as_ptr(bufs["out"].storage_arc()));
        let again = patch_embed_into(&nhwc, &mut bufs)?;
        assert_eq!(Arc::as_ptr(again["out"].storage_arc()), storage, "the output was written in place");
        assert_eq!(again["out"].to_f32_vec(), values);
        Ok(())
    }
}
