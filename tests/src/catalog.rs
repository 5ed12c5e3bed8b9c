//! Fake capability files: a backend and its kernels written as the JSON a capability file
//! holds, loaded the way the shipped files are. The defaults are what every fake shares, so a
//! test states only the fields it is about.
//!
//! ```ignore
//! let k = |id, eff| Kernel::new(id, Op::Attention).efficiency(eff).perf("launch_ns", 100);
//! let catalog = Backend::new("probe", "cpu").kernel(k("probe.attention.fast", 0.9)).catalog()?;
//! ```

use std::sync::Arc;

use layerzero::capabilities::catalog::Catalog;
use layerzero::model::op::Op;
use serde_json::{Value, json};

use crate::TestResult;

/// One fake backend: one capability file.
#[derive(Debug, Clone)]
pub struct Backend(Value);

impl Backend {
    /// Backend `name` on `device` (`cpu`, `cuda`, ...), builtin, of version 0, with no
    /// kernels yet.
    pub fn new(name: &str, device: &str) -> Self {
        Backend(json!({"schema_version": 1, "backend": name, "description": "a test's fake backend",
                       "device": device, "version": "0", "execution": "builtin", "kernels": []}))
    }

    /// Sets a field of the file (`execution`, `probe`, `version`, ...).
    pub fn with(mut self, field: &str, value: impl Into<Value>) -> Self {
        self.0[field] = value.into();
        self
    }

    /// Adds a kernel.
    pub fn kernel(mut self, kernel: Kernel) -> Self {
        if let Some(kernels) = self.0["kernels"].as_array_mut() {
            kernels.push(kernel.0);
        }
        self
    }

    /// The catalog of this backend alone.
    pub fn catalog(self) -> TestResult<Arc<Catalog>> {
        catalog_of([self])
    }
}

/// The catalog of several fake backends, one file each (`<backend>.json`).
pub fn catalog_of(backends: impl IntoIterator<Item = Backend>) -> TestResult<Arc<Catalog>> {
    let files: Vec<(String, String)> = backends
        .into_iter()
        .map(|b| (format!("{}.json", b.0["backend"].as_str().unwrap_or_default()), b.0.to_string()))
        .collect();
    Ok(Arc::new(Catalog::from_texts(&files)?))
}

/// One fake kernel.
#[derive(Debug, Clone)]
pub struct Kernel(Value);

impl Kernel {
    /// Kernel `id` of `op` with no constraints; deterministic, not graph safe, no JIT, no
    /// workspace; efficiencies of 0.5 and a launch of 1 µs.
    pub fn new(id: &str, op: Op) -> Self {
        let properties = json!({"deterministic": true, "graph_safe": false, "needs_jit": false, "workspace_bytes": 0});
        let perf = json!({"eff_compute": 0.5, "eff_mem": 0.5, "launch_ns": 1000});
        Kernel(json!({"id": id, "op": op, "constraints": {}, "properties": properties, "perf": perf}))
    }

    /// An attention kernel that takes grouped queries and causal masks of either alignment:
    /// every call the runtime tests make.
    pub fn attention(id: &str) -> Self {
        Kernel::new(id, Op::Attention)
            .constraints(json!({"gqa": {"supported": true}, "causal": {"alignments": ["bottom_right", "top_left"]}}))
    }

    /// A kernel of a shipped capability file (`capabilities/<file>.json`), as declared.
    pub fn shipped(file: &str, id: &str) -> TestResult<Self> {
        let path = crate::repo_root().join("capabilities").join(format!("{file}.json"));
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let kernel = doc["kernels"].as_array().and_then(|ks| ks.iter().find(|k| k["id"] == id));
        Ok(Kernel(kernel.cloned().ok_or_else(|| format!("{id} is not declared in {}", path.display()))?))
    }

    /// Replaces the constraints.
    pub fn constraints(mut self, constraints: Value) -> Self {
        self.0["constraints"] = constraints;
        self
    }

    /// Sets one property (`graph_safe`, `workspace_bytes`, ...).
    pub fn property(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.0["properties"][name] = value.into();
        self
    }

    /// Sets one perf coefficient (`eff_compute`, `launch_ns`, `fused`, ...).
    pub fn perf(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.0["perf"][name] = value.into();
        self
    }

    /// The same efficiency for compute and memory.
    pub fn efficiency(self, eff: f64) -> Self {
        self.perf("eff_compute", eff).perf("eff_mem", eff)
    }

    /// Sets any other field of the kernel (`id`, `execution`, `library_versions`, ...).
    pub fn with(mut self, field: &str, value: impl Into<Value>) -> Self {
        self.0[field] = value.into();
        self
    }
}
