//! `cpu.paged_attention.split_kv`: queries against NHD/HND page caches addressed through a
//! block table. Every table entry a context reaches and every context length is validated
//! before any read; the engine then runs split-KV decode (few queries) or the tiled path
//! over the gathered pages, dequantizing fp8 (or any dtype) with `k_scale`/`v_scale`.

use layerzero_core::exec::args::{Outputs, PagedAttentionArgs};
use layerzero_core::exec::executor::KernelError;
use layerzero_core::exec::semantics::{alibi_slopes, softmax_scale};
use layerzero_core::model::layout::Layout;
use layerzero_core::tensor::{HostTensor, Storage};

use smallvec::SmallVec;

use super::engine::{KvAddr, KvSrc, Mods, Problem, Seq, output_into};
use super::pack::{Bshd, IntSlice, floats, int_slice, ints, invalid, output};

/// A page cache: sizes and strides in (page, slot, head, d) order.
struct Cache<'a> {
    t: &'a HostTensor,
    n: [usize; 4],
    s: [usize; 4],
    scale: Option<Vec<f32>>,
}

impl<'a> Cache<'a> {
    fn new(
        name: &str,
        t: &'a HostTensor,
        scale: Option<&HostTensor>,
        scale_name: &str,
    ) -> Result<Cache<'a>, KernelError> {
        if !t.dtype().is_float() {
            return Err(invalid(format!("tensor `{name}` has dtype {}; expected a float dtype", t.dtype())));
        }
        let perm = match t.layout() {
            Some(Layout::Nhd) => [0, 1, 2, 3],
            Some(Layout::Hnd) => [0, 2, 1, 3],
            Some(other) => return Err(invalid(format!("tensor `{name}` has layout {other}; expected NHD or HND"))),
            None => return Err(invalid(format!("tensor `{name}` needs a layout tag (NHD or HND)"))),
        };
        if t.rank() != 4 {
            return Err(invalid(format!(
                "tensor `{name}` has shape {:?} (rank {}); expected rank 4 (NHD or HND)",
                t.shape(),
                t.rank()
            )));
        }
        let n = perm.map(|d| t.shape()[d]);
        let s = perm.map(|d| t.strides()[d]);
        let heads = n[2];
        let scale = match scale {
            None => None,
            Some(st) => {
                let v = floats(st, scale_name)?;
                if v.len() == 1 {
                    Some(vec![v[0]; heads])
                } else if st.rank() == 1 && v.len() == heads {
                    Some(v)
                } else {
                    return Err(invalid(format!(
                        "tensor `{scale_name}` has shape {:?}; expected [1] (per tensor) or [{heads}] (per kv head)",
                        st.shape()
                    )));
                }
            }
        };
        Ok(Cache { t, n, s, scale })
    }

    fn src<'t>(&'t self, table_row: IntSlice<'t>) -> KvSrc<'t> {
        KvSrc {
            st: self.t.storage(),
            sd: self.s[3],
            sh: self.s[2],
            addr: KvAddr::Paged {
                table: table_row,
                base: self.t.offset(),
                s_page: self.s[0],
                ps: self.n[1],
                s_slot: self.s[1],
            },
            scale: None,
            rot: None,
        }
    }
}

/// Runs paged attention: output [B, Sq, Hq, Dv] (BSHD) in q's dtype (into `bufs["out"]`
/// when it fits).
pub(crate) fn run(a: &PagedAttentionArgs, bufs: &mut Outputs) -> Result<Outputs, KernelError> {
    a.attrs.check()?;
    if a.attrs.rope.is_some() {
        return Err(KernelError::Unsupported("attrs.rope: paged attention takes q and k already rotated".into()));
    }
    if let Some(l) = a.q.layout()
        && l != Layout::Bshd
    {
        return Err(invalid(format!("tensor `q` has layout {l}; paged attention takes BSHD queries")));
    }
    let q = Bshd::new(&a.q, "q")?;
    let kc = Cache::new("k_cache", &a.k_cache, a.k_scale.as_ref(), "k_scale")?;
    let vc = Cache::new("v_cache", &a.v_cache, a.v_scale.as_ref(), "v_scale")?;
    let [b, sq, hq, d] = q.n;
    let [pages, ps, hkv, dk] = kc.n;
    if vc.n[..3] != kc.n[..3] {
        return Err(invalid(format!(
            "v_cache [pages, page_size, heads] = {:?} != k_cache's {:?}",
            &vc.n[..3],
            &kc.n[..3]
        )));
    }
    let dv = vc.n[3];
    if dk != d {
        return Err(invalid(format!("k_cache head_dim {dk} != q head_dim {d}")));
    }
    if hkv == 0 || hq % hkv != 0 {
        return Err(invalid(format!("q heads {hq} are not a multiple of kv heads {hkv}")));
    }
    let bt = &a.block_table;
    if bt.rank() != 2 || bt.shape()[0] != b {
        return Err(invalid(format!(
            "tensor `block_table` has shape {:?}; expected [batch = {b}, max_pages]",
            bt.shape()
        )));
    }
    let max_pages = bt.shape()[1];
    // Read in place (the decode loop's tables are contiguous); copied only when strided.
    let (table_copy, lens_copy);
    let table = match int_slice(bt, "block_table")? {
        Some(t) => t,
        None => {
            table_copy = ints(bt, "block_table")?;
            IntSlice::I64(&table_copy)
        }
    };
    let cl = &a.context_lens;
    if cl.rank() != 1 || cl.shape()[0] != b {
        return Err(invalid(format!("tensor `context_lens` has shape {:?}; expected [batch = {b}]", cl.shape())));
    }
    let lens = match int_slice(cl, "context_lens")? {
        Some(t) => t,
        None => {
            lens_copy = ints(cl, "context_lens")?;
            IntSlice::I64(&lens_copy)
        }
    };
    let capacity = max_pages.saturating_mul(ps);
    for bb in 0..lens.len() {
        let len = lens.get(bb);
        if len < 0 || len as u64 > capacity as u64 {
            return Err(invalid(format!(
                "context_lens[{bb}] = {len}; it must be in 0..={capacity} ({max_pages} pages of {ps} tokens)"
            )));
        }
    }
    for bb in 0..lens.len() {
        let len = lens.get(bb);
        let need = (len as usize).div_ceil(ps.max(1));
        for p in 0..need {
            let page = table.get(bb * max_pages + p);
            if page < 0 || page >= pages as i64 {
                return Err(invalid(format!(
                    "block_table[{bb}, {p}] = {page} is outside the cache's {pages} pages (sequence {bb} reads {need} pages for {len} tokens)"
                )));
            }
        }
    }
    if b == 0 || sq == 0 || hq == 0 || dv == 0 {
        return finish(Storage::zeros(a.q.dtype(), b * sq * hq * dv), [b, sq, hq, dv]);
    }
    let seqs: SmallVec<[Seq; 8]> = (0..b)
        .map(|bb| {
            let len = lens.get(bb) as usize;
            let row = table.slice(bb * max_pages, bb * max_pages + len.div_ceil(ps.max(1)));
            let mut k = kc.src(row);
            let mut v = vc.src(row);
            k.scale = kc.scale.as_deref();
            v.scale = vc.scale.as_deref();
            Seq { b: bb, q0: 0, sq, sk: len, mask_b: bb, mask_k0: 0, k, v }
        })
        .collect();
    let p = Problem {
        q,
        hq,
        hkv,
        d,
        dv,
        scale: softmax_scale(&a.attrs, d) as f32,
        attrs: &a.attrs,
        mods: Mods {
            softcap: a.attrs.softcap.map(|c| c as f32),
            alibi: a.attrs.alibi.then(|| alibi_slopes(hq)),
            mask: None,
        },
        seqs,
        bf16: [&a.q, &a.k_cache, &a.v_cache].iter().all(|t| t.dtype() == layerzero_core::model::dtype::DType::BF16)
            && a.k_scale.is_none()
            && a.v_scale.is_none(),
        rope: None,
    };
    output_into(&p, [b, sq, hq, dv], Layout::Bshd, a.q.dtype(), bufs)
}

fn finish(storage: Storage, n: [usize; 4]) -> Result<Outputs, KernelError> {
    Ok(Outputs::from([("out", output(storage, n, Layout::Bshd)?)]))
}
