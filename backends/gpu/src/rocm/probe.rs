//! AMD GPU probing through HIP (`rocmrc`, dynamic loading).
//!
//! With no ROCm installed this returns `Err` quietly: `libamdhip64` is looked for with a
//! plain `dlopen` before any HIP function is touched (the crate panics when a function is
//! called without the library), and every per-device read runs inside `catch_unwind`.
//!
//! ## Peak throughput estimate
//!
//! `peak TFLOP/s = CUs x engine clock (hipDeviceProp_t::clockRate) x per-CU rate`, with these
//! dense per-CU, per-clock rates (FLOP, or OP for int8), from AMD's datasheets:
//!
//! | gfx    | part              | f32 (vector) | f16 / bf16 matrix | fp8 matrix        | i8 matrix |
//! |--------|-------------------|-------------:|------------------:|------------------:|----------:|
//! | gfx90a | MI210/MI250(X)    | 128          | 1024 / 1024       | -                 | 1024      |
//! | gfx942 | MI300X/MI325X     | 128          | 2048 / 2048       | 4096 (FNUZ)       | 4096      |
//! | gfx950 | MI350X/MI355X     | 256          | 4096 / 4096       | 8192 (OCP)        | 8192      |
//!
//! Checks against the datasheets: MI250X 220 x 128 x 1.7 GHz = 47.9 f32, 220 x 1024 x 1.7 =
//! 383 f16; MI300X 304 x 2048 x 2.1 = 1307 f16, 304 x 4096 x 2.1 = 2615 fp8; MI355X
//! 256 x 4096 x 2.4 = 2517 f16. gfx942's fp8 are the FNUZ encodings (the named profile's
//! `fp8_e4m3` figure stands for them). An arch this table does not know gets no estimate
//! and a note; use a named profile then. Bandwidth = 2 x memory clock x bus width / 8, as
//! HIP reports them (not checked against a device here: none was at hand).

use std::collections::BTreeMap;
use std::panic;

use layerzero_core::exec::executor::panic_text;
use layerzero_core::hardware::profile::{CpuFeatures, DeviceProfile};
use layerzero_core::model::device::DeviceKind;
use layerzero_core::model::dtype::DType;

/// Dense per-CU, per-clock rates of one gfx architecture (see the module table).
#[derive(Debug, Clone, Copy, PartialEq)]
struct CuRates {
    f32: f64,
    f16: f64,
    fp8: Option<f64>,
    i8: f64,
}

/// The per-CU rates of `gfx`; `None` for an architecture the table does not know.
fn cu_rates(gfx: &str) -> Option<CuRates> {
    match gfx {
        "gfx90a" => Some(CuRates { f32: 128.0, f16: 1024.0, fp8: None, i8: 1024.0 }),
        "gfx942" => Some(CuRates { f32: 128.0, f16: 2048.0, fp8: Some(4096.0), i8: 4096.0 }),
        "gfx950" => Some(CuRates { f32: 256.0, f16: 4096.0, fp8: Some(8192.0), i8: 8192.0 }),
        _ => None,
    }
}

/// Peak TFLOP/s per dtype of `cus` compute units of `gfx` at `ghz`.
fn peak_tflops(gfx: &str, cus: u32, ghz: f64) -> Option<BTreeMap<DType, f64>> {
    let r = cu_rates(gfx)?;
    let t = |per_clock: f64| (f64::from(cus) * per_clock * ghz / 1e3 * 10.0).round() / 10.0;
    let mut peak =
        BTreeMap::from([(DType::F32, t(r.f32)), (DType::F16, t(r.f16)), (DType::BF16, t(r.f16)), (DType::I8, t(r.i8))]);
    if let Some(fp8) = r.fp8 {
        peak.insert(DType::Fp8E4M3, t(fp8));
        peak.insert(DType::Fp8E5M2, t(fp8));
    }
    Some(peak)
}

/// The gfx target of `gcnArchName` without HIP's feature suffix (`gfx942:sramecc+:xnack-`).
fn gfx_of(arch: &str) -> String {
    arch.split(':').next().unwrap_or(arch).trim().to_owned()
}

/// True when HIP's runtime library (libamdhip64) can be loaded.
#[allow(unsafe_code)]
fn hip_present() -> bool {
    // SAFETY: `is_rocmlib_present` only tries `dlopen` on the candidate names of
    // libamdhip64 and drops each handle; it calls no HIP function. Loading the library runs
    // its initialisers, which are designed to run in any host process.
    unsafe { rocmrc::hip::sys::is_rocmlib_present() }
}

/// Reads one device; `Err` names what failed.
fn read_device(ordinal: i32, notes: &mut Vec<String>) -> Result<DeviceProfile, String> {
    let p = rocmrc::hip::result::device::get_properties(ordinal)
        .map_err(|e| format!("rocm:{ordinal}: cannot read the device properties: {e:?}"))?;
    let text = |chars: &[core::ffi::c_char]| -> String {
        let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let name = Some(text(&p.name)).filter(|n| !n.is_empty()).unwrap_or_else(|| format!("AMD GPU {ordinal}"));
    let gfx = gfx_of(&text(&p.gcnArchName));
    let cus = u32::try_from(p.multiProcessorCount).unwrap_or(0);
    let ghz = f64::from(p.clockRate.max(0)) / 1e6;
    let memory_bandwidth_gbps = if p.memoryClockRate > 0 && p.memoryBusWidth > 0 {
        ((2.0 * f64::from(p.memoryClockRate) * 1e3 * f64::from(p.memoryBusWidth) / 8.0) / 1e9 * 10.0).round() / 10.0
    } else {
        notes.push(format!("rocm:{ordinal} ({name}): memory clock or bus width not reported; bandwidth unknown (0)"));
        0.0
    };
    let peak = match peak_tflops(&gfx, cus, ghz) {
        Some(p) => p,
        None => {
            notes.push(format!(
                "rocm:{ordinal} ({name}): {gfx} is not in the per-CU table of backend/rocm/probe.rs; no peak estimate, use a named profile"
            ));
            BTreeMap::new()
        }
    };
    notes.push(format!("rocm:{ordinal} ({name}): {gfx}, {cus} CUs at {ghz:.2} GHz; peaks from the per-CU table"));
    Ok(DeviceProfile {
        kind: DeviceKind::Rocm,
        vendor: "amd".to_owned(),
        name,
        compute_capability: None,
        gfx: Some(gfx),
        isa: CpuFeatures::empty(),
        driver: None,
        runtime: None,
        l2_bytes: None,
        memory_bytes: p.totalGlobalMem as u64,
        memory_bandwidth_gbps,
        compute_units: cus,
        peak_tflops: peak,
    })
}

/// The AMD GPUs of this host with notes. `Err(reason)` when ROCm is not installed, HIP
/// fails, or there is no device.
pub fn probe_gpus_with_notes() -> Result<(Vec<DeviceProfile>, Vec<String>), String> {
    if !hip_present() {
        return Err("ROCm not installed (libamdhip64 not found)".to_owned());
    }
    let count = match panic::catch_unwind(rocmrc::hip::result::device::get_count) {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => return Err(format!("ROCm present but unusable: {e:?}")),
        Err(p) => return Err(format!("ROCm present but unusable: {}", panic_text(p.as_ref()))),
    };
    if count <= 0 {
        return Err("ROCm present but no AMD GPU".to_owned());
    }
    let (mut devices, notes) =
        super::super::gpus::read_all("rocm", count as usize, |ordinal, notes| read_device(ordinal as i32, notes))?;
    let driver = driver_version();
    for d in &mut devices {
        d.driver.clone_from(&driver);
    }
    Ok((devices, notes))
}

/// The HIP driver version (`hipDriverGetVersion`: 60140092 is `hip 6.1.40092`), the
/// profile's `driver`; `None` when HIP does not say.
#[allow(unsafe_code)]
fn driver_version() -> Option<String> {
    let mut version: std::ffi::c_int = 0;
    // SAFETY: called only after `hip_present` found libamdhip64 (so the symbol loads); the
    // function writes one int through the pointer, which points to a live local.
    let read =
        panic::catch_unwind(panic::AssertUnwindSafe(|| unsafe { rocmrc::hip::sys::hipDriverGetVersion(&mut version) }));
    match read {
        Ok(rocmrc::hip::sys::hipError_t::hipSuccess) if version > 0 => Some(hip_version_text(version)),
        _ => None,
    }
}

/// `hip MAJOR.MINOR.PATCH` of a HIP version number (10^7 x major + 10^5 x minor + patch).
fn hip_version_text(v: std::ffi::c_int) -> String {
    format!("hip {}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    #[test]
    fn the_per_cu_table_gives_the_datasheet_peaks() -> TestResult {
        let close = |got: f64, want: f64| (got - want).abs() / want < 0.01;
        let mi300x = peak_tflops("gfx942", 304, 2.1).ok_or("no peaks for gfx942")?;
        assert!(close(mi300x[&DType::BF16], 1307.4) && close(mi300x[&DType::Fp8E4M3], 2614.9), "{mi300x:?}");
        assert!(close(mi300x[&DType::F32], 81.7), "{mi300x:?}");
        let mi250x = peak_tflops("gfx90a", 220, 1.7).ok_or("no peaks for gfx90a")?;
        assert!(close(mi250x[&DType::F16], 383.0) && !mi250x.contains_key(&DType::Fp8E4M3), "{mi250x:?}");
        let mi355x = peak_tflops("gfx950", 256, 2.4).ok_or("no peaks for gfx950")?;
        assert!(close(mi355x[&DType::F16], 2516.6) && close(mi355x[&DType::F32], 157.3), "{mi355x:?}");
        assert!(peak_tflops("gfx1100", 96, 2.5).is_none());
        Ok(())
    }

    #[test]
    fn the_driver_version_reads_as_hip_major_minor_patch() {
        assert_eq!(hip_version_text(60140092), "hip 6.1.40092");
        assert_eq!(hip_version_text(60342134), "hip 6.3.42134");
    }

    #[test]
    fn the_gfx_target_drops_hips_feature_suffix() {
        assert_eq!(gfx_of("gfx942:sramecc+:xnack-"), "gfx942");
        assert_eq!(gfx_of("gfx90a"), "gfx90a");
    }

    #[test]
    fn without_rocm_the_probe_says_so_and_does_not_panic() -> TestResult {
        if !hip_present() {
            let err = probe_gpus_with_notes().err().ok_or("the probe found ROCm that is not installed")?;
            assert!(err.contains("ROCm not installed"), "{err}");
        }
        Ok(())
    }
}
