//! One query row against a block of key rows, for decode attention's scores when a kv head
//! serves one query row (multi-head attention, one new token): each key's dot product in
//! its own vector accumulator, the accumulators then summed across lanes all together by a
//! transposing reduction (three rounds of shuffles and adds for sixteen keys). A block of
//! keys transposed for a GEMM of one row costs more than the dots themselves, and that
//! GEMM's single accumulator is one chain of FMAs as long as the head dim.

use super::{Level, level};

/// Keys per block.
pub(crate) const KEYS: usize = 16;

/// `out[j] = q . k[j * ld .. j * ld + d]` for the `KEYS` keys of a block (`out.len() ==
/// KEYS`), `d` a multiple of 16.
pub(crate) fn dots_keys(q: &[f32], k: &[f32], ld: usize, d: usize, out: &mut [f32]) {
    assert!(
        out.len() == KEYS && d.is_multiple_of(16) && q.len() >= d && k.len() >= (KEYS - 1) * ld + d,
        "dots_keys: a block of {KEYS} keys of {d} at stride {ld} does not fit {} values",
        k.len()
    );
    #[cfg(target_arch = "x86_64")]
    match level() {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected; the assert above bounds every read.
        Level::Avx512 => return unsafe { x86::keys_avx512(q, k, ld, d, out) },
        #[allow(unsafe_code)]
        // SAFETY: AVX2 and FMA were detected; bounds as above.
        Level::Avx2 => {
            // SAFETY: as above, for each half of the block.
            unsafe {
                x86::keys_avx2(q, k, ld, d, &mut out[..8]);
                x86::keys_avx2(q, &k[8 * ld..], ld, d, &mut out[8..]);
            }
            return;
        }
        Level::Portable => {}
    }
    let _ = level;
    portable(q, k, ld, d, out);
}

/// [`dots_keys`] in scalar code: eight partial sums per key, as the vector paths' lanes.
fn portable(q: &[f32], k: &[f32], ld: usize, d: usize, out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        let row = &k[j * ld..j * ld + d];
        let mut lanes = [0f32; 8];
        for (qc, kc) in q[..d].chunks_exact(8).zip(row.chunks_exact(8)) {
            for l in 0..8 {
                lanes[l] += qc[l] * kc[l];
            }
        }
        *o = lanes.iter().sum();
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX-512F must be available; bounds as [`super::dots_keys`] asserts.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn keys_avx512(q: &[f32], k: &[f32], ld: usize, d: usize, out: &mut [f32]) {
        let (qp, kp) = (q.as_ptr(), k.as_ptr());
        let mut a = [_mm512_setzero_ps(); 16];
        let mut c = 0;
        while c < d {
            // SAFETY: c + 16 <= d <= q.len(); key j's columns c..c + 16 lie within k.
            let qv = unsafe { _mm512_loadu_ps(qp.add(c)) };
            for (j, acc) in a.iter_mut().enumerate() {
                // SAFETY: as above.
                *acc = _mm512_fmadd_ps(qv, unsafe { _mm512_loadu_ps(kp.add(j * ld + c)) }, *acc);
            }
            c += 16;
        }
        // Pairs of keys: within each 128-bit lane, key 2i's two partial sums, then 2i + 1's.
        let b: [__m512; 8] = std::array::from_fn(|i| {
            let (x, y) = (a[2 * i], a[2 * i + 1]);
            _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y))
        });
        // Quads: each 128-bit lane holds its share of keys 4m..4m + 4, in order.
        let q4: [__m512; 4] = std::array::from_fn(|m| {
            let (x, y) = (_mm512_castps_pd(b[2 * m]), _mm512_castps_pd(b[2 * m + 1]));
            _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)))
        });
        // The four 128-bit lanes of each quad summed, quad m landing in lane m.
        let half = |x: __m512, y: __m512| {
            _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(x, y), _mm512_shuffle_f32x4::<0xEE>(x, y))
        };
        let (e01, e23) = (half(q4[0], q4[1]), half(q4[2], q4[3]));
        let sums = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(e01, e23), _mm512_shuffle_f32x4::<0xDD>(e01, e23));
        // SAFETY: out holds KEYS = 16 values.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), sums) };
    }

    /// Eight keys (`out.len() == 8`).
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `q` holds `d` values and `k` eight rows of `d` at
    /// stride `ld`; `d % 8 == 0`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn keys_avx2(q: &[f32], k: &[f32], ld: usize, d: usize, out: &mut [f32]) {
        assert!(out.len() == 8 && q.len() >= d && k.len() >= 7 * ld + d && d.is_multiple_of(8));
        let (qp, kp) = (q.as_ptr(), k.as_ptr());
        let mut a = [_mm256_setzero_ps(); 8];
        let mut c = 0;
        while c < d {
            // SAFETY: c + 8 <= d; the bounds asserted above.
            let qv = unsafe { _mm256_loadu_ps(qp.add(c)) };
            for (j, acc) in a.iter_mut().enumerate() {
                // SAFETY: as above.
                *acc = _mm256_fmadd_ps(qv, unsafe { _mm256_loadu_ps(kp.add(j * ld + c)) }, *acc);
            }
            c += 8;
        }
        let b: [__m256; 4] = std::array::from_fn(|i| {
            let (x, y) = (a[2 * i], a[2 * i + 1]);
            _mm256_add_ps(_mm256_unpacklo_ps(x, y), _mm256_unpackhi_ps(x, y))
        });
        let q4: [__m256; 2] = std::array::from_fn(|m| {
            let (x, y) = (_mm256_castps_pd(b[2 * m]), _mm256_castps_pd(b[2 * m + 1]));
            _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)), _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)))
        });
        let sums =
            _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(q4[0], q4[1]), _mm256_permute2f128_ps::<0x31>(q4[0], q4[1]));
        // SAFETY: out holds 8 values.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sums) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_gives_each_keys_dot_in_its_own_slot() {
        for (d, ld) in [(16usize, 16usize), (64, 768), (128, 1024)] {
            let q: Vec<f32> = (0..d).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.25).collect();
            let k: Vec<f32> = (0..(KEYS - 1) * ld + d).map(|i| ((i * 11 % 17) as f32 - 8.0) * 0.125).collect();
            let want: Vec<f64> =
                (0..KEYS).map(|j| (0..d).map(|c| f64::from(q[c]) * f64::from(k[j * ld + c])).sum()).collect();
            let mut paths = Vec::new();
            let mut out = [0f32; KEYS];
            dots_keys(&q, &k, ld, d, &mut out);
            paths.push(("dispatched", out));
            portable(&q, &k, ld, d, &mut out);
            paths.push(("portable", out));
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            {
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    // SAFETY: AVX2 and FMA were just detected; the sizes are dots_keys's.
                    unsafe {
                        x86::keys_avx2(&q, &k, ld, d, &mut out[..8]);
                        x86::keys_avx2(&q, &k[8 * ld..], ld, d, &mut out[8..]);
                    }
                    paths.push(("avx2", out));
                }
                if is_x86_feature_detected!("avx512f") {
                    // SAFETY: AVX-512F was just detected.
                    unsafe { x86::keys_avx512(&q, &k, ld, d, &mut out) };
                    paths.push(("avx512", out));
                }
            }
            for (path, got) in paths {
                for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!((f64::from(*g) - w).abs() <= 1e-5 * (1.0 + w.abs()), "{path} d {d}: key {j}: {g} vs {w}");
                }
            }
        }
    }
}
