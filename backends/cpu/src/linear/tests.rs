use super::*;
use crate::TestResult;
use crate::gemm::{BSrc, F32View, packed_gemm};
use layerzero_core::exec::args::{W8a8Args, strided_copy};
use layerzero_core::model::attrs::{Int4Attrs, NoAttrs, W8a8Attrs};
use layerzero_core::model::layout::Layout;
use layerzero_core::model::w4::ActQuant;
use layerzero_reference as cpu_reference;
use layerzero_reference::test_util::values;

fn reference(args: &OpArgs) -> TestResult<HostTensor> {
    let mut r = Registry::new();
    cpu_reference::register(&mut r);
    let id = match args {
        OpArgs::Linear(_) => "cpu_reference.linear.naive",
        OpArgs::LinearW8a8(_) => "cpu_reference.linear_w8a8.naive",
        _ => "cpu_reference.linear_int4.naive",
    };
    Ok(r.get(id).ok_or_else(|| format!("{id} is not registered"))?.run(args)?.remove("out").ok_or("no out")?)
}

fn t(shape: &[usize], seed: u64, dtype: DType) -> TestResult<HostTensor> {
    let n = shape.iter().product();
    Ok(HostTensor::from_f32_as(dtype, shape, &values(n, seed))?)
}

/// GEMM tolerance: per element `tol * (|ref| + sqrt(K) * rms(|x| |w|) scale)`, plus one
/// 16-bit ulp for f16/bf16 outputs; `mag` is the magnitude of the summed products.
pub(crate) fn assert_gemm_close(ours: &HostTensor, want: &HostTensor, k: usize, mag: f64, what: &str) {
    assert_eq!(ours.shape(), want.shape(), "{what}: shape");
    assert_eq!(ours.dtype(), want.dtype(), "{what}: dtype");
    let (tol, ulp) = match want.dtype() {
        DType::F32 => (1e-6, 0.0),
        DType::F16 => (1e-3, 2f64.powi(-10)),
        _ => (1e-2, 2f64.powi(-7)),
    };
    let bound = tol * (k.max(1) as f64).sqrt() * mag;
    for (i, (o, r)) in ours.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        let d = (o - r).abs();
        assert!(d <= bound + tol * r.abs() || d <= ulp * r.abs().max(o.abs()), "{what}: element {i}: {o} vs {r}");
    }
}

fn lin(x: HostTensor, weight: HostTensor, bias: Option<HostTensor>) -> LinearArgs {
    LinearArgs { x, weight, bias, attrs: NoAttrs {} }
}

#[test]
fn fast_matches_reference_on_odd_shapes_dtypes_and_layouts() -> TestResult {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for m in [1usize, 3, 5, 8, 17, 32, 130] {
            for k in [5usize, 64, 130] {
                for n in [7usize, 64] {
                    for nn in [false, true] {
                        let x = t(&[m, k], 1 + m as u64, dtype)?;
                        let w = if nn { t(&[k, n], 2, dtype)?.with_layout(Layout::Nn) } else { t(&[n, k], 2, dtype)? };
                        let bias = (n == 7).then(|| t(&[n], 3, dtype)).transpose()?;
                        let a = lin(x, w, bias);
                        let what = format!("{dtype} m{m} k{k} n{n} nn={nn}");
                        let ours = linear(&a)?;
                        assert_gemm_close(&ours, &reference(&OpArgs::Linear(a))?, k, 1.0, &what);
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn packed_gemm_matches_reference_on_edges_blocks_and_strides() -> TestResult {
    // Tile edges (M, N off 12 / 32), several K blocks (KC = 256) and N blocks (NC =
    // 1024), NT / NN / strided weights, strided x, a bias.
    let shapes = [
        (7usize, 13usize, 29usize),
        (9, 29, 13),
        (13, 1, 33),
        (65, 130, 257),
        (12, 256, 32),
        (40, 50, 20),
        (601, 19, 70),
        (25, 257, 65),
        (37, 520, 1090),
    ];
    for (m, k, n) in shapes {
        for case in 0..3 {
            let w = match case {
                0 => t(&[n, k], 2, DType::F32)?,
                1 => t(&[k, n], 2, DType::F32)?.with_layout(Layout::Nn),
                _ => strided_copy(&t(&[n, k], 2, DType::F32)?, &[k + 5, 1])?,
            };
            let x = t(&[m, k], 1, DType::F32)?;
            let x = if case == 2 { x.permute(&[1, 0])?.contiguous().permute(&[1, 0])? } else { x };
            let a = lin(x, w, (case != 1).then(|| t(&[n], 3, DType::F32)).transpose()?);
            let what = format!("packed m{m} k{k} n{n} case {case}");
            assert_gemm_close(&linear(&a)?, &reference(&OpArgs::Linear(a))?, k, 1.0, &what);
        }
        // The blocked GEMM itself (any M, also below the GEMV cut), with beta = 1.
        let (xa, wb) = (values(m * k, 4), values(n * k, 5));
        let (xv, wv) = (F32View::dense(&xa, m, k), F32View { data: &wb, off: 0, rows: k, cols: n, rs: 1, cs: k });
        let ldc = n + 3;
        let mut c = values(m * ldc, 6);
        let mut want = c.clone();
        packed_gemm(xv, BSrc::F32(wv), &mut c, ldc, true);
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|p| f64::from(xa[i * k + p]) * f64::from(wb[j * k + p])).sum();
                want[i * ldc + j] = (f64::from(want[i * ldc + j]) + s) as f32;
            }
        }
        for (i, (o, r)) in c.iter().zip(&want).enumerate() {
            assert!((o - r).abs() <= 1e-5 * (k as f32).sqrt() + 1e-6 * r.abs(), "gemm += {m}x{k}x{n} at {i}");
        }
        // beta = 0 overwrites: what C held (NaN here) never reaches the result.
        let mut c = vec![f32::NAN; m * ldc];
        packed_gemm(xv, BSrc::F32(wv), &mut c, ldc, false);
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|p| f64::from(xa[i * k + p]) * f64::from(wb[j * k + p])).sum();
                let o = c[i * ldc + j];
                assert!((f64::from(o) - s).abs() <= 1e-5 * (k as f64).sqrt(), "gemm = {m}x{k}x{n} at {i}, {j}: {o}");
            }
        }
    }
    Ok(())
}

#[test]
fn bf16_tile_path_on_many_slabs_edges_and_layouts() -> TestResult {
    // Several weight blocks, K chunks and x blocks (the last of each partial), M and K
    // off the tile sizes, a bias, and NN / strided weights (the generic packing).
    for (m, k, n) in [(40usize, 96usize, 200usize), (9, 70, 130), (130, 1100, 300), (530, 600, 40)] {
        for nn in [false, true] {
            let x = t(&[m, k], 11, DType::BF16)?;
            let w =
                if nn { t(&[k, n], 12, DType::BF16)?.with_layout(Layout::Nn) } else { t(&[n, k], 12, DType::BF16)? };
            let a = lin(x, w, Some(t(&[n], 13, DType::F32)?));
            let what = format!("bf16 m{m} k{k} n{n} nn={nn}");
            assert_gemm_close(&linear(&a)?, &reference(&OpArgs::Linear(a))?, k, 1.0, &what);
        }
    }
    Ok(())
}

#[test]
fn strided_and_batched_views() -> TestResult {
    for dtype in [DType::F32, DType::BF16] {
        for m in [2usize, 9] {
            let (k, n) = (33usize, 19usize);
            let x = t(&[m, k], 5, dtype)?;
            // x read through a transposed buffer; weight through padded row strides.
            let xt = x.permute(&[1, 0])?.contiguous().permute(&[1, 0])?;
            let wp = strided_copy(&t(&[n, k], 6, dtype)?, &[k + 3, 1])?;
            let a = lin(xt, wp.clone(), None);
            assert_gemm_close(&linear(&a)?, &reference(&OpArgs::Linear(a))?, k, 1.0, "strided");
            // A 3-D x whose leading dims do not collapse (a permuted batch).
            let x3 = t(&[3, m, k], 7, dtype)?.permute(&[1, 0, 2])?;
            let a = lin(x3, wp, Some(t(&[n], 8, DType::F32)?));
            let ours = linear(&a)?;
            assert_eq!(ours.shape(), &[m, 3, n]);
            assert_gemm_close(&ours, &reference(&OpArgs::Linear(a))?, k, 1.0, "batched");
        }
    }
    Ok(())
}

#[test]
fn errors_and_empty_dims() -> TestResult {
    let x = t(&[2, 3], 1, DType::F32)?;
    match linear(&lin(x.clone(), t(&[4, 2], 1, DType::F32)?, None)) {
        Err(KernelError::InvalidInput(m)) => assert!(m.contains("`weight`") && m.contains("K = 3"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(linear(&lin(x.clone(), t(&[4, 3], 1, DType::F32)?, Some(t(&[3], 1, DType::F32)?))),
        Err(KernelError::InvalidInput(m)) if m.contains("`bias`")));
    let e = linear(&lin(t(&[0, 3], 1, DType::F32)?, t(&[4, 3], 1, DType::F32)?, None))?;
    assert_eq!(e.shape(), &[0, 4]);
    let z = linear(&lin(t(&[5, 0], 1, DType::F32)?, t(&[2, 0], 1, DType::F32)?, Some(t(&[2], 2, DType::F32)?)))?;
    assert_eq!(z.to_f32_vec(), [values(2, 2), values(2, 2), values(2, 2), values(2, 2), values(2, 2)].concat());
    let mut r = Registry::new();
    register(&mut r);
    let q = OpArgs::LinearW8a8(W8a8Args {
        x: HostTensor::zeros(DType::I8, &[1, 2])?,
        x_scale: t(&[1], 1, DType::F32)?,
        weight: HostTensor::zeros(DType::I8, &[1, 2])?,
        w_scale: t(&[1], 1, DType::F32)?,
        bias: None,
        attrs: W8a8Attrs::default(),
    });
    assert!(matches!(r.get(LINEAR).ok_or("linear is not registered")?.run(&q), Err(KernelError::Unsupported(_))));
    assert!(r.get(W8A8).ok_or("w8a8 is not registered")?.run(&q).is_ok());
    Ok(())
}

#[test]
fn w8a8_with_block_scales_matches_the_reference_and_a_misshapen_scale_is_named() -> TestResult {
    for (m, k, n, g) in [(1usize, 64usize, 7usize, 32usize), (3, 128, 33, 32), (17, 96, 16, 16), (2, 256, 5, 256)] {
        let (x, w) = (i8s(&[m, k], 31)?, i8s(&[n, k], 32)?);
        let scales = |rows: usize, seed| -> TestResult<HostTensor> {
            Ok(HostTensor::from_f32(
                &[rows, k / g],
                values(rows * k / g, seed).iter().map(|v| v.abs() * 0.01 + 1e-3).collect(),
            )?)
        };
        let a = W8a8Args {
            x: x.clone(),
            x_scale: scales(m, 33)?,
            weight: w.clone(),
            w_scale: scales(n, 34)?,
            bias: Some(t(&[n], 35, DType::F32)?),
            attrs: W8a8Attrs { out_dtype: None, group_size: Some(g as u64) },
        };
        let ours = linear_w8a8(&a)?;
        let what = format!("w8a8 m{m} k{k} n{n} blocks of {g}");
        assert_gemm_close(&ours, &reference(&OpArgs::LinearW8a8(a.clone()))?, k, 1.0, &what);
        // Per-row scales of the same values would give another answer: the blocks are read.
        let flat =
            W8a8Args { attrs: W8a8Attrs::default(), x_scale: HostTensor::from_f32(&[1], vec![0.01])?, ..a.clone() };
        let flat = W8a8Args { w_scale: HostTensor::from_f32(&[1], vec![0.01])?, ..flat };
        assert_ne!(linear_w8a8(&flat)?.to_f32_vec(), ours.to_f32_vec(), "{what}");
    }
    let mut bad = W8a8Args {
        x: i8s(&[2, 64], 1)?,
        x_scale: HostTensor::from_f32(&[2], vec![0.1; 2])?,
        weight: i8s(&[3, 64], 2)?,
        w_scale: HostTensor::from_f32(&[3, 2], vec![0.1; 6])?,
        bias: None,
        attrs: W8a8Attrs { out_dtype: None, group_size: Some(32) },
    };
    let e = linear_w8a8(&bad).err().ok_or("per-row x scales passed for blocks")?;
    assert!(
        matches!(&e, KernelError::InvalidInput(m) if m.contains("SCALE_LAYOUT_MISMATCH") && m.contains("`x_scale`")),
        "{e:?}"
    );
    bad.attrs.group_size = Some(48);
    let e = linear_w8a8(&bad).err().ok_or("blocks of 48 over K = 64 passed")?;
    assert!(matches!(&e, KernelError::InvalidInput(m) if m.contains("group_size is 48")), "{e:?}");
    Ok(())
}

fn i8s(shape: &[usize], seed: u64) -> TestResult<HostTensor> {
    let n = shape.iter().product();
    let v: Vec<f32> = values(n, seed).iter().map(|v| (v * 128.0).floor().clamp(-128.0, 127.0)).collect();
    Ok(HostTensor::from_f32_as(DType::I8, shape, &v)?)
}

#[test]
fn w8a8_matches_the_dequantized_float_reference() -> TestResult {
    for (m, k, n) in [(1usize, 5usize, 7usize), (17, 130, 64), (3, 64, 33)] {
        let (x, w) = (i8s(&[m, k], 11)?, i8s(&[n, k], 12)?);
        let xs = HostTensor::from_f32(&[m], values(m, 13).iter().map(|v| v.abs() * 0.01 + 1e-3).collect())?;
        let ws = HostTensor::from_f32(&[1], vec![0.02])?;
        for out_dtype in [None, Some(DType::BF16)] {
            let a = W8a8Args {
                x: x.clone(),
                x_scale: xs.clone(),
                weight: w.clone(),
                w_scale: ws.clone(),
                bias: Some(t(&[n], 14, DType::F16)?),
                attrs: W8a8Attrs { out_dtype, group_size: None },
            };
            let ours = linear_w8a8(&a)?;
            assert_gemm_close(&ours, &reference(&OpArgs::LinearW8a8(a.clone()))?, k, 1.0, "w8a8 vs reference");
            // The same product as a float linear of the dequantized operands.
            let xd = HostTensor::from_f32(
                &[m, k],
                x.to_f32_vec().iter().enumerate().map(|(i, v)| v * xs.to_f32_vec()[i / k]).collect(),
            )?;
            let wd = HostTensor::from_f32(&[n, k], w.to_f32_vec().iter().map(|v| v * 0.02).collect())?;
            let f = reference(&OpArgs::Linear(lin(xd, wd, a.bias.clone())))?;
            let f = HostTensor::from_f32_as(ours.dtype(), f.shape(), &f.to_f32_vec())?;
            assert_gemm_close(&ours, &f, k, 1.0, "w8a8 vs dequantized linear");
        }
    }
    // Exactness of the integer accumulation at the extremes (no i32 overflow).
    let k = 140_000usize;
    let x = HostTensor::from_f32_as(DType::I8, &[1, k], &vec![-128.0; k])?;
    let a = W8a8Args {
        x: x.clone(),
        x_scale: HostTensor::from_f32(&[1], vec![1.0])?,
        weight: x,
        w_scale: HostTensor::from_f32(&[1], vec![1.0])?,
        bias: None,
        attrs: W8a8Attrs::default(),
    };
    assert_eq!(linear_w8a8(&a)?.to_f64_vec(), vec![(k as f64 * 16384.0) as f32 as f64]);
    Ok(())
}

fn int4_args(m: usize, k: usize, n: usize, g: usize, zeros: bool, dtype: DType) -> TestResult<Int4Args> {
    let bytes: Vec<i8> = values(n * k / 2, 21).iter().map(|v| (v * 128.0).floor() as i8).collect();
    Ok(Int4Args {
        x: t(&[m, k], 22, dtype)?,
        weight: HostTensor::new(Storage::I8(bytes.into()), &[n, k / 2])?,
        scales: HostTensor::from_f32(&[n, k / g], values(n * k / g, 23).iter().map(|v| v.abs() * 0.1).collect())?,
        zeros: zeros
            .then(|| {
                let z = values(n * k / g, 24).iter().map(|v| ((v + 1.0) * 8.0).floor()).collect();
                HostTensor::from_f32(&[n, k / g], z)
            })
            .transpose()?,
        bias: Some(t(&[n], 25, DType::F32)?),
        global_scale: None,
        attrs: Int4Attrs::int4(g as u64),
    })
}

#[test]
fn int4_matches_the_dequantized_reference_for_group_sizes() -> TestResult {
    for g in [32usize, 64, 128] {
        for zeros in [false, true] {
            for (m, dtype) in [(1usize, DType::F32), (3, DType::BF16), (17, DType::F32), (130, DType::F16)] {
                let (k, n) = (256usize, 7usize);
                let a = int4_args(m, k, n, g, zeros, dtype)?;
                let ours = linear_int4(&a)?;
                let what = format!("int4 g{g} zeros={zeros} m{m} {dtype}");
                assert_gemm_close(&ours, &reference(&OpArgs::LinearInt4(a.clone()))?, k, 1.0, &what);
                // Against a float linear of the weight dequantized here by hand.
                let bytes = a.weight.to_i64_vec();
                let (s, z) = (a.scales.to_f32_vec(), a.zeros.as_ref().map(|z| z.to_f32_vec()));
                let mut w = vec![0f32; n * k];
                for r in 0..n {
                    for c in 0..k {
                        let b = bytes[r * k / 2 + c / 2] as u8;
                        let q = if c % 2 == 0 { b & 15 } else { b >> 4 };
                        let gi = r * (k / g) + c / g;
                        w[r * k + c] = (f32::from(q) - z.as_ref().map_or(8.0, |z| z[gi])) * s[gi];
                    }
                }
                let f = reference(&OpArgs::Linear(lin(
                    a.x.clone(),
                    HostTensor::from_f32_as(dtype, &[n, k], &w)?,
                    a.bias.clone(),
                )))?;
                if dtype == DType::F32 {
                    assert_gemm_close(&ours, &f, k, 1.0, &format!("{what} vs dequantized linear"));
                }
            }
        }
    }
    let odd = int4_args(2, 6, 3, 3, true, DType::F32)?;
    assert!(matches!(linear_int4(&odd), Err(KernelError::InvalidInput(m)) if m.contains("group_size is 3")));
    let mut bad = int4_args(2, 64, 3, 32, true, DType::F32)?;
    bad.attrs.group_size = 48;
    assert!(matches!(linear_int4(&bad), Err(KernelError::InvalidInput(m)) if m.contains("SCALE_LAYOUT_MISMATCH")));
    let mut bad = int4_args(2, 64, 3, 32, true, DType::F32)?;
    bad.zeros = Some(t(&[3, 4], 1, DType::F32)?);
    assert!(
        matches!(linear_int4(&bad), Err(KernelError::InvalidInput(m)) if m.contains("`zeros`") && m.contains("[3, 2]"))
    );
    Ok(())
}

#[test]
fn int4_with_int8_activations_matches_the_reference_on_every_path() -> TestResult {
    // m = 1 and 2 take the integer GEMV where it serves (no zeros, K = 256; 2 rows dotted in
    // one pass), zeros and group 16 the f32 GEMV on the rounded x; from m = 3 the integer
    // GEMM with AVX-512 VNNI or AVX2 (no zeros; AVX2 blocks of a multiple of 32; 7 rows: a
    // tile of 4 and one of 3; 9 columns: a part of a panel; 300 rows: two row blocks), where
    // it does not serve the GEMV up to 4 rows and the f32 GEMM on the rounded x beyond.
    let shapes = [
        (1usize, DType::F32),
        (2, DType::F32),
        (3, DType::BF16),
        (7, DType::BF16),
        (130, DType::F32),
        (300, DType::F32),
    ];
    for g in [16usize, 32, 64, 128] {
        for zeros in [false, true] {
            for (m, dtype) in shapes {
                let (k, n) = (256usize, 9usize);
                let mut a = int4_args(m, k, n, g, zeros, dtype)?;
                a.attrs.activations = ActQuant::Int8;
                let ours = linear_int4(&a)?;
                let want = reference(&OpArgs::LinearInt4(a.clone()))?;
                assert_gemm_close(&ours, &want, k, 1.0, &format!("int4 x int8 g{g} zeros={zeros} m{m} {dtype}"));
                // The attribute changes the product: the f32-activation result is another one.
                a.attrs.activations = ActQuant::F32;
                assert_ne!(reference(&OpArgs::LinearInt4(a))?.to_f32_vec(), want.to_f32_vec());
            }
        }
    }
    // A NaN in x reaches its row's outputs on the integer path too, and only that row's.
    let mut a = int4_args(2, 256, 5, 32, false, DType::F32)?;
    a.attrs.activations = ActQuant::Int8;
    let mut x = a.x.to_f32_vec();
    x[7] = f32::NAN;
    a.x = HostTensor::from_f32(&[2, 256], x)?;
    let out = linear_int4(&a)?.to_f32_vec();
    assert!(out[..5].iter().all(|v| v.is_nan()) && out[5..].iter().all(|v| v.is_finite()), "{out:?}");
    Ok(())
}

#[test]
fn a_bf16_weight_is_packed_once_and_reused_by_later_prefills() -> TestResult {
    if !simd::bf16_pairs_fast() || simd::amx_bf16() {
        // The pair path runs only where vdpbf16ps outruns f32 FMAs and there is no AMX;
        // elsewhere nothing is packed.
        return Ok(());
    }
    let a = lin(t(&[20, 96], 1, DType::BF16)?, t(&[72, 96], 2, DType::BF16)?, None);
    let want = reference(&OpArgs::Linear(a.clone()))?;
    super::prepare(&OpArgs::Linear(a.clone()))?;
    let before = crate::packed_weight_stats();
    for _ in 0..3 {
        assert_gemm_close(&linear(&a)?, &want, 96, 1.0, "prepared bf16 prefill");
    }
    let after = crate::packed_weight_stats();
    // Other tests pack their own weights meanwhile; this one's three calls all hit.
    assert!(after.hits >= before.hits + 3, "{before:?} -> {after:?}");
    assert!(after.entries >= 1 && after.bytes >= (72 * 96 * 2) as u64, "{after:?}");
    Ok(())
}
