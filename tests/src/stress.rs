//! The allocation-fragmentation stress of E2E §11.3: projections and norms over many tensor
//! sizes, each dispatched with freshly allocated outputs, in another order every round, so
//! that the allocator sees blocks of every size freed and reused in shuffled order. The test
//! (`tests/decode_alloc.rs`) runs a few rounds and bounds what stays allocated and resident;
//! the example `fragmentation` runs many and reports the time of each.

use layerzero::compare::Category;
use layerzero::exec::args::{LinearArgs, NormArgs, OpArgs};
use layerzero::model::attrs::{NoAttrs, NormAttrs};
use layerzero::tensor::HostTensor;
use layerzero::{Dispatch, LayerZero};

use crate::TestResult;

/// Rows of every case: small and odd, so that no two sizes share an allocation class.
const ROWS: [usize; 8] = [1, 3, 7, 16, 31, 64, 127, 250];
/// (input width, output width) of the projections; widths of the norms are the inputs.
const WIDTHS: [(usize, usize); 5] = [(16, 24), (48, 80), (96, 40), (200, 136), (328, 64)];

fn tensor(shape: &[usize], seed: usize) -> TestResult<HostTensor> {
    let n: usize = shape.iter().product();
    let v = (0..n).map(|i| (((i + seed) * 7919 % 97) as f32 - 48.0) / 97.0).collect();
    Ok(HostTensor::from_f32(shape, v)?)
}

/// Every case: a projection and a norm per (rows, width), 80 in all, f32.
pub fn cases() -> TestResult<Vec<OpArgs>> {
    let mut out = Vec::new();
    for (i, &rows) in ROWS.iter().enumerate() {
        for (j, &(k, n)) in WIDTHS.iter().enumerate() {
            out.push(OpArgs::Linear(LinearArgs {
                x: tensor(&[rows, k], i + j)?,
                weight: tensor(&[n, k], 3 * j + 1)?,
                bias: None,
                attrs: NoAttrs {},
            }));
            out.push(OpArgs::RmsNorm(NormArgs {
                x: tensor(&[rows, k], i * j + 2)?,
                weight: tensor(&[k], j)?,
                bias: None,
                residual: None,
                attrs: NormAttrs { eps: Some(1e-6) },
            }));
        }
    }
    Ok(out)
}

/// The parity table's category for a case's output.
pub fn category(args: &OpArgs) -> Category {
    match args {
        OpArgs::Linear(_) => Category::Gemm,
        _ => Category::Norms,
    }
}

/// The order of round `round` over `n` cases: a seeded shuffle (Fisher-Yates on SplitMix64).
pub fn order(round: u64, n: usize) -> Vec<usize> {
    let mut state = 0x11_3f4a_6e5d_0001u64 ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut idx: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        idx.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    idx
}

/// One round: every case dispatched once in round `round`'s order, each with new outputs,
/// handed to `check` with its index and then dropped.
pub fn round(
    lz: &LayerZero,
    cases: &[OpArgs],
    round: u64,
    mut check: impl FnMut(usize, &Dispatch<'_>) -> TestResult,
) -> TestResult {
    for i in order(round, cases.len()) {
        let d = lz.dispatch(&cases[i]).map_err(|e| format!("case {i} ({}): {e}", cases[i].op().as_str()))?;
        check(i, &d)?;
    }
    Ok(())
}
