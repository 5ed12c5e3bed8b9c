//! Hardware profiles: a machine as data. Detection produces one; a named profile simulates
//! another machine (plan for an H100 from a laptop).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};
use crate::model::device::{DeviceKind, DeviceRef};
use crate::model::dtype::DType;

/// A CUDA compute capability, e.g. 9.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl ComputeCapability {
    /// A capability from its parts.
    pub const fn new(major: u32, minor: u32) -> ComputeCapability {
        ComputeCapability { major, minor }
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for ComputeCapability {
    type Err = String;
    fn from_str(s: &str) -> Result<ComputeCapability, String> {
        let bad = || format!("invalid compute capability {s:?} (expected MAJOR.MINOR such as 8.0 or 9.0)");
        let (a, b) = s.split_once('.').ok_or_else(bad)?;
        Ok(ComputeCapability { major: a.parse().map_err(|_| bad())?, minor: b.parse().map_err(|_| bad())? })
    }
}

impl Serialize for ComputeCapability {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ComputeCapability {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ComputeCapability, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

macro_rules! cpu_features {
    ($( $(#[doc = $doc:literal])+ $variant:ident = $name:literal, )+) => {
        /// A CPU instruction-set extension that kernels care about.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum CpuFeature { $( $(#[doc = $doc])+ $variant, )+ }

        impl CpuFeature {
            /// Every feature.
            pub const ALL: &'static [CpuFeature] = &[ $( CpuFeature::$variant, )+ ];
            /// The stable name (`avx512_bf16`, `amx_int8`, ...).
            pub fn as_str(self) -> &'static str {
                match self { $( CpuFeature::$variant => $name, )+ }
            }
        }
    };
}

cpu_features! {
    /// SSE4.2.
    Sse42 = "sse4_2",
    /// AVX.
    Avx = "avx",
    /// AVX2.
    Avx2 = "avx2",
    /// FMA3.
    Fma = "fma",
    /// F16C half-precision conversion.
    F16c = "f16c",
    /// AVX-512 Foundation.
    Avx512f = "avx512f",
    /// AVX-512 Byte and Word.
    Avx512bw = "avx512bw",
    /// AVX-512 Doubleword and Quadword.
    Avx512dq = "avx512dq",
    /// AVX-512 Vector Length.
    Avx512vl = "avx512vl",
    /// AVX-512 VNNI.
    Avx512Vnni = "avx512_vnni",
    /// AVX-512 BF16.
    Avx512Bf16 = "avx512_bf16",
    /// AVX-512 FP16.
    Avx512Fp16 = "avx512_fp16",
    /// AVX-VNNI (VEX encoded).
    AvxVnni = "avx_vnni",
    /// AVX-NE-CONVERT.
    AvxNeConvert = "avx_ne_convert",
    /// AMX tile architecture.
    AmxTile = "amx_tile",
    /// AMX BF16.
    AmxBf16 = "amx_bf16",
    /// AMX INT8.
    AmxInt8 = "amx_int8",
    /// AMX FP16.
    AmxFp16 = "amx_fp16",
    /// Arm NEON.
    Neon = "neon",
    /// Arm SVE.
    Sve = "sve",
}

impl fmt::Display for CpuFeature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CpuFeature {
    type Err = String;
    fn from_str(s: &str) -> Result<CpuFeature, String> {
        CpuFeature::ALL.iter().copied().find(|f| f.as_str() == s).ok_or_else(|| {
            let names: Vec<&str> = CpuFeature::ALL.iter().map(|f| f.as_str()).collect();
            format!("unknown CPU feature {s:?} (known: {})", names.join(" "))
        })
    }
}

impl Serialize for CpuFeature {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CpuFeature {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<CpuFeature, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A set of CPU features, as a bitset so that checks cost one AND.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CpuFeatures(u32);

impl CpuFeatures {
    /// The empty set.
    pub const fn empty() -> CpuFeatures {
        CpuFeatures(0)
    }
    /// Adds a feature.
    pub fn insert(&mut self, f: CpuFeature) {
        self.0 |= 1 << (f as u32);
    }
    /// True when `f` is in the set.
    pub fn contains(self, f: CpuFeature) -> bool {
        self.0 & (1 << (f as u32)) != 0
    }
    /// True when every feature of `other` is in the set.
    pub fn contains_all(self, other: CpuFeatures) -> bool {
        self.0 & other.0 == other.0
    }
    /// The features of `other` missing from `self`.
    pub fn missing(self, other: CpuFeatures) -> CpuFeatures {
        CpuFeatures(other.0 & !self.0)
    }
    /// True when empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The features, in declaration order.
    pub fn iter(self) -> impl Iterator<Item = CpuFeature> {
        CpuFeature::ALL.iter().copied().filter(move |f| self.contains(*f))
    }
    /// Space-separated names.
    pub fn names(self) -> String {
        self.iter().map(|f| f.as_str()).collect::<Vec<_>>().join(" ")
    }
}

impl FromIterator<CpuFeature> for CpuFeatures {
    fn from_iter<I: IntoIterator<Item = CpuFeature>>(iter: I) -> CpuFeatures {
        let mut s = CpuFeatures::empty();
        for f in iter {
            s.insert(f);
        }
        s
    }
}

impl Serialize for CpuFeatures {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for CpuFeatures {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<CpuFeatures, D::Error> {
        Ok(Vec::<CpuFeature>::deserialize(d)?.into_iter().collect())
    }
}

fn no_features(f: &CpuFeatures) -> bool {
    f.is_empty()
}

/// One device of a machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// Device kind.
    pub kind: DeviceKind,
    /// Vendor (`nvidia`, `amd`, `intel`, ...).
    pub vendor: String,
    /// Marketing name.
    pub name: String,
    /// CUDA compute capability (CUDA devices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<ComputeCapability>,
    /// ROCm gfx architecture (ROCm devices), e.g. `gfx942`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gfx: Option<String>,
    /// CPU instruction-set extensions (CPU devices).
    #[serde(default, skip_serializing_if = "no_features")]
    pub isa: CpuFeatures,
    /// The driver the device runs under, where the probe reads it (`cuda 12.4`: the CUDA
    /// version the driver implements; `hip 6.1.40092`): part of the fingerprint, so a table,
    /// PerfDB rows or a calibration made under another driver are another machine's. A CPU
    /// has none (its kernels run no driver; the libraries they load are gated by their own
    /// versions), and a named profile names none; absent, it leaves the fingerprint as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The GPU runtime library this process loads, where the probe reads it (`cudart 13.0`);
    /// not part of the fingerprint (it is the process's, not the machine's). None for a CPU
    /// and a named profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// A GPU's L2 cache in bytes, where the probe reads it or a source states it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_bytes: Option<u64>,
    /// Device memory in bytes (host RAM for a CPU).
    pub memory_bytes: u64,
    /// Memory bandwidth, GB/s (a nominal peak: spec sheet or channels x transfer rate).
    pub memory_bandwidth_gbps: f64,
    /// SMs / CUs / CPU cores.
    pub compute_units: u32,
    /// Peak dense throughput per dtype, TFLOP/s (TOP/s for integers).
    pub peak_tflops: BTreeMap<DType, f64>,
}

impl DeviceProfile {
    /// Peak throughput for `dtype` in FLOP/s; dtypes without a figure use the slowest
    /// declared one, so an unknown path is never modeled as fast.
    pub fn peak_flops(&self, dtype: DType) -> f64 {
        let tflops = match self.peak_tflops.get(&dtype) {
            Some(&t) => t,
            None => self.peak_tflops.values().copied().fold(f64::INFINITY, f64::min),
        };
        if tflops.is_finite() && tflops > 0.0 { tflops * 1e12 } else { 1e9 }
    }

    /// Memory bandwidth in bytes/s.
    pub fn bandwidth_bytes_per_s(&self) -> f64 {
        if self.memory_bandwidth_gbps > 0.0 { self.memory_bandwidth_gbps * 1e9 } else { 1e9 }
    }
}

/// A machine: one or more devices; the first is the primary one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HardwareProfile {
    /// Profile name (`h100`, `zen4`, `host`).
    pub name: String,
    /// Human description.
    pub description: String,
    /// Devices, primary first.
    pub devices: Vec<DeviceProfile>,
    /// Stable blake3 fingerprint of the devices.
    pub fingerprint: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    #[serde(rename = "$schema", default)]
    _schema: Option<String>,
    schema_version: u32,
    name: String,
    description: String,
    devices: Vec<DeviceProfile>,
}

/// The schema version of hardware profile files this build reads.
pub const HARDWARE_SCHEMA_VERSION: u32 = 1;

impl HardwareProfile {
    /// A profile from its devices; computes the fingerprint.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        devices: Vec<DeviceProfile>,
    ) -> HardwareProfile {
        let fingerprint = fingerprint(&devices);
        HardwareProfile { name: name.into(), description: description.into(), devices, fingerprint }
    }

    /// Parses a profile file (already schema-checked or not: this checks the types itself).
    pub fn from_json(text: &str, origin: &str) -> Result<HardwareProfile> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let file: ProfileFile = serde_path_to_error::deserialize(de)
            .map_err(|e| Error::invalid(format!("{origin}: field `{}`: {}", e.path(), e.inner())))?;
        if file.schema_version != HARDWARE_SCHEMA_VERSION {
            return Err(Error::invalid(format!(
                "{origin}: field `schema_version` is {}; this build reads {HARDWARE_SCHEMA_VERSION}",
                file.schema_version
            )));
        }
        if file.devices.is_empty() {
            return Err(Error::invalid(format!(
                "{origin}: field `devices` is empty; a profile needs at least one device"
            )));
        }
        for (i, d) in file.devices.iter().enumerate() {
            let problem = match d.kind {
                DeviceKind::Cuda if d.compute_capability.is_none() => Some("a cuda device needs `compute_capability`"),
                DeviceKind::Rocm if d.gfx.is_none() => Some("a rocm device needs `gfx`"),
                _ if d.peak_tflops.is_empty() => Some("`peak_tflops` needs at least one dtype"),
                _ => None,
            };
            if let Some(p) = problem {
                return Err(Error::invalid(format!("{origin}: field `devices[{i}]`: {p}")));
            }
        }
        Ok(HardwareProfile::new(file.name, file.description, file.devices))
    }

    /// The primary device.
    pub fn primary(&self) -> &DeviceProfile {
        &self.devices[0]
    }

    /// The device a tensor reference names (`None` = primary).
    pub fn device(&self, r: Option<DeviceRef>) -> Option<&DeviceProfile> {
        match r {
            None => Some(self.primary()),
            Some(r) => self.devices.iter().filter(|d| d.kind == r.kind).nth(r.ordinal() as usize),
        }
    }

    /// The profile as its file JSON (without the fingerprint, which is derived).
    pub fn to_file_json(&self) -> serde_json::Value {
        serde_json::json!({
            "schema_version": HARDWARE_SCHEMA_VERSION,
            "name": self.name,
            "description": self.description,
            "devices": self.devices,
        })
    }
}

/// blake3 over the canonical JSON (sorted keys) of the devices' identity: names and
/// descriptions of the profile do not change it, nor do the figures a host measures of
/// itself (`memory_bandwidth_gbps`, `peak_tflops`: `lz hardware --measure`), so that
/// measuring a machine, or measuring it again, keeps its PerfDB rows, calibration and
/// plans; every other device fact (kind, vendor, name, ISA, memory, compute units, compute
/// capability, gfx, driver) does change it.
fn fingerprint(devices: &[DeviceProfile]) -> String {
    let mut value = serde_json::to_value(devices).unwrap_or(serde_json::Value::Null);
    if let Some(list) = value.as_array_mut() {
        for d in list.iter_mut().filter_map(|d| d.as_object_mut()) {
            d.remove("memory_bandwidth_gbps");
            d.remove("peak_tflops");
            // The runtime is the process's (the CLI and a torch process may load different
            // ones on one machine), not the machine's.
            d.remove("runtime");
        }
    }
    crate::canonical::hash(&value)[..16].to_owned()
}
