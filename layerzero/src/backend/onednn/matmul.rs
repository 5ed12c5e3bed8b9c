//! `onednn.linear.matmul`: `out = x · weightᵀ (+ bias)` through oneDNN's matmul primitive.
//! The C API's signatures were checked against `include/oneapi/dnnl/dnnl.h` of v3.2 and
//! v3.14. A primitive is created (JIT-compiled) once per shape and kept in a bounded cache;
//! the weight is read in place through a transposed memory descriptor, never copied.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use half::{bf16, f16};
use parking_lot::Mutex;

use super::loader::Loaded;
use crate::backend::cpu_reference::linear::{WeightLayout, weight_dims};
use crate::exec::args::{OpArgs, Outputs};
use crate::exec::executor::{Executor, KernelError};
use crate::model::dtype::DType;
use crate::tensor::{HostTensor, Storage};

type Handle = *mut c_void;
type Status = c_int;
const DNNL_MAX_NDIMS: usize = 12;
type Dims = [i64; DNNL_MAX_NDIMS];
/// `dnnl_engine_kind_t::dnnl_cpu`.
const ENGINE_CPU: c_int = 1;
/// `dnnl_stream_default_flags`.
const STREAM_DEFAULT: c_uint = 1;
/// `dnnl_data_type_t`.
const DT_F16: c_int = 1;
const DT_BF16: c_int = 2;
const DT_F32: c_int = 3;
/// `DNNL_ARG_*`.
const ARG_SRC: c_int = 1;
const ARG_DST: c_int = 17;
const ARG_WEIGHTS: c_int = 33;
const ARG_BIAS: c_int = 41;
/// Primitives kept (one per shape and dtype); beyond it a call creates its own and drops it.
const MAX_PRIMITIVES: usize = 256;

#[repr(C)]
struct ExecArg {
    arg: c_int,
    memory: Handle,
}

/// The entry points used, resolved once.
struct Api {
    engine_create: unsafe extern "C" fn(*mut Handle, c_int, usize) -> Status,
    stream_create: unsafe extern "C" fn(*mut Handle, Handle, c_uint) -> Status,
    stream_wait: unsafe extern "C" fn(Handle) -> Status,
    stream_destroy: unsafe extern "C" fn(Handle) -> Status,
    md_create: unsafe extern "C" fn(*mut Handle, c_int, *const i64, c_int, *const i64) -> Status,
    md_destroy: unsafe extern "C" fn(Handle) -> Status,
    matmul_pd_create: unsafe extern "C" fn(*mut Handle, Handle, Handle, Handle, Handle, Handle, Handle) -> Status,
    pd_destroy: unsafe extern "C" fn(Handle) -> Status,
    primitive_create: unsafe extern "C" fn(*mut Handle, Handle) -> Status,
    primitive_destroy: unsafe extern "C" fn(Handle) -> Status,
    primitive_execute: unsafe extern "C" fn(Handle, Handle, c_int, *const ExecArg) -> Status,
    memory_create: unsafe extern "C" fn(*mut Handle, Handle, Handle, *mut c_void) -> Status,
    memory_destroy: unsafe extern "C" fn(Handle) -> Status,
}

/// What a primitive is made for: m, k, n, NN weight, bias, dtype.
type Shape = (usize, usize, usize, bool, bool, DType);

/// One shape's primitive and the descriptors it was made from; destroyed when the last
/// user drops it (a primitive beyond the cache's bound lives for one call).
struct Prim {
    primitive: Handle,
    /// src, weights, bias (null when absent), dst.
    mds: [Handle; 4],
    primitive_destroy: unsafe extern "C" fn(Handle) -> Status,
    md_destroy: unsafe extern "C" fn(Handle) -> Status,
}

impl Drop for Prim {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if !self.primitive.is_null() {
            // SAFETY: created by primitive_create; no call uses it any more (its last `Arc`
            // is being dropped).
            unsafe { (self.primitive_destroy)(self.primitive) };
        }
        for md in self.mds.iter().filter(|m| !m.is_null()) {
            // SAFETY: created by memory_desc_create and owned by this primitive only.
            unsafe { (self.md_destroy)(*md) };
        }
    }
}

/// The matmul executor: the library, its CPU engine, and the primitive cache.
pub struct Matmul {
    api: Api,
    engine: Handle,
    prims: Mutex<HashMap<Shape, Arc<Prim>>>,
    _lib: Arc<Loaded>,
}

// SAFETY: a oneDNN engine and primitives may be used from several threads at once (each
// call makes its own stream and memory objects); the cache is behind a mutex.
#[allow(unsafe_code)]
unsafe impl Send for Matmul {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for Matmul {}
// SAFETY: a primitive is immutable once created and may be executed concurrently.
#[allow(unsafe_code)]
unsafe impl Send for Prim {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for Prim {}

fn check(what: &str, s: Status) -> Result<(), KernelError> {
    if s == 0 { Ok(()) } else { Err(KernelError::Failed(format!("oneDNN {what} returned status {s}"))) }
}

impl Matmul {
    /// Resolves the entry points of `lib` and creates its CPU engine.
    #[allow(unsafe_code)]
    pub fn new(lib: Arc<Loaded>) -> Result<Matmul, String> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol's type is the signature declared in oneDNN's dnnl.h /
                // dnnl_common.h (v3.2 to v3.14), written out in `Api`.
                *unsafe { lib.library().get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{}: {}", $name, crate::backend::library::describe(&e)))?
            };
        }
        let api = Api {
            engine_create: sym!("dnnl_engine_create"),
            stream_create: sym!("dnnl_stream_create"),
            stream_wait: sym!("dnnl_stream_wait"),
            stream_destroy: sym!("dnnl_stream_destroy"),
            md_create: sym!("dnnl_memory_desc_create_with_strides"),
            md_destroy: sym!("dnnl_memory_desc_destroy"),
            matmul_pd_create: sym!("dnnl_matmul_primitive_desc_create"),
            pd_destroy: sym!("dnnl_primitive_desc_destroy"),
            primitive_create: sym!("dnnl_primitive_create"),
            primitive_destroy: sym!("dnnl_primitive_destroy"),
            primitive_execute: sym!("dnnl_primitive_execute"),
            memory_create: sym!("dnnl_memory_create"),
            memory_destroy: sym!("dnnl_memory_destroy"),
        };
        let mut engine: Handle = std::ptr::null_mut();
        // SAFETY: `engine` is a valid out-pointer; index 0 is the one CPU engine.
        let s = unsafe { (api.engine_create)(&mut engine, ENGINE_CPU, 0) };
        if s != 0 || engine.is_null() {
            return Err(format!("dnnl_engine_create(cpu) returned status {s}"));
        }
        Ok(Matmul { api, engine, prims: Mutex::new(HashMap::new()), _lib: lib })
    }

    #[allow(unsafe_code)]
    fn md(&self, dims: &[i64], strides: &[i64], dt: c_int) -> Result<Handle, KernelError> {
        let (mut d, mut s): (Dims, Dims) = ([0; DNNL_MAX_NDIMS], [0; DNNL_MAX_NDIMS]);
        d[..dims.len()].copy_from_slice(dims);
        s[..strides.len()].copy_from_slice(strides);
        let mut md: Handle = std::ptr::null_mut();
        let n = c_int::try_from(dims.len()).unwrap_or(0);
        // SAFETY: both arrays hold DNNL_MAX_NDIMS entries as `dnnl_dims_t` requires.
        check("memory_desc_create", unsafe { (self.api.md_create)(&mut md, n, d.as_ptr(), dt, s.as_ptr()) })?;
        Ok(md)
    }

    #[allow(unsafe_code)]
    fn primitive(
        &self,
        m: usize,
        k: usize,
        n: usize,
        nn: bool,
        bias: bool,
        dtype: DType,
    ) -> Result<Arc<Prim>, KernelError> {
        let key = (m, k, n, nn, bias, dtype);
        if let Some(p) = self.prims.lock().get(&key) {
            return Ok(p.clone());
        }
        let dt = match dtype {
            DType::BF16 => DT_BF16,
            DType::F16 => DT_F16,
            _ => DT_F32,
        };
        let (mi, ki, ni) = (m as i64, k as i64, n as i64);
        let src = self.md(&[mi, ki], &[ki, 1], dt)?;
        // An NT weight is [n, k] row-major: read in place as [k, n] with strides (1, k); an
        // NN weight is [k, n] already.
        let wei = if nn { self.md(&[ki, ni], &[ni, 1], dt)? } else { self.md(&[ki, ni], &[1, ki], dt)? };
        let bia = if bias { self.md(&[1, ni], &[ni, 1], dt)? } else { std::ptr::null_mut() };
        let dst = self.md(&[mi, ni], &[ni, 1], dt)?;
        let mut made = Prim {
            primitive: std::ptr::null_mut(),
            mds: [src, wei, bia, dst],
            primitive_destroy: self.api.primitive_destroy,
            md_destroy: self.api.md_destroy,
        };
        let mut pd: Handle = std::ptr::null_mut();
        // SAFETY: the descriptors were created above; a null bias or attr means none.
        let s = unsafe { (self.api.matmul_pd_create)(&mut pd, self.engine, src, wei, bia, dst, std::ptr::null_mut()) };
        if s != 0 {
            return Err(KernelError::Unsupported(format!(
                "oneDNN has no matmul for {m}x{k}x{n} {dtype} on this CPU (status {s})"
            )));
        }
        // SAFETY: `pd` is a valid primitive descriptor; it is destroyed right after.
        let s = unsafe { (self.api.primitive_create)(&mut made.primitive, pd) };
        // SAFETY: created above; the primitive keeps what it needs.
        unsafe { (self.api.pd_destroy)(pd) };
        if s != 0 {
            return Err(KernelError::Failed(format!("oneDNN primitive_create returned status {s}")));
        }
        let made = Arc::new(made);
        let mut prims = self.prims.lock();
        if prims.len() < MAX_PRIMITIVES {
            prims.insert(key, made.clone());
        }
        Ok(made)
    }

    #[allow(unsafe_code)]
    fn execute(&self, p: &Prim, ptrs: [*mut c_void; 4]) -> Result<(), KernelError> {
        let mut mems: [Handle; 4] = [std::ptr::null_mut(); 4];
        let mut stream: Handle = std::ptr::null_mut();
        let result = (|| {
            for i in 0..4 {
                if p.mds[i].is_null() {
                    continue;
                }
                // SAFETY: the descriptor matches the buffer behind `ptrs[i]`, which outlives
                // the call (the caller holds the tensors); oneDNN does not take ownership.
                check("memory_create", unsafe {
                    (self.api.memory_create)(&mut mems[i], p.mds[i], self.engine, ptrs[i])
                })?;
            }
            // SAFETY: a stream on the engine, destroyed below.
            check("stream_create", unsafe { (self.api.stream_create)(&mut stream, self.engine, STREAM_DEFAULT) })?;
            let args: Vec<ExecArg> = [ARG_SRC, ARG_WEIGHTS, ARG_BIAS, ARG_DST]
                .into_iter()
                .zip(mems)
                .filter(|(_, m)| !m.is_null())
                .map(|(arg, memory)| ExecArg { arg, memory })
                .collect();
            let nargs = c_int::try_from(args.len()).unwrap_or(0);
            // SAFETY: every argument is a memory object created above for this primitive.
            check("primitive_execute", unsafe {
                (self.api.primitive_execute)(p.primitive, stream, nargs, args.as_ptr())
            })?;
            // SAFETY: waits for the work submitted on this stream.
            check("stream_wait", unsafe { (self.api.stream_wait)(stream) })
        })();
        for m in mems.iter().filter(|m| !m.is_null()) {
            // SAFETY: created above; the data buffers stay the caller's.
            unsafe { (self.api.memory_destroy)(*m) };
        }
        if !stream.is_null() {
            // SAFETY: created above.
            unsafe { (self.api.stream_destroy)(stream) };
        }
        result
    }
}

/// A contiguous tensor's elements as a raw pointer (read-only use by oneDNN for inputs).
fn input_ptr(t: &HostTensor, dtype: DType) -> Result<*mut c_void, KernelError> {
    if !t.is_contiguous() || t.dtype() != dtype {
        return Err(KernelError::Unsupported(format!("oneDNN matmul takes contiguous {dtype} tensors")));
    }
    let off = t.offset();
    let p = match t.storage() {
        Storage::F32(v) => v.get(off..).map(|s| s.as_ptr().cast::<c_void>()),
        Storage::BF16(v) => v.get(off..).map(|s| s.as_ptr().cast::<c_void>()),
        Storage::F16(v) => v.get(off..).map(|s| s.as_ptr().cast::<c_void>()),
        _ => None,
    };
    p.map(|p| p.cast_mut())
        .ok_or_else(|| KernelError::Unsupported(format!("oneDNN matmul takes f32 or bf16, not {dtype}")))
}

impl Executor for Matmul {
    fn run(&self, args: &OpArgs) -> Result<Outputs, KernelError> {
        let OpArgs::Linear(a) = args else {
            return Err(KernelError::Unsupported("onednn.linear.matmul runs linear only".to_owned()));
        };
        let dtype = a.x.dtype();
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(KernelError::Unsupported(format!("onednn.linear.matmul runs f32, bf16 and f16, not {dtype}")));
        }
        let xs = a.x.shape();
        let &[m, k] = xs else {
            return Err(KernelError::Unsupported(format!("onednn.linear.matmul takes a rank-2 x, not {xs:?}")));
        };
        let (layout, n) = weight_dims("weight", &a.weight, k)?;
        if let Some(b) = &a.bias
            && b.shape() != [n]
        {
            return Err(KernelError::InvalidInput(format!("tensor `bias` has shape {:?}; expected [{n}]", b.shape())));
        }
        let prim = self.primitive(m, k, n, layout == WeightLayout::Nn, a.bias.is_some(), dtype)?;
        let bias = a.bias.as_ref().map(|b| input_ptr(b, dtype)).transpose()?.unwrap_or(std::ptr::null_mut());
        let (x, w) = (input_ptr(&a.x, dtype)?, input_ptr(&a.weight, dtype)?);
        let out = if dtype == DType::BF16 {
            let mut v = vec![bf16::ZERO; m * n];
            self.execute(&prim, [x, w, bias, v.as_mut_ptr().cast::<c_void>()])?;
            HostTensor::new(Storage::BF16(v.into()), &[m, n])
        } else if dtype == DType::F16 {
            let mut v = vec![f16::ZERO; m * n];
            self.execute(&prim, [x, w, bias, v.as_mut_ptr().cast::<c_void>()])?;
            HostTensor::new(Storage::F16(v.into()), &[m, n])
        } else {
            let mut v = vec![0.0f32; m * n];
            self.execute(&prim, [x, w, bias, v.as_mut_ptr().cast::<c_void>()])?;
            HostTensor::from_f32(&[m, n], v)
        }
        .map_err(|e| KernelError::Failed(e.to_string()))?;
        let mut o = Outputs::new();
        o.insert("out", out);
        Ok(o)
    }
}
