//! Row-wise oneDNN kernels: `layer_norm` (layer normalization primitive), `gelu` / `silu`
//! (eltwise), and `swiglu` / `geglu` (eltwise on the gate into the output, then a binary
//! multiply by `up` in place, chunk by chunk so the output chunk is still in cache: v3.2's
//! eltwise with a binary post-op is its reference implementation, ~30x slower).
//!
//! oneDNN has no runtime dims for these primitives, so rows run in power-of-two chunks
//! (`jit::chunks`): a bucket of row counts needs the chunk primitives up to its bound and
//! no others, which is what warm-up compiles.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use super::api::{self, Dnnl, Handle, Prim};
use super::buffers::{Output, f32_values, input};
use super::jit::{self, Key};
use layerzero_core::exec::args::{NormArgs, OpArgs, Outputs};
use layerzero_core::exec::check::check_gated;
use layerzero_core::exec::executor::{Executor, KernelError};
use layerzero_core::model::attrs::GeluApproximate;
use layerzero_core::model::dtype::DType;
use layerzero_core::model::op::Op;
use layerzero_core::tensor::HostTensor;

/// `onednn.layer_norm.lnorm`.
pub const LAYER_NORM: &str = "onednn.layer_norm.lnorm";
/// `onednn.gelu.eltwise`.
pub const GELU: &str = "onednn.gelu.eltwise";
/// `onednn.silu.eltwise`.
pub const SILU: &str = "onednn.silu.eltwise";
/// `onednn.swiglu.eltwise_mul`.
pub const SWIGLU: &str = "onednn.swiglu.eltwise_mul";
/// `onednn.geglu.eltwise_mul`.
pub const GEGLU: &str = "onednn.geglu.eltwise_mul";

/// Which row-wise kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `layer_norm`.
    LayerNorm,
    /// `gelu`.
    Gelu,
    /// `silu`.
    Silu,
    /// `swiglu`.
    Swiglu,
    /// `geglu`.
    Geglu,
}

impl Kind {
    pub(super) fn id(self) -> &'static str {
        match self {
            Kind::LayerNorm => LAYER_NORM,
            Kind::Gelu => GELU,
            Kind::Silu => SILU,
            Kind::Swiglu => SWIGLU,
            Kind::Geglu => GEGLU,
        }
    }
}

/// One row-wise executor.
pub struct Rows {
    dnnl: Arc<Dnnl>,
    kind: Kind,
}

/// A checked call: dense rows of `cols` elements, and the primitive's flags.
struct Plan<'a> {
    rows: usize,
    cols: usize,
    dtype: DType,
    /// The eltwise algorithm (or 0 for the layer norm).
    alg: c_int,
    /// Flags of the key beyond the dtype (bias and eps, or the algorithm).
    flags: u64,
    out_shape: Vec<usize>,
    /// The input (the gate, for the gated kinds) and, for those, `up`.
    x: &'a HostTensor,
    up: Option<&'a HostTensor>,
    norm: Option<(&'a NormArgs, f32)>,
}

fn unsupported(kind: Kind, args: &OpArgs) -> KernelError {
    KernelError::Unsupported(format!("{} does not run {}", kind.id(), args.op()))
}

fn float_dtype(d: DType) -> Result<DType, KernelError> {
    match d {
        DType::F32 | DType::BF16 | DType::F16 => Ok(d),
        d => Err(KernelError::Unsupported(format!("oneDNN row-wise kernels here run f32, bf16 and f16, not {d}"))),
    }
}

/// The eltwise algorithm of a GELU.
fn gelu_alg(a: GeluApproximate) -> c_int {
    match a {
        GeluApproximate::None => api::ELTWISE_GELU_ERF,
        GeluApproximate::Tanh => api::ELTWISE_GELU_TANH,
    }
}

impl Rows {
    /// The executor of `kind` over the library `dnnl`.
    pub fn new(dnnl: Arc<Dnnl>, kind: Kind) -> Rows {
        Rows { dnnl, kind }
    }

    /// Its kernel id.
    pub fn id(&self) -> &'static str {
        self.kind.id()
    }

    fn plan<'a>(&self, args: &'a OpArgs) -> Result<Plan<'a>, KernelError> {
        let last = |t: &HostTensor| t.shape().last().copied().unwrap_or(1);
        let rows_of = |t: &HostTensor| t.numel().checked_div(last(t)).unwrap_or(0);
        match (self.kind, args) {
            (Kind::LayerNorm, OpArgs::LayerNorm(a)) => {
                let (rows, h, eps) = a.check(Op::LayerNorm)?;
                if a.residual.is_some() {
                    return Err(KernelError::Unsupported(format!("{LAYER_NORM} takes no residual")));
                }
                Ok(Plan {
                    rows,
                    cols: h,
                    dtype: float_dtype(a.x.dtype())?,
                    alg: 0,
                    // eps is compiled into the primitive: it is part of the key.
                    flags: u64::from(a.bias.is_some()) << 8 | u64::from((eps as f32).to_bits()) << 32,
                    out_shape: a.x.shape().to_vec(),
                    x: &a.x,
                    up: None,
                    norm: Some((a, eps as f32)),
                })
            }
            (Kind::Gelu | Kind::Silu, OpArgs::Gelu(_) | OpArgs::Silu(_)) => {
                let (x, alg) = match args {
                    OpArgs::Gelu(a) if self.kind == Kind::Gelu => (&a.x, gelu_alg(a.attrs.approximate)),
                    OpArgs::Silu(a) if self.kind == Kind::Silu => (&a.x, api::ELTWISE_SWISH),
                    _ => return Err(unsupported(self.kind, args)),
                };
                let cols = last(x);
                Ok(Plan {
                    rows: rows_of(x),
                    cols,
                    dtype: float_dtype(x.dtype())?,
                    alg,
                    flags: (alg as u64) << 8,
                    out_shape: x.shape().to_vec(),
                    x,
                    up: None,
                    norm: None,
                })
            }
            (Kind::Swiglu, OpArgs::Swiglu(_)) | (Kind::Geglu, OpArgs::Geglu(_)) => {
                let (split, x, gate, up, alg, op) = match args {
                    OpArgs::Swiglu(a) => {
                        (a.attrs.split, a.x.as_ref(), a.gate.as_ref(), a.up.as_ref(), api::ELTWISE_SWISH, "swiglu")
                    }
                    OpArgs::Geglu(a) => {
                        let alg = gelu_alg(a.attrs.approximate);
                        (a.attrs.split, a.x.as_ref(), a.gate.as_ref(), a.up.as_ref(), alg, "geglu")
                    }
                    _ => return Err(unsupported(self.kind, args)),
                };
                let out_shape = check_gated(op, split, x, gate, up)?;
                let cols = out_shape.last().copied().unwrap_or(1);
                // Dense operands only: the split form (gate and up as row-strided views of x)
                // is not declared (see the capability file).
                let (first, up) = match (split, gate, up) {
                    (false, Some(g), Some(u)) => (g, u),
                    (true, _, _) => {
                        return Err(KernelError::Unsupported(format!(
                            "{} takes gate and up separately",
                            self.kind.id()
                        )));
                    }
                    _ => return Err(KernelError::InvalidInput(format!("{op}: operands missing"))),
                };
                let _ = x;
                if up.dtype() != first.dtype() {
                    return Err(KernelError::Unsupported(format!("{} takes gate and up of one dtype", self.kind.id())));
                }
                let rows = out_shape.iter().product::<usize>().checked_div(cols).unwrap_or(0);
                Ok(Plan {
                    rows,
                    cols,
                    dtype: float_dtype(first.dtype())?,
                    alg,
                    flags: (alg as u64) << 8,
                    out_shape: out_shape.to_vec(),
                    x: first,
                    up: Some(up),
                    norm: None,
                })
            }
            _ => Err(unsupported(self.kind, args)),
        }
    }

    fn key(&self, p: &Plan<'_>, chunk: usize) -> Key {
        let code = api::data_type(p.dtype).unwrap_or(0) as u64;
        Key { kernel: self.kind.id(), dims: [chunk as i64, p.cols as i64, 0, 0], flags: code | p.flags }
    }

    /// The key of the gated kinds' multiply for `chunk` rows.
    fn multiply_key(&self, p: &Plan<'_>, chunk: usize) -> Key {
        let mut key = self.key(p, chunk);
        key.flags |= 1 << 40;
        key
    }

    /// The primitive for `chunk` rows of `p`'s shape.
    fn primitive(&self, p: &Plan<'_>, chunk: usize) -> Result<Arc<Prim>, KernelError> {
        let d = &self.dnnl;
        jit::primitive(self.key(p, chunk), || {
            let t = api::data_type(p.dtype).ok_or_else(|| KernelError::Unsupported(format!("{}", p.dtype)))?;
            let (r, c) = (chunk as i64, p.cols as i64);
            let (src, dst) = (d.md2(r, c, c, t)?, d.md2(r, c, c, t)?);
            let (s, o) = (src.raw(), dst.raw());
            match self.kind {
                Kind::LayerNorm => {
                    let flags = api::USE_SCALE | if p.flags & (1 << 8) != 0 { api::USE_SHIFT } else { 0 };
                    let eps = p.norm.map_or(1e-5, |(_, e)| e);
                    let f32t = api::data_type(DType::F32).unwrap_or(3);
                    let mut mds =
                        vec![(api::ARG_SRC, src), (api::ARG_DST, dst), (api::ARG_SCALE, d.md(&[c], &[1], f32t)?)];
                    if flags & api::USE_SHIFT != 0 {
                        mds.push((api::ARG_SHIFT, d.md(&[c], &[1], f32t)?));
                    }
                    d.create("layer normalization", mds, false, |pd| d.lnorm_pd(pd, s, o, eps, flags))
                }
                // The activation (of the gate, for the gated kinds).
                Kind::Gelu | Kind::Silu | Kind::Swiglu | Kind::Geglu => {
                    let mds = vec![(api::ARG_SRC, src), (api::ARG_DST, dst)];
                    d.create("eltwise", mds, false, |pd| d.eltwise_pd(pd, p.alg, s, o, 1.0, std::ptr::null_mut()))
                }
            }
        })
    }

    /// The multiply `out = act * up` of the gated kinds for `chunk` rows. v3.2's eltwise
    /// writes its source's dtype, so a bf16 or f16 activation is rounded before the multiply
    /// (two roundings, within those dtypes' tolerance).
    fn multiply(&self, p: &Plan<'_>, chunk: usize) -> Result<Arc<Prim>, KernelError> {
        let d = &self.dnnl;
        jit::primitive(self.multiply_key(p, chunk), || {
            let t = api::data_type(p.dtype).ok_or_else(|| KernelError::Unsupported(format!("{}", p.dtype)))?;
            let (r, c) = (chunk as i64, p.cols as i64);
            let (src0, src1, dst) = (d.md2(r, c, c, t)?, d.md2(r, c, c, t)?, d.md2(r, c, c, t)?);
            let raws = (src0.raw(), src1.raw(), dst.raw());
            let mds = vec![(api::ARG_SRC, src0), (api::ARG_SRC_1, src1), (api::ARG_DST, dst)];
            d.create("binary multiply", mds, false, |pd| d.binary_pd(pd, api::BINARY_MUL, raws.0, raws.1, raws.2))
        })
    }

    /// The largest chunk: unbounded, except for the gated kinds, whose activations are read
    /// again by the multiply and should still be in cache (about 1 MiB of them).
    fn cap(&self, p: &Plan<'_>) -> usize {
        if p.up.is_none() {
            return usize::MAX;
        }
        let row = (p.cols * p.dtype.size_bytes() as usize).max(1);
        let rows = ((1usize << 20) / row).max(1);
        1usize << rows.ilog2()
    }

    /// The chunk sizes calls of up to `p.rows` rows need.
    fn sizes(&self, p: &Plan<'_>) -> impl Iterator<Item = usize> {
        jit::chunk_sizes_up_to(p.rows.min(self.cap(p)))
    }

    #[allow(unsafe_code)]
    fn execute(&self, p: &Plan<'_>) -> Result<Outputs, KernelError> {
        let esize = p.dtype.size_bytes() as usize;
        let mut out = Output::new(p.dtype, p.rows * p.cols)?;
        let x = input("x", p.x)?;
        let up = p.up.map(|t| input("up", t)).transpose()?;
        // Layer norm: scale and shift in f32, as oneDNN takes them.
        let (scale, shift) = match p.norm {
            Some((a, _)) => {
                (Some(f32_values("weight", &a.weight)?), a.bias.as_ref().map(|b| f32_values("bias", b)).transpose()?)
            }
            None => (None, None),
        };
        // The gated kinds' activations, one chunk at a time.
        let mut act = Output::new(p.dtype, if up.is_some() { p.cols * p.rows.min(self.cap(p)) } else { 0 })?;
        if p.cols > 0 {
            for (at, size) in jit::capped_chunks(p.rows, self.cap(p)) {
                let prim = self.primitive(p, size)?;
                let out_at = out.ptr().cast::<u8>().wrapping_add(at * p.cols * esize).cast::<c_void>();
                let dst = if up.is_some() { act.ptr() } else { out_at };
                let src = x.cast::<u8>().wrapping_add(at * p.cols * esize).cast::<c_void>();
                let mut bind: smallvec::SmallVec<[(c_int, *mut c_void); 4]> =
                    smallvec::smallvec![(api::ARG_SRC, src), (api::ARG_DST, dst)];
                if let Some(s) = &scale {
                    bind.push((api::ARG_SCALE, s.as_ptr().cast_mut().cast()));
                }
                if let Some(s) = &shift {
                    bind.push((api::ARG_SHIFT, s.as_ptr().cast_mut().cast()));
                }
                let runtime: [(c_int, Handle); 0] = [];
                // SAFETY: the chunk's rows [at, at + size) lie inside x and the output (dense
                // rows of cols elements); scale and shift hold cols f32 values; all live until
                // the call returns.
                unsafe { self.dnnl.execute(&prim, &bind, &runtime)? };
                if let Some(u) = up {
                    let mul = self.multiply(p, size)?;
                    let at_up = u.cast::<u8>().wrapping_add(at * p.cols * esize).cast::<c_void>();
                    let bind = [(api::ARG_SRC, dst), (api::ARG_SRC_1, at_up), (api::ARG_DST, out_at)];
                    // SAFETY: the chunk's activations just written, the same rows of up and of
                    // the output; all live until the call returns.
                    unsafe { self.dnnl.execute(&mul, &bind, &runtime)? };
                }
            }
        }
        let mut o = Outputs::new();
        o.insert("out", out.into_tensor(&p.out_shape)?);
        Ok(o)
    }
}

impl Executor for Rows {
    fn run(&self, args: &OpArgs) -> Result<Outputs, KernelError> {
        let p = self.plan(args)?;
        self.execute(&p)
    }

    fn warm(&self, args: &OpArgs) -> Result<u64, KernelError> {
        let p = self.plan(args)?;
        let before = jit::compiled_here();
        for size in self.sizes(&p) {
            self.primitive(&p, size)?;
            if p.up.is_some() {
                self.multiply(&p, size)?;
            }
        }
        Ok(jit::compiled_here() - before)
    }

    fn is_warm(&self, args: &OpArgs) -> bool {
        self.plan(args).is_ok_and(|p| {
            self.sizes(&p).all(|s| {
                jit::is_ready(&self.key(&p, s)) && (p.up.is_none() || jit::is_ready(&self.multiply_key(&p, s)))
            })
        })
    }
}
