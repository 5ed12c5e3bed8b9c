//! Element types.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An element type, by its stable name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DType {
    /// IEEE binary32.
    #[serde(rename = "f32")]
    F32,
    /// IEEE binary16.
    #[serde(rename = "f16")]
    F16,
    /// bfloat16.
    #[serde(rename = "bf16")]
    BF16,
    /// OCP FP8 E4M3 (finite-only, max 448).
    #[serde(rename = "fp8_e4m3")]
    Fp8E4M3,
    /// OCP FP8 E5M2.
    #[serde(rename = "fp8_e5m2")]
    Fp8E5M2,
    /// Signed 8-bit integer.
    #[serde(rename = "i8")]
    I8,
    /// Signed 32-bit integer.
    #[serde(rename = "i32")]
    I32,
    /// Signed 64-bit integer.
    #[serde(rename = "i64")]
    I64,
    /// Boolean, one byte per element.
    #[serde(rename = "bool")]
    Bool,
}

impl DType {
    /// Every dtype.
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Fp8E4M3,
        DType::Fp8E5M2,
        DType::I8,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];

    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Fp8E4M3 => "fp8_e4m3",
            DType::Fp8E5M2 => "fp8_e5m2",
            DType::I8 => "i8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Fp8E4M3 | DType::Fp8E5M2 | DType::I8 | DType::Bool => 1,
            DType::I64 => 8,
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::Fp8E4M3 | DType::Fp8E5M2)
    }

    /// True when every value of `self` is exactly representable in `wider`, so a cast
    /// from `self` to `wider` loses nothing. Only such casts are done implicitly.
    pub fn widens_losslessly_to(self, wider: DType) -> bool {
        use DType::*;
        matches!(
            (self, wider),
            (F16, F32)
                | (BF16, F32)
                | (Fp8E4M3, F16 | BF16 | F32)
                | (Fp8E5M2, F16 | F32)
                | (I8, I32 | I64 | F16 | BF16 | F32)
                | (I32, I64)
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<DType, String> {
        DType::ALL.iter().copied().find(|d| d.as_str() == s).ok_or_else(|| {
            format!("unknown dtype {s:?} (expected one of f32 f16 bf16 fp8_e4m3 fp8_e5m2 i8 i32 i64 bool)")
        })
    }
}
