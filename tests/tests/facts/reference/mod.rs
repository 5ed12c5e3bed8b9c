//! The reference kernels' facts (`capabilities/cpu_reference.json`), each held to the line of
//! our code that implements or enforces it.

mod attention;
mod linear;
mod rows;

use super::*;

const MOD: &str = "layerzero/src/backend/cpu_reference/mod.rs";
const ACTIVATION: &str = "layerzero/src/backend/cpu_reference/activation.rs";
const MOE: &str = "layerzero/src/backend/cpu_reference/moe.rs";

/// `req` with its tensors `names` in `dtype`.
fn retyped(req: Request, names: &[&str], dtype: DType) -> Request {
    let mut out = req.clone();
    for name in names {
        let mut t: TensorDesc = req.get(name).cloned().unwrap_or_else(|| panic!("no {name}"));
        t.dtype = dtype;
        out = out.tensor(name, t);
    }
    out
}

/// `req` with tensor `name` read every other element along its last dim (`stride(-1) == 2`).
fn every_other(req: Request, name: &str) -> Request {
    let t: TensorDesc = req.get(name).cloned().unwrap_or_else(|| panic!("no {name}"));
    let mut strides = vec![2u64; t.shape.len()];
    for d in (0..t.shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * t.shape[d + 1];
    }
    let t = t.with_strides(strides);
    req.tensor(name, t)
}

pub(super) fn facts() -> Vec<Fact> {
    let mut rows = attention::attention();
    rows.extend(attention::paged_attention());
    rows.extend(rows::row_ops());
    rows.extend(linear::matrix_ops());
    rows
}
