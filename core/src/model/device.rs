//! Devices: which kind of processor a tensor lives on and a kernel runs on.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A kind of device. A kernel runs on exactly one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// The host CPU.
    Cpu,
    /// An NVIDIA GPU.
    Cuda,
    /// An AMD GPU.
    Rocm,
}

impl DeviceKind {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Rocm => "rocm",
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A device reference as written in a request: `cpu`, `cuda`, `cuda:1`, `rocm:0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceRef {
    /// The kind.
    pub kind: DeviceKind,
    /// The index among devices of that kind; `None` means the first.
    pub index: Option<u32>,
}

impl DeviceRef {
    /// The index, defaulting to 0.
    pub fn ordinal(self) -> u32 {
        self.index.unwrap_or(0)
    }
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "{}:{i}", self.kind),
            None => f.write_str(self.kind.as_str()),
        }
    }
}

impl FromStr for DeviceRef {
    type Err = String;
    fn from_str(s: &str) -> Result<DeviceRef, String> {
        let (kind, index) = match s.split_once(':') {
            Some((k, i)) => {
                let idx = i
                    .parse::<u32>()
                    .map_err(|_| format!("invalid device index {i:?} in {s:?} (expected e.g. cuda:1)"))?;
                (k, Some(idx))
            }
            None => (s, None),
        };
        let kind = match kind {
            "cpu" => DeviceKind::Cpu,
            "cuda" => DeviceKind::Cuda,
            "rocm" => DeviceKind::Rocm,
            other => {
                return Err(format!("unknown device {other:?} (expected cpu, cuda or rocm, optionally with :INDEX)"));
            }
        };
        Ok(DeviceRef { kind, index })
    }
}

impl Serialize for DeviceRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DeviceRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<DeviceRef, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
