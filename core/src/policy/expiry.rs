//! Time-boxed rules: a rule's `expires_at` (`YYYY-MM-DDTHH:MM:SSZ`, UTC) and the policy in
//! force at a given instant. The instant is always passed in: the policy stays pure, and the
//! runtime decides when to look at the clock.

use super::Policy;
use crate::time::parse_utc;

impl Policy {
    /// The policy in force at `now` (Unix seconds): rules whose `expires_at` has passed are
    /// dropped. Rules with an unreadable timestamp never load, so none is dropped for that.
    pub fn in_force_at(&self, now: i64) -> Policy {
        let mut p = self.clone();
        p.rules.retain(|r| r.expires_at.as_deref().and_then(parse_utc).is_none_or(|t| now < t));
        p
    }

    /// The earliest `expires_at` after `now`, if any rule has one.
    pub fn next_expiry_after(&self, now: i64) -> Option<i64> {
        self.rules.iter().filter_map(|r| r.expires_at.as_deref().and_then(parse_utc)).filter(|&t| t > now).min()
    }
}
