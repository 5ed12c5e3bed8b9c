//! Split-KV decode: few queries against a long cache. Memory-bound, so every key and value
//! row is read once for all the query heads of its kv-head group (and, when the heads of a
//! row sit next to each other in memory, for all kv heads in one sequential pass). The keys
//! are cut into chunks processed in parallel; partial results are merged with log-sum-exp.

use smallvec::SmallVec;

use super::{Problem, Unit};
use crate::alloc::with_scratch;
use crate::pack::out_index;
use crate::simd;
use layerzero_core::model::layout::Layout;

/// Smallest chunk of keys per task (measured on a 125M model's decode, 576 keys on 2
/// threads: chunks of at least 256 made 3 tasks, and one thread did two of them).
const MIN_CHUNK: usize = 64;
/// Keys per block of the P . V product.
const VBLOCK: usize = 64;
/// Keys per block of the Q . K^T product (a few short query rows: `simd::dots_keys`; more: one 16 x 16
/// transpose per 16 dims).
const KBLOCK: usize = simd::KEYS;
/// Query values per kv head (rows x head dim) up to which the scores are taken row by row
/// (`simd::dots_keys`) rather than by one transposed GEMM: measured on 2 threads, row by row
/// took 0.8-0.9x the time at 3 or 4 rows of 64 and about 0.9x at 2 of 128, 1.1x at 4 of 128.
const ROWS_BY_KEYS: usize = 256;

/// A task: kv heads `h0..h1` of sequence `seq`, keys `c0..c1`.
#[derive(Debug, Clone, Copy)]
struct Task {
    seq: usize,
    h0: usize,
    h1: usize,
    c0: usize,
    c1: usize,
}

/// A task's unnormalized output rows with their running max and sum, in one slice of the
/// partials buffer: `o` (rows x dv), then `m` and `l` (rows each).
struct Partial<'b> {
    o: &'b [f32],
    m: &'b [f32],
    l: &'b [f32],
}

/// A decode unit with its kv heads `h0..h1`.
type DecodeUnit = (Unit, (usize, usize));

/// The decode units: per sequence, all kv heads together when the heads of a row are
/// adjacent in memory (one sequential pass), else one unit per kv head; with its kv heads.
fn units(p: &Problem, seqs: &[usize]) -> SmallVec<[DecodeUnit; 8]> {
    let g = p.group();
    let mut out = SmallVec::new();
    for &si in seqs {
        let seq = &p.seqs[si];
        let unit = |h0: usize, h1: usize| (Unit { seq: si, h0: h0 * g, nh: (h1 - h0) * g, i0: 0, n: seq.sq }, (h0, h1));
        if seq.k.heads_inner() && seq.v.heads_inner() {
            out.push(unit(0, p.hkv));
        } else {
            out.extend((0..p.hkv).map(|h| unit(h, h + 1)));
        }
    }
    out
}

/// Runs the decode sequences `seqs` of `p`: each unit's key range split into chunks computed
/// in parallel, merged, and written through `put` into `out` (canonical size `n`,
/// contiguous in `layout`). Temporaries come from per-thread scratch: a warm decode step
/// allocates nothing here.
pub(crate) fn run<T: Send>(
    p: &Problem,
    seqs: &[usize],
    n: [usize; 4],
    layout: Layout,
    out: &mut [T],
    put: fn(&mut [T], &[f32]),
) {
    let units = units(p, seqs);
    if units.is_empty() {
        return;
    }
    let (g, dv) = (p.group(), p.dv);
    // K and V bytes the units read: split across the team's threads only when that outlasts
    // a call on it (a short cache on one thread, unchunked, costs no merge either). Split on
    // rayon's threshold, the 125M model's 576-key cache (1.2 MB a layer) stayed on one
    // thread: 1.34 ms of a 18.2 ms f32 decode step at 10.7 GB/s.
    let kv_bytes: usize = units
        .iter()
        .map(|&(u, (h0, h1))| {
            let seq = &p.seqs[u.seq];
            let elem = seq.k.st.dtype().size_bytes() as usize;
            seq.sk * (h1 - h0) * (p.d + dv) * elem
        })
        .sum();
    let split = crate::split::worth_teaming(kv_bytes);
    // One chunk of keys per thread: each streams one long run of the cache and the merge has
    // the fewest partials. Measured on the 125M model's decode (GQA, 3 rows of 64 per kv
    // head, 576-704 keys, caches cold after the weights' sweep, 2 threads): attention took
    // 514-528 us per step against 638-694 with four chunks per thread; cache-resident
    // single calls were within noise either way.
    let want = if split { rayon::current_num_threads() } else { 1 };
    let per_group = want.div_ceil(units.len()).max(1);
    let mut tasks: SmallVec<[Task; 64]> = SmallVec::new();
    let mut spans: SmallVec<[(usize, usize); 8]> = SmallVec::new();
    for &(u, (h0, h1)) in &units {
        let sk = p.seqs[u.seq].sk;
        let chunks = per_group.min(sk.div_ceil(MIN_CHUNK)).max(1);
        let len = sk.div_ceil(chunks).max(1);
        let first = tasks.len();
        let mut c0 = 0;
        loop {
            let c1 = (c0 + len).min(sk);
            tasks.push(Task { seq: u.seq, h0, h1, c0, c1 });
            c0 = c1;
            if c0 >= sk {
                break;
            }
        }
        spans.push((first, tasks.len()));
    }
    // Every task's partial in one buffer, at a common stride.
    let rows = |t: &Task| (t.h1 - t.h0) * g * p.seqs[t.seq].sq;
    let stride = tasks.iter().map(rows).max().unwrap_or(0) * (dv + 2);
    if stride == 0 {
        return;
    }
    with_scratch(tasks.len() * stride, |parts: &mut [f32]| {
        if split {
            crate::team::chunks_mut(parts, stride, |i, buf| {
                let t = &tasks[i];
                task(p, t, &mut buf[..rows(t) * (dv + 2)]);
            });
        } else {
            for (buf, t) in parts.chunks_mut(stride).zip(tasks.iter()) {
                task(p, t, &mut buf[..rows(t) * (dv + 2)]);
            }
        }
        let parts: &[f32] = parts;
        with_scratch(dv, |row: &mut [f32]| {
            for (&(u, _), &(a, b)) in units.iter().zip(&spans) {
                let seq = &p.seqs[u.seq];
                let partial = |i: usize| {
                    let r = rows(&tasks[i]);
                    let (o, ml) = parts[i * stride..i * stride + r * (dv + 2)].split_at(r * dv);
                    let (m, l) = ml.split_at(r);
                    Partial { o, m, l }
                };
                let pieces: SmallVec<[Partial; 64]> = (a..b).map(partial).collect();
                for r in 0..u.nh * u.n {
                    combine(&pieces, r, dv, row);
                    let (hh, t) = (r / u.n, r % u.n);
                    let at = out_index(n, layout, seq.b, seq.q0 + u.i0 + t, u.h0 + hh);
                    put(&mut out[at..at + dv], row);
                }
            }
        });
    });
}

/// Task `t` into `buf` (its partial: o, m, l).
fn task(p: &Problem, t: &Task, buf: &mut [f32]) {
    let seq = &p.seqs[t.seq];
    let (d, dv, g, sq) = (p.d, p.dv, p.group(), seq.sq);
    let per_head = g * sq;
    let nheads = t.h1 - t.h0;
    let rows = nheads * per_head;
    let (o, ml) = buf.split_at_mut(rows * dv);
    let (mrow, lrow) = ml.split_at_mut(rows);
    o.fill(0.0);
    mrow.fill(f32::NEG_INFINITY);
    lrow.fill(0.0);
    let mut ranges = [(0usize, 0usize); super::DECODE_MAX_SQ];
    for (i, r) in ranges.iter_mut().enumerate().take(sq) {
        *r = p.range(seq, i);
    }
    let ranges = &ranges[..sq];
    let (lo, hi) = ranges.iter().filter(|r| r.0 < r.1).fold((usize::MAX, 0), |(a, b), r| (a.min(r.0), b.max(r.1)));
    let (ja, jb) = (lo.max(t.c0), hi.min(t.c1));
    if ja >= jb {
        return;
    }
    let w = jb - ja;
    with_scratch(rows * d + rows * w + per_head + d + VBLOCK * dv + 2 * KBLOCK * d, |scratch: &mut [f32]| {
        let (qp, rest) = scratch.split_at_mut(rows * d);
        let (s, rest) = rest.split_at_mut(rows * w);
        let (tmp, rest) = rest.split_at_mut(per_head);
        let (kscratch, rest) = rest.split_at_mut(d);
        let (kbuf, rest) = rest.split_at_mut(KBLOCK * d);
        let (kt, vbuf) = rest.split_at_mut(KBLOCK * d);
        // Queries, rows ordered [kv head][head in group][position].
        for kh in 0..nheads {
            for hh in 0..g {
                for i in 0..sq {
                    let r = (kh * g + hh) * sq + i;
                    p.read_q(seq, i, (t.h0 + kh) * g + hh, &mut qp[r * d..(r + 1) * d]);
                }
            }
        }
        // Scores [row][key]: blocks of KBLOCK keys as a small GEMM of the head's queries
        // against the block transposed (no horizontal sums, no call per key), or for one
        // query row each key's dot in its own accumulator; the rest key by key.
        // Row by row for a few short query rows, or wherever the block transpose is scalar.
        let by_keys = per_head * d <= ROWS_BY_KEYS || simd::level() != simd::Level::Avx512;
        let mut j = ja;
        while j < jb {
            let full = jb - j >= KBLOCK && d.is_multiple_of(16);
            let nb = if full { KBLOCK } else { 1 };
            for kh in 0..nheads {
                let q = &qp[kh * per_head * d..(kh + 1) * per_head * d];
                if full {
                    // f32 keys in one run are transposed where they lie; others gathered first.
                    let (src, ld) = match seq.k.f32_run(t.h0 + kh, j, j + KBLOCK, d) {
                        Some(run) => run,
                        None => {
                            for (x, dst) in kbuf.chunks_exact_mut(d).enumerate() {
                                dst.copy_from_slice(seq.k.row_f32(t.h0 + kh, j + x, kscratch));
                            }
                            (&*kbuf, d)
                        }
                    };
                    let at = kh * per_head * w + (j - ja);
                    // A few short query rows: each key's dot in its own accumulator, row by
                    // row; more share one transpose of the block, where AVX-512 transposes it
                    // in registers (below AVX-512 the transpose is scalar: at cap avx2 the
                    // 4096-key GQA decode streamed its cache at 39% of copy bandwidth).
                    if by_keys {
                        for (r, qr) in q.chunks_exact(d).enumerate() {
                            simd::dots_keys(qr, src, ld, d, &mut s[at + r * w..at + r * w + KBLOCK]);
                        }
                        continue;
                    }
                    for dd in (0..d).step_by(16) {
                        simd::transpose_16x16(&src[dd..], ld, &mut kt[dd * KBLOCK..], KBLOCK);
                    }
                    simd::gemm(per_head, KBLOCK, d, q, d, kt, KBLOCK, &mut s[at..], w, false);
                } else {
                    let krow = seq.k.row_f32(t.h0 + kh, j, kscratch);
                    simd::dots(q, d, krow, tmp);
                    for (r, &x) in tmp.iter().enumerate() {
                        s[(kh * per_head + r) * w + (j - ja)] = x;
                    }
                }
            }
            j += nb;
        }
        for r in 0..rows {
            let (kh, hh, i) = (r / per_head, (r / sq) % g, r % sq);
            let (lo, hi) = ranges[i];
            let a = lo.clamp(ja, jb) - ja;
            let b = hi.clamp(ja, jb) - ja;
            let row = &mut s[r * w..(r + 1) * w];
            row[..a].fill(0.0);
            row[b.max(a)..].fill(0.0);
            if a >= b {
                continue;
            }
            let seg = &mut row[a..b];
            if p.mods.active() {
                p.mods.apply(seq, (t.h0 + kh) * g + hh, i, ja + a, seg);
            }
            let mx = simd::row_max(seg);
            if mx == f32::NEG_INFINITY {
                seg.fill(0.0);
                continue;
            }
            lrow[r] = simd::exp_sub_sum(seg, mx);
            mrow[r] = mx;
        }
        // o += P . V, per kv head, over blocks of keys (a block of all heads stays in L2).
        let mut j0 = ja;
        while j0 < jb {
            let j1 = (j0 + VBLOCK).min(jb);
            for kh in 0..nheads {
                let h = t.h0 + kh;
                let o = &mut o[kh * per_head * dv..(kh + 1) * per_head * dv];
                let mut j = j0;
                while j < j1 {
                    let e = seq.v.run_end(j, j1);
                    let a = &s[kh * per_head * w + (j - ja)..];
                    match seq.v.f32_run(h, j, e, dv) {
                        Some((rows, ld)) => simd::gemm(per_head, dv, e - j, a, w, rows, ld, o, dv, true),
                        None => {
                            let vb = &mut vbuf[..(e - j) * dv];
                            for (x, row) in vb.chunks_exact_mut(dv).enumerate() {
                                seq.v.read_row(h, j + x, row);
                            }
                            simd::gemm(per_head, dv, e - j, a, w, vb, dv, o, dv, true);
                        }
                    }
                    j = e;
                }
            }
            j0 = j1;
        }
    });
}

/// Row `r` of a unit merged from its pieces into `row` (normalized; zeros when no key was
/// visible).
fn combine(parts: &[Partial], r: usize, dv: usize, row: &mut [f32]) {
    row.fill(0.0);
    let mx = parts.iter().map(|q| q.m[r]).fold(f32::NEG_INFINITY, f32::max);
    let mut l = 0f32;
    if mx != f32::NEG_INFINITY {
        for q in parts {
            if q.m[r] == f32::NEG_INFINITY {
                continue;
            }
            let f = (q.m[r] - mx).exp();
            l += f * q.l[r];
            simd::axpy(row, f, &q.o[r * dv..(r + 1) * dv]);
        }
    }
    if l > 0.0 {
        simd::scale(row, 1.0 / l);
    } else {
        row.fill(0.0);
    }
}
