//! Model scopes: one runtime serving several models. A scope is a handle of its own for one
//! model ([`LayerZero::scoped`]): its plan, its selection caches (their keys salted with the
//! model id and tokenizer hash), its counters and recent decisions; the catalog, hardware,
//! PerfDB measurements, calibration, executors and health (breakers, quarantines) are the
//! parent's, shared. A plan solved for another tokenizer is refused with
//! `TOKENIZER_HASH_MISMATCH`, never served.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::LayerZero;
use crate::error::{Error, Result};
use crate::plan::DispatchTable;
use crate::reason::{Reason, ReasonCode};

/// The model a scope serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The model's id (a name, a folder).
    pub model: String,
    /// Its tokenizer's identity hash, when it has one.
    pub tokenizer_hash: Option<String>,
}

impl Scope {
    /// A scope for `model` whose tokenizer has `tokenizer_hash`.
    pub fn new(model: impl Into<String>, tokenizer_hash: Option<&str>) -> Result<Scope> {
        let model = model.into();
        if model.is_empty() {
            return Err(Error::invalid("a model scope needs a non-empty model id".to_owned()));
        }
        Ok(Scope { model, tokenizer_hash: tokenizer_hash.map(str::to_owned) })
    }

    /// What the scope mixes into its cache context: no key of one model or tokenizer
    /// matches another's.
    pub(super) fn salt(&self) -> u64 {
        let mut h = blake3::Hasher::new();
        h.update(b"layerzero.scope\0");
        h.update(self.model.as_bytes());
        h.update(b"\0");
        h.update(self.tokenizer_hash.as_deref().unwrap_or("").as_bytes());
        let bytes = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&bytes.as_bytes()[..8]);
        u64::from_le_bytes(first)
    }
}

/// Refuses a table solved for another tokenizer than the scope's (tables that name none,
/// and handles that are no model's scope, pass).
pub(super) fn tokenizer_check(table: &DispatchTable, scope: Option<&Scope>) -> std::result::Result<(), Reason> {
    let (Some(want), Some(scope)) = (table.header.tokenizer_hash.as_deref(), scope) else {
        return Ok(());
    };
    if scope.tokenizer_hash.as_deref() == Some(want) {
        return Ok(());
    }
    Err(Reason::new(
        ReasonCode::TOKENIZER_HASH_MISMATCH,
        format!(
            "the table was solved for tokenizer {want}; model {:?} has {}",
            scope.model,
            scope.tokenizer_hash.as_deref().map_or_else(|| "no tokenizer".to_owned(), |h| format!("tokenizer {h}"))
        ),
    ))
}

impl LayerZero {
    /// A scope of this runtime for one model: a handle with its own plan (none yet; add one
    /// with [`with_plan`](LayerZero::with_plan)), selection caches and counters, sharing
    /// this handle's catalog, hardware, PerfDB measurements, calibration, executors, faults
    /// and health, under the policy in force now.
    pub fn scoped(&self, scope: Scope) -> Result<LayerZero> {
        let mut parts = self.parts.clone();
        parts.scope = Some(Arc::new(scope));
        parts.table = None;
        parts.table_rejection = None;
        let policy = self.live.load().declared.clone();
        let mut lz =
            LayerZero::assemble(parts, self.registry.clone(), self.health.clone(), policy, self.cache.capacity())?;
        lz.faults = self.faults.clone();
        lz.check_inputs = AtomicBool::new(self.check_inputs.load(Ordering::Relaxed));
        Ok(lz)
    }

    /// The model this handle serves, when it is a model's scope.
    pub fn scope(&self) -> Option<&Scope> {
        self.parts.scope.as_deref()
    }

    /// Makes this scope's tokenizer `tokenizer_hash`. When the hash changes, nothing
    /// selected for the old one is served: the caches start empty (their context changes
    /// with the hash), and a plan solved for the old tokenizer stops being served
    /// (`TOKENIZER_HASH_MISMATCH`; in strict plan mode that is an error and nothing
    /// changes). Returns the reason when something was invalidated.
    pub fn retokenize(&mut self, tokenizer_hash: Option<&str>) -> Result<Option<Reason>> {
        let Some(old) = self.parts.scope.clone() else {
            return Err(Error::invalid("only a model's scope has a tokenizer (LayerZero::scoped)".to_owned()));
        };
        if old.tokenizer_hash.as_deref() == tokenizer_hash {
            return Ok(None);
        }
        let new = Scope { model: old.model.clone(), tokenizer_hash: tokenizer_hash.map(str::to_owned) };
        if let (Some(table), super::PlanMode::Strict) = (&self.parts.table, self.parts.plan_mode) {
            tokenizer_check(table, Some(&new)).map_err(super::refused)?;
        }
        let reason = Reason::new(
            ReasonCode::TOKENIZER_HASH_MISMATCH,
            format!(
                "model {:?}: tokenizer {} replaced by {}; what was selected and planned for it is not served",
                old.model,
                old.tokenizer_hash.as_deref().unwrap_or("(none)"),
                tokenizer_hash.unwrap_or("(none)")
            ),
        );
        self.parts.scope = Some(Arc::new(new));
        self.rebuild(None)?;
        Ok(Some(reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    #[test]
    fn salts_differ_by_model_and_by_tokenizer() -> TestResult {
        let a = Scope::new("a", Some("h1"))?.salt();
        assert_ne!(a, Scope::new("b", Some("h1"))?.salt());
        assert_ne!(a, Scope::new("a", Some("h2"))?.salt());
        assert_ne!(a, Scope::new("a", None)?.salt());
        assert_eq!(a, Scope::new("a", Some("h1"))?.salt());
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(Scope::new("ab", Some("c"))?.salt(), Scope::new("a", Some("bc"))?.salt());
        Ok(())
    }
}
