//! Register tiles of dot products for small batches (`gemm/small.rs`): `MR` rows of x (f32)
//! against `NR` weight rows (f32 or bf16, widened as loaded), summed along K in vector
//! accumulators held in registers (`MR x NR` of them), `MR + NR` loads per `MR x NR`
//! multiply-adds. Intrinsics, so that each accumulator is one register whatever the
//! compiler's preferred vector width.

/// A weight element the dot kernels widen to f32 as they load it.
pub(crate) trait Widen: Copy + Send + Sync {
    /// The exact f32 value.
    fn widen(self) -> f32;
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Widen for half::bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
}

/// A weight element these kernels load in vectors.
pub(crate) trait TileLane: Copy + Send + Sync + Widen {
    /// Loads 16 lanes at `p` widened to f32.
    ///
    /// # Safety
    /// AVX-512F and AVX-512BW must be available; `p..p + 16` must be readable.
    #[allow(unsafe_code)]
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
    /// Loads 8 lanes at `p` widened to f32.
    ///
    /// # Safety
    /// AVX2 must be available; `p..p + 8` must be readable.
    #[allow(unsafe_code)]
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

#[cfg(target_arch = "x86_64")]
impl TileLane for f32 {
    #[allow(unsafe_code)]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        #[allow(unsafe_code)]
        // SAFETY: the caller's contract (features, 16 readable lanes).
        unsafe {
            std::arch::x86_64::_mm512_loadu_ps(p)
        }
    }
    #[allow(unsafe_code)]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        #[allow(unsafe_code)]
        // SAFETY: the caller's contract (features, 8 readable lanes).
        unsafe {
            std::arch::x86_64::_mm256_loadu_ps(p)
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl TileLane for half::bf16 {
    #[allow(unsafe_code)]
    #[inline(always)]
    unsafe fn load16(p: *const half::bf16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        #[allow(unsafe_code)]
        // SAFETY: the caller's contract (features, 16 readable bf16 = 32 bytes); bf16 is the
        // high half of an f32, so widening shifts each 16-bit lane up.
        unsafe {
            let h = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
    #[allow(unsafe_code)]
    #[inline(always)]
    unsafe fn load8(p: *const half::bf16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        #[allow(unsafe_code)]
        // SAFETY: as `load16`, 8 lanes (16 bytes).
        unsafe {
            let h = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

/// The scalar rest of a tile: lanes `from..k` of every dot.
#[inline(always)]
fn tails<W: TileLane, const MR: usize, const NR: usize>(
    x: [&[f32]; MR],
    w: [&[W]; NR],
    from: usize,
    k: usize,
    out: &mut [[f32; NR]; MR],
) {
    for r in 0..MR {
        for c in 0..NR {
            out[r][c] += x[r][from..k].iter().zip(&w[c][from..k]).map(|(a, b)| a * b.widen()).sum::<f32>();
        }
    }
}

/// `out[r][c] = x[r][..k] . w[c][..k]`, 16 lanes per register.
///
/// # Safety
/// AVX-512F, AVX-512BW, AVX2 and FMA must be available. (Every row is at least `k` long:
/// checked.)
#[allow(unsafe_code)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(crate) unsafe fn dot_tile_avx512<W: TileLane, const MR: usize, const NR: usize>(
    x: [&[f32]; MR],
    w: [&[W]; NR],
    k: usize,
) -> [[f32; NR]; MR] {
    use std::arch::x86_64::*;
    assert!(x.iter().all(|r| r.len() >= k) && w.iter().all(|r| r.len() >= k), "dot_tile: a row is shorter than k");
    let mut acc = [[_mm512_setzero_ps(); NR]; MR];
    let body = k / 16 * 16;
    let mut i = 0;
    while i < body {
        #[allow(unsafe_code)]
        // SAFETY: i + 16 <= k <= every row's length (asserted above); the features are the
        // caller's contract.
        unsafe {
            let xv: [__m512; MR] = std::array::from_fn(|r| _mm512_loadu_ps(x[r].as_ptr().add(i)));
            for c in 0..NR {
                let wv = W::load16(w[c].as_ptr().add(i));
                for r in 0..MR {
                    acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
                }
            }
        }
        i += 16;
    }
    let mut out = [[0f32; NR]; MR];
    for r in 0..MR {
        for c in 0..NR {
            out[r][c] = _mm512_reduce_add_ps(acc[r][c]);
        }
    }
    tails(x, w, body, k, &mut out);
    out
}

/// `out[r][c] = x[r][..k] . w[c][..k]`, 8 lanes per register.
///
/// # Safety
/// AVX2 and FMA must be available. (Every row is at least `k` long: checked.)
#[allow(unsafe_code)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_tile_avx2<W: TileLane, const MR: usize, const NR: usize>(
    x: [&[f32]; MR],
    w: [&[W]; NR],
    k: usize,
) -> [[f32; NR]; MR] {
    use std::arch::x86_64::*;
    assert!(x.iter().all(|r| r.len() >= k) && w.iter().all(|r| r.len() >= k), "dot_tile: a row is shorter than k");
    let mut acc = [[_mm256_setzero_ps(); NR]; MR];
    let body = k / 8 * 8;
    let mut i = 0;
    while i < body {
        #[allow(unsafe_code)]
        // SAFETY: i + 8 <= k <= every row's length (asserted above); AVX2 and FMA are the
        // caller's contract.
        unsafe {
            let xv: [__m256; MR] = std::array::from_fn(|r| _mm256_loadu_ps(x[r].as_ptr().add(i)));
            for c in 0..NR {
                let wv = W::load8(w[c].as_ptr().add(i));
                for r in 0..MR {
                    acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
                }
            }
        }
        i += 8;
    }
    let mut out = [[0f32; NR]; MR];
    for r in 0..MR {
        for c in 0..NR {
            let v = acc[r][c];
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
            out[r][c] = _mm_cvtss_f32(s);
        }
    }
    tails(x, w, body, k, &mut out);
    out
}
