//! The `policy_kernels` check (E2E §24, required kernels of the configured policy): every
//! kernel a lock rule that can apply on this host names runs here, so a policy requiring a
//! kernel this machine lacks fails the gate with the kernel named, not on the first request.

use super::Check;
use crate::policy::{Action, glob_match};
use crate::select::{BackendStatus, Selector};

/// `None` when the policy locks nothing that could apply here.
pub(super) fn policy_kernels_check(sel: &Selector, has_executor: impl Fn(&str) -> bool) -> Option<Check> {
    let hw = sel.hardware();
    let mut named = 0;
    let mut problems = Vec::new();
    for (i, rule) in sel.policy().rules.iter().enumerate().filter(|(_, r)| r.action == Action::Lock) {
        // A rule scoped to other machines or devices cannot require anything of this one.
        let here = (rule.when.hardware.is_empty() || rule.when.hardware.iter().any(|g| glob_match(g, &hw.name)))
            && (rule.when.device.is_empty() || hw.devices.iter().any(|d| rule.when.device.contains(&d.kind)));
        let Some(ki) = sel.catalog().find(&rule.kernels).filter(|_| here) else { continue };
        named += 1;
        let (backend, kernel) = sel.catalog().kernel(ki);
        let device = kernel.device.unwrap_or(backend.device);
        let why = match sel.availability().status(&backend.backend) {
            BackendStatus::NotInstalled(m) => Some(format!("BACKEND_NOT_INSTALLED: {m}")),
            BackendStatus::Unhealthy(m) => Some(format!("BACKEND_UNHEALTHY: {m}")),
            BackendStatus::Available if !hw.devices.iter().any(|d| d.kind == device) => {
                Some(format!("DEVICE_KIND_MISMATCH: it runs on {device}; this host has none"))
            }
            BackendStatus::Available if !has_executor(&kernel.id) => {
                Some("EXECUTOR_NOT_REGISTERED: no executor in this process".to_owned())
            }
            BackendStatus::Available => None,
        };
        if let Some(why) = why {
            problems.push(format!("rules[{i}] locks {} ({why})", kernel.id));
        }
    }
    if named == 0 {
        return None;
    }
    Some(if problems.is_empty() {
        Check::pass("policy_kernels", format!("{named} kernels locked by the policy, all runnable here"))
    } else {
        Check::fail(
            "policy_kernels",
            problems.join("; "),
            "install the backend of each kernel named, or scope or remove its lock rule".into(),
        )
    })
}
