use super::*;
use crate::TestResult;

#[test]
fn transpose_round_bf16_matches_the_scalar_rounding() {
    let (nb, rows, ldc) = (50usize, 37usize, 40usize);
    let mut c: Vec<f32> = (0..nb * ldc).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.0137).collect();
    (c[3], c[ldc + 5], c[17 * ldc + 20], c[2 * ldc]) = (f32::NAN, f32::INFINITY, -f32::NAN, 1e-40);
    let bias: Vec<f32> = (0..nb).map(|j| j as f32 * 0.25 - 3.0).collect();
    for b in [None, Some(&bias[..])] {
        let mut out = vec![vec![half::bf16::ZERO; nb + 3]; rows];
        let mut refs: Vec<&mut [half::bf16]> = out.iter_mut().map(|r| &mut r[..]).collect();
        transpose_round_bf16(&c, ldc, nb, b, &mut refs, 2);
        for (i, row) in out.iter().enumerate() {
            for j in 0..nb {
                let want = half::bf16::from_f32(c[j * ldc + i] + b.map_or(0.0, |b| b[j]));
                let got = row[2 + j];
                assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{i} {j}");
            }
        }
    }
}

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

#[test]
fn gemm_matches_the_portable_loops_on_odd_shapes() {
    let mut seed = 7u64;
    for &(m, n, k) in &[(1, 1, 1), (6, 64, 128), (7, 65, 3), (13, 130, 80), (64, 128, 96), (5, 17, 256), (2, 9, 1)] {
        for acc in [false, true] {
            let (lda, ldb, ldc) = (k + 3, n + 5, n + 2);
            let a: Vec<f32> = (0..m * lda).map(|_| lcg(&mut seed)).collect();
            let b: Vec<f32> = (0..k * ldb).map(|_| lcg(&mut seed)).collect();
            let c0: Vec<f32> = (0..m * ldc).map(|_| lcg(&mut seed)).collect();
            let mut c1 = c0.clone();
            let mut c2 = c0.clone();
            gemm(m, n, k, &a, lda, &b, ldb, &mut c1, ldc, acc);
            gemm_reference(m, n, k, &a, lda, &b, ldb, &mut c2, ldc, acc);
            for i in 0..m * ldc {
                assert!((c1[i] - c2[i]).abs() < 1e-4, "{m}x{n}x{k} acc={acc} at {i}: {} vs {}", c1[i], c2[i]);
            }
            // Padding columns beyond n are untouched.
            for i in 0..m {
                for j in n..ldc {
                    assert_eq!(c1[i * ldc + j], c0[i * ldc + j]);
                }
            }
        }
    }
}

#[test]
fn amx_gemm_matches_the_f32_gemm_on_bf16_values() {
    if !amx_bf16() {
        return;
    }
    let mut seed = 3u64;
    let bf = |x: f32| half::bf16::from_f32(x);
    for &(m, n, k2, acc) in
        &[(16usize, 16usize, 16usize, false), (48, 80, 32, true), (64, 160, 48, false), (32, 64, 16, true)]
    {
        let (lda, ldc) = (2 * k2 + 6, n + 4);
        let a: Vec<half::bf16> = (0..m * lda).map(|_| bf(lcg(&mut seed))).collect();
        // B as f32 k x n (row-major) and as 64-column pair panels.
        let bm: Vec<half::bf16> = (0..2 * k2 * n).map(|_| bf(lcg(&mut seed))).collect();
        let panels = n.div_ceil(AMX_PANEL);
        let pstride = k2 * AMX_PANEL + 8;
        let mut bp = vec![0u32; panels * pstride];
        for p in 0..k2 {
            for j in 0..n {
                let (lo, hi) = (bm[2 * p * n + j].to_bits(), bm[(2 * p + 1) * n + j].to_bits());
                bp[(j / AMX_PANEL) * pstride + p * AMX_PANEL + j % AMX_PANEL] = u32::from(lo) | (u32::from(hi) << 16);
            }
        }
        let c0: Vec<f32> = (0..m * ldc).map(|_| lcg(&mut seed)).collect();
        let (mut c1, mut c2) = (c0.clone(), c0.clone());
        let a_bits: Vec<u16> = a.iter().map(|x| x.to_bits()).collect();
        gemm_amx_bf16(m, n, k2, &a_bits, lda, &bp, pstride, &mut c1, ldc, acc);
        let af: Vec<f32> = a.iter().map(|x| x.to_f32()).collect();
        let bf32: Vec<f32> = bm.iter().map(|x| x.to_f32()).collect();
        gemm_reference(m, n, 2 * k2, &af, lda, &bf32, n, &mut c2, ldc, acc);
        for i in 0..m * ldc {
            assert!((c1[i] - c2[i]).abs() < 1e-4, "{m}x{n}x{k2} at {i}: {} vs {}", c1[i], c2[i]);
        }
    }
}

#[test]
fn exp_is_accurate_and_zero_for_minus_infinity() {
    let mut x: Vec<f32> = (-1000..=1000).map(|i| i as f32 * 0.087).collect();
    x.push(f32::NEG_INFINITY);
    x.push(f32::NEG_INFINITY);
    let orig = x.clone();
    let s = exp_sub_sum(&mut x, 0.0);
    let mut want = 0f64;
    for (y, &o) in x.iter().zip(&orig) {
        let e = f64::from(o).exp();
        want += e;
        if o < -87.0 {
            // Zero, or the (sub)normal value itself.
            assert!(*y >= 0.0 && *y < 2e-38, "exp({o}) = {y}");
        } else if o > 88.0 {
            assert!(*y > 1e38, "exp({o}) = {y}");
        } else {
            assert!((f64::from(*y) - e).abs() <= 3e-7 * e, "exp({o}) = {y}, want {e}");
        }
    }
    assert!(want > 1e38 || (f64::from(s) - want).abs() < 1e-5 * want);
    assert_eq!(x[x.len() - 1], 0.0);
    // The scalar form is 0 below -87.
    assert_eq!(exp_approx(-87.5), 0.0);
    assert_eq!(exp_approx(f32::NEG_INFINITY), 0.0);
    assert!(exp_approx(f32::NAN).is_nan());
    let mut nan = [f32::NAN, 0.0];
    assert!(exp_sub_sum(&mut nan, 0.0).is_nan());
}

#[test]
fn reductions_and_dots() {
    let x: Vec<f32> = (0..37).map(|i| ((i * 7) % 11) as f32 - 3.0).collect();
    assert_eq!(row_max(&x), 7.0);
    assert_eq!(row_max(&[]), f32::NEG_INFINITY);
    let q: Vec<f32> = (0..3 * 41).map(|i| (i % 5) as f32).collect();
    let k: Vec<f32> = (0..41).map(|i| (i % 3) as f32).collect();
    let mut out = [0f32; 3];
    dots(&q, 41, &k, &mut out);
    for r in 0..3 {
        let want: f32 = (0..41).map(|i| q[r * 41 + i] * k[i]).sum();
        assert!((out[r] - want).abs() < 1e-3);
    }
    let mut y = vec![1f32; 19];
    axpy(&mut y, 2.0, &k[..19]);
    assert_eq!(y[2], 5.0);
    scale(&mut y, 0.5);
    assert_eq!(y[2], 2.5);
}

#[test]
fn bf16_dot_sums_match_f64_sums_or_decline() -> TestResult {
    if !avx512_bf16() {
        assert!(sums_bf16_dp(&[half::bf16::ONE]).is_none());
        return Ok(());
    }
    let mut seed = 5;
    // Lengths around the 64-element steps, the 32-element tail and the 512 blocks.
    for n in [1usize, 31, 32, 33, 63, 64, 65, 511, 512, 513, 4096 + 37] {
        let x: Vec<half::bf16> = (0..n).map(|_| half::bf16::from_f32(lcg(&mut seed) * 3.0 + 0.5)).collect();
        let (s, q) = sums_bf16_dp(&x).ok_or_else(|| format!("n {n}: a finite row declined"))?;
        let ws: f64 = x.iter().map(|v| f64::from(v.to_f32())).sum();
        let wq: f64 = x.iter().map(|v| f64::from(v.to_f32()).powi(2)).sum();
        assert!((s - ws).abs() <= 1e-5 * wq.sqrt() * (n as f64).sqrt() + 1e-9, "n {n}: {s} vs {ws}");
        assert!((q - wq).abs() <= 2e-6 * wq, "n {n}: {q} vs {wq}");
    }
    // Squares past f32 and non-finite values are left to the f64 form.
    assert!(sums_bf16_dp(&[half::bf16::from_f32(1e30); 3]).is_none());
    assert!(sums_bf16_dp(&[half::bf16::ONE, half::bf16::NAN]).is_none());
    assert_eq!(sums_bf16_dp(&[]), Some((0.0, 0.0)));
    Ok(())
}
