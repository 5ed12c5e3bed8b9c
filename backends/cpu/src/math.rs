//! Scalar math shared by the kernels: erf and erfc in f32. `erfc` is Numerical Recipes'
//! Chebyshev fit `erfc(z) = t exp(-z^2 - 1.26551223 + t P(t))`, `t = 1/(1 + z/2)` (relative
//! error of the fit 1.05e-7 for every z >= 0, 6.6e-7 evaluated in f32 for z < 2;
//! `erfc(-z) = 2 - erfc(z)`). `erfc_arg` is the fit's exponent, for callers that take the
//! exponential of many at once (the activations' vectorized `exp`).

use super::simd;

/// erfc(z) for z >= 0 from `t = 1/(1 + z/2)` and `e = exp(-z^2 + q(t))` (see the module
/// doc): the exponent's argument.
#[inline(always)]
pub(super) fn erfc_arg(z: f32, t: f32) -> f32 {
    let mut p = 0.170_872_77f32;
    p = p * t - 0.822_152_23;
    p = p * t + 1.488_515_9;
    p = p * t - 1.135_204;
    p = p * t + 0.278_868_07;
    p = p * t - 0.186_288_06;
    p = p * t + 0.096_784_18;
    p = p * t + 0.374_091_96;
    p = p * t + 1.000_023_7;
    -z * z - 1.265_512_2 + t * p
}

/// erfc in f32 (NaN stays NaN). Against mpmath: relative error below 6.6e-7 for |x| < 2,
/// growing with the rounding of x^2 to 9e-6 at x = 9 (where erfc is 4e-37).
pub(crate) fn erfc_f32(x: f32) -> f32 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let e = t * simd::exp_approx(erfc_arg(z, t));
    if x < 0.0 { 2.0 - e } else { e }
}

/// erf in f32: a Taylor series below 0.8 (where `1 - erfc` would lose relative
/// precision), `1 - erfc` above; relative error below 1.6e-7 (against mpmath on 6500
/// points in [0, 9]).
#[cfg_attr(not(test), allow(dead_code))] // the f32 erf itself, held to known values by the tests
pub(crate) fn erf_f32(x: f32) -> f32 {
    let z = x.abs();
    if z < 0.8 {
        // 2/sqrt(pi) * x * sum_n (-1)^n (x^2)^n / (n! (2n+1)), n <= 9 (next term < 2e-9).
        const C: [f32; 10] = [
            1.0,
            -1.0 / 3.0,
            1.0 / 10.0,
            -1.0 / 42.0,
            1.0 / 216.0,
            -1.0 / 1320.0,
            1.0 / 9360.0,
            -1.0 / 75600.0,
            1.0 / 685_440.0,
            -1.0 / 6_894_720.0,
        ];
        let s = z * z;
        let mut p = C[9];
        for &c in C[..9].iter().rev() {
            p = p * s + c;
        }
        return (std::f32::consts::FRAC_2_SQRT_PI * z * p).copysign(x);
    }
    (1.0 - erfc_f32(z)).copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_f32_at_known_values() {
        // (x, erf(x as f32)) from mpmath.
        let known = [
            (0.0f32, 0.0f64),
            (1e-6, 1.1283791642462529e-06),
            (0.1, 0.11246291768297051),
            (0.5, 0.5204998778130465),
            (0.79, 0.7361034667923186),
            (0.81, 0.7480032819936904),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (3.0, 0.9999779095030014),
            (5.0, 0.9999999999984626),
        ];
        for (x, want) in known {
            let got = f64::from(erf_f32(x));
            assert!((got - want).abs() <= 2e-7 * want, "erf({x}) = {got} vs {want}");
            assert_eq!(erf_f32(-x), -erf_f32(x));
        }
        // erfc keeps relative precision far into the tail: erfc(5) = 1.5374597944280349e-12.
        let e = f64::from(erfc_f32(5.0));
        assert!((e / 1.537_459_794_428_035e-12 - 1.0).abs() < 2e-6, "{e}");
        assert_eq!(erfc_f32(-30.0), 2.0);
        assert_eq!(erfc_f32(f32::INFINITY), 0.0);
        assert!(erf_f32(f32::NAN).is_nan());
    }
}
