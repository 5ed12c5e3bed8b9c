//! Policy: what the operator wants. Rules (prefer, avoid, deny, allow, lock) with optional
//! conditions, and global switches (strict_mode, allow_adaptation, require_deterministic...).
//!
//! A lock never bypasses checks: locking an ineligible kernel is an error that lists why.

mod expiry;
mod fields;
pub mod glob;
mod overrides;
pub mod stage;

use serde::{Deserialize, Serialize};

use crate::capabilities::catalog::Catalog;
use crate::error::{Error, Result};
use crate::hardware::profile::HardwareProfile;
use crate::model::device::DeviceKind;
use crate::model::dtype::DType;
use crate::model::op::Op;
use crate::model::problem::{Dims, Problem};
use crate::schema::{self, SchemaKind};

pub use fields::{FieldOverride, FieldValue, PolicyOverride};
pub use glob::glob_match;
pub use overrides::Overrides;

/// What a rule does to the kernels it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Multiply the kernel's score by `factor` (< 1 favours it).
    Prefer,
    /// Multiply the kernel's score by `factor` (> 1 disfavours it).
    Avoid,
    /// Reject the kernel.
    Deny,
    /// Only kernels named by matching allow rules may run.
    Allow,
    /// Run exactly this kernel (it must still pass every check).
    Lock,
}

impl Action {
    /// The name a policy file gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Prefer => "prefer",
            Action::Avoid => "avoid",
            Action::Deny => "deny",
            Action::Allow => "allow",
            Action::Lock => "lock",
        }
    }
}

/// An inclusive range condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bounds {
    /// Lowest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u64>,
    /// Highest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
}

impl Bounds {
    fn contains(&self, v: u64) -> bool {
        self.min.is_none_or(|m| v >= m) && self.max.is_none_or(|m| v <= m)
    }
}

/// Conditions under which a rule applies; all given conditions must hold.
/// A shape condition on an op that lacks that dimension does not hold.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct When {
    /// Ops.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub op: Vec<Op>,
    /// Compute dtypes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dtype: Vec<DType>,
    /// Hardware profile names (globs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hardware: Vec<String>,
    /// Device kinds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device: Vec<DeviceKind>,
    /// Batch size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<Bounds>,
    /// Query sequence length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len_q: Option<Bounds>,
    /// Key sequence length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len_k: Option<Bounds>,
    /// Attention head dim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<Bounds>,
    /// Last dimension of row-wise ops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<Bounds>,
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// What it does.
    pub action: Action,
    /// Kernel ids it names: a glob with `*` (a lock names exactly one kernel id).
    pub kernels: String,
    /// Score multiplier for prefer (0, 1] and avoid [1, inf); defaults 0.5 and 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    /// When it applies (always, if absent).
    #[serde(default)]
    pub when: When,
    /// The rule stops applying at this instant (`YYYY-MM-DDTHH:MM:SSZ`, UTC): a time-boxed
    /// rule, e.g. a kernel denied until a fix ships.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Where the rule came from when not from the policy file (a `LAYERZERO_*` knob, a
    /// per-request override): errors name it. Not serialized, not hashed.
    #[serde(skip)]
    pub origin: Option<String>,
}

impl Rule {
    /// A rule that always applies.
    pub fn new(action: Action, kernels: impl Into<String>) -> Rule {
        Rule { action, kernels: kernels.into(), factor: None, when: When::default(), expires_at: None, origin: None }
    }

    /// The same rule, saying where it came from.
    pub fn from_origin(mut self, origin: impl Into<String>) -> Rule {
        self.origin = Some(origin.into());
        self
    }

    /// The effective score factor of a prefer/avoid rule.
    pub fn effective_factor(&self) -> f64 {
        match (self.action, self.factor) {
            (_, Some(f)) => f,
            (Action::Prefer, None) => 0.5,
            (Action::Avoid, None) => 2.0,
            _ => 1.0,
        }
    }
}

/// The operator's policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Reference to the schema (ignored).
    #[serde(rename = "$schema", default, skip_serializing)]
    pub schema_ref: Option<String>,
    /// File format version.
    #[serde(default = "one")]
    pub schema_version: u32,
    /// Rules, in order; the first matching lock wins.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Reject kernels that need an implicit transform (layout, contiguity, dtype cast).
    #[serde(default)]
    pub strict_mode: bool,
    /// Consider adapting inputs (transforms) at all.
    #[serde(default = "yes")]
    pub allow_adaptation: bool,
    /// Only deterministic kernels.
    #[serde(default)]
    pub require_deterministic: bool,
    /// Only kernels safe to capture into a CUDA graph.
    #[serde(default)]
    pub graph_strict_mode: bool,
    /// Kernels that compile at first use are allowed.
    #[serde(default = "yes")]
    pub allow_jit: bool,
    /// Kernels whose executor has not passed its self-test on this machine are allowed (an
    /// executor written against a library's documented API that never ran here). Written out
    /// only when set, so the hash of every policy without it is what it was.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_unverified: bool,
    /// Whether a kernel needs a passing parity record on this machine (`lz parity
    /// --record`) to be chosen: `off` (the default), `warn` (chosen, reported unverified),
    /// `strict` (refused, `PARITY_UNVERIFIED`). A failed record refuses a kernel under every
    /// mode. Written out only when set, so the hash of every policy without it is what it was.
    #[serde(default, skip_serializing_if = "RequireParity::is_off")]
    pub require_parity: RequireParity,
    /// Kernels (globs) chosen despite a failed parity record. Written out only when set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_parity_failed: Vec<String>,
    /// Shadow checks while serving: every N-th call of a kernel also runs the reference on
    /// a few rows of the same inputs and compares. Not part of the policy hash (it checks
    /// kernels, it does not choose them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow_check: Option<ShadowCheck>,
    /// Device memory kept free besides the request's tensors, bytes.
    #[serde(default)]
    pub memory_reserve_bytes: u64,
    /// Circuit breakers. Not part of the policy hash: they change no selection.
    #[serde(default)]
    pub health: HealthPolicy,
    /// Per-kernel deadline in milliseconds: a kernel that has not returned by then is
    /// abandoned and the next one runs (absent: no deadline). Not part of the policy hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_timeout_ms: Option<u64>,
    /// Check outputs for NaN/Inf the inputs did not have, and fall back when found. Not part
    /// of the policy hash.
    #[serde(default)]
    pub validate_outputs: bool,
    /// Readiness fails unless every kernel of the table that compiles at first use is
    /// compiled (warm) for every size of its buckets in the serving process. Not part of the
    /// policy hash.
    #[serde(default)]
    pub require_warm: bool,
    /// Ranks of a distributed engine on different machines must still serve one plan:
    /// agreement by capability group (`layerzero::distributed`) fails instead of reporting
    /// the groups' differences. Not part of the policy hash (it changes no selection);
    /// written out only when set.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub one_plan_across_ranks: bool,
    /// Plugins that may load, as `NAME@VERSION` globs (`fusedops@0.1.*`); absent: every plugin
    /// the lockfile pins. Checked before a plugin is opened. Not part of the policy hash (the
    /// plugins loaded are in the catalog's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_plugins: Option<Vec<String>>,
    /// How plugins run, by `NAME@VERSION` glob or plugin name: `subprocess` opens and runs the
    /// plugin in a worker process (a crash or hang there is contained and falls back),
    /// `in_process` (the default) loads it here. Not part of the policy hash (it changes where
    /// a kernel runs, not which).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub isolation: std::collections::BTreeMap<String, Isolation>,
}

/// `shadow_check` in a policy file: every `every`-th call of each kernel also runs the
/// reference (`cpu_reference`) on `rows` rows of the same inputs (a slice of the queries for
/// attention) and compares them with the kernel's rows of the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowCheck {
    /// Check one call in this many, per kernel (1: every call).
    pub every: u32,
    /// Rows compared per checked call (evenly spread, the last row always among them).
    #[serde(default = "four")]
    pub rows: u32,
}

impl ShadowCheck {
    /// Parses the knob's form: `N` (every N-th call, 4 rows), `every=N,rows=R`, or `off`
    /// (`None`). The error names the part that is wrong.
    pub fn parse(text: &str) -> std::result::Result<Option<ShadowCheck>, String> {
        let text = text.trim();
        if text == "off" {
            return Ok(None);
        }
        let number = |what: &str, v: &str| -> std::result::Result<u32, String> {
            match v.trim().parse::<u32>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(format!("`{what}` is {v:?}; expected a whole number of at least 1")),
            }
        };
        if !text.contains('=') {
            return Ok(Some(ShadowCheck { every: number("every", text)?, rows: 4 }));
        }
        let mut check = ShadowCheck { every: 0, rows: 4 };
        for part in text.split(',') {
            match part.split_once('=').map(|(k, v)| (k.trim(), v)) {
                Some(("every", v)) => check.every = number("every", v)?,
                Some(("rows", v)) => check.rows = number("rows", v)?,
                _ => return Err(format!("{part:?} is not every=N or rows=R")),
            }
        }
        if check.every == 0 {
            return Err("`every` is missing; write every=N[,rows=R], N, or off".to_owned());
        }
        Ok(Some(check))
    }
}

/// Whether selection requires a passing parity record (`require_parity` in a policy file).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequireParity {
    /// Records only refuse kernels that failed.
    #[default]
    Off,
    /// Kernels without a passing record are chosen and reported as unverified.
    Warn,
    /// Kernels without a passing record are refused.
    Strict,
}

impl RequireParity {
    /// True for `off`.
    pub fn is_off(&self) -> bool {
        *self == RequireParity::Off
    }

    /// `off`, `warn` or `strict`.
    pub fn as_str(self) -> &'static str {
        match self {
            RequireParity::Off => "off",
            RequireParity::Warn => "warn",
            RequireParity::Strict => "strict",
        }
    }

    /// Parses `off`, `warn` or `strict`.
    pub fn parse(s: &str) -> Option<RequireParity> {
        match s {
            "off" => Some(RequireParity::Off),
            "warn" => Some(RequireParity::Warn),
            "strict" => Some(RequireParity::Strict),
            _ => None,
        }
    }
}

/// Where a plugin's kernels run (`isolation` in a policy file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// Loaded into the serving process.
    InProcess,
    /// In a worker process of their own.
    Subprocess,
}

impl Policy {
    /// How the plugin `name` at `version` runs: a key naming it exactly (`NAME@VERSION`, then
    /// `NAME`) decides; otherwise it runs in a worker when any glob key matching
    /// `NAME@VERSION` says `subprocess`.
    pub fn isolation_of(&self, name: &str, version: &str) -> Isolation {
        let namespace = format!("{name}@{version}");
        if let Some(i) = self.isolation.get(&namespace).or_else(|| self.isolation.get(name)) {
            return *i;
        }
        let isolated =
            self.isolation.iter().any(|(glob, i)| *i == Isolation::Subprocess && glob::glob_match(glob, &namespace));
        if isolated { Isolation::Subprocess } else { Isolation::InProcess }
    }
}

/// Circuit-breaker settings (`health` in a policy file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthPolicy {
    /// Consecutive failures that quarantine a kernel (at least 1).
    #[serde(default = "three")]
    pub failure_threshold: u32,
    /// How long a quarantined kernel or a disabled backend is not called, milliseconds.
    #[serde(default = "thirty_seconds")]
    pub cooldown_ms: u64,
    /// Trial calls let through after the cooldown (at least 1); a success closes the breaker.
    #[serde(default = "one")]
    pub half_open_trials: u32,
    /// Abandoned (timed-out) calls of one backend still running beyond which the backend is
    /// disabled.
    #[serde(default = "four")]
    pub max_abandoned: u32,
}

impl Default for HealthPolicy {
    fn default() -> HealthPolicy {
        HealthPolicy { failure_threshold: 3, cooldown_ms: 30_000, half_open_trials: 1, max_abandoned: 4 }
    }
}

fn three() -> u32 {
    3
}
fn four() -> u32 {
    4
}
fn thirty_seconds() -> u64 {
    30_000
}

fn one() -> u32 {
    1
}
/// Policy fields that tune the runtime's health, not selection: left out of the hash.
const RUNTIME_FIELDS: [&str; 8] = [
    "health",
    "shadow_check",
    "kernel_timeout_ms",
    "validate_outputs",
    "require_warm",
    "one_plan_across_ranks",
    "allow_plugins",
    "isolation",
];
fn yes() -> bool {
    true
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            schema_ref: None,
            schema_version: 1,
            rules: Vec::new(),
            strict_mode: false,
            allow_adaptation: true,
            require_deterministic: false,
            graph_strict_mode: false,
            allow_jit: true,
            allow_unverified: false,
            require_parity: RequireParity::Off,
            allow_parity_failed: Vec::new(),
            shadow_check: None,
            memory_reserve_bytes: 0,
            health: HealthPolicy::default(),
            kernel_timeout_ms: None,
            validate_outputs: false,
            require_warm: false,
            one_plan_across_ranks: false,
            allow_plugins: None,
            isolation: std::collections::BTreeMap::new(),
        }
    }
}

impl Policy {
    /// Reads, schema-checks and parses a policy file.
    pub fn load(path: &std::path::Path) -> Result<Policy> {
        let origin = path.display().to_string();
        let text = crate::files::read_to_string(path)?;
        Policy::from_json(&text, &origin)
    }

    /// Parses and schema-checks a policy file's text.
    pub fn from_json(text: &str, origin: &str) -> Result<Policy> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
        schema::validate(SchemaKind::Policy, &value, origin)?;
        let policy: Policy = serde_path_to_error::deserialize(value)
            .map_err(|e| Error::invalid(format!("{origin}: field `{}`: {}", e.path(), e.inner())))?;
        policy.check_values(origin)?;
        Ok(policy)
    }

    fn check_values(&self, origin: &str) -> Result<()> {
        if self.schema_version != 1 {
            return Err(Error::invalid(format!(
                "{origin}: field `schema_version` is {}; this build reads 1",
                self.schema_version
            )));
        }
        let h = &self.health;
        for (field, value) in [("failure_threshold", h.failure_threshold), ("half_open_trials", h.half_open_trials)] {
            if value == 0 {
                return Err(Error::invalid(format!("{origin}: field `health.{field}` is 0; it must be at least 1")));
            }
        }
        if let Some(c) = self.shadow_check
            && (c.every == 0 || c.rows == 0)
        {
            return Err(Error::invalid(format!(
                "{origin}: field `shadow_check` is every {} rows {}; both must be at least 1",
                c.every, c.rows
            )));
        }
        if self.kernel_timeout_ms == Some(0) {
            return Err(Error::invalid(format!(
                "{origin}: field `kernel_timeout_ms` is 0; give a deadline of at least 1 ms or leave it out"
            )));
        }
        for (i, r) in self.rules.iter().enumerate() {
            let f = r.effective_factor();
            let bad = match r.action {
                Action::Prefer => !(f > 0.0 && f <= 1.0),
                Action::Avoid => !(f.is_finite() && f >= 1.0),
                _ => r.factor.is_some(),
            };
            if bad {
                return Err(Error::invalid(format!(
                    "{origin}: field `rules[{i}].factor` is {f}; prefer takes (0, 1], avoid [1, inf), others none"
                )));
            }
            let w = &r.when;
            for (name, b) in [
                ("batch", w.batch),
                ("seq_len_q", w.seq_len_q),
                ("seq_len_k", w.seq_len_k),
                ("head_dim", w.head_dim),
                ("hidden", w.hidden),
            ] {
                if let Some(Bounds { min: Some(lo), max: Some(hi) }) = b
                    && lo > hi
                {
                    return Err(Error::invalid(format!(
                        "{origin}: field `rules[{i}].when.{name}` is min {lo} > max {hi}; the rule could never apply"
                    )));
                }
            }
            if let Some(t) = &r.expires_at
                && crate::time::parse_utc(t).is_none()
            {
                return Err(Error::invalid(format!(
                    "{origin}: field `rules[{i}].expires_at` is {t:?}; expected a UTC time YYYY-MM-DDTHH:MM:SSZ"
                )));
            }
            if r.action == Action::Lock && r.kernels.contains('*') {
                return Err(Error::invalid(format!(
                    "{origin}: field `rules[{i}].kernels` is {:?}; a lock names exactly one kernel id",
                    r.kernels
                )));
            }
        }
        Ok(())
    }

    /// Checks that every rule names at least one kernel of `catalog` (typos fail loudly).
    pub fn check_against(&self, catalog: &Catalog) -> Result<()> {
        for (i, r) in self.rules.iter().enumerate() {
            if !catalog.kernels().any(|(_, _, k)| glob_match(&r.kernels, &k.id)) {
                let field = match &r.origin {
                    Some(origin) => origin.clone(),
                    None => format!("policy field `rules[{i}].kernels`"),
                };
                return Err(Error::invalid(format!(
                    "{field}: {:?} names no kernel in the catalog (see `lz list-kernels`)",
                    r.kernels
                )));
            }
        }
        // Plugins are in the catalog as `NAME@VERSION`: a plain name found there is a builtin
        // backend, which always runs in this process.
        for (key, mode) in &self.isolation {
            if *mode == Isolation::Subprocess && !key.contains('@') && catalog.backend(key).is_some() {
                return Err(Error::invalid(format!(
                    "policy field `isolation`: {key:?} is a builtin backend; only plugins run in a worker process \
                     (name one as NAME@VERSION or a glob of those)"
                )));
            }
        }
        Ok(())
    }

    /// blake3 over the canonical JSON of the policy with defaults written out, without the
    /// fields that only tune the runtime's health (`health`, `kernel_timeout_ms`,
    /// `validate_outputs`): changing them keeps plans and cached choices valid.
    pub fn hash(&self) -> String {
        let mut value = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(map) = value.as_object_mut() {
            for field in RUNTIME_FIELDS {
                map.remove(field);
            }
        }
        crate::canonical::hash(&value)
    }
}

/// Per-request facts rule conditions read.
pub struct Subject<'a> {
    /// The problem.
    pub problem: &'a Problem,
    /// The hardware profile.
    pub hardware: &'a HardwareProfile,
    /// The device kind the request runs on.
    pub device: DeviceKind,
}

impl When {
    /// True when every given condition holds for `s`.
    pub fn matches(&self, s: &Subject<'_>) -> bool {
        let p = s.problem;
        if !self.op.is_empty() && !self.op.contains(&p.op) {
            return false;
        }
        if !self.dtype.is_empty() && !self.dtype.contains(&p.dtype) {
            return false;
        }
        if !self.hardware.is_empty() && !self.hardware.iter().any(|h| glob_match(h, &s.hardware.name)) {
            return false;
        }
        if !self.device.is_empty() && !self.device.contains(&s.device) {
            return false;
        }
        let attn = p.attention();
        let rows_hidden = match p.dims {
            Dims::Rows { hidden, .. } | Dims::Mlp { hidden, .. } => Some(hidden),
            Dims::Gemm { k, .. } => Some(k),
            _ => None,
        };
        let batch = match p.dims {
            Dims::Attention(a) => Some(a.batch),
            Dims::Rows { rows, .. } => Some(rows),
            Dims::Mlp { tokens, .. } => Some(tokens),
            Dims::Gemm { m, .. } => Some(m),
            Dims::None => None,
        };
        let conds = [
            (self.batch, batch),
            (self.seq_len_q, attn.map(|a| a.seq_q)),
            (self.seq_len_k, attn.map(|a| a.seq_k)),
            (self.head_dim, attn.map(|a| a.head_dim)),
            (self.hidden, rows_hidden),
        ];
        conds.iter().all(|(b, v)| match (b, v) {
            (None, _) => true,
            (Some(b), Some(v)) => b.contains(*v),
            (Some(_), None) => false,
        })
    }
}
