//! `cpu_reference`: obviously-correct kernels (plain loops, f64 accumulation), the oracle
//! every other kernel is held to.
//!
//! Every kernel reads its inputs through their shapes and strides (any view works), checks
//! every dimension it relies on and answers bad input with `KernelError::InvalidInput`
//! naming the tensor, the position and the value; it never indexes out of bounds.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub(crate) mod activation;
pub mod attention;
mod embedding;
pub(crate) mod linear;
pub(crate) mod mlp;
pub(crate) mod moe;
pub(crate) mod norm;
pub mod paged;
pub mod patch;
mod quant;
pub mod rope;
mod sample;

use std::sync::Arc;

use half::{bf16, f16};

use layerzero_core::exec::args::{OpArgs, Outputs};
use layerzero_core::exec::check::{expect_rank, invalid};
use layerzero_core::exec::executor::{KernelError, Registry};
use layerzero_core::model::dtype::DType;
use layerzero_core::model::layout::Layout;
use layerzero_core::model::op::Op;
use layerzero_core::tensor::{HostTensor, Storage};

/// Dense attention kernel id.
pub const ATTENTION: &str = "cpu_reference.attention.naive";
/// Paged attention kernel id.
pub const PAGED_ATTENTION: &str = "cpu_reference.paged_attention.naive";
/// RoPE kernel id.
pub const ROPE: &str = "cpu_reference.rope.naive";

/// Binds this backend's kernels.
pub fn register(registry: &mut Registry) {
    registry.register(
        ATTENTION,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Attention(a) => attention::attention(a).map(out),
            other => Err(wrong_op(ATTENTION, Op::Attention, other)),
        }),
    );
    registry.register(
        PAGED_ATTENTION,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::PagedAttention(a) => paged::paged_attention(a).map(out),
            other => Err(wrong_op(PAGED_ATTENTION, Op::PagedAttention, other)),
        }),
    );
    norm::register(registry);
    activation::register(registry);
    embedding::register(registry);
    linear::register(registry);
    quant::register(registry);
    mlp::register(registry);
    sample::register(registry);
    moe::register(registry);
    patch::register(registry);
    registry.register(
        ROPE,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::Rope(a) => rope::rope(a),
            other => Err(wrong_op(ROPE, Op::Rope, other)),
        }),
    );
}

fn out(t: HostTensor) -> Outputs {
    Outputs::from([("out", t)])
}

fn wrong_op(kernel: &str, expected: Op, got: &OpArgs) -> KernelError {
    KernelError::Unsupported(format!("{kernel} runs {expected}; it was given {} arguments", got.op()))
}

/// A contiguous tensor of `dtype` from f64 values, rounded once (f64 -> f16/bf16 directly,
/// not through f32, so the oracle adds no double rounding).
pub(crate) fn from_f64_as(dtype: DType, shape: &[usize], values: &[f64]) -> Result<HostTensor, KernelError> {
    let storage = match dtype {
        DType::F32 => Storage::F32(values.iter().map(|&x| x as f32).collect()),
        DType::F16 => Storage::F16(values.iter().map(|&x| f16::from_f64(x)).collect()),
        DType::BF16 => Storage::BF16(values.iter().map(|&x| bf16::from_f64(x)).collect()),
        other => Storage::from_f32(other, &values.iter().map(|&x| x as f32).collect::<Vec<_>>()),
    };
    HostTensor::new(storage, shape).map_err(|e| KernelError::Failed(format!("building the output: {e}")))
}

/// Zeros for an output of `shape`, or an error when its size overflows.
pub(crate) fn zeros_for(shape: &[usize]) -> Result<Vec<f64>, KernelError> {
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    n.map(|n| vec![0.0; n]).ok_or_else(|| invalid(format!("the output shape {shape:?} overflows")))
}

/// The values of an integer index tensor (i32 or i64), in logical order.
pub(crate) fn index_values(name: &str, t: &HostTensor) -> Result<Vec<i64>, KernelError> {
    match t.dtype() {
        DType::I32 | DType::I64 => Ok(t.to_i64_vec()),
        other => Err(invalid(format!("tensor `{name}` has dtype {other}; expected i32 or i64"))),
    }
}

/// A rank-4 attention tensor read as `[b, s, h, d]` whatever its layout (BSHD or BHSD,
/// from its tag; untagged is BSHD) and strides.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads<'a> {
    t: &'a HostTensor,
    bhsd: bool,
    /// Batch.
    pub b: usize,
    /// Sequence length.
    pub s: usize,
    /// Heads.
    pub h: usize,
    /// Head dim.
    pub d: usize,
}

impl<'a> Heads<'a> {
    pub(crate) fn new(name: &str, t: &'a HostTensor) -> Result<Heads<'a>, KernelError> {
        let layout = t.layout().unwrap_or(Layout::Bshd);
        let bhsd = match layout {
            Layout::Bshd => false,
            Layout::Bhsd => true,
            other => return Err(invalid(format!("tensor `{name}` has layout {other}; expected BSHD or BHSD"))),
        };
        expect_rank(name, t, 4, &format!("rank 4 ({layout})"))?;
        let sh = t.shape();
        let (b, s, h, d) = if bhsd { (sh[0], sh[2], sh[1], sh[3]) } else { (sh[0], sh[1], sh[2], sh[3]) };
        Ok(Heads { t, bhsd, b, s, h, d })
    }

    /// Element `[b, s, h, d]` (callers stay within the dims checked at construction).
    #[inline]
    pub(crate) fn at(&self, b: usize, s: usize, h: usize, d: usize) -> f64 {
        if self.bhsd { self.t.at(&[b, h, s, d]) } else { self.t.at(&[b, s, h, d]) }
    }

    /// The row-major index of `[b, s, h, d]` in a contiguous tensor of this layout with
    /// head dim `dv` (where outputs are written).
    #[inline]
    pub(crate) fn out_index(&self, b: usize, s: usize, h: usize, d: usize, dv: usize) -> usize {
        if self.bhsd { ((b * self.h + h) * self.s + s) * dv + d } else { ((b * self.s + s) * self.h + h) * dv + d }
    }

    /// The shape of an output in this layout with head dim `dv`.
    pub(crate) fn out_shape(&self, dv: usize) -> [usize; 4] {
        if self.bhsd { [self.b, self.h, self.s, dv] } else { [self.b, self.s, self.h, dv] }
    }

    /// The layout tag.
    pub(crate) fn layout(&self) -> Layout {
        if self.bhsd { Layout::Bhsd } else { Layout::Bshd }
    }
}

/// Deterministic inputs for the tests of this oracle and of the kernels held to it.
#[doc(hidden)]
pub mod test_util {
    use layerzero_core::compare::{Tolerance, check_within};
    use layerzero_core::error::Result;
    use layerzero_core::model::layout::Layout;
    use layerzero_core::tensor::HostTensor;

    /// Deterministic values in [-1, 1) (a small LCG; no dependency).
    pub fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((x >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
            })
            .collect()
    }

    /// A contiguous f32 tensor of deterministic values with a layout tag.
    pub fn tensor(shape: &[usize], seed: u64, layout: Layout) -> Result<HostTensor> {
        let n = shape.iter().product();
        Ok(HostTensor::from_f32(shape, values(n, seed))?.with_layout(layout))
    }

    /// Asserts that `got` is within `atol` of the values `want` computed in closed form (the
    /// one tolerance check, `compare::check_within`, with an absolute bound).
    pub fn close(got: &[f32], want: &[f32], atol: f32) {
        let widen = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let tol = Tolerance { rtol: 0.0, atol: f64::from(atol), ulp: 0.0 };
        let close = check_within("values", tol, &widen(want), &widen(got));
        assert!(close.is_ok(), "{}", close.err().unwrap_or_default());
    }
}

/// What a unit test, or a helper of one, returns: a failed call is an `Err` the harness
/// prints, not a panic.
#[cfg(test)]
type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

#[cfg(test)]
mod tests {
    use super::*;
    use layerzero_core::exec::args::{AttentionArgs, RopeArgs};
    use layerzero_core::model::attrs::{AttentionAttrs, RopeAttrs};

    #[test]
    fn registers_three_kernels_that_reject_the_wrong_op() -> TestResult {
        let mut r = Registry::new();
        register(&mut r);
        assert!(r.contains(ATTENTION) && r.contains(PAGED_ATTENTION) && r.contains(ROPE));
        let q = test_util::tensor(&[1, 2, 1, 4], 1, Layout::Bshd)?;
        let att = OpArgs::Attention(AttentionArgs {
            q: q.clone(),
            k: q.clone(),
            v: q.clone(),
            mask: None,
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            attrs: AttentionAttrs::default(),
        });
        let outs = r.get(ATTENTION).ok_or("attention is not registered")?.run(&att)?;
        assert_eq!(outs["out"].shape(), &[1, 2, 1, 4]);
        assert!(matches!(r.get(ROPE).ok_or("rope is not registered")?.run(&att), Err(KernelError::Unsupported(_))));
        assert!(matches!(
            r.get(PAGED_ATTENTION).ok_or("paged_attention is not registered")?.run(&att),
            Err(KernelError::Unsupported(_))
        ));
        let rope =
            OpArgs::Rope(RopeArgs { q, k: None, positions: None, cos: None, sin: None, attrs: RopeAttrs::default() });
        assert!(r.get(ROPE).ok_or("rope is not registered")?.run(&rope)?.contains_key("out"));
        assert!(matches!(
            r.get(ATTENTION).ok_or("attention is not registered")?.run(&rope),
            Err(KernelError::Unsupported(_))
        ));
        Ok(())
    }
}
