//! Outputs held to a reference under the parity table's tolerance: the core's check
//! (`layerzero::compare::check`), the one tolerance the tests use, as a test result.

use layerzero::compare::{self, Category};
use layerzero::model::dtype::DType;
use layerzero::tensor::HostTensor;

use crate::TestResult;

/// `got` is within the tolerance of `category` for an output of `dtype` of `want`.
pub fn values(what: &str, category: Category, dtype: DType, want: &[f64], got: &[f64]) -> TestResult {
    Ok(compare::check(what, category, dtype, want, got)?)
}

/// The same for two tensors, which must also agree in shape and dtype.
pub fn tensors(what: &str, category: Category, want: &HostTensor, got: &HostTensor) -> TestResult {
    Ok(compare::check_tensors(what, category, want, got)?)
}
