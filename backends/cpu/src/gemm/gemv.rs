//! Decode GEMV (M <= `GEMV_MAX_M`): every weight element is read once, parallel over N.

use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::view::Mat;
use super::weights::Weights;
use crate::alloc::with_scratch;
use crate::simd;
use crate::simd::Widen;
use layerzero_core::tensor::Storage;

#[inline(always)]
fn fma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { c + a * b }
}

#[inline(always)]
fn hsum16(mut a: [f32; 16]) -> f32 {
    for width in [8, 4, 2, 1] {
        for l in 0..width {
            a[l] += a[l + width];
        }
    }
    a[0]
}

/// `x . w` (equal lengths) with 64 independent f32 lanes.
#[inline(always)]
fn dot1<W: Widen, const FMA: bool>(x: &[f32], w: &[W]) -> f32 {
    const L: usize = 16;
    let (mut a0, mut a1, mut a2, mut a3) = ([0f32; L], [0f32; L], [0f32; L], [0f32; L]);
    let n = w.len().min(x.len()) / (4 * L) * (4 * L);
    for (wv, xv) in w[..n].chunks_exact(4 * L).zip(x[..n].chunks_exact(4 * L)) {
        // Each cache line of this chunk, a few KiB ahead (into the next rows: a GEMV's rows
        // lie back to back).
        for line in (0..4 * L * size_of::<W>()).step_by(64) {
            simd::prefetch_ahead(wv, line);
        }
        for l in 0..L {
            a0[l] = fma::<FMA>(xv[l], wv[l].widen(), a0[l]);
            a1[l] = fma::<FMA>(xv[L + l], wv[L + l].widen(), a1[l]);
            a2[l] = fma::<FMA>(xv[2 * L + l], wv[2 * L + l].widen(), a2[l]);
            a3[l] = fma::<FMA>(xv[3 * L + l], wv[3 * L + l].widen(), a3[l]);
        }
    }
    for l in 0..L {
        a0[l] += (a1[l] + a2[l]) + a3[l];
    }
    let tail: f32 = x[n..].iter().zip(&w[n..]).map(|(p, q)| p * q.widen()).sum();
    hsum16(a0) + tail
}

/// Four rows dotted with one `w`: each 16-lane slice of `w` is loaded once for the four.
#[inline(always)]
fn dot4<W: Widen, const FMA: bool>(x: [&[f32]; 4], w: &[W]) -> [f32; 4] {
    const L: usize = 16;
    let (mut a0, mut a1, mut a2, mut a3) = ([0f32; L], [0f32; L], [0f32; L], [0f32; L]);
    let len = x.iter().fold(w.len(), |m, r| m.min(r.len()));
    let n = len / L * L;
    let rows = w[..n]
        .chunks_exact(L)
        .zip(x[0][..n].chunks_exact(L))
        .zip(x[1][..n].chunks_exact(L))
        .zip(x[2][..n].chunks_exact(L))
        .zip(x[3][..n].chunks_exact(L));
    for ((((wv, x0), x1), x2), x3) in rows {
        for l in 0..L {
            let v = wv[l].widen();
            a0[l] = fma::<FMA>(x0[l], v, a0[l]);
            a1[l] = fma::<FMA>(x1[l], v, a1[l]);
            a2[l] = fma::<FMA>(x2[l], v, a2[l]);
            a3[l] = fma::<FMA>(x3[l], v, a3[l]);
        }
    }
    let mut out = [0f32; 4];
    for (r, a) in [a0, a1, a2, a3].into_iter().enumerate() {
        let tail: f32 = x[r][n..len].iter().zip(&w[n..len]).map(|(p, q)| p * q.widen()).sum();
        out[r] = hsum16(a) + tail;
    }
    out
}

/// Rows `r0..r0 + part.len()` of `wt` ([N, K], contiguous rows of `v`) dotted with one row
/// `x`, a row at a time: one weight stream read 256 bytes per step. Four rows interleaved
/// (four streams of 64 bytes per step) streamed slower on an AMD EPYC (Zen 5 class, 2
/// vCPUs): the 32000 x 768 f32 lm_head at 23-24 GB/s on one thread against 32-35 a row at a
/// time, on two 30-41 against 32-56 (`lz run --repeat 20`, three interleaved rounds). bf16
/// pairs keep four rows (`bf16_pair_columns`): there one row's two `vdpbf16ps` chains were
/// the slower (the 125M bf16 model's decode step 6.05-6.25 ms against 5.28-5.66).
fn one_row_columns<W: Widen>(x: &[f32], v: &[W], wt: &Mat, r0: usize, part: &mut [f32]) -> bool {
    let k = wt.cols;
    let row = |r: usize| v.get(wt.at(r, 0)..wt.at(r, 0) + k);
    // Rows lie at increasing offsets: the first and the last bound them all.
    let last = r0 + part.len().saturating_sub(1);
    if x.len() < k || row(r0).is_none() || row(last).is_none() {
        return false;
    }
    let x = &x[..k];
    for (j, out) in part.chunks_exact_mut(1).enumerate() {
        dots_rows(x, k, row(r0 + j).unwrap_or_default(), out);
    }
    true
}

#[inline(always)]
fn dots_rows_impl<W: Widen, const FMA: bool>(x: &[f32], k: usize, w: &[W], out: &mut [f32]) {
    let w = &w[..k];
    let row = |r: usize| &x[r * k..(r + 1) * k];
    let mut r = 0;
    while r + 4 <= out.len() {
        out[r..r + 4].copy_from_slice(&dot4::<W, FMA>([row(r), row(r + 1), row(r + 2), row(r + 3)], w));
        r += 4;
    }
    while r < out.len() {
        out[r] = dot1::<W, FMA>(row(r), w);
        r += 1;
    }
}

/// `out[r] = x[r * k..(r + 1) * k] . w` for every r < `out.len()` (x holds that many rows
/// of length k, w at least k elements), loading `w` once per four rows.
pub(crate) fn dots_rows<W: Widen>(x: &[f32], k: usize, w: &[W], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        /// # Safety
        /// The CPU must support AVX-512F, AVX-512VL, AVX2, FMA.
        #[allow(unsafe_code)]
        #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
        unsafe fn with_avx512<W: Widen>(x: &[f32], k: usize, w: &[W], out: &mut [f32]) {
            dots_rows_impl::<W, true>(x, k, w, out);
        }
        /// # Safety
        /// The CPU must support AVX2, FMA.
        #[allow(unsafe_code)]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn with_avx2<W: Widen>(x: &[f32], k: usize, w: &[W], out: &mut [f32]) {
            dots_rows_impl::<W, true>(x, k, w, out);
        }
        match simd::level() {
            simd::Level::Avx512 => {
                #[allow(unsafe_code)]
                // SAFETY: `level()` is Avx512 only when the CPU reports AVX-512F/VL, AVX2 and FMA.
                unsafe {
                    with_avx512(x, k, w, out)
                };
                return;
            }
            simd::Level::Avx2 => {
                #[allow(unsafe_code)]
                // SAFETY: `level()` is Avx2 only when the CPU reports AVX2 and FMA.
                unsafe {
                    with_avx2(x, k, w, out)
                };
                return;
            }
            simd::Level::Portable => {}
        }
    }
    dots_rows_impl::<W, false>(x, k, w, out);
}

/// `out[i] = x_i . w[r, :]` for the rows x_i of `x` (each `w.cols` long): a contiguous f32
/// or bf16 row is read in place (bf16 widened as it is loaded), any other through
/// `scratch` (at least `w.cols` long).
pub(crate) fn dots_mat_row(x: &[f32], w: &Mat, r: usize, scratch: &mut [f32], out: &mut [f32]) {
    let (k, at) = (w.cols, w.at(r, 0));
    if w.cs == 1 || k <= 1 {
        match w.st {
            Storage::F32(v) if at + k <= v.len() => return dots_rows(x, k, &v[at..at + k], out),
            Storage::BF16(v) if at + k <= v.len() => return dots_rows(x, k, &v[at..at + k], out),
            _ => {}
        }
    }
    w.read_row(r, &mut scratch[..k]);
    dots_rows(x, k, &scratch[..k], out);
}

/// Rows `r0..r0 + nb` of a bf16 weight (`wt`: [N, K], rows read in place) dotted with the
/// `m` bf16 rows of `xb`, four weight rows at a time, into `part` ([nb, m]); `false` when
/// the weight is not a bf16 matrix with contiguous rows.
/// With `lo`, x is `xb + lo` (see [`simd::split_bf16`]).
pub(crate) fn bf16_pair_columns(
    xb: &[u16],
    lo: Option<&[u16]>,
    m: usize,
    wt: &Mat,
    r0: usize,
    part: &mut [f32],
) -> bool {
    let Storage::BF16(v) = wt.st else { return false };
    let k = wt.cols;
    if !(wt.cs == 1 || k <= 1) || xb.len() < m * k || lo.is_some_and(|l| l.len() < m * k) {
        return false;
    }
    let v: &[u16] = v.reinterpret_cast();
    let row = |r: usize| v.get(wt.at(r, 0)..wt.at(r, 0) + k);
    let nb = part.len() / m;
    let mut j = 0;
    while j + 4 <= nb {
        let (Some(a), Some(b), Some(c), Some(d)) = (row(r0 + j), row(r0 + j + 1), row(r0 + j + 2), row(r0 + j + 3))
        else {
            return false;
        };
        for i in 0..m {
            let dots = simd::dots_bf16(&xb[i * k..(i + 1) * k], lo.map(|l| &l[i * k..(i + 1) * k]), [a, b, c, d]);
            for (q, &d) in dots.iter().enumerate() {
                part[(j + q) * m + i] = d;
            }
        }
        j += 4;
    }
    for j in j..nb {
        let Some(a) = row(r0 + j) else { return false };
        for i in 0..m {
            part[j * m + i] = simd::dots_bf16(&xb[i * k..(i + 1) * k], lo.map(|l| &l[i * k..(i + 1) * k]), [a])[0];
        }
    }
    true
}

/// Column ranges splitting `n` for a parallel sweep (about 8 per thread, at least `min`).
pub(crate) fn chunks(n: usize, min: usize) -> Vec<(usize, usize)> {
    let size = chunk_size(n, min);
    (0..n).step_by(size).map(|n0| (n0, size.min(n - n0))).collect()
}

/// The width of the column ranges of [`chunks`].
pub(crate) fn chunk_size(n: usize, min: usize) -> usize {
    let target = rayon::current_num_threads().max(1) * 8;
    n.div_ceil(target).max(min).max(1)
}

/// `C [M, N] = x [M, K] . B` for a few rows: every weight element is read once. Nothing
/// is allocated once the threads' scratch is warm (a decode step runs this per projection).
/// `xb` is x as bf16 bits when x is bf16: with a bf16 weight the dots then run on bf16
/// pairs ([`simd::dots_bf16`]).
pub(super) fn gemv(x: &[f32], xb: Option<&[u16]>, m: usize, w: &Weights, c: &mut [f32]) {
    let n = w.n();
    if m == 0 || n == 0 {
        return;
    }
    // A small weight runs on this thread (the split would cost more than it saves): one row
    // splits on the team (a decode step's chain of calls), more rows on rayon.
    let split = if m == 1 { crate::split::worth_teaming(w.bytes()) } else { crate::split::worth_splitting(w.bytes()) };
    let size = if split { chunk_size(n, 16) } else { n };
    if m == 1 {
        // One row: [nb, 1] and [1, nb] are the same layout, so each task writes C directly.
        if split {
            crate::team::chunks_mut(&mut c[..n], size, |ci, part| columns(x, xb, m, w, ci * size, part));
        } else {
            columns(x, xb, m, w, 0, &mut c[..n]);
        }
        return;
    }
    // Each task fills its columns' block of a [N, M] (by column) or [M, nb] (by row)
    // image, scattered into C afterwards.
    with_scratch(n * m, |img| {
        if split {
            img.par_chunks_mut(size * m).enumerate().for_each(|(ci, part)| columns(x, xb, m, w, ci * size, part));
        } else {
            columns(x, xb, m, w, 0, img);
        }
        let by_col = w.by_column();
        for (ci, part) in img.chunks(size * m).enumerate() {
            let (n0, nb) = (ci * size, part.len() / m);
            for i in 0..m {
                for j in 0..nb {
                    c[i * n + n0 + j] = if by_col { part[j * m + i] } else { part[i * nb + j] };
                }
            }
        }
    });
}

/// Columns `n0..n0 + part.len() / m` of `x . B` into `part`: `[nb, m]` when the weight is
/// read by column (one weight row dotted with every x row), `[m, nb]` otherwise.
fn columns(x: &[f32], xb: Option<&[u16]>, m: usize, w: &Weights, n0: usize, part: &mut [f32]) {
    let (k, nb) = (w.k(), part.len() / m);
    if let (Some(xb), Weights::Dense(b)) = (xb, w)
        && w.by_column()
        && simd::avx512_bf16()
        && bf16_pair_columns(xb, None, m, &b.t(), n0, part)
    {
        return;
    }
    // One f32 row of x against contiguous f32 or bf16 weight rows, a row at a time.
    if let (1, Weights::Dense(b)) = (m, w)
        && w.by_column()
        && (b.rs == 1 || k <= 1)
    {
        let wt = b.t();
        let done = match wt.st {
            Storage::F32(v) => one_row_columns(x, v, &wt, n0, part),
            Storage::BF16(v) => one_row_columns(x, v, &wt, n0, part),
            _ => false,
        };
        if done {
            return;
        }
    }
    if let Weights::Int4(q) = w
        && let Some(xq) = &q.xq
    {
        return super::gemv_int4::columns_i8(xq, m, q, n0, part);
    }
    if let Weights::Int4(q) = w
        && super::gemv_int4::serves(q)
    {
        return super::gemv_int4::columns(x, m, q, n0, part);
    }
    with_scratch(k.max(nb), |scratch| {
        if w.by_column() {
            for j in 0..nb {
                let out = &mut part[j * m..(j + 1) * m];
                match w {
                    Weights::Dense(b) => dots_mat_row(x, &b.t(), n0 + j, scratch, out),
                    Weights::Int4(q) => {
                        q.row(n0 + j, &mut scratch[..k]);
                        dots_rows(x, k, &scratch[..k], out);
                    }
                }
            }
        } else if let Weights::Dense(b) = w {
            // The weight rows' segments, each read once, axpy'd in.
            part.fill(0.0);
            let sub = b.cols(n0, nb);
            let seg = &mut scratch[..nb];
            for p in 0..k {
                let row = match sub.f32_row(p) {
                    Some(r) => r,
                    None => {
                        sub.read_row(p, seg);
                        &*seg
                    }
                };
                for i in 0..m {
                    simd::axpy(&mut part[i * nb..(i + 1) * nb], x[i * k + p], row);
                }
            }
        }
    });
}
