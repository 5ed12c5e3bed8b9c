//! `cpu`: fast Rust kernels. Attention is flash-style (packed f32 tiles, AVX-512/AVX2
//! microkernels, online softmax, rayon over batch x kv head x query tile); decode and paged
//! attention split the cache into chunks merged by log-sum-exp; RoPE computes its angles in
//! f64. Semantics are those of `exec::semantics`, shared with `cpu_reference`.
//!
//! The driver is kept apart from the kernels, as tract keeps `frame/` apart from its ops: a
//! kernel imports driver modules and the core, never another kernel.
//!
//! | Driver | |
//! |---|---|
//! | `rows` | the element-wise/row driver: strided views read as rows, output element types, `fill` |
//! | `gemm` | the GEMM driver: prefill GEMM (packed, `matrixmultiply`, AMX, bf16 pairs), decode GEMV |
//! | `engine` | the attention engine that dense and paged attention share (tiles; `decode`: the split-KV path of few queries; `rotary`: RoPE fused into its reads), and their output |
//! | `pack` | strided tensors of any dtype read as f32, index tensors, BSHD/BHSD views |
//! | `alloc` | output buffers (huge pages, alignment, per-thread scratch) |
//! | `simd` | AVX-512/AVX2 loops and microkernels, picked at run time |
//! | `split` | whether work is worth spreading over rayon |
//! | `fork` | forked children: a rayon pool of their own instead of the parent's vanished one |
//! | `math` | scalar erf and erfc |
//!
//! | Kernels | |
//! |---|---|
//! | `attention`, `paged` | dense and paged attention on the engine |
//! | `norm`, `activation`, `embedding`, `rope` | row kernels (all but `rope` on `rows`) |
//! | `linear`, `mlp`, `patch`, `moe` | matrix products (all but `moe` on `gemm`) |
//! | `quant`, `quant4`, `sample` | quantize and dequantize (`quant4`: of packed 4-bit weights, on `gemm`'s row decoder); token sampling |

#![deny(unsafe_code)]
#![warn(missing_docs)]

// The driver.
mod alloc;
mod engine;
pub mod fork;
mod gemm;
mod math;
mod pack;
mod rows;
pub mod simd;
pub mod split;

// The kernels.
mod activation;
mod attention;
mod embedding;
mod linear;
mod mlp;
mod moe;
mod norm;
mod paged;
mod patch;
mod quant;
mod quant4;
mod rope;
mod sample;
mod team;

#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

/// What a unit test, or a helper of one, returns: a failed call is an `Err` the harness
/// prints, not a panic.
#[cfg(test)]
type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

use std::sync::Arc;

pub use alloc::scratch_bytes;
pub use gemm::{PackedWeightStats, packed_weight_stats};
pub use simd::set_cap as set_isa_cap;

use layerzero_core::exec::args::{OpArgs, Outputs};
use layerzero_core::exec::executor::{KernelError, Registry, WritesInto};

fn wrong_op(kernel: &str, args: &OpArgs) -> KernelError {
    KernelError::Unsupported(format!("{kernel} does not run {}", args.op()))
}

/// Binds this backend's kernels.
pub fn register(registry: &mut Registry) {
    registry.register(
        "cpu.attention.flash",
        Arc::new(WritesInto(|args: &OpArgs, bufs: &mut Outputs| match args {
            OpArgs::Attention(a) => attention::run(a, bufs),
            other => Err(wrong_op("cpu.attention.flash", other)),
        })),
    );
    registry.register(
        "cpu.paged_attention.split_kv",
        Arc::new(WritesInto(|args: &OpArgs, bufs: &mut Outputs| match args {
            OpArgs::PagedAttention(a) => paged::run(a, bufs),
            other => Err(wrong_op("cpu.paged_attention.split_kv", other)),
        })),
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
        "cpu.rope.fast",
        Arc::new(WritesInto(|args: &OpArgs, bufs: &mut Outputs| match args {
            OpArgs::Rope(a) => rope::run_into(a, bufs),
            other => Err(wrong_op("cpu.rope.fast", other)),
        })),
    );
}
