//! Host detection: this machine as a [`HardwareProfile`] named `host`.
//!
//! An I/O edge that never panics and never fails: what cannot be read is estimated and the
//! estimate is stated in [`Detection::notes`]. No GPU is a normal outcome, not an error.
//!
//! ## CPU estimates
//!
//! - Peak FLOP/s = cores x clock x FLOP per cycle per core, by ISA (two FMA pipes assumed):
//!   f32: AVX-512 64 (AMD without AVX-VNNI, i.e. Zen 4, runs 512-bit ops on 256-bit pipes:
//!   32), AVX2+FMA 32, AVX 16, SSE 8, NEON 16; bf16 only with AMX-BF16 (1024) or AVX512-BF16
//!   (2x f32); f16 only with AMX-FP16 (1024) or AVX512-FP16 (2x f32); i8: AMX-INT8 2048,
//!   AVX512-VNNI / AVX-VNNI 4x f32, AVX2 2x f32.
//! - Cores: `std::thread::available_parallelism`; when `/proc/cpuinfo` shows SMT (siblings >
//!   cores) the peak counts physical cores only (SMT threads share the FMA pipes).
//! - Clock: the highest `cpu MHz` in `/proc/cpuinfo`, else 2.5 GHz.
//! - Memory bandwidth: a nominal figure, no benchmark: one DDR4-3200 channel (25.6 GB/s) per
//!   8 cores, at least 2 and at most 12 channels. Use a named profile or `lz tune` for real
//!   numbers.

use std::collections::BTreeMap;

use crate::hardware::profile::{CpuFeature, CpuFeatures, DeviceProfile, HardwareProfile};
use crate::model::device::DeviceKind;
use crate::model::dtype::DType;

/// The detected profile and what was estimated, assumed or not found on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct Detection {
    /// The profile, named `host`.
    pub profile: HardwareProfile,
    /// Quiet facts: `no NVIDIA driver (libcuda not found)`, estimates and their basis.
    pub notes: Vec<String>,
}

/// Clock assumed when `/proc/cpuinfo` gives none (GHz).
const DEFAULT_CPU_GHZ: f64 = 2.5;
/// Nominal bandwidth of one DDR4-3200 channel, GB/s.
const CHANNEL_GBPS: f64 = 25.6;

/// What `/proc/cpuinfo` says (Linux); everything optional.
#[derive(Debug, Default, Clone)]
struct CpuInfo {
    model: Option<String>,
    vendor_id: Option<String>,
    max_mhz: Option<f64>,
    /// Logical CPUs per package (`siblings`) and physical cores per package (`cpu cores`).
    siblings: Option<u32>,
    cores: Option<u32>,
    flags: Option<Vec<String>>,
}

fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut info = CpuInfo::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else { continue };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "model name" | "Model" | "cpu model" if info.model.is_none() && !value.is_empty() => {
                info.model = Some(value.to_owned());
            }
            "vendor_id" | "CPU implementer" if info.vendor_id.is_none() => info.vendor_id = Some(value.to_owned()),
            "cpu MHz" => {
                if let Ok(mhz) = value.parse::<f64>()
                    && mhz.is_finite()
                    && mhz > 0.0
                    && info.max_mhz.is_none_or(|m| mhz > m)
                {
                    info.max_mhz = Some(mhz);
                }
            }
            "siblings" if info.siblings.is_none() => info.siblings = value.parse().ok(),
            "cpu cores" if info.cores.is_none() => info.cores = value.parse().ok(),
            "flags" | "Features" if info.flags.is_none() => {
                info.flags = Some(value.split_whitespace().map(str::to_owned).collect());
            }
            _ => {}
        }
    }
    info
}

fn vendor_name(vendor_id: Option<&str>) -> &'static str {
    match vendor_id {
        Some("GenuineIntel") => "intel",
        Some("AuthenticAMD" | "HygonGenuine") => "amd",
        Some("0x41") => "arm",
        Some("0x61") => "apple",
        Some("0x51") => "qualcomm",
        Some("0xc0") => "ampere",
        Some("0x48") => "hisilicon",
        _ if cfg!(target_arch = "aarch64") => "arm",
        _ => "unknown",
    }
}

/// `MemTotal` of `/proc/meminfo` in bytes.
fn parse_meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut parts = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    let unit = match parts.next() {
        Some("kB") | Some("KB") | Some("kb") => 1024,
        None => 1,
        Some(_) => return None,
    };
    n.checked_mul(unit)
}

/// `isa` without the features above `LAYERZERO_CPU_ISA`, noted.
fn capped(isa: CpuFeatures, notes: &mut Vec<String>) -> CpuFeatures {
    let knob = crate::knobs::CPU_ISA.name();
    if let Some(e) = super::process_errors().iter().find(|e| e.to_string().starts_with(knob)) {
        notes.push(format!("{e}; no ISA cap applied"));
        return isa;
    }
    let cap = super::process().cpu_isa;
    let dropped: Vec<&str> = isa.iter().filter(|f| !cap.allows(*f)).map(|f| f.as_str()).collect();
    if dropped.is_empty() {
        return isa;
    }
    notes.push(format!("ISA capped at {cap} by LAYERZERO_CPU_ISA: {} not used", dropped.join(" ")));
    isa.iter().filter(|f| cap.allows(*f)).collect()
}

/// The ISA extensions of this CPU that the OS lets programs use.
#[cfg(target_arch = "x86_64")]
fn detect_isa(cpuinfo_flags: Option<&[String]>, notes: &mut Vec<String>) -> CpuFeatures {
    use raw_cpuid::CpuId;

    let mut isa = CpuFeatures::empty();
    let cpuid = CpuId::new();
    let mut set = |f: CpuFeature, on: bool| {
        if on {
            isa.insert(f);
        }
    };
    if let Some(fi) = cpuid.get_feature_info() {
        set(CpuFeature::Sse42, fi.has_sse42());
        set(CpuFeature::Avx, fi.has_avx());
        set(CpuFeature::Fma, fi.has_fma());
        set(CpuFeature::F16c, fi.has_f16c());
    }
    let max_leaf = raw_cpuid::cpuid!(0).eax;
    if let Some(ef) = cpuid.get_extended_feature_info() {
        // Leaf 7 subleaf 0: EBX avx2 (5), avx512f (16), avx512dq (17), avx512bw (30),
        // avx512vl (31); ECX avx512_vnni (11); EDX avx512_fp16 (23), amx_bf16 (22),
        // amx_tile (24), amx_int8 (25).
        set(CpuFeature::Avx2, ef.has_avx2());
        set(CpuFeature::Avx512f, ef.has_avx512f());
        set(CpuFeature::Avx512bw, ef.has_avx512bw());
        set(CpuFeature::Avx512dq, ef.has_avx512dq());
        set(CpuFeature::Avx512vl, ef.has_avx512vl());
        set(CpuFeature::Avx512Vnni, ef.has_avx512vnni());
        set(CpuFeature::Avx512Fp16, ef.has_avx512_fp16());
        set(CpuFeature::AmxTile, ef.has_amx_tile());
        set(CpuFeature::AmxBf16, ef.has_amx_bf16());
        set(CpuFeature::AmxInt8, ef.has_amx_int8());
        // Leaf 7 subleaf 1 (valid when subleaf 0 EAX, the max subleaf, is >= 1): EAX
        // avx_vnni (4), avx512_bf16 (5), amx_fp16 (21); EDX avx_ne_convert (5).
        if max_leaf >= 7 && raw_cpuid::cpuid!(7, 0).eax >= 1 {
            let sub1 = raw_cpuid::cpuid!(7, 1);
            set(CpuFeature::AvxVnni, sub1.eax & (1 << 4) != 0);
            set(CpuFeature::Avx512Bf16, sub1.eax & (1 << 5) != 0);
            set(CpuFeature::AmxFp16, sub1.eax & (1 << 21) != 0);
            set(CpuFeature::AvxNeConvert, sub1.edx & (1 << 5) != 0);
        }
    }

    // CPUID says what the core implements; the OS must also save the register state.
    // std checks XCR0 for the YMM (AVX) and ZMM/opmask (AVX-512) state.
    let mut drop_all = |features: &[CpuFeature], why: &str| {
        let present: Vec<&str> = features.iter().filter(|f| isa.contains(**f)).map(|f| f.as_str()).collect();
        if !present.is_empty() {
            notes.push(format!("CPUID reports {} but {why}; not used", present.join(" ")));
            let keep: CpuFeatures = isa.iter().filter(|f| !features.contains(f)).collect();
            isa = keep;
        }
    };
    const AVX512_FAMILY: [CpuFeature; 7] = [
        CpuFeature::Avx512f,
        CpuFeature::Avx512bw,
        CpuFeature::Avx512dq,
        CpuFeature::Avx512vl,
        CpuFeature::Avx512Vnni,
        CpuFeature::Avx512Bf16,
        CpuFeature::Avx512Fp16,
    ];
    const AMX_FAMILY: [CpuFeature; 4] =
        [CpuFeature::AmxTile, CpuFeature::AmxBf16, CpuFeature::AmxInt8, CpuFeature::AmxFp16];
    if !std::is_x86_feature_detected!("avx") {
        let mut all = vec![
            CpuFeature::Avx,
            CpuFeature::Avx2,
            CpuFeature::Fma,
            CpuFeature::F16c,
            CpuFeature::AvxVnni,
            CpuFeature::AvxNeConvert,
        ];
        all.extend(AVX512_FAMILY);
        drop_all(&all, "the OS does not enable AVX state (XCR0)");
    } else if !std::is_x86_feature_detected!("avx512f") {
        drop_all(&AVX512_FAMILY, "the OS does not enable AVX-512 state (XCR0)");
    }
    // AMX tile data must be enabled by the kernel (XCR0 bits 17-18); Linux lists the amx
    // flags in /proc/cpuinfo only then. Without /proc/cpuinfo CPUID is trusted.
    if let Some(flags) = cpuinfo_flags
        && !flags.iter().any(|f| f == "amx_tile")
    {
        drop_all(&AMX_FAMILY, "the kernel does not list amx_tile in /proc/cpuinfo");
    }
    isa
}

#[cfg(target_arch = "aarch64")]
fn detect_isa(_cpuinfo_flags: Option<&[String]>, _notes: &mut Vec<String>) -> CpuFeatures {
    let mut isa = CpuFeatures::empty();
    if std::arch::is_aarch64_feature_detected!("neon") {
        isa.insert(CpuFeature::Neon);
    }
    if std::arch::is_aarch64_feature_detected!("sve") {
        isa.insert(CpuFeature::Sve);
    }
    isa
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect_isa(_cpuinfo_flags: Option<&[String]>, notes: &mut Vec<String>) -> CpuFeatures {
    notes.push(format!("ISA detection is not implemented for {}; no extensions reported", std::env::consts::ARCH));
    CpuFeatures::empty()
}

/// FLOP (OP for i8) per cycle per core by dtype, from the ISA (see the module docs).
fn flops_per_cycle(isa: CpuFeatures, vendor: &str) -> BTreeMap<DType, f64> {
    use CpuFeature as F;
    let f32 = if isa.contains(F::Avx512f) {
        // Zen 4 executes 512-bit FMAs on two 256-bit pipes; Zen 5 (which added AVX-VNNI)
        // has full-width pipes.
        if vendor == "amd" && !isa.contains(F::AvxVnni) { 32.0 } else { 64.0 }
    } else if isa.contains(F::Avx2) && isa.contains(F::Fma) {
        32.0
    } else if isa.contains(F::Avx) || isa.contains(F::Neon) {
        16.0
    } else {
        8.0
    };
    let mut out = BTreeMap::new();
    out.insert(DType::F32, f32);
    if isa.contains(F::AmxBf16) {
        out.insert(DType::BF16, 1024.0);
    } else if isa.contains(F::Avx512Bf16) {
        out.insert(DType::BF16, 2.0 * f32);
    }
    if isa.contains(F::AmxFp16) {
        out.insert(DType::F16, 1024.0);
    } else if isa.contains(F::Avx512Fp16) {
        out.insert(DType::F16, 2.0 * f32);
    }
    if isa.contains(F::AmxInt8) {
        out.insert(DType::I8, 2048.0);
    } else if isa.contains(F::Avx512Vnni) || isa.contains(F::AvxVnni) {
        out.insert(DType::I8, 4.0 * f32);
    } else if isa.contains(F::Avx2) {
        out.insert(DType::I8, 2.0 * f32);
    }
    out
}

/// Nominal memory bandwidth for `cores` cores, GB/s (see the module docs).
fn nominal_bandwidth_gbps(cores: u32) -> f64 {
    let channels = cores.div_ceil(8).clamp(2, 12);
    (f64::from(channels) * CHANNEL_GBPS * 10.0).round() / 10.0
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The CPU of this host as a device, with notes on every estimate.
fn detect_cpu(notes: &mut Vec<String>) -> DeviceProfile {
    let info = read("/proc/cpuinfo").map(|t| parse_cpuinfo(&t)).unwrap_or_default();
    #[cfg(target_arch = "x86_64")]
    let brand = raw_cpuid::CpuId::new().get_processor_brand_string().map(|b| b.as_str().trim().to_owned());
    #[cfg(not(target_arch = "x86_64"))]
    let brand: Option<String> = None;
    #[cfg(target_arch = "x86_64")]
    let cpuid_vendor = raw_cpuid::CpuId::new().get_vendor_info().map(|v| v.as_str().to_owned());
    #[cfg(not(target_arch = "x86_64"))]
    let cpuid_vendor: Option<String> = None;

    let name = info
        .model
        .clone()
        .or(brand)
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("unknown {} CPU", std::env::consts::ARCH));
    let vendor = vendor_name(info.vendor_id.as_deref().or(cpuid_vendor.as_deref())).to_owned();

    let logical = std::thread::available_parallelism().map(|n| n.get()).unwrap_or_else(|_| {
        notes.push("available_parallelism unknown; assuming 1 CPU".to_owned());
        1
    });
    let compute_units = u32::try_from(logical).unwrap_or(u32::MAX);
    let smt = match (info.siblings, info.cores) {
        (Some(s), Some(c)) if c > 0 && s > c => s / c,
        _ => 1,
    };
    let physical = (compute_units / smt).max(1);
    if smt > 1 {
        notes.push(format!("SMT x{smt}: {compute_units} logical CPUs, peak counted on {physical} physical cores"));
    }

    let memory_bytes = match read("/proc/meminfo").as_deref().and_then(parse_meminfo_total) {
        Some(b) => b,
        None => {
            notes.push("host memory unknown (no /proc/meminfo MemTotal); reported as 0".to_owned());
            0
        }
    };

    let isa = capped(detect_isa(info.flags.as_deref(), notes), notes);
    let ghz = match info.max_mhz {
        Some(mhz) => mhz / 1000.0,
        None => {
            notes.push(format!("CPU clock unknown (no `cpu MHz` in /proc/cpuinfo); assuming {DEFAULT_CPU_GHZ} GHz"));
            DEFAULT_CPU_GHZ
        }
    };
    let per_cycle = flops_per_cycle(isa, &vendor);
    let peak_tflops: BTreeMap<DType, f64> = per_cycle
        .iter()
        .map(|(&dt, &fpc)| (dt, ((f64::from(physical) * ghz * fpc / 1000.0) * 1e4).round() / 1e4))
        .collect();
    let per_cycle_text: Vec<String> = per_cycle.iter().map(|(dt, v)| format!("{dt} {v}")).collect();
    notes.push(format!(
        "CPU peak estimated as {physical} cores x {ghz:.2} GHz x FLOP/cycle/core ({})",
        per_cycle_text.join(", ")
    ));
    let memory_bandwidth_gbps = nominal_bandwidth_gbps(physical);
    notes.push(format!(
        "CPU memory bandwidth {memory_bandwidth_gbps} GB/s is a nominal estimate (one DDR4-3200 channel per 8 cores, 2..12 channels), not measured"
    ));

    DeviceProfile {
        kind: DeviceKind::Cpu,
        vendor,
        name,
        compute_capability: None,
        gfx: None,
        isa,
        driver: None,
        runtime: None,
        l2_bytes: None,
        memory_bytes,
        memory_bandwidth_gbps,
        compute_units,
        peak_tflops,
    }
}

/// This host as the profile `host`: GPUs first when any is found, the CPU last; otherwise
/// the CPU alone; with the CPU figures `lz hardware --measure` stored for it, where it did.
/// Never panics, never fails.
pub fn detect_host() -> Detection {
    with_measured(detect_nominal(), &super::measure::path())
}

/// [`detect_host`] with the nominal estimates, whatever was measured.
pub fn detect_nominal() -> Detection {
    let mut notes = Vec::new();
    let cpu = detect_cpu(&mut notes);
    let mut devices = Vec::new();
    match crate::backend::cuda::probe::probe_gpus_with_notes() {
        Ok((gpus, mut gpu_notes)) => {
            devices.extend(gpus);
            notes.append(&mut gpu_notes);
        }
        Err(reason) => notes.push(reason),
    }
    match crate::backend::rocm::probe::probe_gpus_with_notes() {
        Ok((gpus, mut gpu_notes)) => {
            devices.extend(gpus);
            notes.append(&mut gpu_notes);
        }
        Err(reason) => notes.push(reason),
    }
    let gpu_names: Vec<String> = devices.iter().map(|d| d.name.clone()).collect();
    devices.push(cpu);
    let description = if gpu_names.is_empty() {
        format!("detected on this host: {}", devices[0].name)
    } else {
        format!("detected on this host: {} with {}", gpu_names.join(", "), devices[devices.len() - 1].name)
    };
    Detection { profile: HardwareProfile::new("host", description, devices), notes }
}

/// `profile` with the CPU figures `lz hardware --measure` stored for its fingerprint in
/// `file`, when there are any (the nominal notes then give way to what was measured).
pub fn with_measured(nominal: Detection, file: &std::path::Path) -> Detection {
    let Detection { profile, mut notes } = nominal;
    let m = match super::measure::load(file) {
        Ok(f) => f.hosts.get(&profile.fingerprint).cloned(),
        Err(e) => {
            notes.push(format!("measured figures not used: {e}"));
            None
        }
    };
    let Some(m) = m else {
        notes.push("CPU figures not measured on this host; `lz hardware --measure` measures them".to_owned());
        return Detection { profile, notes };
    };
    let HardwareProfile { name, description, mut devices, .. } = profile;
    for d in devices.iter_mut().filter(|d| d.kind == DeviceKind::Cpu) {
        let before: Vec<String> = m
            .peak_tflops
            .keys()
            .map(|dt| format!("{dt} {}", d.peak_tflops.get(dt).map_or("-".to_owned(), |v| v.to_string())))
            .collect();
        // The estimate of the dtypes not measured (f16, i8) stands; the bandwidth's does not.
        notes.retain(|n| !n.starts_with("CPU memory bandwidth"));
        let peaks: Vec<String> = m.peak_tflops.iter().map(|(dt, v)| format!("{dt} {v}")).collect();
        notes.push(format!(
            "CPU measured {} (cap {}, {} threads): copy bandwidth {} GB/s (nominal estimate {} GB/s), peak TFLOP/s {} (nominal {})",
            m.measured_at,
            m.cap,
            m.threads,
            m.copy_gbps,
            d.memory_bandwidth_gbps,
            peaks.join(", "),
            before.join(", ")
        ));
        super::measure::apply(d, &m);
    }
    Detection { profile: HardwareProfile::new(name, description, devices), notes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    const CPUINFO: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7763 64-Core Processor\n\
cpu MHz\t\t: 2445.000\nsiblings\t: 4\ncpu cores\t: 2\nflags\t\t: fpu avx avx2 fma\n\nprocessor\t: 1\ncpu MHz\t\t: 3100.5\n";

    #[test]
    fn cpuinfo_fields() -> TestResult {
        let i = parse_cpuinfo(CPUINFO);
        assert_eq!(i.model.as_deref(), Some("AMD EPYC 7763 64-Core Processor"));
        assert_eq!(vendor_name(i.vendor_id.as_deref()), "amd");
        assert_eq!(i.max_mhz, Some(3100.5));
        assert_eq!((i.siblings, i.cores), (Some(4), Some(2)));
        assert_eq!(i.flags.ok_or("no flags")?.len(), 4);
        let empty = parse_cpuinfo("");
        assert!(empty.model.is_none() && empty.max_mhz.is_none());
        Ok(())
    }

    #[test]
    fn meminfo_total() {
        assert_eq!(parse_meminfo_total("MemTotal:       24731708 kB\nMemFree: 1 kB\n"), Some(24731708 * 1024));
        assert_eq!(parse_meminfo_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo_total("MemTotal: x kB\n"), None);
    }

    #[test]
    fn flops_by_isa() {
        use CpuFeature as F;
        let avx2: CpuFeatures = [F::Avx, F::Avx2, F::Fma].into_iter().collect();
        let p = flops_per_cycle(avx2, "amd");
        assert_eq!(p[&DType::F32], 32.0);
        assert_eq!(p[&DType::I8], 64.0);
        assert!(!p.contains_key(&DType::BF16) && !p.contains_key(&DType::F16));
        let zen4: CpuFeatures = [F::Avx2, F::Fma, F::Avx512f, F::Avx512Bf16, F::Avx512Vnni].into_iter().collect();
        let p = flops_per_cycle(zen4, "amd");
        assert_eq!((p[&DType::F32], p[&DType::BF16], p[&DType::I8]), (32.0, 64.0, 128.0));
        let spr: CpuFeatures =
            [F::Avx2, F::Fma, F::Avx512f, F::Avx512Bf16, F::Avx512Fp16, F::AmxTile, F::AmxBf16, F::AmxInt8]
                .into_iter()
                .collect();
        let p = flops_per_cycle(spr, "intel");
        assert_eq!((p[&DType::F32], p[&DType::F16], p[&DType::BF16], p[&DType::I8]), (64.0, 128.0, 1024.0, 2048.0));
        assert_eq!(flops_per_cycle(CpuFeatures::empty(), "unknown")[&DType::F32], 8.0);
    }

    #[test]
    fn nominal_bandwidth() {
        assert_eq!(nominal_bandwidth_gbps(2), 51.2);
        assert_eq!(nominal_bandwidth_gbps(64), 204.8);
        assert_eq!(nominal_bandwidth_gbps(1000), 307.2);
    }

    #[test]
    fn host_profile_is_valid_and_round_trips() -> TestResult {
        let d = detect_host();
        let p = &d.profile;
        assert_eq!(p.name, "host");
        assert_eq!(p.devices.last().map(|d| d.kind), Some(DeviceKind::Cpu));
        assert!(p.devices.iter().all(|d| !d.peak_tflops.is_empty()));
        let json = p.to_file_json();
        crate::schema::validate(crate::schema::SchemaKind::Hardware, &json, "host")?;
        let again = HardwareProfile::from_json(&json.to_string(), "host")?;
        assert_eq!(&again, p);
        assert!(!d.notes.is_empty());
        Ok(())
    }
}
