//! Every `LAYERZERO_*` environment variable, declared once as data: its name, type, default,
//! what it does, and how its current value is read and checked.
//!
//! The library reads `LAYERZERO_*` variables only through the knobs here, so `lz doctor` can
//! list them all and a bad value is an error naming the variable and the value. Every function
//! has an `_in` form that takes the environment as a lookup function, for tests and tools that
//! must not touch the process environment. An empty value counts as unset.

use std::ffi::OsString;
use std::path::PathBuf;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::policy::{Action, Rule};

/// The type of a knob's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnobType {
    /// A file or folder path.
    Path,
    /// `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off` (case-insensitive).
    Bool,
    /// A non-negative integer.
    U64,
    /// Free text.
    String,
    /// One of the listed words.
    Enum(&'static [&'static str]),
}

impl KnobType {
    /// The type as shown by `lz doctor`: `path`, `bool`, `u64`, `string` or `enum(a|b|c)`.
    pub fn name(&self) -> String {
        match self {
            KnobType::Path => "path".to_owned(),
            KnobType::Bool => "bool".to_owned(),
            KnobType::U64 => "u64".to_owned(),
            KnobType::String => "string".to_owned(),
            KnobType::Enum(values) => format!("enum({})", values.join("|")),
        }
    }
}

/// A parsed knob value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KnobValue {
    /// A path.
    Path(PathBuf),
    /// A boolean.
    Bool(bool),
    /// An unsigned integer.
    U64(u64),
    /// Free text.
    String(String),
    /// One of the type's words (lower case).
    Enum(&'static str),
}

/// One environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knob {
    /// The variable, `LAYERZERO_...`.
    pub name: &'static str,
    /// Its type.
    pub ty: KnobType,
    /// The default, as text (a description where it is computed, e.g. a folder).
    pub default: &'static str,
    /// What it does.
    pub doc: &'static str,
}

/// Where the run-time state lives (PerfDB, JIT cache).
pub const HOME: Knob = Knob {
    name: "LAYERZERO_HOME",
    ty: KnobType::Path,
    default: "the user cache folder: $XDG_CACHE_HOME/layerzero, else $HOME/.cache/layerzero \
              (macOS ~/Library/Caches/layerzero, Windows %LOCALAPPDATA%\\layerzero)",
    doc: "Folder for LayerZero's run-time state: the PerfDB and the JIT cache.",
};

/// The PerfDB file.
pub const PERFDB: Knob = Knob {
    name: "LAYERZERO_PERFDB",
    ty: KnobType::Path,
    default: "$LAYERZERO_HOME/perfdb.sqlite",
    doc: "The PerfDB (SQLite timing database) file.",
};

/// Whether a loaded dispatch table is used.
pub const PLAN_MODE: Knob = Knob {
    name: "LAYERZERO_PLAN_MODE",
    ty: KnobType::Enum(&["off", "prefer", "strict"]),
    default: "prefer",
    doc: "off: ignore dispatch tables; prefer: use a dispatch table when one is loaded (a miss or \
          mismatch runs live selection and is reported); strict: refuse on a table mismatch or miss.",
};

/// A dispatch table to load.
pub const DISPATCH_TABLE: Knob = Knob {
    name: "LAYERZERO_DISPATCH_TABLE",
    ty: KnobType::Path,
    default: "none",
    doc: "Dispatch table file to load at start-up.",
};

/// A policy file to load.
pub const POLICY: Knob = Knob {
    name: "LAYERZERO_POLICY",
    ty: KnobType::Path,
    default: "none",
    doc: "Policy file to load at start-up (absent: the default policy).",
};

/// Selection cache size.
pub const CACHE_CAPACITY: Knob = Knob {
    name: "LAYERZERO_CACHE_CAPACITY",
    ty: KnobType::U64,
    default: "4096",
    doc: "Maximum number of entries in the selection cache.",
};

/// Which end-to-end sections run.
pub const E2E: Knob = Knob {
    name: "LAYERZERO_E2E",
    ty: KnobType::String,
    default: "all sections",
    doc: "End-to-end suite only: comma-separated section numbers to run (e.g. `6.1,7.3`).",
};

/// Where a model's weights are served from.
pub const WEIGHTS: Knob = Knob {
    name: "LAYERZERO_WEIGHTS",
    ty: KnobType::Enum(&["resident", "mapped"]),
    default: "resident",
    doc: "resident: a model's weights are copied once at load from the memory-mapped safetensors \
          files into memory backed by transparent huge pages (faster kernels); mapped: kernels read \
          the mapped files in place (no copy; the page cache is shared between processes).",
};

/// The most bytes an input file may hold.
pub const MAX_READ_BYTES: Knob = Knob {
    name: "LAYERZERO_MAX_READ_BYTES",
    ty: KnobType::U64,
    default: "268435456",
    doc: "The most bytes LayerZero reads from one input file or standard input (requests, \
          policies, tables, workloads, configs, tokenizers, safetensors read whole); a larger \
          input is refused naming it. Memory-mapped model weights are not counted.",
};

/// Faults injected into dispatch, for drills.
pub const FAULTS: Knob = Knob {
    name: "LAYERZERO_FAULTS",
    ty: KnobType::String,
    default: "none",
    doc: "Drills only: KERNEL_OR_BACKEND=MODE[,...] makes the named kernels (a kernel id, or a \
          backend for all its kernels) fail on every dispatch; MODE is error, panic, slow:MS, nan, \
          oom, device_lost or fail_first:N. `lz doctor` warns while it is set.",
};

/// Overrides the policy's `health.failure_threshold`.
pub const FAILURE_THRESHOLD: Knob = Knob {
    name: "LAYERZERO_FAILURE_THRESHOLD",
    ty: KnobType::U64,
    default: "the policy's health.failure_threshold (3)",
    doc: "Consecutive failures (errors, panics, invalid outputs, out of memory) after which a kernel \
          is quarantined (at least 1).",
};

/// Overrides the policy's `health.cooldown_ms`.
pub const COOLDOWN_MS: Knob = Knob {
    name: "LAYERZERO_COOLDOWN_MS",
    ty: KnobType::U64,
    default: "the policy's health.cooldown_ms (30000)",
    doc: "How long a quarantined kernel or a disabled backend is not called before trial calls \
          probe it, in milliseconds.",
};

/// Overrides the policy's `health.half_open_trials`.
pub const HALF_OPEN_TRIALS: Knob = Knob {
    name: "LAYERZERO_HALF_OPEN_TRIALS",
    ty: KnobType::U64,
    default: "the policy's health.half_open_trials (1)",
    doc: "Trial calls let through once a cooldown has passed (at least 1); a success closes the \
          breaker, a failure opens it again.",
};

/// Overrides the policy's `health.max_abandoned`.
pub const MAX_ABANDONED: Knob = Knob {
    name: "LAYERZERO_MAX_ABANDONED",
    ty: KnobType::U64,
    default: "the policy's health.max_abandoned (4)",
    doc: "Calls of one backend abandoned at their deadline and still running beyond which the \
          whole backend is disabled.",
};

/// Overrides the policy's `kernel_timeout_ms`.
pub const KERNEL_TIMEOUT_MS: Knob = Knob {
    name: "LAYERZERO_KERNEL_TIMEOUT_MS",
    ty: KnobType::U64,
    default: "the policy's kernel_timeout_ms (none)",
    doc: "Per-kernel deadline in milliseconds (at least 1): kernels run on runner threads and one \
          that has not returned by then is abandoned, quarantined, and the next kernel runs \
          (KERNEL_TIMEOUT).",
};

/// Overrides the policy's `validate_outputs`.
pub const VALIDATE_OUTPUTS: Knob = Knob {
    name: "LAYERZERO_VALIDATE_OUTPUTS",
    ty: KnobType::Bool,
    default: "the policy's validate_outputs (false; `lz run` checks)",
    doc: "Check every output for NaN/Inf the inputs did not have; such outputs are discarded and \
          the next kernel runs (KERNEL_OUTPUT_INVALID).",
};

/// Rules appended to the policy: prefer these kernels.
pub const PREFER: Knob = Knob {
    name: "LAYERZERO_PREFER",
    ty: KnobType::String,
    default: "none",
    doc: "Comma-separated kernel ids or globs to prefer: each becomes a policy rule \
          `{\"action\": \"prefer\", \"kernels\": GLOB}` (score x0.5) after the policy file's rules.",
};

/// Rules appended to the policy: avoid these kernels.
pub const AVOID: Knob = Knob {
    name: "LAYERZERO_AVOID",
    ty: KnobType::String,
    default: "none",
    doc: "Comma-separated kernel ids or globs to avoid: each becomes a policy rule \
          `{\"action\": \"avoid\", \"kernels\": GLOB}` (score x2) after the policy file's rules.",
};

/// Rules appended to the policy: deny these kernels.
pub const DENY: Knob = Knob {
    name: "LAYERZERO_DENY",
    ty: KnobType::String,
    default: "none",
    doc: "Comma-separated kernel ids or globs never to run: each becomes a policy rule \
          `{\"action\": \"deny\", \"kernels\": GLOB}` after the policy file's rules.",
};

/// Overrides the policy's `strict_mode`.
pub const STRICT_MODE: Knob = Knob {
    name: "LAYERZERO_STRICT_MODE",
    ty: KnobType::Bool,
    default: "the policy's strict_mode (false)",
    doc: "Reject kernels that need an implicit transform (layout, contiguity, dtype cast).",
};

/// How often a watched policy file is checked for changes.
pub const POLICY_POLL_MS: Knob = Knob {
    name: "LAYERZERO_POLICY_POLL_MS",
    ty: KnobType::U64,
    default: "1000",
    doc: "How often the process-wide handle (and `LayerZero::watch_policy`) checks the \
          LAYERZERO_POLICY file for changes, in milliseconds (at least 10); a changed, valid file \
          replaces the policy while serving, an invalid one is reported and the old policy kept.",
};

/// The selection log.
pub const LOG: Knob = Knob {
    name: "LAYERZERO_LOG",
    ty: KnobType::String,
    default: "none (no log)",
    doc: "The structured log on standard error: `json` or `text`, optionally followed by \
          RUST_LOG-style directives (`json,layerzero::selection=info,layerzero::dispatch=debug`; \
          default `layerzero=info`). Spans lz.select and lz.dispatch, selection and fallback events.",
};

/// OpenTelemetry span export.
pub const OTEL: Knob = Knob {
    name: "LAYERZERO_OTEL",
    ty: KnobType::Enum(&["stdout", "otlp"]),
    default: "none",
    doc: "Export the lz.select and lz.dispatch spans with OpenTelemetry (builds with the `otel` \
          feature): stdout, or otlp over HTTP to OTEL_EXPORTER_OTLP_ENDPOINT (default \
          http://localhost:4318).",
};

/// Fields written as `[redacted]`.
pub const REDACT: Knob = Knob {
    name: "LAYERZERO_REDACT",
    ty: KnobType::String,
    default: "none",
    doc: "Comma-separated fields written as [redacted] in logs, spans and snapshots: kernels, \
          shapes, ops, backends, or all.",
};

/// How often the host's memory headroom is re-read.
pub const MEMORY_POLL_MS: Knob = Knob {
    name: "LAYERZERO_MEMORY_POLL_MS",
    ty: KnobType::U64,
    default: "500",
    doc: "How often one thread re-reads this host's memory headroom (MemAvailable and the cgroup \
          limit) for selection, in milliseconds (at least 10); selection never reads it itself.",
};

/// Where oneDNN is.
pub const ONEDNN_LIB: Knob = Knob {
    name: "LAYERZERO_ONEDNN_LIB",
    ty: KnobType::Path,
    default: "search: the loader's libdnnl.so.3 / libdnnl.so.2, then $VIRTUAL_ENV/lib, $CONDA_PREFIX/lib",
    doc: "The oneDNN library (libdnnl.so.3) to load, tried before the loader's default paths and \
          the active Python environment's lib/ folder.",
};

/// The cost model's calibration for this machine.
pub const CALIBRATION: Knob = Knob {
    name: "LAYERZERO_CALIBRATION",
    ty: KnobType::Path,
    default: "$LAYERZERO_HOME/calibration.json",
    doc: "The cost-model calibration file (`lz tune --calibrate` writes it); used when its hardware \
          fingerprint is this machine's.",
};

/// A ceiling on the instruction set this host uses.
pub const CPU_ISA: Knob = Knob {
    name: "LAYERZERO_CPU_ISA",
    ty: KnobType::Enum(&["portable", "avx2", "avx512", "avx512_bf16", "amx", "native"]),
    default: "native",
    doc: "Caps the ISA that detection reports, the `cpu` kernels use and oneDNN may JIT for \
          (avx2: a Zen 3; avx512: an Ice Lake; avx512_bf16: a Zen 4, no AMX; amx; native: no cap), \
          so one machine can run and measure another's paths.",
};

static ALL: [Knob; 28] = [
    HOME,
    PERFDB,
    PLAN_MODE,
    DISPATCH_TABLE,
    POLICY,
    CACHE_CAPACITY,
    E2E,
    WEIGHTS,
    MAX_READ_BYTES,
    FAULTS,
    FAILURE_THRESHOLD,
    COOLDOWN_MS,
    HALF_OPEN_TRIALS,
    MAX_ABANDONED,
    KERNEL_TIMEOUT_MS,
    VALIDATE_OUTPUTS,
    PREFER,
    AVOID,
    DENY,
    STRICT_MODE,
    POLICY_POLL_MS,
    LOG,
    OTEL,
    REDACT,
    MEMORY_POLL_MS,
    ONEDNN_LIB,
    CALIBRATION,
    CPU_ISA,
];

/// A policy field set by a knob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyOverride {
    /// The variable.
    pub knob: &'static str,
    /// The policy field it sets.
    pub field: &'static str,
    /// The value it set, as text.
    pub value: String,
}

/// Applies the knobs that override policy fields (set in `env`) to `policy`, and lists
/// them. A bad value is an error naming the variable.
pub fn apply_policy_overrides_in(policy: &mut crate::policy::Policy, env: Lookup<'_>) -> Result<Vec<PolicyOverride>> {
    let mut applied = Vec::new();
    let positive = |knob: &Knob| -> Result<Option<u64>> {
        match knob.value_in(env)? {
            Some(KnobValue::U64(0)) => Err(Error::invalid(format!("{}=0: expected at least 1", knob.name))),
            Some(KnobValue::U64(n)) => Ok(Some(n)),
            _ => Ok(None),
        }
    };
    let small = |knob: &Knob, n: u64| {
        u32::try_from(n).map_err(|_| Error::invalid(format!("{}={n}: expected at most {}", knob.name, u32::MAX)))
    };
    let mut note = |knob: &Knob, field: &'static str, value: String| {
        applied.push(PolicyOverride { knob: knob.name, field, value });
    };
    if let Some(n) = positive(&FAILURE_THRESHOLD)? {
        policy.health.failure_threshold = small(&FAILURE_THRESHOLD, n)?;
        note(&FAILURE_THRESHOLD, "health.failure_threshold", n.to_string());
    }
    if let Some(KnobValue::U64(n)) = COOLDOWN_MS.value_in(env)? {
        policy.health.cooldown_ms = n;
        note(&COOLDOWN_MS, "health.cooldown_ms", n.to_string());
    }
    if let Some(n) = positive(&HALF_OPEN_TRIALS)? {
        policy.health.half_open_trials = small(&HALF_OPEN_TRIALS, n)?;
        note(&HALF_OPEN_TRIALS, "health.half_open_trials", n.to_string());
    }
    if let Some(KnobValue::U64(n)) = MAX_ABANDONED.value_in(env)? {
        policy.health.max_abandoned = small(&MAX_ABANDONED, n)?;
        note(&MAX_ABANDONED, "health.max_abandoned", n.to_string());
    }
    if let Some(n) = positive(&KERNEL_TIMEOUT_MS)? {
        policy.kernel_timeout_ms = Some(n);
        note(&KERNEL_TIMEOUT_MS, "kernel_timeout_ms", n.to_string());
    }
    if let Some(KnobValue::Bool(b)) = VALIDATE_OUTPUTS.value_in(env)? {
        policy.validate_outputs = b;
        note(&VALIDATE_OUTPUTS, "validate_outputs", b.to_string());
    }
    if let Some(KnobValue::Bool(b)) = STRICT_MODE.value_in(env)? {
        policy.strict_mode = b;
        note(&STRICT_MODE, "strict_mode", b.to_string());
    }
    for (knob, action) in [(&PREFER, Action::Prefer), (&AVOID, Action::Avoid), (&DENY, Action::Deny)] {
        let Some(list) = knob.current_in(env) else { continue };
        for glob in list.split(',').map(str::trim).filter(|g| !g.is_empty()) {
            if glob.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(Error::invalid(format!("{}: {glob:?} is not a kernel id or glob", knob.name)));
            }
            let i = policy.rules.len();
            policy.rules.push(Rule::new(action, glob).from_origin(format!("{}={list:?}", knob.name)));
            note(knob, "rules", format!("rules[{i}] = {} {glob}", action_name(action)));
        }
    }
    Ok(applied)
}

fn action_name(a: Action) -> &'static str {
    match a {
        Action::Prefer => "prefer",
        Action::Avoid => "avoid",
        Action::Deny => "deny",
        Action::Allow => "allow",
        Action::Lock => "lock",
    }
}

/// `LAYERZERO_POLICY_POLL_MS` in `env` (default 1000, at least 10).
pub fn policy_poll_in(env: Lookup<'_>) -> Result<std::time::Duration> {
    match POLICY_POLL_MS.value_in(env)? {
        Some(KnobValue::U64(n)) if n < 10 => {
            Err(Error::invalid(format!("{}={n}: expected at least 10", POLICY_POLL_MS.name)))
        }
        Some(KnobValue::U64(n)) => Ok(std::time::Duration::from_millis(n)),
        _ => Ok(std::time::Duration::from_millis(1000)),
    }
}

/// `LAYERZERO_MEMORY_POLL_MS` in the process environment (default 500, at least 10).
pub fn memory_poll() -> Result<std::time::Duration> {
    match MEMORY_POLL_MS.value()? {
        Some(KnobValue::U64(n)) if n < 10 => {
            Err(Error::invalid(format!("{}={n}: expected at least 10", MEMORY_POLL_MS.name)))
        }
        Some(KnobValue::U64(n)) => Ok(std::time::Duration::from_millis(n)),
        _ => Ok(std::time::Duration::from_millis(500)),
    }
}

/// [`apply_policy_overrides_in`] over the process environment.
pub fn apply_policy_overrides(policy: &mut crate::policy::Policy) -> Result<Vec<PolicyOverride>> {
    apply_policy_overrides_in(policy, &process_env)
}

/// Every knob, in a fixed order.
pub fn all() -> &'static [Knob] {
    &ALL
}

/// The knob called `name`.
pub fn find(name: &str) -> Option<&'static Knob> {
    ALL.iter().find(|k| k.name == name)
}

/// Reads a variable: a function from a name to its value (`None` when unset).
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The process environment as a [`Lookup`].
pub fn process_env(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

fn non_empty(v: Option<OsString>) -> Option<OsString> {
    v.filter(|v| !v.is_empty())
}

impl Knob {
    /// The type as shown by `lz doctor`.
    pub fn type_name(&self) -> String {
        self.ty.name()
    }

    /// The raw value in the process environment (`None` when unset or empty).
    pub fn current(&self) -> Option<String> {
        self.current_in(&process_env)
    }

    /// The raw value in `env` (`None` when unset or empty; non-UTF-8 shown lossily).
    pub fn current_in(&self, env: Lookup<'_>) -> Option<String> {
        non_empty(env(self.name)).map(|v| v.to_string_lossy().into_owned())
    }

    /// The parsed value in the process environment; `Ok(None)` when unset.
    pub fn value(&self) -> Result<Option<KnobValue>> {
        self.value_in(&process_env)
    }

    /// The parsed value in `env`; `Ok(None)` when unset. A bad value is an error naming the
    /// variable, the value and what was expected.
    pub fn value_in(&self, env: Lookup<'_>) -> Result<Option<KnobValue>> {
        let Some(raw) = non_empty(env(self.name)) else { return Ok(None) };
        if self.ty == KnobType::Path {
            return Ok(Some(KnobValue::Path(PathBuf::from(raw))));
        }
        let Some(text) = raw.to_str() else {
            return Err(Error::invalid(format!("{}={:?} is not valid UTF-8", self.name, raw)));
        };
        self.parse(text).map(Some)
    }

    /// Parses `text` as this knob's type.
    pub fn parse(&self, text: &str) -> Result<KnobValue> {
        let bad = |expected: &str| Error::invalid(format!("{}={text:?}: expected {expected}", self.name));
        match self.ty {
            KnobType::Path => Ok(KnobValue::Path(PathBuf::from(text))),
            KnobType::String => Ok(KnobValue::String(text.to_owned())),
            KnobType::U64 => text.trim().parse::<u64>().map(KnobValue::U64).map_err(|_| bad("a non-negative integer")),
            KnobType::Bool => match text.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(KnobValue::Bool(true)),
                "0" | "false" | "no" | "off" => Ok(KnobValue::Bool(false)),
                _ => Err(bad("a boolean (1/true/yes/on or 0/false/no/off)")),
            },
            KnobType::Enum(values) => {
                let t = text.trim().to_ascii_lowercase();
                values
                    .iter()
                    .find(|v| **v == t)
                    .map(|v| KnobValue::Enum(v))
                    .ok_or_else(|| bad(&format!("one of {}", values.join(", "))))
            }
        }
    }

    /// This knob as `lz doctor` reports it, with its current value in `env` and any error.
    pub fn describe_in(&self, env: Lookup<'_>) -> KnobReport {
        KnobReport {
            name: self.name,
            r#type: self.type_name(),
            default: self.default,
            doc: self.doc,
            current: self.current_in(env),
            error: self.value_in(env).err().map(|e| e.to_string()),
        }
    }
}

/// A knob with its current value, for reports.
#[derive(Debug, Clone, Serialize)]
pub struct KnobReport {
    /// The variable.
    pub name: &'static str,
    /// Its type, as text.
    pub r#type: String,
    /// Its default, as text.
    pub default: &'static str,
    /// What it does.
    pub doc: &'static str,
    /// The raw value set in the environment, if any.
    pub current: Option<String>,
    /// Why the current value is invalid, if it is.
    pub error: Option<String>,
}

/// Every knob with its current value in `env`.
pub fn report_in(env: Lookup<'_>) -> Vec<KnobReport> {
    ALL.iter().map(|k| k.describe_in(env)).collect()
}

fn path_in(knob: &Knob, env: Lookup<'_>) -> Option<PathBuf> {
    non_empty(env(knob.name)).map(PathBuf::from)
}

/// The user cache folder for LayerZero, from the platform's variables in `env`.
pub fn user_cache_dir_in(env: Lookup<'_>) -> PathBuf {
    let home = non_empty(env("HOME")).map(PathBuf::from);
    if cfg!(target_os = "macos") {
        if let Some(h) = home {
            return h.join("Library/Caches/layerzero");
        }
    } else if cfg!(windows) {
        if let Some(d) = non_empty(env("LOCALAPPDATA")) {
            return PathBuf::from(d).join("layerzero");
        }
    } else {
        if let Some(x) = non_empty(env("XDG_CACHE_HOME")).map(PathBuf::from).filter(|p| p.is_absolute()) {
            return x.join("layerzero");
        }
        if let Some(h) = home {
            return h.join(".cache/layerzero");
        }
    }
    std::env::temp_dir().join("layerzero")
}

/// `LAYERZERO_HOME` in `env`, else the user cache folder.
pub fn home_in(env: Lookup<'_>) -> PathBuf {
    path_in(&HOME, env).unwrap_or_else(|| user_cache_dir_in(env))
}

/// `LAYERZERO_HOME` in the process environment, else the user cache folder.
pub fn home() -> PathBuf {
    home_in(&process_env)
}

/// `LAYERZERO_PERFDB` in `env`, else `<LAYERZERO_HOME>/perfdb.sqlite`.
pub fn perfdb_path_in(env: Lookup<'_>) -> PathBuf {
    path_in(&PERFDB, env).unwrap_or_else(|| home_in(env).join("perfdb.sqlite"))
}

/// `LAYERZERO_PERFDB` in the process environment, else `<LAYERZERO_HOME>/perfdb.sqlite`.
pub fn perfdb_path() -> PathBuf {
    perfdb_path_in(&process_env)
}

/// `LAYERZERO_CALIBRATION` in `env`, else `<LAYERZERO_HOME>/calibration.json`.
pub fn calibration_path_in(env: Lookup<'_>) -> PathBuf {
    path_in(&CALIBRATION, env).unwrap_or_else(|| home_in(env).join("calibration.json"))
}

/// `LAYERZERO_CALIBRATION` in the process environment, else `<LAYERZERO_HOME>/calibration.json`.
pub fn calibration_path() -> PathBuf {
    calibration_path_in(&process_env)
}

pub use crate::llm::Residence;
pub use crate::runtime::PlanMode;

/// `LAYERZERO_FAULTS` in `env`, if set.
pub fn faults_in(env: Lookup<'_>) -> Option<String> {
    FAULTS.current_in(env)
}

/// `LAYERZERO_FAULTS` in the process environment, if set.
pub fn faults() -> Option<String> {
    faults_in(&process_env)
}

/// `LAYERZERO_MAX_READ_BYTES` in `env` (default 256 MiB).
pub fn max_read_bytes_in(env: Lookup<'_>) -> Result<u64> {
    Ok(match MAX_READ_BYTES.value_in(env)? {
        Some(KnobValue::U64(n)) => n,
        _ => 256 << 20,
    })
}

/// `LAYERZERO_MAX_READ_BYTES` in the process environment (default 256 MiB).
pub fn max_read_bytes() -> Result<u64> {
    max_read_bytes_in(&process_env)
}

/// `LAYERZERO_WEIGHTS` in `env` (default `resident`).
pub fn weights_in(env: Lookup<'_>) -> Result<Residence> {
    Ok(match WEIGHTS.value_in(env)? {
        Some(KnobValue::Enum("mapped")) => Residence::Mapped,
        _ => Residence::Resident,
    })
}

/// `LAYERZERO_WEIGHTS` in the process environment (default `resident`).
pub fn weights() -> Result<Residence> {
    weights_in(&process_env)
}

/// `LAYERZERO_PLAN_MODE` in `env` (default `prefer`).
pub fn plan_mode_in(env: Lookup<'_>) -> Result<PlanMode> {
    Ok(match PLAN_MODE.value_in(env)? {
        Some(KnobValue::Enum("off")) => PlanMode::Off,
        Some(KnobValue::Enum("strict")) => PlanMode::Strict,
        _ => PlanMode::Prefer,
    })
}

/// `LAYERZERO_CPU_ISA` in `env` (default `native`: no cap); an unknown value is an error
/// naming the knob and the values it takes.
pub fn cpu_isa_in(env: Lookup<'_>) -> Result<crate::hardware::cap::IsaCap> {
    use crate::hardware::cap::IsaCap;
    Ok(match CPU_ISA.value_in(env)? {
        Some(KnobValue::Enum(v)) => IsaCap::parse(v).unwrap_or(IsaCap::Native),
        _ => IsaCap::Native,
    })
}

/// `LAYERZERO_CPU_ISA` in the process environment.
pub fn cpu_isa() -> Result<crate::hardware::cap::IsaCap> {
    cpu_isa_in(&process_env)
}

/// `LAYERZERO_PLAN_MODE` in the process environment (default `prefer`).
pub fn plan_mode() -> Result<PlanMode> {
    plan_mode_in(&process_env)
}

/// `LAYERZERO_DISPATCH_TABLE` in `env`, if set.
pub fn dispatch_table_in(env: Lookup<'_>) -> Option<PathBuf> {
    path_in(&DISPATCH_TABLE, env)
}

/// `LAYERZERO_DISPATCH_TABLE` in the process environment, if set.
pub fn dispatch_table() -> Option<PathBuf> {
    dispatch_table_in(&process_env)
}

/// `LAYERZERO_POLICY` in `env`, if set.
pub fn policy_in(env: Lookup<'_>) -> Option<PathBuf> {
    path_in(&POLICY, env)
}

/// `LAYERZERO_POLICY` in the process environment, if set.
pub fn policy() -> Option<PathBuf> {
    policy_in(&process_env)
}

/// `LAYERZERO_CACHE_CAPACITY` in `env` (default 4096).
pub fn cache_capacity_in(env: Lookup<'_>) -> Result<u64> {
    Ok(match CACHE_CAPACITY.value_in(env)? {
        Some(KnobValue::U64(n)) => n,
        _ => 4096,
    })
}

/// `LAYERZERO_CACHE_CAPACITY` in the process environment (default 4096).
pub fn cache_capacity() -> Result<u64> {
    cache_capacity_in(&process_env)
}

/// `LAYERZERO_E2E` in `env`: the section numbers to run (empty: all).
pub fn e2e_sections_in(env: Lookup<'_>) -> Vec<String> {
    E2E.current_in(env)
        .map(|s| s.split(',').map(|p| p.trim().to_owned()).filter(|p| !p.is_empty()).collect())
        .unwrap_or_default()
}

/// `LAYERZERO_E2E` in the process environment: the section numbers to run (empty: all).
pub fn e2e_sections() -> Vec<String> {
    e2e_sections_in(&process_env)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: BTreeMap<String, OsString> = pairs.iter().map(|(k, v)| ((*k).to_owned(), OsString::from(v))).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn names_are_unique_and_prefixed() {
        let names: BTreeSet<&str> = all().iter().map(|k| k.name).collect();
        assert_eq!(names.len(), all().len());
        assert!(all().iter().all(|k| k.name.starts_with("LAYERZERO_") && !k.doc.is_empty() && !k.default.is_empty()));
        assert_eq!(find("LAYERZERO_PERFDB"), Some(&PERFDB));
        assert_eq!(find("LAYERZERO_TEST_NOPE"), None);
    }

    #[test]
    fn type_names() {
        assert_eq!(PLAN_MODE.type_name(), "enum(off|prefer|strict)");
        assert_eq!(CACHE_CAPACITY.type_name(), "u64");
        assert_eq!(HOME.type_name(), "path");
        assert_eq!(E2E.type_name(), "string");
        assert_eq!(KnobType::Bool.name(), "bool");
    }

    #[test]
    fn perfdb_path_resolution() {
        if cfg!(unix) && !cfg!(target_os = "macos") {
            let e = env(&[("HOME", "/home/u")]);
            assert_eq!(perfdb_path_in(&e), PathBuf::from("/home/u/.cache/layerzero/perfdb.sqlite"));
            let e = env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg")]);
            assert_eq!(perfdb_path_in(&e), PathBuf::from("/xdg/layerzero/perfdb.sqlite"));
            // A relative XDG_CACHE_HOME is invalid per the spec and ignored.
            let e = env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "rel")]);
            assert_eq!(home_in(&e), PathBuf::from("/home/u/.cache/layerzero"));
        }
        let e = env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg"), ("LAYERZERO_HOME", "/lz")]);
        assert_eq!(perfdb_path_in(&e), PathBuf::from("/lz/perfdb.sqlite"));
        let e = env(&[("LAYERZERO_HOME", "/lz"), ("LAYERZERO_PERFDB", "/db/x.sqlite")]);
        assert_eq!(perfdb_path_in(&e), PathBuf::from("/db/x.sqlite"));
        // Empty counts as unset.
        let e = env(&[("LAYERZERO_HOME", "/lz"), ("LAYERZERO_PERFDB", "")]);
        assert_eq!(perfdb_path_in(&e), PathBuf::from("/lz/perfdb.sqlite"));
    }

    #[test]
    fn typed_values_and_errors_name_the_variable_and_value() {
        let e = env(&[]);
        assert_eq!(plan_mode_in(&e).ok(), Some(PlanMode::Prefer));
        assert_eq!(cache_capacity_in(&e).ok(), Some(4096));
        assert_eq!(dispatch_table_in(&e), None);
        assert_eq!(policy_in(&e), None);
        assert!(e2e_sections_in(&e).is_empty());

        let e = env(&[
            ("LAYERZERO_PLAN_MODE", "Strict"),
            ("LAYERZERO_CACHE_CAPACITY", "17"),
            ("LAYERZERO_POLICY", "/p.json"),
            ("LAYERZERO_DISPATCH_TABLE", "/t.json"),
            ("LAYERZERO_E2E", "6.1, 7.3"),
        ]);
        assert_eq!(plan_mode_in(&e).ok(), Some(PlanMode::Strict));
        assert_eq!(cache_capacity_in(&e).ok(), Some(17));
        assert_eq!(policy_in(&e), Some(PathBuf::from("/p.json")));
        assert_eq!(dispatch_table_in(&e), Some(PathBuf::from("/t.json")));
        assert_eq!(e2e_sections_in(&e), vec!["6.1".to_owned(), "7.3".to_owned()]);

        let e = env(&[("LAYERZERO_PLAN_MODE", "sometimes"), ("LAYERZERO_CACHE_CAPACITY", "-3")]);
        let err = plan_mode_in(&e).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("LAYERZERO_PLAN_MODE") && err.contains("sometimes") && err.contains("strict"), "{err}");
        let err = cache_capacity_in(&e).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("LAYERZERO_CACHE_CAPACITY") && err.contains("-3"), "{err}");
        let report = report_in(&e);
        assert_eq!(report.len(), all().len());
        let pm = report.iter().find(|r| r.name == "LAYERZERO_PLAN_MODE");
        assert!(pm.is_some_and(|r| r.current.as_deref() == Some("sometimes") && r.error.is_some()));
        let table = report.iter().find(|r| r.name == "LAYERZERO_DISPATCH_TABLE");
        assert!(table.is_some_and(|r| r.current.is_none() && r.error.is_none()));
    }

    #[test]
    fn bool_parsing() {
        const B: Knob = Knob { name: "LAYERZERO_TEST_BOOL", ty: KnobType::Bool, default: "false", doc: "test" };
        for (t, v) in [("1", true), ("Yes", true), ("on", true), ("0", false), ("FALSE", false), ("off", false)] {
            assert_eq!(B.parse(t).ok(), Some(KnobValue::Bool(v)), "{t}");
        }
        assert!(B.parse("maybe").err().is_some_and(|e| e.to_string().contains("LAYERZERO_TEST_BOOL=\"maybe\"")));
    }

    /// Every `LAYERZERO_*` name used anywhere in the repository is declared here.
    #[test]
    fn every_variable_in_the_repository_is_declared() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut used = BTreeSet::new();
        let mut stack: Vec<PathBuf> =
            ["layerzero/src", "tests", "e2e", "tools", "README.md"].iter().map(|p| root.join(p)).collect();
        while let Some(p) = stack.pop() {
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n == "target" || n == "fixtures" || n == "data") {
                    continue;
                }
                if let Ok(rd) = std::fs::read_dir(&p) {
                    stack.extend(rd.filter_map(|e| e.ok().map(|e| e.path())));
                }
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&p) else { continue };
            let mut rest = text.as_str();
            while let Some(i) = rest.find("LAYERZERO_") {
                let tail = &rest[i..];
                let end = tail.find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'));
                let name = &tail[..end.unwrap_or(tail.len())];
                // `LAYERZERO_TEST_*` names are test-local; a bare prefix is a mention, not a variable.
                if name.len() > "LAYERZERO_".len() && !name.starts_with("LAYERZERO_TEST_") && !name.ends_with('_') {
                    used.insert((name.to_owned(), p.display().to_string()));
                }
                rest = &tail["LAYERZERO_".len()..];
            }
        }
        let missing: Vec<_> = used.iter().filter(|(n, _)| find(n).is_none()).collect();
        assert!(missing.is_empty(), "undeclared LAYERZERO_* variables (declare them in knobs.rs): {missing:?}");
    }
}
