//! The attention engine shared by dense and paged attention. A problem is a list of
//! sequences (queries of one batch row against their keys), each key row reachable through a
//! [`KvSrc`] (dense strided, or through a block table). Sequences with many queries run the
//! flash-style tiled path: K and V of each (sequence, kv head) are packed once into panels,
//! then each unit (all query heads of a kv head x a tile of positions) walks the visible key
//! tiles with an online softmax, its two tile products on the AVX-512/AVX2 microkernels (f32)
//! or on bf16 pairs (bf16 inputs: AMX tiles, or `vdpbf16ps` without AMX); fully masked key tiles are never visited. Sequences with few
//! queries run the split-KV decode path (`decode.rs`). Every output row is written once, in
//! the output dtype, by the unit that computes it.

mod decode;
mod rotary;

pub(crate) use rotary::Rotary;

use half::{bf16, f16};
use rayon::prelude::*;
use smallvec::SmallVec;

use layerzero_core::exec::args::Outputs;
use layerzero_core::exec::executor::KernelError;
use layerzero_core::exec::semantics::{alibi_distance, visible_keys};
use layerzero_core::model::attrs::AttentionAttrs;
use layerzero_core::model::dtype::DType;
use layerzero_core::model::layout::Layout;
use layerzero_core::tensor::{HostTensor, Storage};

use super::alloc::{Aligned, Out};
use super::pack::{self, Bshd, IntSlice, invalid, out_index, read_f32};
use super::simd;

/// Keys per tile of the tiled path.
pub(crate) const BK: usize = 256;
/// Keys per tile of the bf16-pair path (AMX or `vdpbf16ps`).
pub(crate) const BK_AMX: usize = 512;
/// Sequences with at most this many queries take the decode path.
pub(crate) const DECODE_MAX_SQ: usize = 4;

/// Where key (or value) row `j` of kv head `h` of one sequence lives.
#[derive(Debug, Clone)]
pub(crate) enum KvAddr<'a> {
    /// `base + j * sj + h * sh`.
    Dense {
        /// Storage index of row 0, head 0.
        base: usize,
        /// Stride between rows.
        sj: usize,
    },
    /// `base + table[j / ps] * s_page + (j % ps) * s_slot + h * sh`.
    Paged {
        /// The sequence's row of the block table (every entry it reaches already validated).
        table: IntSlice<'a>,
        /// Storage index of page 0, slot 0, head 0.
        base: usize,
        /// Stride between pages.
        s_page: usize,
        /// Page size.
        ps: usize,
        /// Stride between slots of a page.
        s_slot: usize,
    },
}

/// The key or value rows of one sequence.
#[derive(Debug, Clone)]
pub(crate) struct KvSrc<'a> {
    /// Storage.
    pub st: &'a Storage,
    /// Stride of the head dim.
    pub sd: usize,
    /// Stride between kv heads.
    pub sh: usize,
    /// Row addressing.
    pub addr: KvAddr<'a>,
    /// Per-kv-head dequantization scale (paged caches with `k_scale`/`v_scale`).
    pub scale: Option<&'a [f32]>,
    /// RoPE fused into attention: row `j` is rotated at position `j` as it is read (keys).
    pub rot: Option<&'a Rotary>,
}

impl KvSrc<'_> {
    /// Storage index of row `j` of head `h`.
    #[inline]
    pub(crate) fn row(&self, h: usize, j: usize) -> usize {
        match &self.addr {
            KvAddr::Dense { base, sj } => base + j * sj + h * self.sh,
            KvAddr::Paged { table, base, s_page, ps, s_slot } => {
                base + table.get(j / ps) as usize * s_page + (j % ps) * s_slot + h * self.sh
            }
        }
    }

    /// True when the heads of one row are closer in memory than consecutive rows.
    pub(crate) fn heads_inner(&self) -> bool {
        match &self.addr {
            KvAddr::Dense { sj, .. } => self.sh < *sj,
            KvAddr::Paged { s_slot, .. } => self.sh < *s_slot,
        }
    }

    /// Rows `j0..j1` of head `h` as one f32 slice with its row stride, when they are f32
    /// with a unit head-dim stride, need no scale and lie in one run (one page when paged).
    pub(crate) fn f32_run(&self, h: usize, j0: usize, j1: usize, width: usize) -> Option<(&[f32], usize)> {
        if self.scale.is_some() || self.rot.is_some() || (self.sd != 1 && width > 1) || j1 <= j0 {
            return None;
        }
        let stride = match &self.addr {
            KvAddr::Dense { sj, .. } => *sj,
            KvAddr::Paged { ps, s_slot, .. } if j0 / ps == (j1 - 1) / ps => *s_slot,
            KvAddr::Paged { .. } => return None,
        };
        let Storage::F32(v) = self.st else { return None };
        let base = self.row(h, j0);
        v.get(base..base + (j1 - j0 - 1) * stride + width).map(|r| (r, stride))
    }

    /// The end of the run of rows starting at `j` (the page end when paged), capped at `end`.
    pub(crate) fn run_end(&self, j: usize, end: usize) -> usize {
        match &self.addr {
            KvAddr::Dense { .. } => end,
            KvAddr::Paged { ps, .. } => ((j / ps + 1) * ps).min(end),
        }
    }

    /// Row `j` of head `h` as bf16 bits (exact when the storage is bf16 with no scale).
    pub(crate) fn read_row_bf16(&self, h: usize, j: usize, out: &mut [u16]) {
        if self.scale.is_none() && self.rot.is_none() {
            pack::read_bf16_bits(self.st, self.row(h, j), self.sd, out);
        } else {
            let mut tmp = vec![0f32; out.len()];
            self.read_row(h, j, &mut tmp);
            simd::f32_to_bf16_bits(&tmp, out);
        }
    }

    /// Row `j` of head `h` converted (and dequantized) into `out` (the row length).
    pub(crate) fn read_row(&self, h: usize, j: usize, out: &mut [f32]) {
        read_f32(self.st, self.row(h, j), self.sd, out);
        if let Some(s) = self.scale {
            simd::scale(out, s[h]);
        }
        if let Some(r) = self.rot {
            r.apply(j, out);
        }
    }

    /// Row `j` of head `h` as f32: borrowed from the storage when it is contiguous f32,
    /// else converted (and dequantized) into `scratch` (whose length is the row length).
    #[inline]
    pub(crate) fn row_f32<'s>(&'s self, h: usize, j: usize, scratch: &'s mut [f32]) -> &'s [f32] {
        let base = self.row(h, j);
        if self.scale.is_none()
            && self.rot.is_none()
            && let Some(r) = pack::f32_row(self.st, base, self.sd, scratch.len())
        {
            return r;
        }
        read_f32(self.st, base, self.sd, scratch);
        if let Some(s) = self.scale {
            simd::scale(scratch, s[h]);
        }
        if let Some(r) = self.rot {
            r.apply(j, scratch);
        }
        scratch
    }
}

/// One sequence: `sq` queries (rows `q0..q0+sq` of batch row `b` of q) against `sk` keys.
#[derive(Debug, Clone)]
pub(crate) struct Seq<'a> {
    /// Batch row of q (and of the mask's batch index, `mask_b`).
    pub b: usize,
    /// First query row.
    pub q0: usize,
    /// Queries.
    pub sq: usize,
    /// Keys.
    pub sk: usize,
    /// Mask batch index.
    pub mask_b: usize,
    /// Mask column of key 0.
    pub mask_k0: usize,
    /// Keys.
    pub k: KvSrc<'a>,
    /// Values.
    pub v: KvSrc<'a>,
}

/// A mask seen as [B, Hq, Sq, Sk] with zero strides on broadcast dims.
#[derive(Debug, Clone)]
pub(crate) struct MaskView<'a> {
    st: &'a Storage,
    off: usize,
    s: [usize; 4],
}

impl<'a> MaskView<'a> {
    /// Checks that `t` (bool or float) broadcasts to `target` and builds the view.
    pub(crate) fn new(t: &'a HostTensor, target: [usize; 4]) -> Result<MaskView<'a>, KernelError> {
        if !(t.dtype() == DType::Bool || t.dtype().is_float()) {
            return Err(invalid(format!(
                "tensor `mask` has dtype {}; a mask is bool (keep) or float (additive)",
                t.dtype()
            )));
        }
        let r = t.rank();
        if r > 4 {
            return Err(invalid(format!(
                "`mask` has rank {r} (shape {:?}); it must broadcast to {target:?}",
                t.shape()
            )));
        }
        let mut s = [0usize; 4];
        for (i, &want) in target.iter().enumerate() {
            if i + r < 4 {
                continue;
            }
            let md = i + r - 4;
            let have = t.shape()[md];
            if have == want {
                s[i] = if have == 1 { 0 } else { t.strides()[md] };
            } else if have != 1 {
                return Err(invalid(format!(
                    "`mask` shape {:?} does not broadcast to [B, Hq, Sq, Sk] = {target:?} (dim {md} is {have}, needs 1 or {want})",
                    t.shape()
                )));
            }
        }
        Ok(MaskView { st: t.storage(), off: t.offset(), s })
    }
}

/// Score modifiers beyond scale and causal/window: soft-cap, ALiBi, mask.
#[derive(Debug, Clone, Default)]
pub(crate) struct Mods<'a> {
    /// Soft-cap.
    pub softcap: Option<f32>,
    /// ALiBi slope per query head.
    pub alibi: Option<Vec<f64>>,
    /// Mask.
    pub mask: Option<MaskView<'a>>,
}

impl Mods<'_> {
    /// True when any modifier is on.
    pub(crate) fn active(&self) -> bool {
        self.softcap.is_some() || self.alibi.is_some() || self.mask.is_some()
    }

    /// Applies the modifiers to the scores `s` of query `i` (head `h`) and keys `j0..`.
    pub(crate) fn apply(&self, seq: &Seq, h: usize, i: usize, j0: usize, s: &mut [f32]) {
        if let Some(c) = self.softcap {
            for x in s.iter_mut() {
                *x = c * (*x / c).tanh();
            }
        }
        if let Some(slopes) = &self.alibi {
            let slope = slopes[h];
            for (t, x) in s.iter_mut().enumerate() {
                *x -= (slope * alibi_distance(i, j0 + t, seq.sq, seq.sk)) as f32;
            }
        }
        if let Some(m) = &self.mask {
            let base = m.off + seq.mask_b * m.s[0] + h * m.s[1] + (seq.q0 + i) * m.s[2] + (seq.mask_k0 + j0) * m.s[3];
            let sj = m.s[3];
            match m.st {
                Storage::Bool(v) => {
                    for (t, x) in s.iter_mut().enumerate() {
                        if !v[base + t * sj] {
                            *x = f32::NEG_INFINITY;
                        }
                    }
                }
                Storage::F32(v) => s.iter_mut().enumerate().for_each(|(t, x)| *x += v[base + t * sj]),
                other => s.iter_mut().enumerate().for_each(|(t, x)| *x += other.get_f32(base + t * sj)),
            }
        }
    }
}

/// An attention problem.
#[derive(Debug)]
pub(crate) struct Problem<'a> {
    /// Queries (canonical BSHD view).
    pub q: Bshd<'a>,
    /// Query heads.
    pub hq: usize,
    /// Kv heads.
    pub hkv: usize,
    /// Head dim of q and k.
    pub d: usize,
    /// Head dim of v.
    pub dv: usize,
    /// Softmax scale.
    pub scale: f32,
    /// Options (causal, window).
    pub attrs: &'a AttentionAttrs,
    /// Score modifiers.
    pub mods: Mods<'a>,
    /// Sequences (inline up to a batch of eight: a decode step allocates none).
    pub seqs: SmallVec<[Seq<'a>; 8]>,
    /// q, k and v hold bf16 values exactly (bf16 storage, no dequantization scale): the
    /// tile products may then run on bf16 pairs (exact products, f32 sums).
    pub bf16: bool,
    /// RoPE fused into attention: query row `i` of a sequence is rotated at position
    /// `i + sk - sq` as it is read (its keys' `rot` rotates them).
    pub rope: Option<&'a Rotary>,
}

impl Problem<'_> {
    /// Query heads per kv head.
    pub(crate) fn group(&self) -> usize {
        self.hq / self.hkv
    }

    /// Visible key range of query `i` of `seq`.
    #[inline]
    pub(crate) fn range(&self, seq: &Seq, i: usize) -> (usize, usize) {
        visible_keys(i, seq.sq, seq.sk, self.attrs)
    }

    /// Reads query (seq, i, h) scaled by the softmax scale into `out` (length d).
    #[inline]
    pub(crate) fn read_q(&self, seq: &Seq, i: usize, h: usize, out: &mut [f32]) {
        self.read_q_unscaled(seq, i, h, out);
        simd::scale(out, self.scale);
    }

    /// Reads query (seq, i, h), rotated when RoPE is fused, into `out` (length d).
    #[inline]
    pub(crate) fn read_q_unscaled(&self, seq: &Seq, i: usize, h: usize, out: &mut [f32]) {
        self.q.read(seq.b, seq.q0 + i, h, out);
        if let Some(r) = self.rope {
            r.apply(i + seq.sk - seq.sq, out);
        }
    }
}

/// Where a unit of work writes its output: row `r` (ordered [head][position] within the
/// unit) as f32 values, converted to the output dtype.
pub(crate) type Sink<'s> = Box<dyn FnMut(usize, &[f32]) + Send + 's>;

/// One unit's output: query heads `h0..h0+nh`, positions `i0..i0+n` of sequence `seq`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unit {
    /// Sequence index.
    pub seq: usize,
    /// First query head.
    pub h0: usize,
    /// Query heads.
    pub nh: usize,
    /// First position (within the sequence).
    pub i0: usize,
    /// Positions.
    pub n: usize,
}

/// Writes the output of `p` into `out` (canonical size `n` = [b, sq, hq, dv], contiguous in
/// `layout`, zeros on entry) through `put`, each row once by the unit that computes it; rows
/// that belong to no sequence stay zeros. Decode sequences (few queries) allocate nothing.
pub(crate) fn run_into<T: Send>(p: &Problem, n: [usize; 4], layout: Layout, out: &mut [T], put: fn(&mut [T], &[f32])) {
    let dv = p.dv;
    if dv == 0 {
        return;
    }
    let (dec, pre): (SmallVec<[usize; 8]>, SmallVec<[usize; 8]>) =
        (0..p.seqs.len()).filter(|&i| p.seqs[i].sq > 0).partition(|&i| p.seqs[i].sq <= DECODE_MAX_SQ);
    decode::run(p, &dec, n, layout, out, put);
    if pre.is_empty() {
        return;
    }
    let mut slots: Vec<Option<&mut [T]>> = out.chunks_mut(dv).map(Some).collect();
    let mut sink = |u: &Unit| -> Sink<'_> {
        let seq = &p.seqs[u.seq];
        let mut rows = Vec::with_capacity(u.nh * u.n);
        for hh in 0..u.nh {
            for t in 0..u.n {
                let r = out_index(n, layout, seq.b, seq.q0 + u.i0 + t, u.h0 + hh) / dv;
                rows.push(slots.get_mut(r).and_then(Option::take));
            }
        }
        Box::new(move |r: usize, src: &[f32]| {
            if let Some(Some(d)) = rows.get_mut(r) {
                put(d, src);
            }
        })
    };
    let pre_units = prefill_units(p, &pre);
    let pre_sinks: Vec<Sink> = pre_units.iter().map(|u| sink(&u.0)).collect();
    prefill(p, &pre, &pre_units, pre_sinks);
}

/// Converters from the engine's f32 rows to each output dtype.
pub(crate) mod put {
    use half::slice::HalfFloatSliceExt;
    use half::{bf16, f16};

    use super::simd;

    /// f32.
    pub(crate) fn f32(d: &mut [f32], s: &[f32]) {
        d.copy_from_slice(s);
    }
    /// f16 (round to nearest even).
    pub(crate) fn f16(d: &mut [f16], s: &[f32]) {
        d.convert_from_f32_slice(s);
    }
    /// bf16 (round to nearest even).
    pub(crate) fn bf16(d: &mut [bf16], s: &[f32]) {
        simd::f32_to_bf16(s, d);
    }
}

/// The output of `p` (canonical size `n`, contiguous in `layout`, `dtype`), written into the
/// caller's buffer `out` when it can hold it.
pub(crate) fn output_into(
    p: &Problem,
    n: [usize; 4],
    layout: Layout,
    dtype: DType,
    bufs: &mut Outputs,
) -> Result<Outputs, KernelError> {
    let [b, s, h, d] = n;
    let shape = if layout == Layout::Bhsd { [b, h, s, d] } else { [b, s, h, d] };
    let len = n.iter().product();
    let t = match dtype {
        DType::F32 => {
            let mut o = Out::<f32>::take(bufs, "out", len);
            run_into(p, n, layout, &mut o.v, put::f32);
            o.finish(&shape)?
        }
        DType::BF16 => {
            let mut o = Out::<bf16>::take(bufs, "out", len);
            run_into(p, n, layout, &mut o.v, put::bf16);
            o.finish(&shape)?
        }
        DType::F16 => {
            let mut o = Out::<f16>::take(bufs, "out", len);
            run_into(p, n, layout, &mut o.v, put::f16);
            o.finish(&shape)?
        }
        other => {
            let mut v = vec![0f32; len];
            run_into(p, n, layout, &mut v, put::f32);
            HostTensor::new(Storage::from_f32(other, &v), &shape)
                .map_err(|e| KernelError::Failed(format!("building the output: {e}")))?
        }
    };
    Ok(Outputs::from([("out", t.with_layout(layout))]))
}

/// K of one (sequence, kv head) transposed into tiles of panels `[tile][BK/64][d][64]`
/// and V into `[tile][ceil(dv/64)][BK][64]` (the B operands of the two tile products),
/// zero-padded to whole tiles. The bf16-pair form (AMX tiles or `vdpbf16ps`) holds pairs along the product's inner
/// dim in 16-column panels: K `[tile][BK/16][d2][16]` (d2 = d rounded up to 32, halved), V
/// `[tile][ceil(dv/16)][BK/2][16]` (u32 = low, high).
enum Packed {
    F32 { kt: Vec<f32>, v: Vec<f32> },
    Bf16 { kt: Aligned<u32>, v: Aligned<u32> },
}

fn pack_kv(seq: &Seq, kvh: usize, d: usize, dv: usize) -> Packed {
    const P: usize = simd::PANEL;
    let nt = seq.sk.div_ceil(BK);
    let nvb = dv.div_ceil(P);
    let mut kt = vec![0f32; nt * d * BK];
    let mut v = vec![0f32; nt * nvb * BK * P];
    const G: usize = 16;
    let mut buf = vec![0f32; G * d];
    let mut j0 = 0;
    while j0 < seq.sk {
        let g = G.min(seq.sk - j0);
        for c in 0..g {
            seq.k.read_row(kvh, j0 + c, &mut buf[c * d..(c + 1) * d]);
        }
        let (tile, col) = (j0 / BK, j0 % BK);
        let panel = &mut kt[(tile * (BK / P) + col / P) * d * P..][..d * P];
        for dd in 0..d {
            let dst = &mut panel[dd * P + col % P..dd * P + col % P + g];
            for (c, x) in dst.iter_mut().enumerate() {
                *x = buf[c * d + dd];
            }
        }
        j0 += g;
    }
    let mut row = vec![0f32; dv];
    for j in 0..seq.sk {
        seq.v.read_row(kvh, j, &mut row);
        let (tile, c) = (j / BK, j % BK);
        for (vb, part) in row.chunks(P).enumerate() {
            v[((tile * nvb + vb) * BK + c) * P..][..part.len()].copy_from_slice(part);
        }
    }
    Packed::F32 { kt, v }
}

/// Rows of the AMX operands are padded to multiples of 16 pairs (32 bf16).
const AMX_K: usize = 32;

fn pack_kv_bf16(seq: &Seq, kvh: usize, d: usize, dv: usize) -> Packed {
    const P: usize = simd::AMX_PANEL;
    let (nt, nvb, d2) = (seq.sk.div_ceil(BK_AMX), dv.div_ceil(P), d.div_ceil(AMX_K) * AMX_K / 2);
    // Tile operands start on cache lines (split-line tile rows load 3x slower).
    let mut kt = Aligned::zeroed(nt * d2 * BK_AMX);
    let mut v = Aligned::zeroed(nt * nvb * (BK_AMX / 2) * P);
    const G: usize = 16;
    let w = 2 * d2;
    let mut buf = vec![0u16; G * w];
    let mut j0 = 0;
    while j0 < seq.sk {
        let g = G.min(seq.sk - j0);
        for c in 0..g {
            seq.k.read_row_bf16(kvh, j0 + c, &mut buf[c * w..c * w + d]);
        }
        let (tile, col) = (j0 / BK_AMX, j0 % BK_AMX);
        let panel = &mut kt[(tile * (BK_AMX / P) + col / P) * d2 * P..][..d2 * P];
        for pr in 0..d2 {
            let dst = &mut panel[pr * P + col % P..pr * P + col % P + g];
            for (c, x) in dst.iter_mut().enumerate() {
                let (lo, hi) = (buf[c * w + 2 * pr], buf[c * w + 2 * pr + 1]);
                *x = u32::from(lo) | (u32::from(hi) << 16);
            }
        }
        j0 += g;
    }
    let (mut r0, mut r1) = (vec![0u16; dv], vec![0u16; dv]);
    let mut j = 0;
    while j < seq.sk {
        seq.v.read_row_bf16(kvh, j, &mut r0);
        if j + 1 < seq.sk {
            seq.v.read_row_bf16(kvh, j + 1, &mut r1);
        } else {
            r1.fill(0);
        }
        let (tile, c) = (j / BK_AMX, j % BK_AMX);
        for vb in 0..nvb {
            let e0 = vb * P;
            let w = P.min(dv - e0);
            let dst = &mut v[((tile * nvb + vb) * (BK_AMX / 2) + c / 2) * P..][..w];
            for (x, (&lo, &hi)) in dst.iter_mut().zip(r0[e0..e0 + w].iter().zip(&r1[e0..e0 + w])) {
                *x = u32::from(lo) | (u32::from(hi) << 16);
            }
        }
        j += 2;
    }
    Packed::Bf16 { kt, v }
}

/// Query positions per tile for `g` heads per kv head: about 64 rows in all, a multiple of
/// the microkernel height (6) where possible; for the AMX path about 128 rows, a multiple of
/// the tile height (16) where possible.
fn q_tile(g: usize, amx: bool) -> usize {
    let (rows, mult) = if amx { (128usize, 16) } else { (64, 6) };
    let first = rows.div_ceil(g).max(1);
    (first..first + mult).find(|bq| (g * bq).is_multiple_of(mult)).unwrap_or(first)
}

/// The prefill units (one per sequence, kv head and query tile) with their kv head.
fn prefill_units(p: &Problem, seqs: &[usize]) -> Vec<(Unit, usize)> {
    let (g, bq) = (p.group(), q_tile(p.group(), p.bf16 && simd::bf16_panels()));
    let mut units = Vec::new();
    for &si in seqs {
        for kvh in 0..p.hkv {
            for i0 in (0..p.seqs[si].sq).step_by(bq) {
                let n = bq.min(p.seqs[si].sq - i0);
                units.push((Unit { seq: si, h0: kvh * g, nh: g, i0, n }, kvh));
            }
        }
    }
    units
}

fn prefill(p: &Problem, seqs: &[usize], units: &[(Unit, usize)], sinks: Vec<Sink>) {
    if seqs.is_empty() {
        return;
    }
    let (hkv, d, dv) = (p.hkv, p.d, p.dv);
    let bf16 = p.bf16 && simd::bf16_panels();
    let packed: Vec<Packed> = (0..seqs.len() * hkv)
        .into_par_iter()
        .map(|x| {
            let seq = &p.seqs[seqs[x / hkv]];
            if bf16 { pack_kv_bf16(seq, x % hkv, d, dv) } else { pack_kv(seq, x % hkv, d, dv) }
        })
        .collect();
    let mut index = vec![usize::MAX; p.seqs.len()];
    for (pi, &si) in seqs.iter().enumerate() {
        index[si] = pi;
    }
    units.par_iter().zip(sinks).for_each_init(Scratch::default, |scratch, (&(u, kvh), mut sink)| {
        prefill_item(p, &u, &packed[index[u.seq] * hkv + kvh], kvh, &mut sink, scratch);
    });
}

/// Buffers of [`prefill_item`], reused across the items a worker runs (no zeroing needed
/// except where noted there).
#[derive(Default)]
struct Scratch {
    qp: Vec<f32>,
    qb: Aligned<u16>,
    o: Aligned<f32>,
    s: Aligned<f32>,
    pb: Aligned<u16>,
    local: Vec<(usize, usize)>,
    mrow: Vec<f32>,
    lrow: Vec<f32>,
}

/// `v` with at least `n` elements (old contents kept: the caller overwrites what it reads).
fn grow<T: Copy + Default>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

/// `v` as `n` copies of `x`.
fn filled<T: Copy>(v: &mut Vec<T>, n: usize, x: T) -> &mut [T] {
    v.clear();
    v.resize(n, x);
    v
}

/// [`grow`] for the cache-line-aligned AMX operands (a new buffer, when it grows, is zeros).
fn grow_aligned<T: Copy + Default>(v: &mut Aligned<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.set_len(n);
    }
    &mut v[..n]
}

/// One tile of queries (all heads of kv head `kvh`, positions `i0..i0+n`) against every
/// visible key tile, with online softmax.
fn prefill_item(p: &Problem, u: &Unit, pk: &Packed, kvh: usize, sink: &mut Sink, scratch: &mut Scratch) {
    const P: usize = simd::PANEL;
    let (seq, i0, n) = (&p.seqs[u.seq], u.i0, u.n);
    let (d, dv, g) = (p.d, p.dv, p.group());
    let m = g * n;
    let pairs = matches!(pk, Packed::Bf16 { .. });
    let bk = if pairs { BK_AMX } else { BK };
    // The AMX form pads rows to 16, the head dims to 32 (q . k) and 16 (p . v). Padding rows
    // of the A operands may hold stale values: they only reach padding rows of the results.
    let (mp, dq, ldo) =
        if pairs { (m.div_ceil(16) * 16, d.div_ceil(AMX_K) * AMX_K, dv.div_ceil(16) * 16) } else { (m, d, dv) };
    // Queries: f32 pre-scaled, or bf16 bits (scaled after the product).
    let Scratch { qp, qb, o, s, pb, local, mrow, lrow } = scratch;
    let (qp, qb) = if pairs {
        let qb = grow_aligned(qb, mp * dq);
        let mut rotated = vec![0f32; if p.rope.is_some() { d } else { 0 }];
        for (r, row) in qb.chunks_exact_mut(dq.max(1)).enumerate().take(m) {
            let (i, h) = (i0 + r % n, kvh * g + r / n);
            if p.rope.is_some() {
                // Rotated in f32, rounded to bf16 once: what the unfused chain hands attention.
                p.read_q_unscaled(seq, i, h, &mut rotated);
                simd::f32_to_bf16_bits(&rotated, &mut row[..d]);
            } else {
                let base = p.q.row(seq.b, seq.q0 + i, h);
                pack::read_bf16_bits(p.q.st, base, p.q.s[3], &mut row[..d]);
            }
            row[d..].fill(0);
        }
        (&mut [][..], qb)
    } else {
        let qp = grow(qp, m * d);
        for (r, row) in qp.chunks_exact_mut(d.max(1)).enumerate().take(m) {
            p.read_q(seq, i0 + r % n, kvh * g + r / n, row);
        }
        (qp, &mut [][..])
    };
    let (qp, qb): (&[f32], &[u16]) = (qp, qb);
    let ranges: Vec<(usize, usize)> = (0..n).map(|t| p.range(seq, i0 + t)).collect();
    let (jmin, jmax) = ranges.iter().filter(|r| r.0 < r.1).fold((usize::MAX, 0), |(a, b), r| (a.min(r.0), b.max(r.1)));
    let o = grow_aligned(o, mp * ldo);
    o.fill(0.0);
    let mrow = filled(mrow, m, f32::NEG_INFINITY);
    let lrow = filled(lrow, m, 0f32);
    if jmin < jmax {
        let s = grow_aligned(s, mp * bk);
        let pb = if pairs { grow_aligned(pb, mp * bk) } else { &mut [][..] };
        let local = filled(local, m, (0usize, 0usize));
        let nvb = dv.div_ceil(P);
        for tile in jmin / bk..jmax.div_ceil(bk) {
            let tj0 = tile * bk;
            // Columns c0..c1 of the tile, c0 on a panel boundary.
            let c0 = (jmin.max(tj0) - tj0) / P * P;
            let c1 = jmax.min(tj0 + bk) - tj0;
            match pk {
                Packed::F32 { kt, .. } => {
                    let kt = &kt[(tile * bk + c0) * d..(tile + 1) * bk * d];
                    simd::gemm_panels(m, c1 - c0, d, qp, d, kt, d * P, &mut s[c0..], bk, false);
                }
                Packed::Bf16 { kt, .. } => {
                    let d2 = dq / 2;
                    let kt = &kt[(tile * bk + c0) * d2..(tile + 1) * bk * d2];
                    let nc = (c1 - c0).div_ceil(16) * 16;
                    simd::gemm_bf16_panels(mp, nc, d2, qb, dq, kt, d2 * simd::AMX_PANEL, &mut s[c0..], bk, false);
                    if p.mods.active() {
                        for r in 0..m {
                            simd::scale(&mut s[r * bk + c0..r * bk + c1], p.scale);
                        }
                    }
                }
            }
            for (r, lr) in local.iter_mut().enumerate() {
                let (lo, hi) = ranges[r % n];
                let a = lo.clamp(tj0 + c0, tj0 + c1) - tj0;
                let b = hi.clamp(tj0 + c0, tj0 + c1) - tj0;
                *lr = (a - c0, b.max(a) - c0);
                if a < b && p.mods.active() {
                    let seg = &mut s[r * bk + a..r * bk + b];
                    p.mods.apply(seq, kvh * g + r / n, i0 + r % n, tj0 + a, seg);
                }
            }
            // The bf16 scores are unscaled; with modifiers they were scaled above.
            let scale = if pairs && !p.mods.active() { p.scale } else { 1.0 };
            let rows = simd::SoftmaxRows { ranges: local, m: mrow, l: lrow, scale };
            match pk {
                Packed::F32 { v, .. } => {
                    simd::softmax_tile(&mut s[c0..], bk, c1 - c0, rows, o, ldo, dv);
                    let vt = &v[(tile * nvb * bk + c0) * P..];
                    simd::gemm_panels(m, dv, c1 - c0, &s[c0..], bk, vt, bk * P, o, dv, true);
                }
                Packed::Bf16 { v, .. } => {
                    // P as bf16, zero-padded to a multiple of 32 keys (within the tile).
                    let kw = (c1 - c0).div_ceil(AMX_K) * AMX_K;
                    simd::softmax_tile_bf16(&s[c0..], bk, c1 - c0, rows, o, ldo, dv, &mut pb[c0..], bk, kw);
                    const AP: usize = simd::AMX_PANEL;
                    let vt = &v[(tile * dv.div_ceil(AP) * (bk / 2) + c0 / 2) * AP..];
                    simd::gemm_bf16_panels(mp, ldo, kw / 2, &pb[c0..], bk, vt, (bk / 2) * AP, o, ldo, true);
                }
            }
        }
    }
    for r in 0..m {
        let row = &mut o[r * ldo..r * ldo + dv];
        if lrow[r] > 0.0 {
            simd::scale(row, 1.0 / lrow[r]);
        } else {
            row.fill(0.0);
        }
        sink(r, row);
    }
}
