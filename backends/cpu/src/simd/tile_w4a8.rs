//! The register tile of the int4 x int8 prefill GEMM (`gemm::w4a8`): up to four rows of x's
//! int8 codes against a panel of [`W4A8_PANEL`] weight columns whose int4 codes are packed
//! four consecutive k to a 32-bit lane. `vpdpbusd` (AVX-512 VNNI) multiplies the unsigned
//! codes by a broadcast of four x codes and sums them into the lane, exactly; after each
//! block of `g` k the lane's integer sum, with the zero point's term added, goes to f32 once,
//! times x's block scale and the column's. Per 64 multiply-adds one instruction, where the
//! f32 GEMM on dequantized weights spends one per 16 and decodes every code first.
//!
//! With AVX2 alone (no VNNI: Zen 3), `vpmaddubsw` multiplies the same bytes into pairs
//! summed in i16, eight k-steps (32 k) summed in i16 before `vpmaddwd` widens them (at most
//! 8 x 2 x 15 x 128 = 30720 in magnitude: no saturation), two rows of x at a time; blocks of
//! a multiple of 32.

use std::sync::OnceLock;

use super::{Level, level};

/// Weight columns per packed panel (two 16-lane registers).
pub(crate) const W4A8_PANEL: usize = 32;
/// Most rows of x per tile.
pub(crate) const W4A8_ROWS: usize = 4;

/// One tile's operands.
#[derive(Clone, Copy)]
pub(crate) struct W4a8Tile<'a> {
    /// The panel's codes, `[k / 4][W4A8_PANEL][4]` (values 0..=15).
    pub codes: &'a [u8],
    /// The panel's scales, `[k / g][W4A8_PANEL]`.
    pub scales: &'a [f32],
    /// The rows' int8 codes, `[rows][k]`.
    pub x: &'a [i8],
    /// Per row and block (`[rows][k / g]`): x's scale.
    pub sx: &'a [f32],
    /// Per row and block: minus the zero point (8) times the sum of the block's x codes.
    pub zt: &'a [i32],
    /// Rows of x (1..=4).
    pub rows: usize,
    /// Inner dimension (a multiple of `g`).
    pub k: usize,
    /// Block size (a multiple of 4).
    pub g: usize,
}

impl W4a8Tile<'_> {
    /// Whether the slices hold what the shape says (checked before the unchecked loads).
    fn fits(&self) -> bool {
        let groups = self.k / self.g.max(1);
        (1..=W4A8_ROWS).contains(&self.rows)
            && self.g > 0
            && self.g.is_multiple_of(4)
            && self.k.is_multiple_of(self.g)
            && self.codes.len() >= self.k * W4A8_PANEL
            && self.scales.len() >= groups * W4A8_PANEL
            && self.x.len() >= self.rows * self.k
            && self.sx.len() >= self.rows * groups
            && self.zt.len() >= self.rows * groups
    }
}

/// Which tile runs here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// AVX-512 with VNNI and BW (and not capped below it).
    Vnni,
    /// AVX2 (the level in use, or AVX-512 without VNNI).
    Avx2,
}

fn kind() -> Option<Kind> {
    #[cfg(target_arch = "x86_64")]
    {
        static VNNI: OnceLock<bool> = OnceLock::new();
        let vnni =
            || *VNNI.get_or_init(|| is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw"));
        match level() {
            Level::Avx512 if vnni() => Some(Kind::Vnni),
            Level::Avx512 | Level::Avx2 => Some(Kind::Avx2),
            Level::Portable => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, &OnceLock::<bool>::new, Kind::Vnni, Kind::Avx2);
        None
    }
}

/// Whether [`w4a8_tile`] runs here for blocks of `g`: any multiple of 4 with AVX-512 VNNI, a
/// multiple of 32 with AVX2.
pub(crate) fn w4a8_tiles(g: usize) -> bool {
    match kind() {
        Some(Kind::Vnni) => g > 0 && g.is_multiple_of(4),
        Some(Kind::Avx2) => g > 0 && g.is_multiple_of(32),
        None => false,
    }
}

/// `out[r][c] = sum over blocks b of (sum_k x[r, k] * code[c, k] + zt[r, b]) * sx[r, b] *
/// scale[b, c]` for the tile's rows; `false` (nothing written) where [`w4a8_tiles`] is
/// false for `t.g` or the operands do not fit the shape.
pub(crate) fn w4a8_tile(t: &W4a8Tile<'_>, out: &mut [[f32; W4A8_PANEL]; W4A8_ROWS]) -> bool {
    match kind() {
        Some(k) if w4a8_tiles(t.g) && t.fits() => {
            #[cfg(target_arch = "x86_64")]
            {
                #[allow(unsafe_code)]
                // SAFETY: `kind()` is Vnni only when AVX-512F, BW and VNNI were detected, Avx2
                // when AVX2 and FMA were (and then g is a multiple of 32: `w4a8_tiles`); `fits`
                // holds.
                unsafe {
                    run(k, t, out)
                };
                true
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = (k, out);
                false
            }
        }
        _ => false,
    }
}

/// The tile by `kind`.
///
/// # Safety
/// The CPU must have `kind`'s features (with AVX2, `t.g` a multiple of 32) and `t.fits()`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
unsafe fn run(kind: Kind, t: &W4a8Tile<'_>, out: &mut [[f32; W4A8_PANEL]; W4A8_ROWS]) {
    // SAFETY: the caller's contract.
    unsafe {
        match (kind, t.rows) {
            (Kind::Vnni, 1) => x86::tile::<1>(t, out),
            (Kind::Vnni, 2) => x86::tile::<2>(t, out),
            (Kind::Vnni, 3) => x86::tile::<3>(t, out),
            (Kind::Vnni, _) => x86::tile::<4>(t, out),
            (Kind::Avx2, _) => {
                // Two rows at a time (16 registers).
                let (top, bottom) = out.split_at_mut(2);
                x86::tile_avx2(t, 0, t.rows.min(2), top);
                if t.rows > 2 {
                    x86::tile_avx2(t, 2, t.rows - 2, bottom);
                }
            }
        }
    }
}

/// [`w4a8_tile`] by its definition, in scalar code (the tests' reference).
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) fn w4a8_tile_scalar(t: &W4a8Tile<'_>, out: &mut [[f32; W4A8_PANEL]; W4A8_ROWS]) {
    let groups = t.k / t.g;
    for (r, row) in out.iter_mut().enumerate().take(t.rows) {
        for (c, o) in row.iter_mut().enumerate() {
            let mut acc = 0f32;
            for b in 0..groups {
                let mut s = t.zt[r * groups + b];
                for kk in b * t.g..(b + 1) * t.g {
                    let code = t.codes[(kk / 4) * W4A8_PANEL * 4 + c * 4 + kk % 4];
                    s += i32::from(code) * i32::from(t.x[r * t.k + kk]);
                }
                acc += s as f32 * (t.scales[b * W4A8_PANEL + c] * t.sx[r * groups + b]);
            }
            *o = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::*;

    use super::{W4A8_PANEL, W4A8_ROWS, W4a8Tile};

    /// # Safety
    /// AVX-512F, BW and VNNI must be available and `t.fits()` hold with `t.rows == R`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn tile<const R: usize>(t: &W4a8Tile<'_>, out: &mut [[f32; W4A8_PANEL]; W4A8_ROWS]) {
        let (k, g) = (t.k, t.g);
        let groups = k / g;
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for b in 0..groups {
            let mut sums = [[_mm512_setzero_si512(); 2]; R];
            for kk in (b * g..(b + 1) * g).step_by(4) {
                // SAFETY: kk + 4 <= k: the panel holds k * 32 bytes (`fits`), a row k codes.
                unsafe {
                    let p = t.codes.as_ptr().add(kk * W4A8_PANEL);
                    let (w0, w1) = (_mm512_loadu_si512(p.cast()), _mm512_loadu_si512(p.add(64).cast()));
                    for (r, s) in sums.iter_mut().enumerate() {
                        let xv = _mm512_set1_epi32(t.x.as_ptr().add(r * k + kk).cast::<i32>().read_unaligned());
                        s[0] = _mm512_dpbusd_epi32(s[0], w0, xv);
                        s[1] = _mm512_dpbusd_epi32(s[1], w1, xv);
                    }
                }
            }
            // SAFETY: b < groups: the panel's scales hold groups * 32, the rows' terms R * groups.
            unsafe {
                let sc = t.scales.as_ptr().add(b * W4A8_PANEL);
                let (w0, w1) = (_mm512_loadu_ps(sc), _mm512_loadu_ps(sc.add(16)));
                for (r, (a, s)) in acc.iter_mut().zip(&sums).enumerate() {
                    let z = _mm512_set1_epi32(*t.zt.get_unchecked(r * groups + b));
                    let sx = _mm512_set1_ps(*t.sx.get_unchecked(r * groups + b));
                    for (j, w) in [w0, w1].into_iter().enumerate() {
                        let v = _mm512_cvtepi32_ps(_mm512_add_epi32(s[j], z));
                        a[j] = _mm512_fmadd_ps(v, _mm512_mul_ps(w, sx), a[j]);
                    }
                }
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            // SAFETY: each output row holds 32 floats.
            unsafe {
                _mm512_storeu_ps(o.as_mut_ptr(), a[0]);
                _mm512_storeu_ps(o.as_mut_ptr().add(16), a[1]);
            }
        }
    }

    /// Rows `r0..r0 + rows` of the tile (`rows` 1 or 2) into `out[..rows]`, with AVX2: per 32
    /// k, `vpmaddubsw` pairs summed in i16 over eight steps, widened once by `vpmaddwd`, the
    /// i32 sums of a block kept in `sums`, then scaled into `out` at the block's end.
    ///
    /// # Safety
    /// AVX2 must be available, `t.fits()` hold, `g` be a multiple of 32 and `r0 + rows <=
    /// t.rows` with `rows` 1 or 2.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_avx2(t: &W4a8Tile<'_>, r0: usize, rows: usize, out: &mut [[f32; W4A8_PANEL]]) {
        let (k, g) = (t.k, t.g);
        let groups = k / g;
        let ones = _mm256_set1_epi16(1);
        for o in out.iter_mut().take(rows) {
            o.fill(0.0);
        }
        let mut sums = [[0i32; W4A8_PANEL]; 2];
        for b in 0..groups {
            sums.iter_mut().for_each(|s| s.fill(0));
            for k0 in (b * g..(b + 1) * g).step_by(32) {
                let mut acc = [[_mm256_setzero_si256(); 4]; 2];
                for kk in (k0..k0 + 32).step_by(4) {
                    // SAFETY: kk + 4 <= k; the panel holds k * 32 bytes, a row k codes.
                    unsafe {
                        let p = t.codes.as_ptr().add(kk * W4A8_PANEL);
                        let w = [
                            _mm256_loadu_si256(p.cast()),
                            _mm256_loadu_si256(p.add(32).cast()),
                            _mm256_loadu_si256(p.add(64).cast()),
                            _mm256_loadu_si256(p.add(96).cast()),
                        ];
                        for (r, a) in acc.iter_mut().enumerate().take(rows) {
                            let at = (r0 + r) * k + kk;
                            let xv = _mm256_set1_epi32(t.x.as_ptr().add(at).cast::<i32>().read_unaligned());
                            for (aj, wj) in a.iter_mut().zip(w) {
                                *aj = _mm256_add_epi16(*aj, _mm256_maddubs_epi16(wj, xv));
                            }
                        }
                    }
                }
                for (s, a) in sums.iter_mut().zip(&acc).take(rows) {
                    for (j, aj) in a.iter().enumerate() {
                        // SAFETY: j * 8 + 8 <= 32: within the row of sums.
                        unsafe {
                            let at = s.as_mut_ptr().add(8 * j).cast::<__m256i>();
                            _mm256_storeu_si256(
                                at,
                                _mm256_add_epi32(_mm256_loadu_si256(at), _mm256_madd_epi16(*aj, ones)),
                            );
                        }
                    }
                }
            }
            // SAFETY: b < groups: the panel's scales hold groups * 32, the rows' terms
            // t.rows * groups; each row of sums and of `out` holds 32.
            unsafe {
                let sc = t.scales.as_ptr().add(b * W4A8_PANEL);
                for (r, (s, o)) in sums.iter().zip(out.iter_mut()).enumerate().take(rows) {
                    let z = _mm256_set1_epi32(*t.zt.get_unchecked((r0 + r) * groups + b));
                    let sx = _mm256_set1_ps(*t.sx.get_unchecked((r0 + r) * groups + b));
                    for j in 0..4 {
                        let v =
                            _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_loadu_si256(s.as_ptr().add(8 * j).cast()), z));
                        let w = _mm256_mul_ps(_mm256_loadu_ps(sc.add(8 * j)), sx);
                        let at = o.as_mut_ptr().add(8 * j);
                        _mm256_storeu_ps(at, _mm256_fmadd_ps(v, w, _mm256_loadu_ps(at)));
                    }
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::TestResult;

    fn next(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// The tiles this CPU can run for blocks of `g`, whatever level is in use.
    fn kinds(g: usize) -> Vec<Kind> {
        let mut out = Vec::new();
        let has = |f: &[bool]| f.iter().all(|&b| b);
        if has(&[
            is_x86_feature_detected!("avx512f"),
            is_x86_feature_detected!("avx512bw"),
            is_x86_feature_detected!("avx512vnni"),
        ]) && g.is_multiple_of(4)
        {
            out.push(Kind::Vnni);
        }
        if has(&[is_x86_feature_detected!("avx2"), is_x86_feature_detected!("fma")]) && g.is_multiple_of(32) {
            out.push(Kind::Avx2);
        }
        out
    }

    #[test]
    fn every_tile_equals_its_definition_for_every_row_count_and_block() -> TestResult {
        let mut seed = 0x5eed_u64;
        for (k, g) in [(32, 32), (64, 4), (128, 64), (256, 128), (96, 32)] {
            let groups = k / g;
            let codes: Vec<u8> = (0..k * W4A8_PANEL).map(|_| (next(&mut seed) % 16) as u8).collect();
            let scales: Vec<f32> = (0..groups * W4A8_PANEL).map(|_| (next(&mut seed) % 1000) as f32 * 1e-4).collect();
            let x: Vec<i8> = (0..W4A8_ROWS * k).map(|_| (next(&mut seed) % 255) as i8).collect();
            let sx: Vec<f32> = (0..W4A8_ROWS * groups).map(|_| (next(&mut seed) % 1000) as f32 * 1e-3).collect();
            let zt: Vec<i32> = x.chunks_exact(g).map(|b| -8 * b.iter().map(|&c| i32::from(c)).sum::<i32>()).collect();
            for rows in 1..=W4A8_ROWS {
                let t = W4a8Tile { codes: &codes, scales: &scales, x: &x, sx: &sx, zt: &zt, rows, k, g };
                let mut want = [[0f32; W4A8_PANEL]; W4A8_ROWS];
                w4a8_tile_scalar(&t, &mut want);
                for kind in kinds(g) {
                    let mut got = [[f32::NAN; W4A8_PANEL]; W4A8_ROWS];
                    #[allow(unsafe_code)]
                    // SAFETY: `kinds` lists only what this CPU has; the operands fit.
                    unsafe {
                        run(kind, &t, &mut got)
                    };
                    for (r, (gr, wr)) in got.iter().zip(&want).enumerate().take(rows) {
                        for (c, (a, b)) in gr.iter().zip(wr).enumerate() {
                            assert!(
                                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                                "{kind:?} k {k} g {g} row {r} col {c}: {a} vs {b}"
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
