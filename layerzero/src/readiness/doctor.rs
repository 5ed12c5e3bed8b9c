//! Is this installation sound? Hardware, backends, shipped files, one sample selection, the
//! PerfDB, the configured dispatch table and every `LAYERZERO_*` knob, as one report.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use super::files::{self, FileCheck};
use crate::capabilities::catalog::Catalog;
use crate::capabilities::spec::Execution;
use crate::error::Result;
use crate::hardware::profile::HardwareProfile;
use crate::host::detect;
use crate::knobs::{self, KnobReport, Lookup, Settings};
use crate::model::attrs::{AttentionAttrs, Attrs};
use crate::model::device::DeviceKind;
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::op::Op;
use crate::model::request::Request;
use crate::model::tensor::TensorDesc;
use crate::perfdb::{DbStats, PerfDb, Recovery};
use crate::plan::PlanMode;
use crate::policy::Policy;
use crate::policy::PolicyOverride;
use crate::select::{Availability, BackendStatus, Selector};

/// What to examine.
pub struct DoctorInputs<'a> {
    /// The catalog in use.
    pub catalog: Arc<Catalog>,
    /// The PerfDB file; `None` is the default path (`$LAYERZERO_PERFDB`, ...).
    pub perfdb: Option<&'a Path>,
    /// The environment whose knobs are reported and applied (`knobs::process_env`).
    pub env: Lookup<'a>,
}

/// Everything doctor found. The host is always detected: doctor is about this machine.
#[derive(Debug)]
pub struct DoctorReport {
    /// This host's profile.
    pub hardware: Arc<HardwareProfile>,
    /// What detection could not see or had to estimate.
    pub hardware_notes: Vec<String>,
    /// Each GPU's free and total memory read through its driver now (the live headroom a GPU
    /// request's workspace is checked against), or why it could not be read.
    pub device_memory: Vec<DeviceMemoryCheck>,
    /// The catalog's hash.
    pub capabilities_hash: String,
    /// Every backend of the catalog and whether it can run here.
    pub backends: Vec<BackendCheck>,
    /// The shipped files' schema checks.
    pub files: Vec<FileCheck>,
    /// A typical request for the primary device and what it selects.
    pub sample: SampleSelection,
    /// The PerfDB.
    pub perfdb: PerfDbCheck,
    /// The cost-model calibration: its path, whether a handle here uses it, and why (not).
    pub calibration: (String, bool, String),
    /// The dispatch table a runtime here would serve with.
    pub plan: PlanCheck,
    /// Every `LAYERZERO_*` knob as the process environment sets it.
    pub knobs: Vec<KnobReport>,
    /// The policy a handle here serves with (`LAYERZERO_POLICY` and the knobs that override
    /// its fields and add rules), or why it cannot be read.
    pub policy: Result<PolicyCheck, String>,
    /// The lockfile's path and each locked plugin's state (`Err`: the lockfile is unreadable).
    pub plugins: (String, Result<Vec<crate::plugins::PluginState>, String>),
    /// No problem anywhere above.
    pub ok: bool,
}

/// A GPU's memory as its driver reports it now.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceMemoryCheck {
    /// `cuda:0`, ...
    pub device: String,
    /// Free bytes now.
    pub free_bytes: Option<u64>,
    /// Total bytes.
    pub total_bytes: Option<u64>,
    /// Why it could not be read.
    pub error: Option<String>,
}

/// The free memory of each CUDA device of `host`, read through the driver.
fn device_memory(host: &HardwareProfile) -> Vec<DeviceMemoryCheck> {
    let cudas = host.devices.iter().filter(|d| d.kind == crate::model::device::DeviceKind::Cuda).count();
    (0..cudas)
        .map(|i| {
            let read = crate::backend::cuda::probe::free_memory_reader(i).and_then(|r| r.read());
            let (free, total, error) = match read {
                Ok((f, t)) => (Some(f), Some(t), None),
                Err(e) => (None, None, Some(e)),
            };
            DeviceMemoryCheck { device: format!("cuda:{i}"), free_bytes: free, total_bytes: total, error }
        })
        .collect()
}

/// The policy `LayerZero::host` would serve with, and where each override came from.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PolicyCheck {
    /// The policy file (absent: the default policy).
    pub file: Option<String>,
    /// The hash of the policy in force (what plans and cached choices are keyed by).
    pub hash: String,
    /// Rules (time-boxed ones included).
    pub rules: usize,
    /// Policy fields and rules set by knobs, and the plan mode when its knob sets it.
    pub overrides: Vec<PolicyOverride>,
    /// The health settings (breakers, deadline, output checks).
    pub health: crate::health::HealthConfig,
}

/// The policy `LayerZero::host` would use under `env`, checked against `catalog`.
fn check_policy(catalog: &Catalog, env: Lookup<'_>) -> Result<PolicyCheck, String> {
    let settings = Settings::from_lookup(env).map_err(|e| e.to_string())?;
    let file = settings.policy.clone();
    let mut policy = match &file {
        Some(path) => Policy::load(path).map_err(|e| e.to_string())?,
        None => Policy::default(),
    };
    let mut overrides = policy.apply_overrides(&settings.policy_overrides());
    policy.check_against(catalog).map_err(|e| e.to_string())?;
    if let Some(mode) = knobs::PLAN_MODE.current_in(env) {
        overrides.push(PolicyOverride { knob: knobs::PLAN_MODE.name(), field: "plan_mode", value: mode });
    }
    Ok(PolicyCheck {
        file: file.map(|p| p.display().to_string()),
        hash: policy.hash(),
        rules: policy.rules.len(),
        overrides,
        health: crate::health::HealthConfig::of(&policy),
    })
}

/// One backend of the catalog.
#[derive(Debug, Clone)]
pub struct BackendCheck {
    /// Its name.
    pub backend: String,
    /// The device it runs on.
    pub device: DeviceKind,
    /// How it executes.
    pub execution: Execution,
    /// Its version.
    pub version: String,
    /// How many kernels it declares.
    pub kernels: usize,
    /// Whether it can run here, and why not.
    pub status: BackendStatus,
    /// The library it was loaded from and its version (backends whose probe reads one).
    pub library: Option<crate::select::LoadedLibrary>,
}

/// The sample selection: causal GQA attention prefill on the primary device.
#[derive(Debug, Clone)]
pub struct SampleSelection {
    /// The primary device's kind.
    pub device: DeviceKind,
    /// The request selected for.
    pub request: Request,
    /// The winner and its modeled time in ns, or why nothing qualified.
    pub result: std::result::Result<(String, f64), String>,
}

/// What doctor found at the PerfDB path. A missing file is not created: doctor only looks.
#[derive(Debug, Clone, Default)]
pub struct PerfDbCheck {
    /// The path looked at.
    pub path: PathBuf,
    /// Whether a file was there.
    pub exists: bool,
    /// Its statistics, when it could be read.
    pub stats: Option<DbStats>,
    /// Set when the file was damaged and moved aside.
    pub recovered: Option<Recovery>,
    /// Why it could not be opened or read.
    pub error: Option<String>,
    /// This machine's parity records that failed: `kernel (dtype, bucket): detail`.
    pub parity_failing: Vec<String>,
}

/// Whether a configured dispatch table loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanStatus {
    /// No `LAYERZERO_DISPATCH_TABLE`: selection is live and cached.
    None,
    /// The table loaded.
    Loaded,
    /// The table, its policy or the selector for it was refused; `PlanCheck::reason` says why.
    Refused,
}

/// The plan a runtime here would serve with: `LAYERZERO_DISPATCH_TABLE` under
/// `LAYERZERO_PLAN_MODE` and `LAYERZERO_POLICY`, checked against this host; and the cache size.
#[derive(Debug, Clone)]
pub struct PlanCheck {
    /// `LAYERZERO_PLAN_MODE`; `None` when its value is invalid.
    pub mode: Option<PlanMode>,
    /// The table path, when one is configured.
    pub table: Option<String>,
    /// Whether it loads.
    pub status: PlanStatus,
    /// Entries served.
    pub entries: usize,
    /// Entries dropped because their kernel is no longer eligible here.
    pub dropped: usize,
    /// Why it was refused.
    pub reason: Option<String>,
    /// `LAYERZERO_CACHE_CAPACITY`; `None` when its value is invalid.
    pub cache_slots: Option<u64>,
}

/// Examines this installation. Fails only when no selector can be built for this host.
pub fn doctor(inputs: &DoctorInputs<'_>) -> Result<DoctorReport> {
    let catalog = &inputs.catalog;
    let detection = detect::detect_host();
    let host = Arc::new(detection.profile);
    let availability = Arc::new(crate::host::probe::probe(catalog, &host));
    let files = files::shipped();
    let selector = Selector::new(catalog.clone(), host.clone(), Arc::new(Policy::default()), availability.clone())?;
    let device = host.primary().kind;
    let request = sample_request(device);
    let result = selector.select(&request).map(|s| (s.kernel, s.score.total_ns)).map_err(|e| e.to_string());
    let knobs = knobs::report_in(inputs.env);
    let (settings, _) = Settings::lenient(inputs.env);
    let perfdb =
        check_perfdb(inputs.perfdb.map_or_else(|| settings.perfdb_path(), Path::to_path_buf), &host.fingerprint);
    let plan = check_plan(catalog, &host, &availability, inputs.env);
    let calibration = check_calibration(&settings.calibration_path(), &host);
    let backends = catalog
        .backends()
        .iter()
        .map(|b| BackendCheck {
            backend: b.backend.clone(),
            device: b.device,
            execution: b.execution,
            version: b.version.clone(),
            kernels: b.kernels.len(),
            status: availability.status(&b.backend),
            library: availability.library(&b.backend).cloned(),
        })
        .collect();
    let policy = check_policy(catalog, inputs.env);
    let lock = settings.lock_path();
    // The policy's allowlist and isolation, as the host applies them (an unreadable policy is
    // reported above).
    let mut effective = settings.policy.as_deref().and_then(|p| Policy::load(p).ok()).unwrap_or_default();
    effective.apply_overrides(&settings.policy_overrides());
    let loading = crate::plugins::Loading::new(&effective, &settings);
    let plugins = (lock.display().to_string(), crate::plugins::states(&lock, &loading).map_err(|e| e.to_string()));
    let plugins_ok = plugins.1.as_ref().is_ok_and(|states| states.iter().all(|s| s.error.is_none()));
    let ok = plugins_ok
        && files.iter().all(FileCheck::is_valid)
        && policy.is_ok()
        && result.is_ok()
        && knobs.iter().all(|k| k.error.is_none())
        && perfdb.ok()
        && plan.status != PlanStatus::Refused;
    let device_memory = device_memory(&host);
    Ok(DoctorReport {
        hardware: host,
        hardware_notes: detection.notes,
        device_memory,
        capabilities_hash: catalog.hash().to_owned(),
        backends,
        files,
        sample: SampleSelection { device, request, result },
        perfdb,
        calibration,
        plan,
        knobs,
        policy,
        plugins,
        ok,
    })
}

impl DoctorReport {
    /// The report as `lz doctor --json` prints it (`schemas/doctor.schema.json`).
    pub fn to_json(&self) -> serde_json::Value {
        let mut hw = self.hardware.to_file_json();
        hw["fingerprint"] = serde_json::Value::String(self.hardware.fingerprint.clone());
        let backends: Vec<serde_json::Value> = self
            .backends
            .iter()
            .map(|b| {
                let (status, reason) = match &b.status {
                    BackendStatus::Available => ("available", None),
                    BackendStatus::NotInstalled(r) => ("not_installed", Some(r)),
                    BackendStatus::Unhealthy(r) => ("unhealthy", Some(r)),
                };
                serde_json::json!({
                    "backend": b.backend, "device": b.device, "execution": b.execution, "version": b.version,
                    "kernels": b.kernels, "status": status, "reason": reason,
                    "library": b.library.as_ref().map(|l| serde_json::json!({"path": l.path, "version": l.version, "isa": l.isa,
                                                                  "note": threads_note(&b.backend)})),
                })
            })
            .collect();
        let request = &self.sample.request;
        let sample = match &self.sample.result {
            Ok((kernel, ns)) => serde_json::json!({
                "request": request, "selected": kernel, "estimated_ns": ns, "error": null,
            }),
            Err(e) => serde_json::json!({"request": request, "selected": null, "estimated_ns": null, "error": e}),
        };
        serde_json::json!({
            "layerzero_version": env!("CARGO_PKG_VERSION"),
            "ok": self.ok,
            "hardware": hw,
            "hardware_notes": self.hardware_notes,
            "device_memory": self.device_memory,
            "capabilities_hash": self.capabilities_hash,
            "backends": backends,
            "files": self.files.iter().map(|f| serde_json::json!({"file": f.file, "kind": f.kind, "valid": f.is_valid(), "errors": f.errors})).collect::<Vec<_>>(),
            "sample_selection": sample,
            "perfdb": self.perfdb.to_json(),
            "calibration": {"path": self.calibration.0, "used": self.calibration.1, "detail": self.calibration.2},
            "plan": self.plan.to_json(),
            "knobs": self.knobs,
            "plugins": match &self.plugins.1 {
                Ok(states) => serde_json::json!({"lockfile": self.plugins.0, "error": null, "locked": states}),
                Err(e) => serde_json::json!({"lockfile": self.plugins.0, "error": e, "locked": []}),
            },
            "policy": match &self.policy {
                Ok(p) => serde_json::json!({"file": p.file, "hash": p.hash, "rules": p.rules, "overrides": p.overrides,
                                            "health": p.health, "error": null}),
                Err(e) => serde_json::json!({"file": null, "hash": null, "rules": null, "overrides": [], "health": null, "error": e}),
            },
        })
    }
}

impl PerfDbCheck {
    /// Readable, intact when present, and no kernel failed its parity check on this machine.
    pub fn ok(&self) -> bool {
        self.error.is_none()
            && self.stats.as_ref().is_none_or(|s| s.integrity == "ok")
            && self.parity_failing.is_empty()
    }

    /// The `perfdb` object of the doctor report.
    pub fn to_json(&self) -> serde_json::Value {
        let s = self.stats.as_ref();
        serde_json::json!({
            "path": self.path.display().to_string(),
            "exists": self.exists,
            "rows": s.map(|s| s.rows),
            "fingerprints": s.map(|s| s.fingerprints),
            "last_tune": s.and_then(|s| s.last_tune),
            "integrity": s.map(|s| s.integrity.clone()),
            "schema_version": s.map(|s| s.schema_version),
            "parity_records": s.map(|s| s.parity_records),
            "parity_failed": s.map(|s| s.parity_failed),
            "parity_failing_here": self.parity_failing,
            "recovered": self.recovered.as_ref().map(|r| serde_json::json!({
                "moved_to": r.moved_to.display().to_string(), "why": r.why,
            })),
            "error": self.error,
        })
    }
}

impl PlanCheck {
    /// The `plan` object of the doctor report.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "mode": self.mode, "table": self.table, "status": self.status, "entries": self.entries,
            "dropped": self.dropped, "reason": self.reason, "cache_slots": self.cache_slots,
        })
    }
}

/// A typical attention request for the primary device: causal GQA prefill.
fn sample_request(kind: DeviceKind) -> Request {
    let (dtype, seq) = match kind {
        DeviceKind::Cpu => (DType::F32, 512),
        DeviceKind::Cuda | DeviceKind::Rocm => (DType::BF16, 2048),
    };
    let t = |h: u64| TensorDesc::new(dtype, [1, seq, h, 128]).with_layout(Layout::Bshd);
    Request::new(Op::Attention)
        .tensor("q", t(32))
        .tensor("k", t(8))
        .tensor("v", t(8))
        .attrs(Attrs::Attention(AttentionAttrs { causal: true, ..AttentionAttrs::default() }))
}

/// Opens the PerfDB at `path` if the file exists (moving it aside if it is damaged) and reads
/// its statistics.
/// oneDNN's GNU OpenMP workers spin after each call unless `OMP_WAIT_POLICY=PASSIVE`; on
/// shared cores that spinning slows LayerZero's own (rayon) kernels that run next: with it
/// passive, the `cpu` kernels won 18 of 30 contested buckets on the 2-core VM instead of 2
/// (`lz tune --verify`, linear/gelu/swiglu), and oneDNN's own calls got slower (its workers
/// wake up for each). Which is better depends on the mix: the note says to measure both.
pub fn threads_note(backend: &str) -> Option<String> {
    if backend != "onednn" {
        return None;
    }
    let policy = std::env::var("OMP_WAIT_POLICY").unwrap_or_default();
    (!policy.eq_ignore_ascii_case("passive")).then(|| {
        format!(
            "OMP_WAIT_POLICY is {}: oneDNN's OpenMP workers spin after each call and slow LayerZero's own kernels on \
             the same cores; compare `lz tune --verify` with OMP_WAIT_POLICY=PASSIVE",
            if policy.is_empty() { "unset".to_owned() } else { policy }
        )
    })
}

/// Whether `LayerZero::host` would model with the calibration at `path`, and why (not).
fn check_calibration(path: &Path, host: &HardwareProfile) -> (String, bool, String) {
    let shown = path.display().to_string();
    if !path.exists() {
        return (shown, false, "absent: the capability files' coefficients model every kernel".to_owned());
    }
    match crate::score::calibration::Calibration::load(path) {
        Err(e) => (shown, false, format!("not used: {e}")),
        Ok(c) if c.fingerprint != host.fingerprint => (
            shown,
            false,
            format!(
                "not used: fitted on {} ({}), not this machine",
                c.hardware,
                c.fingerprint.get(..16).unwrap_or(&c.fingerprint)
            ),
        ),
        Ok(c) => {
            (shown, true, format!("{} kernel fits from workload `{}`, {}", c.kernels.len(), c.workload, c.created_at))
        }
    }
}

fn check_perfdb(path: PathBuf, fingerprint: &str) -> PerfDbCheck {
    let mut check = PerfDbCheck { exists: path.exists(), ..PerfDbCheck::default() };
    if check.exists {
        match PerfDb::open(&path) {
            Ok(opened) => {
                check.recovered = opened.recovered;
                match opened.db.stats() {
                    Ok(s) => check.stats = Some(s),
                    Err(e) => check.error = Some(e.to_string()),
                }
                match opened.db.parity_for(fingerprint) {
                    Ok(records) => {
                        check.parity_failing = records
                            .iter()
                            .filter(|r| r.status == crate::perfdb::ParityStatus::Fail)
                            .map(|r| {
                                let detail = r.detail.as_deref().unwrap_or("failed");
                                let cos = r.cosine.map(|c| format!(", cosine {c:.4}")).unwrap_or_default();
                                format!("{} ({} {}, {}): {detail}{cos}", r.kernel, r.op, r.dtype, r.bucket)
                            })
                            .collect()
                    }
                    Err(e) => check.error = Some(e.to_string()),
                }
            }
            Err(e) => check.error = Some(e.to_string()),
        }
    }
    check.path = path;
    check
}

fn check_plan(
    catalog: &Arc<Catalog>,
    host: &Arc<HardwareProfile>,
    availability: &Arc<Availability>,
    env: Lookup<'_>,
) -> PlanCheck {
    let mut check = PlanCheck {
        mode: knobs::PLAN_MODE.value_in(env).ok(),
        table: None,
        status: PlanStatus::None,
        entries: 0,
        dropped: 0,
        reason: None,
        cache_slots: knobs::CACHE_CAPACITY.value_in(env).ok(),
    };
    let (settings, _) = Settings::lenient(env);
    let Some(path) = settings.dispatch_table else { return check };
    check.table = Some(path.display().to_string());
    let loaded = settings
        .policy
        .map_or_else(|| Ok(Policy::default()), |p| Policy::load(&p))
        .and_then(|policy| Selector::new(catalog.clone(), host.clone(), Arc::new(policy), availability.clone()))
        .and_then(|selector| crate::plan::table::load(&path, &selector).map_err(|r| r.error));
    match loaded {
        Ok(plan) => {
            check.status = PlanStatus::Loaded;
            check.entries = plan.len();
            check.dropped = plan.dropped().len();
        }
        Err(e) => {
            check.status = PlanStatus::Refused;
            check.reason = Some(e.to_string());
        }
    }
    check
}
