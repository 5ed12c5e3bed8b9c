//! Shipped hardware profiles (`capabilities/hardware/*.json`, compiled in) and loading a
//! profile by name or from a file: plan for an H100 from a laptop.

use crate::error::{Error, ErrorKind, Result};
use crate::hardware::profile::HardwareProfile;
use crate::schema::{self, SchemaKind};

macro_rules! shipped {
    ($($name:literal),+ $(,)?) => {
        &[ $( (concat!($name, ".json"), include_str!(concat!("../../../capabilities/hardware/", $name, ".json"))), )+ ]
    };
}

/// Every shipped profile file, sorted by file name: `(file name, text)`.
static FILES: &[(&str, &str)] = shipped!(
    "a10", "a100", "b200", "h100", "h200", "icx", "l4", "mi250x", "mi300x", "mi355x", "rtx4090", "spr", "t4", "zen3",
    "zen4",
);

/// The shipped profile files: `(file name such as "h100.json", JSON text)`, sorted by name.
pub fn builtin_files() -> &'static [(&'static str, &'static str)] {
    FILES
}

/// The names of the shipped profiles (`a100`, `h100`, ...), sorted.
pub fn builtin_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> =
        FILES.iter().map(|(file, _)| file.strip_suffix(".json").unwrap_or(file)).collect();
    names.sort_unstable();
    names
}

/// The text of a shipped profile by name.
fn builtin_text(name: &str) -> Option<(&'static str, &'static str)> {
    FILES.iter().find(|(file, _)| file.strip_suffix(".json") == Some(name)).map(|&(file, text)| (file, text))
}

/// True when `s` should be read as a path rather than a shipped name.
fn looks_like_path(s: &str) -> bool {
    s.ends_with(".json") || s.contains('/') || s.contains(std::path::MAIN_SEPARATOR)
}

/// Parses and checks a profile document: schema first (names the field and the rule), then
/// the typed parse.
fn parse(text: &str, origin: &str) -> Result<HardwareProfile> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::invalid(format!("{origin}: not valid JSON: {e}")))?;
    schema::validate(SchemaKind::Hardware, &value, origin)?;
    HardwareProfile::from_json(text, origin)
}

/// A hardware profile: a shipped name (`h100`, `zen4`, ...) or a path to a `.json` profile
/// file. An unknown name is an error of kind [`ErrorKind::UnknownHardware`] that lists the
/// shipped names; a file that cannot be read is [`ErrorKind::Io`]; a file that breaks the
/// schema is [`ErrorKind::Schema`].
pub fn load(name_or_path: &str) -> Result<HardwareProfile> {
    let key = name_or_path.trim();
    if let Some((file, text)) = builtin_text(key) {
        return parse(text, &format!("capabilities/hardware/{file}"));
    }
    if looks_like_path(key) || std::path::Path::new(key).is_file() {
        let text =
            crate::files::read_to_string(std::path::Path::new(key)).map_err(|e| e.context("hardware profile"))?;
        return parse(&text, key);
    }
    Err(Error::new(
        ErrorKind::UnknownHardware,
        format!(
            "unknown hardware profile {key:?} (shipped: {}; or give a path to a .json profile file)",
            builtin_names().join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::model::device::DeviceKind;

    #[test]
    fn every_shipped_profile_loads_and_is_named_after_its_file() -> TestResult {
        for name in builtin_names() {
            let p = load(name).map_err(|e| format!("{name}: {e}"))?;
            assert_eq!(p.name, name);
            assert!(!p.devices.is_empty());
            for d in &p.devices {
                assert!(!d.peak_tflops.is_empty(), "{name}: {}", d.name);
                assert!(d.memory_bandwidth_gbps > 0.0 && d.memory_bytes > 0 && d.compute_units > 0);
            }
        }
        Ok(())
    }

    #[test]
    fn names_are_sorted_and_complete() {
        let names = builtin_names();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
        for n in ["t4", "a100", "a10", "l4", "rtx4090", "h100", "h200", "b200", "mi300x", "zen3", "icx", "zen4", "spr"]
        {
            assert!(names.contains(&n), "{n} missing");
        }
    }

    #[test]
    fn gpu_profiles_put_the_gpu_first_and_a_host_cpu_last() -> TestResult {
        for name in ["t4", "a100", "a10", "l4", "rtx4090", "h100", "h200", "b200", "mi250x", "mi300x", "mi355x"] {
            let p = load(name)?;
            assert_ne!(p.primary().kind, DeviceKind::Cpu, "{name}");
            assert_eq!(p.devices.last().map(|d| d.kind), Some(DeviceKind::Cpu), "{name}");
        }
        for (name, gfx) in [("mi250x", "gfx90a"), ("mi300x", "gfx942"), ("mi355x", "gfx950")] {
            assert_eq!(load(name)?.primary().gfx.as_deref(), Some(gfx), "{name}");
        }
        assert_eq!(load("h100")?.primary().compute_capability.map(|c| c.to_string()), Some("9.0".into()));
        Ok(())
    }

    #[test]
    fn unknown_name_lists_the_shipped_ones() -> TestResult {
        let e = load("h900").err().ok_or("an unknown name must be refused")?;
        assert_eq!(e.kind(), ErrorKind::UnknownHardware);
        assert!(e.message().contains("h100") && e.message().contains("zen4"), "{e}");
        Ok(())
    }

    #[test]
    fn missing_file_is_io_and_bad_file_is_schema() -> TestResult {
        assert_eq!(load("/nonexistent/x.json").err().ok_or("a missing file must be refused")?.kind(), ErrorKind::Io);
        let dir = std::env::temp_dir().join(format!("lz-named-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("bad.json");
        let mut v: serde_json::Value = serde_json::from_str(builtin_text("h100").ok_or("h100 is not shipped")?.1)?;
        v["devices"][0].as_object_mut().ok_or("the first device is not an object")?.remove("compute_capability");
        std::fs::write(&path, v.to_string())?;
        let e = load(path.to_str().ok_or("a temporary path that is not UTF-8")?)
            .err()
            .ok_or("a bad file must be refused")?;
        assert_eq!(e.kind(), ErrorKind::Schema, "{e}");
        let good = dir.join("good.json");
        std::fs::write(&good, builtin_text("zen4").ok_or("zen4 is not shipped")?.1)?;
        assert_eq!(load(good.to_str().ok_or("a temporary path that is not UTF-8")?)?.name, "zen4");
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    #[test]
    fn shipped_profiles_round_trip_through_to_file_json() -> TestResult {
        for name in builtin_names() {
            let p = load(name)?;
            let text = p.to_file_json().to_string();
            let again = HardwareProfile::from_json(&text, name)?;
            assert_eq!(again, p);
        }
        Ok(())
    }
}
