//! Prefill GEMM of a bf16 model on bf16 pairs (`vdpbf16ps`, AVX512_BF16 without AMX): the
//! weight is packed once into pair panels (`[panel of 32 columns][K/2][32]`, each u32 two
//! consecutive K elements of one column) and kept in a bounded cache keyed by the weight's
//! identity, so a model's projections are packed on their first prefill and never again;
//! x is packed per call into 12-row pair panels; the 12 x 32 register tile sums each pair
//! of products exactly in f32.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use half::slice::HalfFloatSliceExt;
use parking_lot::Mutex;
use rayon::prelude::*;

use super::view::Mat;
use crate::simd::{self, PAIR_MR as MR, PAIR_NR as NR};
use layerzero_core::tensor::{HostTensor, Storage};

/// A weight `[N, K]` packed as pair panels.
#[derive(Debug)]
pub(crate) struct PairPanels {
    n: usize,
    k2: usize,
    data: Vec<u32>,
}

impl PairPanels {
    fn bytes(&self) -> usize {
        self.data.len() * 4
    }
}

/// Packed weights kept at most (bytes); past it, weights are packed per call.
const CACHE_BYTES: usize = 16 << 30;

/// The identity of a weight view: its storage's address and the view's geometry.
type Key = (usize, usize, usize, usize, usize, usize);

struct Entry {
    /// Alive while the weight is: an address is never reused while a `Weak` to it exists.
    owner: Weak<Storage>,
    panels: Arc<PairPanels>,
}

#[derive(Default)]
struct Cache {
    map: HashMap<Key, Entry>,
    bytes: usize,
}

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(|| Mutex::new(Cache::default()));
static HITS: AtomicU64 = AtomicU64::new(0);
static PACKS: AtomicU64 = AtomicU64::new(0);

/// What the packed-weight cache has done in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PackedWeightStats {
    /// Calls that found their weight packed.
    pub hits: u64,
    /// Weights packed (each once while it stays cached).
    pub packs: u64,
    /// Bytes of packed weights held now.
    pub bytes: u64,
    /// Weights held now.
    pub entries: u64,
}

/// The packed-weight cache's counters.
pub fn packed_weight_stats() -> PackedWeightStats {
    let c = CACHE.lock();
    PackedWeightStats {
        hits: HITS.load(Ordering::Relaxed),
        packs: PACKS.load(Ordering::Relaxed),
        bytes: c.bytes as u64,
        entries: c.map.len() as u64,
    }
}

/// The pair panels of `wt` (`[N, K]` rows of the bf16 weight tensor `w`, read in place):
/// from the cache when this weight was packed before, else packed now (and kept while the
/// cache has room). `None` when `wt` is not bf16 with contiguous rows.
pub(crate) fn panels(w: &HostTensor, wt: &Mat) -> Option<Arc<PairPanels>> {
    let Storage::BF16(v) = wt.st else { return None };
    if !(wt.cs == 1 || wt.cols <= 1) {
        return None;
    }
    let key = (Arc::as_ptr(w.storage_arc()) as usize, wt.off, wt.rows, wt.cols, wt.rs, wt.cs);
    {
        let c = CACHE.lock();
        if let Some(e) = c.map.get(&key)
            && e.owner.strong_count() > 0
        {
            HITS.fetch_add(1, Ordering::Relaxed);
            return Some(Arc::clone(&e.panels));
        }
    }
    let panels = Arc::new(pack(v.reinterpret_cast(), wt)?);
    PACKS.fetch_add(1, Ordering::Relaxed);
    let mut c = CACHE.lock();
    // Weights dropped since: their entries go.
    let mut freed = 0;
    c.map.retain(|_, e| {
        let alive = e.owner.strong_count() > 0;
        if !alive {
            freed += e.panels.bytes();
        }
        alive
    });
    c.bytes -= freed;
    if c.bytes + panels.bytes() <= CACHE_BYTES {
        c.bytes += panels.bytes();
        let old = c.map.insert(key, Entry { owner: Arc::downgrade(w.storage_arc()), panels: Arc::clone(&panels) });
        if let Some(old) = old {
            c.bytes -= old.panels.bytes();
        }
    }
    Some(panels)
}

fn pack(v: &[u16], wt: &Mat) -> Option<PairPanels> {
    let (n, k) = (wt.rows, wt.cols);
    let k2 = k.div_ceil(2);
    // Streamed on every prefill: huge pages keep its TLB misses few.
    let mut data = crate::alloc::huge(vec![0u32; n.div_ceil(NR) * k2 * NR]);
    // Rows lie at increasing offsets: the first and the last bound them all.
    let fits = |r: usize| v.get(wt.at(r, 0)..wt.at(r, 0) + k).is_some();
    if n > 0 && !(fits(0) && fits(n - 1)) {
        return None;
    }
    data.par_chunks_mut(k2 * NR).enumerate().for_each(|(q, panel)| {
        for j in 0..NR.min(n - q * NR) {
            let at = wt.at(q * NR + j, 0);
            let row = &v[at..at + k];
            for (p, pair) in row.chunks(2).enumerate() {
                let hi = pair.get(1).copied().unwrap_or(0);
                panel[p * NR + j] = u32::from(pair[0]) | (u32::from(hi) << 16);
            }
        }
    });
    Some(PairPanels { n, k2, data })
}

/// `c [M, N] = x . W^T` for `m` bf16 rows of K of `x` (row stride `ldx`) and the packed `w`
/// (`c` contiguous).
pub(crate) fn gemm(x: &[u16], ldx: usize, m: usize, k: usize, w: &PairPanels, c: &mut [f32]) {
    let (n, k2) = (w.n, w.k2);
    if m == 0 || n == 0 {
        return;
    }
    if k2 == 0 {
        c[..m * n].fill(0.0);
        return;
    }
    let tiles = m.div_ceil(MR);
    let mut ap = vec![0u32; tiles * k2 * MR];
    ap.par_chunks_mut(k2 * MR).enumerate().for_each(|(t, tile)| {
        for i in 0..MR.min(m - t * MR) {
            let row = &x[(t * MR + i) * ldx..(t * MR + i) * ldx + k];
            for (p, pair) in row.chunks(2).enumerate() {
                let hi = pair.get(1).copied().unwrap_or(0);
                tile[p * MR + i] = u32::from(pair[0]) | (u32::from(hi) << 16);
            }
        }
    });
    let ap: &[u32] = &ap;
    // Tasks of whole column panels (about four per thread).
    let panels = n.div_ceil(NR);
    let per = panels.div_ceil(4 * rayon::current_num_threads().max(1)).max(1);
    let per_n = per * NR;
    let mut tasks: Vec<Vec<&mut [f32]>> = (0..n.div_ceil(per_n)).map(|_| Vec::with_capacity(m)).collect();
    for row in c[..m * n].chunks_mut(n) {
        for (s, seg) in row.chunks_mut(per_n).enumerate() {
            tasks[s].push(seg);
        }
    }
    tasks.into_par_iter().enumerate().for_each(|(t, mut rows)| {
        for q in 0..per {
            let jp = t * per + q;
            if jp >= panels {
                break;
            }
            let b = &w.data[jp * k2 * NR..(jp + 1) * k2 * NR];
            let nr = NR.min(n - jp * NR);
            for ti in 0..tiles {
                let r1 = ((ti + 1) * MR).min(m);
                simd::gemm_tile_bf16_pairs(k2, &ap[ti * k2 * MR..], b, &mut rows[ti * MR..r1], q * NR, nr);
            }
        }
    });
}
