//! `mlp` of the `cpu` backend: `out = (act(x @ w_gate^T) * (x @ w_up^T)) @ w_down^T`.
//!
//! - `cpu.mlp.chain`: three calls of the GEMM driver's linear (`gemm::linear_f32`) and an
//!   activation pass, materializing the [M, I] gate and up projections.
//! - `cpu.mlp.fused`: tiles over I. For M > `GEMV_MAX_M`, each I-tile of `TILE_I` columns
//!   (and block of at most `BLOCK_M` rows) computes its gate and up tiles with sgemm,
//!   applies the activation, and accumulates the tile's down-projection contribution into
//!   the output (sgemm with beta 1); [M, I] is never materialized. Up to 16 or 32 rows
//!   (`gemm::small_m_max`), gate, up and down run as the small-batch linear's register tiles
//!   instead, each weight read once, no tile packed. For decode, two parallel
//!   sweeps: gate and up over chunks of I (the [M, I] hidden rows live in per-thread scratch),
//!   then the down projection over chunks of H, whole weight rows; each weight streams once,
//!   in order, and every output is one dot product (the same on any thread count). A bf16
//!   model on a CPU with AVX512_BF16 runs both sweeps on bf16 pairs (`vdpbf16ps`), the
//!   hidden rows rounded to bf16 as the unfused chain rounds them.
//!
//! Both compute in f32 with the same activation code (`act_mul`): silu `g / (1 + e^-g)`;
//! gelu_tanh `g / (1 + e^(-2u))` with `u = sqrt(2/pi) (g + 0.044715 g^3)` (equal to
//! `g/2 (1 + tanh u)`, no cancellation); gelu `g/2 * erfc(-g / sqrt 2)` with an erfc of
//! relative error about 1e-7 (Numerical Recipes' `erfcc`), written `g - g/2 erfc(|g|/sqrt 2)`
//! for g >= 0. The output is rounded once to x's dtype.

use std::sync::Arc;

use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::alloc::{Out, with_scratch};
use super::gemm::{
    F32View, GEMV_MAX_M, Mat, PairPanels, Weights, bf16_pair_columns, chunk_size, dots_mat_row, gemm, linear_f32,
    pair_panels, pairs_gemm, rows_view, small_m, small_m_applies, small_m_max, to_tensor, uses_pairs,
};
use super::rows::{Elem, by_dtype};
use super::simd;
use super::wrong_op;
use layerzero_core::exec::args::{MlpArgs, OpArgs, Outputs};
use layerzero_core::exec::executor::{KernelError, Prepares, Registry};
use layerzero_core::model::attrs::Activation;
use layerzero_core::tensor::{Dims, HostTensor, Storage};

/// Unfused MLP kernel id.
pub(super) const CHAIN: &str = "cpu.mlp.chain";
/// Fused MLP kernel id.
pub(super) const FUSED: &str = "cpu.mlp.fused";

/// I columns per tile of the fused kernel (prefill).
const TILE_I: usize = 512;
/// Rows per block of the fused kernel (prefill); the live intermediates are
/// 2 x BLOCK_M x TILE_I floats.
const BLOCK_M: usize = 512;

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        CHAIN,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Mlp(a) => chain(a).map(out),
            other => Err(wrong_op(CHAIN, other)),
        }),
    );
    registry.register(
        FUSED,
        Arc::new(Prepares(
            |args: &OpArgs, bufs: &mut Outputs| match args {
                OpArgs::Mlp(a) => fused_into(a, bufs),
                other => Err(wrong_op(FUSED, other)),
            },
            prepare,
        )),
    );
}

fn out(t: HostTensor) -> Outputs {
    Outputs::from([("out", t)])
}

simd::multiversion! {
    /// `g[i] = act(g[i]) * u[i]`, compiled for the best SIMD level this CPU has.
    fn act_mul(act: Activation, g: &mut [f32], u: &[f32]) => act_mul_impl;
}

#[inline(always)]
fn act_mul_impl(act: Activation, g: &mut [f32], u: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    match act {
        Activation::Silu => {
            for (g, &u) in g.iter_mut().zip(u) {
                *g = *g / (1.0 + simd::exp_approx(-*g)) * u;
            }
        }
        Activation::GeluTanh => {
            for (g, &u) in g.iter_mut().zip(u) {
                let x = *g;
                let t = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
                *g = x / (1.0 + simd::exp_approx(-2.0 * t)) * u;
            }
        }
        Activation::Gelu => {
            for (g, &u) in g.iter_mut().zip(u) {
                let x = *g;
                let e = super::math::erfc_f32(x.abs() * std::f32::consts::FRAC_1_SQRT_2);
                let v = if x >= 0.0 { x - 0.5 * x * e } else { 0.5 * x * e };
                *g = v * u;
            }
        }
    }
}

/// `act_mul` over large buffers, in parallel chunks.
fn act_mul_par(act: Activation, g: &mut [f32], u: &[f32]) {
    const CHUNK: usize = 1 << 14;
    g.par_chunks_mut(CHUNK).zip(u.par_chunks(CHUNK)).for_each(|(g, u)| act_mul(act, g, u));
}

/// The checked views: x as [M, H] rows, w_gate and w_up [I, H], w_down [H, I].
struct Problem<'a> {
    x: Mat<'a>,
    wg: Mat<'a>,
    wu: Mat<'a>,
    wd: Mat<'a>,
    shape: Dims,
}

fn problem<'a>(a: &'a MlpArgs, holder: &'a mut Option<HostTensor>) -> Result<Problem<'a>, KernelError> {
    // What makes MLP arguments valid is defined once, in the core (`MlpArgs::dims`).
    a.dims()?;
    let x = rows_view(&a.x, holder)?;
    Ok(Problem {
        x,
        wg: Mat::of(&a.w_gate),
        wu: Mat::of(&a.w_up),
        wd: Mat::of(&a.w_down),
        shape: Dims::from_slice(a.x.shape()),
    })
}

/// Unfused: gate and up projections [M, I], activation, down projection.
pub(super) fn chain(a: &MlpArgs) -> Result<HostTensor, KernelError> {
    let mut holder = None;
    let p = problem(a, &mut holder)?;
    let (m, i) = (p.x.rows, p.wg.rows);
    let mut gate = linear_f32(&p.x, &Weights::Dense(p.wg.t()), None)?;
    let up = linear_f32(&p.x, &Weights::Dense(p.wu.t()), None)?;
    act_mul_par(a.attrs.activation, &mut gate, &up);
    drop(up);
    let hidden = Storage::F32(gate.into());
    let hm = Mat { st: &hidden, off: 0, rows: m, cols: i, rs: i, cs: 1 };
    let out = linear_f32(&hm, &Weights::Dense(p.wd.t()), None)?;
    to_tensor(a.x.dtype(), &p.shape, out)
}

/// Fused, into new buffers.
#[cfg(test)]
pub(super) fn fused(a: &MlpArgs) -> Result<HostTensor, KernelError> {
    fused_into(a, &mut Outputs::new())?
        .remove("out")
        .ok_or_else(|| KernelError::Failed("mlp produced no output".to_owned()))
}

/// Packs the three weights into pair panels where a prefill of these arguments runs on them.
fn prepare(args: &OpArgs) -> Result<(), KernelError> {
    let OpArgs::Mlp(a) = args else { return Err(wrong_op(FUSED, args)) };
    let mut holder = None;
    let p = problem(a, &mut holder)?;
    if uses_pairs(&p.x) {
        pair_weights(a, &p);
    }
    Ok(())
}

/// The pair panels of the three weights (packed once, cached), when all three are bf16 with
/// contiguous rows.
fn pair_weights(a: &MlpArgs, p: &Problem) -> Option<[Arc<PairPanels>; 3]> {
    Some([pair_panels(&a.w_gate, &p.wg)?, pair_panels(&a.w_up, &p.wu)?, pair_panels(&a.w_down, &p.wd)?])
}

/// Prefill of a bf16 model on bf16 pairs: per block of rows, gate and up against their
/// packed weights, the activation in f32, and the down projection on the hidden rows rounded
/// to bf16, as HF transformers (and the unfused chain) round them. Measured on the tiny bf16
/// model against its float64 truth: the worst prefill stage 7.7e-3 L2-relative rounded,
/// 8.2e-3 with the hidden split into two bf16 parts, which costs twice the products (125M
/// prefill: 2200 tok/s split, 2700 rounded). Decode keeps the split: it is memory-bound.
fn fused_pairs(p: &Problem, act: Activation, x: &[u16], w: &[Arc<PairPanels>; 3]) -> Vec<f32> {
    let (m, h, i) = (p.x.rows, p.x.cols, p.wg.rows);
    let mut out = vec![0f32; m * h];
    let block = BLOCK_M.min(m);
    let (mut g, mut u, mut hb) = (vec![0f32; block * i], vec![0f32; block * i], vec![0u16; block * i]);
    for r0 in (0..m).step_by(BLOCK_M) {
        let mb = BLOCK_M.min(m - r0);
        let rows = &x[r0 * p.x.rs..];
        pairs_gemm(rows, p.x.rs, mb, h, &w[0], &mut g[..mb * i]);
        pairs_gemm(rows, p.x.rs, mb, h, &w[1], &mut u[..mb * i]);
        act_mul_par(act, &mut g[..mb * i], &u[..mb * i]);
        for (b, &v) in hb.iter_mut().zip(&g[..mb * i]) {
            *b = half::bf16::from_f32(v).to_bits();
        }
        pairs_gemm(&hb[..mb * i], i, mb, i, &w[2], &mut out[r0 * h..(r0 + mb) * h]);
    }
    out
}

/// Fused: tiles over I; the [M, I] intermediates are never materialized. Into the caller's
/// `out` where it fits.
pub(super) fn fused_into(a: &MlpArgs, bufs: &mut Outputs) -> Result<Outputs, KernelError> {
    let mut holder = None;
    let p = problem(a, &mut holder)?;
    let (m, h) = (p.x.rows, p.x.cols);
    if m > GEMV_MAX_M {
        if let (true, Storage::BF16(xv)) = (uses_pairs(&p.x), p.x.st)
            && let Some(w) = pair_weights(a, &p)
        {
            let out = fused_pairs(&p, a.attrs.activation, xv[p.x.off..].reinterpret_cast(), &w);
            return Ok(Outputs::one("out", to_tensor(a.x.dtype(), &p.shape, out)?));
        }
        let out = match fused_small(&p, a.attrs.activation) {
            Some(out) => out,
            None => fused_tiled(&p, a.attrs.activation)?,
        };
        return Ok(Outputs::one("out", to_tensor(a.x.dtype(), &p.shape, out)?));
    }
    by_dtype!(a.x.dtype(), FUSED, T => {
        let mut out = Out::<T>::take(bufs, "out", m * h);
        T::produce_par(&mut out.v, |c| {
            if m > 0 && h > 0 {
                fused_decode(&p, a.attrs.activation, c);
            }
            Ok::<(), KernelError>(())
        })?;
        Ok(Outputs::one("out", out.finish(&p.shape)?))
    })
}

/// A few rows (a speculative verification, a batched decode step): gate, up and down as
/// the small-batch linear's register tiles, each weight read in place once (the tiled path
/// packs every tile of them per call); the [M, I] hidden rows are materialized, at most
/// 32 of them. `None` where that linear does not take these weights.
fn fused_small(p: &Problem, act: Activation) -> Option<Vec<f32>> {
    let (m, h, i) = (p.x.rows, p.x.cols, p.wg.rows);
    let [wg, wu, wd] = [&p.wg, &p.wu, &p.wd].map(|w| Weights::Dense(w.t()));
    if !(2..=small_m_max()).contains(&m) || ![&wg, &wu, &wd].into_iter().all(small_m_applies) {
        return None;
    }
    let owned;
    let x = match p.x.as_f32().filter(|v| v.is_dense()) {
        Some(v) => &v.data[v.off..v.off + m * h],
        None => {
            owned = p.x.to_f32();
            &owned[..]
        }
    };
    let (mut gate, mut up, mut out) = (vec![0f32; m * i], vec![0f32; m * i], vec![0f32; m * h]);
    let done = small_m(x, m, &wg, &mut gate) && small_m(x, m, &wu, &mut up) && {
        act_mul_par(act, &mut gate, &up);
        small_m(&gate, m, &wd, &mut out)
    };
    done.then_some(out)
}

fn fused_tiled(p: &Problem, act: Activation) -> Result<Vec<f32>, KernelError> {
    let (m, h, i) = (p.x.rows, p.x.cols, p.wg.rows);
    let owned;
    let xv = match p.x.as_f32() {
        Some(v) => v,
        None => {
            owned = p.x.to_f32();
            F32View::dense(&owned, m, h)
        }
    };
    let mut out = vec![0f32; m * h];
    let mut g = Vec::new();
    let mut u = Vec::new();
    for r0 in (0..m).step_by(BLOCK_M) {
        let mb = BLOCK_M.min(m - r0);
        let xb = xv.rows(r0, mb);
        let ob = &mut out[r0 * h..(r0 + mb) * h];
        for j0 in (0..i).step_by(TILE_I) {
            let ti = TILE_I.min(i - j0);
            g.resize(mb * ti, 0.0);
            u.resize(mb * ti, 0.0);
            gemm(xb, &Weights::Dense(p.wg.rows(j0, ti).t()), 0.0, &mut g, ti)?;
            gemm(xb, &Weights::Dense(p.wu.rows(j0, ti).t()), 0.0, &mut u, ti)?;
            act_mul_par(act, &mut g, &u);
            let beta = if j0 == 0 { 0.0 } else { 1.0 };
            gemm(F32View::dense(&g, mb, ti), &Weights::Dense(p.wd.cols(j0, ti).t()), beta, ob, h)?;
        }
    }
    Ok(out)
}

/// The fused decode MLP into `out` ([M, H], zeros). Nothing is allocated once the
/// threads' scratch is warm: x, the tiles' partial sums and each tile's temporaries live
/// there.
fn fused_decode(p: &Problem, act: Activation, out: &mut [f32]) {
    let (m, h) = (p.x.rows, p.x.cols);
    if fused_decode_bf16(p, act, out) {
        return;
    }
    match p.x.as_f32().filter(|v| v.is_dense()) {
        Some(v) => fused_decode_x(p, act, &v.data[v.off..v.off + m * h], out),
        None => with_scratch(m * h, |x| {
            p.x.read_into(x);
            fused_decode_x(p, act, x, out);
        }),
    }
    // Two parallel sweeps: gate and up over chunks of I ([I, m], one weight row dotted with
    // every x row, then act(g) * u), then the down projection over chunks of H with whole
    // weight rows: each weight streams once, in order (tiles over I read w_down in short
    // strided segments, measured 10% slower on the 125M model's decode step).
    fn fused_decode_x(p: &Problem, act: Activation, x: &[f32], out: &mut [f32]) {
        let (m, h, i) = (p.x.rows, p.x.cols, p.wg.rows);
        with_scratch(3 * i * m + h * m, |buf| {
            let (g, rest) = buf.split_at_mut(i * m);
            let (u, rest) = rest.split_at_mut(i * m);
            let (hid, img) = rest.split_at_mut(i * m);
            let size = chunk_size(i, 16);
            crate::team::chunks2_mut(g, u, size * m, |c, gp, up| {
                with_scratch(h, |scratch| {
                    for (w, dst) in [(&p.wg, &mut *gp), (&p.wu, &mut *up)] {
                        for (j, o) in dst.chunks_exact_mut(m).enumerate() {
                            dots_mat_row(x, w, c * size + j, scratch, o);
                        }
                    }
                });
                act_mul(act, gp, up);
            });
            // The hidden rows [m, I].
            for j in 0..i {
                for r in 0..m {
                    hid[r * i + j] = g[j * m + r];
                }
            }
            let hid: &[f32] = hid;
            let size = chunk_size(h, 16);
            let dst = if m == 1 { &mut out[..h] } else { &mut img[..h * m] };
            crate::team::chunks_mut(dst, size * m, |c, part| {
                with_scratch(i, |scratch| {
                    for (j, o) in part.chunks_exact_mut(m).enumerate() {
                        dots_mat_row(hid, &p.wd, c * size + j, scratch, o);
                    }
                });
            });
            if m > 1 {
                for c in 0..h {
                    for r in 0..m {
                        out[r * h + c] = img[c * m + r];
                    }
                }
            }
        });
    }
}

/// The decode MLP of a bf16 model on bf16 pairs (`vdpbf16ps`), when x and the three
/// weights are bf16 with contiguous rows and the CPU has AVX512_BF16; `false` otherwise
/// (nothing written). Two parallel sweeps: gate and up over chunks of I, then the down
/// projection over chunks of H with whole weight rows (each weight streams once, in order).
/// The activation runs in f32, and the hidden row enters the down projection split into two
/// bf16 parts (about 16 significant bits; rounding it to bf16 put the tiny bf16 model's
/// logits past 1e-2 of the float64 truth).
fn fused_decode_bf16(p: &Problem, act: Activation, out: &mut [f32]) -> bool {
    let (m, h, i) = (p.x.rows, p.x.cols, p.wg.rows);
    let rows_ok = |w: &Mat| matches!(w.st, Storage::BF16(_)) && (w.cs == 1 || w.cols <= 1);
    let xb = match p.x.st {
        Storage::BF16(v) if p.x.cs == 1 && (p.x.rs == h || m == 1) => v.get(p.x.off..p.x.off + m * h),
        _ => None,
    };
    let Some(xb) = xb else { return false };
    if !(simd::avx512_bf16() && rows_ok(&p.wg) && rows_ok(&p.wu) && rows_ok(&p.wd)) || m == 0 || h == 0 || i == 0 {
        return false;
    }
    let xb: &[u16] = xb.reinterpret_cast();
    with_scratch(3 * i * m + h * m, |buf: &mut [f32]| {
        let (g, rest) = buf.split_at_mut(i * m);
        let (u, rest) = rest.split_at_mut(i * m);
        let (hb, img) = rest.split_at_mut(i * m);
        // Gate and up, [I, m] (one weight row dotted with every x row), then act(g) * u.
        let size = chunk_size(i, 16);
        crate::team::chunks2_mut(g, u, size * m, |c, gp, up| {
            bf16_pair_columns(xb, None, m, &p.wg, c * size, gp);
            bf16_pair_columns(xb, None, m, &p.wu, c * size, up);
            act_mul(act, gp, up);
        });
        // The hidden rows [m, I] (in `u`, free now), split into two bf16 parts.
        for j in 0..i {
            for r in 0..m {
                u[r * i + j] = g[j * m + r];
            }
        }
        let (hi, lo) = bytemuck::cast_slice_mut::<f32, u16>(hb).split_at_mut(i * m);
        simd::split_bf16(u, hi, lo);
        let (hi, lo): (&[u16], &[u16]) = (hi, lo);
        // Down: whole rows of w_down, [H, m], written straight into `out` for one row.
        let size = chunk_size(h, 16);
        let dst = if m == 1 { &mut out[..h] } else { &mut img[..h * m] };
        crate::team::chunks_mut(dst, size * m, |c, part| {
            bf16_pair_columns(hi, Some(lo), m, &p.wd, c * size, part);
        });
        if m > 1 {
            for c in 0..h {
                for r in 0..m {
                    out[r * h + c] = img[c * m + r];
                }
            }
        }
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::linear::tests::assert_gemm_close;
    use layerzero_core::exec::args::strided_copy;
    use layerzero_core::model::attrs::MlpAttrs;
    use layerzero_core::model::dtype::DType;
    use layerzero_reference as cpu_reference;
    use layerzero_reference::test_util::values;

    fn t(shape: &[usize], seed: u64, dtype: DType, scale: f32) -> TestResult<HostTensor> {
        let n = shape.iter().product();
        let v: Vec<f32> = values(n, seed).iter().map(|v| v * scale).collect();
        Ok(HostTensor::from_f32_as(dtype, shape, &v)?)
    }

    fn args(m: usize, h: usize, i: usize, dtype: DType, act: Activation) -> TestResult<MlpArgs> {
        Ok(MlpArgs {
            x: t(&[m, h], 1, dtype, 2.0)?,
            w_gate: t(&[i, h], 2, dtype, 0.3)?,
            w_up: t(&[i, h], 3, dtype, 0.3)?,
            w_down: t(&[h, i], 4, dtype, 0.3)?,
            attrs: MlpAttrs { activation: act },
        })
    }

    fn reference(a: &MlpArgs) -> TestResult<HostTensor> {
        let mut r = Registry::new();
        cpu_reference::register(&mut r);
        Ok(r.get("cpu_reference.mlp.naive")
            .ok_or("cpu_reference.mlp.naive is not registered")?
            .run(&OpArgs::Mlp(a.clone()))?
            .remove("out")
            .ok_or("no out")?)
    }

    #[test]
    fn activation_matches_the_f64_definitions() -> TestResult {
        let xs: Vec<f32> = (-4000..=4000).map(|v| v as f32 / 400.0).collect();
        for act in [Activation::Silu, Activation::Gelu, Activation::GeluTanh] {
            let mut g = xs.clone();
            act_mul(act, &mut g, &vec![1.0; xs.len()]);
            for (&x, &y) in xs.iter().zip(&g) {
                let want = match act {
                    Activation::Silu => f64::from(x) / (1.0 + (-f64::from(x)).exp()),
                    Activation::Gelu => {
                        // erf through the f64 reference: [x, 1] with gate = x, up = 1.
                        let mlp = MlpArgs {
                            x: HostTensor::from_f32(&[1, 2], vec![x, 1.0])?,
                            w_gate: HostTensor::from_f32(&[1, 2], vec![1.0, 0.0])?,
                            w_up: HostTensor::from_f32(&[1, 2], vec![0.0, 1.0])?,
                            w_down: HostTensor::from_f32(&[2, 1], vec![1.0, 0.0])?,
                            attrs: MlpAttrs { activation: act },
                        };
                        f64::from(reference(&mlp)?.to_f32_vec()[0])
                    }
                    Activation::GeluTanh => {
                        let x = f64::from(x);
                        0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
                    }
                };
                let err = (f64::from(y) - want).abs();
                assert!(err <= 1e-6 * want.abs() + 1e-7, "{act:?}({x}) = {y}, want {want}");
            }
        }
        Ok(())
    }

    #[test]
    fn chain_fused_and_reference_agree() -> TestResult {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for act in [Activation::Silu, Activation::Gelu, Activation::GeluTanh] {
                for (m, h, i) in [
                    (1usize, 48usize, 80usize),
                    (3, 17, 300),
                    (5, 48, 80),
                    (17, 48, 80),
                    (32, 33, 70),
                    (130, 64, 520),
                    (9, 5, 7),
                ] {
                    let a = args(m, h, i, dtype, act)?;
                    let want = reference(&a)?;
                    let c = chain(&a)?;
                    let f = fused(&a)?;
                    let what = format!("{dtype} {act:?} m{m} h{h} i{i}");
                    // |hidden| ~ |x| |w| sqrt(H) (<= 1 here), summed over I.
                    assert_gemm_close(&c, &want, i, 1.0, &format!("chain {what}"));
                    assert_gemm_close(&f, &want, i, 1.0, &format!("fused {what}"));
                    assert_gemm_close(&f, &c, i, 1.0, &format!("fused vs chain {what}"));
                }
            }
        }
        Ok(())
    }

    #[test]
    fn strided_inputs_and_shape_errors() -> TestResult {
        let mut a = args(6, 20, 33, DType::F32, Activation::Silu)?;
        let want = reference(&a)?;
        a.x = a.x.permute(&[1, 0])?.contiguous().permute(&[1, 0])?;
        a.w_down = strided_copy(&a.w_down, &[40, 1])?;
        for r in [chain(&a)?, fused(&a)?] {
            assert_gemm_close(&r, &want, 33, 1.0, "strided");
        }
        let mut x3 = args(6, 20, 33, DType::F32, Activation::Gelu)?;
        x3.x = t(&[2, 3, 20], 9, DType::F32, 1.0)?;
        let w3 = reference(&x3)?;
        assert_eq!(w3.shape(), &[2, 3, 20]);
        assert_gemm_close(&fused(&x3)?, &w3, 33, 1.0, "3-D x");
        let mut bad = args(2, 4, 3, DType::F32, Activation::Silu)?;
        bad.w_up = t(&[3, 5], 1, DType::F32, 1.0)?;
        for f in [chain, fused] {
            assert!(
                matches!(f(&bad), Err(KernelError::InvalidInput(m)) if m.contains("`w_up`") && m.contains("[3, 4]"))
            );
        }
        let mut r = Registry::new();
        register(&mut r);
        let lin = OpArgs::Linear(layerzero_core::exec::args::LinearArgs {
            x: t(&[1, 2], 1, DType::F32, 1.0)?,
            weight: t(&[1, 2], 1, DType::F32, 1.0)?,
            bias: None,
            attrs: layerzero_core::model::attrs::NoAttrs {},
        });
        assert!(matches!(r.get(FUSED).ok_or("fused is not registered")?.run(&lin), Err(KernelError::Unsupported(_))));
        assert!(matches!(r.get(CHAIN).ok_or("chain is not registered")?.run(&lin), Err(KernelError::Unsupported(_))));
        Ok(())
    }
}
