//! Comparing an output with the reference: NMSE, max-abs, and the tolerance table of the
//! E2E specification (§5).

use serde::Serialize;

use crate::model::dtype::DType;

/// Which row of the tolerance table applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Attention (dense and paged).
    Attention,
    /// Norms.
    Norms,
    /// GEMM / MLP.
    Gemm,
    /// RoPE / ALiBi.
    Rope,
}

/// An allclose tolerance: |out - ref| <= atol + rtol * |ref| for every element.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tolerance {
    /// Relative.
    pub rtol: f64,
    /// Absolute.
    pub atol: f64,
}

/// The specification's tolerance for a category and output dtype.
pub fn tolerance(category: Category, dtype: DType) -> Tolerance {
    let t = |rtol, atol| Tolerance { rtol, atol };
    match (category, dtype) {
        (Category::Attention, DType::F16) => t(1e-3, 1e-3),
        (Category::Attention, DType::BF16) => t(1e-2, 1e-2),
        (Category::Attention, _) => t(1e-5, 1e-5),
        (Category::Norms | Category::Gemm, DType::F16) => t(1e-3, 1e-3),
        (Category::Norms | Category::Gemm, DType::BF16) => t(1e-2, 1e-2),
        (Category::Norms | Category::Gemm, _) => t(1e-6, 1e-6),
        (Category::Rope, DType::F16) => t(1e-4, 1e-4),
        (Category::Rope, DType::BF16) => t(1e-3, 1e-3),
        (Category::Rope, _) => t(1e-6, 1e-6),
    }
}

/// How far an output is from the reference.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Diff {
    /// mse(ref, out) / mse(ref, 0); 0 when both are all zeros.
    pub nmse: f64,
    /// max |out - ref|.
    pub max_abs: f64,
    /// Elements outside the tolerance.
    pub violations: usize,
    /// Elements compared.
    pub elements: usize,
}

/// Compares `out` with `reference` (same length) under `tol`. A NaN where the reference
/// is finite (or the other way round) is a violation.
pub fn compare(reference: &[f64], out: &[f64], tol: Tolerance) -> Diff {
    let mut se = 0.0;
    let mut sr = 0.0;
    let mut max_abs: f64 = 0.0;
    let mut violations = 0;
    for (&r, &o) in reference.iter().zip(out) {
        let d = (o - r).abs();
        if r.is_nan() != o.is_nan() || !(d <= tol.atol + tol.rtol * r.abs() || (r.is_nan() && o.is_nan())) {
            violations += 1;
        }
        if d.is_finite() {
            se += d * d;
            max_abs = max_abs.max(d);
        } else if !(r.is_nan() && o.is_nan()) {
            max_abs = f64::INFINITY;
        }
        sr += r * r;
    }
    if reference.len() != out.len() {
        violations += reference.len().abs_diff(out.len());
    }
    let nmse = if sr > 0.0 {
        se / sr
    } else if se == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    Diff { nmse, max_abs, violations, elements: reference.len().max(out.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nmse_and_tolerance_follow_their_definitions() {
        let r = [1.0, -2.0, 0.0, 4.0];
        let o = [1.0, -2.0, 0.0005, 4.001];
        let d = compare(&r, &o, tolerance(Category::Attention, DType::F16));
        assert_eq!(d.violations, 0);
        assert!((d.nmse - (0.0005f64.powi(2) + 0.001f64.powi(2)) / 21.0).abs() < 1e-15);
        assert!((d.max_abs - 0.001).abs() < 1e-12);
        let strict = compare(&r, &o, tolerance(Category::Attention, DType::F32));
        assert_eq!(strict.violations, 2);
        assert_eq!(compare(&[1.0], &[f64::NAN], tolerance(Category::Rope, DType::BF16)).violations, 1);
        assert_eq!(compare(&[0.0, 0.0], &[0.0, 0.0], tolerance(Category::Rope, DType::F32)).nmse, 0.0);
    }
}
