//! Our CPU kernels' facts (`capabilities/cpu.json`), each held to the line of our code that
//! implements or enforces it.
//!
//! Where a declared limit is narrower than what the code computes (a conservative
//! declaration: the code would run the request, but it is not tested there), the row cites
//! the line that does the work and says so.

mod attention;
mod linear;
mod rows;

use super::*;

const PACK: &str = "layerzero/src/backend/cpu/pack.rs";
const MOE: &str = "layerzero/src/backend/cpu/moe.rs";

/// `t` as a view that reads every other element of a twice-as-wide buffer (last stride 2).
fn every_other(t: TensorDesc) -> TensorDesc {
    let mut strides = vec![2u64; t.shape.len()];
    for d in (0..t.shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * t.shape[d + 1];
    }
    t.with_strides(strides)
}

/// `req` with its tensor `name` read through [`every_other`].
fn strided(req: Request, name: &str) -> Request {
    let t: TensorDesc = req.get(name).cloned().unwrap_or_else(|| panic!("no {name}"));
    req.tensor(name, every_other(t))
}

pub(super) fn facts() -> Vec<Fact> {
    let mut rows = attention::attention_facts();
    rows.extend(attention::paged_facts());
    rows.extend(rows::rope_facts());
    rows.extend(rows::row_facts());
    rows.extend(linear::linear_facts());
    rows.extend(linear::quant_facts());
    rows.extend(linear::gemm_facts());
    rows
}
