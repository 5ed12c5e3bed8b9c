//! Outputs held to a reference under the parity table's tolerance
//! (`layerzero::compare`): the one tolerance the tests use, with an error that says
//! what differed, where and by how much.

use layerzero::compare::{Category, compare, output_tolerance};
use layerzero::model::dtype::DType;
use layerzero::tensor::HostTensor;

use crate::TestResult;

/// `got` is within the tolerance of `category` for an output of `dtype` of `want`; else an
/// error naming `what`, how many elements are outside and the first of them.
pub fn values(what: &str, category: Category, dtype: DType, want: &[f64], got: &[f64]) -> TestResult {
    let tol = output_tolerance(category, dtype);
    let d = compare(want, got, tol);
    if d.violations == 0 {
        return Ok(());
    }
    let first = d.first_violation.map(|(i, r, o)| format!("; first: [{i}] expected {r} got {o}")).unwrap_or_default();
    Err(format!(
        "{what}: {} of {} elements outside {category:?} {dtype} (rtol={:e} atol={:e}), max |diff| {:e}{first}",
        d.violations, d.elements, tol.rtol, tol.atol, d.max_abs
    )
    .into())
}

/// The same for two tensors, which must also agree in shape and dtype.
pub fn tensors(what: &str, category: Category, want: &HostTensor, got: &HostTensor) -> TestResult {
    if (got.shape(), got.dtype()) != (want.shape(), want.dtype()) {
        let (g, w) = ((got.shape(), got.dtype()), (want.shape(), want.dtype()));
        return Err(format!("{what}: got {g:?}, expected {w:?}").into());
    }
    values(what, category, want.dtype(), &want.to_f64_vec(), &got.to_f64_vec())
}
