//! `quantize` and `dequantize` of the `cpu` backend: rayon over rows (per tensor) or over
//! bands of block rows (per channel, per block), each band read once into f32.
//!
//! The arithmetic is the reference's, bit for bit (see `cpu_reference::quant`): x widened
//! to f32; `amax = max |x|` (NaN skipped, order-free); `scale = amax / qmax` (one f32
//! division, 1 when amax is 0); `q = x / scale` (one f32 division); i8:
//! `round_half_even(q)` clamped to [-127, 127] (NaN -> 0); fp8: round to nearest even,
//! saturating, NaN kept (`fp8_encode`, a bit-level encoder equal to `Fp8::encode` on every
//! input). Scheme `none`: scale 1, `q = x`. Dequantize: `decode(x) * scale` in f32, rounded
//! once to `out_dtype`.
//!
//! Scale tensors given to `dequantize` are checked like the reference does: f32, the
//! scheme's shape, and for `per_block` the memory order `attrs.scale_layout` states, else
//! a SCALE_LAYOUT_MISMATCH `InvalidInput` naming the tensor, its shape, strides and the
//! expectation.
//! Packed 4-bit weights (`attrs.format`) are dequantized in `quant4`.

use std::sync::Arc;

use rayon::prelude::*;

use super::alloc::{Out, with_scratch};
use super::gemm::{Mat, to_tensor};
use super::pack::{invalid, read_f32};
use super::simd::i8_encode;
use super::wrong_op;
use layerzero_core::exec::args::{DequantizeArgs, OpArgs, Outputs, QuantizeArgs};
use layerzero_core::exec::executor::{KernelError, Registry, WritesInto};
use layerzero_core::exec::quant::{Grid, Target, check_scale};
use layerzero_core::model::attrs::{QuantScheme, ScaleLayout};
use layerzero_core::model::dtype::DType;
use layerzero_core::tensor::fp8::Fp8;
use layerzero_core::tensor::{HostTensor, Storage};

/// Quantize kernel id.
pub(super) const QUANTIZE: &str = "cpu.quantize.fast";
/// Dequantize kernel id.
pub(super) const DEQUANTIZE: &str = "cpu.dequantize.fast";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        QUANTIZE,
        Arc::new(WritesInto(|args: &OpArgs, bufs: &mut Outputs| match args {
            OpArgs::Quantize(a) => quantize_into(a, bufs),
            other => Err(wrong_op(QUANTIZE, other)),
        })),
    );
    registry.register(
        DEQUANTIZE,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Dequantize(a) => dequantize(a).map(|t| Outputs::from([("out", t)])),
            other => Err(wrong_op(DEQUANTIZE, other)),
        }),
    );
}

/// OCP FP8 encoding from the f32 bits: round to nearest even, saturate to the largest
/// finite value, NaN to the format's NaN code. Equal to `Fp8::encode` for every f32.
#[inline]
pub(super) fn fp8_encode(f: Fp8, x: f32) -> u8 {
    let (mb, bias, max, max_code, nan_code): (u32, i32, f32, u32, u8) = match f {
        Fp8::E4M3 => (3, 7, 448.0, 0x7E, 0x7F),
        Fp8::E5M2 => (2, 15, 57344.0, 0x7B, 0x7E),
    };
    if x.is_nan() {
        return nan_code;
    }
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs();
    if a >= max {
        return sign | max_code as u8;
    }
    let emin = 1 - bias;
    let code = if a < f32::from_bits(((emin + 127) as u32) << 23) {
        // Subnormal: multiples of 2^(emin - mb); the scaling is exact. Rounding up to 2^mb
        // lands on the smallest normal's code.
        (a * f32::from_bits(((mb as i32 - emin + 127) as u32) << 23)).round_ties_even() as u32
    } else {
        // Normal: round the f32 mantissa to mb bits (ties to even; a carry bumps the
        // exponent), then rebias the exponent.
        let bits = a.to_bits();
        let shift = 23 - mb;
        let r = (bits + ((bits >> shift) & 1) + (1 << (shift - 1)) - 1) >> shift;
        r - (((127 - bias) as u32) << mb)
    };
    sign | code.min(max_code) as u8
}

/// x as rows of its last dim (a 0-d x is one row of one element).
fn x_rows<'a>(x: &'a HostTensor, holder: &'a mut Option<HostTensor>) -> Result<Mat<'a>, KernelError> {
    if x.rank() == 0 {
        return Ok(Mat { st: x.storage(), off: x.offset(), rows: 1, cols: 1, rs: 1, cs: 1 });
    }
    super::gemm::rows_view(x, holder)
}

fn amax(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |m, &x| if x.abs() > m { x.abs() } else { m })
}

/// Quantizes x into `codes` (of type `T`, x's rows) with `enc(x / scale)` and the
/// row-major `scales` (the grid's count); temporaries from this thread's scratch.
fn run<T: Copy + Default + Send + Sync>(
    x: &Mat,
    grid: &Grid,
    qmax: f32,
    enc: impl Fn(f32) -> T + Sync,
    codes: &mut [T],
    scales: &mut [f32],
) {
    let cols = x.cols;
    let scale_of = |m: f32| if m == 0.0 { 1.0 } else { m / qmax };
    if codes.is_empty() {
        scales.fill(1.0);
        return;
    }
    if !grid.banded() {
        let scale = if grid.scheme == QuantScheme::None {
            1.0
        } else {
            let m = (0..x.rows)
                .into_par_iter()
                .map(|r| {
                    with_scratch(cols, |buf: &mut [f32]| {
                        x.read_row(r, buf);
                        amax(buf)
                    })
                })
                .reduce(|| 0.0f32, f32::max);
            scale_of(m)
        };
        let none = grid.scheme == QuantScheme::None;
        codes.par_chunks_mut(cols).enumerate().for_each(|(r, out)| {
            with_scratch(cols, |buf: &mut [f32]| {
                x.read_row(r, buf);
                for (o, &v) in out.iter_mut().zip(buf.iter()) {
                    *o = enc(if none { v } else { v / scale });
                }
            })
        });
        scales.fill(scale);
        return;
    }
    // Bands of `br` rows: amax per column block over the band, then quantize the band.
    let (br, bc, gc) = (grid.br, grid.bc, grid.gc);
    codes.par_chunks_mut(br * cols).zip(scales.par_chunks_mut(gc)).enumerate().for_each(|(band, (out, sc))| {
        let nr = out.len() / cols;
        with_scratch(nr * cols + gc, |t: &mut [f32]| {
            let (buf, m) = t.split_at_mut(nr * cols);
            m.fill(0.0);
            for (i, row) in buf.chunks_mut(cols).enumerate() {
                x.read_row(band * br + i, row);
            }
            for row in buf.chunks(cols) {
                for (j, blk) in row.chunks(bc).enumerate() {
                    m[j] = m[j].max(amax(blk));
                }
            }
            for (s, &m) in sc.iter_mut().zip(m.iter()) {
                *s = scale_of(m);
            }
            for (orow, row) in out.chunks_mut(cols).zip(buf.chunks(cols)) {
                for ((oblk, blk), &s) in orow.chunks_mut(bc).zip(row.chunks(bc)).zip(sc.iter()) {
                    for (o, &v) in oblk.iter_mut().zip(blk) {
                        *o = enc(v / s);
                    }
                }
            }
        })
    });
}

/// `quantize`: outputs `out` (target dtype, x's shape, contiguous) and `scale` (f32).
#[cfg(test)]
pub(super) fn quantize(a: &QuantizeArgs) -> Result<Outputs, KernelError> {
    quantize_into(a, &mut Outputs::new())
}

/// [`quantize`] into the buffers of the previous call where they fit (i8 codes and
/// row-major scales: a decode step's activations allocate nothing once warm).
pub(super) fn quantize_into(a: &QuantizeArgs, bufs: &mut Outputs) -> Result<Outputs, KernelError> {
    let x = &a.x;
    if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Err(invalid(format!("tensor `x` has dtype {}; quantize reads f32, f16 or bf16", x.dtype())));
    }
    let target = Target::of(a.attrs.target.unwrap_or(DType::I8), "attrs.target")?;
    let grid = Grid::new(&a.attrs, x)?;
    let mut holder = None;
    let xm = x_rows(x, &mut holder)?;
    let n = xm.rows * xm.cols;
    let column_major = grid.scheme == QuantScheme::PerBlock && a.attrs.scale_layout == Some(ScaleLayout::ColumnMajor);
    let mut sc = Out::<f32>::take(bufs, "scale", grid.gr * grid.gc);
    let built = |e: layerzero_core::error::Error| KernelError::Failed(format!("building the output: {e}"));
    let out = match target {
        Target::I8 => {
            let mut codes = Out::<i8>::take(bufs, "out", n);
            run(&xm, &grid, target.qmax(), i8_encode, &mut codes.v, &mut sc.v);
            codes.finish(x.shape())?
        }
        Target::Fp8(f) => {
            let mut c = vec![0u8; n];
            run(&xm, &grid, target.qmax(), |v| fp8_encode(f, v), &mut c, &mut sc.v);
            let st = if f == Fp8::E4M3 { Storage::Fp8E4M3(c.into()) } else { Storage::Fp8E5M2(c.into()) };
            HostTensor::new(st, x.shape()).map_err(built)?
        }
    };
    let scale = if column_major {
        let (gr, gc) = (grid.gr, grid.gc);
        let mut cm = vec![0f32; gr * gc];
        for i in 0..gr {
            for j in 0..gc {
                cm[j * gr + i] = sc.v[i * gc + j];
            }
        }
        HostTensor::from_f32(&[gr * gc], cm).and_then(|t| t.view(&[gr, gc], &[1, gr], 0)).map_err(built)?
    } else {
        sc.finish(&grid.shape())?
    };
    Ok(Outputs::from([("out", out), ("scale", scale)]))
}

/// `dequantize`: `out = decode(x) * scale` in f32, rounded once to `attrs.out_dtype`.
pub(super) fn dequantize(a: &DequantizeArgs) -> Result<HostTensor, KernelError> {
    let x = &a.x;
    let out_dtype = match a.attrs.out_dtype.unwrap_or(DType::F32) {
        d @ (DType::F32 | DType::F16 | DType::BF16) => d,
        d => return Err(invalid(format!("attrs.out_dtype is {d}; expected f32, f16 or bf16"))),
    };
    if a.is_w4()? {
        return super::quant4::dequantize_w4(a, out_dtype);
    }
    Target::of(x.dtype(), "tensor `x` dtype")?;
    let grid = Grid::new(&a.attrs, x)?;
    check_scale(&a.attrs, x, &a.scale, &grid)?;
    let scales = a.scale.to_f32_vec();
    let mut holder = None;
    let xm = x_rows(x, &mut holder)?;
    let (rows, cols) = (xm.rows, xm.cols);
    let mut out = vec![0f32; rows * cols];
    if !out.is_empty() {
        out.par_chunks_mut(cols).enumerate().for_each(|(r, row)| {
            read_x_row(&xm, r, row);
            match grid.scheme {
                QuantScheme::None | QuantScheme::PerTensor => row.iter_mut().for_each(|v| *v *= scales[0]),
                QuantScheme::PerChannel => row.iter_mut().for_each(|v| *v *= scales[r]),
                QuantScheme::PerBlock => {
                    let srow = &scales[(r / grid.br) * grid.gc..(r / grid.br + 1) * grid.gc];
                    for (blk, &s) in row.chunks_mut(grid.bc).zip(srow) {
                        blk.iter_mut().for_each(|v| *v *= s);
                    }
                }
            }
        });
    }
    to_tensor(out_dtype, x.shape(), out)
}

/// Row `r` of a quantized x decoded to f32 (i8 contiguous rows without the generic path).
fn read_x_row(x: &Mat, r: usize, out: &mut [f32]) {
    if let Storage::I8(v) = x.st
        && (x.cs == 1 || x.cols <= 1)
    {
        let s = x.at(r, 0);
        for (o, &q) in out.iter_mut().zip(&v[s..s + x.cols]) {
            *o = f32::from(q);
        }
        return;
    }
    read_f32(x.st, x.at(r, 0), x.cs, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use layerzero_core::exec::args::strided_copy;
    use layerzero_core::model::attrs::QuantAttrs;
    use layerzero_reference as cpu_reference;
    use layerzero_reference::test_util::values;

    fn reference(args: &OpArgs) -> TestResult<Outputs> {
        let mut r = Registry::new();
        cpu_reference::register(&mut r);
        let id = match args {
            OpArgs::Quantize(_) => "cpu_reference.quantize.naive",
            _ => "cpu_reference.dequantize.naive",
        };
        Ok(r.get(id).ok_or_else(|| format!("{id} is not registered"))?.run(args)?)
    }

    fn attrs(scheme: QuantScheme, block: Option<[u64; 2]>, layout: Option<ScaleLayout>, target: DType) -> QuantAttrs {
        QuantAttrs { block, scale_layout: layout, target: Some(target), ..QuantAttrs::of(scheme) }
    }

    /// Int8 / fp8 dequantize arguments (no global scale).
    fn deq(x: &HostTensor, scale: &HostTensor, attrs: QuantAttrs) -> DequantizeArgs {
        DequantizeArgs { x: x.clone(), scale: scale.clone(), global_scale: None, attrs }
    }

    fn bits(t: &HostTensor) -> Vec<u64> {
        let c = t.contiguous();
        match c.storage() {
            Storage::I8(v) => v.iter().map(|&x| u64::from(x as u8)).collect(),
            Storage::Fp8E4M3(v) | Storage::Fp8E5M2(v) => v.iter().map(|&x| u64::from(x)).collect(),
            Storage::F32(v) => v.iter().map(|&x| u64::from(x.to_bits())).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fp8_encoder_equals_the_reference_encoder() {
        let check = |x: f32| {
            for f in [Fp8::E4M3, Fp8::E5M2] {
                assert_eq!(fp8_encode(f, x), f.encode(x), "{f:?} {x:e} ({:#010x})", x.to_bits());
            }
        };
        // Every f16 value scaled into and around both formats' ranges.
        for h in 0..=u16::MAX {
            let v = half::f16::from_bits(h).to_f32();
            for s in [1.0f32, 2f32.powi(-10), 2f32.powi(8), 3.0] {
                check(v * s);
            }
        }
        // Midpoints between neighbouring codes and their f32 neighbours (rounding ties).
        for f in [Fp8::E4M3, Fp8::E5M2] {
            for c in 0u8..0x7F {
                let (a, b) = (f.decode(c), f.decode(c + 1));
                if !(a.is_finite() && b.is_finite()) {
                    continue;
                }
                let mid = (a + b) / 2.0;
                for v in [mid, f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1), a, b] {
                    check(v);
                    check(-v);
                }
            }
        }
        // Pseudo-random bit patterns, specials and f32 subnormals.
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..1_000_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            check(f32::from_bits((s >> 32) as u32));
        }
        for v in [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MIN_POSITIVE, 1e-45, f32::MAX] {
            check(v);
        }
    }

    #[test]
    fn quantize_is_bit_exact_with_the_reference_for_every_scheme() -> TestResult {
        let schemes = [
            (QuantScheme::None, None, None),
            (QuantScheme::PerTensor, None, None),
            (QuantScheme::PerChannel, None, None),
            (QuantScheme::PerBlock, Some([1, 128]), None),
            (QuantScheme::PerBlock, Some([128, 128]), Some(ScaleLayout::ColumnMajor)),
            (QuantScheme::PerBlock, Some([3, 5]), Some(ScaleLayout::RowMajor)),
        ];
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let (r, c) = (130usize, 260usize);
            let mut v: Vec<f32> = values(r * c, 31).iter().map(|x| x * 3.0).collect();
            v[7] = f32::NAN;
            v[1000] = 0.0;
            let x = HostTensor::from_f32_as(dtype, &[r, c], &v)?;
            let strided = strided_copy(&x, &[1, r])?;
            for target in [DType::I8, DType::Fp8E4M3, DType::Fp8E5M2] {
                for &(scheme, block, layout) in &schemes {
                    for x in [&x, &strided] {
                        let args = OpArgs::Quantize(QuantizeArgs {
                            x: x.clone(),
                            attrs: attrs(scheme, block, layout, target),
                        });
                        let want = reference(&args)?;
                        let OpArgs::Quantize(q) = &args else { unreachable!() };
                        let ours = quantize(q)?;
                        let what = format!("{dtype} {target} {scheme:?} {block:?}");
                        for name in ["out", "scale"] {
                            assert_eq!(ours[name].shape(), want[name].shape(), "{what} {name}");
                            assert_eq!(ours[name].strides(), want[name].strides(), "{what} {name}");
                            assert_eq!(bits(&ours[name]), bits(&want[name]), "{what} {name}");
                        }
                    }
                }
            }
        }
        // A 3-D x per tensor, and a 0-d x.
        let x3 = HostTensor::from_f32(&[2, 3, 4], values(24, 5))?.permute(&[2, 0, 1])?;
        let x0 = HostTensor::from_f32(&[], vec![-2.5])?;
        for x in [x3, x0] {
            let args =
                OpArgs::Quantize(QuantizeArgs { x, attrs: attrs(QuantScheme::PerTensor, None, None, DType::I8) });
            let OpArgs::Quantize(q) = &args else { unreachable!() };
            let ours = quantize(q)?;
            assert_eq!(bits(&ours["out"]), bits(&reference(&args)?["out"]));
        }
        Ok(())
    }

    #[test]
    fn round_trip_error_is_within_half_a_step() -> TestResult {
        let (r, c) = (40usize, 300usize);
        let x = HostTensor::from_f32(&[r, c], values(r * c, 41).iter().map(|v| v * 10.0).collect())?;
        let xs = x.to_f32_vec();
        for (scheme, block) in [
            (QuantScheme::PerTensor, None),
            (QuantScheme::PerChannel, None),
            (QuantScheme::PerBlock, Some([1u64, 128u64])),
            (QuantScheme::PerBlock, Some([128, 128])),
        ] {
            for target in [DType::I8, DType::Fp8E4M3, DType::Fp8E5M2] {
                let a = attrs(scheme, block, Some(ScaleLayout::ColumnMajor), target);
                let q = quantize(&QuantizeArgs { x: x.clone(), attrs: a.clone() })?;
                let back = dequantize(&deq(&q["out"], &q["scale"], a))?.to_f32_vec();
                // Each group's amax maps to qmax: i8 steps are scale (error <= scale / 2);
                // fp8 keeps 3 (e4m3) or 2 (e5m2) mantissa bits (relative error <= 2^-4 / 2^-3).
                let max = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (i, (&b, &v)) in back.iter().zip(&xs).enumerate() {
                    let bound = match target {
                        DType::I8 => 0.5 * max / 127.0 * 1.001,
                        DType::Fp8E4M3 => v.abs() * 2f32.powi(-4) + max / 448.0 * 2f32.powi(-9),
                        _ => v.abs() * 2f32.powi(-3) + max / 57344.0 * 2f32.powi(-16),
                    };
                    assert!((b - v).abs() <= bound, "{scheme:?} {target} {i}: {b} vs {v}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn dequantize_matches_reference_and_checks_the_scale_layout() -> TestResult {
        let (r, c) = (130usize, 260usize);
        let q: Vec<f32> = values(r * c, 51).iter().map(|v| (v * 127.0).round()).collect();
        let x8 = HostTensor::from_f32_as(DType::I8, &[r, c], &q)?;
        let xf = HostTensor::from_f32_as(DType::Fp8E4M3, &[r, c], &values(r * c, 52))?;
        let col = HostTensor::from_f32(&[6], vec![0.01, 0.02, 0.03, 0.04, 0.05, 0.06])?.view(&[2, 3], &[1, 2], 0)?;
        let rowm = col.contiguous();
        let cases = [
            (QuantScheme::PerChannel, None, None, HostTensor::from_f32(&[r], values(r, 53))?),
            (QuantScheme::PerTensor, None, None, HostTensor::from_f32(&[1, 1], vec![0.5])?),
            (QuantScheme::PerBlock, Some([128, 128]), Some(ScaleLayout::ColumnMajor), col.clone()),
            (QuantScheme::PerBlock, Some([128, 128]), Some(ScaleLayout::RowMajor), rowm.clone()),
        ];
        for x in [&x8, &xf] {
            for (scheme, block, layout, scale) in &cases {
                for out_dtype in [None, Some(DType::BF16)] {
                    let mut at = attrs(*scheme, *block, *layout, x.dtype());
                    at.out_dtype = out_dtype;
                    let args = OpArgs::Dequantize(deq(x, scale, at));
                    let want = reference(&args)?.remove("out").ok_or("no out")?;
                    let OpArgs::Dequantize(d) = &args else { unreachable!() };
                    let ours = dequantize(d)?;
                    assert_eq!(ours.dtype(), want.dtype());
                    for (o, w) in ours.to_f64_vec().iter().zip(want.to_f64_vec()) {
                        // f32: identical; bf16: at most one ulp apart (double rounding).
                        assert!(*o == w || (o - w).abs() <= w.abs() * 2f64.powi(-7), "{scheme:?}: {o} vs {w}");
                    }
                }
            }
        }
        // A transposed (column-major) scale where row-major is stated: refused, named.
        for (layout, scale) in
            [(Some(ScaleLayout::RowMajor), &col), (None, &col), (Some(ScaleLayout::ColumnMajor), &rowm)]
        {
            let a = attrs(QuantScheme::PerBlock, Some([128, 128]), layout, DType::I8);
            match dequantize(&deq(&x8, scale, a)) {
                Err(KernelError::InvalidInput(m)) => {
                    assert!(
                        m.contains("SCALE_LAYOUT_MISMATCH") && m.contains("`scale`") && m.contains("[2, 3]"),
                        "{m}"
                    );
                    assert!(m.contains(&format!("strides {:?}", scale.strides())), "{m}");
                }
                other => panic!("{other:?}"),
            }
        }
        // A scale of the wrong shape for the scheme.
        for (scheme, block, scale) in [
            (QuantScheme::PerChannel, None, HostTensor::from_f32(&[c], vec![1.0; c])?),
            (QuantScheme::PerBlock, Some([128, 128]), HostTensor::from_f32(&[3, 2], vec![1.0; 6])?),
            (QuantScheme::PerTensor, None, HostTensor::from_f32(&[2], vec![1.0; 2])?),
        ] {
            let a = attrs(scheme, block, None, DType::I8);
            let e = dequantize(&deq(&x8, &scale, a));
            assert!(matches!(&e, Err(KernelError::InvalidInput(m)) if m.contains("SCALE_LAYOUT_MISMATCH")), "{e:?}");
        }
        Ok(())
    }

    #[test]
    fn fp8_saturates_and_keeps_nan() -> TestResult {
        let x = HostTensor::from_f32(&[1, 4], vec![1e6, -1e6, f32::NAN, 3.0])?;
        let o = quantize(&QuantizeArgs { x, attrs: attrs(QuantScheme::None, None, None, DType::Fp8E4M3) })?;
        let v = o["out"].to_f32_vec();
        assert_eq!((v[0], v[1], v[3]), (448.0, -448.0, 3.0));
        assert!(v[2].is_nan());
        assert_eq!(o["scale"].to_f32_vec(), vec![1.0]);
        Ok(())
    }
}
