//! Helpers of the `cpu` kernels' parity tests: deterministic inputs, strided views, and the
//! check of a fast kernel against the reference oracle.

use crate::TestResult;
use layerzero_core::compare::{Category, compare, tolerance};
use layerzero_core::exec::args::{OpArgs, strided_copy};
use layerzero_core::exec::executor::{KernelError, Registry};
use layerzero_core::model::dtype::DType;
use layerzero_core::tensor::HostTensor;

pub(super) use layerzero_reference::test_util::values;

/// Deterministic values in [-scale, scale) of `dtype`.
pub(super) fn t(shape: &[usize], seed: u64, dtype: DType, scale: f32) -> TestResult<HostTensor> {
    let n = shape.iter().product();
    let v: Vec<f32> = values(n, seed).into_iter().map(|x| x * scale).collect();
    Ok(HostTensor::from_f32_as(dtype, shape, &v)?)
}

/// Views of the same values with other strides: rows padded, the last dim strided by 2,
/// and (rank 2) the transpose of a column-major copy.
pub(super) fn strided(x: &HostTensor) -> TestResult<Vec<HostTensor>> {
    let sh = x.shape();
    let r = sh.len();
    let mut out = Vec::new();
    let mut pad = vec![1usize; r];
    let mut two = vec![2usize; r];
    for d in (0..r.saturating_sub(1)).rev() {
        pad[d] = pad[d + 1] * (sh[d + 1] + if d + 1 == r - 1 { 3 } else { 0 });
        two[d] = two[d + 1] * sh[d + 1] + 1;
    }
    out.push(strided_copy(x, &pad)?);
    out.push(strided_copy(x, &two)?);
    if r == 2 {
        let cm = strided_copy(x, &[1, sh[0]])?;
        assert!(!cm.is_contiguous() || sh[0] <= 1 || sh[1] <= 1);
        out.push(cm);
    }
    Ok(out)
}

/// Runs `fast` and `reference` on `args` and holds every output of `fast` to the
/// reference's within the specification's tolerance for its dtype.
pub(super) fn check(fast: &str, reference: &str, args: &OpArgs, category: Category, what: &str) -> TestResult {
    let r = registry();
    let want = r
        .get(reference)
        .ok_or_else(|| format!("{reference} is not registered"))?
        .run(args)
        .map_err(|e| format!("{what}: reference: {e}"))?;
    let got = r
        .get(fast)
        .ok_or_else(|| format!("{fast} is not registered"))?
        .run(args)
        .map_err(|e| format!("{what}: {e}"))?;
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{what}: outputs");
    for (name, w) in &want {
        let g = &got[name];
        assert_eq!((g.shape(), g.dtype()), (w.shape(), w.dtype()), "{what}: {name} shape/dtype");
        assert!(g.is_contiguous(), "{what}: {name} contiguous");
        let d = compare(&w.to_f64_vec(), &g.to_f64_vec(), tolerance(category, w.dtype()));
        assert_eq!(d.violations, 0, "{what}: {name}: {d:?}");
    }
    Ok(())
}

/// Runs `kernel` and returns its `InvalidInput` message.
pub(super) fn invalid_message(kernel: &str, args: &OpArgs) -> TestResult<String> {
    Ok(match registry().get(kernel).ok_or_else(|| format!("{kernel} is not registered"))?.run(args) {
        Err(KernelError::InvalidInput(m)) => m,
        other => panic!("{kernel}: expected invalid input, got {other:?}"),
    })
}

/// The `cpu` kernels and the reference oracle they are held to.
pub(super) fn registry() -> Registry {
    let mut r = Registry::new();
    super::register(&mut r);
    layerzero_reference::register(&mut r);
    r
}
