//! OCP FP8 conversions (E4M3 "fn": finite-only, max 448; E5M2: IEEE-like with inf).
//! Encoding rounds to nearest even and saturates to the largest finite value; NaN stays NaN.

/// The two FP8 formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8 {
    /// 4 exponent bits (bias 7), 3 mantissa bits, no infinities, NaN = S.1111.111.
    E4M3,
    /// 5 exponent bits (bias 15), 2 mantissa bits, infinities and NaNs as in IEEE.
    E5M2,
}

impl Fp8 {
    const fn mantissa_bits(self) -> i32 {
        match self {
            Fp8::E4M3 => 3,
            Fp8::E5M2 => 2,
        }
    }
    const fn bias(self) -> i32 {
        match self {
            Fp8::E4M3 => 7,
            Fp8::E5M2 => 15,
        }
    }
    /// Largest finite value.
    pub const fn max(self) -> f32 {
        match self {
            Fp8::E4M3 => 448.0,
            Fp8::E5M2 => 57344.0,
        }
    }
    const fn max_code(self) -> u8 {
        match self {
            Fp8::E4M3 => 0x7E,
            Fp8::E5M2 => 0x7B,
        }
    }
    const fn nan_code(self) -> u8 {
        match self {
            Fp8::E4M3 => 0x7F,
            Fp8::E5M2 => 0x7E,
        }
    }

    /// Decodes one byte.
    pub fn decode(self, code: u8) -> f32 {
        let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let mb = self.mantissa_bits();
        let exp_bits = 7 - mb;
        let e = ((code >> mb) & ((1 << exp_bits) - 1)) as i32;
        let m = (code & ((1 << mb) - 1)) as i32;
        let all_ones = (1 << exp_bits) - 1;
        match self {
            Fp8::E4M3 if e == all_ones && m == (1 << mb) - 1 => return f32::NAN,
            Fp8::E5M2 if e == all_ones => return if m == 0 { sign * f32::INFINITY } else { f32::NAN },
            _ => {}
        }
        let frac = m as f32 / (1 << mb) as f32;
        let v = if e == 0 { frac * 2f32.powi(1 - self.bias()) } else { (1.0 + frac) * 2f32.powi(e - self.bias()) };
        sign * v
    }

    /// Encodes one value: round to nearest even, saturate to the largest finite value.
    pub fn encode(self, x: f32) -> u8 {
        if x.is_nan() {
            return self.nan_code();
        }
        let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = f64::from(x.abs());
        if a >= f64::from(self.max()) {
            return sign | self.max_code();
        }
        let mb = self.mantissa_bits();
        let steps = f64::from(1 << mb);
        let emin = 1 - self.bias();
        let exp = if a == 0.0 { emin } else { a.log2().floor() as i32 };
        let code = if exp < emin {
            // Subnormal: multiples of 2^emin / 2^mb; rounding up to 2^mb lands exactly on
            // the smallest normal's code.
            round_half_even(a / 2f64.powi(emin) * steps) as u32
        } else {
            let mut e = exp;
            // log2 can be off by one at exact powers of two; fix up.
            if a / 2f64.powi(e) >= 2.0 {
                e += 1;
            } else if a / 2f64.powi(e) < 1.0 {
                e -= 1;
            }
            let mut q = round_half_even((a / 2f64.powi(e) - 1.0) * steps) as u32;
            if q == 1 << mb {
                q = 0;
                e += 1;
            }
            ((((e + self.bias()) as u32) << mb) | q).min(self.max_code() as u32)
        };
        sign | (code as u8)
    }
}

fn round_half_even(v: f64) -> f64 {
    let r = v.round();
    if (v - v.trunc()).abs() == 0.5 && r % 2.0 != 0.0 { r - v.signum() } else { r }
}

#[cfg(test)]
mod tests {
    use super::Fp8;

    #[test]
    fn every_finite_code_round_trips() {
        for f in [Fp8::E4M3, Fp8::E5M2] {
            for code in 0u8..=255 {
                let v = f.decode(code);
                if v.is_nan() || v.is_infinite() {
                    continue;
                }
                let back = f.encode(v);
                // +0 and -0 are distinct codes that decode to equal values.
                assert_eq!(f.decode(back), v, "{f:?} code {code:#04x} = {v}");
                if v != 0.0 {
                    assert_eq!(back, code, "{f:?} code {code:#04x} = {v}");
                }
            }
        }
    }

    #[test]
    fn known_values_saturation_and_nan() {
        let e4 = Fp8::E4M3;
        assert_eq!(e4.decode(0x7E), 448.0);
        assert!(e4.decode(0x7F).is_nan());
        assert_eq!(e4.encode(1000.0), 0x7E);
        assert_eq!(e4.encode(f32::INFINITY), 0x7E);
        assert_eq!(e4.encode(-1000.0), 0xFE);
        assert!(e4.decode(e4.encode(f32::NAN)).is_nan());
        assert_eq!(e4.decode(e4.encode(1.0)), 1.0);
        assert_eq!(e4.decode(0x01), 2f32.powi(-9));
        // 1.0625 lies halfway between 1.0 and 1.125: ties to even (1.0).
        assert_eq!(e4.decode(e4.encode(1.0625)), 1.0);
        let e5 = Fp8::E5M2;
        assert_eq!(e5.decode(0x7B), 57344.0);
        assert_eq!(e5.decode(0x7C), f32::INFINITY);
        assert_eq!(e5.encode(1e9), 0x7B);
        assert!(e5.decode(e5.encode(f32::NAN)).is_nan());
        assert_eq!(e5.decode(0x01), 2f32.powi(-16));
    }
}
