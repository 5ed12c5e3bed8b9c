//! `lz doctor`: is this installation sound? Hardware, backends, files, one selection.

use std::fmt::Write as _;
use std::sync::Arc;

use super::{Outcome, print_json, render};
use crate::capabilities::catalog::Catalog;
use crate::error::Result;
use crate::hardware::detect;
use crate::model::attrs::{AttentionAttrs, Attrs};
use crate::model::device::DeviceKind;
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::op::Op;
use crate::model::request::Request;
use crate::model::tensor::TensorDesc;
use crate::policy::Policy;
use crate::select::{Availability, BackendStatus, Selector};

/// A typical attention request for the primary device: causal GQA prefill.
fn sample_request(kind: DeviceKind) -> Request {
    let (dtype, seq) = match kind {
        DeviceKind::Cpu => (DType::F32, 512),
        DeviceKind::Cuda | DeviceKind::Rocm => (DType::BF16, 2048),
    };
    let t = |h: u64| TensorDesc::new(dtype, [1, seq, h, 128]).with_layout(Layout::Bshd);
    Request::new(Op::Attention)
        .tensor("q", t(32))
        .tensor("k", t(8))
        .tensor("v", t(8))
        .attrs(Attrs::Attention(AttentionAttrs { causal: true, ..AttentionAttrs::default() }))
}

pub(super) fn run(catalog: Arc<Catalog>, json: bool) -> Result<Outcome> {
    let detection = detect::detect_host();
    let host = Arc::new(detection.profile);
    let availability = Arc::new(Availability::probe_host(&catalog, &host, &[]));
    let files = super::validate::shipped_results();
    let files_ok = files.iter().all(|(_, _, e)| e.is_empty());
    let selector = Selector::new(catalog.clone(), host.clone(), Arc::new(Policy::default()), availability.clone())?;
    let request = sample_request(host.primary().kind);
    let sample = selector.select(&request);
    let ok = files_ok && sample.is_ok();

    let backends: Vec<serde_json::Value> = catalog
        .backends()
        .iter()
        .map(|b| {
            let (status, reason) = match availability.status(&b.backend) {
                BackendStatus::Available => ("available", None),
                BackendStatus::NotInstalled(r) => ("not_installed", Some(r)),
                BackendStatus::Unhealthy(r) => ("unhealthy", Some(r)),
            };
            serde_json::json!({
                "backend": b.backend, "device": b.device, "execution": b.execution, "version": b.version,
                "kernels": b.kernels.len(), "status": status, "reason": reason,
            })
        })
        .collect();
    let sample_json = match &sample {
        Ok(s) => serde_json::json!({
            "request": request, "selected": s.kernel, "estimated_ns": s.score.total_ns, "error": null,
        }),
        Err(e) => {
            serde_json::json!({"request": request, "selected": null, "estimated_ns": null, "error": e.to_string()})
        }
    };
    if json {
        let mut hw = host.to_file_json();
        hw["fingerprint"] = serde_json::Value::String(host.fingerprint.clone());
        print_json(&serde_json::json!({
            "layerzero_version": env!("CARGO_PKG_VERSION"),
            "ok": ok,
            "hardware": hw,
            "hardware_notes": detection.notes,
            "capabilities_hash": catalog.hash(),
            "backends": backends,
            "files": files.iter().map(|(f, k, e)| serde_json::json!({"file": f, "kind": k, "valid": e.is_empty(), "errors": e})).collect::<Vec<_>>(),
            "sample_selection": sample_json,
        }));
    } else {
        let mut out = String::new();
        let _ = writeln!(out, "LayerZero {} doctor\n", env!("CARGO_PKG_VERSION"));
        out.push_str(&render::hardware(&host, &detection.notes));
        let _ = writeln!(out, "\nbackends:");
        for b in catalog.backends() {
            let line = match availability.status(&b.backend) {
                BackendStatus::Available => "available".to_owned(),
                BackendStatus::NotInstalled(r) => format!("not installed: {r}"),
                BackendStatus::Unhealthy(r) => format!("unhealthy: {r}"),
            };
            let _ = writeln!(out, "  {:<14} {:<5} v{:<8} {line}", b.backend, b.device.as_str(), b.version);
        }
        let _ = writeln!(out, "\nfiles:");
        for (f, k, errs) in &files {
            match errs.first() {
                None => {
                    let _ = writeln!(out, "  ok       {k:<13} {f}");
                }
                Some(e) => {
                    let _ = writeln!(out, "  INVALID  {k:<13} {e}");
                }
            }
        }
        let _ = writeln!(out, "  capabilities hash {}", catalog.hash());
        let _ = writeln!(out, "\nsample selection (causal GQA attention on {}):", host.primary().kind);
        match &sample {
            Ok(s) => {
                let _ = writeln!(out, "  {} (modeled {})", s.kernel, render::duration(s.score.total_ns));
            }
            Err(e) => {
                let _ = writeln!(out, "  FAILED: {e}");
            }
        }
        let _ = writeln!(out, "\n{}", if ok { "doctor: ok" } else { "doctor: problems found (see above)" });
        print!("{out}");
    }
    Ok(if ok { Outcome::Ok } else { Outcome::CheckFailed })
}
