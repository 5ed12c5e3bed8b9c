//! Per-request overrides: rules and switches one call adds on top of the policy in force
//! (`LayerZero::select_with`). Pure: they make a new policy; the handle's stays as it is.

use super::{Action, Policy, Rule};

/// What one request changes about the policy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    rules: Vec<Rule>,
    strict_mode: Option<bool>,
    require_deterministic: Option<bool>,
    graph_strict_mode: Option<bool>,
}

impl Overrides {
    /// No change.
    pub fn new() -> Overrides {
        Overrides::default()
    }

    fn rule(mut self, action: Action, kernels: &str) -> Overrides {
        let origin = format!("per-request {} {kernels:?}", action.as_str());
        self.rules.push(Rule::new(action, kernels).from_origin(origin));
        self
    }

    /// Prefer kernels matching `glob` (score x0.5).
    pub fn prefer(self, glob: &str) -> Overrides {
        self.rule(Action::Prefer, glob)
    }

    /// Avoid kernels matching `glob` (score x2).
    pub fn avoid(self, glob: &str) -> Overrides {
        self.rule(Action::Avoid, glob)
    }

    /// Never run kernels matching `glob`.
    pub fn deny(self, glob: &str) -> Overrides {
        self.rule(Action::Deny, glob)
    }

    /// Run exactly `kernel_id` (it must still pass every check); wins over the policy's locks.
    pub fn lock(self, kernel_id: &str) -> Overrides {
        self.rule(Action::Lock, kernel_id)
    }

    /// Set `strict_mode` for this request.
    pub fn strict_mode(mut self, on: bool) -> Overrides {
        self.strict_mode = Some(on);
        self
    }

    /// Set `require_deterministic` for this request.
    pub fn require_deterministic(mut self, on: bool) -> Overrides {
        self.require_deterministic = Some(on);
        self
    }

    /// Set `graph_strict_mode` for this request.
    pub fn graph_strict_mode(mut self, on: bool) -> Overrides {
        self.graph_strict_mode = Some(on);
        self
    }

    /// `base` with these overrides on top: their rules first (the first matching lock wins),
    /// then the policy's.
    pub fn apply(&self, base: &Policy) -> Policy {
        let mut p = base.clone();
        p.rules = self.rules.iter().cloned().chain(base.rules.iter().cloned()).collect();
        if let Some(v) = self.strict_mode {
            p.strict_mode = v;
        }
        if let Some(v) = self.require_deterministic {
            p.require_deterministic = v;
        }
        if let Some(v) = self.graph_strict_mode {
            p.graph_strict_mode = v;
        }
        p
    }
}
