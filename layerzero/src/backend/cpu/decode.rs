//! Split-KV decode: few queries against a long cache. Memory-bound, so every key and value
//! row is read once for all the query heads of its kv-head group (and, when the heads of a
//! row sit next to each other in memory, for all kv heads in one sequential pass). The keys
//! are cut into chunks processed in parallel; partial results are merged with log-sum-exp.

use rayon::prelude::*;

use super::engine::{Problem, Sink, Unit};
use super::simd;

/// Smallest chunk of keys per task.
const MIN_CHUNK: usize = 256;
/// Keys per block of the P . V product.
const VBLOCK: usize = 64;

/// A task: kv heads `h0..h1` of sequence `seq`, keys `c0..c1`.
#[derive(Debug, Clone, Copy)]
struct Task {
    seq: usize,
    h0: usize,
    h1: usize,
    c0: usize,
    c1: usize,
}

/// Unnormalized output rows with their running max and sum.
struct Partial {
    o: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
}

/// The decode units: per sequence, all kv heads together when the heads of a row are
/// adjacent in memory (one sequential pass), else one unit per kv head; with its kv heads.
pub(crate) fn units(p: &Problem, seqs: &[usize]) -> Vec<(Unit, (usize, usize))> {
    let g = p.group();
    let mut out = Vec::new();
    for &si in seqs {
        let seq = &p.seqs[si];
        let ranges: Vec<(usize, usize)> = if seq.k.heads_inner() && seq.v.heads_inner() {
            vec![(0, p.hkv)]
        } else {
            (0..p.hkv).map(|h| (h, h + 1)).collect()
        };
        for (h0, h1) in ranges {
            out.push((Unit { seq: si, h0: h0 * g, nh: (h1 - h0) * g, i0: 0, n: seq.sq }, (h0, h1)));
        }
    }
    out
}

/// Runs the decode units, each key range split into chunks computed in parallel and merged.
pub(crate) fn run(p: &Problem, units: &[(Unit, (usize, usize))], sinks: Vec<Sink>) {
    if units.is_empty() {
        return;
    }
    let want = 4 * rayon::current_num_threads();
    let per_group = want.div_ceil(units.len()).max(1);
    let mut tasks = Vec::new();
    let mut spans = Vec::with_capacity(units.len());
    for &(u, (h0, h1)) in units {
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
        spans.push(first..tasks.len());
    }
    let partials: Vec<Partial> = tasks.par_iter().map(|t| task(p, t)).collect();
    units.par_iter().zip(spans).zip(sinks).for_each(|((&(u, _), span), mut sink)| {
        combine(p, &u, &partials[span], &mut sink);
    });
}

fn task(p: &Problem, t: &Task) -> Partial {
    let seq = &p.seqs[t.seq];
    let (d, dv, g, sq) = (p.d, p.dv, p.group(), seq.sq);
    let per_head = g * sq;
    let nheads = t.h1 - t.h0;
    let rows = nheads * per_head;
    let mut out = Partial { o: vec![0f32; rows * dv], m: vec![f32::NEG_INFINITY; rows], l: vec![0f32; rows] };
    let ranges: Vec<(usize, usize)> = (0..sq).map(|i| p.range(seq, i)).collect();
    let (lo, hi) = ranges.iter().filter(|r| r.0 < r.1).fold((usize::MAX, 0), |(a, b), r| (a.min(r.0), b.max(r.1)));
    let (ja, jb) = (lo.max(t.c0), hi.min(t.c1));
    if ja >= jb {
        return out;
    }
    let w = jb - ja;
    // Queries, rows ordered [kv head][head in group][position].
    let mut qp = vec![0f32; rows * d];
    for kh in 0..nheads {
        for hh in 0..g {
            for i in 0..sq {
                let r = (kh * g + hh) * sq + i;
                p.read_q(seq, i, (t.h0 + kh) * g + hh, &mut qp[r * d..(r + 1) * d]);
            }
        }
    }
    // Scores [row][key].
    let mut s = vec![0f32; rows * w];
    let mut tmp = vec![0f32; per_head];
    let mut kscratch = vec![0f32; d];
    for j in ja..jb {
        for kh in 0..nheads {
            let krow = seq.k.row_f32(t.h0 + kh, j, &mut kscratch);
            simd::dots(&qp[kh * per_head * d..(kh + 1) * per_head * d], d, krow, &mut tmp);
            for (r, &x) in tmp.iter().enumerate() {
                s[(kh * per_head + r) * w + (j - ja)] = x;
            }
        }
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
        out.l[r] = simd::exp_sub_sum(seg, mx);
        out.m[r] = mx;
    }
    // out += P . V, per kv head, over blocks of keys (a block of all heads stays in L2).
    let mut vbuf = Vec::new();
    let mut j0 = ja;
    while j0 < jb {
        let j1 = (j0 + VBLOCK).min(jb);
        for kh in 0..nheads {
            let h = t.h0 + kh;
            let o = &mut out.o[kh * per_head * dv..(kh + 1) * per_head * dv];
            let mut j = j0;
            while j < j1 {
                let e = seq.v.run_end(j, j1);
                let a = &s[kh * per_head * w + (j - ja)..];
                match seq.v.f32_run(h, j, e, dv) {
                    Some((rows, ld)) => simd::gemm(per_head, dv, e - j, a, w, rows, ld, o, dv, true),
                    None => {
                        vbuf.resize((e - j) * dv, 0.0);
                        for (x, row) in vbuf.chunks_exact_mut(dv).enumerate() {
                            seq.v.read_row(h, j + x, row);
                        }
                        simd::gemm(per_head, dv, e - j, a, w, &vbuf, dv, o, dv, true);
                    }
                }
                j = e;
            }
        }
        j0 = j1;
    }
    out
}

fn combine(p: &Problem, u: &Unit, parts: &[Partial], sink: &mut Sink) {
    let dv = p.dv;
    let mut row = vec![0f32; dv];
    for r in 0..u.nh * u.n {
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
                simd::axpy(&mut row, f, &q.o[r * dv..(r + 1) * dv]);
            }
        }
        if l > 0.0 {
            simd::scale(&mut row, 1.0 / l);
        } else {
            row.fill(0.0);
        }
        sink(r, &row);
    }
}
