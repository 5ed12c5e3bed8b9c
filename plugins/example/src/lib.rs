//! An example LayerZero plugin over the C ABI (`layerzero-plugin-abi`): one kernel,
//! `fusedops.rms_norm.add_fused`, a residual add fused with RMSNorm in f32:
//! `s = x + residual` (returned as `residual_out`), `out = s / sqrt(mean(s^2) + eps) * weight`.
//!
//! It keeps the ABI's rule: no panic crosses it. Every entry point catches its own and returns
//! `PANICKED` with the message.

use std::ffi::{CStr, c_char, c_void};

use layerzero_plugin_abi as abi;

static CAPABILITIES: &str = concat!(include_str!("../capabilities.json"), "\0");

/// `uint32_t lz_plugin_abi_version(void)`.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub extern "C" fn lz_plugin_abi_version() -> u32 {
    abi::ABI_VERSION
}

/// `const char *lz_plugin_capabilities(void)`: static, NUL-terminated.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub extern "C" fn lz_plugin_capabilities() -> *const c_char {
    CAPABILITIES.as_ptr().cast()
}

/// `lz_kernel_fn lz_plugin_kernel(const char *id)`.
///
/// # Safety
///
/// `id` is NULL or a NUL-terminated string.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lz_plugin_kernel(id: *const c_char) -> Option<abi::KernelFn> {
    if id.is_null() {
        return None;
    }
    // SAFETY: NUL-terminated by the caller's contract.
    let id = unsafe { CStr::from_ptr(id) };
    (id.to_bytes() == b"fusedops.rms_norm.add_fused").then_some(add_rms_norm as abi::KernelFn)
}

/// A kernel's failure: its status code and message.
struct Failure(i32, String);

fn invalid(m: impl Into<String>) -> Failure {
    Failure(abi::status::INVALID_INPUT, m.into())
}

/// An input as rows of `hidden` f32 (contiguous).
struct Rows<'a> {
    data: &'a [f32],
    shape: Vec<i64>,
}

/// The f32 tensor `t`, checked contiguous.
///
/// # Safety
///
/// `t` describes a live tensor as the ABI says (data, `ndim` sizes and strides).
#[allow(unsafe_code)]
unsafe fn rows<'a>(name: &str, t: &abi::Tensor) -> Result<Rows<'a>, Failure> {
    if t.dtype != abi::dtype::F32 || t.device != abi::device::CPU {
        return Err(invalid(format!("{name}: only f32 CPU tensors (dtype code {}, device {})", t.dtype, t.device)));
    }
    // SAFETY: `ndim` sizes and strides, by the caller's contract.
    let (shape, strides) = unsafe {
        (
            std::slice::from_raw_parts(t.shape, t.ndim as usize).to_vec(),
            std::slice::from_raw_parts(t.strides, t.ndim as usize),
        )
    };
    let mut expect = 1i64;
    for (d, s) in shape.iter().zip(strides).rev() {
        if *d > 1 && *s != expect {
            return Err(invalid(format!("{name}: strides {strides:?} of shape {shape:?} are not contiguous")));
        }
        expect *= d;
    }
    let n = usize::try_from(shape.iter().product::<i64>()).map_err(|_| invalid(format!("{name}: bad shape")))?;
    // SAFETY: a contiguous f32 tensor of `n` elements at `data`, alive for the call.
    let data = unsafe { std::slice::from_raw_parts(t.data.cast::<f32>(), n) };
    Ok(Rows { data, shape })
}

/// The fused kernel, panics caught.
#[allow(unsafe_code)]
unsafe extern "C" fn add_rms_norm(
    inputs: *const abi::Arg,
    n_inputs: usize,
    attrs_json: *const c_char,
    host: *mut c_void,
    alloc: abi::AllocFn,
    error: *mut c_char,
    error_len: usize,
) -> i32 {
    let result = std::panic::catch_unwind(|| {
        // SAFETY: the host's arguments, as the ABI describes them, alive for this call.
        unsafe { run(inputs, n_inputs, attrs_json, host, alloc) }
    });
    let failure = match result {
        Ok(Ok(())) => return abi::status::OK,
        Ok(Err(f)) => f,
        Err(p) => {
            let text = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
            Failure(abi::status::PANICKED, format!("panicked: {}", text.unwrap_or_default()))
        }
    };
    if !error.is_null() && error_len > 0 {
        let bytes = failure.1.as_bytes();
        let n = bytes.len().min(error_len - 1);
        // SAFETY: `error` holds `error_len` bytes (the ABI); `n + 1 <= error_len`.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), error.cast::<u8>(), n);
            *error.add(n) = 0;
        }
    }
    failure.0
}

/// # Safety
///
/// The ABI's contract for a kernel call.
#[allow(unsafe_code)]
unsafe fn run(
    inputs: *const abi::Arg,
    n_inputs: usize,
    attrs_json: *const c_char,
    host: *mut c_void,
    alloc: abi::AllocFn,
) -> Result<(), Failure> {
    // SAFETY: `n_inputs` arguments with NUL-terminated names, per the ABI.
    let args = unsafe { std::slice::from_raw_parts(inputs, n_inputs) };
    let find = |want: &str| {
        // SAFETY: each name is NUL-terminated (the ABI).
        args.iter().find(|a| unsafe { CStr::from_ptr(a.name) }.to_bytes() == want.as_bytes())
    };
    let x = find("x").ok_or_else(|| invalid("input x is missing"))?;
    let w = find("weight").ok_or_else(|| invalid("input weight is missing"))?;
    // SAFETY: live tensors described by the ABI.
    let (x, w) = unsafe { (rows("x", &x.tensor)?, rows("weight", &w.tensor)?) };
    // SAFETY: as above.
    let residual = find("residual").map(|r| unsafe { rows("residual", &r.tensor) }).transpose()?;
    let hidden = *x.shape.last().ok_or_else(|| invalid("x has no dims"))?;
    if w.shape != [hidden] || residual.as_ref().is_some_and(|r| r.shape != x.shape) {
        return Err(invalid(format!("weight {:?} / residual must match x {:?}", w.shape, x.shape)));
    }
    // SAFETY: NUL-terminated JSON (the ABI).
    let attrs = unsafe { CStr::from_ptr(attrs_json) }.to_string_lossy();
    let attrs: serde_json::Value = serde_json::from_str(&attrs).map_err(|e| invalid(format!("attrs: {e}")))?;
    let eps = attrs.get("eps").and_then(serde_json::Value::as_f64).unwrap_or(1e-6) as f32;
    // An invariant of the math, kept as an assertion: a panic is caught at the entry point and
    // returned as the ABI's PANICKED status, never unwound into the host.
    assert!(eps.is_finite() && eps >= 0.0, "eps must be finite and non-negative, got {eps}");
    let out = output(host, alloc, "out", &x.shape)?;
    let sum = residual.as_ref().map(|_| output(host, alloc, "residual_out", &x.shape)).transpose()?;
    let h = usize::try_from(hidden).map_err(|_| invalid("bad hidden size"))?.max(1);
    let mut s = vec![0f32; h];
    for (row, chunk) in x.data.chunks_exact(h).enumerate() {
        for (i, v) in chunk.iter().enumerate() {
            s[i] = v + residual.as_ref().map_or(0.0, |r| r.data[row * h + i]);
        }
        let mean = s.iter().map(|v| v * v).sum::<f32>() / h as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (i, (v, g)) in s.iter().zip(w.data).enumerate() {
            // SAFETY: `out` and `sum` are buffers of x's shape the host allocated for us.
            unsafe {
                *out.add(row * h + i) = v * scale * g;
                if let Some(p) = sum {
                    *p.add(row * h + i) = *v;
                }
            }
        }
    }
    Ok(())
}

/// Asks the host for an f32 output of `shape`.
#[allow(unsafe_code)]
fn output(host: *mut c_void, alloc: abi::AllocFn, name: &str, shape: &[i64]) -> Result<*mut f32, Failure> {
    let cname = std::ffi::CString::new(name).map_err(|_| invalid("bad output name"))?;
    let mut t = std::mem::MaybeUninit::<abi::Tensor>::uninit();
    // SAFETY: the host's allocator with its own `host` pointer, a NUL-terminated name, a shape
    // of `shape.len()` sizes and a descriptor to fill.
    let status =
        unsafe { alloc(host, cname.as_ptr(), abi::dtype::F32, shape.len() as u32, shape.as_ptr(), t.as_mut_ptr()) };
    if status != abi::status::OK {
        return Err(Failure(abi::status::FAILED, format!("the host refused output {name}: status {status}")));
    }
    // SAFETY: status OK: the host filled the descriptor.
    Ok(unsafe { t.assume_init() }.data.cast())
}
