//! The reference kernels' facts (`capabilities/cpu_reference.json`), each held to the line of
//! our code that implements or enforces it.

mod attention;
pub(in crate::facts) mod linear;
mod rows;

use super::*;

const MOD: &str = "backends/reference/src/lib.rs";
const ACTIVATION: &str = "backends/reference/src/activation.rs";
const MOE: &str = "backends/reference/src/moe.rs";

/// `req` with its tensors `names` in `dtype`.
fn retyped(req: Request, names: &[&str], dtype: DType) -> TestResult<Request> {
    let mut out = req.clone();
    for name in names {
        let mut t: TensorDesc = req.get(name).cloned().ok_or_else(|| format!("no {name}"))?;
        t.dtype = dtype;
        out = out.tensor(name, t);
    }
    Ok(out)
}

pub(super) fn facts() -> TestResult<Vec<Fact>> {
    let mut rows = attention::attention()?;
    rows.extend(attention::paged_attention()?);
    rows.extend(rows::row_ops()?);
    rows.extend(linear::matrix_ops()?);
    Ok(rows)
}
