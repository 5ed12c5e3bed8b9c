//! `cpu.swiglu.fast`, `cpu.geglu.fast`, `cpu.gelu.fast`, `cpu.silu.fast`: one pass over the
//! inputs in chunks of `CH` elements (f32 contiguous inputs borrowed in place, others
//! converted into stack buffers), f32 math, one write in the input dtype, rayon over
//! blocks of the output.
//!
//! Every activation is written around one `exp` per element, done by the backend's
//! vectorized `simd::exp_sub_sum` (AVX-512/AVX2 when present):
//! `silu(x) = x / (1 + exp(-x))`, tanh-GELU `= x / (1 + exp(-2u))` with
//! `u = sqrt(2/pi) (x + 0.044715 x^3)` (the same value as `0.5 x (1 + tanh u)` without
//! cancellation), and erf-GELU `= 0.5 x erfc(-x / sqrt 2)` with the `erfc` of `math`
//! (Numerical Recipes' Chebyshev fit; its exponent, `math::erfc_arg`, goes through the same
//! `exp`).

use std::sync::Arc;

use layerzero_core::exec::args::{GegluArgs, GeluArgs, OpArgs, Outputs, SiluArgs};
use layerzero_core::exec::executor::{KernelError, Registry, WritesInto};
use layerzero_core::model::attrs::GeluApproximate;
use layerzero_core::tensor::HostTensor;

use super::alloc::Out;
use super::math::erfc_arg;
use super::pack::invalid;
use super::rows::{Elem, View, by_dtype, expect_float, fill, fill_into, tensor};
use super::{simd, wrong_op};

/// SwiGLU kernel id.
pub const SWIGLU: &str = "cpu.swiglu.fast";
/// GeGLU kernel id.
pub const GEGLU: &str = "cpu.geglu.fast";
/// GELU kernel id.
pub const GELU: &str = "cpu.gelu.fast";
/// SiLU kernel id.
pub const SILU: &str = "cpu.silu.fast";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        SWIGLU,
        Arc::new(WritesInto(|args: &OpArgs, bufs: &mut Outputs| match args {
            OpArgs::Swiglu(a) => {
                let operands = (a.x.as_ref(), a.gate.as_ref(), a.up.as_ref());
                gated(SWIGLU, "swiglu", a.attrs.split, operands, Act::Silu, bufs)
            }
            other => Err(wrong_op(SWIGLU, other)),
        })),
    );
    registry.register(
        GEGLU,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Geglu(a) => geglu(a),
            other => Err(wrong_op(GEGLU, other)),
        }),
    );
    registry.register(
        GELU,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Gelu(a) => gelu(a),
            other => Err(wrong_op(GELU, other)),
        }),
    );
    registry.register(
        SILU,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Silu(a) => silu(a),
            other => Err(wrong_op(SILU, other)),
        }),
    );
}

/// Elements per inner chunk (the stack buffers).
const CH: usize = 512;

/// The activation of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Act {
    /// `x * sigmoid(x)`.
    Silu,
    /// `0.5 x (1 + erf(x / sqrt 2))`.
    GeluErf,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    GeluTanh,
}

impl Act {
    fn gelu(a: GeluApproximate) -> Act {
        match a {
            GeluApproximate::None => Act::GeluErf,
            GeluApproximate::Tanh => Act::GeluTanh,
        }
    }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// `out[i] = act(g[i])`, or `act(g[i]) * u[i]` when `u` is given (g and u at least as long
/// as `out`).
#[cfg_attr(not(test), allow(dead_code))] // a slice API for other kernels; the kernels here use `apply_chunk`
pub(crate) fn apply(act: Act, g: &[f32], u: Option<&[f32]>, out: &mut [f32]) {
    let (mut e, mut t) = ([0f32; CH], [0f32; CH]);
    let mut pos = 0;
    while pos < out.len() {
        let n = CH.min(out.len() - pos);
        let u = u.map(|u| &u[pos..pos + n]);
        apply_chunk(act, &g[pos..pos + n], u, &mut out[pos..pos + n], &mut e[..n], &mut t[..n]);
        pos += n;
    }
}

/// One chunk of `apply`, with scratch `e` and `t` of the same length as `out`.
#[inline(always)]
fn apply_chunk(act: Act, g: &[f32], u: Option<&[f32]>, out: &mut [f32], e: &mut [f32], t: &mut [f32]) {
    let n = out.len();
    let (g, e, t) = (&g[..n], &mut e[..n], &mut t[..n]);
    match act {
        Act::Silu => {
            for (e, &g) in e.iter_mut().zip(g) {
                *e = -g;
            }
        }
        Act::GeluTanh => {
            for (e, &g) in e.iter_mut().zip(g) {
                *e = -2.0 * SQRT_2_OVER_PI * (g + 0.044715 * g * g * g);
            }
        }
        Act::GeluErf => {
            for ((e, t), &g) in e.iter_mut().zip(t.iter_mut()).zip(g) {
                let z = g.abs() * std::f32::consts::FRAC_1_SQRT_2;
                *t = 1.0 / (1.0 + 0.5 * z);
                *e = erfc_arg(z, *t);
            }
        }
    }
    simd::exp_sub_sum(e, 0.0);
    match act {
        Act::Silu | Act::GeluTanh => match u {
            Some(u) => {
                for (((o, &e), &g), &u) in out.iter_mut().zip(&*e).zip(g).zip(&u[..n]) {
                    *o = g * u / (1.0 + e);
                }
            }
            None => {
                for ((o, &e), &g) in out.iter_mut().zip(&*e).zip(g) {
                    *o = g / (1.0 + e);
                }
            }
        },
        Act::GeluErf => {
            for (((o, &e), &t), &g) in out.iter_mut().zip(&*e).zip(&*t).zip(g) {
                let ec = t * e; // erfc(|g| / sqrt 2)
                let c = if g < 0.0 { ec } else { 2.0 - ec }; // erfc(-g / sqrt 2)
                *o = 0.5 * g * c;
            }
            if let Some(u) = u {
                for (o, &u) in out.iter_mut().zip(&u[..n]) {
                    *o *= u;
                }
            }
        }
    }
}

/// Output elements per call of the chunk loop (a multiple of `CH`).
const UNIT: usize = 16 * CH;

simd::multiversion! {
    /// Runs `act` over `out.len()` elements starting at logical `start` of `g` (and `u`),
    /// compiled for the widest vectors this CPU has (the erfc polynomial and the divisions
    /// vectorize; at the build's baseline they ran 4 lanes wide).
    fn run_chunks(act: Act, g: &View<'_>, u: Option<&View<'_>>, start: usize, out: &mut [f32]) => run_chunks_impl;
}

#[inline(always)]
fn run_chunks_impl(act: Act, g: &View<'_>, u: Option<&View<'_>>, start: usize, out: &mut [f32]) {
    let (mut gb, mut ub, mut e, mut t) = ([0f32; CH], [0f32; CH], [0f32; CH], [0f32; CH]);
    let mut pos = 0;
    while pos < out.len() {
        let n = CH.min(out.len() - pos);
        let gs = g.get(start + pos, &mut gb[..n]);
        let us = u.map(|u| u.get(start + pos, &mut ub[..n]));
        apply_chunk(act, gs, us, &mut out[pos..pos + n], &mut e[..n], &mut t[..n]);
        pos += n;
    }
}

fn unary(kernel: &str, x: &HostTensor, act: Act) -> Result<Outputs, KernelError> {
    expect_float("x", x)?;
    let v = View::new(x);
    by_dtype!(x.dtype(), kernel, T => {
        let out = fill::<T>(x.numel(), UNIT, |start, dst, _| run_chunks(act, &v, None, start, dst));
        Ok(Outputs::from([("out", tensor(out, x.shape())?)]))
    })
}

/// `gelu`.
pub(crate) fn gelu(a: &GeluArgs) -> Result<Outputs, KernelError> {
    unary(GELU, &a.x, Act::gelu(a.attrs.approximate))
}

/// `silu`.
pub(crate) fn silu(a: &SiluArgs) -> Result<Outputs, KernelError> {
    unary(SILU, &a.x, Act::Silu)
}

/// `geglu`.
pub(crate) fn geglu(a: &GegluArgs) -> Result<Outputs, KernelError> {
    let act = Act::gelu(a.attrs.approximate);
    gated(GEGLU, "geglu", a.attrs.split, (a.x.as_ref(), a.gate.as_ref(), a.up.as_ref()), act, &mut Outputs::new())
}

/// `act(gate) * up` in the split or separate form.
/// x (split) or gate and up: the operands a gated op may take.
type Gated<'a> = (Option<&'a HostTensor>, Option<&'a HostTensor>, Option<&'a HostTensor>);

/// A gated activation into the buffers of the previous call where they fit.
pub(crate) fn gated(
    kernel: &str,
    op: &str,
    split: bool,
    (x, gate, up): Gated<'_>,
    act: Act,
    bufs: &mut Outputs,
) -> Result<Outputs, KernelError> {
    // What makes gated operands valid is defined once, in the core (`check_gated`).
    let shape = layerzero_core::exec::check::check_gated(op, split, x, gate, up)?;
    match (x, gate, up) {
        (Some(x), _, _) if split => {
            let i = shape.last().copied().unwrap_or(0);
            let last_stride = x.strides().last().copied().unwrap_or(1);
            let g = View::of(x, &shape, x.strides(), x.offset());
            let u = View::of(x, &shape, x.strides(), x.offset() + i * last_stride);
            by_dtype!(x.dtype(), kernel, T => run_gated::<T>(act, &g, &u, &shape, bufs))
        }
        (_, Some(gate), Some(up)) => {
            let (g, u) = (View::new(gate), View::new(up));
            by_dtype!(gate.dtype(), kernel, T => run_gated::<T>(act, &g, &u, &shape, bufs))
        }
        _ => Err(invalid(format!("{op}: the checked operands are missing"))),
    }
}

fn run_gated<T: Elem>(
    act: Act,
    g: &View<'_>,
    u: &View<'_>,
    shape: &[usize],
    bufs: &mut Outputs,
) -> Result<Outputs, KernelError> {
    let mut out = Out::<T>::take(bufs, "out", shape.iter().product());
    fill_into::<T>(&mut out.v, UNIT, |start, dst, conv, _| {
        T::produce(dst, conv, |d| run_chunks(act, g, Some(u), start, d))
    });
    Ok(Outputs::one("out", out.finish(shape)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::testing::{check, invalid_message, registry, strided, t};
    use layerzero_core::compare::Category;
    use layerzero_core::exec::args::{GegluArgs, GeluArgs, SiluArgs, SwigluArgs};
    use layerzero_core::model::attrs::{GegluAttrs, GeluAttrs, NoAttrs, SwigluAttrs};
    use layerzero_core::model::dtype::DType;
    use layerzero_core::tensor::Storage;

    const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    #[test]
    fn activations_at_known_points() {
        let mut out = [0f32; 3];
        apply(Act::GeluErf, &[1.0, -1.0, 0.0], None, &mut out);
        assert!((f64::from(out[0]) - 0.8413447460685429).abs() < 1e-7, "{out:?}");
        assert!((f64::from(out[1]) + 0.15865525393145705).abs() < 1e-7, "{out:?}");
        assert_eq!(out[2], 0.0);
        apply(Act::Silu, &[1.0, -2.0, 0.0], None, &mut out);
        assert!((f64::from(out[0]) - 0.7310585786300049).abs() < 1e-7, "{out:?}");
        assert!((f64::from(out[1]) + 0.23840584404423512).abs() < 1e-7, "{out:?}");
        apply(Act::GeluTanh, &[1.0, 100.0, -100.0], Some(&[2.0, 1.0, 1.0]), &mut out);
        assert!((f64::from(out[0]) - 2.0 * 0.8411919906082768).abs() < 2e-7, "{out:?}");
        assert_eq!(out[1], 100.0);
        assert!(out[2].abs() < 1e-30);
        // Longer than one chunk.
        let g: Vec<f32> = (0..1500).map(|i| i as f32 / 100.0 - 7.5).collect();
        let mut o = vec![0f32; g.len()];
        apply(Act::Silu, &g, Some(&g), &mut o);
        for (i, (&g, &o)) in g.iter().zip(&o).enumerate() {
            let want = g * g / (1.0 + (-g).exp());
            assert!((o - want).abs() <= 1e-6 * (1.0 + want.abs()), "{i}: {o} vs {want}");
        }
    }

    fn gelus() -> [GeluApproximate; 2] {
        [GeluApproximate::None, GeluApproximate::Tanh]
    }

    #[test]
    fn unary_activations_match_the_reference() -> TestResult {
        for dtype in DTYPES {
            for shape in [vec![1usize, 1], vec![7, 5], vec![33, 4097], vec![2, 3, 130], vec![]] {
                let x = t(&shape, shape.iter().sum::<usize>() as u64, dtype, 6.0)?;
                let what = format!("{shape:?} {dtype}");
                let mut views = vec![x.clone()];
                if shape.len() >= 2 && shape.iter().product::<usize>() < 10_000 {
                    views.extend(strided(&x)?);
                }
                for x in views {
                    for approximate in gelus() {
                        let a = OpArgs::Gelu(GeluArgs { x: x.clone(), attrs: GeluAttrs { approximate } });
                        check(GELU, "cpu_reference.gelu.naive", &a, Category::Gemm, &format!("gelu {what}"))?;
                    }
                    let a = OpArgs::Silu(SiluArgs { x: x.clone(), attrs: NoAttrs {} });
                    check(SILU, "cpu_reference.silu.naive", &a, Category::Gemm, &format!("silu {what}"))?;
                }
            }
        }
        // The tails: large magnitudes and zeros.
        let v = [-1e4f32, -90.0, -30.0, -8.0, -0.0, 0.0, 1e-30, 8.0, 30.0, 90.0, 1e4];
        let x = HostTensor::from_f32(&[v.len()], v.to_vec())?;
        for approximate in gelus() {
            let a = OpArgs::Gelu(GeluArgs { x: x.clone(), attrs: GeluAttrs { approximate } });
            check(GELU, "cpu_reference.gelu.naive", &a, Category::Gemm, "gelu tails")?;
        }
        let a = OpArgs::Silu(SiluArgs { x, attrs: NoAttrs {} });
        check(SILU, "cpu_reference.silu.naive", &a, Category::Gemm, "silu tails")?;
        // +inf stays +inf, NaN stays NaN.
        for act in [Act::Silu, Act::GeluErf, Act::GeluTanh] {
            let mut o = [0f32; 2];
            apply(act, &[f32::INFINITY, f32::NAN], None, &mut o);
            assert!(o[0] == f32::INFINITY && o[1].is_nan(), "{act:?}: {o:?}");
        }
        Ok(())
    }

    fn swiglu(x: Option<HostTensor>, gate: Option<HostTensor>, up: Option<HostTensor>) -> OpArgs {
        OpArgs::Swiglu(SwigluArgs { attrs: SwigluAttrs { split: x.is_some() }, x, gate, up })
    }

    #[test]
    fn gated_activations_match_the_reference_split_and_separate() -> TestResult {
        for dtype in DTYPES {
            for (rows, i) in [(1usize, 1usize), (7, 5), (33, 4096), (7, 4097)] {
                let what = format!("{rows}x{i} {dtype}");
                let x = t(&[rows, 2 * i], (rows + i) as u64, dtype, 5.0)?;
                let g = t(&[rows, i], (rows + i + 1) as u64, dtype, 5.0)?;
                let u = t(&[rows, i], (rows + i + 2) as u64, dtype, 3.0)?;
                let mut xs = vec![x];
                let mut gs = vec![(g.clone(), u.clone())];
                if rows * i < 10_000 {
                    xs.extend(strided(&xs[0])?);
                    gs.extend(strided(&g)?.into_iter().zip(strided(&u)?));
                    gs.push((strided(&g)?.remove(0), u.clone()));
                }
                for (k, x) in xs.iter().enumerate() {
                    let a = swiglu(Some(x.clone()), None, None);
                    check(
                        SWIGLU,
                        "cpu_reference.swiglu.naive",
                        &a,
                        Category::Gemm,
                        &format!("swiglu split {what} {k}"),
                    )?;
                    for approximate in gelus() {
                        let attrs = GegluAttrs { split: true, approximate };
                        let a = OpArgs::Geglu(GegluArgs { x: Some(x.clone()), gate: None, up: None, attrs });
                        check(
                            GEGLU,
                            "cpu_reference.geglu.naive",
                            &a,
                            Category::Gemm,
                            &format!("geglu split {what} {k}"),
                        )?;
                    }
                }
                for (k, (g, u)) in gs.iter().enumerate() {
                    let a = swiglu(None, Some(g.clone()), Some(u.clone()));
                    check(SWIGLU, "cpu_reference.swiglu.naive", &a, Category::Gemm, &format!("swiglu sep {what} {k}"))?;
                    for approximate in gelus() {
                        let attrs = GegluAttrs { split: false, approximate };
                        let a = OpArgs::Geglu(GegluArgs { x: None, gate: Some(g.clone()), up: Some(u.clone()), attrs });
                        check(
                            GEGLU,
                            "cpu_reference.geglu.naive",
                            &a,
                            Category::Gemm,
                            &format!("geglu sep {what} {k}"),
                        )?;
                    }
                }
            }
        }
        // Rank 3 split, and an empty last dim.
        let x = t(&[2, 3, 10], 5, DType::BF16, 4.0)?;
        check(SWIGLU, "cpu_reference.swiglu.naive", &swiglu(Some(x), None, None), Category::Gemm, "rank 3")?;
        let e = t(&[4, 0], 5, DType::F32, 1.0)?;
        let o = gated(SWIGLU, "swiglu", true, (Some(&e), None, None), Act::Silu, &mut Outputs::new())?;
        assert_eq!(o["out"].shape(), &[4, 0]);
        Ok(())
    }

    #[test]
    fn gated_shape_errors_name_the_tensor() -> TestResult {
        let odd = t(&[2, 3], 1, DType::F32, 1.0)?;
        let m = invalid_message(SWIGLU, &swiglu(Some(odd.clone()), None, None))?;
        assert!(m.contains("`x`") && m.contains("[2, 3]") && m.contains("even"), "{m}");
        let m = invalid_message(SWIGLU, &swiglu(None, Some(odd.clone()), Some(t(&[3, 2], 1, DType::F32, 1.0)?)))?;
        assert!(m.contains("`gate`") && m.contains("[2, 3]") && m.contains("[3, 2]"), "{m}");
        let attrs = GegluAttrs { split: false, approximate: GeluApproximate::None };
        let a = OpArgs::Geglu(GegluArgs { x: Some(odd.clone()), gate: None, up: None, attrs });
        assert!(invalid_message(GEGLU, &a)?.contains("split = false"));
        let a = OpArgs::Geglu(GegluArgs { x: None, gate: Some(odd.clone()), up: None, attrs: GegluAttrs::default() });
        assert!(invalid_message(GEGLU, &a)?.contains("split = false"));
        let ints = HostTensor::new(Storage::I32(vec![1, 2].into()), &[2])?;
        let m = invalid_message(SILU, &OpArgs::Silu(SiluArgs { x: ints, attrs: NoAttrs {} }))?;
        assert!(m.contains("`x`") && m.contains("dtype"), "{m}");
        let r = silu(&SiluArgs { x: HostTensor::from_f32_as(DType::Fp8E5M2, &[1], &[1.0])?, attrs: NoAttrs {} });
        assert!(matches!(r, Err(KernelError::Unsupported(_))));
        let r = registry();
        let a = OpArgs::Silu(SiluArgs { x: odd, attrs: NoAttrs {} });
        assert!(matches!(r.get(GELU).ok_or("gelu is not registered")?.run(&a), Err(KernelError::Unsupported(_))));
        Ok(())
    }
}
