//! Small batches (2 <= M <= [`small_m_max`] rows: batched decode, a speculative
//! verification of a few draft tokens, a short prompt): `x [M, K] . W^T` with the weight
//! `W [N, K]` read in place (f32 or bf16, rows contiguous), each element from memory once,
//! parallel over N.
//!
//! The GEMV dots every weight row with the rows of x four at a time, one weight row in
//! flight: five loads per four multiply-adds, so its time grows with M from the first rows
//! on; the GEMM above it packs the whole weight per call (on the Zen 3 of issue 32 a
//! 2048 x 2048 f32 linear took 0.74 ms at M = 3..4 and 4.83 ms at M = 5..8). Here a register
//! tile of `MR` rows of x by `NR` weight rows is summed along K, `MR + NR` vector loads per
//! `MR x NR` multiply-adds, so the multiply-adds, not the loads, set the pace once the
//! weight streams; the weight rows of a tile come from memory for the first rows of x and
//! from cache for the next ones (a tile's rows: `NR x K` elements).
//!
//! Tiles: AVX-512, 16 lanes, 4 x 4 (16 accumulators of 32 registers); AVX2, 8 lanes, 3 x 4
//! (12 of 16); otherwise 8 lanes, 2 x 2, without fused multiply-adds (as the other portable
//! paths).

use rayon::prelude::*;

use super::gemv::chunk_size;
use super::view::Mat;
use super::weights::Weights;
use crate::alloc::with_scratch;
use crate::simd;
use crate::simd::TileLane;
use layerzero_core::tensor::Storage;

/// Up to this many rows a dense NT linear runs here rather than through the GEMM: 32 where
/// the GEMM is `matrixmultiply` (AVX2 and below: these tiles took 0.31 to 0.59 of its time
/// at 5 to 32 rows of a 2048 x 2048 f32 weight on the 2-core VM, capped to AVX2), 16 where
/// it is the packed AVX-512 GEMM (which overtakes the tiles from about 24 rows: 1.22x and
/// 1.13x their time at 24 and 32).
pub(crate) fn small_m_max() -> usize {
    if simd::level() == simd::Level::Avx512 { 16 } else { 32 }
}

/// The weight's rows, each `k` elements from `off + r * rs` (bounds checked by the caller
/// for the first and the last).
#[derive(Clone, Copy)]
struct Rows<'a, W> {
    v: &'a [W],
    off: usize,
    rs: usize,
    k: usize,
}

impl<'a, W> Rows<'a, W> {
    #[inline(always)]
    fn get(self, r: usize) -> &'a [W] {
        let at = self.off + r * self.rs;
        &self.v[at..at + self.k]
    }
}

#[inline(always)]
fn fma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { c + a * b }
}

/// `out[r][c] = x_r . w_c` for `MR` rows of x (`x[r]`, each `k` long) and `NR` weight rows.
#[inline(always)]
fn tile<W: TileLane, const MR: usize, const NR: usize, const L: usize, const FMA: bool>(
    x: [&[f32]; MR],
    w: [&[W]; NR],
    k: usize,
) -> [[f32; NR]; MR] {
    let mut acc = [[[0f32; L]; NR]; MR];
    let body = k / L * L;
    // Whole L-lane chunks of every row, so the loop indexes fixed-size arrays.
    let xc: [&[[f32; L]]; MR] = std::array::from_fn(|r| x[r][..body].as_chunks::<L>().0);
    let wc: [&[[W; L]]; NR] = std::array::from_fn(|c| w[c][..body].as_chunks::<L>().0);
    for i in 0..body / L {
        let xv: [[f32; L]; MR] = std::array::from_fn(|r| xc[r][i]);
        for c in 0..NR {
            let wv: [f32; L] = std::array::from_fn(|l| wc[c][i][l].widen());
            for r in 0..MR {
                for l in 0..L {
                    acc[r][c][l] = fma::<FMA>(xv[r][l], wv[l], acc[r][c][l]);
                }
            }
        }
    }
    let mut out = [[0f32; NR]; MR];
    for r in 0..MR {
        for c in 0..NR {
            let mut s = acc[r][c];
            let mut width = L / 2;
            while width > 0 {
                for l in 0..width {
                    s[l] += s[l + width];
                }
                width /= 2;
            }
            let tail: f32 = x[r][body..k].iter().zip(&w[c][body..k]).map(|(a, b)| a * b.widen()).sum();
            out[r][c] = s[0] + tail;
        }
    }
    out
}

/// A level's tile kernel. A value of an intrinsic level exists only where the CPU has its
/// instructions (`Avx512::here`, `Avx2::here`).
trait Tile: Copy {
    fn dot<W: TileLane, const R: usize, const C: usize>(self, x: [&[f32]; R], w: [&[W]; C], k: usize) -> [[f32; C]; R];
}

/// AVX-512 tiles, 16 lanes.
#[derive(Clone, Copy)]
struct Avx512(());

/// AVX2 tiles, 8 lanes.
#[derive(Clone, Copy)]
struct Avx2(());

/// The portable tile (the compiler's vectors, no fused multiply-add).
#[derive(Clone, Copy)]
struct Portable;

impl Avx512 {
    fn here() -> Option<Avx512> {
        (simd::level() == simd::Level::Avx512).then_some(Avx512(()))
    }
}

impl Avx2 {
    fn here() -> Option<Avx2> {
        (simd::level() == simd::Level::Avx2).then_some(Avx2(()))
    }
}

impl Tile for Avx512 {
    #[inline(always)]
    fn dot<W: TileLane, const R: usize, const C: usize>(self, x: [&[f32]; R], w: [&[W]; C], k: usize) -> [[f32; C]; R] {
        #[cfg(target_arch = "x86_64")]
        {
            #[allow(unsafe_code)]
            // SAFETY: an `Avx512` exists only where `simd::level()` is Avx512, which it is
            // only when the CPU reports AVX-512F/BW/VL, AVX2 and FMA.
            unsafe {
                simd::dot_tile_avx512::<W, R, C>(x, w, k)
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        tile::<W, R, C, 16, true>(x, w, k)
    }
}

impl Tile for Avx2 {
    #[inline(always)]
    fn dot<W: TileLane, const R: usize, const C: usize>(self, x: [&[f32]; R], w: [&[W]; C], k: usize) -> [[f32; C]; R] {
        #[cfg(target_arch = "x86_64")]
        {
            #[allow(unsafe_code)]
            // SAFETY: an `Avx2` exists only where `simd::level()` is Avx2, which it is only
            // when the CPU reports AVX2 and FMA.
            unsafe {
                simd::dot_tile_avx2::<W, R, C>(x, w, k)
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        tile::<W, R, C, 8, true>(x, w, k)
    }
}

impl Tile for Portable {
    #[inline(always)]
    fn dot<W: TileLane, const R: usize, const C: usize>(self, x: [&[f32]; R], w: [&[W]; C], k: usize) -> [[f32; C]; R] {
        tile::<W, R, C, 8, false>(x, w, k)
    }
}

/// Rows `i0..i0 + R` of x against weight rows `j0..j0 + C` over `ks` of K, added into
/// `part` ([M, nb], the task's columns from `n0`; zeros before the first range of K).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn block<T: Tile, W: TileLane, const R: usize, const C: usize>(
    t: T,
    x: &[f32],
    k: usize,
    ks: std::ops::Range<usize>,
    rows: Rows<'_, W>,
    i0: usize,
    j0: usize,
    n0: usize,
    nb: usize,
    part: &mut [f32],
) {
    let xs: [&[f32]; R] = std::array::from_fn(|r| &x[(i0 + r) * k + ks.start..(i0 + r) * k + ks.end]);
    let ws: [&[W]; C] = std::array::from_fn(|c| &rows.get(j0 + c)[ks.clone()]);
    let d = t.dot::<W, R, C>(xs, ws, ks.len());
    for (r, dr) in d.iter().enumerate() {
        for (c, v) in dr.iter().enumerate() {
            part[(i0 + r) * nb + (j0 - n0 + c)] += *v;
        }
    }
}

/// Elements of K a pass covers: the pass's rows of x (`MR` of them) stay in L1 while the
/// weight tiles of a block go by, and the block's part of K ([`BLOCK_BYTES`]) stays in L2
/// for the next rows of x. Whole rows of K (16 rows of 2048 f32 = 128 KiB of x) streamed x
/// through L1 for every weight tile: the tiles ran at a quarter of the multiply-add peak.
const K_CHUNK: usize = 1024;
/// Bytes of weight a block holds over one chunk of K.
const BLOCK_BYTES: usize = 64 << 10;

/// Columns `n0..n0 + nb` of `x . W^T` for all `m` rows into `part` ([m, nb]): blocks of
/// weight rows, each over K a chunk at a time ([`K_CHUNK`]), each chunk against the rows of
/// x `MR` at a time, and those against the block's weight rows `NR` at a time (the rest of
/// the rows and columns by smaller tiles).
#[allow(clippy::too_many_arguments)]
fn columns<T: Tile, W: TileLane, const MR: usize, const NR: usize>(
    t: T,
    x: &[f32],
    m: usize,
    k: usize,
    rows: Rows<'_, W>,
    n0: usize,
    nb: usize,
    part: &mut [f32],
) {
    part.fill(0.0);
    // One group of rows of x reads each weight tile once: chunks of K would only add sums.
    let chunk = if m > MR { K_CHUNK.min(k).max(1) } else { k.max(1) };
    let span = (BLOCK_BYTES / (chunk * size_of::<W>())).max(1).div_ceil(NR) * NR;
    let end = n0 + nb;
    let mut b0 = n0;
    while b0 < end {
        let b1 = (b0 + span).min(end);
        let mut k0 = 0;
        loop {
            let ks = k0..(k0 + chunk).min(k);
            let mut i = 0;
            while i < m {
                let here = (m - i).min(MR);
                let mut j = b0;
                while j < b1 {
                    let cols = (b1 - j).min(NR);
                    let ks = ks.clone();
                    match (here == MR, cols == NR) {
                        (true, true) => block::<T, W, MR, NR>(t, x, k, ks, rows, i, j, n0, nb, part),
                        (_, true) => match here {
                            1 => block::<T, W, 1, NR>(t, x, k, ks, rows, i, j, n0, nb, part),
                            2 => block::<T, W, 2, NR>(t, x, k, ks, rows, i, j, n0, nb, part),
                            _ => block::<T, W, 3, NR>(t, x, k, ks, rows, i, j, n0, nb, part),
                        },
                        // The last weight rows, one at a time.
                        (_, false) => {
                            for jj in j..j + cols {
                                for ii in i..i + here {
                                    block::<T, W, 1, 1>(t, x, k, ks.clone(), rows, ii, jj, n0, nb, part);
                                }
                            }
                        }
                    }
                    j += cols;
                }
                i += here;
            }
            k0 = ks.end;
            if k0 >= k {
                break;
            }
        }
        b0 = b1;
    }
}

/// One task's columns with the best level this CPU has.
fn columns_at_level<W: TileLane>(x: &[f32], m: usize, k: usize, rows: Rows<'_, W>, n0: usize, part: &mut [f32]) {
    let nb = part.len() / m.max(1);
    if let Some(t) = Avx512::here() {
        return columns::<_, W, 4, 4>(t, x, m, k, rows, n0, nb, part);
    }
    if let Some(t) = Avx2::here() {
        return columns::<_, W, 3, 4>(t, x, m, k, rows, n0, nb, part);
    }
    columns::<_, W, 2, 2>(Portable, x, m, k, rows, n0, nb, part);
}

/// True when [`small_m`] takes the weight: a dense f32 or bf16 `W [N, K]` with contiguous
/// rows.
pub(crate) fn small_m_applies(w: &Weights) -> bool {
    matches!(w, Weights::Dense(b) if w.by_column() && (b.rs == 1 || b.rows <= 1)
        && matches!(b.st, Storage::F32(_) | Storage::BF16(_)))
}

/// `c [m, n] = x [m, k] . W^T` (x dense f32 rows, `c` contiguous) when
/// [`small_m_applies`] to the weight; `false` (nothing written) otherwise.
pub(crate) fn small_m(x: &[f32], m: usize, w: &Weights, c: &mut [f32]) -> bool {
    let Weights::Dense(b) = w else { return false };
    if !small_m_applies(w) || m == 0 || x.len() < m * b.rows {
        return false;
    }
    let wt = b.t();
    match wt.st {
        Storage::F32(v) => run(x, m, &wt, v, c),
        Storage::BF16(v) => run(x, m, &wt, v, c),
        _ => false,
    }
}

fn run<W: TileLane>(x: &[f32], m: usize, wt: &Mat, v: &[W], c: &mut [f32]) -> bool {
    let (n, k) = (wt.rows, wt.cols);
    // Rows lie at increasing offsets: the first and the last bound them all.
    let bounded = |r: usize| wt.at(r, 0).checked_add(k).is_some_and(|e| e <= v.len());
    if n == 0 || !bounded(0) || !bounded(n - 1) || c.len() < m * n {
        return false;
    }
    let rows = Rows { v, off: wt.off, rs: wt.rs, k };
    let split = crate::split::worth_splitting(n * k * size_of::<W>());
    let size = if split { chunk_size(n, 16) } else { n };
    // Each task fills its columns' [m, nb] block of an image, scattered into C afterwards.
    with_scratch(n * m, |img| {
        if split {
            img.par_chunks_mut(size * m)
                .enumerate()
                .for_each(|(ci, part)| columns_at_level(x, m, k, rows, ci * size, part));
        } else {
            columns_at_level(x, m, k, rows, 0, &mut img[..n * m]);
        }
        for (ci, part) in img[..n * m].chunks(size * m).enumerate() {
            let (n0, nb) = (ci * size, part.len() / m);
            for i in 0..m {
                c[i * n + n0..i * n + n0 + nb].copy_from_slice(&part[i * nb..(i + 1) * nb]);
            }
        }
    });
    true
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;
    use crate::TestResult;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    /// Every tile shape of every level (run as plain code here, whatever this CPU has),
    /// against f64 sums, over the row, column and K tails.
    fn check<W: TileLane>(to_w: impl Fn(f32) -> W) -> TestResult {
        // The last: several chunks of K (the last not a whole vector), blocks of weight rows
        // with a remainder, groups of rows of x with one left over.
        for (m, n, k) in [
            (1, 1, 1),
            (5, 7, 33),
            (6, 4, 16),
            (7, 9, 130),
            (8, 3, 8),
            (11, 13, 64),
            (32, 5, 7),
            (33, 6, 17),
            (9, 70, 2500),
        ] {
            let x = values(m * k, (m * 31 + k) as u64);
            let wf = values(n * k, (n * 17 + k) as u64);
            let w: Vec<W> = wf.iter().map(|&v| to_w(v)).collect();
            let rows = Rows { v: &w, off: 0, rs: k, k };
            let want: Vec<f64> = (0..m)
                .flat_map(|i| {
                    let (x, w) = (&x, &w);
                    (0..n).map(move |j| (0..k).map(|p| f64::from(x[i * k + p]) * f64::from(w[j * k + p].widen())).sum())
                })
                .collect();
            let mut outs = Vec::new();
            for level in 0..3 {
                let mut part = vec![f32::NAN; m * n];
                match (level, Avx512::here(), Avx2::here()) {
                    (0, Some(t), _) => columns::<_, W, 4, 4>(t, &x, m, k, rows, 0, n, &mut part),
                    (1, _, Some(t)) => columns::<_, W, 3, 4>(t, &x, m, k, rows, 0, n, &mut part),
                    (0 | 1, ..) => continue, // a level this CPU (or its cap) does not run
                    _ => columns::<_, W, 2, 2>(Portable, &x, m, k, rows, 0, n, &mut part),
                }
                outs.push(part);
            }
            for (level, got) in outs.iter().enumerate() {
                for (e, (g, w)) in got.iter().zip(&want).enumerate() {
                    let tol = 1e-5 * (k as f64).sqrt() * (1.0 + w.abs());
                    assert!((f64::from(*g) - w).abs() <= tol, "level {level} m{m} n{n} k{k} at {e}: {g} vs {w}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn every_tile_of_every_level_matches_f64_sums_on_f32_weights() -> TestResult {
        check::<f32>(|v| v)
    }

    #[test]
    fn every_tile_of_every_level_matches_f64_sums_on_bf16_weights() -> TestResult {
        check::<bf16>(bf16::from_f32)
    }
}
