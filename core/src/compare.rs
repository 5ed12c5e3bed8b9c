//! Comparing an output with the reference: NMSE, max-abs, and the tolerance table of the
//! E2E specification (§5).

use serde::Serialize;

use crate::model::dtype::DType;
use crate::model::op::Op;
use crate::tensor::HostTensor;

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

impl Category {
    /// The row an op's outputs are held to; `None` for tokenization (ids, compared exactly).
    pub fn of(op: Op) -> Option<Category> {
        Some(match op {
            Op::Attention | Op::PagedAttention => Category::Attention,
            Op::Rope => Category::Rope,
            Op::RmsNorm | Op::LayerNorm | Op::MoeRoute | Op::Quantize | Op::Dequantize | Op::Sample => Category::Norms,
            Op::Linear
            | Op::Swiglu
            | Op::Geglu
            | Op::Gelu
            | Op::Silu
            | Op::Embedding
            | Op::Mlp
            | Op::MoeExperts
            | Op::LinearW8a8
            | Op::LinearInt4
            | Op::PatchEmbed => Category::Gemm,
            Op::Tokenize => return None,
        })
    }
}

/// Exact equality: integer and fp8 outputs (tokens, expert ids, quantized values).
pub const EXACT: Tolerance = Tolerance { rtol: 0.0, atol: 0.0, ulp: 0.0 };

/// The tolerance for one output: exact for integer and fp8 dtypes, else the table's.
pub fn output_tolerance(category: Category, dtype: DType) -> Tolerance {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => tolerance(category, dtype),
        _ => EXACT,
    }
}

/// torch.testing.assert_close's default tolerance for float32: (rtol, atol).
const TORCH_F32: (f64, f64) = (1.3e-6, 1e-5);

/// The tolerance a check of a real call on this machine holds an output to (shadow checks,
/// `lz tune`'s lead-in calls): the table's, but for f32 GEMMs at least torch.testing's
/// float32 default. The table's 1e-6 is sized for the specification's fixtures; at a model's
/// reduction lengths two correct f32 kernels summing in other orders differ by a few 1e-6
/// from the f64 reference (K = 2048: oneDNN's matmul 6.0e-6, `cpu.linear.fast` 1.7e-6).
pub fn real_call_tolerance(category: Category, dtype: DType) -> Tolerance {
    let mut t = output_tolerance(category, dtype);
    if category == Category::Gemm && dtype == DType::F32 {
        (t.rtol, t.atol) = (t.rtol.max(TORCH_F32.0), t.atol.max(TORCH_F32.1));
    }
    t
}

/// An allclose tolerance: |out - ref| <= atol + rtol * |ref| for every element, or within
/// one unit in the last place of a 16-bit output dtype. Two results each rounded correctly
/// to f16/bf16 from slightly different exact values may land on neighbouring values; RoPE's
/// 16-bit tolerances are tighter than that step, so the step is allowed on top of the table.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tolerance {
    /// Relative.
    pub rtol: f64,
    /// Absolute.
    pub atol: f64,
    /// One ulp, relative, of the output dtype (0 for f32).
    pub ulp: f64,
}

/// One unit in the last place, relative, of a 16-bit float dtype.
pub fn ulp_rel(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        _ => 0.0,
    }
}

/// The specification's tolerance for a category and output dtype.
pub fn tolerance(category: Category, dtype: DType) -> Tolerance {
    let t = |rtol, atol| Tolerance { rtol, atol, ulp: ulp_rel(dtype) };
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
    /// The first element outside the tolerance: (index, reference, output).
    pub first_violation: Option<(usize, f64, f64)>,
}

/// The cosine similarity of `out` with `reference` over the pairs where both are finite:
/// 1 for the same direction, about 0 for unrelated values (seed 004's broken GEMM read
/// 0.006). Two all-zero vectors are alike (1); a zero vector against another is not (0).
pub fn cosine(reference: &[f64], out: &[f64]) -> f64 {
    let (mut dot, mut rr, mut oo) = (0.0, 0.0, 0.0);
    for (&r, &o) in reference.iter().zip(out) {
        if r.is_finite() && o.is_finite() {
            dot += r * o;
            rr += r * r;
            oo += o * o;
        }
    }
    match (rr > 0.0, oo > 0.0) {
        (true, true) => (dot / (rr.sqrt() * oo.sqrt())).clamp(-1.0, 1.0),
        (false, false) => 1.0,
        _ => 0.0,
    }
}

/// Compares `out` with `reference` (same length) under `tol`. A NaN where the reference
/// is finite (or the other way round) is a violation.
pub fn compare(reference: &[f64], out: &[f64], tol: Tolerance) -> Diff {
    let mut se = 0.0;
    let mut sr = 0.0;
    let mut max_abs: f64 = 0.0;
    let mut violations = 0;
    let mut first_violation = None;
    for (i, (&r, &o)) in reference.iter().zip(out).enumerate() {
        let d = (o - r).abs();
        let close = d <= tol.atol + tol.rtol * r.abs() || d <= tol.ulp * r.abs().max(o.abs());
        if r.is_nan() != o.is_nan() || !(close || (r.is_nan() && o.is_nan())) {
            violations += 1;
            first_violation.get_or_insert((i, r, o));
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
    Diff { nmse, max_abs, violations, elements: reference.len().max(out.len()), first_violation }
}

/// Holds `out` to `reference` under the table's tolerance for `category` and an output of
/// `dtype`: the one tolerance check of the test suites and the parity harness. The error
/// names `what`, how many elements are outside, the worst difference and the first of them.
pub fn check(what: &str, category: Category, dtype: DType, reference: &[f64], out: &[f64]) -> Result<(), String> {
    check_within(what, output_tolerance(category, dtype), reference, out)
        .map_err(|e| format!("{e} ({category:?} {dtype})"))
}

/// [`check`] of two tensors, which must also agree in shape and dtype.
pub fn check_tensors(what: &str, category: Category, reference: &HostTensor, out: &HostTensor) -> Result<(), String> {
    if (out.shape(), out.dtype()) != (reference.shape(), reference.dtype()) {
        let (o, r) = ((out.shape(), out.dtype()), (reference.shape(), reference.dtype()));
        return Err(format!("{what}: got {o:?}, expected {r:?}"));
    }
    check(what, category, reference.dtype(), &reference.to_f64_vec(), &out.to_f64_vec())
}

/// [`check`] under an explicit tolerance (values known in closed form, a bound a test states
/// for a reason of its own).
pub fn check_within(what: &str, tol: Tolerance, reference: &[f64], out: &[f64]) -> Result<(), String> {
    let d = compare(reference, out, tol);
    if d.violations == 0 {
        return Ok(());
    }
    let first = d.first_violation.map(|(i, r, o)| format!("; first: [{i}] expected {r} got {o}")).unwrap_or_default();
    Err(format!(
        "{what}: {} of {} elements outside rtol={:e} atol={:e}, max |diff| {:e}{first}",
        d.violations, d.elements, tol.rtol, tol.atol, d.max_abs
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_call_holds_f32_gemms_to_torch_defaults_and_everything_else_to_the_table() {
        let gemm = real_call_tolerance(Category::Gemm, DType::F32);
        assert_eq!((gemm.rtol, gemm.atol), (1.3e-6, 1e-5));
        for (c, d) in [(Category::Gemm, DType::BF16), (Category::Norms, DType::F32), (Category::Attention, DType::F32)]
        {
            assert_eq!(real_call_tolerance(c, d), tolerance(c, d));
        }
        assert_eq!(real_call_tolerance(Category::Gemm, DType::I32), EXACT);
    }

    #[test]
    fn cosine_tells_the_same_direction_from_a_permutation_and_zeros() {
        let r = [1.0, -2.0, 3.0, 0.5];
        assert!((cosine(&r, &r.map(|x| 2.0 * x)) - 1.0).abs() < 1e-12);
        assert!((cosine(&r, &r.map(|x| -x)) + 1.0).abs() < 1e-12);
        // A permuted output (seed 004's garbage: plausible values, wrong places) is far off.
        assert!(cosine(&r, &[3.0, 0.5, -2.0, 1.0]) < 0.5);
        assert_eq!(cosine(&[0.0; 3], &[0.0; 3]), 1.0);
        assert_eq!(cosine(&[0.0; 3], &[1.0, 0.0, 0.0]), 0.0);
        // Non-finite pairs are left out.
        assert!((cosine(&[1.0, f64::NAN, 2.0], &[1.0, 5.0, 2.0]) - 1.0).abs() < 1e-12);
    }

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
        assert_eq!(strict.first_violation, Some((2, 0.0, 0.0005)));
        // One bf16 ulp at 1.0 (2^-7) is accepted for RoPE although rtol is 1e-3.
        let rope = tolerance(Category::Rope, DType::BF16);
        assert_eq!(compare(&[1.0], &[1.0 + 2f64.powi(-7)], rope).violations, 0);
        assert_eq!(compare(&[1.0], &[1.0 + 2f64.powi(-6)], rope).violations, 1);
        assert_eq!(compare(&[1.0], &[f64::NAN], tolerance(Category::Rope, DType::BF16)).violations, 1);
        assert_eq!(compare(&[0.0, 0.0], &[0.0, 0.0], tolerance(Category::Rope, DType::F32)).nmse, 0.0);
    }
}
