//! Policy fields set from outside the policy file (the `LAYERZERO_*` knobs): typed values
//! in, the policy changed, and a list of what was set for `lz doctor`. The values arrive
//! parsed and checked; the environment is read at the edge, not here.

use serde::Serialize;

use super::{Action, Policy, Rule};

/// A value for one policy field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue {
    /// `health.failure_threshold` (at least 1).
    FailureThreshold(u32),
    /// `health.cooldown_ms`.
    CooldownMs(u64),
    /// `health.half_open_trials` (at least 1).
    HalfOpenTrials(u32),
    /// `health.max_abandoned`.
    MaxAbandoned(u32),
    /// `kernel_timeout_ms` (at least 1).
    KernelTimeoutMs(u64),
    /// `validate_outputs`.
    ValidateOutputs(bool),
    /// `strict_mode`.
    StrictMode(bool),
    /// `require_parity`.
    RequireParity(super::RequireParity),
    /// `shadow_check` (`None`: off).
    ShadowCheck(Option<super::ShadowCheck>),
    /// `isolation`: each glob's plugins run in a worker process.
    Isolate(Vec<String>),
    /// Rules appended after the file's, one per glob.
    Rules {
        /// What each rule does.
        action: Action,
        /// The kernel ids or globs.
        globs: Vec<String>,
        /// Where they came from, as each rule's `origin` says (`LAYERZERO_DENY="a,b"`).
        origin: String,
    },
}

/// A field value and the knob that set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldOverride {
    /// The variable.
    pub knob: &'static str,
    /// The value.
    pub value: FieldValue,
}

/// A policy field set by a knob, as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyOverride {
    /// The variable.
    pub knob: &'static str,
    /// The policy field it sets.
    pub field: &'static str,
    /// The value it set, as text.
    pub value: String,
}

impl Policy {
    /// Sets each field `overrides` names, in order, and lists what was set.
    pub fn apply_overrides(&mut self, overrides: &[FieldOverride]) -> Vec<PolicyOverride> {
        let mut applied = Vec::new();
        for o in overrides {
            let mut note =
                |field: &'static str, value: String| applied.push(PolicyOverride { knob: o.knob, field, value });
            match &o.value {
                FieldValue::FailureThreshold(n) => {
                    self.health.failure_threshold = *n;
                    note("health.failure_threshold", n.to_string());
                }
                FieldValue::CooldownMs(n) => {
                    self.health.cooldown_ms = *n;
                    note("health.cooldown_ms", n.to_string());
                }
                FieldValue::HalfOpenTrials(n) => {
                    self.health.half_open_trials = *n;
                    note("health.half_open_trials", n.to_string());
                }
                FieldValue::MaxAbandoned(n) => {
                    self.health.max_abandoned = *n;
                    note("health.max_abandoned", n.to_string());
                }
                FieldValue::KernelTimeoutMs(n) => {
                    self.kernel_timeout_ms = Some(*n);
                    note("kernel_timeout_ms", n.to_string());
                }
                FieldValue::ValidateOutputs(b) => {
                    self.validate_outputs = *b;
                    note("validate_outputs", b.to_string());
                }
                FieldValue::StrictMode(b) => {
                    self.strict_mode = *b;
                    note("strict_mode", b.to_string());
                }
                FieldValue::RequireParity(m) => {
                    self.require_parity = *m;
                    note("require_parity", m.as_str().to_owned());
                }
                FieldValue::ShadowCheck(c) => {
                    self.shadow_check = *c;
                    let shown = c.map_or_else(|| "off".to_owned(), |c| format!("every {} rows {}", c.every, c.rows));
                    note("shadow_check", shown);
                }
                FieldValue::Isolate(globs) => {
                    for glob in globs {
                        self.isolation.insert(glob.clone(), super::Isolation::Subprocess);
                        note("isolation", format!("{glob} = subprocess"));
                    }
                }
                FieldValue::Rules { action, globs, origin } => {
                    for glob in globs {
                        let i = self.rules.len();
                        self.rules.push(Rule::new(*action, glob.as_str()).from_origin(origin.as_str()));
                        note("rules", format!("rules[{i}] = {} {glob}", action.as_str()));
                    }
                }
            }
        }
        applied
    }
}
