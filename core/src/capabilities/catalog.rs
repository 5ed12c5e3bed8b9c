//! The catalog: every backend's kernels, loaded and validated, indexed by op, hashed.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use super::spec::{
    BackendSpec, CAPABILITIES_SCHEMA_VERSION, KernelSpec, PAD_MULTIPLES, declared_op_fields, fields_for_op,
};
use crate::error::{Error, ErrorKind, Result};
use crate::model::op::Op;
use crate::schema::{self, SchemaKind};

/// Index of a kernel in the catalog.
pub type KernelIndex = usize;

/// All backends and kernels LayerZero knows, with the capabilities hash.
#[derive(Debug, Clone)]
pub struct Catalog {
    backends: Vec<BackendSpec>,
    /// (backend index, kernel index within backend), sorted by kernel id.
    kernels: Vec<(usize, usize)>,
    by_op: Vec<Vec<KernelIndex>>,
    hash: String,
}

/// The capability files shipped in `capabilities/`, compiled in.
const BUILTIN: &[(&str, &str)] = &[
    ("cpu_reference.json", include_str!("../../../capabilities/cpu_reference.json")),
    ("cpu.json", include_str!("../../../capabilities/cpu.json")),
    ("onednn.json", include_str!("../../../capabilities/onednn.json")),
    ("flash_attn_2.json", include_str!("../../../capabilities/flash_attn_2.json")),
    ("flash_attn_3.json", include_str!("../../../capabilities/flash_attn_3.json")),
    ("flashinfer.json", include_str!("../../../capabilities/flashinfer.json")),
    ("xformers.json", include_str!("../../../capabilities/xformers.json")),
    ("torch_sdpa.json", include_str!("../../../capabilities/torch_sdpa.json")),
    ("liger.json", include_str!("../../../capabilities/liger.json")),
    ("zendnn.json", include_str!("../../../capabilities/zendnn.json")),
];

impl Catalog {
    /// The shipped capability files (validated once per process).
    pub fn builtin() -> Result<Arc<Catalog>> {
        static BUILTIN_CATALOG: OnceLock<Result<Arc<Catalog>>> = OnceLock::new();
        BUILTIN_CATALOG
            .get_or_init(|| {
                let files: Vec<(String, String)> =
                    BUILTIN.iter().map(|(n, t)| (format!("capabilities/{n}"), (*t).to_owned())).collect();
                Catalog::from_texts(&files).map(Arc::new)
            })
            .clone()
    }

    /// Every `*.json` file directly in `dir` (hardware profiles live in a subfolder).
    pub fn load_dir(dir: &Path) -> Result<Catalog> {
        let entries = std::fs::read_dir(dir).map_err(|e| {
            Error::new(ErrorKind::Io, format!("cannot read capabilities folder {}: {e}", dir.display())).with_source(e)
        })?;
        let mut files = Vec::new();
        for entry in entries {
            let path =
                entry.map_err(|e| Error::new(ErrorKind::Io, format!("{}: {e}", dir.display())).with_source(e))?.path();
            if path.extension().is_some_and(|e| e == "json") && path.is_file() {
                let text = crate::files::read_to_string(&path)?;
                files.push((path.display().to_string(), text));
            }
        }
        files.sort();
        Catalog::from_texts(&files)
    }

    /// Builds a catalog from (origin, JSON text) pairs: schema-checked, typed, cross-checked.
    pub fn from_texts(files: &[(String, String)]) -> Result<Catalog> {
        let mut backends = Vec::new();
        for (origin, text) in files {
            backends.push(parse_backend(origin, text)?);
        }
        Catalog::from_backends(backends)
    }

    /// Builds a catalog from typed backends (cross-checks ids and fields).
    pub fn from_backends(mut backends: Vec<BackendSpec>) -> Result<Catalog> {
        backends.sort_by(|a, b| a.backend.cmp(&b.backend));
        for pair in backends.windows(2) {
            if pair[0].backend == pair[1].backend {
                return Err(Error::invalid(format!("backend {:?} is declared twice", pair[0].backend)));
            }
        }
        let mut kernels = Vec::new();
        for (bi, b) in backends.iter().enumerate() {
            if b.schema_version != CAPABILITIES_SCHEMA_VERSION {
                return Err(Error::invalid(format!(
                    "backend {}: field `schema_version` is {}; this build reads {CAPABILITIES_SCHEMA_VERSION}",
                    b.backend, b.schema_version
                )));
            }
            for (ki, k) in b.kernels.iter().enumerate() {
                validate_kernel(b, k)?;
                kernels.push((bi, ki));
            }
        }
        kernels.sort_by(|a, b| backends[a.0].kernels[a.1].id.cmp(&backends[b.0].kernels[b.1].id));
        for pair in kernels.windows(2) {
            let (a, b) = (&backends[pair[0].0].kernels[pair[0].1], &backends[pair[1].0].kernels[pair[1].1]);
            if a.id == b.id {
                return Err(Error::invalid(format!("kernel id {:?} is declared twice", a.id)));
            }
        }
        let mut by_op = vec![Vec::new(); Op::ALL.len()];
        for (i, &(bi, ki)) in kernels.iter().enumerate() {
            by_op[backends[bi].kernels[ki].op.index()].push(i);
        }
        let docs: Vec<serde_json::Value> =
            backends.iter().map(|b| serde_json::to_value(b).unwrap_or(serde_json::Value::Null)).collect();
        let hash = crate::canonical::hash(&serde_json::Value::Array(docs));
        Ok(Catalog { backends, kernels, by_op, hash })
    }

    /// blake3 over the canonical JSON of every backend: any capability change changes it.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The backends, sorted by name.
    pub fn backends(&self) -> &[BackendSpec] {
        &self.backends
    }

    /// A backend by name.
    pub fn backend(&self, name: &str) -> Option<&BackendSpec> {
        self.backends.iter().find(|b| b.backend == name)
    }

    /// Number of kernels.
    pub fn len(&self) -> usize {
        self.kernels.len()
    }

    /// True when there are no kernels.
    pub fn is_empty(&self) -> bool {
        self.kernels.is_empty()
    }

    /// The kernel at `i` and its backend.
    pub fn kernel(&self, i: KernelIndex) -> (&BackendSpec, &KernelSpec) {
        let (bi, ki) = self.kernels[i];
        let b = &self.backends[bi];
        (b, &b.kernels[ki])
    }

    /// All kernels, sorted by id.
    pub fn kernels(&self) -> impl Iterator<Item = (KernelIndex, &BackendSpec, &KernelSpec)> {
        (0..self.kernels.len()).map(|i| {
            let (b, k) = self.kernel(i);
            (i, b, k)
        })
    }

    /// Kernels of one op, sorted by id.
    pub fn candidates(&self, op: Op) -> &[KernelIndex] {
        &self.by_op[op.index()]
    }

    /// The kernel with this id.
    pub fn find(&self, id: &str) -> Option<KernelIndex> {
        self.kernels.binary_search_by(|&(bi, ki)| self.backends[bi].kernels[ki].id.as_str().cmp(id)).ok()
    }
}

fn parse_backend(origin: &str, text: &str) -> Result<BackendSpec> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
    check_schema_version(origin, &value)?;
    schema::validate(SchemaKind::Capabilities, &value, origin)?;
    serde_path_to_error::deserialize(value)
        .map_err(|e| Error::invalid(format!("{origin}: field `{}`: {}", e.path(), e.inner())))
}

/// A file of another schema version is refused before its fields are read, naming the
/// version found and the one read here: no earlier version was ever published, so there is
/// nothing to migrate from, and a later one may mean things this build would misread.
fn check_schema_version(origin: &str, value: &serde_json::Value) -> Result<()> {
    let found = &value["schema_version"];
    match found.as_u64() {
        Some(v) if v == u64::from(CAPABILITIES_SCHEMA_VERSION) => Ok(()),
        Some(v) => {
            let what = if v > u64::from(CAPABILITIES_SCHEMA_VERSION) {
                "newer than this build; upgrade layerzero to read it"
            } else {
                "older than any published version; nothing migrates it: rewrite it for the current schema"
            };
            Err(Error::invalid(format!(
                "{origin}: capabilities schema version {v} ({what}); this build reads schema version {CAPABILITIES_SCHEMA_VERSION}"
            )))
        }
        // Missing or not a number: the schema check names the field.
        None => Ok(()),
    }
}

fn validate_kernel(b: &BackendSpec, k: &KernelSpec) -> Result<()> {
    let prefix = format!("{}.{}.", b.backend, k.op);
    let variant = k.id.strip_prefix(&prefix).unwrap_or("");
    let variant_ok =
        !variant.is_empty() && variant.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !variant_ok {
        return Err(Error::invalid(format!(
            "backend {}: kernel id {:?} must be `{prefix}VARIANT` with VARIANT in [a-z0-9_]",
            b.backend, k.id
        )));
    }
    if let Some(v) = &k.library_versions {
        let parse = crate::capabilities::Version::parse;
        match (parse(&v.min), parse(&v.below)) {
            (Some(lo), Some(hi)) if lo < hi => {}
            _ => {
                return Err(Error::invalid(format!(
                    "kernel {}: field `library_versions` is min {:?}, below {:?}; expected versions with min < below",
                    k.id, v.min, v.below
                )));
            }
        }
    }
    if let Some(p) = k.constraints.head_dim.as_ref().and_then(|h| h.padded_to)
        && !PAD_MULTIPLES.iter().any(|(m, _)| *m == p)
    {
        let known: Vec<String> = PAD_MULTIPLES.iter().map(|(m, _)| m.to_string()).collect();
        return Err(Error::invalid(format!(
            "kernel {}: field `constraints.head_dim.padded_to` is {p}; expected one of {}",
            k.id,
            known.join(", ")
        )));
    }
    let allowed = fields_for_op(k.op);
    if let Some(field) = declared_op_fields(&k.constraints).into_iter().find(|f| !allowed.contains(f)) {
        return Err(Error::invalid(format!(
            "kernel {}: field `constraints.{field}` does not apply to op {} (nothing would check it)",
            k.id, k.op
        )));
    }
    let p = &k.perf;
    for (name, v) in [("eff_compute", p.eff_compute), ("eff_mem", p.eff_mem)] {
        if !(v > 0.0 && v <= 1.0) {
            return Err(Error::invalid(format!("kernel {}: field `perf.{name}` is {v}; it must be in (0, 1]", k.id)));
        }
    }
    if p.fused && !matches!(k.op, Op::Mlp | Op::MoeExperts) {
        return Err(Error::invalid(format!(
            "kernel {}: field `perf.fused` applies to mlp and moe_experts only (nothing else reads it)",
            k.id
        )));
    }
    if !(p.launch_ns.is_finite() && p.launch_ns >= 0.0) {
        return Err(Error::invalid(format!(
            "kernel {}: field `perf.launch_ns` is {}; it must be >= 0",
            k.id, p.launch_ns
        )));
    }
    let device_fields = match k.device_kind(b) {
        crate::model::device::DeviceKind::Cpu => ["compute_capability", "built_archs", "gfx"],
        crate::model::device::DeviceKind::Cuda => ["cpu_isa", "gfx", ""],
        crate::model::device::DeviceKind::Rocm => ["cpu_isa", "compute_capability", "built_archs"],
    };
    let c = &k.constraints;
    let present = |f: &str| match f {
        "compute_capability" => c.compute_capability.is_some(),
        "built_archs" => c.built_archs.is_some(),
        "gfx" => c.gfx.is_some(),
        "cpu_isa" => c.cpu_isa.is_some(),
        _ => false,
    };
    if let Some(f) = device_fields.iter().find(|f| present(f)) {
        return Err(Error::invalid(format!(
            "kernel {}: field `constraints.{f}` does not apply to a {} kernel",
            k.id,
            k.device_kind(b)
        )));
    }
    Ok(())
}
