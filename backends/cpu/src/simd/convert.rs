//! Conversions between f32 and the 16-bit float formats.

/// bf16 to f32 (exact: the bits shifted up).
#[inline(always)]
pub(super) fn bf16_f32(x: half::bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// bf16 bits of `x`, round to nearest even; NaN keeps its sign and becomes quiet.
#[inline(always)]
pub(super) fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    if x.is_nan() { ((b >> 16) as u16) | 0x0040 } else { rounded }
}

/// `bf16_bits` for a value that is not NaN, or is the default quiet NaN that arithmetic on
/// non-NaN values produces (it stays NaN); infinities stay infinite.
#[inline(always)]
pub(crate) fn bf16_bits_finite(x: f32) -> u16 {
    let b = x.to_bits();
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

#[inline(always)]
fn bf16_to_f32_impl(src: &[half::bf16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f32::from_bits(u32::from(s.to_bits()) << 16);
    }
}

multiversion! {
    /// bf16 to f32 (exact).
    fn bf16_to_f32(src: &[half::bf16], dst: &mut [f32]) => bf16_to_f32_impl;
}

#[inline(always)]
fn f16_to_f32_impl(src: &[half::f16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

multiversion! {
    /// f16 to f32 (exact).
    fn f16_to_f32(src: &[half::f16], dst: &mut [f32]) => f16_to_f32_impl;
}

#[inline(always)]
fn f32_to_bf16_bits_impl(src: &[f32], dst: &mut [u16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = bf16_bits(x);
    }
}

multiversion! {
    /// f32 to bf16 bits, round to nearest even (NaN stays NaN).
    fn f32_to_bf16_bits(src: &[f32], dst: &mut [u16]) => f32_to_bf16_bits_impl;
}

#[inline(always)]
fn f32_to_bf16_impl(src: &[f32], dst: &mut [half::bf16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = half::bf16::from_bits(bf16_bits(x));
    }
}

multiversion! {
    /// f32 to bf16, round to nearest even (as `half::bf16::from_f32`).
    fn f32_to_bf16(src: &[f32], dst: &mut [half::bf16]) => f32_to_bf16_impl;
}
