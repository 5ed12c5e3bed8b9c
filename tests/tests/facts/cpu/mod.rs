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

const PACK: &str = "backends/cpu/src/pack.rs";
const MOE: &str = "backends/cpu/src/moe.rs";

pub(super) fn facts() -> TestResult<Vec<Fact>> {
    let mut rows = attention::attention_facts()?;
    rows.extend(attention::paged_facts()?);
    rows.extend(rows::rope_facts()?);
    rows.extend(rows::row_facts()?);
    rows.extend(linear::linear_facts()?);
    rows.extend(linear::quant_facts()?);
    rows.extend(linear::gemm_facts()?);
    Ok(rows)
}
