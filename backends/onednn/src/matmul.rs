//! `onednn.linear.matmul` (`out = x · weightᵀ (+ bias)`, f32 / bf16 / f16) and
//! `onednn.linear_w8a8.matmul` (i8 × i8 with i32 accumulation, per-channel weight scales,
//! per-row or per-tensor activation scales) through oneDNN's matmul primitive.
//!
//! The row count m is a runtime dimension, so one primitive (one JIT compilation) serves
//! every m of a shape. The weight's layout is the primitive's choice (`format_tag_any`):
//! a weight is reordered into it once and kept in a bounded cache keyed by the weight
//! tensor's identity (its storage, held by `Weak`, so an address is never reused while
//! the entry lives), never re-packed per call. Past the cache's bound, a second primitive
//! that reads the weight in place (strided, as given) serves the call instead.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::api::{self, Dnnl, Handle, Prim, RUNTIME_DIM};
use super::buffers::{Output, f32_values, input};
use super::jit::{self, Key};
use layerzero_core::exec::args::{LinearArgs, OpArgs, Outputs, W8a8Args};
use layerzero_core::exec::check::{WeightLayout, out_dtype, rows_of, weight_dims};
use layerzero_core::exec::executor::{Executor, KernelError};
use layerzero_core::model::dtype::DType;
use layerzero_core::tensor::{HostTensor, Storage};

/// The float matmul's kernel id.
pub const LINEAR: &str = "onednn.linear.matmul";
/// The int8 matmul's kernel id.
pub const W8A8: &str = "onednn.linear_w8a8.matmul";

/// Packed weights kept at most (bytes); past it, weights are read in place.
const PACKED_BYTES: usize = 16 << 30;

/// 64-byte aligned storage for a packed weight.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A weight in the layout its primitive wants.
struct Packed {
    /// The layout it was packed for (owned here).
    md: Handle,
    data: Vec<Line>,
    md_destroy: unsafe extern "C" fn(Handle) -> i32,
}

// SAFETY: the descriptor and the data are read-only once packed.
#[allow(unsafe_code)]
unsafe impl Send for Packed {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for Packed {}

impl Drop for Packed {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: cloned for this entry and owned by it only.
        unsafe { (self.md_destroy)(self.md) };
    }
}

/// A weight view's identity: storage address, offset, dims and the primitive's key.
type WeightKey = (usize, usize, i64, i64, Key);

#[derive(Clone)]
struct Entry {
    owner: Weak<Storage>,
    packed: Arc<Packed>,
}

/// The packed weights, read without a lock (one atomic load per call); a packing publishes
/// a new map under `PACKING`, which also holds the bytes kept.
static PACKED: LazyLock<ArcSwap<HashMap<WeightKey, Entry>>> = LazyLock::new(|| ArcSwap::from_pointee(HashMap::new()));
static PACKING: Mutex<usize> = Mutex::new(0);
static PACKS: AtomicU64 = AtomicU64::new(0);
static IN_PLACE: AtomicU64 = AtomicU64::new(0);

/// What the oneDNN packed-weight cache has done in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct PackedStats {
    /// Weights reordered into a primitive's layout (each once while it stays cached).
    pub packs: u64,
    /// Calls that read their weight in place (the packed-weight cache was full).
    pub in_place: u64,
    /// Bytes of packed weights held now.
    pub bytes: u64,
    /// Weights held now.
    pub entries: u64,
}

/// The packed-weight cache's counters.
pub fn packed_stats() -> PackedStats {
    let bytes = *PACKING.lock();
    PackedStats {
        packs: PACKS.load(Ordering::Relaxed),
        in_place: IN_PLACE.load(Ordering::Relaxed),
        bytes: bytes as u64,
        entries: PACKED.load().len() as u64,
    }
}

/// Drops the packed weights whose tensor is gone; returns the bytes kept after.
fn purge_dead() -> usize {
    let mut kept = PACKING.lock();
    let current = PACKED.load_full();
    if current.values().all(|e| e.owner.strong_count() > 0) {
        return *kept;
    }
    let mut next = HashMap::clone(&current);
    next.retain(|_, e| e.owner.strong_count() > 0);
    *kept = next.values().map(|e| e.packed.data.len() * 64).sum();
    PACKED.store(Arc::new(next));
    *kept
}

/// The two matmul executors (they share the library and the caches).
pub struct Matmul {
    dnnl: Arc<Dnnl>,
    /// `onednn.linear_w8a8.matmul` rather than `onednn.linear.matmul`.
    int8: bool,
}

impl Matmul {
    /// The float matmul.
    pub fn linear(dnnl: Arc<Dnnl>) -> Matmul {
        Matmul { dnnl, int8: false }
    }

    /// The int8 matmul.
    pub fn w8a8(dnnl: Arc<Dnnl>) -> Matmul {
        Matmul { dnnl, int8: true }
    }
}

/// What a float matmul call is, checked.
struct Problem {
    lead: Vec<usize>,
    m: usize,
    k: usize,
    n: usize,
    nn: bool,
    dtype: DType,
}

fn problem(a: &LinearArgs) -> Result<Problem, KernelError> {
    let dtype = a.x.dtype();
    if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
        return Err(KernelError::Unsupported(format!("{LINEAR} runs f32, bf16 and f16, not {dtype}")));
    }
    let (lead, m, k) = rows_of("x", &a.x)?;
    let (layout, n) = weight_dims("weight", &a.weight, k)?;
    if a.weight.dtype() != dtype {
        return Err(KernelError::Unsupported(format!(
            "{LINEAR} takes a weight in x's dtype {dtype}, not {}",
            a.weight.dtype()
        )));
    }
    if let Some(b) = &a.bias
        && b.shape() != [n]
    {
        return Err(KernelError::InvalidInput(format!("tensor `bias` has shape {:?}; expected [{n}]", b.shape())));
    }
    Ok(Problem { lead: lead.to_vec(), m, k, n, nn: layout == WeightLayout::Nn, dtype })
}

fn dt(d: DType) -> Result<i32, KernelError> {
    api::data_type(d).ok_or_else(|| KernelError::Unsupported(format!("oneDNN has no {d} here")))
}

impl Matmul {
    /// The key of a float matmul's primitive: the weight packed (`any`) or read in place.
    fn linear_key(p: &Problem, bias: bool, in_place: bool) -> Key {
        let code = api::data_type(p.dtype).unwrap_or(0) as u64;
        let flags = code | u64::from(p.nn) << 8 | u64::from(bias) << 9 | u64::from(in_place) << 10;
        Key { kernel: LINEAR, dims: [RUNTIME_DIM, p.k as i64, p.n as i64, 0], flags }
    }

    fn linear_primitive(&self, p: &Problem, bias: bool, in_place: bool) -> Result<Arc<Prim>, KernelError> {
        let d = &self.dnnl;
        jit::primitive(Matmul::linear_key(p, bias, in_place), || {
            let t = dt(p.dtype)?;
            let (k, n) = (p.k as i64, p.n as i64);
            let src = d.md2(RUNTIME_DIM, k, k, t)?;
            // An NT weight [n, k] is read as [k, n] with strides (1, k); NN is [k, n].
            let wei = match (in_place, p.nn) {
                (false, _) => d.md_any(&[k, n], t)?,
                (true, true) => d.md2(k, n, n, t)?,
                (true, false) => d.md(&[k, n], &[1, k], t)?,
            };
            let dst = d.md2(RUNTIME_DIM, n, n, t)?;
            let bia = if bias { Some(d.md2(1, n, n, t)?) } else { None };
            let raws = (src.raw(), wei.raw(), bia.as_ref().map_or(std::ptr::null_mut(), |b| b.raw()), dst.raw());
            let mut mds = vec![(api::ARG_SRC, src), (api::ARG_WEIGHTS, wei), (api::ARG_DST, dst)];
            if let Some(b) = bia {
                mds.push((api::ARG_BIAS, b));
            }
            d.create("matmul", mds, !in_place, |pd| {
                d.matmul_pd(pd, raws.0, raws.1, raws.2, raws.3, std::ptr::null_mut())
            })
        })
    }

    /// The weight in the layout `prim` wants: packed once and cached, or `None` when the
    /// cache has no room (the caller then uses the in-place primitive).
    #[allow(unsafe_code)]
    fn packed(&self, w: &HostTensor, p: &Problem, key: &Key, prim: &Prim) -> Result<Option<Arc<Packed>>, KernelError> {
        let Some(want) = prim.weights_md() else { return Ok(None) };
        let id: WeightKey = (Arc::as_ptr(w.storage_arc()) as usize, w.offset(), p.k as i64, p.n as i64, key.clone());
        if let Some(e) = PACKED.load().get(&id)
            && e.owner.strong_count() > 0
        {
            return Ok(Some(Arc::clone(&e.packed)));
        }
        let d = &self.dnnl;
        let bytes = d.size_of(want);
        // Room for it, once the weights dropped since are let go.
        if purge_dead() + bytes > PACKED_BYTES {
            return Ok(None);
        }
        let t = dt(p.dtype)?;
        let (k, n) = (p.k as i64, p.n as i64);
        let from = if p.nn { d.md2(k, n, n, t)? } else { d.md(&[k, n], &[1, k], t)? };
        let mut data = vec![Line([0; 64]); bytes.div_ceil(64)];
        let src = input("weight", w)?;
        // SAFETY: `src` is the contiguous weight `from` describes; `data` holds the
        // `bytes` that `want` needs; both outlive the call.
        unsafe { d.reorder(&from, want, src, data.as_mut_ptr().cast::<c_void>())? };
        let md = d.clone_md(want)?;
        let packed = Arc::new(Packed { md, data, md_destroy: d.md_destroy_fn() });
        PACKS.fetch_add(1, Ordering::Relaxed);
        let mut kept = PACKING.lock();
        let mut next = HashMap::clone(&PACKED.load_full());
        next.retain(|_, e| e.owner.strong_count() > 0);
        next.insert(id, Entry { owner: Arc::downgrade(w.storage_arc()), packed: Arc::clone(&packed) });
        *kept = next.values().map(|e| e.packed.data.len() * 64).sum();
        PACKED.store(Arc::new(next));
        drop(kept);
        Ok(Some(packed))
    }

    #[allow(unsafe_code)]
    fn run_linear(&self, a: &LinearArgs) -> Result<Outputs, KernelError> {
        let p = problem(a)?;
        let bias = a.bias.is_some();
        let key = Matmul::linear_key(&p, bias, false);
        let prim = self.linear_primitive(&p, bias, false)?;
        let (prim, weight) = match self.packed(&a.weight, &p, &key, &prim)? {
            Some(packed) => (prim, WeightPtr::Packed(packed)),
            None => {
                IN_PLACE.fetch_add(1, Ordering::Relaxed);
                (self.linear_primitive(&p, bias, true)?, WeightPtr::InPlace(input("weight", &a.weight)?))
            }
        };
        let mut out = Output::new(p.dtype, p.m * p.n)?;
        if p.m > 0 && p.n > 0 {
            let d = &self.dnnl;
            let t = dt(p.dtype)?;
            let (m, k, n) = (p.m as i64, p.k as i64, p.n as i64);
            let (src_md, dst_md) = (d.md2(m, k, k, t)?, d.md2(m, n, n, t)?);
            let mut bind =
                vec![(api::ARG_SRC, input("x", &a.x)?), (api::ARG_WEIGHTS, weight.ptr()), (api::ARG_DST, out.ptr())];
            if let Some(b) = &a.bias {
                bind.push((api::ARG_BIAS, input("bias", b)?));
            }
            let mut runtime = vec![(api::ARG_SRC, src_md.raw()), (api::ARG_DST, dst_md.raw())];
            if let WeightPtr::Packed(pk) = &weight {
                runtime.push((api::ARG_WEIGHTS, pk.md));
            }
            // SAFETY: x is [m, k] contiguous, the weight is the packed buffer of the layout
            // the primitive wants (or the weight as its in-place descriptor reads it), the
            // bias [n], the output [m, n]; all live until the call returns.
            unsafe { d.execute(&prim, &bind, &runtime)? };
        }
        let mut shape = p.lead;
        shape.push(p.n);
        let mut o = Outputs::new();
        o.insert("out", out.into_tensor(&shape)?);
        Ok(o)
    }

    fn w8a8_key(per_row: bool, k: usize, n: usize, out: DType, cols: bool, bias: bool) -> Key {
        let code = api::data_type(out).unwrap_or(0) as u64;
        let flags = code | u64::from(per_row) << 8 | u64::from(cols) << 9 | u64::from(bias) << 10;
        Key { kernel: W8A8, dims: [RUNTIME_DIM, k as i64, n as i64, 0], flags }
    }

    /// The int8 primitive; m is a runtime dim. With one activation scale both scales are the
    /// matmul's own and the bias its bias (`acc * xs * ws + bias`, as oneDNN 3.x orders them).
    /// With one scale per row, v3.2 has no per-row source scale and runs a matmul with a
    /// per-row binary post-op in its reference implementation (measured ~400x slower here):
    /// the primitive then writes `acc * ws` in f32 and [`Matmul::run_w8a8`] applies the row
    /// scales and the bias in one pass over the output.
    fn w8a8_primitive(
        &self,
        per_row: bool,
        k: usize,
        n: usize,
        out: DType,
        cols: bool,
        bias: bool,
    ) -> Result<Arc<Prim>, KernelError> {
        let d = &self.dnnl;
        jit::primitive(Matmul::w8a8_key(per_row, k, n, out, cols, bias), || {
            let (ki, ni) = (k as i64, n as i64);
            let (s8, f32t) = (dt(DType::I8)?, dt(DType::F32)?);
            let src = d.md2(RUNTIME_DIM, ki, ki, s8)?;
            let wei = d.md(&[ki, ni], &[1, ki], s8)?;
            let dst = d.md2(RUNTIME_DIM, ni, ni, if per_row { f32t } else { dt(out)? })?;
            let mut attr = d.attr()?;
            // Weight scales per output column (mask bit 1: dim n of [k, n]) or one.
            attr.scales(api::ARG_WEIGHTS, if cols { 2 } else { 0 })?;
            let bia = if per_row {
                None
            } else {
                attr.scales(api::ARG_SRC, 0)?;
                if bias { Some(d.md2(1, ni, ni, f32t)?) } else { None }
            };
            let raw_attr = attr.raw();
            let raws = (src.raw(), wei.raw(), bia.as_ref().map_or(std::ptr::null_mut(), |b| b.raw()), dst.raw());
            let mut mds = vec![(api::ARG_SRC, src), (api::ARG_WEIGHTS, wei), (api::ARG_DST, dst)];
            if let Some(b) = bia {
                mds.push((api::ARG_BIAS, b));
            }
            d.create("int8 matmul", mds, false, |pd| d.matmul_pd(pd, raws.0, raws.1, raws.2, raws.3, raw_attr))
        })
    }

    #[allow(unsafe_code)]
    fn run_w8a8(&self, a: &W8a8Args) -> Result<Outputs, KernelError> {
        let (m, k, n) = a.dims()?;
        let out_dt = out_dtype("out_dtype", a.attrs.out_dtype)?;
        let per_row = a.x_scale.shape() == [m] && m != 1;
        let cols = a.w_scale.shape() == [n] && n != 1;
        let d = &self.dnnl;
        let b = a.bias.as_ref().map(|b| f32_values("bias", b)).transpose()?;
        let prim = self.w8a8_primitive(per_row, k, n, out_dt, cols, b.is_some())?;
        // Per row, the primitive writes f32 products that the epilogue below scales.
        let mut out = Output::new(if per_row { DType::F32 } else { out_dt }, m * n)?;
        if m > 0 && n > 0 {
            let ws = a.w_scale.to_f32_vec();
            let xs = a.x_scale.to_f32_vec();
            let f = |v: &[f32]| v.as_ptr().cast_mut().cast::<c_void>();
            let (mi, ki, ni) = (m as i64, k as i64, n as i64);
            let dst_dt = if per_row { DType::F32 } else { out_dt };
            let (src_md, dst_md) = (d.md2(mi, ki, ki, dt(DType::I8)?)?, d.md2(mi, ni, ni, dt(dst_dt)?)?);
            let ws_md = d.md(&[ws.len() as i64], &[1], dt(DType::F32)?)?;
            let scale_md = d.md(&[1], &[1], dt(DType::F32)?)?;
            let mut bind = vec![
                (api::ARG_SRC, input("x", &a.x)?),
                (api::ARG_WEIGHTS, input("weight", &a.weight)?),
                (api::ARG_DST, out.ptr()),
                (api::ARG_ATTR_SCALES | api::ARG_WEIGHTS, f(&ws)),
            ];
            let mut runtime = vec![
                (api::ARG_SRC, src_md.raw()),
                (api::ARG_DST, dst_md.raw()),
                (api::ARG_ATTR_SCALES | api::ARG_WEIGHTS, ws_md.raw()),
            ];
            if !per_row {
                bind.push((api::ARG_ATTR_SCALES | api::ARG_SRC, f(&xs)));
                runtime.push((api::ARG_ATTR_SCALES | api::ARG_SRC, scale_md.raw()));
                if let Some(b) = &b {
                    bind.push((api::ARG_BIAS, f(b)));
                }
            }
            // SAFETY: x [m, k] and weight [n, k] are contiguous i8, the scales f32 of the
            // lengths their descriptors say, the bias f32 [n], the output [m, n] of the
            // descriptor's dtype; all live until the call returns.
            unsafe { d.execute(&prim, &bind, &runtime)? };
        }
        let out = if per_row {
            let acc = out.into_f32().ok_or_else(|| KernelError::Failed("the int8 products are not f32".to_owned()))?;
            scale_rows(acc, n, &a.x_scale.to_f32_vec(), b.as_deref(), out_dt)?
        } else {
            out.into_tensor(&[m, n])?
        };
        let mut o = Outputs::new();
        o.insert("out", out);
        Ok(o)
    }
}

/// `out[i, j] = acc[i, j] * xs[i] + bias[j]` over the f32 products `acc` (`[m, n]`, rows of
/// `n`), in place, rounded once to `dtype`.
fn scale_rows(
    mut acc: Vec<f32>,
    n: usize,
    xs: &[f32],
    bias: Option<&[f32]>,
    dtype: DType,
) -> Result<HostTensor, KernelError> {
    let m = acc.len().checked_div(n).unwrap_or(0);
    for (row, s) in acc.chunks_exact_mut(n.max(1)).zip(xs) {
        match bias {
            Some(b) => row.iter_mut().zip(b).for_each(|(x, b)| *x = *x * s + b),
            None => row.iter_mut().for_each(|x| *x *= s),
        }
    }
    let out = if dtype == DType::F32 {
        HostTensor::from_f32(&[m, n], acc)
    } else {
        HostTensor::from_f32_as(dtype, &[m, n], &acc)
    };
    out.map_err(|e| KernelError::Failed(e.to_string()))
}

enum WeightPtr {
    Packed(Arc<Packed>),
    InPlace(*mut c_void),
}

impl WeightPtr {
    fn ptr(&self) -> *mut c_void {
        match self {
            WeightPtr::Packed(p) => p.data.as_ptr().cast_mut().cast(),
            WeightPtr::InPlace(p) => *p,
        }
    }
}

impl Executor for Matmul {
    fn run(&self, args: &OpArgs) -> Result<Outputs, KernelError> {
        match (self.int8, args) {
            (false, OpArgs::Linear(a)) => self.run_linear(a),
            (true, OpArgs::LinearW8a8(a)) => self.run_w8a8(a),
            (int8, _) => Err(KernelError::Unsupported(format!(
                "{} runs {} only",
                if int8 { W8A8 } else { LINEAR },
                if int8 { "linear_w8a8" } else { "linear" }
            ))),
        }
    }

    /// Compiles the primitive and packs the weight, so that the first call does neither.
    fn prepare(&self, args: &OpArgs) -> Result<(), KernelError> {
        self.warm(args).map(|_| ())
    }

    fn warm(&self, args: &OpArgs) -> Result<u64, KernelError> {
        let before = jit::compiled_here();
        match (self.int8, args) {
            (false, OpArgs::Linear(a)) => {
                let p = problem(a)?;
                let bias = a.bias.is_some();
                let key = Matmul::linear_key(&p, bias, false);
                let prim = self.linear_primitive(&p, bias, false)?;
                if self.packed(&a.weight, &p, &key, &prim)?.is_none() {
                    self.linear_primitive(&p, bias, true)?;
                }
            }
            (true, OpArgs::LinearW8a8(a)) => {
                let (m, k, n) = a.dims()?;
                let out = out_dtype("out_dtype", a.attrs.out_dtype)?;
                let per_row = a.x_scale.shape() == [m] && m != 1;
                let cols = a.w_scale.shape() == [n] && n != 1;
                self.w8a8_primitive(per_row, k, n, out, cols, a.bias.is_some())?;
                // m = 1 takes one activation scale; larger m of the bucket one per row.
                if m > 1 && per_row {
                    self.w8a8_primitive(false, k, n, out, cols, a.bias.is_some())?;
                }
            }
            _ => return self.run(args).map(|_| 0),
        }
        Ok(jit::compiled_here() - before)
    }

    fn is_warm(&self, args: &OpArgs) -> bool {
        match (self.int8, args) {
            (false, OpArgs::Linear(a)) => problem(a).is_ok_and(|p| {
                let bias = a.bias.is_some();
                jit::is_ready(&Matmul::linear_key(&p, bias, false))
                    || jit::is_ready(&Matmul::linear_key(&p, bias, true))
            }),
            (true, OpArgs::LinearW8a8(a)) => a.dims().is_ok_and(|(m, k, n)| {
                let out = out_dtype("out_dtype", a.attrs.out_dtype).unwrap_or(DType::F32);
                let per_row = a.x_scale.shape() == [m] && m != 1;
                let cols = a.w_scale.shape() == [n] && n != 1;
                let key = |row| Matmul::w8a8_key(row, k, n, out, cols, a.bias.is_some());
                jit::is_ready(&key(per_row)) && (!per_row || jit::is_ready(&key(false)))
            }),
            _ => false,
        }
    }
}
