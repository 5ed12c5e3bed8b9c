//! The 4-bit weight formats of `linear_int4` (and of a 4-bit `dequantize`, `QuantAttrs::format`)
//! and what each one's scales must be.
//!
//! Every format packs two 4-bit codes per byte of an `[N, K/2]` weight and scales blocks of
//! `group_size` consecutive input features of one output row (`scales` `[N, K/group_size]`,
//! row-major: NVIDIA's "linear" scale order). The public definitions followed:
//!
//! - `int4`: unsigned codes q, `w = (q - zero) * scale` (zero 8 without `zeros`); float scales.
//! - `nf4` (bitsandbytes / QLoRA): `w = NF4[q] * absmax`, absmax f32 per block (64 by
//!   default); the FIRST element of a pair sits in the HIGH nibble (bitsandbytes'
//!   `kQuantizeBlockwise` packs `q[2j] << 4 | q[2j + 1]`).
//! - `mxfp4` (OCP Microscaling v1.0): FP4 E2M1 codes in blocks of 32 along K, one E8M0 scale
//!   per block (`2^(e - 127)`, e = 255 is NaN) stored as raw bytes in an i8 tensor.
//! - `nvfp4` (NVIDIA): FP4 E2M1 codes in blocks of 16 along K, one FP8 E4M3 scale per block
//!   and an optional per-tensor f32 `global_scale` [1]: `w = E2M1[q] * scale * global_scale`.
//!
//! int4, mxfp4 and nvfp4 put the even element in the LOW nibble; nf4 in the HIGH one.

use serde::{Deserialize, Serialize};

use super::dtype::DType;

/// The 4-bit code a `linear_int4` weight holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum W4Format {
    /// Unsigned integers with a zero point (GPTQ / AWQ style).
    #[default]
    Int4,
    /// NormalFloat 4 (bitsandbytes).
    Nf4,
    /// FP4 E2M1 with E8M0 block scales (OCP MX).
    Mxfp4,
    /// FP4 E2M1 with FP8 E4M3 block scales and a per-tensor scale (NVIDIA).
    Nvfp4,
}

/// The order the block scales are stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleOrder {
    /// `[N, K / group_size]` row-major.
    #[default]
    Linear,
    /// NVIDIA's tensor-core order: 128 x 4 tiles of scales, each stored as 32 x 4 x 4
    /// ("32_4_4"); what the cuBLASLt / CUTLASS block-scaled GEMMs read.
    #[serde(rename = "swizzled_32_4_4")]
    Swizzled32x4x4,
}

/// How `linear_int4` takes its activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActQuant {
    /// As given (f32 arithmetic on x).
    #[default]
    F32,
    /// Rounded to int8 first, in blocks of `group_size` along K with one scale each
    /// (`d = max|x| / 127`, `q = round_ties_even(x / d)`, `x = q * d`): llama.cpp's Q8_0
    /// activations, which its Q4_0 dot products take.
    Int8,
}

impl ActQuant {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            ActQuant::F32 => "f32",
            ActQuant::Int8 => "int8",
        }
    }

    /// Whether this is the default (`f32`).
    pub fn is_f32(&self) -> bool {
        *self == ActQuant::F32
    }
}

/// The 16 NF4 values, indexed by code, as bitsandbytes writes them (`csrc/kernels.cu`,
/// `nf4_dequantization_lut`; float32, the decimals below are those float32 values exactly).
const NF4_DECIMAL: [f64; 16] = [
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
];

/// The NF4 table in float32.
pub const NF4: [f32; 16] = {
    let mut t = [0f32; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = NF4_DECIMAL[i] as f32;
        i += 1;
    }
    t
};

/// The 16 FP4 E2M1 values, indexed by code: bit 3 the sign, then 2 exponent bits (bias 1)
/// and 1 mantissa bit, no infinities or NaN.
pub const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// An E8M0 scale byte's value: `2^(e - 127)`; 255 is NaN.
pub fn e8m0(e: u8) -> f64 {
    if e == 255 { f64::NAN } else { (f64::from(e) - 127.0).exp2() }
}

/// An E8M0 scale byte's value in f32, from its bits (no `exp2`): 2^(e - 127) is the normal
/// float with exponent field e (1..=254), 2^-127 the subnormal 2^22 ulps, 255 NaN.
pub fn e8m0_f32(e: u8) -> f32 {
    match e {
        0 => f32::from_bits(1 << 22),
        255 => f32::NAN,
        e => f32::from_bits(u32::from(e) << 23),
    }
}

impl W4Format {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            W4Format::Int4 => "int4",
            W4Format::Nf4 => "nf4",
            W4Format::Mxfp4 => "mxfp4",
            W4Format::Nvfp4 => "nvfp4",
        }
    }

    /// Whether this is the default (`int4`): then the attribute is not serialized, so the
    /// requests and keys made before the other formats existed are unchanged.
    pub fn is_int4(&self) -> bool {
        *self == W4Format::Int4
    }

    /// Whether the even element of a byte's pair is in the high nibble (bitsandbytes).
    pub fn high_nibble_first(self) -> bool {
        self == W4Format::Nf4
    }

    /// The block size the format defines, when it fixes one.
    pub fn block(self) -> Option<u64> {
        match self {
            W4Format::Mxfp4 => Some(32),
            W4Format::Nvfp4 => Some(16),
            W4Format::Int4 | W4Format::Nf4 => None,
        }
    }

    /// The dtypes the format's `scales` may have.
    pub fn scale_dtypes(self) -> &'static [DType] {
        match self {
            W4Format::Int4 => &[DType::F32, DType::F16, DType::BF16],
            W4Format::Nf4 => &[DType::F32],
            W4Format::Mxfp4 => &[DType::I8],
            W4Format::Nvfp4 => &[DType::Fp8E4M3],
        }
    }

    /// The value of code `q` before scaling (int4: the unsigned integer; its zero point is
    /// applied by the caller).
    pub fn code(self, q: u8) -> f32 {
        let q = usize::from(q & 0x0F);
        match self {
            W4Format::Int4 => q as f32,
            W4Format::Nf4 => NF4[q],
            W4Format::Mxfp4 | W4Format::Nvfp4 => E2M1[q],
        }
    }

    /// Why `scales` of `dtype` in groups of `group`, with or without `zeros` and a
    /// `global_scale`, are not this format's, in words naming what differs (None when they are).
    pub fn scale_mismatch(self, group: u64, dtype: DType, zeros: bool, global: bool) -> Option<String> {
        let name = self.as_str();
        if let Some(b) = self.block()
            && group != b
        {
            return Some(format!("{name} scales blocks of {b} along K; attrs.group_size is {group}"));
        }
        if !self.scale_dtypes().contains(&dtype) {
            let want: Vec<&str> = self.scale_dtypes().iter().map(|d| d.as_str()).collect();
            let what = match self {
                W4Format::Mxfp4 => " (E8M0 exponent bytes)",
                W4Format::Nf4 => " (bitsandbytes absmax)",
                _ => "",
            };
            return Some(format!("{name} scales are {}{what}; the given scales are {dtype}", want.join(" or ")));
        }
        if zeros && self != W4Format::Int4 {
            return Some(format!("{name} is symmetric: it takes no `zeros`"));
        }
        if global && self != W4Format::Nvfp4 {
            return Some(format!("only nvfp4 has a per-tensor `global_scale`; the format is {name}"));
        }
        None
    }
}

/// Why a `name` tensor of `shape` is not the `[N, K / group]` of a per-block format, naming
/// a per-channel tensor as such (None when it is that shape).
pub fn group_shape_mismatch(name: &str, shape: &[u64], n: u64, k: u64, group: u64) -> Option<String> {
    let want = [n, k / group.max(1)];
    if shape == want {
        return None;
    }
    let per_channel = shape == [n] || shape == [n, 1];
    Some(if per_channel && want[1] != 1 {
        format!(
            "tensor `{name}` {shape:?} is per-channel (one per output row); the kernel scales blocks of {group} \
             along K: [out_features, in_features / group_size] = {want:?}"
        )
    } else {
        format!("tensor `{name}` shape {shape:?} must be [out_features, in_features / group_size] = {want:?}")
    })
}

impl ScaleOrder {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            ScaleOrder::Linear => "linear",
            ScaleOrder::Swizzled32x4x4 => "swizzled_32_4_4",
        }
    }

    /// Whether this is the default (`linear`).
    pub fn is_linear(&self) -> bool {
        *self == ScaleOrder::Linear
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_follow_their_public_definitions() {
        // E2M1: 2^(e - 1) * (1 + m / 2) for e > 0, m / 2 for e = 0; the sign bit negates.
        for q in 0u8..8 {
            let (e, m) = (i32::from(q >> 1), f32::from(q & 1));
            let v = if e == 0 { m * 0.5 } else { 2f32.powi(e - 1) * (1.0 + m * 0.5) };
            assert_eq!(E2M1[usize::from(q)], v);
            assert_eq!(E2M1[usize::from(q | 8)], -v);
        }
        // NF4 is sorted, spans [-1, 1] and holds an exact zero at code 7.
        assert!(NF4.windows(2).all(|w| w[0] < w[1]));
        assert_eq!((NF4[0], NF4[7], NF4[15]), (-1.0, 0.0, 1.0));
        // The decimals are float32 values exactly: nothing is lost narrowing them.
        assert!(NF4.iter().zip(NF4_DECIMAL).all(|(&f, d)| f64::from(f) == d));
        assert_eq!((e8m0(127), e8m0(0), e8m0(130)), (1.0, 2f64.powi(-127), 8.0));
        assert!(e8m0(255).is_nan());
        for e in 0..=254u8 {
            assert_eq!(f64::from(e8m0_f32(e)), e8m0(e), "{e}");
        }
        assert!(e8m0_f32(255).is_nan());
    }

    #[test]
    fn a_scale_that_is_not_the_formats_is_named() {
        let m = W4Format::Nvfp4.scale_mismatch(32, DType::Fp8E4M3, false, true);
        assert!(m.is_some_and(|m| m.contains("blocks of 16") && m.contains("32")));
        let m = W4Format::Mxfp4.scale_mismatch(32, DType::F32, false, false);
        assert!(m.is_some_and(|m| m.contains("E8M0") && m.contains("f32")));
        assert!(W4Format::Nf4.scale_mismatch(64, DType::F32, true, false).is_some());
        assert!(W4Format::Nf4.scale_mismatch(64, DType::F32, false, false).is_none());
        assert!(W4Format::Int4.scale_mismatch(16, DType::BF16, true, false).is_none());
    }

    #[test]
    fn the_serialized_names_are_the_stable_names() -> Result<(), serde_json::Error> {
        for o in [ScaleOrder::Linear, ScaleOrder::Swizzled32x4x4] {
            assert_eq!(serde_json::to_string(&o)?, format!("\"{}\"", o.as_str()));
        }
        for f in [W4Format::Int4, W4Format::Nf4, W4Format::Mxfp4, W4Format::Nvfp4] {
            assert_eq!(serde_json::to_string(&f)?, format!("\"{}\"", f.as_str()));
        }
        Ok(())
    }
}
