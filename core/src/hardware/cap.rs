//! A ceiling on the instruction set this host uses (`LAYERZERO_CPU_ISA`): detection reports
//! no feature above it, the `cpu` kernels pick no code path above it, and oneDNN is told the
//! same (`dnnl_set_max_cpu_isa`), so one machine can run, test and measure another's paths
//! (an AVX2-only Zen 3, an AVX-512 Ice Lake, an AVX-512-BF16 Zen 4 without AMX).

use super::profile::CpuFeature;

/// The ceiling, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IsaCap {
    /// No vector extension beyond the build target's baseline.
    Portable,
    /// AVX2, FMA and F16C (a Zen 3, a Haswell-to-Skylake client).
    Avx2,
    /// AVX-512 F/BW/DQ/VL and VNNI, no bf16 (an Ice Lake server).
    Avx512,
    /// AVX-512 with BF16 (and FP16, AVX-VNNI, AVX-NE-CONVERT where present), no AMX (a Zen 4).
    Avx512Bf16,
    /// Everything up to AMX (a Sapphire Rapids).
    Amx,
    /// What the CPU has (no cap).
    Native,
}

impl IsaCap {
    /// Every cap by its knob value, lowest first.
    pub const ALL: [IsaCap; 6] =
        [IsaCap::Portable, IsaCap::Avx2, IsaCap::Avx512, IsaCap::Avx512Bf16, IsaCap::Amx, IsaCap::Native];

    /// The knob value.
    pub fn as_str(self) -> &'static str {
        match self {
            IsaCap::Portable => "portable",
            IsaCap::Avx2 => "avx2",
            IsaCap::Avx512 => "avx512",
            IsaCap::Avx512Bf16 => "avx512_bf16",
            IsaCap::Amx => "amx",
            IsaCap::Native => "native",
        }
    }

    /// Parses a knob value.
    pub fn parse(text: &str) -> Option<IsaCap> {
        IsaCap::ALL.into_iter().find(|c| c.as_str() == text.trim())
    }

    /// Whether a CPU feature stays usable under this cap.
    pub fn allows(self, f: CpuFeature) -> bool {
        use CpuFeature as F;
        let amx = matches!(f, F::AmxTile | F::AmxBf16 | F::AmxInt8 | F::AmxFp16);
        let bf16_era = matches!(f, F::Avx512Bf16 | F::Avx512Fp16 | F::AvxVnni | F::AvxNeConvert);
        let avx512 = matches!(f, F::Avx512f | F::Avx512bw | F::Avx512dq | F::Avx512vl | F::Avx512Vnni);
        let avx2 = matches!(f, F::Avx | F::Avx2 | F::Fma | F::F16c);
        match self {
            IsaCap::Native | IsaCap::Amx => true,
            IsaCap::Avx512Bf16 => !amx,
            IsaCap::Avx512 => !amx && !bf16_era,
            IsaCap::Avx2 => !amx && !bf16_era && !avx512,
            IsaCap::Portable => !amx && !bf16_era && !avx512 && !avx2,
        }
    }
}

impl std::fmt::Display for IsaCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CpuFeature as F;

    #[test]
    fn each_cap_keeps_exactly_the_features_of_the_machine_it_stands_for() {
        let kept = |cap: IsaCap| -> Vec<&str> {
            [F::Sse42, F::Avx2, F::Avx512f, F::Avx512Vnni, F::Avx512Bf16, F::AvxNeConvert, F::AmxBf16, F::Neon]
                .into_iter()
                .filter(|f| cap.allows(*f))
                .map(F::as_str)
                .collect()
        };
        assert_eq!(kept(IsaCap::Portable), ["sse4_2", "neon"]);
        assert_eq!(kept(IsaCap::Avx2), ["sse4_2", "avx2", "neon"]);
        assert_eq!(kept(IsaCap::Avx512), ["sse4_2", "avx2", "avx512f", "avx512_vnni", "neon"]);
        assert_eq!(
            kept(IsaCap::Avx512Bf16),
            ["sse4_2", "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_ne_convert", "neon"]
        );
        assert_eq!(kept(IsaCap::Amx).len(), 8);
        assert_eq!(kept(IsaCap::Native).len(), 8);
    }

    #[test]
    fn caps_parse_from_their_knob_values_and_order_low_to_high() {
        for c in IsaCap::ALL {
            assert_eq!(IsaCap::parse(c.as_str()), Some(c));
        }
        assert_eq!(IsaCap::parse("avx-512"), None);
        assert!(IsaCap::Avx2 < IsaCap::Avx512Bf16 && IsaCap::Amx < IsaCap::Native);
    }
}
