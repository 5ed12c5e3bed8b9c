//! `quantize` and `dequantize` of the `cpu_reference` backend: plain loops over the
//! logical elements.
//!
//! The arithmetic, which `cpu.quantize.fast` repeats bit for bit (i8 and fp8 outputs and
//! f32 scales are compared exactly):
//!
//! - every input element is widened to f32 exactly (f16/bf16 widen losslessly);
//! - `amax = max |x|` over the group, in f32, starting at 0 and skipping NaN (a max is exact
//!   and independent of the order);
//! - `scale = amax / qmax` as one f32 division (qmax 127 for i8, 448 for fp8_e4m3, 57344 for
//!   fp8_e5m2), and `scale = 1` when amax is 0;
//! - `q = x / scale` as one f32 division; i8: `round_half_even(q)` clamped to [-127, 127]
//!   (NaN gives 0); fp8: `Fp8::encode(q)` (round to nearest even, saturating, NaN kept);
//! - scheme `none`: scale 1 and `q = x` (an fp8 saturating cast; for i8 a rounding,
//!   clamping cast).
//!
//! Groups: `none`/`per_tensor` one scale (shape [1]) for x of any rank; `per_channel` one
//! per row of a 2-D x (shape [R]); `per_block` [r, c] one per tile of a 2-D x (shape
//! [ceil(R/r), ceil(C/c)], edge tiles partial), returned row-major or as a column-major
//! view (strides [1, ceil(R/r)]) as `attrs.scale_layout` says.
//!
//! `dequantize`: `out = decode(x) * scale` (broadcast by the same groups), computed in f64
//! and rounded once to `attrs.out_dtype` (f32 by default). The given scale must be f32 with
//! the scheme's shape and, for `per_block`, the memory order `attrs.scale_layout` states
//! (row-major when absent); anything else is a SCALE_LAYOUT_MISMATCH error naming the
//! tensor, its shape and strides and what was expected.
//!
//! A 4-bit `dequantize` (`attrs.format`): the packed codes decoded in f64 by the decoder
//! `linear_int4` uses (`linear::decode_w4`), rounded once to `attrs.out_dtype`.

use std::sync::Arc;

use layerzero_core::exec::args::{DequantizeArgs, OpArgs, Outputs, QuantizeArgs};
use layerzero_core::exec::executor::{KernelError, Registry};
use layerzero_core::model::attrs::{QuantScheme, ScaleLayout};
use layerzero_core::model::dtype::DType;
use layerzero_core::model::op::Op;
use layerzero_core::tensor::fp8::Fp8;
use layerzero_core::tensor::{HostTensor, Storage};

use super::{from_f64_as, wrong_op};
use crate::linear::decode_w4;
use layerzero_core::exec::check::invalid;
use layerzero_core::exec::quant::{Grid, Target, check_scale};

/// Quantize kernel id.
pub const QUANTIZE: &str = "cpu_reference.quantize.naive";
/// Dequantize kernel id.
pub const DEQUANTIZE: &str = "cpu_reference.dequantize.naive";

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        QUANTIZE,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Quantize(a) => quantize(a),
            other => Err(wrong_op(QUANTIZE, Op::Quantize, other)),
        }),
    );
    registry.register(
        DEQUANTIZE,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Dequantize(a) => dequantize(a).map(|t| Outputs::from([("out", t)])),
            other => Err(wrong_op(DEQUANTIZE, Op::Dequantize, other)),
        }),
    );
}

/// The f32 scale of a group whose largest magnitude is `amax`.
fn scale_of(amax: f32, qmax: f32) -> f32 {
    if amax == 0.0 { 1.0 } else { amax / qmax }
}

/// The stored code of `q` (already divided by its scale): i8 value or fp8 byte.
fn encode(t: Target, q: f32) -> i32 {
    match t {
        Target::I8 => {
            if q.is_nan() {
                0
            } else {
                q.round_ties_even().clamp(-127.0, 127.0) as i32
            }
        }
        Target::Fp8(f) => i32::from(f.encode(q)),
    }
}

/// `quantize`: outputs `out` (the target dtype, x's shape, contiguous) and `scale` (f32).
pub fn quantize(a: &QuantizeArgs) -> Result<Outputs, KernelError> {
    let x = &a.x;
    if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Err(invalid(format!("tensor `x` has dtype {}; quantize reads f32, f16 or bf16", x.dtype())));
    }
    let target = Target::of(a.attrs.target.unwrap_or(DType::I8), "attrs.target")?;
    let grid = Grid::new(&a.attrs, x)?;
    let vals = x.to_f32_vec();
    let ngroups = grid.gr * grid.gc;
    let mut amax = vec![0.0f32; ngroups];
    for (i, &v) in vals.iter().enumerate() {
        let g = &mut amax[grid.group(i)];
        if v.abs() > *g {
            *g = v.abs();
        }
    }
    let none = grid.scheme == QuantScheme::None;
    let scales: Vec<f32> = amax.iter().map(|&m| if none { 1.0 } else { scale_of(m, target.qmax()) }).collect();
    let codes: Vec<i32> = vals
        .iter()
        .enumerate()
        .map(|(i, &v)| encode(target, if none { v } else { v / scales[grid.group(i)] }))
        .collect();
    let storage = match target {
        Target::I8 => Storage::I8(codes.iter().map(|&c| c as i8).collect()),
        Target::Fp8(Fp8::E4M3) => Storage::Fp8E4M3(codes.iter().map(|&c| c as u8).collect()),
        Target::Fp8(Fp8::E5M2) => Storage::Fp8E5M2(codes.iter().map(|&c| c as u8).collect()),
    };
    let built = |e: layerzero_core::error::Error| KernelError::Failed(format!("building the output: {e}"));
    let out = HostTensor::new(storage, x.shape()).map_err(built)?;
    let column_major = a.attrs.scale_layout == Some(ScaleLayout::ColumnMajor);
    let scale = if grid.scheme == QuantScheme::PerBlock && column_major {
        let mut cm = vec![0.0f32; ngroups];
        for i in 0..grid.gr {
            for j in 0..grid.gc {
                cm[j * grid.gr + i] = scales[i * grid.gc + j];
            }
        }
        HostTensor::from_f32(&[ngroups], cm).and_then(|t| t.view(&[grid.gr, grid.gc], &[1, grid.gr], 0))
    } else {
        HostTensor::from_f32(&grid.shape(), scales)
    }
    .map_err(built)?;
    Ok(Outputs::from([("out", out), ("scale", scale)]))
}

/// `dequantize`: `out = decode(x) * scale`, in f64, rounded once to `attrs.out_dtype`.
pub fn dequantize(a: &DequantizeArgs) -> Result<HostTensor, KernelError> {
    let x = &a.x;
    let out_dtype = match a.attrs.out_dtype.unwrap_or(DType::F32) {
        d @ (DType::F32 | DType::F16 | DType::BF16) => d,
        d => return Err(invalid(format!("attrs.out_dtype is {d}; expected f32, f16 or bf16"))),
    };
    if a.is_w4()? {
        return dequantize_w4(a, out_dtype);
    }
    Target::of(x.dtype(), "tensor `x` dtype")?;
    let grid = Grid::new(&a.attrs, x)?;
    check_scale(&a.attrs, x, &a.scale, &grid)?;
    // Logical order: row-major over the scale grid, whatever the scale's strides.
    let scales = a.scale.to_f64_vec();
    let vals = x.to_f64_vec();
    let out: Vec<f64> = vals.iter().enumerate().map(|(i, &v)| v * scales[grid.group(i)]).collect();
    from_f64_as(out_dtype, x.shape(), &out)
}

/// A 4-bit `dequantize`: the packed `[N, K/2]` codes decoded in f64 by their format (the
/// decoder `linear_int4` uses), rounded once to `out_dtype`; the result is `[N, K]`.
fn dequantize_w4(a: &DequantizeArgs, out_dtype: DType) -> Result<HostTensor, KernelError> {
    let (format, n, k, g) = a.w4_dims()?;
    from_f64_as(out_dtype, &[n, k], &decode_w4(&a.w4_scales(format, g as u64), &a.x, n, k, g))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::test_util::values;
    use layerzero_core::model::attrs::QuantAttrs;

    fn attrs(scheme: QuantScheme, block: Option<[u64; 2]>, layout: Option<ScaleLayout>, target: DType) -> QuantAttrs {
        QuantAttrs {
            scheme,
            block,
            scale_layout: layout,
            target: Some(target),
            out_dtype: None,
            format: None,
            scale_order: Default::default(),
        }
    }

    fn q(x: &HostTensor, a: QuantAttrs) -> TestResult<Outputs> {
        Ok(quantize(&QuantizeArgs { x: x.clone(), attrs: a })?)
    }

    #[test]
    fn i8_per_tensor_hand_computed_with_ties_to_even() -> TestResult {
        // amax 127 -> scale 1: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -2.5 -> -2.
        let x = HostTensor::from_f32(&[6], vec![0.5, 1.5, 2.5, -2.5, 127.0, -3.49])?;
        let o = q(&x, attrs(QuantScheme::PerTensor, None, None, DType::I8))?;
        assert_eq!(o["out"].to_f32_vec(), vec![0.0, 2.0, 2.0, -2.0, 127.0, -3.0]);
        assert_eq!(o["scale"].shape(), &[1]);
        assert_eq!(o["scale"].to_f32_vec(), vec![1.0]);
        // All zeros: scale 1.
        let z =
            q(&HostTensor::from_f32(&[2, 2], vec![0.0; 4])?, attrs(QuantScheme::PerChannel, None, None, DType::I8))?;
        assert_eq!(z["scale"].to_f32_vec(), vec![1.0, 1.0]);
        Ok(())
    }

    #[test]
    fn per_channel_and_per_block_partial_edges_round_trip() -> TestResult {
        let (r, c) = (5usize, 7usize);
        let x = HostTensor::from_f32(&[r, c], values(r * c, 3).iter().map(|v| v * 4.0).collect())?;
        let xs = x.to_f32_vec();
        for (scheme, block) in [(QuantScheme::PerChannel, None), (QuantScheme::PerBlock, Some([2, 3]))] {
            let o = q(&x, attrs(scheme, block, None, DType::I8))?;
            let s = &o["scale"];
            let want: &[usize] = if block.is_some() { &[3, 3] } else { &[5] };
            assert_eq!(s.shape(), want);
            let back = dequantize(&DequantizeArgs {
                x: o["out"].clone(),
                scale: s.clone(),
                global_scale: None,
                attrs: attrs(scheme, block, None, DType::I8),
            })?
            .to_f32_vec();
            let grid = Grid::new(&attrs(scheme, block, None, DType::I8), &x)?;
            let sv = s.to_f32_vec();
            for i in 0..r * c {
                // Round to nearest: at most half a step off.
                assert!((back[i] - xs[i]).abs() <= 0.5 * sv[grid.group(i)] * 1.0001, "{scheme:?} {i}");
            }
        }
        Ok(())
    }

    #[test]
    fn fp8_saturation_and_nan() -> TestResult {
        let x = HostTensor::from_f32(&[4], vec![1000.0, -1e9, f32::NAN, 1.0])?;
        let o = q(&x, attrs(QuantScheme::None, None, None, DType::Fp8E4M3))?;
        let v = o["out"].to_f32_vec();
        assert_eq!((v[0], v[1], v[3]), (448.0, -448.0, 1.0));
        assert!(v[2].is_nan());
        let o = q(&x, attrs(QuantScheme::PerTensor, None, None, DType::Fp8E5M2))?;
        // amax skips NaN: 1e9 / 57344.
        assert_eq!(o["scale"].to_f32_vec(), vec![1e9f32 / 57344.0]);
        assert!(o["out"].to_f32_vec()[2].is_nan());
        Ok(())
    }

    #[test]
    fn column_major_scale_returned_and_checked() -> TestResult {
        let x = HostTensor::from_f32(&[5, 7], values(35, 9))?;
        let a = attrs(QuantScheme::PerBlock, Some([2, 3]), Some(ScaleLayout::ColumnMajor), DType::I8);
        let o = q(&x, a.clone())?;
        let s = &o["scale"];
        assert_eq!((s.shape(), s.strides()), (&[3usize, 3][..], &[1usize, 3][..]));
        let row = q(&x, attrs(QuantScheme::PerBlock, Some([2, 3]), None, DType::I8))?;
        assert_eq!(row["scale"].strides(), &[3, 1]);
        assert_eq!(s.to_f32_vec(), row["scale"].to_f32_vec());
        let deq = |scale: &HostTensor, a: QuantAttrs| {
            dequantize(&DequantizeArgs { x: o["out"].clone(), scale: scale.clone(), global_scale: None, attrs: a })
        };
        assert!(deq(s, a.clone()).is_ok());
        // The column-major scale where row-major is stated (or implied) is refused.
        for stated in [Some(ScaleLayout::RowMajor), None] {
            let mut b = a.clone();
            b.scale_layout = stated;
            match deq(s, b) {
                Err(KernelError::InvalidInput(m)) => {
                    assert!(
                        m.contains("SCALE_LAYOUT_MISMATCH") && m.contains("strides [1, 3]") && m.contains("row_major"),
                        "{m}"
                    )
                }
                other => panic!("{other:?}"),
            }
        }
        // A transposed shape is refused too.
        let t = s.permute(&[1, 0])?;
        let bad = HostTensor::from_f32(&[3, 2], vec![1.0; 6])?;
        for scale in [t.contiguous(), bad] {
            let e = deq(&scale, a.clone());
            assert!(matches!(&e, Err(KernelError::InvalidInput(m)) if m.contains("SCALE_LAYOUT_MISMATCH")), "{e:?}");
        }
        Ok(())
    }
}
