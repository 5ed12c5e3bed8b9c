//! NVIDIA GPU probing through the CUDA driver API (`cudarc`, dynamic loading).
//!
//! With no driver installed this returns `Err` quietly: the library's presence is checked
//! with a plain `dlopen` before any driver function is touched (cudarc panics when a driver
//! function is called without the library), and every per-device read runs inside
//! `catch_unwind` so that a driver too old for a symbol cannot take the host down.
//!
//! ## Peak throughput estimate
//!
//! `peak TFLOP/s = SMs x max SM clock (CU_DEVICE_ATTRIBUTE_CLOCK_RATE) x per-SM rate`, with
//! these dense (non-sparse) per-SM rates in FLOP (OP for int8) per clock:
//!
//! | cc        | arch                  | f32 (non-tensor) | f16 / bf16 tensor | fp8 tensor | i8 tensor |
//! |-----------|-----------------------|-----------------:|------------------:|-----------:|----------:|
//! | 7.0, 7.2  | Volta                 | 128              | 1024 / -          | -          | -         |
//! | 7.5       | Turing                | 128              | 1024 / -          | -          | 2048      |
//! | 8.0       | A100                  | 128              | 2048 / 2048       | -          | 4096      |
//! | 8.6, 8.7  | GA10x, Orin           | 256              | 1024 / 1024       | -          | 2048      |
//! | 8.9       | Ada                   | 256              | 1024 / 1024       | 2048       | 2048      |
//! | 9.0       | Hopper                | 256              | 4096 / 4096       | 8192       | 8192      |
//! | 10.x      | Blackwell datacenter  | 256              | 8192 / 8192       | 16384      | 16384     |
//! | 12.x      | Blackwell consumer    | 256              | 1024 / 1024       | 2048       | 2048      |
//!
//! Tensor rates are with FP32 accumulation. GeForce parts run FP16/BF16/FP8 with FP32
//! accumulation at half rate, so a device whose name contains "GeForce" gets those halved
//! (int8 stays). Checks against the spec sheets: T4 40x128x1.59 GHz = 8.1 f32; A100
//! 108x2048x1.41 = 312 f16; H100 SXM 132x256x1.98 = 67 f32, 132x4096x1.83 = 989 f16 (the
//! estimate uses the max clock, so it is an upper bound within ~10%). An unknown
//! architecture gets only an f32 figure (256 per SM) and a note.
//!
//! Memory bandwidth = 2 (double data rate) x memory clock x bus width / 8 (H100 SXM:
//! 2 x 2619 MHz x 5120 bit / 8 = 3352 GB/s; RTX 4090: 2 x 10501 MHz x 384 / 8 = 1008 GB/s).

use std::collections::BTreeMap;
use std::panic;

use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUdevice_attribute;

use layerzero_core::exec::executor::panic_text;
use layerzero_core::hardware::profile::{ComputeCapability, CpuFeatures, DeviceProfile};
use layerzero_core::model::device::DeviceKind;
use layerzero_core::model::dtype::DType;

/// Clock assumed when the driver does not report one (GHz).
const DEFAULT_SM_CLOCK_GHZ: f64 = 1.5;

/// Dense per-SM, per-clock rates of one architecture (see the module table).
#[derive(Debug, Clone, Copy, PartialEq)]
struct SmRates {
    f32: f64,
    f16: Option<f64>,
    bf16: Option<f64>,
    fp8: Option<f64>,
    i8: Option<f64>,
}

/// The per-SM rates for a compute capability; `None` for an architecture this table does
/// not know.
fn sm_rates(cc: ComputeCapability) -> Option<SmRates> {
    let r = |f32: f64, f16: f64, bf16: bool, fp8: bool, i8: Option<f64>| SmRates {
        f32,
        f16: Some(f16),
        bf16: bf16.then_some(f16),
        fp8: fp8.then_some(f16 * 2.0),
        i8,
    };
    Some(match (cc.major, cc.minor) {
        (7, 0) | (7, 2) => r(128.0, 1024.0, false, false, None),
        (7, 5) => r(128.0, 1024.0, false, false, Some(2048.0)),
        (8, 0) => r(128.0, 2048.0, true, false, Some(4096.0)),
        (8, 6) | (8, 7) => r(256.0, 1024.0, true, false, Some(2048.0)),
        (8, 9) => r(256.0, 1024.0, true, true, Some(2048.0)),
        (9, 0) => r(256.0, 4096.0, true, true, Some(8192.0)),
        (10, _) => r(256.0, 8192.0, true, true, Some(16384.0)),
        (12, _) => r(256.0, 1024.0, true, true, Some(2048.0)),
        _ => return None,
    })
}

/// Peak TFLOP/s per dtype for `sms` SMs at `clock_ghz`.
fn peak_tflops(
    cc: ComputeCapability,
    name: &str,
    sms: u32,
    clock_ghz: f64,
    notes: &mut Vec<String>,
) -> BTreeMap<DType, f64> {
    let per_clock = f64::from(sms) * clock_ghz * 1e9 / 1e12;
    let round = |x: f64| (x * 10.0).round() / 10.0;
    let mut out = BTreeMap::new();
    let Some(rates) = sm_rates(cc) else {
        notes.push(format!(
            "{name}: compute capability {cc} is not in the per-SM throughput table; only an f32 estimate (256 FLOP/clock/SM) is given"
        ));
        out.insert(DType::F32, round(per_clock * 256.0));
        return out;
    };
    let tensor_scale = if name.contains("GeForce") { 0.5 } else { 1.0 };
    out.insert(DType::F32, round(per_clock * rates.f32));
    if let Some(v) = rates.f16 {
        out.insert(DType::F16, round(per_clock * v * tensor_scale));
    }
    if let Some(v) = rates.bf16 {
        out.insert(DType::BF16, round(per_clock * v * tensor_scale));
    }
    if let Some(v) = rates.fp8 {
        out.insert(DType::Fp8E4M3, round(per_clock * v * tensor_scale));
        out.insert(DType::Fp8E5M2, round(per_clock * v * tensor_scale));
    }
    if let Some(v) = rates.i8 {
        out.insert(DType::I8, round(per_clock * v));
    }
    out
}

/// True when the CUDA driver library (libcuda) can be loaded.
#[allow(unsafe_code)]
fn driver_library_present() -> bool {
    // SAFETY: `is_culib_present` only tries `dlopen` on the candidate names of the CUDA
    // driver library and drops each handle; it calls no driver function. Loading libcuda
    // runs its initialisers, which are designed to run in any host process.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Reads one device; `Err` names what failed.
fn read_device(ordinal: usize, notes: &mut Vec<String>) -> Result<DeviceProfile, String> {
    let ctx = CudaContext::new(ordinal).map_err(|e| format!("cuda:{ordinal}: cannot create a context: {e}"))?;
    let attr = |a: CUdevice_attribute| ctx.attribute(a).ok().filter(|v| *v > 0).map(|v| v as u64);
    let name = ctx.name().unwrap_or_else(|_| format!("NVIDIA GPU {ordinal}"));
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| format!("cuda:{ordinal} ({name}): cannot read the compute capability: {e}"))?;
    let cc = ComputeCapability::new(major.max(0) as u32, minor.max(0) as u32);
    let sms = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap_or(0);
    let sms = u32::try_from(sms).unwrap_or(u32::MAX);
    let memory_bytes = ctx.total_mem().map(|b| b as u64).unwrap_or(0);

    let clock_ghz = match attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE) {
        Some(khz) => khz as f64 / 1e6,
        None => {
            notes.push(format!("cuda:{ordinal} ({name}): SM clock not reported; assuming {DEFAULT_SM_CLOCK_GHZ} GHz"));
            DEFAULT_SM_CLOCK_GHZ
        }
    };
    let mem_clock_khz = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
    let bus_bits = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
    let memory_bandwidth_gbps = match (mem_clock_khz, bus_bits) {
        (Some(khz), Some(bits)) => ((2.0 * khz as f64 * 1e3 * bits as f64 / 8.0) / 1e9 * 10.0).round() / 10.0,
        _ => {
            notes.push(format!(
                "cuda:{ordinal} ({name}): memory clock or bus width not reported; bandwidth unknown (0), use a named profile"
            ));
            0.0
        }
    };
    let l2_bytes = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
    let peak = peak_tflops(cc, &name, sms, clock_ghz, notes);
    notes.push(format!(
        "cuda:{ordinal} ({name}): sm{}{}, {sms} SMs at {clock_ghz:.2} GHz; peaks estimated from the per-SM table in backend/cuda/probe.rs",
        cc.major, cc.minor
    ));
    Ok(DeviceProfile {
        kind: DeviceKind::Cuda,
        vendor: "nvidia".to_owned(),
        name,
        compute_capability: Some(cc),
        gfx: None,
        isa: CpuFeatures::empty(),
        driver: None,
        runtime: None,
        l2_bytes,
        memory_bytes,
        memory_bandwidth_gbps,
        compute_units: sms,
        peak_tflops: peak,
    })
}

/// The NVIDIA GPUs of this host with notes on what was estimated or skipped. `Err(reason)`
/// when there is no driver, the driver fails, or there is no device.
pub fn probe_gpus_with_notes() -> Result<(Vec<DeviceProfile>, Vec<String>), String> {
    if !driver_library_present() {
        return Err("no NVIDIA driver (libcuda not found)".to_owned());
    }
    let count = match panic::catch_unwind(CudaContext::device_count) {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => return Err(format!("NVIDIA driver present but unusable: {e}")),
        Err(p) => return Err(format!("NVIDIA driver present but unusable: {}", panic_text(p.as_ref()))),
    };
    if count <= 0 {
        return Err("NVIDIA driver present but no CUDA device".to_owned());
    }
    let (mut devices, notes) = super::super::gpus::read_all("cuda", count as usize, read_device)?;
    let driver = driver_version();
    let mut notes = notes;
    let runtime = match runtime_version() {
        Ok(v) => Some(v),
        Err(why) => {
            notes.push(format!("CUDA runtime version not read: {why}"));
            None
        }
    };
    for d in &mut devices {
        d.driver.clone_from(&driver);
        d.runtime.clone_from(&runtime);
    }
    Ok((devices, notes))
}

/// Reads the free and total memory of CUDA device `ordinal` (`cuMemGetInfo`), in bytes: the
/// live headroom selection checks a GPU request's workspace against. The reader holds the
/// device's primary context for as long as it lives (retaining it per read would create and
/// tear it down each time). `Err(reason)` without a driver or device.
pub fn free_memory_reader(ordinal: usize) -> Result<FreeMemory, String> {
    if !driver_library_present() {
        return Err("no NVIDIA driver (libcuda not found)".to_owned());
    }
    let made = panic::catch_unwind(|| CudaContext::new(ordinal));
    match made {
        Ok(Ok(ctx)) => Ok(FreeMemory { ctx, ordinal }),
        Ok(Err(e)) => Err(format!("cuda:{ordinal}: cannot create a context: {e}")),
        Err(p) => Err(format!("cuda:{ordinal}: creating a context panicked: {}", panic_text(p.as_ref()))),
    }
}

/// A device's free memory, read on demand (see [`free_memory_reader`]).
pub struct FreeMemory {
    ctx: std::sync::Arc<CudaContext>,
    ordinal: usize,
}

impl FreeMemory {
    /// `(free, total)` bytes now.
    pub fn read(&self) -> Result<(u64, u64), String> {
        let ordinal = self.ordinal;
        match panic::catch_unwind(panic::AssertUnwindSafe(|| self.ctx.mem_get_info())) {
            Ok(Ok((free, total))) => Ok((free as u64, total as u64)),
            Ok(Err(e)) => Err(format!("cuda:{ordinal}: cuMemGetInfo: {e}")),
            Err(p) => Err(format!("cuda:{ordinal}: reading free memory panicked: {}", panic_text(p.as_ref()))),
        }
    }
}

/// Where the CUDA runtime library is looked for: by soname first (a process that imported
/// torch has its `libcudart` loaded already, found by name), then the toolkit's folder.
const CUDART: [&str; 6] = [
    "libcudart.so.13",
    "libcudart.so.12",
    "libcudart.so.11.0",
    "libcudart.so",
    "/usr/local/cuda/lib64/libcudart.so",
    "/usr/local/cuda/targets/x86_64-linux/lib/libcudart.so",
];

/// The version of the CUDA runtime this process loads (`cudaRuntimeGetVersion`), as
/// `cudart MAJOR.MINOR`; `Err` names the libraries tried.
#[allow(unsafe_code)]
pub fn runtime_version() -> Result<String, String> {
    type GetVersion = unsafe extern "C" fn(*mut std::ffi::c_int) -> std::ffi::c_int;
    for name in CUDART {
        // SAFETY: loading the CUDA runtime runs its initialisers, which are made to run in
        // any host process; the library is kept loaded (leaked) so that no call into it can
        // outlive it.
        let Ok(lib) = (unsafe { libloading::Library::new(name) }) else { continue };
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        // SAFETY: `cudaRuntimeGetVersion(int*)` has this signature in every CUDA release.
        let Ok(get) = (unsafe { lib.get::<GetVersion>(b"cudaRuntimeGetVersion\0") }) else { continue };
        let mut v: std::ffi::c_int = 0;
        // SAFETY: the function writes one int through a pointer to a live local.
        let rc = unsafe { get(&mut v) };
        if rc == 0 && v > 0 {
            return Ok(format!("cudart {}.{}", v / 1000, (v % 1000) / 10));
        }
    }
    Err(format!("no CUDA runtime library could be loaded (tried {})", CUDART.join(", ")))
}

/// The CUDA version the driver implements (`cuDriverGetVersion`: 12040 is `cuda 12.4`), the
/// profile's `driver`; `None` when the driver does not say.
#[allow(unsafe_code)]
fn driver_version() -> Option<String> {
    let mut version: std::ffi::c_int = 0;
    // SAFETY: called only after `driver_library_present` found libcuda (so the symbol loads);
    // the function writes one int through the pointer, which points to a live local.
    let read = panic::catch_unwind(panic::AssertUnwindSafe(|| unsafe {
        cudarc::driver::sys::cuDriverGetVersion(&mut version)
    }));
    match read {
        Ok(cudarc::driver::sys::CUresult::CUDA_SUCCESS) if version > 0 => Some(cuda_version_text(version)),
        _ => None,
    }
}

/// `cuda MAJOR.MINOR` of a `cuDriverGetVersion` number (1000 x major + 10 x minor).
fn cuda_version_text(v: std::ffi::c_int) -> String {
    format!("cuda {}.{}", v / 1000, (v % 1000) / 10)
}

/// The NVIDIA GPUs of this host. `Err(reason)` when there is no driver or no device.
pub fn probe_gpus() -> Result<Vec<DeviceProfile>, String> {
    probe_gpus_with_notes().map(|(devices, _)| devices)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peaks(cc: (u32, u32), name: &str, sms: u32, ghz: f64) -> BTreeMap<DType, f64> {
        peak_tflops(ComputeCapability::new(cc.0, cc.1), name, sms, ghz, &mut Vec::new())
    }

    #[test]
    fn table_matches_spec_sheets_within_ten_percent() {
        let close = |got: f64, want: f64| (got - want).abs() / want < 0.10;
        let h100 = peaks((9, 0), "NVIDIA H100 80GB HBM3", 132, 1.98);
        assert!(close(h100[&DType::F32], 67.0), "{h100:?}");
        assert!(close(h100[&DType::BF16], 989.4), "{h100:?}");
        assert!(close(h100[&DType::Fp8E4M3], 1978.9), "{h100:?}");
        let a100 = peaks((8, 0), "NVIDIA A100-SXM4-80GB", 108, 1.41);
        assert!(close(a100[&DType::F16], 312.0) && close(a100[&DType::I8], 624.0), "{a100:?}");
        assert!(!a100.contains_key(&DType::Fp8E4M3));
        let t4 = peaks((7, 5), "Tesla T4", 40, 1.59);
        assert!(close(t4[&DType::F32], 8.1) && close(t4[&DType::F16], 65.0) && !t4.contains_key(&DType::BF16));
        let g = peaks((8, 9), "NVIDIA GeForce RTX 4090", 128, 2.52);
        assert!(close(g[&DType::F16], 165.2) && close(g[&DType::I8], 660.6) && close(g[&DType::F32], 82.6), "{g:?}");
    }

    #[test]
    fn unknown_arch_gets_f32_only_and_a_note() {
        let mut notes = Vec::new();
        let p = peak_tflops(ComputeCapability::new(42, 0), "future", 100, 2.0, &mut notes);
        assert_eq!(p.len(), 1);
        assert!(p.contains_key(&DType::F32));
        assert_eq!(notes.len(), 1);
    }

    #[test]
    fn the_driver_version_reads_as_cuda_major_minor() {
        assert_eq!(cuda_version_text(12040), "cuda 12.4");
        assert_eq!(cuda_version_text(13000), "cuda 13.0");
        assert_eq!(cuda_version_text(11080), "cuda 11.8");
    }

    #[test]
    fn probing_never_panics() {
        // No GPU here is a normal outcome: Err with a reason. With a GPU: devices.
        match probe_gpus() {
            Ok(devs) => assert!(
                devs.iter().all(|d| d.kind == DeviceKind::Cuda && d.compute_capability.is_some() && d.driver.is_some())
            ),
            Err(reason) => assert!(!reason.is_empty()),
        }
    }
}
