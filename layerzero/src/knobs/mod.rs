//! Every `LAYERZERO_*` environment variable, declared once: its name, type, default value and
//! what it does. The declarations below generate the typed [`Settings`] the library is
//! configured with, the list `lz doctor` prints ([`all`], [`report_in`]) and the test that
//! finds undeclared variables in the repository. An empty value counts as unset; a bad value
//! is an error naming the variable, the value and what was expected.
//!
//! Knobs are read at the edge, once, and passed down as values: a handle reads them when it
//! is built ([`Settings::from_env`], `LayerZero::host`). Some are process-wide by nature and
//! are resolved once per process by `host::process`, which hands them to the parts that obey
//! them:
//! the ISA ceiling (`LAYERZERO_CPU_ISA`: detection, the `cpu` kernels, oneDNN's JIT), where
//! oneDNN is searched (`LAYERZERO_ONEDNN_LIB`), the read limit (`LAYERZERO_MAX_READ_BYTES`),
//! the memory sampler's period (`LAYERZERO_MEMORY_POLL_MS`) and redaction (`LAYERZERO_REDACT`).
//! No backend and nothing in the core reads the environment.

mod value;

use std::ffi::OsString;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::PathBuf;

use serde::Serialize;

pub use value::{Globs, KnobValue, List, Lookup, OtelExport, Period, Shadow, process_env};

use crate::error::Result;
use crate::hardware::cap::IsaCap;
use crate::plan::PlanMode;
use crate::policy::RequireParity;
use crate::policy::{Action, FieldOverride, FieldValue};
use crate::tensor::Residence;

/// One environment variable of type `T`.
#[derive(Debug)]
pub struct Knob<T: 'static> {
    name: &'static str,
    doc: &'static str,
    default: T,
    /// How the default reads where it is derived rather than a value (a folder, a policy field).
    shown: Option<&'static str>,
}

impl<T: KnobValue + Clone> Knob<T> {
    /// The variable, `LAYERZERO_...`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The default value.
    pub fn default(&self) -> &T {
        &self.default
    }

    /// The raw value in `env` (`None` when unset or empty; non-UTF-8 shown lossily).
    pub fn current_in(&self, env: Lookup<'_>) -> Option<String> {
        non_empty(env(self.name)).map(|v| v.to_string_lossy().into_owned())
    }

    /// The value in `env`: the default when unset, an error naming the variable when bad.
    pub fn value_in(&self, env: Lookup<'_>) -> Result<T> {
        match non_empty(env(self.name)) {
            None => Ok(self.default.clone()),
            Some(raw) => T::parse(self.name, &raw),
        }
    }
}

/// `r`'s value, else `default` with the error kept.
fn or_default<T: Clone>(r: Result<T>, default: &T, errors: &mut Vec<crate::error::Error>) -> T {
    r.unwrap_or_else(|e| {
        errors.push(e);
        default.clone()
    })
}

fn non_empty(v: Option<OsString>) -> Option<OsString> {
    v.filter(|v| !v.is_empty())
}

/// A knob of any type, as listed: what `lz doctor` shows of it.
pub trait Declared: Sync {
    /// The variable.
    fn name(&self) -> &'static str;
    /// Its type, as text.
    fn type_name(&self) -> String;
    /// Its default, as text.
    fn default_text(&self) -> String;
    /// What it does.
    fn doc(&self) -> &'static str;
    /// Why its value in `env` is invalid, if it is.
    fn check_in(&self, env: Lookup<'_>) -> Option<String>;
}

impl<T: KnobValue + Clone + Sync> Declared for Knob<T> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn type_name(&self) -> String {
        T::type_name()
    }
    fn default_text(&self) -> String {
        self.shown.map_or_else(|| self.default.show(), str::to_owned)
    }
    fn doc(&self) -> &'static str {
        self.doc.trim_start()
    }
    fn check_in(&self, env: Lookup<'_>) -> Option<String> {
        self.value_in(env).err().map(|e| e.to_string())
    }
}

/// Declares the knobs: a `pub static` [`Knob`] each, the [`Settings`] field it resolves into,
/// and the list of all of them. A knob's doc comment is its documentation everywhere.
macro_rules! knobs {
    ($(
        $(#[doc = $doc:literal])+
        $knob:ident => $field:ident: $ty:ty = $default:expr $(, shown $shown:literal)?;
    )+) => {
        $(
            $(#[doc = $doc])+
            pub static $knob: Knob<$ty> = Knob {
                name: concat!("LAYERZERO_", stringify!($knob)),
                doc: concat!($($doc),+),
                default: $default,
                shown: knobs!(@shown $($shown)?),
            };
        )+

        /// Every knob's value, resolved once at the edge and passed down.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Settings {
            $(
                $(#[doc = $doc])+
                pub $field: $ty,
            )+
            /// Where run-time state lives when `LAYERZERO_HOME` is unset: the user cache folder,
            /// from the platform's variables.
            pub user_cache: PathBuf,
            /// The active Python environments' prefixes (`$VIRTUAL_ENV`, `$CONDA_PREFIX`), where
            /// oneDNN's wheel puts its library.
            pub python_prefixes: Vec<PathBuf>,
        }

        impl Settings {
            /// Every knob's value in `env`, each bad one falling back to its default; the errors.
            fn read(env: Lookup<'_>) -> (Settings, Vec<crate::error::Error>) {
                let mut errors = Vec::new();
                let settings = Settings {
                    $( $field: or_default($knob.value_in(env), &$knob.default, &mut errors), )+
                    user_cache: user_cache_dir_in(env),
                    python_prefixes: ["VIRTUAL_ENV", "CONDA_PREFIX"]
                        .into_iter()
                        .filter_map(|v| non_empty(env(v)).map(PathBuf::from))
                        .collect(),
                };
                (settings, errors)
            }
        }

        static ALL: &[&dyn Declared] = &[$( &$knob ),+];
    };
    (@shown) => { None };
    (@shown $shown:literal) => { Some($shown) };
}

knobs! {
    /// Folder for LayerZero's run-time state: the PerfDB, the calibration, the measured
    /// hardware and the JIT cache.
    HOME => home: Option<PathBuf> = None,
        shown "the user cache folder: $XDG_CACHE_HOME/layerzero, else $HOME/.cache/layerzero \
               (macOS ~/Library/Caches/layerzero, Windows %LOCALAPPDATA%\\layerzero)";
    /// The PerfDB (SQLite timing database) file.
    PERFDB => perfdb: Option<PathBuf> = None, shown "$LAYERZERO_HOME/perfdb.sqlite";
    /// off: ignore dispatch tables; prefer: use a dispatch table when one is loaded (a miss
    /// or mismatch runs live selection and is reported); strict: refuse on a table mismatch
    /// or miss.
    PLAN_MODE => plan_mode: PlanMode = PlanMode::Prefer;
    /// Dispatch table file to load at start-up.
    DISPATCH_TABLE => dispatch_table: Option<PathBuf> = None;
    /// Policy file to load at start-up (absent: the default policy).
    POLICY => policy: Option<PathBuf> = None;
    /// Maximum number of entries in the selection cache.
    CACHE_CAPACITY => cache_capacity: u64 = 4096;
    /// End-to-end suite only: comma-separated section numbers to run (e.g. `6.1,7.3`).
    E2E => e2e_sections: List = List::EMPTY, shown "all sections";
    /// End-to-end suite only: the most modeled work (GFLOP of the selected kernel) at which
    /// a scenario case is also executed on this machine and held to the f64 oracle; larger
    /// cases are reported as selected only. Raise it for a long run.
    E2E_GFLOP => e2e_gflop: u64 = 4;
    /// resident: a model's weights are copied once at load from the memory-mapped safetensors
    /// files into memory backed by transparent huge pages (faster kernels); mapped: kernels
    /// read the mapped files in place (no copy; the page cache is shared between processes).
    WEIGHTS => weights: Residence = Residence::Resident;
    /// The most bytes LayerZero reads from one input file or standard input (requests,
    /// policies, tables, workloads, configs, tokenizers, safetensors read whole); a larger
    /// input is refused naming it. Memory-mapped model weights are not counted. Process-wide.
    MAX_READ_BYTES => max_read_bytes: u64 = crate::files::DEFAULT_MAX_READ_BYTES;
    /// Drills only: KERNEL_OR_BACKEND=MODE[,...] makes the named kernels (a kernel id, or a
    /// backend for all its kernels) fail on every dispatch; MODE is error, panic, hang,
    /// slow:MS, nan, oom, device_lost, fail_first:N, or the silent garbage and transpose_noop
    /// (wrong finite outputs; `lz parity` applies these too). `lz doctor` warns while it is set.
    FAULTS => faults: Option<String> = None;
    /// Consecutive failures (errors, panics, invalid outputs, out of memory) after which a
    /// kernel is quarantined (at least 1).
    FAILURE_THRESHOLD => failure_threshold: Option<NonZeroU32> = None,
        shown "the policy's health.failure_threshold (3)";
    /// How long a quarantined kernel or a disabled backend is not called before trial calls
    /// probe it, in milliseconds.
    COOLDOWN_MS => cooldown_ms: Option<u64> = None, shown "the policy's health.cooldown_ms (30000)";
    /// Trial calls let through once a cooldown has passed (at least 1); a success closes the
    /// breaker, a failure opens it again.
    HALF_OPEN_TRIALS => half_open_trials: Option<NonZeroU32> = None,
        shown "the policy's health.half_open_trials (1)";
    /// Calls of one backend abandoned at their deadline and still running beyond which the
    /// whole backend is disabled.
    MAX_ABANDONED => max_abandoned: Option<u32> = None, shown "the policy's health.max_abandoned (4)";
    /// Per-kernel deadline in milliseconds (at least 1): kernels run on runner threads and one
    /// that has not returned by then is abandoned, quarantined, and the next kernel runs
    /// (KERNEL_TIMEOUT).
    KERNEL_TIMEOUT_MS => kernel_timeout_ms: Option<NonZeroU64> = None,
        shown "the policy's kernel_timeout_ms (none)";
    /// Check every output for NaN/Inf the inputs did not have; such outputs are discarded and
    /// the next kernel runs (KERNEL_OUTPUT_INVALID).
    VALIDATE_OUTPUTS => validate_outputs: Option<bool> = None,
        shown "the policy's validate_outputs (false; `lz run` checks)";
    /// Comma-separated kernel ids or globs to prefer: each becomes a policy rule
    /// `{"action": "prefer", "kernels": GLOB}` (score x0.5) after the policy file's rules.
    PREFER => prefer: Globs = Globs(List::EMPTY);
    /// Comma-separated kernel ids or globs to avoid: each becomes a policy rule
    /// `{"action": "avoid", "kernels": GLOB}` (score x2) after the policy file's rules.
    AVOID => avoid: Globs = Globs(List::EMPTY);
    /// Comma-separated kernel ids or globs never to run: each becomes a policy rule
    /// `{"action": "deny", "kernels": GLOB}` after the policy file's rules.
    DENY => deny: Globs = Globs(List::EMPTY);
    /// Reject kernels that need an implicit transform (layout, contiguity, dtype cast).
    STRICT_MODE => strict_mode: Option<bool> = None, shown "the policy's strict_mode (false)";
    /// Whether a kernel needs a passing parity record on this machine (`lz parity --record`)
    /// to be chosen: off, warn (chosen and reported unverified) or strict (refused,
    /// PARITY_UNVERIFIED). A failed record refuses a kernel under every mode.
    REQUIRE_PARITY => require_parity: Option<RequireParity> = None, shown "the policy's require_parity (off)";
    /// Shadow checks while serving: every N-th call of a kernel also runs the reference on
    /// R rows of its inputs and compares (`N`, `every=N,rows=R`, or `off`); a kernel that
    /// diverges is quarantined (KERNEL_OUTPUT_DIVERGED), the call falls back, and a failing
    /// parity record is written to the PerfDB.
    SHADOW_CHECK => shadow_check: Option<Shadow> = None, shown "the policy's shadow_check (off)";
    /// How often the process-wide handle (and `LayerZero::watch_policy`) checks the
    /// LAYERZERO_POLICY file for changes, in milliseconds (at least 10); a changed, valid file
    /// replaces the policy while serving, an invalid one is reported and the old policy kept.
    POLICY_POLL_MS => policy_poll: Period = Period::ms(1000);
    /// The structured log on standard error: `json` or `text`, optionally followed by
    /// RUST_LOG-style directives (`json,layerzero::selection=info,layerzero::dispatch=debug`;
    /// default `layerzero=info`). Spans lz.select and lz.dispatch, selection and fallback
    /// events.
    LOG => log: Option<String> = None, shown "none (no log)";
    /// Export the lz.select and lz.dispatch spans with OpenTelemetry (builds with the `otel`
    /// feature): stdout, or otlp over HTTP to OTEL_EXPORTER_OTLP_ENDPOINT (default
    /// http://localhost:4318).
    OTEL => otel: Option<OtelExport> = None;
    /// Comma-separated fields written as [redacted] in logs, spans and snapshots: kernels,
    /// shapes, ops, backends, or all. Process-wide.
    REDACT => redact: Option<String> = None;
    /// How often one thread re-reads this host's memory headroom (MemAvailable and the cgroup
    /// limit) for selection, in milliseconds (at least 10); selection never reads it itself.
    /// Process-wide.
    MEMORY_POLL_MS => memory_poll: Period = Period::ms(500);
    /// The oneDNN library (libdnnl.so.3) to load, tried before the loader's default paths and
    /// the active Python environment's lib/ folder. Process-wide.
    ONEDNN_LIB => onednn_lib: Option<PathBuf> = None,
        shown "search: the loader's libdnnl.so.3 / libdnnl.so.2, then $VIRTUAL_ENV/lib, $CONDA_PREFIX/lib";
    /// The cost-model calibration file (`lz tune --calibrate` writes it); used when its
    /// hardware fingerprint is this machine's.
    CALIBRATION => calibration: Option<PathBuf> = None, shown "$LAYERZERO_HOME/calibration.json";
    /// Caps the ISA that detection reports, the `cpu` kernels use and oneDNN may JIT for
    /// (avx2: a Zen 3; avx512: an Ice Lake; avx512_bf16: a Zen 4, no AMX; amx; native: no
    /// cap), so one machine can run and measure another's paths. Process-wide.
    CPU_ISA => cpu_isa: IsaCap = IsaCap::Native;
    /// The lockfile of plugins (kernel libraries from outside) the host loads, each checked
    /// against its pinned blake3 before it is opened (`lz lock --plugin PATH` writes it).
    LOCK => lock: Option<PathBuf> = None, shown "./layerzero.lock (in the working folder, when it exists)";
    /// Plugins (`NAME@VERSION` globs, comma-separated) that run in a worker process of their
    /// own rather than in this one (the policy's `isolation` field, set to `subprocess`).
    ISOLATE => isolate: Globs = Globs(List::EMPTY);
    /// The worker program isolated plugins run in (`layerzero-plugin-worker`).
    PLUGIN_WORKER => plugin_worker: Option<PathBuf> = None, shown "layerzero-plugin-worker beside the program, else on PATH";
}

impl Settings {
    /// The knobs of the process environment; the first bad value is an error naming it.
    pub fn from_env() -> Result<Settings> {
        Settings::from_lookup(&process_env)
    }

    /// The knobs of `env`; the first bad value is an error naming it.
    pub fn from_lookup(env: Lookup<'_>) -> Result<Settings> {
        let (settings, errors) = Settings::read(env);
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(settings),
        }
    }

    /// The knobs of `env`, each bad value replaced by its knob's default, and the errors.
    pub fn lenient(env: Lookup<'_>) -> (Settings, Vec<crate::error::Error>) {
        Settings::read(env)
    }

    /// `LAYERZERO_HOME`, else the user cache folder.
    pub fn home(&self) -> PathBuf {
        self.home.clone().unwrap_or_else(|| self.user_cache.clone())
    }

    /// `LAYERZERO_PERFDB`, else `<LAYERZERO_HOME>/perfdb.sqlite`.
    pub fn perfdb_path(&self) -> PathBuf {
        self.perfdb.clone().unwrap_or_else(|| self.home().join("perfdb.sqlite"))
    }

    /// `LAYERZERO_LOCK`, else `layerzero.lock` in the working folder.
    pub fn lock_path(&self) -> PathBuf {
        self.lock.clone().unwrap_or_else(|| PathBuf::from("layerzero.lock"))
    }

    /// `LAYERZERO_CALIBRATION`, else `<LAYERZERO_HOME>/calibration.json`.
    pub fn calibration_path(&self) -> PathBuf {
        self.calibration.clone().unwrap_or_else(|| self.home().join("calibration.json"))
    }

    /// Where `lz hardware --measure` keeps this host's measured figures.
    pub fn hardware_path(&self) -> PathBuf {
        self.home().join("hardware.json")
    }

    /// The policy fields these knobs set, in the order they apply.
    pub fn policy_overrides(&self) -> Vec<FieldOverride> {
        let mut out = Vec::new();
        let mut set = |knob: &dyn Declared, value: FieldValue| out.push(FieldOverride { knob: knob.name(), value });
        if let Some(n) = self.failure_threshold {
            set(&FAILURE_THRESHOLD, FieldValue::FailureThreshold(n.get()));
        }
        if let Some(n) = self.cooldown_ms {
            set(&COOLDOWN_MS, FieldValue::CooldownMs(n));
        }
        if let Some(n) = self.half_open_trials {
            set(&HALF_OPEN_TRIALS, FieldValue::HalfOpenTrials(n.get()));
        }
        if let Some(n) = self.max_abandoned {
            set(&MAX_ABANDONED, FieldValue::MaxAbandoned(n));
        }
        if let Some(n) = self.kernel_timeout_ms {
            set(&KERNEL_TIMEOUT_MS, FieldValue::KernelTimeoutMs(n.get()));
        }
        if let Some(b) = self.validate_outputs {
            set(&VALIDATE_OUTPUTS, FieldValue::ValidateOutputs(b));
        }
        if let Some(b) = self.strict_mode {
            set(&STRICT_MODE, FieldValue::StrictMode(b));
        }
        if let Some(m) = self.require_parity {
            set(&REQUIRE_PARITY, FieldValue::RequireParity(m));
        }
        if let Some(Shadow(c)) = self.shadow_check {
            set(&SHADOW_CHECK, FieldValue::ShadowCheck(c));
        }
        if !self.isolate.0.items.is_empty() {
            set(&ISOLATE, FieldValue::Isolate(self.isolate.0.items.clone()));
        }
        for (knob, action, globs) in [
            (&PREFER, Action::Prefer, &self.prefer),
            (&AVOID, Action::Avoid, &self.avoid),
            (&DENY, Action::Deny, &self.deny),
        ] {
            if !globs.0.items.is_empty() {
                let origin = format!("{}={:?}", knob.name, globs.0.text);
                set(knob, FieldValue::Rules { action, globs: globs.0.items.clone(), origin });
            }
        }
        out
    }
}

impl Default for Settings {
    /// Every knob at its default, as in an environment that sets none.
    fn default() -> Settings {
        Settings::read(&|_| None).0
    }
}

/// Every knob, in a fixed order.
pub fn all() -> &'static [&'static dyn Declared] {
    ALL
}

/// The knob called `name`.
pub fn find(name: &str) -> Option<&'static dyn Declared> {
    ALL.iter().copied().find(|k| k.name() == name)
}

/// A knob with its current value, for reports.
#[derive(Debug, Clone, Serialize)]
pub struct KnobReport {
    /// The variable.
    pub name: &'static str,
    /// Its type, as text.
    pub r#type: String,
    /// Its default, as text.
    pub default: String,
    /// What it does.
    pub doc: &'static str,
    /// The raw value set in the environment, if any.
    pub current: Option<String>,
    /// Why the current value is invalid, if it is.
    pub error: Option<String>,
}

/// Every knob with its current value in `env`.
pub fn report_in(env: Lookup<'_>) -> Vec<KnobReport> {
    ALL.iter()
        .map(|k| KnobReport {
            name: k.name(),
            r#type: k.type_name(),
            default: k.default_text(),
            doc: k.doc(),
            current: non_empty(env(k.name())).map(|v| v.to_string_lossy().into_owned()),
            error: k.check_in(env),
        })
        .collect()
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

#[cfg(test)]
mod tests;
