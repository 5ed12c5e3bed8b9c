//! oneDNN's C API as LayerZero uses it: the entry points resolved once from the loaded
//! library, the CPU engine, memory descriptors and primitives as owned values, and one
//! `execute` that binds buffers to a primitive's arguments.
//!
//! Signatures and constants are those of `include/oneapi/dnnl/dnnl.h`, `dnnl_types.h` and
//! `dnnl_common_types.h` of v3.2 (the `onednn-cpu-gomp` wheel), unchanged through v3.14
//! (oneDNN keeps its C ABI within a major version).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use super::loader::Loaded;
use layerzero_core::exec::executor::KernelError;
use layerzero_core::model::dtype::DType;

pub(super) type Handle = *mut c_void;
type Status = c_int;
const MAX_NDIMS: usize = 12;
type Dims = [i64; MAX_NDIMS];

/// `dnnl_engine_kind_t::dnnl_cpu`.
const ENGINE_CPU: c_int = 1;
/// `dnnl_stream_default_flags`.
const STREAM_DEFAULT: c_uint = 1;
/// `dnnl_format_tag_any`: the primitive picks the layout (queried back for packing).
pub(super) const TAG_ANY: c_int = 1;
/// `DNNL_RUNTIME_DIM_VAL`: a dimension given at execution time.
pub(super) const RUNTIME_DIM: i64 = i64::MIN;
/// `dnnl_forward_inference`.
pub(super) const FORWARD_INFERENCE: c_int = 96;
/// `dnnl_alg_kind_t` (the eltwise values count up from `dnnl_eltwise_relu = 0x20`).
pub(super) const ELTWISE_GELU_TANH: c_int = 0x2b;
pub(super) const ELTWISE_SWISH: c_int = 0x2c;
pub(super) const ELTWISE_GELU_ERF: c_int = 0x31;
pub(super) const BINARY_MUL: c_int = 0x1fff1;
/// `dnnl_normalization_flags_t`.
pub(super) const USE_SCALE: c_uint = 0x2;
pub(super) const USE_SHIFT: c_uint = 0x4;
/// `dnnl_query_t`: the weights memory descriptor of a primitive descriptor.
const QUERY_WEIGHTS_MD: c_int = 131;
/// `DNNL_ARG_*`.
pub(super) const ARG_SRC: c_int = 1;
pub(super) const ARG_SRC_1: c_int = 2;
pub(super) const ARG_DST: c_int = 17;
pub(super) const ARG_WEIGHTS: c_int = 33;
pub(super) const ARG_BIAS: c_int = 41;
pub(super) const ARG_SCALE: c_int = 51;
pub(super) const ARG_SHIFT: c_int = 52;
pub(super) const ARG_FROM: c_int = 1;
pub(super) const ARG_TO: c_int = 17;
/// `DNNL_ARG_ATTR_SCALES`, or-ed with the argument the scales belong to.
pub(super) const ARG_ATTR_SCALES: c_int = 4096;

/// `dnnl_data_type_t` of a LayerZero dtype (`None`: oneDNN has no such type here).
pub(super) fn data_type(d: DType) -> Option<c_int> {
    Some(match d {
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::F32 => 3,
        DType::I32 => 4,
        DType::I8 => 5,
        _ => return None,
    })
}

#[repr(C)]
struct ExecArg {
    arg: c_int,
    memory: Handle,
}

type PdCreate2 = unsafe extern "C" fn(*mut Handle, Handle, Handle, Handle, Handle, Handle, Handle) -> Status;

/// The entry points used, resolved once.
pub(super) struct Api {
    engine_create: unsafe extern "C" fn(*mut Handle, c_int, usize) -> Status,
    stream_create: unsafe extern "C" fn(*mut Handle, Handle, c_uint) -> Status,
    stream_wait: unsafe extern "C" fn(Handle) -> Status,
    stream_destroy: unsafe extern "C" fn(Handle) -> Status,
    md_create: unsafe extern "C" fn(*mut Handle, c_int, *const i64, c_int, *const i64) -> Status,
    md_create_tag: unsafe extern "C" fn(*mut Handle, c_int, *const i64, c_int, c_int) -> Status,
    md_clone: unsafe extern "C" fn(*mut Handle, Handle) -> Status,
    md_destroy: unsafe extern "C" fn(Handle) -> Status,
    md_size: unsafe extern "C" fn(Handle) -> usize,
    matmul_pd_create: PdCreate2,
    eltwise_pd_create:
        unsafe extern "C" fn(*mut Handle, Handle, c_int, c_int, Handle, Handle, f32, f32, Handle) -> Status,
    binary_pd_create: unsafe extern "C" fn(*mut Handle, Handle, c_int, Handle, Handle, Handle, Handle) -> Status,
    lnorm_pd_create:
        unsafe extern "C" fn(*mut Handle, Handle, c_int, Handle, Handle, Handle, f32, c_uint, Handle) -> Status,
    reorder_pd_create: unsafe extern "C" fn(*mut Handle, Handle, Handle, Handle, Handle, Handle) -> Status,
    pd_query_md: unsafe extern "C" fn(Handle, c_int, c_int) -> Handle,
    pd_destroy: unsafe extern "C" fn(Handle) -> Status,
    primitive_create: unsafe extern "C" fn(*mut Handle, Handle) -> Status,
    primitive_destroy: unsafe extern "C" fn(Handle) -> Status,
    primitive_execute: unsafe extern "C" fn(Handle, Handle, c_int, *const ExecArg) -> Status,
    memory_create: unsafe extern "C" fn(*mut Handle, Handle, Handle, *mut c_void) -> Status,
    memory_destroy: unsafe extern "C" fn(Handle) -> Status,
    attr_create: unsafe extern "C" fn(*mut Handle) -> Status,
    attr_destroy: unsafe extern "C" fn(Handle) -> Status,
    attr_set_scales_mask: unsafe extern "C" fn(Handle, c_int, c_int) -> Status,
}

fn check(what: &str, s: Status) -> Result<(), KernelError> {
    if s == 0 { Ok(()) } else { Err(KernelError::Failed(format!("oneDNN {what} returned status {s}"))) }
}

/// The library, its entry points and its CPU engine: one per process, shared by every
/// oneDNN executor.
pub struct Dnnl {
    api: Api,
    engine: Handle,
    lib: Arc<Loaded>,
}

// SAFETY: a oneDNN CPU engine may be used from several threads at once; every call makes its
// own stream and memory objects, and the API table is plain function pointers.
#[allow(unsafe_code)]
unsafe impl Send for Dnnl {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for Dnnl {}

impl std::fmt::Debug for Dnnl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dnnl").field("path", &self.lib.path).field("version", &self.lib.version).finish()
    }
}

impl Dnnl {
    /// Resolves the entry points of `lib` and creates its CPU engine.
    #[allow(unsafe_code)]
    pub fn new(lib: Arc<Loaded>) -> Result<Dnnl, String> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol's type is the signature declared in oneDNN's dnnl.h
                // (v3.2 to v3.14), written out in `Api`.
                *unsafe { lib.library().get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{}: {}", $name, layerzero_dylib::describe(&e)))?
            };
        }
        let api = Api {
            engine_create: sym!("dnnl_engine_create"),
            stream_create: sym!("dnnl_stream_create"),
            stream_wait: sym!("dnnl_stream_wait"),
            stream_destroy: sym!("dnnl_stream_destroy"),
            md_create: sym!("dnnl_memory_desc_create_with_strides"),
            md_create_tag: sym!("dnnl_memory_desc_create_with_tag"),
            md_clone: sym!("dnnl_memory_desc_clone"),
            md_destroy: sym!("dnnl_memory_desc_destroy"),
            md_size: sym!("dnnl_memory_desc_get_size"),
            matmul_pd_create: sym!("dnnl_matmul_primitive_desc_create"),
            eltwise_pd_create: sym!("dnnl_eltwise_forward_primitive_desc_create"),
            binary_pd_create: sym!("dnnl_binary_primitive_desc_create"),
            lnorm_pd_create: sym!("dnnl_layer_normalization_forward_primitive_desc_create"),
            reorder_pd_create: sym!("dnnl_reorder_primitive_desc_create"),
            pd_query_md: sym!("dnnl_primitive_desc_query_md"),
            pd_destroy: sym!("dnnl_primitive_desc_destroy"),
            primitive_create: sym!("dnnl_primitive_create"),
            primitive_destroy: sym!("dnnl_primitive_destroy"),
            primitive_execute: sym!("dnnl_primitive_execute"),
            memory_create: sym!("dnnl_memory_create"),
            memory_destroy: sym!("dnnl_memory_destroy"),
            attr_create: sym!("dnnl_primitive_attr_create"),
            attr_destroy: sym!("dnnl_primitive_attr_destroy"),
            attr_set_scales_mask: sym!("dnnl_primitive_attr_set_scales_mask"),
        };
        let mut engine: Handle = std::ptr::null_mut();
        // SAFETY: `engine` is a valid out-pointer; index 0 is the one CPU engine.
        let s = unsafe { (api.engine_create)(&mut engine, ENGINE_CPU, 0) };
        if s != 0 || engine.is_null() {
            return Err(format!("dnnl_engine_create(cpu) returned status {s}"));
        }
        Ok(Dnnl { api, engine, lib })
    }

    /// A memory descriptor with explicit strides (in elements; a `RUNTIME_DIM` dim is given
    /// at execution time).
    #[allow(unsafe_code)]
    pub(super) fn md(&self, dims: &[i64], strides: &[i64], dt: c_int) -> Result<Md<'_>, KernelError> {
        let (mut d, mut s): (Dims, Dims) = ([0; MAX_NDIMS], [0; MAX_NDIMS]);
        d[..dims.len()].copy_from_slice(dims);
        s[..strides.len()].copy_from_slice(strides);
        let mut md: Handle = std::ptr::null_mut();
        let n = c_int::try_from(dims.len()).unwrap_or(0);
        // SAFETY: both arrays hold MAX_NDIMS entries as `dnnl_dims_t` requires.
        check("memory_desc_create", unsafe { (self.api.md_create)(&mut md, n, d.as_ptr(), dt, s.as_ptr()) })?;
        Ok(Md { raw: md, dnnl: self })
    }

    /// A row-major descriptor `[rows, cols]` whose rows lie `ld` elements apart.
    pub(super) fn md2(&self, rows: i64, cols: i64, ld: i64, dt: c_int) -> Result<Md<'_>, KernelError> {
        self.md(&[rows, cols], &[ld, 1], dt)
    }

    /// A descriptor whose layout the primitive chooses (`dnnl_format_tag_any`).
    #[allow(unsafe_code)]
    pub(super) fn md_any(&self, dims: &[i64], dt: c_int) -> Result<Md<'_>, KernelError> {
        let mut d: Dims = [0; MAX_NDIMS];
        d[..dims.len()].copy_from_slice(dims);
        let mut md: Handle = std::ptr::null_mut();
        let n = c_int::try_from(dims.len()).unwrap_or(0);
        // SAFETY: `d` holds MAX_NDIMS entries.
        check("memory_desc_create_with_tag", unsafe { (self.api.md_create_tag)(&mut md, n, d.as_ptr(), dt, TAG_ANY) })?;
        Ok(Md { raw: md, dnnl: self })
    }

    /// An empty attribute set.
    #[allow(unsafe_code)]
    pub(super) fn attr(&self) -> Result<Attr<'_>, KernelError> {
        let mut raw: Handle = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check("primitive_attr_create", unsafe { (self.api.attr_create)(&mut raw) })?;
        Ok(Attr { raw, dnnl: self })
    }

    /// Creates (JIT-compiles) the primitive of a primitive descriptor made by `make`, keeping
    /// `mds` (the descriptors its arguments are bound by) and the weights layout it wants
    /// when `weights_md` is asked for. A descriptor `make` cannot create is
    /// [`KernelError::CompileFailed`]: oneDNN has no implementation for it here.
    #[allow(unsafe_code)]
    pub(super) fn create(
        &self,
        what: &str,
        mds: Vec<(c_int, Md<'_>)>,
        weights_md: bool,
        make: impl FnOnce(&mut Handle) -> Status,
    ) -> Result<Prim, KernelError> {
        let mut pd: Handle = std::ptr::null_mut();
        let s = make(&mut pd);
        if s != 0 || pd.is_null() {
            return Err(KernelError::CompileFailed(format!(
                "oneDNN has no {what} implementation for this shape and dtype on this CPU (status {s})"
            )));
        }
        let mut packed: Handle = std::ptr::null_mut();
        if weights_md {
            // SAFETY: `pd` is valid; the returned descriptor belongs to it, so it is cloned
            // before `pd` is destroyed.
            let md = unsafe { (self.api.pd_query_md)(pd, QUERY_WEIGHTS_MD, 0) };
            // SAFETY: `md` is the pd's valid descriptor; `packed` a valid out-pointer.
            if md.is_null() || unsafe { (self.api.md_clone)(&mut packed, md) } != 0 {
                packed = std::ptr::null_mut();
            }
        }
        let mut primitive: Handle = std::ptr::null_mut();
        // SAFETY: `pd` is a valid primitive descriptor; it is destroyed right after.
        let s = unsafe { (self.api.primitive_create)(&mut primitive, pd) };
        // SAFETY: created above; the primitive keeps what it needs.
        unsafe { (self.api.pd_destroy)(pd) };
        let prim = Prim {
            primitive,
            args: mds.into_iter().map(|(a, md)| (a, md.into_raw())).collect(),
            weights: packed,
            primitive_destroy: self.api.primitive_destroy,
            md_destroy: self.api.md_destroy,
        };
        if s != 0 || primitive.is_null() {
            return Err(KernelError::CompileFailed(format!(
                "oneDNN could not create the {what} primitive (status {s})"
            )));
        }
        Ok(prim)
    }

    /// Runs `p` with the buffers of its arguments (`(arg, pointer)`, matched to the
    /// descriptors it was created with; an argument whose descriptor is given in `runtime`
    /// uses that one instead: its runtime dims filled in, or a packed layout) and waits for it.
    ///
    /// # Safety
    /// Every pointer must address a buffer that the descriptor of its argument describes
    /// (the one in `runtime`, else the one the primitive was created with) and that lives
    /// until the call returns; input buffers are only read.
    #[allow(unsafe_code)]
    pub(super) unsafe fn execute(
        &self,
        p: &Prim,
        bind: &[(c_int, *mut c_void)],
        runtime: &[(c_int, Handle)],
    ) -> Result<(), KernelError> {
        let mut mems: smallvec::SmallVec<[ExecArg; 8]> = smallvec::SmallVec::new();
        let mut stream: Handle = std::ptr::null_mut();
        let result = (|| {
            for &(arg, ptr) in bind {
                let md = runtime
                    .iter()
                    .find(|(a, _)| *a == arg)
                    .map(|(_, md)| *md)
                    .or_else(|| p.args.iter().find(|(a, _)| *a == arg).map(|(_, md)| *md))
                    .ok_or_else(|| KernelError::Failed(format!("oneDNN argument {arg} has no descriptor")))?;
                let mut memory: Handle = std::ptr::null_mut();
                // SAFETY: the caller guarantees `ptr` fits `md` and outlives the call;
                // oneDNN does not take ownership of the buffer.
                check("memory_create", unsafe { (self.api.memory_create)(&mut memory, md, self.engine, ptr) })?;
                mems.push(ExecArg { arg, memory });
            }
            // SAFETY: a stream on the engine, destroyed below.
            check("stream_create", unsafe { (self.api.stream_create)(&mut stream, self.engine, STREAM_DEFAULT) })?;
            let n = c_int::try_from(mems.len()).unwrap_or(0);
            // SAFETY: every argument is a memory object created above for this primitive.
            check("primitive_execute", unsafe { (self.api.primitive_execute)(p.primitive, stream, n, mems.as_ptr()) })?;
            // SAFETY: waits for the work submitted on this stream.
            check("stream_wait", unsafe { (self.api.stream_wait)(stream) })
        })();
        for m in &mems {
            // SAFETY: created above; the data buffers stay the caller's.
            unsafe { (self.api.memory_destroy)(m.memory) };
        }
        if !stream.is_null() {
            // SAFETY: created above.
            unsafe { (self.api.stream_destroy)(stream) };
        }
        result
    }

    /// A copy of descriptor `md` that the caller owns (destroy it with [`Dnnl::md_destroy_fn`]).
    #[allow(unsafe_code)]
    pub(super) fn clone_md(&self, md: Handle) -> Result<Handle, KernelError> {
        let mut out: Handle = std::ptr::null_mut();
        // SAFETY: `md` is a valid descriptor; `out` a valid out-pointer.
        check("memory_desc_clone", unsafe { (self.api.md_clone)(&mut out, md) })?;
        Ok(out)
    }

    /// `dnnl_memory_desc_destroy`, for descriptors kept beyond an `Md`.
    pub(super) fn md_destroy_fn(&self) -> unsafe extern "C" fn(Handle) -> Status {
        self.api.md_destroy
    }

    /// Bytes a buffer of descriptor `md` takes.
    #[allow(unsafe_code)]
    pub(super) fn size_of(&self, md: Handle) -> usize {
        // SAFETY: `md` is a valid descriptor (callers pass ones they own).
        unsafe { (self.api.md_size)(md) }
    }

    /// Copies `src` (laid out as `from`) into `dst` (laid out as `to`) with a reorder primitive.
    ///
    /// # Safety
    /// `src` and `dst` must address buffers that `from` and `to` describe.
    #[allow(unsafe_code)]
    pub(super) unsafe fn reorder(
        &self,
        from: &Md<'_>,
        to: Handle,
        src: *mut c_void,
        dst: *mut c_void,
    ) -> Result<(), KernelError> {
        let mut to_owned: Handle = std::ptr::null_mut();
        // SAFETY: `to` is a valid descriptor; the clone is owned by the `Md` below.
        check("memory_desc_clone", unsafe { (self.api.md_clone)(&mut to_owned, to) })?;
        let to_md = Md { raw: to_owned, dnnl: self };
        let (from_raw, to_raw) = (from.raw, to_md.raw);
        let prim = self.create("reorder", Vec::new(), false, |pd| {
            // SAFETY: both descriptors are valid; the same CPU engine on both sides.
            unsafe {
                (self.api.reorder_pd_create)(pd, from_raw, self.engine, to_raw, self.engine, std::ptr::null_mut())
            }
        })?;
        let runtime = [(ARG_FROM, from.raw), (ARG_TO, to_md.raw)];
        // SAFETY: the caller guarantees the buffers fit the descriptors.
        unsafe { self.execute(&prim, &[(ARG_FROM, src), (ARG_TO, dst)], &runtime) }
    }

    /// `dnnl_matmul_primitive_desc_create`.
    #[allow(unsafe_code)]
    pub(super) fn matmul_pd(
        &self,
        pd: &mut Handle,
        src: Handle,
        wei: Handle,
        bias: Handle,
        dst: Handle,
        attr: Handle,
    ) -> Status {
        // SAFETY: valid descriptors (a null bias or attr means none), a valid out-pointer.
        unsafe { (self.api.matmul_pd_create)(pd, self.engine, src, wei, bias, dst, attr) }
    }

    /// `dnnl_eltwise_forward_primitive_desc_create` for inference.
    #[allow(unsafe_code)]
    pub(super) fn eltwise_pd(
        &self,
        pd: &mut Handle,
        alg: c_int,
        src: Handle,
        dst: Handle,
        alpha: f32,
        attr: Handle,
    ) -> Status {
        // SAFETY: valid descriptors (a null attr means none), a valid out-pointer.
        unsafe { (self.api.eltwise_pd_create)(pd, self.engine, FORWARD_INFERENCE, alg, src, dst, alpha, 0.0, attr) }
    }

    /// `dnnl_binary_primitive_desc_create` (no attributes).
    #[allow(unsafe_code)]
    pub(super) fn binary_pd(&self, pd: &mut Handle, alg: c_int, src0: Handle, src1: Handle, dst: Handle) -> Status {
        // SAFETY: valid descriptors, a valid out-pointer; a null attr means none.
        unsafe { (self.api.binary_pd_create)(pd, self.engine, alg, src0, src1, dst, std::ptr::null_mut()) }
    }

    /// `dnnl_layer_normalization_forward_primitive_desc_create` for inference (statistics
    /// computed inside, not returned).
    #[allow(unsafe_code)]
    pub(super) fn lnorm_pd(&self, pd: &mut Handle, src: Handle, dst: Handle, eps: f32, flags: c_uint) -> Status {
        // SAFETY: valid descriptors; a null statistics descriptor lets oneDNN derive it.
        unsafe {
            (self.api.lnorm_pd_create)(
                pd,
                self.engine,
                FORWARD_INFERENCE,
                src,
                dst,
                std::ptr::null_mut(),
                eps,
                flags,
                std::ptr::null_mut(),
            )
        }
    }
}

/// An owned memory descriptor.
pub(super) struct Md<'a> {
    raw: Handle,
    dnnl: &'a Dnnl,
}

impl Md<'_> {
    pub(super) fn raw(&self) -> Handle {
        self.raw
    }

    fn into_raw(self) -> Handle {
        let raw = self.raw;
        std::mem::forget(self);
        raw
    }
}

impl Drop for Md<'_> {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: created by memory_desc_create*/clone and owned by this value only.
        unsafe { (self.dnnl.api.md_destroy)(self.raw) };
    }
}

/// Primitive attributes (scales given at execution time).
pub(super) struct Attr<'a> {
    raw: Handle,
    dnnl: &'a Dnnl,
}

impl Attr<'_> {
    /// Scales of argument `arg` given at execution time, one per index of the dims in `mask`.
    #[allow(unsafe_code)]
    pub(super) fn scales(&mut self, arg: c_int, mask: c_int) -> Result<(), KernelError> {
        // SAFETY: a valid attribute.
        check("primitive_attr_set_scales_mask", unsafe { (self.dnnl.api.attr_set_scales_mask)(self.raw, arg, mask) })
    }

    /// The attribute handle, for a primitive descriptor.
    pub(super) fn raw(&self) -> Handle {
        self.raw
    }
}

impl Drop for Attr<'_> {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: created in `Dnnl::attr` and owned by this value only.
        unsafe { (self.dnnl.api.attr_destroy)(self.raw) };
    }
}

/// A created (JIT-compiled) primitive, the descriptors its arguments are bound by, and the
/// weights layout it wants; destroyed when the last user drops it.
pub(super) struct Prim {
    primitive: Handle,
    args: Vec<(c_int, Handle)>,
    weights: Handle,
    primitive_destroy: unsafe extern "C" fn(Handle) -> Status,
    md_destroy: unsafe extern "C" fn(Handle) -> Status,
}

impl Prim {
    /// The weights layout the primitive was created for (`format_tag_any` resolved), if asked.
    pub(super) fn weights_md(&self) -> Option<Handle> {
        (!self.weights.is_null()).then_some(self.weights)
    }
}

// SAFETY: a primitive is immutable once created and oneDNN allows executing it from several
// threads at once; the descriptors are read-only.
#[allow(unsafe_code)]
unsafe impl Send for Prim {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for Prim {}

impl Drop for Prim {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if !self.primitive.is_null() {
            // SAFETY: created by primitive_create; no call uses it any more.
            unsafe { (self.primitive_destroy)(self.primitive) };
        }
        for md in self.args.iter().map(|(_, m)| *m).chain(std::iter::once(self.weights)).filter(|m| !m.is_null()) {
            // SAFETY: owned by this primitive only.
            unsafe { (self.md_destroy)(md) };
        }
    }
}
