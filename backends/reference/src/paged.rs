//! Paged attention, the oracle: each sequence's keys are gathered through its block table
//! and attended exactly as dense attention over those `context_len` keys would be.
//!
//! Decisions: every block-table entry is checked (padding entries too: the table must
//! address the cache, as `PagedAttentionArgs` says); a `context_len` shorter than Sq is
//! valid and, under bottom-right causal masking, its first rows see no key and are zeros.
//! With causal masking the queries are aligned by `attrs.causal_alignment` against the
//! `context_len` keys (bottom-right: the queries are the last Sq positions).

use super::attention::{score, softmax_weighted_sum};
use super::{Heads, from_f64_as, index_values, zeros_for};
use layerzero_core::exec::args::PagedAttentionArgs;
use layerzero_core::exec::check::{expect_float, expect_rank, invalid};
use layerzero_core::exec::executor::KernelError;
use layerzero_core::exec::semantics::{alibi_slopes, softmax_scale, visible_keys};
use layerzero_core::model::layout::Layout;
use layerzero_core::tensor::HostTensor;

/// A paged cache read as `[page, slot, head, d]` whatever its layout (NHD or HND) and
/// strides, with its dequantization scale applied.
struct Cache<'a> {
    t: &'a HostTensor,
    hnd: bool,
    pages: usize,
    page_size: usize,
    heads: usize,
    d: usize,
    /// One scale per kv head.
    scale: Vec<f64>,
}

impl<'a> Cache<'a> {
    fn new(
        name: &str,
        t: &'a HostTensor,
        scale: Option<&HostTensor>,
        scale_name: &str,
    ) -> Result<Cache<'a>, KernelError> {
        expect_float(name, t)?;
        let hnd = match t.layout() {
            Some(Layout::Nhd) => false,
            Some(Layout::Hnd) => true,
            Some(other) => return Err(invalid(format!("tensor `{name}` has layout {other}; expected NHD or HND"))),
            None => return Err(invalid(format!("tensor `{name}` needs a layout tag (NHD or HND)"))),
        };
        expect_rank(name, t, 4, "rank 4 (NHD or HND)")?;
        let s = t.shape();
        let (pages, page_size, heads, d) = if hnd { (s[0], s[2], s[1], s[3]) } else { (s[0], s[1], s[2], s[3]) };
        let scale = match scale {
            None => vec![1.0; heads],
            Some(st) => {
                expect_float(scale_name, st)?;
                let values = st.to_f64_vec();
                if values.len() == 1 {
                    vec![values[0]; heads]
                } else if st.rank() == 1 && values.len() == heads {
                    values
                } else {
                    return Err(invalid(format!(
                        "tensor `{scale_name}` has shape {:?}; expected [1] (per tensor) or [{heads}] (per kv head)",
                        st.shape()
                    )));
                }
            }
        };
        Ok(Cache { t, hnd, pages, page_size, heads, d, scale })
    }

    /// The dequantized element at `[page, slot, head, d]`.
    #[inline]
    fn at(&self, page: usize, slot: usize, h: usize, d: usize) -> f64 {
        let raw = if self.hnd { self.t.at(&[page, h, slot, d]) } else { self.t.at(&[page, slot, h, d]) };
        raw * self.scale[h]
    }
}

/// Paged attention (see `PagedAttentionArgs`): output [B, Sq, Hq, Dv] BSHD in q's dtype.
pub fn paged_attention(args: &PagedAttentionArgs) -> Result<HostTensor, KernelError> {
    let a = &args.attrs;
    a.check()?;
    if a.rope.is_some() {
        // The oracle of fused RoPE is the chain: `rope`, then this kernel.
        return Err(KernelError::Unsupported(
            "attrs.rope: the reference paged attention takes q and k already rotated".into(),
        ));
    }
    expect_float("q", &args.q)?;
    if let Some(l) = args.q.layout()
        && l != Layout::Bshd
    {
        return Err(invalid(format!("tensor `q` has layout {l}; paged attention takes BSHD queries")));
    }
    let q = Heads::new("q", &args.q)?;
    let kc = Cache::new("k_cache", &args.k_cache, args.k_scale.as_ref(), "k_scale")?;
    let vc = Cache::new("v_cache", &args.v_cache, args.v_scale.as_ref(), "v_scale")?;
    if (vc.pages, vc.page_size, vc.heads) != (kc.pages, kc.page_size, kc.heads) {
        return Err(invalid(format!(
            "v_cache [pages, page_size, heads] = [{}, {}, {}] != k_cache's [{}, {}, {}]",
            vc.pages, vc.page_size, vc.heads, kc.pages, kc.page_size, kc.heads
        )));
    }
    if kc.d != q.d {
        return Err(invalid(format!("k_cache head_dim {} != q head_dim {}", kc.d, q.d)));
    }
    if kc.heads == 0 || q.h % kc.heads != 0 {
        return Err(invalid(format!("q heads {} are not a multiple of kv heads {}", q.h, kc.heads)));
    }
    let group = q.h / kc.heads;

    let bt = &args.block_table;
    expect_rank("block_table", bt, 2, &format!("[batch = {}, max_pages]", q.b))?;
    if bt.shape()[0] != q.b {
        return Err(invalid(format!("block_table has {} rows; q batch is {}", bt.shape()[0], q.b)));
    }
    let max_pages = bt.shape()[1];
    let table = index_values("block_table", bt)?;
    let cl = &args.context_lens;
    expect_rank("context_lens", cl, 1, &format!("[batch = {}]", q.b))?;
    if cl.shape()[0] != q.b {
        return Err(invalid(format!("context_lens has {} entries; q batch is {}", cl.shape()[0], q.b)));
    }
    let capacity = max_pages.saturating_mul(kc.page_size);
    let lens = index_values("context_lens", cl)?;
    for (b, &len) in lens.iter().enumerate() {
        if len < 0 || len as u64 > capacity as u64 {
            return Err(invalid(format!(
                "context_lens[{b}] = {len}; it must be in 0..={capacity} ({max_pages} pages of {} tokens)",
                kc.page_size
            )));
        }
    }

    // Only the entries a sequence's context reaches are read, so only those must point
    // into the cache: hosts pad the rest of a row with anything (vLLM uses 0, others -1).
    for (b, &len) in lens.iter().enumerate() {
        for p in 0..(len as usize).div_ceil(kc.page_size) {
            let page = table[b * max_pages + p];
            if page < 0 || page >= kc.pages as i64 {
                return Err(invalid(format!(
                    "block_table[{b}, {p}] = {page} is outside the cache's {} pages (sequence {b} reads {} pages for {len} tokens)",
                    kc.pages,
                    (len as usize).div_ceil(kc.page_size)
                )));
            }
        }
    }

    let scale = softmax_scale(a, q.d);
    let slopes = if a.alibi { alibi_slopes(q.h) } else { vec![0.0; q.h] };
    let dv = vc.d;
    let mut out = zeros_for(&[q.b, q.s, q.h, dv])?;
    for b in 0..q.b {
        let ctx = lens[b] as usize;
        // Key j of sequence b: logical page j / page_size, slot j % page_size (checked above).
        let loc = |j: usize| (table[b * max_pages + j / kc.page_size] as usize, j % kc.page_size);
        for h in 0..q.h {
            let hk = h / group;
            for i in 0..q.s {
                let (lo, hi) = visible_keys(i, q.s, ctx, a);
                let scores: Vec<(usize, f64)> = (lo..hi)
                    .map(|j| {
                        let (page, slot) = loc(j);
                        let dot: f64 = (0..q.d).map(|d| q.at(b, i, h, d) * kc.at(page, slot, hk, d)).sum();
                        (j, score(dot, scale, a, slopes[h], i, j, q.s, ctx))
                    })
                    .collect();
                let row = softmax_weighted_sum(&scores, dv, |j, d| {
                    let (page, slot) = loc(j);
                    vc.at(page, slot, hk, d)
                });
                for (d, x) in row.into_iter().enumerate() {
                    out[q.out_index(b, i, h, d, dv)] = x;
                }
            }
        }
    }
    Ok(from_f64_as(args.q.dtype(), &[q.b, q.s, q.h, dv], &out)?.with_layout(Layout::Bshd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::attention::attention;
    use crate::test_util::{close, tensor, values};
    use layerzero_core::exec::args::AttentionArgs;
    use layerzero_core::model::attrs::AttentionAttrs;
    use layerzero_core::model::dtype::DType;
    use layerzero_core::tensor::Storage;

    struct Case {
        layout: Layout,
        page_size: usize,
        i64_table: bool,
        cache_dtype: DType,
        scaled: bool,
    }

    /// Builds a paged problem from logical per-sequence K/V, scattering pages in a
    /// shuffled order, and checks it against dense attention over the dequantized keys.
    fn check(c: &Case, attrs: AttentionAttrs) -> TestResult {
        let (batch, sq, hq, hkv, d, dv) = (3usize, 3usize, 4usize, 2usize, 8usize, 4usize);
        let lens = [5usize, 1, 2 * c.page_size.min(7) + 3];
        let max_pages = lens.iter().map(|l| l.div_ceil(c.page_size)).max().ok_or("no lengths")? + 1;
        // Two spare pages, and a count coprime with 7 so `phys` below is a permutation.
        let pages = if (batch * max_pages + 2) % 7 == 0 { batch * max_pages + 3 } else { batch * max_pages + 2 };
        // Physical page of (b, p): a fixed permutation, so no sequence is stored in order.
        let phys = |b: usize, p: usize| (b * max_pages + p) * 7 % pages;
        let k_scale: Vec<f32> = if c.scaled { vec![0.5, 2.0] } else { vec![1.0, 1.0] };
        let v_scale = if c.scaled { 0.25f32 } else { 1.0 };
        let nhd = |p: usize, s: usize, h: usize, x: usize, width: usize| ((p * c.page_size + s) * hkv + h) * width + x;
        let mut kvals = values(pages * c.page_size * hkv * d, 11);
        let mut vvals = values(pages * c.page_size * hkv * dv, 12);
        // Round through the cache dtype so the dense reference sees the same values.
        for x in kvals.iter_mut().chain(vvals.iter_mut()) {
            *x = Storage::from_f32(c.cache_dtype, &[*x * 4.0]).get_f32(0);
        }
        let cache = |vals: &[f32], width: usize| -> TestResult<_> {
            let t = HostTensor::from_f32_as(c.cache_dtype, &[pages, c.page_size, hkv, width], vals)?;
            Ok(match c.layout {
                Layout::Hnd => t.permute(&[0, 2, 1, 3])?.contiguous().with_layout(Layout::Hnd),
                _ => t.with_layout(Layout::Nhd),
            })
        };
        let mut table = vec![0i64; batch * max_pages];
        for b in 0..batch {
            for p in 0..max_pages {
                table[b * max_pages + p] = phys(b, p) as i64;
            }
        }
        let block_table = if c.i64_table {
            HostTensor::new(Storage::I64(table.clone().into()), &[batch, max_pages])?
        } else {
            HostTensor::new(Storage::I32(table.iter().map(|&x| x as i32).collect()), &[batch, max_pages])?
        };
        let q = tensor(&[batch, sq, hq, d], 13, Layout::Bshd)?;
        let args = PagedAttentionArgs {
            q: q.clone(),
            k_cache: cache(&kvals, d)?,
            v_cache: cache(&vvals, dv)?,
            block_table,
            context_lens: HostTensor::new(Storage::I32(lens.iter().map(|&l| l as i32).collect()), &[batch])?,
            k_scale: c.scaled.then(|| HostTensor::from_f32(&[hkv], k_scale.clone())).transpose()?,
            v_scale: c.scaled.then(|| HostTensor::from_f32(&[1], vec![v_scale])).transpose()?,
            attrs: attrs.clone(),
        };
        let paged = paged_attention(&args)?;
        assert_eq!(paged.shape(), &[batch, sq, hq, dv]);
        let paged = paged.to_f32_vec();
        for (b, &len) in lens.iter().enumerate() {
            let mut k = Vec::new();
            let mut v = Vec::new();
            for j in 0..len {
                let (p, s) = (phys(b, j / c.page_size), j % c.page_size);
                for h in 0..hkv {
                    k.extend((0..d).map(|x| kvals[nhd(p, s, h, x, d)] * k_scale[h]));
                    v.extend((0..dv).map(|x| vvals[nhd(p, s, h, x, dv)] * v_scale));
                }
            }
            let qb = q.view(&[1, sq, hq, d], &[sq * hq * d, hq * d, d, 1], b * sq * hq * d)?;
            let dense = attention(&AttentionArgs {
                q: qb,
                k: HostTensor::from_f32(&[1, len, hkv, d], k)?,
                v: HostTensor::from_f32(&[1, len, hkv, dv], v)?,
                mask: None,
                cu_seqlens_q: None,
                cu_seqlens_k: None,
                attrs: attrs.clone(),
            })?
            .to_f32_vec();
            let n = sq * hq * dv;
            close(&paged[b * n..(b + 1) * n], &dense, 1e-6);
        }
        Ok(())
    }

    #[test]
    fn paged_equals_dense_on_the_gathered_cache() -> TestResult {
        let attrs = [
            AttentionAttrs::default(),
            AttentionAttrs { causal: true, ..Default::default() },
            AttentionAttrs {
                causal: true,
                window_left: Some(2),
                softcap: Some(3.0),
                alibi: true,
                ..Default::default()
            },
        ];
        for layout in [Layout::Nhd, Layout::Hnd] {
            for page_size in [1, 16, 256] {
                for i64_table in [false, true] {
                    for a in &attrs {
                        let c = Case { layout, page_size, i64_table, cache_dtype: DType::F32, scaled: false };
                        check(&c, a.clone())?;
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn fp8_and_half_caches_with_scales() -> TestResult {
        for cache_dtype in [DType::Fp8E4M3, DType::Fp8E5M2, DType::F16, DType::BF16] {
            for layout in [Layout::Nhd, Layout::Hnd] {
                let c = Case { layout, page_size: 4, i64_table: false, cache_dtype, scaled: true };
                check(&c, AttentionAttrs { causal: true, ..Default::default() })?;
            }
        }
        Ok(())
    }

    fn small() -> TestResult<PagedAttentionArgs> {
        let cache = |seed| -> TestResult<_> { Ok(tensor(&[4, 2, 1, 4], seed, Layout::Nhd)?) };
        Ok(PagedAttentionArgs {
            q: tensor(&[2, 2, 1, 4], 1, Layout::Bshd)?,
            k_cache: cache(2)?,
            v_cache: cache(3)?,
            block_table: HostTensor::new(Storage::I32(vec![0, 1, 2, 3].into()), &[2, 2])?,
            context_lens: HostTensor::new(Storage::I32(vec![4, 3].into()), &[2])?,
            k_scale: None,
            v_scale: None,
            attrs: AttentionAttrs { causal: true, ..Default::default() },
        })
    }

    #[test]
    fn bad_tables_and_lengths_are_invalid_input() -> TestResult {
        assert!(paged_attention(&small()?).is_ok());
        for (entry, value) in [(3usize, 4i32), (1, -1)] {
            let mut a = small()?;
            let mut t = vec![0, 1, 2, 3];
            t[entry] = value;
            a.block_table = HostTensor::new(Storage::I32(t.into()), &[2, 2])?;
            let err = paged_attention(&a).err().ok_or_else(|| format!("block_table entry {value} must be refused"))?;
            let at = format!("block_table[{}, {}] = {value}", entry / 2, entry % 2);
            assert!(matches!(&err, KernelError::InvalidInput(m) if m.contains(&at)), "{err}");
        }
        // A padding entry past the pages a context reaches is never read, so it may be anything.
        let mut a = small()?;
        a.block_table = HostTensor::new(Storage::I32(vec![0, 1, 2, -1].into()), &[2, 2])?;
        a.context_lens = HostTensor::new(Storage::I32(vec![4, 2].into()), &[2])?;
        assert!(paged_attention(&a).is_ok());
        for len in [5, -1] {
            let mut a = small()?;
            a.context_lens = HostTensor::new(Storage::I32(vec![4, len].into()), &[2])?;
            let err = paged_attention(&a).err().ok_or_else(|| format!("context_lens {len} must be refused"))?;
            assert!(matches!(&err, KernelError::InvalidInput(m) if m.contains(&format!("context_lens[1] = {len}"))));
        }
        let mut a = small()?;
        a.k_cache = a.k_cache.clone().with_layout(Layout::Bshd);
        assert!(matches!(paged_attention(&a), Err(KernelError::InvalidInput(_))));
        let mut a = small()?;
        a.k_scale = Some(HostTensor::from_f32(&[3], vec![1.0; 3])?);
        assert!(matches!(paged_attention(&a), Err(KernelError::InvalidInput(_))));
        let mut a = small()?;
        a.block_table = HostTensor::new(Storage::I32(vec![0, 1].into()), &[1, 2])?;
        assert!(matches!(paged_attention(&a), Err(KernelError::InvalidInput(_))));
        Ok(())
    }

    #[test]
    fn short_context_gives_zero_rows_not_errors() -> TestResult {
        let mut a = small()?;
        a.context_lens = HostTensor::new(Storage::I32(vec![1, 0].into()), &[2])?;
        let out = paged_attention(&a)?;
        // Sequence 0: row 0 sees no key, row 1 sees key 0 (= v page 0 slot 0).
        for d in 0..4 {
            assert_eq!(out.at(&[0, 0, 0, d]), 0.0);
            assert_eq!(out.at(&[0, 1, 0, d]), a.v_cache.at(&[0, 0, 0, d]));
            assert_eq!(out.at(&[1, 0, 0, d]), 0.0);
            assert_eq!(out.at(&[1, 1, 0, d]), 0.0);
        }
        Ok(())
    }
}
