//! SIMD primitives of the fast CPU kernels, chosen once at run time: AVX-512 and AVX2 GEMM
//! microkernels (intrinsics) for f32 tile products, an AMX tile GEMM for bf16 operands
//! (Linux, after `arch_prctl` grants the tile state), AVX-512 exponentials for the online
//! softmax, and portable loops that the compiler vectorizes inside `#[target_feature]`
//! wrappers for everything else. Each `unsafe` block says why it is sound; each kernel with
//! a caller contract (CPU features, operand bounds) is an `unsafe fn` stating it.
//!
//! A ceiling set once per process ([`set_cap`]; the runtime hands it `LAYERZERO_CPU_ISA`) caps
//! the level: `portable`, `avx2`, `avx512` (no bf16 instructions), `avx512_bf16` (no AMX), `amx`
//! or `native`.

use std::sync::OnceLock;

use layerzero_core::hardware::cap::IsaCap;

pub(crate) use amx::{AMX_A_TILE, AMX_B_TILE, AMX_PANEL, Prefetch, amx_bf16, gemm_amx_bf16, gemm_amx_bf16_tiles};
#[cfg(test)]
pub(crate) use bf16_panels::force_bf16_pairs;
pub(crate) use bf16_panels::{bf16_panels, gemm_bf16_panels};
#[cfg(test)]
pub(crate) use convert::bf16_bits_finite;
pub(crate) use convert::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_bf16_bits};
pub(crate) use dot_bf16::{PAIR_MR, PAIR_NR, dots_bf16, gemm_tile_bf16_pairs, split_bf16};
pub(crate) use dot_keys::{KEYS, dots_keys};
pub(crate) use dot_quant::{dot_i8_block_rows, dot_int4, widen_i8};
pub(crate) use dot_tile::{TileLane, Widen};
#[cfg(target_arch = "x86_64")]
pub(crate) use dot_tile::{dot_tile_avx2, dot_tile_avx512};
pub(crate) use dot_w4a8::{XRow, dot_int4_i8_rows, i8_encode, int8_blocks, round_int8};
#[cfg(test)]
pub(crate) use gemm::gemm_reference;
pub(crate) use gemm::{PANEL, gemm, gemm_panels};
pub(crate) use norm::{
    Norm, affine_bf16_bf16, affine_bf16_f32, affine_f32_bf16, affine_f32_f32, shifted_sums_bf16, shifted_sums_f32,
    sums_bf16_dp,
};
pub(crate) use pack_w4a8::w4a8_pack;
pub(crate) use softmax::{SoftmaxRows, softmax_tile, softmax_tile_bf16};
pub(crate) use throughput::bf16_pairs_fast;
pub use throughput::{MacRates, measure as measure_mac_rates};
pub(crate) use tile::{TILE_MR, TILE_NR, gemm_tile_packed};
pub(crate) use tile_w4a8::{W4A8_PANEL, W4A8_ROWS, W4a8Tile, w4a8_tile, w4a8_tiles};
pub(crate) use transpose::{pair_tile, transpose_16x16, transpose_round_bf16};
pub(crate) use vector::{axpy, dots, exp_approx, exp_sub_sum, row_max, scale};

/// Instruction-set level used by the dispatchers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// AVX-512F (+ AVX2, FMA, F16C).
    Avx512,
    /// AVX2 + FMA (+ F16C).
    Avx2,
    /// Whatever the build target has.
    Portable,
}

static CAP: OnceLock<IsaCap> = OnceLock::new();

/// Sets the ceiling on the code paths these kernels take, once per process and before the
/// first kernel runs (the runtime hands it `LAYERZERO_CPU_ISA`); `false` when a ceiling was
/// already in force, which then stays.
pub fn set_cap(cap: IsaCap) -> bool {
    CAP.set(cap).is_ok() || CAP.get() == Some(&cap)
}

/// How far ahead of its loads a decode GEMV's row stream asks for cache lines: a GEMV
/// streams rows of a few KiB or less back to back, and the L2 streamer stops at each 4 KiB
/// page. On the 2-vCPU Xeon (Emerald Rapids class) the 125M f32 model's decode step went
/// from 18.3-19.9 to 16.2-17.1 ms (4 KiB ahead; 1 KiB 18.3-18.5, 8 KiB 15.7-16.4, 16 KiB
/// 16.5-17.0; interleaved runs).
pub(crate) const PREFETCH_BYTES: usize = 4096;

/// Asks for the cache line [`PREFETCH_BYTES`] past byte `byte` of `v` (past its end too:
/// the rows that follow).
#[inline(always)]
pub(crate) fn prefetch_ahead<T>(v: &[T], byte: usize) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: a prefetch is a hint that never faults, whatever the address; the pointer is
    // only formed (wrapping), never read.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            v.as_ptr().cast::<i8>().wrapping_add(byte + PREFETCH_BYTES),
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (v, byte);
}

/// The ISA ceiling in force: the one set, else none.
pub(crate) fn cap() -> IsaCap {
    *CAP.get_or_init(|| IsaCap::Native)
}

/// The level detected on this CPU (capped by `LAYERZERO_CPU_ISA`).
pub(crate) fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(detect)
}

fn detect() -> Level {
    let cap = cap();
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 =
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
        let avx512 = avx2 && is_x86_feature_detected!("avx512f");
        if avx512 && cap >= IsaCap::Avx512 {
            return Level::Avx512;
        }
        if avx2 && cap >= IsaCap::Avx2 {
            return Level::Avx2;
        }
    }
    let _ = cap;
    Level::Portable
}
/// True when the CPU has AVX512_BF16 (and AVX-512 is the level in use).
pub(crate) fn avx512_bf16() -> bool {
    static BF16: OnceLock<bool> = OnceLock::new();
    *BF16.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            level() == Level::Avx512
                && cap() >= layerzero_core::hardware::cap::IsaCap::Avx512Bf16
                && is_x86_feature_detected!("avx512bf16")
                && is_x86_feature_detected!("avx512bw")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Defines `pub(crate) fn $name(args) -> ret` that runs `$imp` (an `#[inline(always)]`
/// portable function) compiled for the best level this CPU has.
macro_rules! multiversion {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $imp:path;) => {
        $(#[$meta])*
        pub(crate) fn $name($($arg: $ty),*) $(-> $ret)? {
            use $crate::simd::{Level, level};
            #[cfg(target_arch = "x86_64")]
            {
                /// # Safety
                /// The CPU must support AVX-512F, AVX-512VL, AVX-512BW, AVX-512DQ, AVX2, FMA, F16C.
                #[allow(unsafe_code)]
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")]
                unsafe fn with_avx512($($arg: $ty),*) $(-> $ret)? {
                    $imp($($arg),*)
                }
                /// # Safety
                /// The CPU must support AVX2, FMA, F16C.
                #[allow(unsafe_code)]
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn with_avx2($($arg: $ty),*) $(-> $ret)? {
                    $imp($($arg),*)
                }
                match level() {
                    Level::Avx512 => {
                        #[allow(unsafe_code)]
                        // SAFETY: `level()` is Avx512 only when the CPU reports every feature enabled above.
                        let r = unsafe { with_avx512($($arg),*) };
                        return r;
                    }
                    Level::Avx2 => {
                        #[allow(unsafe_code)]
                        // SAFETY: `level()` is Avx2 only when the CPU reports AVX2, FMA and F16C.
                        let r = unsafe { with_avx2($($arg),*) };
                        return r;
                    }
                    Level::Portable => {}
                }
            }
            $imp($($arg),*)
        }
    };
}

pub(crate) use multiversion;

mod amx;
mod bf16_panels;
mod convert;
mod dot_bf16;
mod dot_keys;
mod dot_quant;
mod dot_tile;
mod dot_w4a8;
mod gemm;
mod norm;
mod pack_w4a8;
mod softmax;
#[cfg(test)]
mod tests;
mod throughput;
mod tile;
mod tile_w4a8;
mod transpose;
mod vector;
