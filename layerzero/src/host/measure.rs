//! The host measured, not guessed: `lz hardware --measure` (and the first `lz tune` on a
//! host without a measurement) times this machine's copy bandwidth and its multiply-add
//! rate per dtype, under the ISA cap in force, and stores them under `LAYERZERO_HOME`
//! (`hardware.json`) keyed by the host's fingerprint, which does not include those
//! figures; detection then reports them instead of its nominal estimates (a DDR4-3200
//! channel per 8 cores, the `cpu MHz` line times a FLOP-per-cycle table), so the cost
//! model's roofline is the one the benches see.
//!
//! - Copy bandwidth: a copy of 128 MiB into a buffer written before (no page faults), split
//!   across rayon's threads, best of 5; bytes read plus written over the time (STREAM's
//!   convention), GB/s.
//! - Multiply-adds: every rayon thread at once runs independent chains of f32 FMAs at the
//!   widest vectors the cap allows, bf16 pair products (`vdpbf16ps`) where AVX512_BF16 is
//!   allowed, and an AMX tile product where AMX is; the peak of a dtype is the sum over
//!   threads of the fastest path its kernels have (bf16: AMX, pairs or widening to f32;
//!   f32: FMAs). Other dtypes keep their nominal peak.
//! - The fork-join cost and the size from which row-wise work is split (`backend::cpu::split`).

use std::collections::BTreeMap;
use std::path::Path;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hardware::profile::DeviceProfile;
use crate::model::device::DeviceKind;
use crate::model::dtype::DType;

/// The format of `hardware.json` this build reads and writes.
pub const MEASURED_SCHEMA_VERSION: u32 = 1;

/// Bytes of each copy buffer.
const COPY_BYTES: usize = 128 << 20;

/// One host's measured figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// The host profile's fingerprint (which the figures below do not enter).
    pub fingerprint: String,
    /// The CPU's name.
    pub cpu: String,
    /// `LAYERZERO_CPU_ISA` in force when measured.
    pub cap: String,
    /// When (UTC, RFC 3339).
    pub measured_at: String,
    /// rayon threads used.
    pub threads: u32,
    /// Copy bandwidth, GB/s (read + written).
    pub copy_gbps: f64,
    /// Peak multiply-add throughput per dtype, TFLOP/s (2 FLOP per multiply-add).
    pub peak_tflops: BTreeMap<DType, f64>,
    /// Multiply-adds per ns of one thread: `f32`, `bf16_pairs`, `bf16_amx` where measured.
    pub mac_per_ns_per_thread: BTreeMap<String, f64>,
    /// A fork-join's cost from the calling thread, µs.
    pub fork_join_us: f64,
    /// Bytes (read + written) from which row-wise work is split across threads (absent:
    /// never, one thread).
    pub split_min_bytes: Option<u64>,
    /// A call's cost on the warm decode team (its helpers spinning between a decode step's
    /// ops), µs (absent: one thread, or a file from before it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_call_us: Option<f64>,
    /// Bytes (read + written) from which a decode step's op is split on the team (absent:
    /// never, one thread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_split_min_bytes: Option<u64>,
}

/// `hardware.json`: one measurement per host fingerprint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MeasuredFile {
    /// [`MEASURED_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Measurements by fingerprint.
    pub hosts: BTreeMap<String, Measured>,
}

/// Measures this host (seconds; every rayon thread busy) for the profile `fingerprint`.
pub fn measure(cpu: &DeviceProfile, fingerprint: &str) -> Measured {
    use crate::backend::cpu::simd;
    let threads = rayon::current_num_threads().max(1);
    // Every thread at once: shared FMA pipes (SMT) and a clock that drops with load show.
    let rates: Vec<simd::MacRates> = rayon::broadcast(|_| simd::measure_mac_rates());
    let sum = |f: &dyn Fn(&simd::MacRates) -> Option<f64>| -> Option<f64> {
        rates.iter().map(f).sum::<Option<f64>>().filter(|s| *s > 0.0)
    };
    let mut per_thread = BTreeMap::new();
    let n = rates.len().max(1) as f64;
    for (name, v) in
        [("f32", sum(&|r| Some(r.f32))), ("bf16_pairs", sum(&|r| r.bf16_pairs)), ("bf16_amx", sum(&|r| r.bf16_amx))]
    {
        if let Some(v) = v {
            per_thread.insert(name.to_owned(), round(v / n, 2));
        }
    }
    let mut peak_tflops = BTreeMap::new();
    if let Some(f) = sum(&|r| Some(r.f32)) {
        peak_tflops.insert(DType::F32, round(2.0 * f / 1000.0, 4));
    }
    if let Some(b) = sum(&|r| Some(r.bf16())) {
        peak_tflops.insert(DType::BF16, round(2.0 * b / 1000.0, 4));
    }
    let split = crate::backend::cpu::split::measure();
    Measured {
        fingerprint: fingerprint.to_owned(),
        cpu: cpu.name.clone(),
        cap: super::process().cpu_isa.as_str().to_owned(),
        measured_at: crate::time::format_utc(crate::time::now_unix()),
        threads: u32::try_from(threads).unwrap_or(u32::MAX),
        copy_gbps: round(copy_gbps(), 1),
        peak_tflops,
        mac_per_ns_per_thread: per_thread,
        fork_join_us: round(split.fork_join_ns / 1000.0, 1),
        split_min_bytes: (split.min_bytes != usize::MAX).then_some(split.min_bytes as u64),
        team_call_us: (threads > 1).then_some(round(split.team_ns / 1000.0, 2)),
        team_split_min_bytes: (split.team_min_bytes != usize::MAX).then_some(split.team_min_bytes as u64),
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let s = 10f64.powi(digits);
    (x * s).round() / s
}

/// Copy bandwidth of this host, GB/s (bytes read + written), best of 5.
fn copy_gbps() -> f64 {
    let n = COPY_BYTES / 4;
    let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut dst = vec![0f32; n];
    let per = n.div_ceil(rayon::current_num_threads().max(1) * 4);
    let mut best = f64::MAX;
    for _ in 0..6 {
        let t = std::time::Instant::now();
        dst.par_chunks_mut(per).zip(src.par_chunks(per)).for_each(|(d, s)| d.copy_from_slice(s));
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    2.0 * COPY_BYTES as f64 / best.max(1e-9) / 1e9
}

/// Replaces the nominal figures of the CPU device `cpu` with the measured ones.
pub fn apply(cpu: &mut DeviceProfile, m: &Measured) {
    if cpu.kind != DeviceKind::Cpu {
        return;
    }
    cpu.memory_bandwidth_gbps = m.copy_gbps;
    for (dt, v) in &m.peak_tflops {
        cpu.peak_tflops.insert(*dt, *v);
    }
}

/// Reads `hardware.json` (a missing file is an empty one).
pub fn load(path: &Path) -> Result<MeasuredFile> {
    if !path.exists() {
        return Ok(MeasuredFile { schema_version: MEASURED_SCHEMA_VERSION, hosts: BTreeMap::new() });
    }
    let text = crate::files::read_to_string(path)?;
    let file: MeasuredFile = serde_json::from_str(&text)
        .map_err(|e| Error::invalid(format!("{}: not a measured-hardware file: {e}", path.display())))?;
    if file.schema_version != MEASURED_SCHEMA_VERSION {
        return Err(Error::invalid(format!(
            "{}: field `schema_version` is {}; this build reads {MEASURED_SCHEMA_VERSION}",
            path.display(),
            file.schema_version
        )));
    }
    for (key, m) in &file.hosts {
        let bad = |what: &str, v: f64| {
            Error::invalid(format!(
                "{}: host {key}: field `{what}` is {v}; it must be a positive number",
                path.display()
            ))
        };
        if !(m.copy_gbps.is_finite() && m.copy_gbps > 0.0) {
            return Err(bad("copy_gbps", m.copy_gbps));
        }
        if let Some((dt, v)) = m.peak_tflops.iter().find(|(_, v)| !(v.is_finite() && **v > 0.0)) {
            return Err(bad(&format!("peak_tflops.{dt}"), *v));
        }
    }
    Ok(file)
}

/// Stores `m` in `hardware.json` (other hosts' entries kept; a file that cannot be read is
/// moved aside, not overwritten).
pub fn save(path: &Path, m: &Measured) -> Result<()> {
    let mut file = match load(path) {
        Ok(f) => f,
        Err(_) => {
            let aside = path.with_extension(format!("json.corrupt-{}", crate::time::now_unix()));
            std::fs::rename(path, &aside).map_err(|e| {
                Error::invalid(format!("{}: unreadable, and moving it aside failed: {e}", path.display()))
            })?;
            MeasuredFile::default()
        }
    };
    file.schema_version = MEASURED_SCHEMA_VERSION;
    file.hosts.insert(m.fingerprint.clone(), m.clone());
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::invalid(format!("{}: {e}", dir.display())))?;
    }
    let text = serde_json::to_string_pretty(&file).map_err(|e| Error::invalid(e.to_string()))?;
    crate::files::write(path, format!("{text}\n").as_bytes(), &[])
}

/// Measures this host and stores the figures in `path`, unless they are stored already
/// (the first `lz tune` on a host does this); returns what it measured.
pub fn ensure(path: &Path) -> Result<Option<Measured>> {
    let nominal = super::detect::detect_nominal();
    if load(path).is_ok_and(|f| f.hosts.contains_key(&nominal.profile.fingerprint)) {
        return Ok(None);
    }
    let Some(cpu) = nominal.profile.devices.iter().find(|d| d.kind == DeviceKind::Cpu) else { return Ok(None) };
    let m = measure(cpu, &nominal.profile.fingerprint);
    save(path, &m)?;
    Ok(Some(m))
}

/// `$LAYERZERO_HOME/hardware.json` (of the process's settings).
pub fn path() -> std::path::PathBuf {
    super::process().hardware_path()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    fn sample(fingerprint: &str) -> Measured {
        Measured {
            fingerprint: fingerprint.to_owned(),
            cpu: "test cpu".to_owned(),
            cap: "native".to_owned(),
            measured_at: "2026-11-26T00:00:00Z".to_owned(),
            threads: 2,
            copy_gbps: 27.5,
            peak_tflops: [(DType::F32, 0.48), (DType::BF16, 1.5)].into_iter().collect(),
            mac_per_ns_per_thread: [("f32".to_owned(), 120.0)].into_iter().collect(),
            fork_join_us: 19.0,
            split_min_bytes: Some(5 << 20),
            team_call_us: Some(0.9),
            team_split_min_bytes: Some(96 << 10),
        }
    }

    #[test]
    fn measurements_of_two_hosts_are_stored_side_by_side_and_read_back() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("hardware.json");
        save(&path, &sample("aaaaaaaaaaaaaaaa"))?;
        save(&path, &sample("bbbbbbbbbbbbbbbb"))?;
        let f = load(&path)?;
        assert_eq!(f.hosts.len(), 2);
        assert_eq!(f.hosts["aaaaaaaaaaaaaaaa"], sample("aaaaaaaaaaaaaaaa"));
        Ok(())
    }

    #[test]
    fn a_figure_that_is_not_a_positive_number_is_rejected_by_name() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("hardware.json");
        let mut m = sample("aaaaaaaaaaaaaaaa");
        m.peak_tflops.insert(DType::BF16, -1.0);
        save(&path, &m)?;
        let e = load(&path).err().ok_or("a figure that is not a positive number must be refused")?.to_string();
        assert!(e.contains("peak_tflops.bf16") && e.contains("-1"), "{e}");
        Ok(())
    }

    #[test]
    fn applying_a_measurement_changes_the_figures_but_not_the_fingerprint() -> TestResult {
        let nominal = crate::hardware::named::load("spr")?;
        let mut devices = nominal.devices.clone();
        let m = sample(&nominal.fingerprint);
        for d in &mut devices {
            apply(d, &m);
        }
        let measured = crate::hardware::profile::HardwareProfile::new("host", "x", devices);
        let cpu = measured.devices.iter().find(|d| d.kind == DeviceKind::Cpu).ok_or("no cpu")?;
        assert_eq!(cpu.memory_bandwidth_gbps, 27.5);
        assert_eq!(cpu.peak_tflops[&DType::BF16], 1.5);
        assert_eq!(measured.fingerprint, nominal.fingerprint);
        Ok(())
    }
}
