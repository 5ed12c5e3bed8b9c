//! The policy of a shared handle while it serves: validated swaps, reloads from a file and
//! the file watcher, time-boxed rules expiring, per-request overrides.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::counters::Counter;
use super::{LayerZero, Live, PolicyWatch, context_of, refused, watch};
use crate::error::Result;
use crate::health::HealthConfig;
use crate::plan::PlanMode;
use crate::policy::{Overrides, Policy};
use crate::reason::{Reason, ReasonCode};
use crate::select::{Selection, SelectionReport};

impl LayerZero {
    /// Replaces the policy on a shared handle. Choices cached under the old policy are never
    /// served again (the cache context changes); a plan solved under another policy stops
    /// being served with `PLAN_POLICY_MISMATCH` (an error in `Strict` mode, and the handle
    /// is unchanged), and is served again if its policy comes back.
    ///
    /// The policy is validated before anything changes: an invalid one (a rule naming no
    /// kernel, a refused plan in strict mode) is an error, recorded in
    /// [`LayerZero::policy_error`], and the old policy stays in force. Rules with an
    /// `expires_at` stop applying at that instant: the first selection after it swaps in the
    /// policy without them.
    pub fn set_policy(&self, policy: Policy) -> Result<()> {
        let result = self.swap_policy(Arc::new(policy));
        *self.policy_error.lock() = result.as_ref().err().map(ToString::to_string);
        result
    }

    fn swap_policy(&self, declared: Arc<Policy>) -> Result<()> {
        let _one_at_a_time = self.swap.lock();
        let now = crate::time::now_unix();
        let policy = declared.in_force_at(now);
        let health = HealthConfig::of(&policy);
        let shadow = policy.shadow_check;
        let selector = self.live.load().selector.with_policy(Arc::new(policy))?;
        let mut rejection = self.parts.table_rejection.clone();
        let mut plan_on = false;
        let parity_refusal = self.live.load().parity_refusal.clone();
        if let Some(plan) = &self.plan {
            if let Some(r) = &parity_refusal {
                rejection = Some(r.clone());
            } else if plan.header().policy_hash == selector.policy_hash() {
                plan_on = true;
            } else {
                let reason = Reason::new(
                    ReasonCode::PLAN_POLICY_MISMATCH,
                    format!(
                        "the table was solved under policy {}; the new policy is {}",
                        &plan.header().policy_hash,
                        selector.policy_hash()
                    ),
                );
                if self.parts.plan_mode == PlanMode::Strict {
                    return Err(refused(reason));
                }
                rejection = Some(reason);
            }
        }
        let context = context_of(&selector, self.parts.scope.as_deref());
        let quiet = self.plan.is_none() && rejection.is_none();
        let next_expiry = declared.next_expiry_after(now).unwrap_or(i64::MAX);
        self.live.store(Arc::new(Live {
            declared,
            selector: Arc::new(selector),
            context,
            plan_rejection: rejection,
            plan_on,
            parity_refusal,
        }));
        self.health.configure(health);
        self.shadow.configure(shadow);
        self.next_expiry.store(next_expiry, Ordering::Release);
        self.policy_swaps.fetch_add(1, Ordering::Relaxed);
        self.plan_on.store(plan_on, Ordering::Release);
        self.quiet.store(quiet, Ordering::Release);
        self.context.store(context, Ordering::Release);
        Ok(())
    }

    /// Learns parity records made while serving (a shadow check's, a `lz parity --record`
    /// run beside the engine): selection judges by them from the next call. Choices cached
    /// before are not served again (the parity records are part of the cache context), and
    /// when a failed record refuses a kernel the loaded table names for that point, the plan
    /// stops being served (`PARITY_FAILED` as the plan's rejection; the table's other entries
    /// are re-judged when it is next loaded). Records of other machines or kernel versions are
    /// ignored, as at load.
    pub fn learn_parity(&self, facts: Vec<crate::select::ParityFact>) {
        let _one_at_a_time = self.swap.lock();
        let live = self.live.load_full();
        let (catalog, hardware) = (&self.parts.catalog, &self.parts.hardware);
        let book = match live.selector.parity() {
            Some(b) => b.with(facts.iter().cloned(), catalog, hardware),
            None => crate::select::ParityBook::build(facts.iter().cloned(), catalog, hardware),
        };
        // Only a failure learned now can stop the table: one known at load dropped its entry then.
        let learned_failure = |e: &crate::plan::table::TableEntry| {
            facts.iter().any(|f| !f.passed && (&f.kernel, &f.key, &f.bucket) == (&e.kernel, &e.key, &e.bucket))
                && book.failed_at(&e.key, &e.bucket, &e.kernel)
        };
        let refused = self.parts.table.as_ref().and_then(|t| t.entries.iter().find(|e| learned_failure(e)));
        let mut parity_refusal = live.parity_refusal.clone();
        if let (Some(e), None) = (refused, &parity_refusal) {
            parity_refusal = Some(Reason::new(
                ReasonCode::PARITY_FAILED,
                format!(
                    "a parity record learned while serving refuses {} for {} ({}), which the table chose; \
                     selecting live until the table is loaded again",
                    e.kernel, e.entry, e.bucket
                ),
            ));
        }
        let selector = Arc::new((*live.selector).clone().with_parity(Arc::new(book)));
        let context = context_of(&selector, self.parts.scope.as_deref());
        let plan_on = live.plan_on && parity_refusal.is_none();
        let plan_rejection = parity_refusal.clone().or_else(|| live.plan_rejection.clone());
        let quiet = self.plan.is_none() && plan_rejection.is_none();
        self.live.store(Arc::new(Live {
            declared: live.declared.clone(),
            selector,
            context,
            plan_rejection,
            plan_on,
            parity_refusal,
        }));
        self.plan_on.store(plan_on, Ordering::Release);
        self.quiet.store(quiet, Ordering::Release);
        self.context.store(context, Ordering::Release);
    }

    /// Reads the policy file at `path`, applies the knobs that override policy fields (of
    /// [`LayerZero::settings`]), and swaps it in. A file that cannot be read or
    /// is invalid is an error (recorded in [`LayerZero::policy_error`]); the policy in force
    /// is kept.
    pub fn reload_policy(&self, path: &Path) -> Result<()> {
        let overrides = self.parts.settings.policy_overrides();
        let loaded = Policy::load(path).map(|mut p| {
            p.apply_overrides(&overrides);
            p
        });
        match loaded {
            Ok(p) => self.set_policy(p),
            Err(e) => {
                *self.policy_error.lock() = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Watches the policy file at `path` and reloads it when its content changes, every
    /// `LAYERZERO_POLICY_POLL_MS` of [`LayerZero::settings`] (default 1 s), until the returned guard is dropped or the
    /// handle is. A reload that fails keeps the policy in force (see
    /// [`LayerZero::policy_error`]).
    pub fn watch_policy(self: &Arc<Self>, path: &Path) -> Result<PolicyWatch> {
        watch::spawn(watch::Target::Shared(Arc::downgrade(self)), path, self.parts.settings.policy_poll.0)
    }

    /// [`LayerZero::watch_policy`] for a handle that lives as long as the process (the one
    /// behind [`crate::host`]).
    pub fn watch_policy_static(&'static self, path: &Path) -> Result<PolicyWatch> {
        watch::spawn(watch::Target::Static(self), path, self.parts.settings.policy_poll.0)
    }

    /// Why the last policy change (a `set_policy`, a reload) was refused, if it was; `None`
    /// once a later change succeeds.
    pub fn policy_error(&self) -> Option<String> {
        self.policy_error.lock().clone()
    }

    pub(crate) fn note_policy_error(&self, why: String) {
        *self.policy_error.lock() = Some(why);
    }

    /// How many times the policy was swapped since the handle was built.
    pub fn policy_swaps(&self) -> u64 {
        self.policy_swaps.load(Ordering::Relaxed)
    }

    /// The policy as set, time-boxed rules included (the selector holds the part in force).
    pub fn declared_policy(&self) -> Arc<Policy> {
        self.live.load().declared.clone()
    }

    /// Selects for `req` under the policy in force with `overrides` on top (per-request
    /// rules come first, so a per-request lock wins). Always live: the selection cache holds
    /// only choices of the handle's own policy.
    pub fn select_with(&self, req: &crate::model::request::Request, overrides: &Overrides) -> Result<Selection> {
        self.expire_due();
        let selector = self.selector();
        let derived = selector.with_policy(Arc::new(overrides.apply(selector.policy())))?;
        self.bump(Counter::Live);
        derived.select(req)
    }

    /// [`LayerZero::explain`] with `overrides` on top of the policy in force.
    pub fn explain_with(&self, req: &crate::model::request::Request, overrides: &Overrides) -> Result<SelectionReport> {
        let selector = self.selector();
        Ok(selector.with_policy(Arc::new(overrides.apply(selector.policy())))?.explain(req))
    }

    /// Swaps in the declared policy again when a time-boxed rule has expired: one load on
    /// the selection path while no rule is time-boxed.
    #[inline]
    pub(crate) fn expire_due(&self) {
        let due = self.next_expiry.load(Ordering::Relaxed);
        if due != i64::MAX {
            self.expire_slow(due);
        }
    }

    #[cold]
    fn expire_slow(&self, due: i64) {
        if crate::time::now_unix() < due {
            return;
        }
        let declared = self.live.load().declared.clone();
        if let Err(e) = self.swap_policy(declared) {
            // Not retried on every call: the error stays visible until the next change.
            self.next_expiry.store(i64::MAX, Ordering::Release);
            *self.policy_error.lock() =
                Some(format!("a time-boxed rule expired, but the policy without it was refused: {e}"));
        }
    }
}
