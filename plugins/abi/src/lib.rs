//! The C ABI a LayerZero plugin exports (version [`ABI_VERSION`]); `layerzero_plugin.h` says the
//! same in C. A plugin is a shared library with three symbols:
//!
//! - `uint32_t lz_plugin_abi_version(void)`: the ABI it speaks;
//! - `const char *lz_plugin_capabilities(void)`: its capabilities, a NUL-terminated JSON
//!   document of the capabilities schema (one backend), alive as long as the library is loaded;
//! - `lz_kernel_fn lz_plugin_kernel(const char *kernel_id)`: the entry point of a kernel it
//!   declares, or NULL.
//!
//! A kernel reads its inputs as raw tensor descriptors ([`Tensor`]: pointer, dtype, shape,
//! strides in elements, device), its attributes as JSON, and asks the host for each output
//! buffer through `alloc` (the host owns every buffer). It returns 0, or an error code with a
//! message written into `error`. No panic or exception may cross the ABI: a plugin catches its
//! own (the host cannot unwind through foreign frames; a plugin that aborts takes the process
//! with it, which is what running a backend isolated in a worker process is for).

#![no_std]

use core::ffi::{c_char, c_void};

/// The ABI version this crate describes.
pub const ABI_VERSION: u32 = 1;

/// `uint32_t lz_plugin_abi_version(void)`.
pub const SYMBOL_ABI_VERSION: &[u8] = b"lz_plugin_abi_version\0";
/// `const char *lz_plugin_capabilities(void)`.
pub const SYMBOL_CAPABILITIES: &[u8] = b"lz_plugin_capabilities\0";
/// `lz_kernel_fn lz_plugin_kernel(const char *kernel_id)`.
pub const SYMBOL_KERNEL: &[u8] = b"lz_plugin_kernel\0";

/// Element types, by code (stable: codes are never reused).
pub mod dtype {
    /// 32-bit float.
    pub const F32: u32 = 0;
    /// 16-bit float (IEEE half).
    pub const F16: u32 = 1;
    /// bfloat16.
    pub const BF16: u32 = 2;
    /// float8 e4m3 (fn).
    pub const FP8_E4M3: u32 = 3;
    /// float8 e5m2.
    pub const FP8_E5M2: u32 = 4;
    /// 8-bit signed integer.
    pub const I8: u32 = 5;
    /// 32-bit signed integer.
    pub const I32: u32 = 6;
    /// 64-bit signed integer.
    pub const I64: u32 = 7;
    /// One byte per element, 0 or 1.
    pub const BOOL: u32 = 8;
}

/// Device kinds, by code.
pub mod device {
    /// Host memory.
    pub const CPU: u32 = 0;
    /// An NVIDIA GPU's memory.
    pub const CUDA: u32 = 1;
    /// An AMD GPU's memory.
    pub const ROCM: u32 = 2;
}

/// Return codes of a kernel.
pub mod status {
    /// The outputs are written.
    pub const OK: i32 = 0;
    /// The inputs or attributes are not what the kernel takes (message in `error`).
    pub const INVALID_INPUT: i32 = 1;
    /// The kernel failed (message in `error`).
    pub const FAILED: i32 = 2;
    /// The kernel panicked or threw and caught it (message in `error`).
    pub const PANICKED: i32 = 3;
}

/// A tensor as the ABI passes it: `ndim` sizes and strides (in elements, not bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Tensor {
    /// The first element.
    pub data: *mut c_void,
    /// A [`dtype`] code.
    pub dtype: u32,
    /// A [`device`] code.
    pub device: u32,
    /// The device's index (0 on the CPU).
    pub device_index: i32,
    /// Number of dimensions.
    pub ndim: u32,
    /// `ndim` sizes.
    pub shape: *const i64,
    /// `ndim` strides, in elements.
    pub strides: *const i64,
}

/// A named input (`x`, `residual`, `weight`, ... as the op names them).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Arg {
    /// NUL-terminated argument name.
    pub name: *const c_char,
    /// The tensor.
    pub tensor: Tensor,
}

/// Asks the host for the output `name` of `dtype` and `shape` (`ndim` sizes); on 0 `out`
/// describes a contiguous buffer the kernel writes. The buffer is the host's.
pub type AllocFn = unsafe extern "C" fn(
    host: *mut c_void,
    name: *const c_char,
    dtype: u32,
    ndim: u32,
    shape: *const i64,
    out: *mut Tensor,
) -> i32;

/// A kernel: `n_inputs` inputs, the attributes as NUL-terminated JSON (an object), the host's
/// allocator for the outputs, and `error_len` bytes for a NUL-terminated message. Returns a
/// [`status`] code.
pub type KernelFn = unsafe extern "C" fn(
    inputs: *const Arg,
    n_inputs: usize,
    attrs_json: *const c_char,
    host: *mut c_void,
    alloc: AllocFn,
    error: *mut c_char,
    error_len: usize,
) -> i32;

/// `uint32_t lz_plugin_abi_version(void)`.
pub type AbiVersionFn = unsafe extern "C" fn() -> u32;
/// `const char *lz_plugin_capabilities(void)`.
pub type CapabilitiesFn = unsafe extern "C" fn() -> *const c_char;
/// `lz_kernel_fn lz_plugin_kernel(const char *kernel_id)` (NULL: no such kernel).
pub type KernelLookupFn = unsafe extern "C" fn(kernel_id: *const c_char) -> Option<KernelFn>;
