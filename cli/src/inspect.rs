//! The read-only commands: `lz explain` / `lz which` (one selection), `lz list-kernels`
//! (the catalog) and `lz hardware` (a profile).

use super::args::{HardwareArgs, ListArgs, SelectArgs};
use super::{Outcome, load_catalog, load_request, parse_op, print_json, render, selector};
use layerzero::error::{Error, Result};
use layerzero::hardware::named;
use layerzero::host::{detect, measure};

pub(super) fn explain(a: SelectArgs, which: bool) -> Result<Outcome> {
    let request = load_request(&a.request)?;
    let sel = selector(a.hardware.as_deref(), a.policy.as_ref(), load_catalog(&a.catalog)?)?;
    let report = sel.explain(&request);
    if a.json {
        if which {
            print_json(&serde_json::json!({
                "selected": report.selected,
                "hardware": report.hardware,
                "request_errors": report.request_errors,
            }));
        } else {
            print_json(&report.to_json());
        }
    } else if which {
        match &report.selected {
            Some(k) => println!("{k}"),
            None => eprintln!("{}", render::no_selection_line(&report)),
        }
    } else {
        print!("{}", render::explain(&report));
    }
    if !report.request_errors.is_empty() {
        if !a.json {
            return Err(Error::invalid(format!("invalid request: {}", report.request_errors[0])));
        }
        return Ok(Outcome::InputError);
    }
    Ok(if report.selected.is_some() { Outcome::Ok } else { Outcome::CheckFailed })
}

pub(super) fn list_kernels(a: ListArgs) -> Result<Outcome> {
    let catalog = load_catalog(&a.catalog)?;
    let op = a.op.as_deref().map(parse_op).transpose()?;
    if let Some(b) = &a.backend
        && catalog.backend(b).is_none()
    {
        let names: Vec<&str> = catalog.backends().iter().map(|b| b.backend.as_str()).collect();
        return Err(Error::invalid(format!("--backend {b:?} is not a backend (expected one of {})", names.join(", "))));
    }
    let rows: Vec<_> = catalog
        .kernels()
        .filter(|(_, b, k)| op.is_none_or(|o| k.op == o) && a.backend.as_ref().is_none_or(|n| &b.backend == n))
        .collect();
    // Whether this process has an executor for the kernel (oneDNN's when the library loads).
    let registry = layerzero::host::builtin_registry();
    let runs = |id: &str| registry.contains(id);
    if a.json {
        let items: Vec<serde_json::Value> = rows
            .iter()
            .map(|(_, b, k)| {
                serde_json::json!({
                    "kernel": k.id,
                    "backend": b.backend,
                    "op": k.op,
                    "device": k.device_kind(b),
                    "execution": b.execution,
                    "version": k.version.as_deref().unwrap_or(&b.version),
                    "properties": k.properties,
                    "executable": runs(&k.id),
                })
            })
            .collect();
        print_json(&serde_json::json!({ "capabilities_hash": catalog.hash(), "kernels": items }));
    } else {
        print!("{}", render::kernel_table(&rows, &runs));
    }
    Ok(Outcome::Ok)
}

pub(super) fn hardware(a: HardwareArgs) -> Result<Outcome> {
    if a.list {
        let names = named::builtin_names();
        if a.json {
            print_json(&serde_json::json!({ "profiles": names }));
        } else {
            println!("{}", names.join("\n"));
        }
        return Ok(Outcome::Ok);
    }
    if a.measure {
        return measure_host(a.json);
    }
    let (profile, notes) = match &a.hardware {
        Some(h) => (named::load(h)?, Vec::new()),
        None => {
            let d = detect::detect_host();
            (d.profile, d.notes)
        }
    };
    if a.json {
        let mut v = profile.to_file_json();
        v["fingerprint"] = serde_json::Value::String(profile.fingerprint.clone());
        v["notes"] = serde_json::json!(notes);
        print_json(&v);
    } else {
        print!("{}", render::hardware(&profile, &notes));
    }
    Ok(Outcome::Ok)
}

/// `lz hardware --measure`: measures this host, stores the figures and shows them next to
/// the nominal estimates.
fn measure_host(json: bool) -> Result<Outcome> {
    let nominal = detect::detect_nominal();
    let Some(cpu) = nominal.profile.devices.iter().find(|d| d.kind == layerzero::model::device::DeviceKind::Cpu) else {
        return Err(layerzero::Error::invalid("this host has no CPU device to measure"));
    };
    if !json {
        eprintln!("measuring {} (under a second, every thread busy)...", cpu.name);
    }
    let m = measure::measure(cpu, &nominal.profile.fingerprint);
    let path = measure::path();
    measure::save(&path, &m)?;
    let detected = detect::with_measured(nominal.clone(), &path);
    if json {
        let mut v = detected.profile.to_file_json();
        v["fingerprint"] = serde_json::Value::String(detected.profile.fingerprint.clone());
        v["notes"] = serde_json::json!(detected.notes);
        v["nominal"] = serde_json::json!({
            "memory_bandwidth_gbps": cpu.memory_bandwidth_gbps,
            "peak_tflops": cpu.peak_tflops,
        });
        v["measured"] = serde_json::to_value(&m).map_err(|e| layerzero::Error::invalid(e.to_string()))?;
        v["path"] = serde_json::Value::String(path.display().to_string());
        print_json(&v);
        return Ok(Outcome::Ok);
    }
    print!("{}", render::measured(cpu, &m, &path));
    Ok(Outcome::Ok)
}
