//! What one core's vector units really do, measured: multiply-accumulates per nanosecond of
//! f32 FMAs (the widest vectors the level in force allows) and of bf16 pair products
//! (`vdpbf16ps`). Two CPUs with AVX512_BF16 differ here by 2x: a Zen 4 or Zen 5 issues a
//! 512-bit `vdpbf16ps` (32 products) as often as a 512-bit FMA (16), while a Sapphire Rapids
//! or Cooper Lake issues it at half the FMA rate, so that bf16 pairs there are no faster than
//! widening to f32 (measured here: 215 GFLOP/s on pairs, 319 on f32 FMAs, 512 x 4096 x 4096).
//! The kernels pick the bf16-pair paths from this measurement, not from the feature flag.
//!
//! Each figure is the best of several short runs (about 0.1 ms each) of independent
//! accumulator chains: the issue rate, not the latency, and a preempted run never wins.

use std::sync::OnceLock;
use std::time::Instant;

use super::{Level, avx512_bf16, level};

/// Multiply-accumulates per nanosecond of one core.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MacRates {
    /// f32 FMAs (512-bit at the AVX-512 level, 256-bit at AVX2, scalar code otherwise).
    pub f32: f64,
    /// bf16 pair products (`vdpbf16ps`, 512-bit), where the CPU has AVX512_BF16 under the cap.
    pub bf16_pairs: Option<f64>,
    /// bf16 AMX tile products (the attention and linear tile GEMM on operands in L2), where
    /// AMX is usable under the cap.
    pub bf16_amx: Option<f64>,
}

impl MacRates {
    /// The fastest bf16 path a kernel has here: AMX tiles, bf16 pairs, or widening to f32.
    pub fn bf16(&self) -> f64 {
        [self.bf16_amx, self.bf16_pairs, Some(self.f32)].into_iter().flatten().fold(0.0, f64::max)
    }
}

/// This core's rates, measured once per process.
pub(crate) fn mac_rates() -> MacRates {
    static RATES: OnceLock<MacRates> = OnceLock::new();
    *RATES.get_or_init(measure)
}

/// True when bf16 pair products outrun f32 FMAs by enough (1.3x in multiply-accumulates) to
/// repay packing operands into pairs: a Zen 4 (about 2x), not a Sapphire Rapids without AMX
/// (0.51x measured: 60.6 against 119 multiply-adds/ns).
pub(crate) fn bf16_pairs_fast() -> bool {
    mac_rates().bf16_pairs.is_some_and(|b| b >= 1.3 * mac_rates().f32)
}

/// Measures the rates now (about a millisecond).
pub fn measure() -> MacRates {
    let best = |f: fn(u64) -> f32, macs_per_iter: u64| -> f64 {
        const ITERS: u64 = 4096;
        f(64);
        let mut best = f64::MAX;
        for _ in 0..9 {
            let t = Instant::now();
            std::hint::black_box(f(ITERS));
            best = best.min(t.elapsed().as_secs_f64());
        }
        (ITERS * macs_per_iter) as f64 / (best.max(1e-9) * 1e9)
    };
    #[cfg(target_arch = "x86_64")]
    {
        let f32_rate = match level() {
            Level::Avx512 => best(x86::fma_chains::<16>, CHAINS * 16),
            Level::Avx2 => best(x86::fma_chains::<8>, CHAINS * 8),
            Level::Portable => best(scalar_chains, CHAINS),
        };
        let bf16_pairs = avx512_bf16().then(|| best(x86::dp_chains, CHAINS * 32));
        MacRates { f32: f32_rate, bf16_pairs, bf16_amx: amx_rate() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, avx512_bf16);
        MacRates { f32: best(scalar_chains, CHAINS), bf16_pairs: None, bf16_amx: None }
    }
}

/// AMX's bf16 rate on a 64 x 64 x 512 product held in L2 (best of several runs of 16
/// calls), where AMX is usable.
fn amx_rate() -> Option<f64> {
    if !super::amx_bf16() {
        return None;
    }
    const M: usize = 64;
    const K2: usize = 256;
    let a = vec![0x3F80u16; M * 2 * K2];
    let b = vec![0x3F80_3F80u32; K2 * super::AMX_PANEL];
    let mut c = vec![0f32; M * M];
    let call = |c: &mut [f32]| super::gemm_amx_bf16(M, M, K2, &a, 2 * K2, &b, K2 * super::AMX_PANEL, c, M, false);
    call(&mut c);
    let mut best = f64::MAX;
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..16 {
            call(std::hint::black_box(&mut c));
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    Some((16 * M * M * 2 * K2) as f64 / (best.max(1e-9) * 1e9))
}

/// Independent accumulator chains per iteration (more than latency x issue width).
const CHAINS: u64 = 12;

fn scalar_chains(n: u64) -> f32 {
    let mut acc = [0f32; CHAINS as usize];
    let (a, b) = (std::hint::black_box(1.000_1f32), std::hint::black_box(0.999_9f32));
    // A multiply and an add (`mul_add` without FMA in the target is a library call).
    for _ in 0..n {
        for x in acc.iter_mut() {
            *x = *x * a + b;
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::CHAINS;
    use crate::simd::{Level, avx512_bf16, level};

    /// `n` iterations of `CHAINS` independent FMAs on vectors of `LANES` f32 (16: 512-bit,
    /// 8: 256-bit), where the level in force has them.
    pub(super) fn fma_chains<const LANES: usize>(n: u64) -> f32 {
        #[allow(unsafe_code)]
        match (LANES, level()) {
            // SAFETY: the AVX-512 level was detected.
            (16, Level::Avx512) => unsafe { fma512(n) },
            // SAFETY: AVX2 and FMA were detected (both levels imply them).
            (8, Level::Avx512 | Level::Avx2) => unsafe { fma256(n) },
            _ => super::scalar_chains(n),
        }
    }

    /// # Safety
    /// AVX-512F.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    unsafe fn fma512(n: u64) -> f32 {
        let (a, b) = (_mm512_set1_ps(std::hint::black_box(1.000_1)), _mm512_set1_ps(std::hint::black_box(0.999_9)));
        let mut acc = [_mm512_setzero_ps(); CHAINS as usize];
        for _ in 0..n {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        acc.iter().map(|&x| _mm512_reduce_add_ps(x)).sum()
    }

    /// # Safety
    /// AVX2 and FMA.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma256(n: u64) -> f32 {
        let (a, b) = (_mm256_set1_ps(std::hint::black_box(1.000_1)), _mm256_set1_ps(std::hint::black_box(0.999_9)));
        let mut acc = [_mm256_setzero_ps(); CHAINS as usize];
        for _ in 0..n {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, a, b);
            }
        }
        let mut lanes = [0f32; 8];
        let mut sum = 0f32;
        for x in acc {
            // SAFETY: `lanes` holds 8 f32.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), x) };
            sum += lanes.iter().sum::<f32>();
        }
        sum
    }

    /// `n` iterations of `CHAINS` independent 512-bit `vdpbf16ps`.
    pub(super) fn dp_chains(n: u64) -> f32 {
        if !avx512_bf16() {
            return 0.0;
        }
        /// # Safety
        /// AVX-512F and AVX512_BF16.
        #[allow(unsafe_code)]
        #[target_feature(enable = "avx512f,avx512bf16")]
        unsafe fn dp(n: u64) -> f32 {
            // bf16 1.0 in both halves of every lane.
            let one = _mm512_set1_epi32(std::hint::black_box(0x3F80_3F80));
            // SAFETY: both are 512-bit vectors of plain bits.
            let (a, b) = unsafe {
                (std::mem::transmute::<__m512i, __m512bh>(one), std::mem::transmute::<__m512i, __m512bh>(one))
            };
            let mut acc = [_mm512_setzero_ps(); CHAINS as usize];
            for _ in 0..n {
                for x in acc.iter_mut() {
                    *x = _mm512_dpbf16_ps(*x, a, b);
                }
            }
            acc.iter().map(|&x| _mm512_reduce_add_ps(x)).sum()
        }
        #[allow(unsafe_code)]
        // SAFETY: `avx512_bf16()` detected AVX-512F and AVX512_BF16.
        unsafe {
            dp(n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_measured_rates_are_positive_and_pairs_exist_exactly_where_the_cpu_has_them() {
        let r = measure();
        assert!(r.f32 > 0.0 && r.f32.is_finite(), "{r:?}");
        assert_eq!(r.bf16_pairs.is_some(), avx512_bf16(), "{r:?}");
        assert!(r.bf16_pairs.is_none_or(|b| b > 0.0 && b.is_finite()), "{r:?}");
    }
}
