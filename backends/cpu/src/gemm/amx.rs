//!
//! bf16 x bf16 linear on AMX tiles. Products of bf16 values are exact in f32 and the tiles
//! sum in f32, so this is the f32 GEMM of the same values (another summation order).
//!
//! It computes the transposed product `C^T [N, M] = W [N, K] . x^T`, so that W, the large
//! operand, is AMX's A operand, whose tiles are plain row segments (packing it is a copy of
//! 64-byte pieces) and x, packed once per call, is B (its pairs transposed in registers).
//! A task owns `NB` output columns of up to `MB` rows; it walks K in chunks of `KS` steps,
//! packing the chunk's weight block (256 KiB) while the next chunk's weight and x pieces
//! are prefetched into L2, and accumulates an f32 block in L2 that is finally written
//! transposed, bias added and rounded once. Every tile operand is 64-byte aligned: tile
//! rows straddling two cache lines made the loads 3x slower. Sizes were chosen by
//! measurement (512 x 4096 x 4096 on a 2-core AMX VM): 256 x 8 steps beat 128..512 rows
//! and 4..32 steps by 5-20%.

use half::bf16;
use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;
use rayon::prelude::*;

use super::super::alloc::{self, Aligned, Kept};
use super::super::simd::{self, AMX_A_TILE, AMX_B_TILE, Prefetch, gemm_amx_bf16_tiles};
use super::Mat;
use layerzero_core::tensor::Storage;

fn bits<'a>(m: &Mat<'a>) -> &'a [u16] {
    match m.st {
        Storage::BF16(v) => v.reinterpret_cast(),
        _ => unreachable!("the AMX path is taken for bf16 storages only"),
    }
}

/// Row `r` of `m` as `(m[r][2p] | m[r][2p + 1] << 16)` pairs, zero beyond its columns.
fn pair_row(m: &Mat, v: &[u16], r: usize, out: &mut [u32]) {
    out.fill(0);
    if m.cs == 1 {
        let src = &v[m.at(r, 0)..m.at(r, 0) + m.cols];
        let (pairs, tail) = src.as_chunks::<2>();
        for (d, s) in out.iter_mut().zip(pairs) {
            *d = u32::from(s[0]) | (u32::from(s[1]) << 16);
        }
        if let Some(&t) = tail.first() {
            out[pairs.len()] = u32::from(t);
        }
    } else {
        for c in 0..m.cols {
            out[c / 2] |= u32::from(v[m.at(r, c)]) << (16 * (c % 2));
        }
    }
}

/// x [M, K] as the B operand, chunk by chunk of `ks` K steps (the last may be shorter):
/// in chunk c (at `c * ks * 16 * mt` pair rows), column tile j (x rows 16 j..) is the
/// chunk's pair rows of 16 `u32`, so a chunk's column tiles are contiguous.
fn pack_x(x: &Mat, kt: usize, ks: usize) -> Aligned<u32> {
    let (m, v) = (x.rows, bits(x));
    let mt = m.div_ceil(16);
    let mut out = Aligned::zeroed(mt * kt * AMX_B_TILE);
    // Each column tile's pieces, one per chunk, so tiles can be filled in parallel.
    let mut pieces: Vec<Vec<&mut [u32]>> = (0..mt).map(|_| Vec::new()).collect();
    let mut rest = &mut out[..];
    for chunk in 0..kt.div_ceil(ks) {
        let steps = ks.min(kt - chunk * ks);
        for tile in pieces.iter_mut() {
            let (piece, tail) = rest.split_at_mut(steps * AMX_B_TILE);
            tile.push(piece);
            rest = tail;
        }
    }
    pieces.into_par_iter().enumerate().for_each(|(j, mut tile)| {
        let rows = 16.min(m - 16 * j);
        if x.cs == 1 {
            for s in 0..kt {
                let cols = 32.min(x.cols - 32 * s);
                let src = &v[x.at(16 * j, 32 * s)..];
                let d = (s % ks) * AMX_B_TILE;
                simd::pair_tile(src, x.rs, rows, cols, &mut tile[s / ks][d..d + AMX_B_TILE]);
            }
            return;
        }
        let mut row = vec![0u32; kt * 16];
        for c in 0..rows {
            pair_row(x, v, 16 * j + c, &mut row);
            for (s, step) in row.chunks(16).enumerate() {
                let piece = &mut tile[s / ks];
                for (q, &w) in step.iter().enumerate() {
                    piece[(s % ks) * AMX_B_TILE + q * 16 + c] = w;
                }
            }
        }
    });
    out
}

/// Weight rows n0..n0 + nb (w is [N, K]), K steps s0..s0 + steps, as the A operand:
/// row tile i, step s is the 16 x 32 block at rows 16 i.., columns 32 (s0 + s)..;
/// zero beyond nb rows and K columns.
fn pack_block(w: &Mat, v: &[u16], n0: usize, nb: usize, s0: usize, steps: usize, out: &mut Aligned<u16>) {
    let k = w.cols;
    let (c0, c1) = (32 * s0, (32 * (s0 + steps)).min(k));
    out.set_len(nb.div_ceil(16) * steps * AMX_A_TILE);
    // Every element is written below unless rows or columns fall short of whole tiles.
    if !nb.is_multiple_of(16) || c1 - c0 < 32 * steps {
        out.fill(0);
    }
    for r in 0..nb {
        let base = (r / 16) * steps * AMX_A_TILE + (r % 16) * 32;
        if w.cs == 1 {
            let src = &v[w.at(n0 + r, c0)..w.at(n0 + r, 0) + c1];
            // Fixed-size pieces: 64-byte moves, not a memcpy call each.
            let (pieces, tail) = src.as_chunks::<32>();
            for (s, piece) in pieces.iter().enumerate() {
                let d = base + s * AMX_A_TILE;
                if let Some(dst) = out.get_mut(d..d + 32).and_then(|d| <&mut [u16; 32]>::try_from(d).ok()) {
                    *dst = *piece;
                }
            }
            if !tail.is_empty() {
                let d = base + pieces.len() * AMX_A_TILE;
                out[d..d + tail.len()].copy_from_slice(tail);
            }
        } else {
            for c in c0..c1 {
                out[base + ((c - c0) / 32) * AMX_A_TILE + c % 32] = v[w.at(n0 + r, c)];
            }
        }
    }
}

/// Weight rows per block (a multiple of 32: two row tiles per product).
const NB: usize = 256;
/// K steps (of 32) per chunk.
const KS: usize = 8;
/// x rows per block (a multiple of 16).
const MB: usize = 512;

/// `out [M, N] = x . b + bias` rounded to bf16, for bf16 x [M, K] and b [K, N] (the
/// weight); M, K, N > 0. Needs `simd::amx_bf16()`.
pub(crate) fn linear_bf16(x: &Mat, b: &Mat, bias: Option<&[f32]>) -> Vec<bf16> {
    let (m, k, n) = (x.rows, x.cols, b.cols);
    let kt = k.div_ceil(32);
    let chunks = kt.div_ceil(KS);
    let mt_all = m.div_ceil(16);
    let xp = pack_x(x, kt, KS);
    let w = b.t(); // [N, K]: the weight's rows
    let wv = bits(&w);
    let mut out: Vec<bf16> = alloc::huge(vec![0u16; m * n]).reinterpret_into();
    let (mblocks, nblocks) = (m.div_ceil(MB), n.div_ceil(NB));
    let mut tasks: Vec<Vec<&mut [bf16]>> = (0..mblocks * nblocks).map(|_| Vec::new()).collect();
    for (r, row) in out.chunks_mut(n).enumerate() {
        for (s, seg) in row.chunks_mut(NB).enumerate() {
            tasks[(r / MB) * nblocks + s].push(seg);
        }
    }
    tasks.into_par_iter().enumerate().for_each(|(t, mut rows)| {
        let (mi, ni) = (t / nblocks, t % nblocks);
        let nt = rows.len().div_ceil(16);
        let (n0, nb) = (ni * NB, NB.min(n - ni * NB));
        // One spare tile column: C rows a multiple of 4 KiB apart would share L1 sets.
        let ldc = 16 * nt + 16;
        let mut ct = CT.with(|k| k.take(nb.div_ceil(16) * 16 * ldc));
        let mut slab = SLAB.with(|k| k.take(0));
        for c in 0..chunks {
            let s0 = c * KS;
            let steps = KS.min(kt - s0);
            pack_block(&w, wv, n0, nb, s0, steps, &mut slab);
            let bp = &xp[(s0 * mt_all + (mi * MB / 16) * steps) * AMX_B_TILE..];
            // The next chunk's pieces of these weight rows and of x come into L2 meanwhile.
            let mut pf = [Prefetch::rows(&wv[..0], 0, 0, 0); 2];
            if c + 1 < chunks {
                let (c0, next) = (32 * (s0 + steps), KS.min(kt - s0 - steps));
                if w.cs == 1 {
                    pf[0] = Prefetch::rows(&wv[w.at(n0, c0)..], nb, (32 * next).min(k - c0), w.rs);
                }
                let xn = ((s0 + steps) * mt_all + (mi * MB / 16) * next) * AMX_B_TILE;
                pf[1] = Prefetch::all(&xp[xn..xn + nt * next * AMX_B_TILE]);
            }
            gemm_amx_bf16_tiles(nb.div_ceil(16), nt, steps, &slab, bp, &mut ct, ldc, c > 0, &pf);
        }
        // ct [nb, rows] transposed into the output rows, bias added, rounded once.
        simd::transpose_round_bf16(&ct, ldc, nb, bias.map(|b| &b[n0..n0 + nb]), &mut rows, 0);
        CT.with(|k| k.keep(ct, usize::MAX));
        SLAB.with(|k| k.keep(slab, usize::MAX));
    });
    out
}

thread_local! {
    /// Each worker's f32 product block and packed weight block, kept between tasks and
    /// calls (a few hundred KiB each, faulted in once).
    static CT: Kept<f32> = const { Kept::new() };
    static SLAB: Kept<u16> = const { Kept::new() };
}
