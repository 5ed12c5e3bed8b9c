//! A decoder's KV cache, preallocated per layer and written in place: one contiguous buffer
//! for one sequence, or a pool of pages addressed by a block table per sequence, so that
//! several sequences decode together. Attention reads the first `len` positions of each.

use smallvec::SmallVec;

use super::config::ModelConfig;
use super::nn::view;
use super::refill::{refill_i32, refill_i64};
use layerzero::error::{Error, Result};
use layerzero::exec::args::{AttentionArgs, OpArgs, PagedAttentionArgs};
use layerzero::model::attrs::AttentionAttrs;
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::tensor::HostTensor;

/// How keys and values are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvKind {
    /// One contiguous `[1, capacity, kv_heads, head_dim]` buffer per layer: one sequence.
    #[default]
    Contiguous,
    /// A pool of `[pages, page_size, kv_heads, head_dim]` pages per layer addressed by a
    /// block table per sequence: several sequences decode together.
    Paged {
        /// Positions per page.
        page_size: usize,
    },
}

/// Per layer, keys and values; per sequence, its pages (paged), length and capacity.
pub(crate) struct KvCache {
    kind: KvKind,
    /// Key/value heads and their size.
    heads: usize,
    dim: usize,
    k: Vec<HostTensor>,
    v: Vec<HostTensor>,
    pages: Vec<Vec<u32>>,
    lens: Vec<usize>,
    capacity: Vec<usize>,
    /// A step's positions, block table and context lengths, rewritten in place.
    positions: Option<HostTensor>,
    table: Option<HostTensor>,
    context: Option<HostTensor>,
}

/// One forward call's place in the cache: which sequences, where each one's new positions
/// start, how many there are, and what RoPE and attention read of it.
pub(crate) struct Step {
    /// Per sequence of the batch: its index in the cache and its first new position.
    seqs: SmallVec<[(usize, usize); 8]>,
    /// New positions per sequence.
    pub(crate) len: usize,
    /// Every new position `[sequences, len]`.
    pub(crate) positions: HostTensor,
    /// Paged: the block table `[sequences, pages]` and the context lengths `[sequences]`.
    paged: Option<(HostTensor, HostTensor)>,
}

impl Step {
    /// Rows of the batch: sequences times new positions.
    pub(crate) fn rows(&self) -> usize {
        self.seqs.len() * self.len
    }

    /// Sequences in the batch.
    pub(crate) fn sequences(&self) -> usize {
        self.seqs.len()
    }
}

impl KvCache {
    /// A cache of `capacities.len()` sequences, each with room for its capacity, of `kind`
    /// (a contiguous cache holds one sequence).
    pub(crate) fn new(c: &ModelConfig, dtype: DType, capacities: &[usize], kind: KvKind) -> Result<KvCache> {
        if capacities.is_empty() || capacities.contains(&0) {
            return Err(Error::invalid("every sequence needs room for at least one position".to_owned()));
        }
        let (shape, pages) = match kind {
            KvKind::Contiguous if capacities.len() == 1 => {
                ([1, capacities[0], c.kv_heads, c.head_dim], vec![Vec::new()])
            }
            KvKind::Contiguous => {
                return Err(Error::invalid(format!(
                    "a contiguous KV cache holds one sequence; {} need a paged cache (--kv paged)",
                    capacities.len()
                )));
            }
            KvKind::Paged { page_size: 0 } => return Err(Error::invalid("--page-size must be at least 1".to_owned())),
            KvKind::Paged { page_size } => {
                let mut next = 0u32;
                let pages: Vec<Vec<u32>> = capacities
                    .iter()
                    .map(|&cap| {
                        let n = cap.div_ceil(page_size) as u32;
                        next += n;
                        // Pages are handed out back to front so that a sequence's pages are
                        // not in order: the block table, not the layout, decides.
                        (next - n..next).rev().collect()
                    })
                    .collect();
                ([next as usize, page_size, c.kv_heads, c.head_dim], pages)
            }
        };
        let layout = if matches!(kind, KvKind::Paged { .. }) { Layout::Nhd } else { Layout::Bshd };
        let cache = || -> Result<Vec<HostTensor>> {
            (0..c.layers).map(|_| HostTensor::zeros(dtype, &shape).map(|t| t.with_layout(layout))).collect()
        };
        Ok(KvCache {
            kind,
            heads: c.kv_heads,
            dim: c.head_dim,
            k: cache()?,
            v: cache()?,
            pages,
            lens: vec![0; capacities.len()],
            capacity: capacities.to_vec(),
            positions: None,
            table: None,
            context: None,
        })
    }

    /// Positions cached for sequence `seq`, and its room (`None`: no such sequence).
    pub(crate) fn room(&self, seq: usize) -> Option<(usize, usize)> {
        Some((*self.lens.get(seq)?, *self.capacity.get(seq)?))
    }

    /// Forgets sequence `seq`'s positions from `len` on: the next step writes over them.
    pub(crate) fn truncate(&mut self, seq: usize, len: usize) -> Result<()> {
        match self.lens.get_mut(seq) {
            Some(n) if len <= *n => {
                *n = len;
                Ok(())
            }
            Some(n) => Err(Error::invalid(format!("sequence {seq} caches {n} positions; it cannot grow to {len}"))),
            None => Err(Error::invalid(format!("sequence {seq} is not in this session"))),
        }
    }

    /// The step that appends `len` positions to each of `seqs` (checked by the caller).
    pub(crate) fn step(&mut self, seqs: impl Iterator<Item = usize>, len: usize) -> Result<Step> {
        let seqs: SmallVec<[(usize, usize); 8]> = seqs.map(|seq| (seq, self.lens[seq])).collect();
        let pos = seqs.iter().flat_map(|&(_, start)| (start..start + len).map(|p| p as i64));
        let positions = refill_i64(&mut self.positions, pos, &[seqs.len(), len])?;
        let paged = match self.kind {
            KvKind::Contiguous => None,
            KvKind::Paged { .. } => {
                let width = seqs.iter().map(|&(seq, _)| self.pages[seq].len()).max().unwrap_or(0);
                let pages = &self.pages;
                let entries = seqs.iter().flat_map(|&(seq, _)| {
                    let p = &pages[seq];
                    (0..width).map(move |i| p.get(i).map_or(0, |&page| page as i32))
                });
                let table = refill_i32(&mut self.table, entries, &[seqs.len(), width])?;
                let lens = seqs.iter().map(|&(_, start)| (start + len) as i32);
                Some((table, refill_i32(&mut self.context, lens, &[seqs.len()])?))
            }
        };
        Ok(Step { seqs, len, positions, paged })
    }

    /// Counts `step`'s positions as cached.
    pub(crate) fn commit(&mut self, step: Step) {
        for (seq, _) in step.seqs {
            self.lens[seq] += step.len;
        }
    }

    /// Writes `step`'s keys `k` (`[b, s, kv_heads, d]`) and values `v` (`[b * s, kvd]`) into
    /// layer `l`.
    pub(crate) fn write(&mut self, l: usize, step: &Step, k: &HostTensor, v: &HostTensor) -> Result<()> {
        let kvd = self.heads * self.dim;
        match self.kind {
            KvKind::Contiguous => {
                let start = step.seqs[0].1;
                self.k[l].write_at(start * kvd, k)?;
                self.v[l].write_at(start * kvd, v)
            }
            KvKind::Paged { page_size } => {
                let k = k.contiguous();
                for (i, &(seq, start)) in step.seqs.iter().enumerate() {
                    for t in 0..step.len {
                        let pos = start + t;
                        let page = self.pages[seq][pos / page_size] as usize;
                        let at = (page * page_size + pos % page_size) * kvd;
                        let row = (i * step.len + t) * kvd;
                        self.k[l].write_at(at, &view(&k, &[kvd], row)?)?;
                        self.v[l].write_at(at, &view(v, &[kvd], row)?)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Attention of `q` (`[b, s, heads, d]`) over each sequence's cached positions in layer
    /// `l`, `step`'s included.
    pub(crate) fn attention(&self, l: usize, step: &Step, q: HostTensor, attrs: AttentionAttrs) -> Result<OpArgs> {
        let q = q.with_layout(Layout::Bshd);
        Ok(match &step.paged {
            None => {
                let ctx = step.seqs[0].1 + step.len;
                let shape = [1, ctx, self.heads, self.dim];
                let kv = |t: &HostTensor| Ok::<_, Error>(view(t, &shape, 0)?.with_layout(Layout::Bshd));
                OpArgs::Attention(AttentionArgs {
                    q,
                    k: kv(&self.k[l])?,
                    v: kv(&self.v[l])?,
                    mask: None,
                    cu_seqlens_q: None,
                    cu_seqlens_k: None,
                    attrs,
                })
            }
            Some((block_table, context_lens)) => OpArgs::PagedAttention(PagedAttentionArgs {
                q,
                k_cache: self.k[l].clone(),
                v_cache: self.v[l].clone(),
                block_table: block_table.clone(),
                context_lens: context_lens.clone(),
                k_scale: None,
                v_scale: None,
                attrs,
            }),
        })
    }
}
