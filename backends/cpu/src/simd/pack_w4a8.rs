//! The weight panels of the int4 x int8 GEMM (`gemm::w4a8`), packed from the weight's rows
//! once per call: lane `[s][c]` holds the four codes `4s..4s + 4` of column `c`, one per
//! byte. With AVX2 a column's 16 bytes (32 codes, eight k-steps) widen to their 32 code
//! bytes in one register and eight columns' registers transpose as 8 x 8 lanes; the scalar
//! loop spent about ten instructions per lane and was most of a 5-row call (a 2048 x 2048
//! weight: some 500 us of 624).

use super::{Level, level};
use crate::simd::W4A8_PANEL;

/// Columns per transposed group (eight 32-bit lanes to a 256-bit register).
const GROUP: usize = 8;
/// k-steps of four codes per 16 bytes of a row.
const CHUNK: usize = 8;

/// The lane of k-step `s` from a column's bytes (even element in the low nibble): its four
/// codes, one per byte in k order; zero past the row's end (columns past the weight's).
#[inline]
fn lane(row: &[u8], s: usize) -> u32 {
    row.get(2 * s..2 * s + 2).map_or(0, |b| {
        let v = u32::from(b[0]) | (u32::from(b[1]) << 8);
        ((v & 0xF) | ((v << 4) & 0xF00) | ((v << 8) & 0xF_0000) | ((v << 12) & 0xF00_0000)).to_le()
    })
}

/// One panel's lanes, `lanes[s * W4A8_PANEL + c]` for the `k / 4` k-steps, from `rows[c]`
/// (column `c`'s `k / 2` bytes, or empty for a column past the weight's: zeros).
pub(crate) fn w4a8_pack(rows: &[&[u8]; W4A8_PANEL], k: usize, lanes: &mut [u32]) {
    let steps = k / 4;
    let lanes = &mut lanes[..steps * W4A8_PANEL];
    // Column groups whose eight rows are whole take the vector path for whole chunks.
    let whole = |c0: usize| rows[c0..c0 + GROUP].iter().all(|r| r.len() >= k / 2);
    let mut vector_steps = [0usize; W4A8_PANEL / GROUP];
    #[cfg(target_arch = "x86_64")]
    if matches!(level(), Level::Avx512 | Level::Avx2) {
        let groups: [bool; W4A8_PANEL / GROUP] = std::array::from_fn(|gi| whole(gi * GROUP));
        for (done, &whole) in vector_steps.iter_mut().zip(&groups) {
            if whole {
                *done = steps / CHUNK * CHUNK;
            }
        }
        #[allow(unsafe_code)]
        // SAFETY: AVX2 was detected (level Avx2 or better); the rows of every group marked
        // whole hold at least k / 2 bytes and `lanes` holds k / 4 steps of the panel.
        unsafe {
            x86::panel(rows, &groups, steps / CHUNK, lanes)
        };
    }
    let _ = (level, whole);
    for (c, row) in rows.iter().enumerate() {
        for s in vector_steps[c / GROUP]..steps {
            lanes[s * W4A8_PANEL + c] = lane(row, s);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::*;

    use super::{CHUNK, GROUP, W4A8_PANEL};

    /// Chunks `0..chunks` (eight k-steps each) of the lanes of every group of eight columns
    /// marked in `whole`, a chunk of all groups at a time: the chunk's 1 KiB of lanes is then
    /// written in whole cache lines while they are in L1 (a group at a time wrote a quarter of
    /// each line per pass, the panel's 64 KiB apart, and took twice as long).
    ///
    /// # Safety
    /// AVX2 must be available; each row of a group marked whole holds at least `16 * chunks`
    /// bytes and `lanes` at least `8 * chunks` steps of [`W4A8_PANEL`] lanes.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn panel(
        rows: &[&[u8]; W4A8_PANEL],
        whole: &[bool; W4A8_PANEL / GROUP],
        chunks: usize,
        lanes: &mut [u32],
    ) {
        let nib = _mm256_set1_epi8(0x0F);
        for t in 0..chunks {
            for (gi, _) in whole.iter().enumerate().filter(|(_, w)| **w) {
                let c0 = gi * GROUP;
                // Column c's 16 bytes as 32 code bytes: each byte widened to 16 bits, its
                // high nibble shifted into the upper byte, both masked: step s is lane s.
                let r: [__m256i; GROUP] = std::array::from_fn(|c| {
                    // SAFETY: 16 t + 16 <= 16 chunks <= rows[c0 + c].len() (a whole group).
                    let v = unsafe { _mm_loadu_si128(rows[c0 + c].as_ptr().add(16 * t).cast()) };
                    let w = _mm256_cvtepu8_epi16(v);
                    _mm256_and_si256(_mm256_or_si256(w, _mm256_slli_epi16(w, 4)), nib)
                });
                // 8 x 8 lanes transposed: out[s] holds step s of the eight columns.
                let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
                let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
                let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
                let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
                let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
                let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
                let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
                let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
                let u = [
                    _mm256_unpacklo_epi64(t0, t2),
                    _mm256_unpackhi_epi64(t0, t2),
                    _mm256_unpacklo_epi64(t1, t3),
                    _mm256_unpackhi_epi64(t1, t3),
                    _mm256_unpacklo_epi64(t4, t6),
                    _mm256_unpackhi_epi64(t4, t6),
                    _mm256_unpacklo_epi64(t5, t7),
                    _mm256_unpackhi_epi64(t5, t7),
                ];
                // u[j] (j < 4) holds steps j and j + 4 of columns 0..4, u[j + 4] of 4..8.
                for j in 0..4 {
                    let lo = _mm256_permute2x128_si256(u[j], u[j + 4], 0x20);
                    let hi = _mm256_permute2x128_si256(u[j], u[j + 4], 0x31);
                    for (s, v) in [(CHUNK * t + j, lo), (CHUNK * t + j + 4, hi)] {
                        // SAFETY: s < 8 chunks and c0 + 8 <= W4A8_PANEL: within `lanes`.
                        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().add(s * W4A8_PANEL + c0).cast(), v) };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panel_packs_as_its_lanes_read_for_every_shape_of_k_and_of_the_last_columns() {
        for (k, cols) in [(4, 32), (28, 32), (32, 32), (64, 7), (96, 32), (132, 17), (2048, 32)] {
            let data: Vec<Vec<u8>> =
                (0..cols).map(|c| (0..k / 2).map(|i| ((i * 37 + c * 101 + 11) % 256) as u8).collect()).collect();
            let rows: [&[u8]; W4A8_PANEL] = std::array::from_fn(|c| data.get(c).map_or(&[][..], |r| &r[..]));
            let mut got = vec![u32::MAX; k / 4 * W4A8_PANEL];
            w4a8_pack(&rows, k, &mut got);
            for s in 0..k / 4 {
                for (c, row) in rows.iter().enumerate() {
                    let bytes = got[s * W4A8_PANEL + c].to_le_bytes();
                    let want = if c < cols {
                        let b = [row[2 * s], row[2 * s + 1]];
                        [b[0] & 0xF, b[0] >> 4, b[1] & 0xF, b[1] >> 4]
                    } else {
                        [0; 4]
                    };
                    assert_eq!(bytes, want, "k {k}, {cols} columns: step {s}, column {c}");
                }
            }
        }
    }
}
